//! A publisher whose link goes silent (its close is lost: the relay's side
//! of its connection stays open until the idle timeout) and a second
//! publisher of the same path, through a real relay: the newest
//! announcement takes the route over at once, and a viewer that keeps its
//! subscription goes on with the second publisher's groups, long before
//! the old connection could time out (docs/protocol.md §4).
//!
//! The silent link is a small TCP forwarder between the first publisher
//! and the relay that stops forwarding, in both directions, without
//! closing either side. The idle timeouts of the relay and of the
//! publishers, and the relay's write-stall timeout, are set far beyond the
//! test's own bound, so the delivery cannot come from the old connection
//! being retired.

mod common;

use std::cell::RefCell;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::*;
use skiff_core::conn;
use skiff_monoio::driver::{self, DriverKind};
use skiff_relay::relay::RelayHandler;
use skiff_relay::server;
use skiff_testkit::client::{self, ClientCtx, FrameReader, Publisher, Subscriber};

const FRAMES: u64 = 5;
/// The second publisher's first group.
const SECOND_FIRST: u64 = 1000;
/// The relay's idle and write-stall timeouts: far past the test's bound.
const RELAY_TIMEOUT: Duration = Duration::from_secs(600);
/// The test's bound.
const BOUND_SECS: u64 = 60;

fn payload(g: u64, i: u64) -> Vec<u8> {
    let mut p = Vec::with_capacity(256);
    p.extend_from_slice(&g.to_le_bytes());
    p.extend_from_slice(&i.to_le_bytes());
    while p.len() < 256 {
        p.push((g * 5 + i * 3 + p.len() as u64) as u8);
    }
    p
}

/// `d` as the core's duration.
fn core_time(d: Duration) -> skiff_core::time::Duration {
    skiff_core::time::Duration::from_millis(d.as_millis() as u64)
}

/// A TCP forwarder to `to` for one connection: copies both ways until
/// `silent` is set, then forwards nothing more and closes nothing (the
/// sockets stay open until `done` is set).
fn forwarder(to: SocketAddr, silent: Arc<AtomicBool>, done: Arc<AtomicBool>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind forwarder");
    let addr = listener.local_addr().expect("forwarder address");
    std::thread::spawn(move || {
        let Ok((client, _)) = listener.accept() else {
            return;
        };
        let Ok(relay) = TcpStream::connect(to) else {
            return;
        };
        let pipe = |from: TcpStream, to: TcpStream| {
            let (silent, done) = (silent.clone(), done.clone());
            std::thread::spawn(move || {
                let (mut from, mut to) = (from, to);
                let _ = from.set_read_timeout(Some(Duration::from_millis(5)));
                let mut buf = vec![0u8; 64 << 10];
                while !done.load(Ordering::Relaxed) {
                    if silent.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(5));
                        continue;
                    }
                    match from.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => {
                            if silent.load(Ordering::Relaxed) {
                                continue;
                            }
                            if to.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                        Err(e)
                            if matches!(
                                e.kind(),
                                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                            ) => {}
                        Err(_) => break,
                    }
                }
                // Held open until the test ends: a close would tell the relay.
                while !done.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(5));
                }
            });
        };
        pipe(
            client.try_clone().expect("clone"),
            relay.try_clone().expect("clone"),
        );
        pipe(relay, client);
    });
    addr
}

/// Publishes "live/cam" track "video" through `url`: groups of [`FRAMES`]
/// frames 5 ms apart from group `first` on, until `stop` is set.
fn publish(url: String, first: u64, stop: Rc<std::cell::Cell<bool>>) {
    let ctx = Rc::new(ClientCtx::new(16 << 20));
    // The idle timeout in force is the smaller of the two ends' (docs/protocol.md
    // §2.5): the publisher's as long as the relay's.
    ctx.set_transport(conn::Config {
        max_idle_timeout: core_time(RELAY_TIMEOUT),
        ..ctx.transport()
    });
    let (origin, producer) = ctx.publication("live/cam", "video");
    {
        let ctx = ctx.clone();
        monoio::spawn(async move {
            let mut app = Publisher::default();
            let _ = client::run(&url, Some(origin), &mut app, &ctx).await;
        });
    }
    monoio::spawn(async move {
        for g in first.. {
            let Ok(mut group) = producer.create_group(g) else {
                return;
            };
            for i in 0..FRAMES {
                if stop.get() {
                    ctx.close_all();
                    return;
                }
                let _ = group.write_frame(g * 1000 + i, &payload(g, i));
                ctx.notify().bump();
                monoio::time::sleep(Duration::from_millis(5)).await;
            }
            let _ = group.finish();
            ctx.notify().bump();
        }
    });
}

/// What the viewer saw: frames by group, in arrival order.
#[derive(Debug, Default)]
struct Seen {
    frames: Vec<(u64, u64)>,
    errors: Vec<String>,
}

