//! The moq-lite relay on real loopback sockets: one publisher and a hundred
//! subscribers through `skiff-relay`'s handler, skiff's own session as the
//! client, every frame's bytes and order checked by every subscriber; a
//! connection sending garbage is closed with a code while the others keep
//! receiving.

mod common;

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use common::*;
use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
use skiff_monoio::driver::{self, DriverKind};
use skiff_relay::relay::RelayHandler;
use skiff_relay::server;
use skiff_testkit::client::{self, ClientCtx, Publisher, ReadState};

const SUBSCRIBERS: usize = 100;
/// Groups and frames per group (fewer unoptimized: 200 sessions in one test).
const GROUPS: u64 = if cfg!(debug_assertions) { 8 } else { 24 };
const FRAMES: u64 = 10;

/// The payload of frame `i` of group `g`: its coordinates, then a pattern.
fn payload(g: u64, i: u64) -> Vec<u8> {
    let len = 64 + ((g * 7 + i * 13) % 1500) as usize;
    let mut p = Vec::with_capacity(len);
    p.extend_from_slice(&g.to_le_bytes());
    p.extend_from_slice(&i.to_le_bytes());
    for k in p.len()..len {
        p.push((g as usize * 31 + i as usize * 17 + k) as u8);
    }
    p
}

fn timestamp(g: u64, i: u64) -> u64 {
    g * 1000 + i * 33
}

/// What one subscriber saw.
#[derive(Debug, Default)]
struct Seen {
    next: (u64, u64),
    errors: Vec<String>,
    finished: bool,
    aborted: Option<u64>,
}

impl Seen {
    fn frame(&mut self, f: client::Frame<'_>) {
        let (payload, ts) = (payload(f.group, f.index), timestamp(f.group, f.index));
        check_in_order(
            &mut self.next,
            &mut self.errors,
            &f,
            FRAMES,
            &payload,
            Some(ts),
        );
    }
}

struct Outcome {
    seen: Vec<(usize, Seen)>,
    garbage_reply: usize,
    garbage_closed: bool,
}

