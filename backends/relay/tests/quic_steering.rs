//! Connection-ID steering across a relay's worker endpoints
//! (docs/protocol.md §11.8), against a real `skiff-relay` process with four
//! workers: a publisher and a viewer on the SDK over `moql://` each talk to
//! the relay through a UDP forwarder that moves them to a new source port
//! (a NAT rebinding) several times while they stream. Every datagram still
//! reaches the worker that owns its connection, so no worker drops one and
//! the viewer gets every frame, in order and intact. Every handshake takes a
//! Retry, so the retried Initial must reach the worker whose token key made
//! the token too.
//!
//! Without the steering filter the kernel picks a worker by the addresses,
//! so a new source port lands on another worker three times in four with
//! four workers (`skiff_monoio::reuseport`'s tests show the spread); that
//! worker does not know the connection ID and drops the datagram, and this
//! test stalls at the first rebinding that lands elsewhere.

mod common;
mod peers;
mod sdk_stream;

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use common::{http_get, sample};
use peers::{RelayMetrics, RelayProcess, eventually_within, relay_binary};
use sdk_stream::Stream;
use skiff_monoio::Config;
use skiff_monoio::driver::{self, DriverKind};
use skiff_monoio::tls::Fingerprint;

const WORKERS: usize = 4;
/// Frames per group the publisher writes, one every [`FRAME_GAP`].
const PER_GROUP: u64 = 10;
const FRAME_GAP: Duration = Duration::from_millis(10);
/// New source ports each forwarder moves its client to.
const REBINDS: u64 = 6;
/// Datagrams from the client between two rebindings.
const REBIND_EVERY: u64 = 40;
const WAIT: Duration = Duration::from_secs(30);

/// The payload of frame `i`: its index, then a pattern.
fn payload(i: u64) -> Vec<u8> {
    sdk_stream::pattern(i, 7, 1200)
}

/// Frames with their timestamps checked, [`FRAME_GAP`] apart; a group
/// starts once the viewer has the one before.
const STREAM: Stream = Stream {
    payload,
    max_latency_secs: 20,
    per_group: PER_GROUP,
    frame_gap: FRAME_GAP,
    ..sdk_stream::PACED
};

/// A UDP forwarder between one client and the relay that sends the
/// client's datagrams from a new source port after every [`REBIND_EVERY`]
/// of them, [`REBINDS`] times, and closes the old port, as a NAT that
/// forgot a mapping makes a new one for the next outbound datagram (what
/// the relay still sends to the old port is lost).
struct Forwarder {
    /// Where the client sends.
    front: SocketAddr,
    rebinds: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Vec<u16>>,
}

impl Forwarder {
    fn start(relay: SocketAddr) -> Forwarder {
        let front = UdpSocket::bind("127.0.0.1:0").unwrap();
        front.set_nonblocking(true).unwrap();
        let addr = front.local_addr().unwrap();
        let rebinds = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (rebinds, stop) = (rebinds.clone(), stop.clone());
            std::thread::spawn(move || forward(front, relay, &rebinds, &stop))
        };
        Forwarder {
            front: addr,
            rebinds,
            stop,
            thread,
        }
    }

    /// Stops it; returns the source ports it sent from, in order.
    fn finish(self) -> Vec<u16> {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().expect("forwarder")
    }
}

fn outbound() -> UdpSocket {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.set_nonblocking(true).unwrap();
    s
}

