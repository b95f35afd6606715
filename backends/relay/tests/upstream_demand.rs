//! The relay's upstream subscriptions follow its downstream ones
//! (docs/protocol.md §4.5), on real loopback sockets: one upstream SUBSCRIBE per
//! track whatever the number of subscribers, carrying their aggregate
//! preferences (SUBSCRIBE_UPDATE when they change); cancelled once the last
//! subscriber has been gone for the linger time; a later subscriber gets a
//! new upstream subscription and receives frames again. Observed from the
//! publisher: the subscriptions its session serves are registered on its
//! track (`subscribers`, `demand`).

mod common;

use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use common::*;
use skiff_core::model::track;
use skiff_core::relay::LINGER;
use skiff_core::session::{Event, SubscriptionId};
use skiff_core::time::Duration as CoreDuration;
use skiff_core::window::{End, Request, Start};
use skiff_monoio::driver::{self, DriverKind};
use skiff_monoio::session_driver::App;
use skiff_relay::relay::RelayHandler;
use skiff_relay::server;
use skiff_testkit::client::{self, ClientCtx, Publisher};

/// How long the relay keeps an upstream subscription after its track lost
/// its last subscriber ([`LINGER`]), as a std duration.
const UPSTREAM_LINGER: Duration = Duration::from_micros(LINGER.as_micros());

/// A subscriber with its own preferences: asks for announcements, then
/// subscribes to `local`'s name in `broadcast` with `request`.
struct Sub {
    broadcast: &'static str,
    local: track::Ref<'static, 'static>,
    request: Request,
    asked: bool,
    announced: bool,
    sub: Option<SubscriptionId>,
    /// SUBSCRIBE_START arrived.
    started: Rc<Cell<bool>>,
}

impl App for Sub {
    fn on_event(&mut self, event: &Event<'_>) {
        match *event {
            Event::Announced { path, .. } if path == self.broadcast => self.announced = true,
            Event::Started { subscription, .. } if Some(subscription) == self.sub => {
                self.started.set(true)
            }
            _ => {}
        }
    }

    fn act<X: skiff_core::transport::Transport>(
        &mut self,
        session: &mut skiff_core::session::Session<
            '_,
            'static,
            'static,
            { skiff_monoio::session_driver::STREAMS },
            X,
        >,
    ) {
        if !session.is_established() || !session.is_setup() {
            return;
        }
        if !self.asked {
            self.asked = session.announce_request("").is_ok();
        }
        if self.announced && self.sub.is_none() {
            self.sub = session
                .subscribe(self.broadcast, self.local, self.request)
                .ok();
        }
    }
}

fn request(priority: u8, max_age_ms: u64) -> Request {
    Request {
        start: Start::Latest,
        end: End::Open,
        ordered: false,
        priority,
        max_latency: CoreDuration::from_millis(max_age_ms),
    }
}

/// A running subscriber: its context (close it to leave) and local track.
struct Running {
    ctx: Rc<ClientCtx>,
    local: track::Ref<'static, 'static>,
    started: Rc<Cell<bool>>,
}

/// Starts a subscriber of `live/cam` track `video` with `req` on a sibling
/// of `base` (same pool and media signal, its own close signal).
fn subscribe(base: &ClientCtx, url: &str, req: Request) -> Running {
    let ctx = Rc::new(base.sibling());
    let local = ctx.track("video");
    let started = Rc::new(Cell::new(false));
    let mut app = Sub {
        broadcast: "live/cam",
        local,
        request: req,
        asked: false,
        announced: false,
        sub: None,
        started: started.clone(),
    };
    let (c, url) = (ctx.clone(), url.to_owned());
    monoio::spawn(async move {
        let _ = client::run(&url, None, &mut app, &c).await;
    });
    Running {
        ctx,
        local,
        started,
    }
}

