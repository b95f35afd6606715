//! skiff's own client on both ends of the published `moq-relay` 0.17.10 (docs/protocol.md §7.1,
//! §7.4 items 1-2): the relay runs as a child process with a plain-TCP QMux listener on a
//! free loopback port and anonymous access; a skiff publisher announces a broadcast, and
//! several skiff subscribers find it by ANNOUNCE, subscribe through the relay and must
//! receive every frame of every group with its bytes, order and timestamp intact, then
//! the track's end. One frame is larger than the 256 KiB initial stream window, so the
//! relay's flow control is crossed in both directions.
//!
//! The same scenario runs with `skiff-relay` as a leaf of `moq-relay` (`--upstream`, two
//! workers): the publisher on moq-relay and the subscribers on the leaf, then the other
//! way round.
//!
//! The relay binary is found as [`moq_relay`] says. Without one,
//! [`skiff_client_through_moq_relay`] prints a skip line and passes;
//! [`skiff_client_through_moq_relay_required`] (ignored by default) fails instead.

// The relay tests' helpers (the in-order frame check).
#[path = "../../backends/relay/tests/common/mod.rs"]
mod common;
mod moq_relay;

use common::{check_in_order, spawn_subscriber};
use moq_relay::{INSTALL, MoqRelay, moq_relay_binary};
use std::cell::RefCell;
use std::path::Path;
use std::rc::Rc;
use std::sync::mpsc;
use std::time::Duration;

use std::num::NonZeroUsize;

use skiff_monoio::driver::{self, DriverKind};
use skiff_relay::config::RelayConfig;
use skiff_relay::relay::RelayHandler;
use skiff_relay::server;
use skiff_testkit::client::{self, ClientCtx, Publisher, ReadState};

/// Bound on the whole scenario.
const SCENARIO_SECS: u64 = 60;

/// SETUP path of every client; with `--auth-public '**'` it is the session root.
const PATH: &str = "/anon";
const BROADCAST: &str = "demo";
const TRACK: &str = "video";
const SUBSCRIBERS: usize = 3;
const GROUPS: u64 = 6;
const FRAMES: u64 = 8;
/// Group and frame of the one big frame, and its size (over 256 KiB).
const BIG_AT: (u64, u64) = (2, 3);
const BIG: usize = 300 * 1024 + 11;

/// The payload of frame `i` of group `g`: its coordinates, then a pattern.
fn payload(g: u64, i: u64) -> Vec<u8> {
    let len = if (g, i) == BIG_AT {
        BIG
    } else {
        16 + usize::try_from((g * 97 + i * 31) % 1500).unwrap()
    };
    let mut p = Vec::with_capacity(len);
    p.extend_from_slice(&g.to_le_bytes());
    p.extend_from_slice(&i.to_le_bytes());
    let seed = usize::try_from(g * 31 + i * 17).unwrap();
    p.extend((p.len()..len).map(|k| u8::try_from((seed + k) % 251).unwrap()));
    p
}

/// Timestamp (ms) of frame `i` of group `g`: all groups within moq-dev's 5 s default max
/// age (docs/protocol.md §4.7), so the relay never skips one as stale.
fn timestamp(g: u64, i: u64) -> u64 {
    g * 100 + i * 7
}

// ---------------------------------------------------------------------------
// The skiff clients
// ---------------------------------------------------------------------------

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

