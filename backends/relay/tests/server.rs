//! The thread-per-core server on real loopback sockets, on both drivers:
//! SO_REUSEPORT spreading, the connection limit, metrics, drain.

mod common;

use std::future::Future;
use std::io::Write;
use std::rc::Rc;
use std::time::{Duration, Instant};

use common::*;
use skiff_monoio::driver::{ActiveDriver, DriverKind};
use skiff_relay::conn::Connection;
use skiff_relay::handler::ConnectionHandler;
use skiff_relay::server;

/// Writes back every byte it reads; stops at EOF or when the server drains:
/// the server's runtime, limits, metrics and drain without the protocol.
#[derive(Debug, Clone, Copy, Default)]
struct EchoHandler;

impl ConnectionHandler for EchoHandler {
    type Error = std::io::Error;

    #[allow(clippy::manual_async_fn)]
    fn serve(
        self: Rc<Self>,
        conn: Connection,
    ) -> impl Future<Output = std::io::Result<()>> + 'static {
        async move {
            let (mut reader, mut writer) = conn.into_split();
            loop {
                match reader.read_or_drain().await? {
                    None | Some([]) => break,
                    Some(data) => writer.write_all(data).await?,
                }
            }
            writer.close().await
        }
    }
}

// --- accept spreading ---

#[test]
fn reuseport_spreads_connections_over_both_threads() {
    for kind in drivers() {
        within(60, move || {
            let handle = server::start(config(2, kind), |_| EchoHandler).expect("start");
            let want = if kind == DriverKind::IoUring {
                ActiveDriver::IoUring
            } else {
                ActiveDriver::Legacy
            };
            assert_eq!(handle.drivers(), &[want, want]);
            let addr = handle.local_addr();
            // Each connection comes from a new source port, so the kernel's
            // reuseport hash spreads them; 64 all on one socket would be a 2^-63 event.
            let mut clients = Vec::new();
            for i in 0..64u32 {
                let mut c = connect(addr);
                echo_once(&mut c, format!("hello {i}").as_bytes());
                clients.push(c);
            }
            let m = handle.metrics();
            let per_thread: Vec<u64> = (0..2).map(|i| m.thread(i).snapshot().accepted).collect();
            assert_eq!(per_thread.iter().sum::<u64>(), 64);
            assert!(
                per_thread.iter().all(|&n| n > 0),
                "{kind:?}: accepts per thread {per_thread:?}"
            );
            assert_eq!(m.total().open, 64);
            drop(clients);
            let report = handle.shutdown().expect("shutdown");
            assert_eq!(report.forced(), 0);
        });
    }
}

#[test]
fn large_echo_exercises_buffer_reuse() {
    for kind in drivers() {
        within(60, move || {
            let handle = server::start(config(1, kind), |_| EchoHandler).unwrap();
            let mut c = connect(handle.local_addr());
            // Larger than one read buffer: the echo comes back in pieces.
            let msg: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
            let writer = {
                let mut w = c.try_clone().unwrap();
                let msg = msg.clone();
                std::thread::spawn(move || w.write_all(&msg).unwrap())
            };
            let mut back = vec![0u8; msg.len()];
            std::io::Read::read_exact(&mut c, &mut back).unwrap();
            writer.join().unwrap();
            assert!(back == msg, "{kind:?}: echo differs");
            let m = handle.metrics();
            eventually("byte counters", || m.total().bytes_out == 1_000_000);
            assert_eq!(m.total().bytes_in, 1_000_000);
            drop(c);
            handle.shutdown().unwrap();
        });
    }
}

// --- connection limit ---

#[test]
fn over_the_limit_is_accepted_and_closed() {
    for kind in drivers() {
        within(60, move || {
            let mut cfg = config(1, kind);
            cfg.limits.max_connections = 2;
            let handle = server::start(cfg, |_| EchoHandler).unwrap();
            let addr = handle.local_addr();
            let mut a = connect(addr);
            let mut b = connect(addr);
            echo_once(&mut a, b"a");
            echo_once(&mut b, b"b");
            let mut c = connect(addr);
            assert!(
                closed_by_peer(&mut c),
                "{kind:?}: third connection should be closed"
            );
            let t = handle.metrics().total();
            assert_eq!((t.accepted, t.open, t.refused), (2, 2, 1));
            // Room again once one closes.
            drop(a);
            eventually("the close", || handle.metrics().total().open == 1);
            let mut d = connect(addr);
            echo_once(&mut d, b"d");
            echo_once(&mut b, b"b again");
            drop((b, d));
            handle.shutdown().unwrap();
        });
    }
}

// --- metrics endpoint ---