/// Waits (without blocking the runtime) until `cond` holds; fails after `secs`.
async fn until(what: &str, secs: u64, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        monoio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Starts the publisher of `live/cam` track `video` (a group with one frame
/// every 20 ms while `run` holds) and returns its track.
fn publish(base: &ClientCtx, url: &str, run: Rc<Cell<bool>>) -> track::Ref<'static, 'static> {
    let ctx = Rc::new(base.sibling());
    let (origin, producer) = ctx.publication("live/cam", "video");
    let t = producer.track();
    {
        let (c, url) = (ctx.clone(), url.to_owned());
        monoio::spawn(async move {
            let mut app = Publisher::default();
            let _ = client::run(&url, Some(origin), &mut app, &c).await;
        });
    }
    monoio::spawn(async move {
        let mut g = 0u64;
        while run.get() {
            if let Ok(mut group) = producer.create_group(g) {
                let _ = group.write_frame(g * 20, &g.to_le_bytes());
                let _ = group.finish();
            }
            ctx.notify().bump();
            g += 1;
            monoio::time::sleep(Duration::from_millis(20)).await;
        }
        drop(producer);
        ctx.close_all();
    });
    t
}

/// A subscriber comes and goes: after the linger the relay cancels its
/// upstream subscription (the publisher serves none); a new subscriber gets
/// a new upstream subscription and frames again.
async fn cancel_scenario(url: String) {
    let base = ClientCtx::new(16 << 20);
    let run = Rc::new(Cell::new(true));
    let published = publish(&base, &url, run.clone());
    assert_eq!(published.subscribers(), 0);

    let a = subscribe(&base, &url, request(0, 0));
    until("first subscriber receives groups", 10, || {
        a.started.get() && a.local.latest().is_some()
    })
    .await;
    assert_eq!(published.subscribers(), 1, "one upstream subscription");

    // The subscriber leaves; the upstream subscription lingers a while.
    a.ctx.close_all();
    let left = Instant::now();
    monoio::time::sleep(UPSTREAM_LINGER / 4).await;
    assert_eq!(
        published.subscribers(),
        1,
        "cancelled before the linger ran out"
    );
    until("the relay cancels its upstream subscription", 15, || {
        published.subscribers() == 0
    })
    .await;
    assert!(left.elapsed() >= UPSTREAM_LINGER);
    assert_eq!(published.demand(), None);

    // A new subscriber: a new upstream subscription, frames again.
    let b = subscribe(&base, &url, request(0, 0));
    until("second subscriber receives groups", 10, || {
        b.started.get() && b.local.latest().is_some()
    })
    .await;
    assert_eq!(published.subscribers(), 1, "a new upstream subscription");
    let seen = b.local.latest();
    until("second subscriber keeps receiving", 10, || {
        b.local.latest() > seen
    })
    .await;

    b.ctx.close_all();
    run.set(false);
    monoio::time::sleep(Duration::from_millis(100)).await;
}

/// Two subscribers with different priorities and max ages: one upstream
/// subscription, updated to the aggregate (highest priority, highest max
/// age), back to the first's when the second leaves; cancelled once both left.
async fn merge_scenario(url: String) {
    let base = ClientCtx::new(16 << 20);
    let run = Rc::new(Cell::new(true));
    let published = publish(&base, &url, run.clone());

    let a = subscribe(&base, &url, request(3, 100));
    until("first subscriber receives groups", 10, || {
        a.started.get() && a.local.latest().is_some()
    })
    .await;
    until(
        "upstream asks for the first subscriber's preferences",
        10,
        || published.demand() == Some(request(3, 100)),
    )
    .await;

    let b = subscribe(&base, &url, request(9, 2000));
    until("second subscriber receives groups", 10, || {
        b.started.get() && b.local.latest().is_some()
    })
    .await;
    // SUBSCRIBE_UPDATE: the aggregate of both, on the one upstream subscription:
    // the higher priority, and at least the longer max age (a relay asks a
    // hop upstream for the publisher's default 5 s until its first
    // subscriber's request arrives).
    until("upstream asks for the aggregate", 10, || {
        published.demand().is_some_and(|d| {
            d.priority == 9
                && d.max_latency >= CoreDuration::from_millis(2000)
                && d.start == Start::Latest
                && d.end == End::Open
        })
    })
    .await;
    assert_eq!(published.subscribers(), 1, "one upstream subscription");

    // One leaves: the upstream subscription stays, and comes back down to
    // the other's preferences (docs/protocol.md §4.5).
    b.ctx.close_all();
    until(
        "upstream asks for the remaining subscriber's preferences",
        10,
        || published.demand() == Some(request(3, 100)),
    )
    .await;
    monoio::time::sleep(UPSTREAM_LINGER + Duration::from_millis(500)).await;
    assert_eq!(published.subscribers(), 1, "kept for the other subscriber");
    let seen = a.local.latest();
    until("the other subscriber keeps receiving", 10, || {
        a.local.latest() > seen
    })
    .await;

    // Both gone: cancelled.
    a.ctx.close_all();
    until("the relay cancels its upstream subscription", 15, || {
        published.subscribers() == 0
    })
    .await;

    run.set(false);
    monoio::time::sleep(Duration::from_millis(100)).await;
}

/// Runs `scenario` against a relay of `threads` workers (with two, the
/// clients spread over both and the worker link carries the track: its
/// subscription lingers and is cancelled the same way, one hop at a time).
fn on_relay(
    kind: DriverKind,
    threads: usize,
    scenario: fn(String) -> std::pin::Pin<Box<dyn Future<Output = ()>>>,
) {
    let handle = server::start(
        config(threads, kind),
        RelayHandler::factory(threads).unwrap(),
    )
    .expect("relay");
    let url = format!("tcp://{}/", handle.local_addr());
    driver::block_on(kind, move |_| scenario(url)).expect("client runtime");
    handle.shutdown().expect("relay stops");
}

#[test]
fn upstream_subscription_is_cancelled_after_the_last_subscriber_and_made_again() {
    for threads in [1, 2] {
        for kind in drivers() {
            within(60, move || {
                on_relay(kind, threads, |u| Box::pin(cancel_scenario(u)))
            });
        }
    }
}

#[test]
fn subscribers_with_different_preferences_share_one_upstream_subscription() {
    for threads in [1, 2] {
        for kind in drivers() {
            within(60, move || {
                on_relay(kind, threads, |u| Box::pin(merge_scenario(u)))
            });
        }
    }
}

/// A leaf whose upstream URL carries a long query (an access token) still
/// reaches its upstream: the SETUP it sends needs more room than a worker
/// link's control buffers have.
#[test]
fn a_leaf_with_a_long_upstream_url_reaches_its_upstream() {
    for kind in drivers() {
        within(30, move || {
            let root = server::start(config(1, kind), RelayHandler::factory(1).unwrap())
                .expect("root relay");
            let mut cfg = config(1, kind);
            let token = "t".repeat(700);
            let upstream = format!("tcp://{}/?token={token}", root.local_addr());
            cfg.upstream = Some(upstream.parse().expect("upstream URL"));
            let leaf = server::start(cfg, RelayHandler::factory(1).unwrap()).expect("leaf relay");
            let root_url = format!("tcp://{}/", root.local_addr());
            let leaf_url = format!("tcp://{}/", leaf.local_addr());
            driver::block_on(kind, move |_| async move {
                let base = ClientCtx::new(16 << 20);
                let run = Rc::new(Cell::new(true));
                let _published = publish(&base, &root_url, run.clone());
                let s = subscribe(&base, &leaf_url, request(0, 100));
                until(
                    "the leaf's subscriber receives the root's groups",
                    20,
                    || s.started.get() && s.local.latest().is_some(),
                )
                .await;
                run.set(false);
                s.ctx.close_all();
                base.close_all();
                monoio::time::sleep(Duration::from_millis(100)).await;
            })
            .expect("client runtime");
            leaf.shutdown().expect("leaf stops");
            root.shutdown().expect("root stops");
        });
    }
}