/// One publisher dialing `pub_url` and [`SUBSCRIBERS`] subscribers dialing
/// `sub_url`, on one monoio thread.
async fn scenario(pub_url: String, sub_url: String) -> Vec<Seen> {
    let url = pub_url;
    let ctx = Rc::new(ClientCtx::new(64 << 20));
    let notify = ctx.notify().clone();

    let (origin, producer) = ctx.publication(BROADCAST, TRACK);
    {
        let (ctx, url) = (ctx.clone(), url.clone());
        monoio::spawn(async move {
            let mut app = Publisher::default();
            let r = client::run(&url, Some(origin), &mut app, &ctx).await;
            eprintln!("publisher session ended: {r:?}");
        });
    }
    // Group 0 is open before anyone subscribes: the relay's live-edge subscription
    // (docs/protocol.md §4.8) starts there for every subscriber.
    let mut g0 = producer.create_group(0).unwrap();
    g0.write_frame(timestamp(0, 0), &payload(0, 0)).unwrap();
    notify.bump();

    let url = sub_url;
    let mut states = Vec::new();
    let mut seen_all = Vec::new();
    for _ in 0..SUBSCRIBERS {
        let seen = Rc::new(RefCell::new(Seen::default()));
        seen_all.push(seen.clone());
        let ended = seen.clone();
        states.push(spawn_subscriber(
            &ctx,
            &url,
            BROADCAST,
            ctx.track(TRACK),
            move |f| seen.borrow_mut().frame(f),
            move |end| match end {
                ReadState::Aborted(c) => ended.borrow_mut().aborted = Some(c),
                _ => ended.borrow_mut().finished = true,
            },
        ));
    }

    // Every subscription must start at group 0 before the rest is written.
    skiff_testkit::wait::until(&notify, || {
        if states.iter().all(|s| s.started.get() == Some(0)) {
            return true;
        }
        if let Some(s) = states.iter().find(|s| s.closed.get().is_some()) {
            panic!("a subscription closed early: {:?}", s.closed.get());
        }
        if let Some(s) = states
            .iter()
            .find(|s| s.started.get().is_some_and(|g| g != 0))
        {
            panic!("a subscription started at group {:?}", s.started.get());
        }
        false
    })
    .await;

    for g in 0..GROUPS {
        let mut gp = (g != 0).then(|| producer.create_group(g).unwrap());
        for i in 0..FRAMES {
            if (g, i) == (0, 0) {
                continue;
            }
            let w = gp.as_mut().unwrap_or(&mut g0);
            w.write_frame(timestamp(g, i), &payload(g, i)).unwrap();
            if i % 4 == 3 {
                notify.bump();
                monoio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        match gp.as_mut() {
            Some(w) => w.finish().unwrap(),
            None => g0.finish().unwrap(),
        }
        notify.bump();
    }
    let mut producer = producer;
    producer.finish();
    notify.bump();

    // Every reader stops once the track's end travelled through the relay.
    skiff_testkit::wait::until(&notify, || {
        seen_all.iter().all(|s| {
            let s = s.borrow();
            s.finished || s.aborted.is_some()
        })
    })
    .await;
    ctx.close_all();
    monoio::time::sleep(Duration::from_millis(100)).await;
    seen_all
        .into_iter()
        .map(|s| {
            Rc::try_unwrap(s)
                .map(RefCell::into_inner)
                .unwrap_or_default()
        })
        .collect()
}

/// Runs the scenario against `bin`, asserting every subscriber got everything.
fn through_moq_relay(bin: &Path) {
    let relay = MoqRelay::start(bin);
    let url = format!("tcp://{}{PATH}", relay.addr);
    eprintln!("moq-relay {} on {url}", bin.display());
    run_checked(url.clone(), url);
    drop(relay);
}

/// `skiff-relay` as a leaf of `moq-relay` (`--upstream`, two workers): the
/// publisher on one relay and the subscribers on the other, both ways.
fn leaf_of_moq_relay(bin: &Path, publisher_on_root: bool) {
    let relay = MoqRelay::start(bin);
    let root = format!("tcp://{}{PATH}", relay.addr);
    let mut cfg = RelayConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        threads: NonZeroUsize::new(2).unwrap(),
        driver: DriverKind::Legacy,
        drain_timeout: Duration::from_secs(2),
        ..RelayConfig::default()
    };
    cfg.upstream = Some(root.parse().expect("upstream URL"));
    let leaf = server::start(cfg, RelayHandler::factory(2).unwrap()).expect("start leaf");
    // The leaf's root is moq-relay's `PATH` (docs/protocol.md §4.1): a client at the
    // leaf's root names what a client at `PATH` on moq-relay names.
    let leaf_url = format!("tcp://{}/", leaf.local_addr());
    eprintln!("skiff-relay leaf on {leaf_url}, moq-relay root on {root}");
    if publisher_on_root {
        run_checked(root, leaf_url);
    } else {
        run_checked(leaf_url, root);
    }
    leaf.shutdown().expect("leaf stops");
    drop(relay);
}

/// Runs the scenario, asserting every subscriber got everything.
fn run_checked(pub_url: String, sub_url: String) {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(driver::block_on(DriverKind::Legacy, move |_| {
            scenario(pub_url, sub_url)
        }));
    });
    let seen = match rx.recv_timeout(Duration::from_secs(SCENARIO_SECS)) {
        Ok(r) => r.expect("client runtime"),
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("scenario did not finish within {SCENARIO_SECS} s")
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("scenario thread panicked"),
    };
    assert_eq!(seen.len(), SUBSCRIBERS);
    for (i, s) in seen.iter().enumerate() {
        assert!(
            s.errors.is_empty(),
            "subscriber {i}: {:?}",
            &s.errors[..s.errors.len().min(5)]
        );
        assert_eq!(s.aborted, None, "subscriber {i} aborted");
        assert!(s.finished, "subscriber {i} did not finish");
        assert_eq!(s.next, (GROUPS, 0), "subscriber {i} missed frames");
    }
}

/// Through `moq-relay` if it is installed; otherwise prints why it skipped and passes.
#[test]
fn skiff_client_through_moq_relay() {
    match moq_relay_binary() {
        Some(bin) => through_moq_relay(&bin),
        None => eprintln!("skipped: moq-relay not installed; install with: {INSTALL}"),
    }
}

/// skiff-relay as a leaf of moq-relay, the publisher on moq-relay.
#[test]
fn skiff_leaf_of_moq_relay_publisher_on_the_root() {
    match moq_relay_binary() {
        Some(bin) => leaf_of_moq_relay(&bin, true),
        None => eprintln!("skipped: moq-relay not installed; install with: {INSTALL}"),
    }
}

/// skiff-relay as a leaf of moq-relay, the publisher on the leaf.
#[test]
fn skiff_leaf_of_moq_relay_publisher_on_the_leaf() {
    match moq_relay_binary() {
        Some(bin) => leaf_of_moq_relay(&bin, false),
        None => eprintln!("skipped: moq-relay not installed; install with: {INSTALL}"),
    }
}

/// The same, failing when `moq-relay` is absent (run with `--ignored` where it must be).
#[test]
#[ignore = "needs moq-relay installed; the non-ignored twin skips without it"]
fn skiff_client_through_moq_relay_required() {
    let bin = moq_relay_binary()
        .unwrap_or_else(|| panic!("moq-relay not installed; install with: {INSTALL}"));
    through_moq_relay(&bin);
}