fn forward(
    front: UdpSocket,
    relay: SocketAddr,
    rebinds: &AtomicU64,
    stop: &AtomicBool,
) -> Vec<u16> {
    let mut back = outbound();
    let mut ports = vec![back.local_addr().unwrap().port()];
    let mut client: Option<SocketAddr> = None;
    let mut since = 0u64;
    let mut buf = vec![0u8; 65536];
    while !stop.load(Ordering::SeqCst) {
        let mut fds = [
            libc::pollfd {
                fd: front.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: back.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: two live pollfds, count 2; the sockets outlive the call.
        unsafe { libc::poll(fds.as_mut_ptr(), 2, 20) };
        while let Ok((n, from)) = front.recv_from(&mut buf) {
            client = Some(from);
            since += 1;
            if since > REBIND_EVERY && rebinds.load(Ordering::SeqCst) < REBINDS {
                // A new mapping, made by this outbound datagram.
                back = outbound();
                ports.push(back.local_addr().unwrap().port());
                rebinds.fetch_add(1, Ordering::SeqCst);
                since = 1;
            }
            let _ = back.send_to(&buf[..n], relay);
        }
        while let Ok((n, _)) = back.recv_from(&mut buf) {
            if let Some(c) = client {
                let _ = front.send_to(&buf[..n], c);
            }
        }
    }
    ports
}

/// One series per worker: `skiff_relay_thread_{family}{thread="i"}`.
fn per_worker(relay: &RelayProcess, family: &str) -> Vec<u64> {
    let (_, body) = http_get(relay.metrics, "/metrics");
    (0..WORKERS)
        .map(|i| {
            let series = format!("skiff_relay_thread_{family}{{thread=\"{i}\"}}");
            sample(&body, &series).unwrap_or_else(|| panic!("no {series}"))
        })
        .collect()
}

#[test]
fn rebinding_clients_keep_their_worker_and_every_frame_arrives() {
    let relay = RelayProcess::start_threads(
        relay_binary(),
        WORKERS,
        &[
            "--tls-generate",
            "localhost",
            // Every handshake takes a Retry.
            "--quic-retry-above",
            "0",
        ],
    );
    let (status, body) = http_get(relay.addr, "/certificate.sha256");
    assert!(status.contains("200"), "{status}");
    let fingerprint: Fingerprint = body.parse().expect("a fingerprint");
    assert_eq!(relay.metric("skiff_relay_quic_steering"), 1);

    let viewer_path = Forwarder::start(relay.addr);
    let publisher_path = Forwarder::start(relay.addr);
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(AtomicU64::new(0));
    let clients = {
        let (stop, seen) = (stop.clone(), seen.clone());
        let viewer_url = format!("moql://{}/", viewer_path.front);
        let publisher_url = format!("moql://{}/", publisher_path.front);
        let mut config = Config::default();
        config.tls_fingerprint = Some(fingerprint);
        std::thread::spawn(move || {
            driver::block_on(DriverKind::Legacy, move |_| {
                STREAM.until_stopped(viewer_url, publisher_url, config, stop, seen, WAIT)
            })
            .expect("client runtime")
        })
    };
    eventually_within(WAIT, "both clients rebound", || {
        viewer_path.rebinds.load(Ordering::SeqCst) >= REBINDS
            && publisher_path.rebinds.load(Ordering::SeqCst) >= REBINDS
    });
    // Frames after the last rebinding too.
    let at_least = seen.load(Ordering::SeqCst) + 2 * PER_GROUP;
    eventually_within(WAIT, "frames after the rebindings", || {
        seen.load(Ordering::SeqCst) >= at_least
    });
    // The endpoints' counters reach the metrics every 100 ms.
    std::thread::sleep(Duration::from_millis(300));
    let connections = per_worker(&relay, "quic_connections");
    let dropped = per_worker(&relay, "quic_dropped_datagrams_total");
    let retries = relay.metric("skiff_relay_quic_retries_total");
    eprintln!(
        "QUIC connections per worker {connections:?}, dropped {dropped:?}, retries {retries}"
    );
    assert_eq!(connections.iter().sum::<u64>(), 2, "{connections:?}");
    assert_eq!(
        dropped,
        vec![0; WORKERS],
        "datagrams reached a worker that does not know them"
    );
    assert!(retries >= 2, "{retries} Retry packets");

    stop.store(true, Ordering::SeqCst);
    let (published, got) = clients.join().expect("clients");
    let viewer_ports = viewer_path.finish();
    let publisher_ports = publisher_path.finish();
    eprintln!("viewer source ports {viewer_ports:?}, publisher's {publisher_ports:?}");
    assert_eq!(viewer_ports.len() as u64, REBINDS + 1);
    assert_eq!(publisher_ports.len() as u64, REBINDS + 1);
    assert!(published >= 4 * PER_GROUP, "published {published}");
    assert_eq!(got, (0..published).collect::<Vec<_>>());
}
