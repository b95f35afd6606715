//! Relays and clients built and dropped again and again give their memory
//! back: a relay worker's origins, cache pool and tables, and an SDK
//! client's (or a testkit client context's) pool and tables, are freed when
//! the last handle drops, so the process does not grow with each one.

mod common;

use std::rc::Rc;
use std::time::Duration;

use common::*;
use skiff_core::model::track::Info;
use skiff_monoio::buffers::give_back_memory;
use skiff_monoio::clock::Clock;
use skiff_monoio::driver::{self, DriverKind};
use skiff_monoio::notify::Notify;
use skiff_monoio::sdk::Request;
use skiff_relay::config::RelayConfig;
use skiff_relay::relay::{Relay, RelayHandler};
use skiff_relay::server;
use skiff_testkit::client::{ClientCtx, ClientLimits};
use skiff_testkit::counting::{Counting, live_bytes};

#[global_allocator]
static A: Counting = Counting;

/// Rounds before the first sample (thread-local pools and caches fill).
const WARM: usize = 5;
/// Rounds measured.
const ROUNDS: usize = 200;
/// Rounds of a relay server with a connected client measured.
const SERVER_ROUNDS: usize = 40;
/// The process's resident growth allowed over the measured rounds.
const RSS_BOUND: u64 = 4 << 20;

/// The resident set is the process's: the tests take turns.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Waits for the other tests of this file to finish their turn.
fn turn() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// The process's resident set in bytes (`VmRSS` of `/proc/self/status`).
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("VmRSS")
        * 1024
}

/// The least of three samples of the resident set, after the allocator gave
/// freed memory back to the system.
fn rss_settled() -> u64 {
    (0..3)
        .map(|_| {
            give_back_memory();
            std::thread::sleep(Duration::from_millis(5));
            rss()
        })
        .min()
        .unwrap_or(0)
}

/// A relay configuration with a cache of `cache` bytes.
fn relay_config(cache: u64) -> RelayConfig {
    RelayConfig {
        cache_bytes: cache,
        ..config(1, DriverKind::Legacy)
    }
}

/// Runs `round` [`WARM`] times, then [`ROUNDS`] times measured: the live
/// heap must come back to the byte and the resident set stay within
/// [`RSS_BOUND`]. `what` names the thing each round builds and drops.
fn rounds_give_back(what: &str, mut round: impl FnMut()) {
    for _ in 0..WARM {
        round();
    }
    let (live0, rss0) = (live_bytes(), rss_settled());
    for _ in 0..ROUNDS {
        round();
    }
    let (live1, rss1) = (live_bytes(), rss_settled());
    eprintln!(
        "{ROUNDS} × {what}: live heap {live0} B -> {live1} B, RSS {} KiB -> {} KiB",
        rss0 >> 10,
        rss1 >> 10
    );
    assert_eq!(live1, live0, "a dropped {what} keeps heap bytes");
    assert!(
        rss1 <= rss0 + RSS_BOUND,
        "RSS grew {} KiB over {ROUNDS} × {what}",
        (rss1 - rss0) >> 10
    );
}

#[test]
fn a_relay_built_and_dropped_gives_its_memory_back() {
    within(300, || {
        let _turn = turn();
        let config = relay_config(16 << 20);
        let round = |config: &RelayConfig| {
            driver::block_on(DriverKind::Legacy, |_| async {
                let relay = Relay::new(1, config, Notify::shared(), Clock::new());
                // Touch the cache as a served track would.
                let pool = relay.pool();
                let mut block = pool.alloc().expect("a block");
                block.append(&[7u8; 4096]);
                drop(block);
                drop(relay);
            })
            .expect("runtime");
        };
        rounds_give_back("relay", || round(&config));
    });
}

#[test]
fn a_client_context_built_and_dropped_gives_its_memory_back() {
    within(300, || {
        let _turn = turn();
        let round = || {
            driver::block_on(DriverKind::Legacy, |_| async {
                // SAFETY: every handle below is dropped before the contexts.
                let ctx = Rc::new(unsafe { ClientCtx::owning(8 << 20, ClientLimits::default()) });
                let sibling = ctx.sibling();
                let (_origin, producer) = ctx.publication("cam", "video");
                let mut g = producer.create_group(0).expect("group");
                g.write_frame(0, &[3u8; 2000]).expect("frame");
                g.finish().expect("finish");
                drop(g);
                let local = sibling.track("audio");
                sibling.release(local);
                drop(producer);
                drop(ctx);
                drop(sibling);
            })
            .expect("runtime");
        };
        rounds_give_back("client context", round);
    });
}

/// One SDK client on a fresh runtime: publishes `cam/video`, subscribes to
/// it through the relay at `url`, reads one frame, closes. Returns the
/// frame's payload length once the runner returned: its session has ended
/// and its connection's reader task with it.
fn client_round(url: &str) -> usize {
    let url = url.to_owned();
    driver::block_on(DriverKind::Legacy, move |_| async move {
        let mut config = skiff_monoio::Config::default();
        config.pool_bytes = 4 << 20;
        let (client, runner) = skiff_monoio::connect(&url, config).expect("connect");
        let running = monoio::spawn(runner.run());
        let broadcast = client.publish("cam").expect("publish");
        let mut track = broadcast
            .create_track(Info::new("video").expect("name"))
            .expect("track");
        let mut consumer = client
            .subscribe("cam", "video", Request::LIVE)
            .await
            .expect("subscribe");
        let mut sequence = 0;
        let len = loop {
            let mut group = track.create_group(sequence).expect("group");
            group.write_frame(0, &[9u8; 1500]).await.expect("frame");
            group.finish().expect("finish");
            sequence += 1;
            let next = monoio::time::timeout(Duration::from_millis(200), consumer.next_group());
            if let Ok(Ok(Some(mut g))) = next.await
                && let Ok(Some(frame)) = g.read_frame().await
            {
                break frame.payload.to_vec().len();
            }
        };
        drop(consumer);
        drop(track);
        drop(broadcast);
        client.close().await;
        running.await;
        len
    })
    .expect("runtime")
}

#[test]
fn a_relay_server_and_client_started_and_stopped_keep_rss_flat() {
    within(300, || {
        let _turn = turn();
        // A round returns the live heap its client left on this thread.
        // Only the client's part is counted: the server's threads own and
        // free what this thread hands them (its configuration, the handle's
        // shared state), so the thread's count around a server's start and
        // shutdown moves by whichever thread drops such a value last; the
        // resident set covers the server.
        let round = || {
            let make = RelayHandler::factory(1).expect("factory");
            let handle = server::start(relay_config(16 << 20), make).expect("relay");
            let url = format!("tcp://{}/", handle.local_addr());
            let before = live_bytes();
            assert_eq!(client_round(&url), 1500);
            let kept = live_bytes() - before;
            handle.shutdown().expect("shutdown");
            kept
        };
        for _ in 0..WARM {
            round();
        }
        let rss0 = rss_settled();
        let client_live: i64 = (0..SERVER_ROUNDS).map(|_| round()).sum();
        let rss1 = rss_settled();
        eprintln!(
            "{SERVER_ROUNDS} relay servers with a client: the clients' live heap \
             {client_live:+} B, RSS {} KiB -> {} KiB",
            rss0 >> 10,
            rss1 >> 10
        );
        assert_eq!(client_live, 0, "closed clients keep heap bytes");
        assert!(
            rss1 <= rss0 + RSS_BOUND,
            "RSS grew {} KiB",
            (rss1 - rss0) >> 10
        );
    });
}
