//! Misbehaving peers against a real relay on loopback: each is closed (with
//! a moq-lite or QMux close code where the protocol allows one) while one
//! publisher keeps feeding ten well-behaved subscribers, who must receive
//! every frame in order.
//!
//! The bad peers are blocking std sockets on their own threads, speaking
//! through skiff's sans-IO session where they need valid bytes (and to decode
//! the relay's close frame). The relay runs with 1 s handshake and write
//! timeouts so the whole test takes seconds.

mod common;
mod peers;

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant as StdInstant};

use common::*;
use peers::*;
use skiff_core::model::track;
use skiff_core::session::Config;
use skiff_monoio::driver::{self, DriverKind};
use skiff_relay::config::RelayConfig;
use skiff_relay::metrics::Metrics;
use skiff_relay::relay::RelayHandler;
use skiff_relay::server::{self, ServerHandle};
use skiff_testkit::client::{self, ClientCtx, Publisher, Subscriber};

/// Relay timeouts under test.
const HANDSHAKE: Duration = Duration::from_secs(1);
const WRITE_STALL: Duration = Duration::from_secs(1);
/// CONTROL_MESSAGE_TIMEOUT (docs/protocol.md §3.15).
const CONTROL_MESSAGE_TIMEOUT: u64 = 0x11;
/// The QMux transport-close code for a violation (docs/protocol.md §2.6).
const QMUX_VIOLATION: u64 = 1002;

fn relay_config(kind: DriverKind) -> RelayConfig {
    let mut cfg = config(1, kind);
    cfg.cache_bytes = 64 << 20;
    cfg.timeouts.handshake = HANDSHAKE;
    cfg.timeouts.write = WRITE_STALL;
    // A dead reader holds at most this in the relay's kernel buffers.
    cfg.send_buffer = Some(64 << 10);
    // Long enough that only the timeouts under test close anyone.
    cfg.timeouts.idle = Duration::from_secs(30);
    cfg
}

fn start(cfg: RelayConfig) -> ServerHandle {
    let threads = cfg.threads.get();
    server::start(cfg, RelayHandler::factory(threads).unwrap()).expect("start relay")
}

// ---------------------------------------------------------------------------
// The bad peers
// ---------------------------------------------------------------------------

/// What a bad peer observed.
#[derive(Debug)]
struct Verdict {
    name: &'static str,
    /// How long after misbehaving the relay closed it (`None`: never).
    closed_after: Option<Duration>,
    /// `(code, application)` of the close frame, if one came.
    close: Option<(u64, bool)>,
}

/// Sends garbage instead of QMux parameters.
fn garbage(addr: SocketAddr) -> Verdict {
    let mut raw = Raw::connect(addr, Config::new(), None);
    let mut junk = vec![0xffu8; 64];
    raw.s.write_all(&junk).unwrap();
    junk.clear();
    // The relay's bytes decode as its parameters then a transport close.
    raw.send_output();
    let closed_after = raw.wait_closed(IO_TIMEOUT);
    Verdict {
        name: "garbage",
        closed_after,
        close: raw.close,
    }
}

/// Connects and sends nothing at all.
fn silent(addr: SocketAddr) -> Verdict {
    let mut raw = Raw::connect(addr, Config::new(), None);
    // Read what the relay sends (its parameters, then the close); our own
    // session's parameters are never sent.
    let closed_after = raw.wait_closed(IO_TIMEOUT);
    Verdict {
        name: "silent",
        closed_after,
        close: raw.close,
    }
}

/// Trickles valid QMux parameters one byte every 200 ms.
fn slowloris_handshake(addr: SocketAddr) -> Verdict {
    let mut raw = Raw::connect(addr, Config::new(), None);
    let params = raw.take_output();
    trickle(raw, &params, "slowloris-handshake")
}

