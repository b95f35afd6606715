//! Churn against a real `skiff-relay` process: broadcast paths announced and
//! withdrawn, made-up track names asked for, subscribers that come, read a
//! group and go, while a publisher streams to ten steady subscribers that
//! must receive every frame. After a warm-up of the first half of the
//! operations, the relay's heap must stay flat through the second half, its
//! resident memory must not rise by more than the allocator's slack, and its
//! tables must come back to where they were.

mod common;
mod peers;

use std::net::SocketAddr;
use std::time::{Duration, Instant as StdInstant};

use common::*;
use peers::*;
use skiff_core::model::path::Path;
use skiff_core::model::{broadcast, origin, track};
use skiff_core::relay::{TrackSlot, TrackTable};
use skiff_core::session::Config;
use skiff_testkit::client::process_pool as leak_pool;

/// Broadcast paths announced and withdrawn.
const PATHS: usize = 10_000;
/// Made-up track names asked for in the steady broadcast.
const NAMES: usize = 10_000;
/// Subscribers that connect, read a group and leave.
const VISITORS: usize = 1_000;
/// Paths announced at once; names asked for at once (under the relay's
/// per-connection quota of pending track requests).
const PATH_BATCH: usize = 50;
const NAME_BATCH: usize = 16;
/// The wait before each RSS sample: past two of the buffer pools' trims.
const SETTLE: Duration = Duration::from_millis(2500);
/// The most the relay's heap may grow per 1,000 operations after warm-up:
/// a leak of more than 8 bytes per path, name or visitor exceeds it.
/// Measured: 0 to 2 KiB.
const HEAP_PER_K: f64 = 8.0;
/// The most the relay's resident memory may rise after warm-up, whatever
/// the number of operations. The heap check above catches what grows with
/// them; RSS also moves with where the allocator's free pages lie, by up to
/// 730 KiB between two samples seen here.
const RSS_SLACK: u64 = 2 << 20;
/// NOT_FOUND (docs/protocol.md §3.15).
const NOT_FOUND: u64 = 0x33;

/// A client's settings with an idle timeout of ten minutes.
fn patient() -> Config<'static> {
    let mut config = Config::new();
    config.conn.max_idle_timeout = skiff_core::time::Duration::from_secs(600);
    config
}

/// A publisher announcing and withdrawing made-up broadcast paths.
struct PathChurn {
    raw: Raw,
    origin: origin::Ref<'static, 'static>,
    next: usize,
}

impl PathChurn {
    fn new(addr: SocketAddr) -> PathChurn {
        let o: &'static origin::State<'static, 'static, 64, 1024> =
            Box::leak(Box::new(origin::State::new()));
        let origin = o.handle();
        let mut raw = Raw::connect_with(addr, patient(), None, Some(origin));
        raw.handshake();
        PathChurn {
            raw,
            origin,
            next: 0,
        }
    }

    /// Announces `n` new paths, waits for the relay to route them, withdraws
    /// them and waits for the relay to let them go.
    fn batch(&mut self, relay: &RelayProcess, n: usize, base: u64) {
        let mut paths = Vec::new();
        for _ in 0..n {
            let path = format!("churn/{}", self.next);
            self.next += 1;
            let state: &'static broadcast::State<'static, 'static, 1> = Box::leak(Box::new(
                broadcast::State::new(Path::new(&path).unwrap()).unwrap(),
            ));
            self.origin.announce(state.handle()).unwrap();
            paths.push(path);
        }
        self.pump_until(relay, |b| b == base + n as u64, "paths announced");
        for p in &paths {
            self.origin.unannounce(Path::new(p).unwrap());
        }
        self.pump_until(relay, |b| b == base, "paths withdrawn");
    }

    fn pump_until(&mut self, relay: &RelayProcess, want: impl Fn(u64) -> bool, what: &str) {
        let deadline = StdInstant::now() + Duration::from_secs(10);
        loop {
            self.raw.send_output();
            assert!(
                self.raw.read_once(),
                "{what}: the relay ended the connection"
            );
            if want(relay.metric("skiff_relay_broadcasts")) {
                return;
            }
            assert!(StdInstant::now() < deadline, "{what}: timed out");
        }
    }
}

/// A subscriber asking for track names the publisher does not have.
struct NameChurn {
    raw: Raw,
    tracks: &'static TrackTable<'static, 'static, 2>,
    next: usize,
}