#[test]
fn metrics_endpoint_serves_prometheus_text() {
    for kind in drivers() {
        within(60, move || {
            let mut cfg = config(2, kind);
            cfg.metrics = Some("127.0.0.1:0".parse().unwrap());
            let handle = server::start(cfg, |_| EchoHandler).unwrap();
            let maddr = handle.metrics_addr().expect("metrics bound");
            let mut c = connect(handle.local_addr());
            echo_once(&mut c, b"twelve bytes");
            let m = handle.metrics();
            eventually("byte counters", || m.total().bytes_out == 12);
            let (status, body) = http_get(maddr, "/metrics");
            assert_eq!(status, "HTTP/1.1 200 OK");
            assert_eq!(sample(&body, "skiff_relay_worker_threads"), Some(2));
            assert_eq!(
                sample(&body, "skiff_relay_connections_accepted_total"),
                Some(1)
            );
            assert_eq!(sample(&body, "skiff_relay_connections_open"), Some(1));
            assert_eq!(sample(&body, "skiff_relay_received_bytes_total"), Some(12));
            assert_eq!(sample(&body, "skiff_relay_sent_bytes_total"), Some(12));
            let uring = u64::from(kind == DriverKind::IoUring);
            assert_eq!(
                sample(&body, "skiff_relay_thread_io_uring{thread=\"1\"}"),
                Some(uring)
            );
            assert!(body.contains("# TYPE skiff_relay_connections_refused_total counter"));
            // Any path works.
            let (status, _) = http_get(maddr, "/anything/else");
            assert_eq!(status, "HTTP/1.1 200 OK");
            drop(c);
            handle.shutdown().unwrap();
        });
    }
}

#[test]
fn metrics_endpoint_rejects_other_methods() {
    let mut cfg = config(1, DriverKind::Legacy);
    cfg.metrics = Some("127.0.0.1:0".parse().unwrap());
    within(30, move || {
        let handle = server::start(cfg, |_| EchoHandler).unwrap();
        let mut s = connect(handle.metrics_addr().unwrap());
        s.write_all(b"POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
            .unwrap();
        let mut resp = String::new();
        std::io::Read::read_to_string(&mut s, &mut resp).unwrap();
        assert!(resp.starts_with("HTTP/1.1 405"), "{resp}");
        handle.shutdown().unwrap();
    });
}

// --- drain ---

#[test]
fn stop_drains_echo_connections_promptly() {
    for kind in drivers() {
        within(60, move || {
            let mut cfg = config(2, kind);
            cfg.drain_timeout = Duration::from_secs(10);
            let handle = server::start(cfg, |_| EchoHandler).unwrap();
            let addr = handle.local_addr();
            let mut idle: Vec<_> = (0..8).map(|_| connect(addr)).collect();
            for c in &mut idle {
                echo_once(c, b"x");
            }
            let t0 = Instant::now();
            let report = handle.shutdown().unwrap();
            // The echo handler watches the drain signal: no need for the timeout.
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "{kind:?}: drain took {:?}",
                t0.elapsed()
            );
            assert_eq!(report.forced(), 0);
            for c in &mut idle {
                assert!(closed_by_peer(c));
            }
            // No longer listening.
            assert!(std::net::TcpStream::connect_timeout(&addr, IO_TIMEOUT).is_err());
        });
    }
}

/// Reads and ignores everything and never looks at the drain signal.
struct Stubborn;

impl ConnectionHandler for Stubborn {
    type Error = std::io::Error;

    #[allow(clippy::manual_async_fn)]
    fn serve(
        self: Rc<Self>,
        conn: Connection,
    ) -> impl Future<Output = std::io::Result<()>> + 'static {
        async move {
            let (mut r, _w) = conn.into_split();
            while !r.read().await?.is_empty() {}
            Ok(())
        }
    }
}

#[test]
fn drain_timeout_closes_handlers_that_ignore_it() {
    for kind in drivers() {
        within(60, move || {
            let mut cfg = config(1, kind);
            cfg.drain_timeout = Duration::from_millis(300);
            let handle = server::start(cfg, |_| Stubborn).unwrap();
            let mut c = connect(handle.local_addr());
            c.write_all(b"hi").unwrap();
            eventually("the bytes", || handle.metrics().total().bytes_in == 2);
            let t0 = Instant::now();
            let report = handle.shutdown().unwrap();
            let took = t0.elapsed();
            assert!(
                took >= Duration::from_millis(300),
                "{kind:?}: returned before the drain timeout ({took:?})"
            );
            assert!(
                took < Duration::from_secs(5),
                "{kind:?}: drain took {took:?}"
            );
            assert_eq!(report.forced(), 1);
            assert!(
                closed_by_peer(&mut c),
                "{kind:?}: forced connection should be closed"
            );
        });
    }
}

#[test]
fn io_uring_asked_for_explicitly_fails_cleanly_when_missing() {
    if skiff_monoio::driver::io_uring_available() {
        return; // Nothing to check on this kernel: io_uring works.
    }
    let err = server::start(config(1, DriverKind::IoUring), |_| EchoHandler).unwrap_err();
    assert!(err.to_string().contains("io_uring"), "{err}");
}

#[test]
fn listen_on_a_foreign_address_is_an_error() {
    let mut cfg = config(1, DriverKind::Legacy);
    cfg.listen = "192.0.2.1:9".parse().unwrap(); // TEST-NET-1: not ours, so bind fails
    let err = server::start(cfg, |_| EchoHandler).unwrap_err();
    assert!(
        err.to_string().starts_with("cannot listen on 192.0.2.1:9"),
        "{err}"
    );
}