/// Returns what the viewer saw, and the last group it had from the first
/// publisher when the link went silent.
async fn scenario(relay: SocketAddr) -> (Seen, u64) {
    let silent = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicBool::new(false));
    let via = forwarder(relay, silent.clone(), done.clone());
    let stop = Rc::new(std::cell::Cell::new(false));
    publish(format!("tcp://{via}/"), 0, stop.clone());
    // The viewer.
    let ctx = Rc::new(ClientCtx::new(16 << 20));
    let local = ctx.track("video");
    let app = Subscriber::new("live/cam", local);
    let state = app.state.clone();
    {
        let (ctx, url) = (ctx.clone(), format!("tcp://{relay}/"));
        monoio::spawn(async move {
            let mut app = app;
            let _ = client::run(&url, None, &mut app, &ctx).await;
        });
    }
    let seen = Rc::new(RefCell::new(Seen::default()));
    {
        let (seen, notify) = (seen.clone(), ctx.notify().clone());
        monoio::spawn(async move {
            let mut reader = FrameReader::new(local);
            reader
                .read_to_end(&notify, |f| {
                    let mut s = seen.borrow_mut();
                    if f.payload != payload(f.group, f.index).as_slice() {
                        s.errors
                            .push(format!("frame {}/{} differs", f.group, f.index));
                    }
                    s.frames.push((f.group, f.index));
                })
                .await;
        });
    }
    let reached = |g: u64| {
        let seen = seen.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(BOUND_SECS / 2);
            while seen.borrow().frames.last().is_none_or(|f| f.0 < g) {
                assert!(Instant::now() < deadline, "the viewer never reached {g}");
                monoio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    };
    reached(2).await;
    // The first publisher's link goes silent; it writes on into it.
    silent.store(true, Ordering::Relaxed);
    monoio::time::sleep(Duration::from_millis(20)).await;
    let last_old = seen.borrow().frames.last().map_or(0, |f| f.0);
    // The camera's new connection: the same path, again.
    let stop2 = Rc::new(std::cell::Cell::new(false));
    publish(format!("tcp://{relay}/"), SECOND_FIRST, stop2.clone());
    reached(SECOND_FIRST + 3).await;
    assert_eq!(state.closed.get(), None, "the viewer's subscription ended");
    stop.set(true);
    stop2.set(true);
    ctx.close_all();
    done.store(true, Ordering::Relaxed);
    monoio::time::sleep(Duration::from_millis(50)).await;
    let seen = Rc::try_unwrap(seen)
        .map(RefCell::into_inner)
        .unwrap_or_default();
    (seen, last_old)
}

#[test]
fn a_second_publisher_takes_over_from_a_silent_one_before_the_idle_timeout() {
    // One worker: a reconnecting camera landing on another worker than its
    // old session waits for that session's end (the module docs of
    // `skiff_core::relay::routes`).
    for kind in drivers() {
        let (seen, last_old) = within(BOUND_SECS, move || {
            let mut config = config(1, kind);
            config.timeouts.idle = RELAY_TIMEOUT;
            config.timeouts.write = RELAY_TIMEOUT;
            let handle =
                server::start(config, RelayHandler::factory(1).unwrap()).expect("start relay");
            let relay = handle.local_addr();
            let out = driver::block_on(kind, move |_| scenario(relay)).expect("client runtime");
            handle.shutdown().expect("relay stops");
            out
        });
        check(&seen, last_old, kind);
    }
}

/// The first publisher's groups in order, each whole except the one the
/// silence cut; then the second publisher's, each whole and in order from
/// the first it sent; nothing of the first after the switch.
fn check(seen: &Seen, last_old: u64, kind: DriverKind) {
    assert!(seen.errors.is_empty(), "{kind:?}: {:?}", seen.errors);
    let switch = seen
        .frames
        .iter()
        .position(|f| f.0 >= SECOND_FIRST)
        .expect("no frame of the second publisher");
    let (old, new) = seen.frames.split_at(switch);
    assert!(
        old.iter().all(|f| f.0 <= last_old + 1),
        "{kind:?}: the first publisher's late groups reached the viewer: {old:?}"
    );
    assert!(
        new.iter().all(|f| f.0 >= SECOND_FIRST),
        "{kind:?}: the first publisher's groups after the switch: {new:?}"
    );
    let mut want = (new[0].0, 0);
    for &f in new {
        assert_eq!(
            f, want,
            "{kind:?}: the second publisher's frames out of order"
        );
        want = if f.1 + 1 == FRAMES {
            (f.0 + 1, 0)
        } else {
            (f.0, f.1 + 1)
        };
    }
    for w in old.windows(2) {
        let (a, b) = (w[0], w[1]);
        assert!(
            (b.0 == a.0 && b.1 == a.1 + 1) || (b.0 > a.0 && b.1 == 0),
            "{kind:?}: the first publisher's frames out of order: {a:?} then {b:?}"
        );
    }
    eprintln!(
        "{kind:?}: {} frames of the first publisher (silent after group {last_old}), then {} of the second from group {}",
        old.len(),
        new.len(),
        new[0].0
    );
}