async fn scenario(url: String) -> Outcome {
    let ctx = Rc::new(ClientCtx::new(256 << 20));
    let notify = ctx.notify().clone();

    // The publisher: broadcast "demo", track "video".
    let (origin, producer) = ctx.publication("demo", "video");
    {
        let (ctx, url) = (ctx.clone(), url.clone());
        monoio::spawn(async move {
            let mut app = Publisher::default();
            let r = client::run(&url, Some(origin), &mut app, &ctx).await;
            eprintln!("publisher session ended: {r:?}");
        });
    }
    // Group 0 starts before anyone subscribes; subscribers start there.
    let mut g0 = producer.create_group(0).unwrap();
    g0.write_frame(timestamp(0, 0), &payload(0, 0)).unwrap();
    notify.bump();

    // The subscribers, each with a reader checking every frame.
    let mut states = Vec::new();
    let mut seen_all = Vec::new();
    for _ in 0..SUBSCRIBERS {
        let seen = Rc::new(RefCell::new(Seen::default()));
        seen_all.push(seen.clone());
        let ended = seen.clone();
        states.push(spawn_subscriber(
            &ctx,
            &url,
            "demo",
            ctx.track("video"),
            move |f| seen.borrow_mut().frame(f),
            move |end| match end {
                ReadState::Aborted(c) => ended.borrow_mut().aborted = Some(c),
                _ => ended.borrow_mut().finished = true,
            },
        ));
    }

    let t0 = std::time::Instant::now();
    // Wait until every subscription started at group 0.
    skiff_testkit::wait::until(&notify, || {
        if states.iter().all(|s| s.started.get() == Some(0)) {
            return true;
        }
        if let Some(s) = states.iter().find(|s| s.closed.get().is_some()) {
            panic!("a subscription closed early: {:?}", s.closed.get());
        }
        false
    })
    .await;

    eprintln!("all started after {:?}", t0.elapsed());
    let mut garbage_reply = 0;
    let mut garbage_closed = false;
    for g in 0..GROUPS {
        let mut gp = if g == 0 {
            None
        } else {
            Some(producer.create_group(g).unwrap())
        };
        for i in 0..FRAMES {
            if g == 0 && i == 0 {
                continue;
            }
            let w = gp.as_mut().unwrap_or(&mut g0);
            w.write_frame(timestamp(g, i), &payload(g, i)).unwrap();
            if i % 5 == 4 {
                notify.bump();
                monoio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        match gp.as_mut() {
            Some(w) => w.finish().unwrap(),
            None => g0.finish().unwrap(),
        }
        notify.bump();
        if g == GROUPS / 2 {
            // Garbage from another connection: it is closed, nobody else notices.
            let (addr, _) = client::parse_url(&url).unwrap();
            let mut s = monoio::net::TcpStream::connect(addr).await.unwrap();
            let (r, _) = s.write_all(vec![0xffu8; 64]).await;
            r.unwrap();
            loop {
                let (r, _) = s.read(vec![0u8; 4096]).await;
                match r {
                    Ok(0) | Err(_) => {
                        garbage_closed = true;
                        break;
                    }
                    Ok(n) => garbage_reply += n,
                }
            }
        }
    }
    eprintln!("all written after {:?}", t0.elapsed());
    let mut producer = producer;
    producer.finish();
    notify.bump();

    // Every reader finishes once the end travelled through the relay.
    skiff_testkit::wait::until(&notify, || {
        seen_all.iter().all(|s| {
            let s = s.borrow();
            s.finished || s.aborted.is_some()
        })
    })
    .await;
    eprintln!("all read after {:?}", t0.elapsed());
    ctx.close_all();
    monoio::time::sleep(Duration::from_millis(100)).await;
    Outcome {
        seen: seen_all
            .into_iter()
            .enumerate()
            .map(|(i, s)| {
                (
                    i,
                    Rc::try_unwrap(s)
                        .map(RefCell::into_inner)
                        .unwrap_or_default(),
                )
            })
            .collect(),
        garbage_reply,
        garbage_closed,
    }
}

fn run_on(kind: DriverKind, threads: usize) {
    let mut cfg = config(threads, kind);
    cfg.cache_bytes = 64 << 20;
    let handle = server::start(cfg, RelayHandler::factory(threads).unwrap()).expect("start relay");
    let url = format!("tcp://{}/", handle.local_addr());
    let out = driver::block_on(kind, move |_| scenario(url)).expect("client runtime");
    for (i, s) in &out.seen {
        assert!(
            s.errors.is_empty(),
            "subscriber {i}: {:?}",
            &s.errors[..s.errors.len().min(5)]
        );
        assert_eq!(s.aborted, None, "subscriber {i} aborted");
        assert!(s.finished, "subscriber {i} did not finish");
        assert_eq!(s.next, (GROUPS, 0), "subscriber {i} missed frames");
    }
    if threads > 1 {
        // Both workers served clients, so the link carried the track.
        for t in 0..threads {
            let accepted = handle.metrics().thread(t).snapshot().accepted;
            eprintln!("worker {t} accepted {accepted} connections");
            assert!(accepted > 0, "worker {t} got no connection");
        }
        // The track's payload crossed the link by reference, not as bytes:
        // the publisher's worker lent at least every payload byte once.
        let payload_bytes: u64 = (0..GROUPS)
            .flat_map(|g| (0..FRAMES).map(move |i| payload(g, i).len() as u64))
            .sum();
        let mut lent = 0;
        for _ in 0..100 {
            lent = handle.metrics().total().lent_bytes;
            if lent >= payload_bytes {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        eprintln!("lent {lent} bytes across the link for {payload_bytes} payload bytes");
        assert!(lent >= payload_bytes, "lent {lent} of {payload_bytes}");
    }
    assert!(out.garbage_closed, "garbage connection not closed");
    assert!(
        out.garbage_reply > 0,
        "garbage connection got no close frame"
    );
    handle.shutdown().expect("relay stops");
}

#[test]
fn one_publisher_hundred_subscribers_every_frame_in_order() {
    for kind in drivers() {
        within(120, move || run_on(kind, 1));
    }
}

/// Two workers: SO_REUSEPORT spreads the connections over both, so most
/// subscribers reach the publisher through the link between the workers.
#[test]
fn two_workers_hundred_subscribers_every_frame_in_order() {
    for kind in drivers() {
        within(120, move || run_on(kind, 2));
    }
}

/// Records announcements seen through an ANNOUNCE_REQUEST for everything.
#[derive(Default)]
struct Watcher {
    asked: bool,
    log: Rc<RefCell<Vec<String>>>,
}

impl skiff_monoio::session_driver::App for Watcher {
    fn on_event(&mut self, event: &skiff_core::session::Event<'_>) {
        use skiff_core::session::Event;
        match *event {
            Event::Announced { path, .. } => self.log.borrow_mut().push(format!("+{path}")),
            Event::Unannounced { path, .. } => self.log.borrow_mut().push(format!("-{path}")),
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
        if !self.asked && session.is_established() && session.is_setup() {
            self.asked = session.announce_request("").is_ok();
        }
    }
}

async fn withdraw_scenario(url: String) -> Vec<String> {
    let watch_ctx = Rc::new(ClientCtx::new(1 << 20));
    let pub_ctx = Rc::new(ClientCtx::new(1 << 20));
    let log = Rc::new(RefCell::new(Vec::new()));
    {
        let (ctx, url, log) = (watch_ctx.clone(), url.clone(), log.clone());
        monoio::spawn(async move {
            let mut app = Watcher { asked: false, log };
            let _ = client::run(&url, None, &mut app, &ctx).await;
        });
    }
    let (origin, _producer) = pub_ctx.publication("room/cam", "video");
    {
        let (ctx, url) = (pub_ctx.clone(), url.clone());
        monoio::spawn(async move {
            let mut app = Publisher::default();
            let _ = client::run(&url, Some(origin), &mut app, &ctx).await;
        });
    }
    let wait_for = |want: &'static str| {
        let log = log.clone();
        async move {
            for _ in 0..500 {
                if log.borrow().iter().any(|l| l == want) {
                    return true;
                }
                monoio::time::sleep(Duration::from_millis(10)).await;
            }
            false
        }
    };
    assert!(
        wait_for("+room/cam").await,
        "never announced: {:?}",
        log.borrow()
    );
    // The publisher leaves: its broadcast is withdrawn everywhere.
    pub_ctx.close_all();
    assert!(
        wait_for("-room/cam").await,
        "never withdrawn: {:?}",
        log.borrow()
    );
    watch_ctx.close_all();
    monoio::time::sleep(Duration::from_millis(50)).await;
    log.take()
}

/// A broadcast is announced to subscribers while its publisher is connected
/// and withdrawn when it leaves (on one worker, and across the worker link).
#[test]
fn publisher_leaving_withdraws_its_broadcast() {
    for threads in [1, 2] {
        for kind in drivers() {
            within(60, move || {
                let handle = server::start(
                    config(threads, kind),
                    RelayHandler::factory(threads).unwrap(),
                )
                .expect("start relay");
                let url = format!("tcp://{}/", handle.local_addr());
                let log = driver::block_on(kind, move |_| withdraw_scenario(url)).unwrap();
                assert_eq!(log, ["+room/cam", "-room/cam"], "{threads} threads");
                handle.shutdown().expect("relay stops");
            });
        }
    }
}