impl NameChurn {
    fn new(addr: SocketAddr) -> NameChurn {
        let pool = leak_pool(1 << 20);
        let slots: &'static [TrackSlot<'static, 2>] = Box::leak(
            (0..NAME_BATCH)
                .map(|_| TrackSlot::new(pool, track::Limits::NONE))
                .collect::<Vec<_>>()
                .into_boxed_slice(),
        );
        let tracks = Box::leak(Box::new(TrackTable::new(slots)));
        let mut raw = Raw::connect(addr, patient(), None);
        raw.handshake();
        NameChurn {
            raw,
            tracks,
            next: 0,
        }
    }

    /// Asks for `n` made-up names; each must be refused with NOT_FOUND
    /// within a second.
    fn batch(&mut self, n: usize) {
        let mut locals = Vec::new();
        for _ in 0..n {
            let name = format!("nope-{}", self.next);
            self.next += 1;
            let local = self
                .tracks
                .claim(track::Info::new(&name).unwrap())
                .expect("local track");
            self.raw
                .session
                .subscribe("demo", local, live_request())
                .expect("subscribe");
            locals.push(local);
        }
        self.raw.refused.clear();
        self.raw.send_output();
        let ok = self
            .raw
            .pump_until(Duration::from_secs(1), |r| r.refused.len() == n);
        assert!(
            ok,
            "{} of {n} requests for made-up tracks refused within 1 s",
            self.raw.refused.len()
        );
        assert!(
            self.raw.refused.iter().all(|c| *c == Some(NOT_FOUND)),
            "refusal codes {:?}",
            self.raw.refused
        );
        for t in locals {
            self.tracks.retire(t);
        }
    }
}

/// A subscriber that connects, reads the start of a group and leaves.
fn visit(addr: SocketAddr, local: track::Ref<'static, 'static>) {
    let mut raw = Raw::connect(addr, Config::new(), None);
    raw.handshake();
    raw.session
        .subscribe("demo", local, live_request())
        .expect("subscribe");
    raw.send_output();
    let ok = raw.pump_until(IO_TIMEOUT, |r| !r.started.is_empty());
    assert!(ok, "a visitor's subscription did not start");
}

#[test]
fn churn_leaves_the_relay_where_it_was() {
    within(300, || {
        // Each churning connection sits silent while the other kinds of
        // churn run, which on a slow machine is longer than the default
        // 30 s idle timeout; this test is about tables and memory, so the
        // relay and the churning clients allow ten minutes.
        let relay = start_relay(&["--idle-timeout", "600s"]);
        let addr = relay.addr;
        let audience = SteadyAudience::start(addr);
        let t0 = StdInstant::now();
        let base_broadcasts = relay.metric("skiff_relay_broadcasts");
        let mut paths = PathChurn::new(addr);
        let mut names = NameChurn::new(addr);
        let visitor_pool = leak_pool(1 << 20);
        let run = |paths: &mut PathChurn, names: &mut NameChurn, share: usize| {
            for _ in 0..PATHS / 2 / PATH_BATCH {
                paths.batch(&relay, PATH_BATCH, base_broadcasts);
            }
            for _ in 0..NAMES / 2 / NAME_BATCH {
                names.batch(NAME_BATCH);
            }
            for _ in 0..share {
                let state: &'static track::State<'static, 2> = Box::leak(Box::new(
                    track::State::new(visitor_pool, track::Info::new("video").unwrap()),
                ));
                visit(addr, state.handle());
            }
        };
        run(&mut paths, &mut names, VISITORS / 2);
        // The relay's buffer pools give back what a burst took at their
        // next trim, once a second: sample after two have passed, so the
        // figure is the relay's state, not the buffers of the last burst.
        std::thread::sleep(SETTLE);
        let warm = relay.settled_rss();
        let warm_heap = relay.metric("skiff_relay_heap_bytes");
        let warm_tracks = relay.metric("skiff_relay_relay_tracks");
        run(&mut paths, &mut names, VISITORS / 2);
        std::thread::sleep(SETTLE);
        let end = relay.settled_rss();
        let end_heap = relay.metric("skiff_relay_heap_bytes");
        let end_tracks = relay.metric("skiff_relay_relay_tracks");
        let end_broadcasts = relay.metric("skiff_relay_broadcasts");
        let elapsed = t0.elapsed();
        drop(paths);
        drop(names);
        let seen = audience.finish();
        let ops = (PATHS + NAMES + VISITORS) / 2;
        let heap_per_k = end_heap.saturating_sub(warm_heap) as f64 / 1024.0 / (ops as f64 / 1000.0);
        eprintln!(
            "churn: {PATHS} paths, {NAMES} made-up names, {VISITORS} visitors in {:.1} s; \
             relay heap {} KiB after warm-up, {} KiB at the end: {heap_per_k:.1} KiB per 1,000 operations; \
             RSS {} KiB -> {} KiB; \
             relay tracks {warm_tracks} -> {end_tracks}, broadcasts {end_broadcasts} (base {base_broadcasts})",
            elapsed.as_secs_f64(),
            warm_heap / 1024,
            end_heap / 1024,
            warm / 1024,
            end / 1024,
        );
        check_good(&seen);
        assert!(warm_heap > 0, "the relay reports its heap");
        assert!(
            heap_per_k <= HEAP_PER_K,
            "heap grew {heap_per_k:.1} KiB per 1,000 operations"
        );
        assert!(
            end <= warm + RSS_SLACK,
            "RSS rose {} KiB after warm-up",
            (end - warm) / 1024
        );
        assert_eq!(
            end_broadcasts, base_broadcasts,
            "broadcast table back to its base"
        );
        assert!(
            end_tracks <= warm_tracks,
            "relay tracks {end_tracks} at the end, {warm_tracks} after warm-up"
        );
    });
}