/// Completes the handshake, then trickles an ANNOUNCE_REQUEST record one
/// byte every 200 ms (while answering the relay's pings).
fn slowloris_control(addr: SocketAddr) -> Verdict {
    let mut raw = Raw::connect(addr, Config::new(), None);
    raw.handshake();
    raw.session.announce_request("").expect("announce request");
    let record = raw.take_output();
    assert!(record.len() > 5, "announce request is a few bytes");
    trickle(raw, &record, "slowloris-control")
}

/// Writes `bytes` one every 200 ms, reading in between, until the relay
/// closes the connection (or they are all sent and it closes later).
fn trickle(mut raw: Raw, bytes: &[u8], name: &'static str) -> Verdict {
    let t = StdInstant::now();
    let mut closed_after = None;
    for &b in bytes {
        if raw.s.write_all(&[b]).is_err() {
            break;
        }
        let until = StdInstant::now() + Duration::from_millis(200);
        while StdInstant::now() < until {
            if !raw.read_once() {
                closed_after = Some(t.elapsed());
                break;
            }
        }
        if closed_after.is_some() {
            break;
        }
    }
    if closed_after.is_none() {
        closed_after = raw.wait_closed(IO_TIMEOUT).map(|_| t.elapsed());
    }
    Verdict {
        name,
        closed_after,
        close: raw.close,
    }
}

/// A raw subscriber that grants the relay a huge window (so only its socket
/// buffer, 4 KiB, holds the relay back) and whose subscription to the live
/// track has started.
fn greedy_subscriber(addr: SocketAddr, what: &str) -> Raw {
    let big = 1 << 30;
    let config = Config {
        conn: skiff_core::conn::Config {
            max_data: big,
            max_stream_data_bidi_local: big,
            max_stream_data_bidi_remote: big,
            max_stream_data_uni: big,
            ..skiff_core::conn::Config::new()
        },
        ..Config::new()
    };
    let mut raw = Raw::connect(addr, config, Some(4096));
    raw.handshake();
    raw.session
        .subscribe("demo", scratch_track(), live_request())
        .expect("subscribe");
    raw.send_output();
    let ok = raw.pump_until(IO_TIMEOUT, |r| !r.started.is_empty());
    assert!(ok, "the {what} subscriber's subscription did not start");
    raw
}

/// Grants the relay a huge window, subscribes to the live track, then stops
/// reading its (small) socket buffer: the relay must drop it after its write
/// timeout, seen as the relay's open-connection count falling back to
/// `others` while this peer still reads nothing. Afterwards it drains what
/// was buffered and must reach EOF while the publisher is still sending.
fn stalled_subscriber(addr: SocketAddr, metrics: &Metrics, others: u64) -> Verdict {
    let mut raw = greedy_subscriber(addr, "stalled");
    assert_eq!(metrics.total().open, others + 1);
    // Stop reading; the relay fills the socket buffers, then waits.
    let t = StdInstant::now();
    let mut closed_after = None;
    while t.elapsed() < WRITE_STALL * 5 {
        if metrics.total().open == others {
            closed_after = Some(t.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    // Drain what the kernel buffered: the stream must end.
    let mut buf = vec![0u8; 64 * 1024];
    let mut eof = false;
    let deadline = StdInstant::now() + IO_TIMEOUT;
    while StdInstant::now() < deadline {
        match raw.s.read(&mut buf) {
            Ok(0) => {
                eof = true;
                break;
            }
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => {
                eof = true;
                break;
            }
        }
    }
    Verdict {
        name: "stalled-subscriber",
        closed_after: closed_after.filter(|_| eof),
        close: None,
    }
}

/// Like [`stalled_subscriber`] but keeps reading, slowly (about 160 KB/s
/// against the publisher's 1 MiB/s): the relay must keep it for longer than
/// the write timeout, since every write makes progress.
fn slow_subscriber(addr: SocketAddr, metrics: &Metrics, others: u64) -> Verdict {
    let mut raw = greedy_subscriber(addr, "slow");
    let t = StdInstant::now();
    let mut buf = vec![0u8; 16 * 1024];
    let mut closed_after = None;
    while t.elapsed() < WRITE_STALL * 3 {
        match raw.s.read(&mut buf) {
            Ok(0) => {
                closed_after = Some(t.elapsed());
                break;
            }
            Err(e) if !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                closed_after = Some(t.elapsed());
                break;
            }
            _ => {}
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(metrics.total().open, others + 1, "slow subscriber dropped");
    Verdict {
        name: "slow-subscriber",
        closed_after,
        close: None,
    }
}

// ---------------------------------------------------------------------------
// The good clients
// ---------------------------------------------------------------------------

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

fn bad_peers_scenario(kind: DriverKind) {
    let handle = start(relay_config(kind));
    let addr = handle.local_addr();
    let url = format!("tcp://{addr}/");
    // `true` until the good clients are all receiving; then `true` again
    // once every bad peer is done.
    let flag = Arc::new(AtomicBool::new(true));
    let clients = {
        let flag = flag.clone();
        std::thread::spawn(move || {
            driver::block_on(kind, move |_| good_clients(url, flag, 8)).expect("client runtime")
        })
    };
    eventually_within(Duration::from_secs(20), "good subscribers started", || {
        !flag.load(Ordering::SeqCst)
    });
    let peers: Vec<fn(SocketAddr) -> Verdict> =
        vec![garbage, silent, slowloris_handshake, slowloris_control];
    let threads: Vec<_> = peers
        .into_iter()
        .map(|f| std::thread::spawn(move || f(addr)))
        .collect();
    let mut verdicts: Vec<Verdict> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    // Then, alone, so the open-connection count tells when it is dropped.
    let good = GOOD as u64 + 1;
    eventually("only the good clients connected", || {
        handle.metrics().total().open == good
    });
    let slow = slow_subscriber(addr, handle.metrics(), good);
    assert_eq!(slow.closed_after, None, "slow subscriber: {slow:?}");
    eventually("the slow subscriber gone", || {
        handle.metrics().total().open == good
    });
    verdicts.push(stalled_subscriber(addr, handle.metrics(), good));
    flag.store(true, Ordering::SeqCst);
    let seen = clients.join().expect("clients");
    for v in &verdicts {
        eprintln!("{kind:?}: {v:?}");
    }
    for v in &verdicts {
        assert!(v.closed_after.is_some(), "{}: not closed", v.name);
    }
    let by = |n: &str| verdicts.iter().find(|v| v.name == n).unwrap();
    assert_eq!(by("garbage").close, Some((QMUX_VIOLATION, false)));
    let stalled = by("stalled-subscriber").closed_after.unwrap();
    assert!(
        stalled >= WRITE_STALL && stalled < WRITE_STALL * 4,
        "stalled subscriber dropped after {stalled:?}"
    );
    // A peer that never sent a byte has no session (nothing was taken for
    // it): its socket is just closed at the handshake timeout.
    assert_eq!(by("silent").close, None, "silent: closed without a session");
    for n in ["silent", "slowloris-handshake", "slowloris-control"] {
        if n != "silent" {
            assert_eq!(
                by(n).close,
                Some((CONTROL_MESSAGE_TIMEOUT, true)),
                "{n}: close code"
            );
        }
        let after = by(n).closed_after.unwrap();
        assert!(after < HANDSHAKE * 3, "{n}: closed only after {after:?}");
    }
    check_good(&seen);
    // Every connection was let go, with its buffers and session storage.
    eventually("every connection closed", || {
        handle.metrics().total().open == 0
    });
    // The cache never held more than the track's budget (an eighth of the
    // cache) plus a group in flight: the stalled reader pinned nothing.
    let m = handle.metrics().total();
    eprintln!(
        "{kind:?}: cache {} bytes, high water {}",
        m.cache_bytes, m.cache_high_water
    );
    assert!(
        m.cache_high_water <= (64 << 20) / 8 + (1 << 20),
        "{kind:?}: cache grew to {} bytes",
        m.cache_high_water
    );
    handle.shutdown().expect("relay stops");
}

/// Garbage, a silent connection, slowloris writers (handshake and control
/// message) and a subscriber that stops reading are each closed, a slow but
/// live reader is kept, while ten subscribers receive every frame in order.
#[test]
fn bad_peers_are_closed_while_ten_subscribers_receive() {
    for kind in drivers() {
        within(120, move || bad_peers_scenario(kind));
    }
}

/// A peer that completes the handshake, then neither sends nor reads, is
/// dropped at the idle timeout (QMux closes silently there, docs/protocol.md §2.5).
#[test]
fn silent_after_setup_is_dropped_at_the_idle_timeout() {
    for kind in drivers() {
        within(60, move || {
            let mut cfg = relay_config(kind);
            cfg.timeouts.idle = Duration::from_secs(2);
            let handle = start(cfg);
            let mut raw = Raw::connect(handle.local_addr(), Config::new(), None);
            raw.handshake();
            let t = StdInstant::now();
            // Neither read nor write until the relay gives up.
            std::thread::sleep(Duration::from_secs(3));
            let closed = raw.wait_closed(IO_TIMEOUT);
            assert!(
                closed.is_some(),
                "{kind:?}: still open after {:?}",
                t.elapsed()
            );
            handle.shutdown().expect("relay stops");
        });
    }
}

/// A session over `--max-subscriptions` has its extra SUBSCRIBE refused
/// (INTERNAL 0x0, like a full table) while its first ones are served.
#[test]
fn subscriptions_over_the_limit_are_refused() {
    for kind in drivers() {
        within(60, move || {
            let mut cfg = relay_config(kind);
            cfg.limits.max_subscriptions = 2;
            let handle = start(cfg);
            let addr = handle.local_addr();
            let url = format!("tcp://{addr}/");
            let flag = Arc::new(AtomicBool::new(true));
            let clients = {
                let flag = flag.clone();
                std::thread::spawn(move || {
                    driver::block_on(kind, move |_| good_clients(url, flag, 2))
                        .expect("client runtime")
                })
            };
            eventually_within(Duration::from_secs(20), "good subscribers started", || {
                !flag.load(Ordering::SeqCst)
            });
            let mut raw = Raw::connect(addr, Config::new(), None);
            raw.handshake();
            for _ in 0..3 {
                raw.session
                    .subscribe("demo", scratch_track(), live_request())
                    .expect("subscribe");
            }
            raw.send_output();
            let ok = raw.pump_until(IO_TIMEOUT, |r| {
                r.started.len() == 2 && !r.refused.is_empty()
            });
            flag.store(true, Ordering::SeqCst);
            assert!(
                ok,
                "{kind:?}: started {:?}, refused {:?}",
                raw.started, raw.refused
            );
            assert_eq!(raw.refused, [Some(0)], "{kind:?}: refusal code");
            drop(raw);
            check_good(&clients.join().unwrap());
            handle.shutdown().expect("relay stops");
        });
    }
}

/// How group `seq` of `t` ended for a reader: `Ok(frames)` if complete,
/// `Err(Some(code))` if aborted, `Err(None)` if never received.
fn group_outcome(t: track::Ref<'static, 'static>, seq: u64) -> Result<usize, Option<u64>> {
    use skiff_core::model::group::{Next, ReadError};
    let Some(mut g) = t.group(seq) else {
        return Err(None);
    };
    let mut frames = 0;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match g.read_frame_header() {
            Ok(Next::Ready(h)) => {
                let mut got = 0;
                while got < h.len {
                    match g.read_payload(&mut buf[got..h.len]) {
                        Ok(Next::Ready(n)) => got += n,
                        Err(ReadError::Aborted(c)) => return Err(Some(c)),
                        _ => return Err(None),
                    }
                }
                frames += 1;
            }
            Ok(Next::Finished) => return Ok(frames),
            Err(ReadError::Aborted(c)) => return Err(Some(c)),
            _ => return Err(None),
        }
    }
}

async fn oversized_scenario(url: String) -> Vec<Result<usize, Option<u64>>> {
    let ctx = Rc::new(ClientCtx::new(64 << 20));
    let notify = ctx.notify().clone();
    let (origin, producer) = ctx.publication("demo", "video");
    {
        let (ctx, url) = (ctx.clone(), url.clone());
        monoio::spawn(async move {
            let mut app = Publisher::default();
            let _ = client::run(&url, Some(origin), &mut app, &ctx).await;
        });
    }
    let mut g0 = producer.create_group(0).unwrap();
    g0.write_frame(0, b"small").unwrap();
    notify.bump();
    let local = ctx.track("video");
    let app = Subscriber::new("demo", local);
    let state = app.state.clone();
    {
        let (ctx, url) = (ctx.clone(), url.clone());
        monoio::spawn(async move {
            let mut app = app;
            let _ = client::run(&url, None, &mut app, &ctx).await;
        });
    }
    skiff_testkit::wait::until(&notify, || state.started.get().is_some()).await;
    g0.finish().unwrap();
    // Group 1: one frame over --max-frame-bytes (16 KiB).
    let mut g = producer.create_group(1).unwrap();
    g.write_frame(0, &vec![1u8; 20 << 10]).unwrap();
    g.finish().unwrap();
    notify.bump();
    monoio::time::sleep(Duration::from_millis(50)).await;
    // Group 2: frames within the limit, 75 KiB in all: over --max-group-bytes (64 KiB).
    let mut g = producer.create_group(2).unwrap();
    for i in 0..5 {
        g.write_frame(i, &vec![2u8; 15 << 10]).unwrap();
        notify.bump();
        monoio::time::sleep(Duration::from_millis(5)).await;
    }
    g.finish().unwrap();
    notify.bump();
    monoio::time::sleep(Duration::from_millis(50)).await;
    // Group 3: fine again.
    let mut g = producer.create_group(3).unwrap();
    g.write_frame(0, b"fine").unwrap();
    g.finish().unwrap();
    notify.bump();
    for _ in 0..300 {
        if group_outcome(local, 3).is_ok() {
            break;
        }
        monoio::time::sleep(Duration::from_millis(10)).await;
    }
    let out = (0..4).map(|s| group_outcome(local, s)).collect();
    ctx.close_all();
    monoio::time::sleep(Duration::from_millis(50)).await;
    out
}

/// A publisher's frame over `--max-frame-bytes` and group over
/// `--max-group-bytes` lose that group (FRAME_TOO_LARGE 0x38 / GROUP_TOO_LARGE
/// 0x32); the groups around them arrive.
#[test]
fn oversized_frames_and_groups_are_dropped() {
    for kind in drivers() {
        within(60, move || {
            let mut cfg = relay_config(kind);
            cfg.limits.max_frame_bytes = 16 << 10;
            cfg.limits.max_group_bytes = 64 << 10;
            let handle = start(cfg);
            let url = format!("tcp://{}/", handle.local_addr());
            let out = driver::block_on(kind, move |_| oversized_scenario(url)).unwrap();
            assert_eq!(out[0], Ok(1), "{kind:?}: group 0");
            assert_eq!(
                out[1],
                Err(Some(0x38)),
                "{kind:?}: group 1 (FRAME_TOO_LARGE)"
            );
            assert_eq!(
                out[2],
                Err(Some(0x32)),
                "{kind:?}: group 2 (GROUP_TOO_LARGE)"
            );
            assert_eq!(out[3], Ok(1), "{kind:?}: group 3");
            handle.shutdown().expect("relay stops");
        });
    }
}

// ---------------------------------------------------------------------------
// Against a real skiff-relay process
// ---------------------------------------------------------------------------

/// 2,000 connections that never send a byte hold almost nothing, and give
/// it back when they close, while ten subscribers lose no frame.
#[test]
fn an_idle_connection_flood_holds_little_and_gives_it_back() {
    const IDLE: usize = 2000;
    within(150, || {
        let relay = start_relay(&[
            "--max-connections-per-ip",
            "5000",
            "--max-handshakes",
            "5000",
            "--max-handshakes-per-ip",
            "5000",
            "--handshake-timeout",
            "60s",
        ]);
        let addr = relay.addr;
        let audience = SteadyAudience::start(addr);
        std::thread::sleep(Duration::from_millis(300));
        let before = relay.rss();
        let idle: Vec<TcpStream> = (0..IDLE).map(|_| connect(addr)).collect();
        let open = GOOD as u64 + 1 + IDLE as u64;
        eventually_within(Duration::from_secs(30), "idle connections accepted", || {
            relay.metric("skiff_relay_connections_open") >= open
        });
        std::thread::sleep(Duration::from_millis(300));
        let during = relay.rss();
        drop(idle);
        eventually_within(Duration::from_secs(30), "idle connections closed", || {
            relay.metric("skiff_relay_connections_open") == GOOD as u64 + 1
        });
        std::thread::sleep(Duration::from_millis(300));
        let after = relay.rss();
        let seen = audience.finish();
        let per_idle = during.saturating_sub(before) / IDLE as u64;
        eprintln!(
            "idle flood: RSS {} KiB before, {} KiB with {IDLE} idle connections ({} B each), {} KiB after they closed",
            before / 1024,
            during / 1024,
            per_idle,
            after / 1024
        );
        check_good(&seen);
        assert!(
            per_idle <= 16 * 1024,
            "{per_idle} bytes per idle connection"
        );
        assert!(
            after <= before + (32 << 20),
            "RSS {after} after the flood, {before} before"
        );
    });
}

/// Connections from one address past `--max-connections-per-ip` are closed
/// at once and counted; the ones before keep working.
#[test]
fn connections_per_ip_over_the_quota_are_refused() {
    within(60, || {
        let relay = start_relay(&["--max-connections-per-ip", "3"]);
        let mut first: Vec<TcpStream> = (0..3).map(|_| connect(relay.addr)).collect();
        eventually_within(Duration::from_secs(10), "three open", || {
            relay.metric("skiff_relay_connections_open") == 3
        });
        let mut extra = connect(relay.addr);
        assert!(
            closed_by_peer(&mut extra),
            "the fourth connection stays open"
        );
        assert_eq!(relay.metric("skiff_relay_quota_refused_total"), 1);
        // The first three are still served: a raw session completes its handshake.
        drop(first.pop());
        eventually_within(Duration::from_secs(10), "one closed", || {
            relay.metric("skiff_relay_connections_open") == 2
        });
        let mut raw = Raw::connect(relay.addr, Config::new(), None);
        raw.handshake();
        drop(first);
    });
}

/// Connections still in their handshake past `--max-handshakes` are closed
/// at once; once one finishes its SETUP, room is made.
#[test]
fn handshakes_over_the_quota_are_refused() {
    within(60, || {
        let relay = start_relay(&["--max-handshakes", "2", "--max-handshakes-per-ip", "2"]);
        let mut done = Raw::connect(relay.addr, Config::new(), None);
        done.handshake();
        let silent: Vec<TcpStream> = (0..2).map(|_| connect(relay.addr)).collect();
        eventually_within(Duration::from_secs(10), "three open", || {
            relay.metric("skiff_relay_connections_open") == 3
        });
        let mut extra = connect(relay.addr);
        assert!(closed_by_peer(&mut extra), "a third handshake was let in");
        assert_eq!(relay.metric("skiff_relay_quota_refused_total"), 1);
        drop(silent);
        eventually_within(Duration::from_secs(10), "silent ones gone", || {
            relay.metric("skiff_relay_connections_open") == 1
        });
        let mut again = Raw::connect(relay.addr, Config::new(), None);
        again.handshake();
    });
}
