//! Strangers on a relay's QUIC port (docs/protocol.md §11.8), against a
//! real `skiff-relay` process serving a certificate it generated: a client
//! that finishes the QUIC handshake and never sends SETUP (or trickles it),
//! a handshake that never completes, handshakes past `--max-handshakes` and
//! the per-address quota, handshakes taking a Retry, garbage and truncated
//! datagrams, a spoofed Initial whose answers must stay within three times
//! its size, and a client the relay forgot, answered with a stateless
//! reset. Each runs while an SDK publisher and viewer stream over `moql://`
//! through the same relay, and the viewer must get every frame, in order
//! and intact.

mod common;
mod peers;
mod sdk_stream;

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::http_get;
use peers::{RelayMetrics, RelayProcess, eventually_within, start_relay};
use sdk_stream::Stream;
use skiff_monoio::Config;
use skiff_monoio::driver::{self, DriverKind};
use skiff_monoio::tls::{Fingerprint, Trust};
use skiff_quic::quinn_proto;

/// `--handshake-timeout` of the relays under test.
const HANDSHAKE: Duration = Duration::from_secs(1);
/// CONTROL_MESSAGE_TIMEOUT (docs/protocol.md §3.15).
const CONTROL_MESSAGE_TIMEOUT: u64 = 0x11;
/// Frames per group the publisher writes, one every [`FRAME_GAP`].
const PER_GROUP: u64 = 10;
const FRAME_GAP: Duration = Duration::from_millis(10);
const WAIT: Duration = Duration::from_secs(30);

/// Starts a relay with a generated certificate and `extra` flags; returns it
/// with the fingerprint of its certificate.
fn relay(extra: &[&str]) -> (RelayProcess, Fingerprint) {
    relay_on(1, extra)
}

/// [`relay`] with `threads` workers.
fn relay_on(threads: usize, extra: &[&str]) -> (RelayProcess, Fingerprint) {
    let handshake = format!("{}ms", HANDSHAKE.as_millis());
    let mut flags = vec![
        "--tls-generate",
        "localhost",
        "--handshake-timeout",
        &handshake,
    ];
    flags.extend_from_slice(extra);
    let relay = RelayProcess::start_threads(peers::relay_binary(), threads, &flags);
    let (status, body) = http_get(relay.addr, "/certificate.sha256");
    assert!(status.contains("200"), "{status}");
    let fingerprint = body.parse().expect("a fingerprint");
    (relay, fingerprint)
}

/// The payload of frame `i`: its index, then a pattern.
fn payload(i: u64) -> Vec<u8> {
    sdk_stream::pattern(i, 13, 1200)
}

/// Frames with their timestamps checked, [`FRAME_GAP`] apart and stamped
/// so (10 ms in the track's millisecond timescale): the track keeps a group
/// the newest one supersedes for the publisher's max age (5 s) of media
/// time, so stamps running faster than the frames are written would expire
/// a group still being read as soon as the next one's first frames arrive
/// ahead of its tail, as QUIC's newest-first streams let them after a stall.
const STREAM: Stream = Stream {
    payload,
    tick: 10,
    max_latency_secs: 20,
    per_group: PER_GROUP,
    frame_gap: FRAME_GAP,
    paced: false,
    ..sdk_stream::PACED
};

/// An SDK publisher and viewer over `moql://` on a thread of their own.
struct Audience {
    stop: Arc<AtomicBool>,
    seen: Arc<AtomicU64>,
    thread: std::thread::JoinHandle<(u64, Vec<u64>)>,
}

impl Audience {
    /// Starts both and waits until the viewer receives.
    fn start(addr: SocketAddr, fingerprint: Fingerprint) -> Audience {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(AtomicU64::new(0));
        let url = format!("moql://{addr}/");
        let thread = {
            let (stop, seen) = (stop.clone(), seen.clone());
            let mut config = Config::default();
            config.tls_fingerprint = Some(fingerprint);
            std::thread::spawn(move || {
                driver::block_on(DriverKind::Legacy, move |_| {
                    STREAM.until_stopped(url.clone(), url, config, stop, seen, WAIT)
                })
                .expect("client runtime")
            })
        };
        eventually_within(WAIT, "the viewer receives", || {
            seen.load(Ordering::SeqCst) > 0
        });
        Audience { stop, seen, thread }
    }

    /// Stops the publisher (after its current group), and checks that the
    /// viewer got every frame it published, in order and intact (the frames
    /// are checked as they arrive).
    fn finish(self) {
        let at_least = self.seen.load(Ordering::SeqCst) + 2 * PER_GROUP;
        eventually_within(WAIT, "frames after the strangers", || {
            self.seen.load(Ordering::SeqCst) >= at_least
        });
        self.stop.store(true, Ordering::SeqCst);
        let (published, seen) = self.thread.join().expect("audience");
        assert!(published >= 3 * PER_GROUP, "published {published}");
        assert_eq!(seen, (0..published).collect::<Vec<_>>());
    }
}

/// A QUIC client configuration that trusts exactly the relay's certificate.
fn client_config(fingerprint: Fingerprint) -> quinn_proto::ClientConfig {
    let alpn: Vec<&[u8]> = skiff_quic::config::ALPNS
        .iter()
        .map(|a| a.as_bytes())
        .collect();
    let tls = skiff_monoio::tls::client_config_for(&Trust::Pinned(fingerprint), &alpn).unwrap();
    skiff_quic::config::client_config(Arc::new(tls), 80).unwrap()
}

/// A client's first Initial to `server` (padded to 1200 bytes), made by a
/// sans-IO endpoint that is then forgotten: whoever sends it never answers.
fn initial(server: SocketAddr, fingerprint: Fingerprint) -> Vec<u8> {
    let mut endpoint = quinn_proto::Endpoint::new(
        Arc::new(quinn_proto::EndpointConfig::default()),
        None,
        true,
        None,
    );
    let now = Instant::now();
    let (_, mut conn) = endpoint
        .connect(now, client_config(fingerprint), server, "localhost")
        .unwrap();
    let mut buf = Vec::new();
    let t = conn.poll_transmit(now, 1, &mut buf).expect("an Initial");
    buf.truncate(t.size);
    buf
}

/// A std UDP socket on loopback that reads with a short timeout.
fn udp() -> UdpSocket {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    s
}

/// Reads what reaches `socket` for `span`: (datagrams, bytes).
fn received_for(socket: &UdpSocket, span: Duration) -> (u64, u64) {
    let (mut n, mut bytes) = (0, 0);
    let mut buf = [0u8; 65536];
    let until = Instant::now() + span;
    while Instant::now() < until {
        if let Ok(len) = socket.recv(&mut buf) {
            n += 1;
            bytes += len as u64;
        }
    }
    (n, bytes)
}

/// A deterministic byte source (xorshift64*).
struct Noise(u64);

impl Noise {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// The start of a client's SETUP stream (docs/protocol.md §3.5): the stream
/// type, a Message Length of 64, one parameter, the Path's ID and a 60-byte
/// value to come.
const SETUP_START: &[u8] = &[0x01, 0x40, 0x40, 0x01, 0x02, 0x3c];

/// How a connection the relay's QUIC endpoint accepted ended, as seen by a
/// client that finished the handshake and then sent nothing (or, with
/// `trickle`, the start of its SETUP and then one byte every 100 ms).
fn silent_client(
    addr: SocketAddr,
    fingerprint: Fingerprint,
    trickle: bool,
) -> (Duration, Option<u64>) {
    let config = client_config(fingerprint);
    driver::block_on(DriverKind::Legacy, move |_| async move {
        let clock = skiff_monoio::clock::Clock::new();
        let endpoint = skiff_monoio::quic::Endpoint::client(addr, clock).unwrap();
        let (mut conn, mut link) = endpoint.connect(config, addr, "localhost").unwrap();
        monoio::spawn(endpoint.clone().run());
        let deadline = Instant::now() + WAIT;
        let mut connected = None;
        let mut setup: Option<(quinn_proto::StreamId, Instant)> = None;
        let ended = loop {
            assert!(Instant::now() < deadline, "the relay never closed");
            link.deliver(&mut conn);
            let now = Instant::now();
            if conn.poll_timeout().is_some_and(|t| t <= now) {
                conn.handle_timeout(now);
            }
            let mut lost = None;
            while let Some(event) = conn.poll() {
                match event {
                    quinn_proto::Event::Connected => {
                        connected = Some(Instant::now());
                        if trickle {
                            let id = conn.streams().open(quinn_proto::Dir::Uni).unwrap();
                            conn.send_stream(id).write(SETUP_START).unwrap();
                            setup = Some((id, Instant::now()));
                        }
                    }
                    quinn_proto::Event::ConnectionLost { reason } => lost = Some(reason),
                    _ => {}
                }
            }
            if let Some((id, at)) = &mut setup
                && at.elapsed() >= Duration::from_millis(100)
                && lost.is_none()
            {
                *at = Instant::now();
                let _ = conn.send_stream(*id).write(b"a");
            }
            link.exchange(&mut conn);
            link.flush(&mut conn).await;
            if let Some(reason) = lost {
                break reason;
            }
            monoio::time::sleep(Duration::from_millis(2)).await;
        };
        endpoint.stop();
        let connected = connected.expect("the handshake completed");
        let code = match ended {
            quinn_proto::ConnectionError::ApplicationClosed(close) => {
                Some(close.error_code.into_inner())
            }
            _ => None,
        };
        (connected.elapsed(), code)
    })
    .expect("client runtime")
}

/// How a client's connection ended when it finished its handshake, then
/// missed everything the relay sent (the relay's close at the handshake
/// deadline among it), and spoke again after the deadline: the relay, which
/// forgot the connection, answers with a stateless reset. With `rebind`,
/// the client speaks again from a new source port (a NAT rebinding).
/// Returns the reason and the sizes of the client's last datagram and the
/// answers to it.
fn client_that_missed_the_close(
    addr: SocketAddr,
    fingerprint: Fingerprint,
    rebind: bool,
) -> (quinn_proto::ConnectionError, usize, Vec<usize>) {
    let mut socket = udp();
    let mut endpoint = quinn_proto::Endpoint::new(
        Arc::new(quinn_proto::EndpointConfig::default()),
        None,
        true,
        None,
    );
    let (ch, mut conn) = endpoint
        .connect(
            Instant::now(),
            client_config(fingerprint),
            addr,
            "localhost",
        )
        .unwrap();
    let deadline = Instant::now() + WAIT;
    let (mut buf, mut rx) = (Vec::new(), vec![0u8; 65536]);
    let mut connected: Option<Instant> = None;
    let mut feeding = true;
    let (mut last_sent, mut answers) = (0, Vec::new());
    loop {
        assert!(Instant::now() < deadline, "no reset came");
        let now = Instant::now();
        loop {
            buf.clear();
            let Some(t) = conn.poll_transmit(now, 1, &mut buf) else {
                break;
            };
            socket.send_to(&buf[..t.size], t.destination).unwrap();
            last_sent = t.size;
        }
        while let Some(event) = conn.poll_endpoint_events() {
            if let Some(back) = endpoint.handle_event(ch, event) {
                conn.handle_event(back);
            }
        }
        if let Ok((n, from)) = socket.recv_from(&mut rx)
            && feeding
        {
            if connected.is_some() {
                answers.push(n);
            }
            let data = bytes::BytesMut::from(&rx[..n]);
            let mut response = Vec::new();
            let now = Instant::now();
            if let Some(quinn_proto::DatagramEvent::ConnectionEvent(_, event)) =
                endpoint.handle(now, from, None, None, data, &mut response)
            {
                conn.handle_event(event);
            }
        }
        let now = Instant::now();
        if conn.poll_timeout().is_some_and(|t| t <= now) {
            conn.handle_timeout(now);
        }
        while let Some(event) = conn.poll() {
            match event {
                quinn_proto::Event::Connected => {
                    connected = Some(Instant::now());
                    feeding = false;
                }
                quinn_proto::Event::ConnectionLost { reason } => {
                    return (reason, last_sent, answers);
                }
                _ => {}
            }
        }
        if !feeding && connected.is_some_and(|at| at.elapsed() > HANDSHAKE * 2) {
            // Past the relay's deadline: speak, and listen again.
            if rebind {
                socket = udp();
            }
            conn.ping();
            feeding = true;
        }
    }
}

/// A client that missed the relay's close (speaking again from a new
/// source port if `new_port`) is answered with a stateless reset, smaller
/// than what provoked it.
fn gets_a_stateless_reset(relay: &RelayProcess, fingerprint: Fingerprint, new_port: bool) {
    let (reason, sent, answers) = client_that_missed_the_close(relay.addr, fingerprint, new_port);
    eprintln!("{reason:?} after {sent} bytes, answers {answers:?}");
    assert_eq!(reason, quinn_proto::ConnectionError::Reset);
    assert!(answers.iter().all(|&n| n < sent), "{answers:?} for {sent}");
}

#[test]
fn a_forgotten_connection_gets_a_stateless_reset() {
    let (relay, fingerprint) = relay(&[]);
    let audience = Audience::start(relay.addr, fingerprint);
    gets_a_stateless_reset(&relay, fingerprint, false);
    assert_eq!(relay.metric("skiff_relay_quic_connections"), 2);
    audience.finish();
}

/// With four workers, a forgotten client that speaks again from a new
/// source port still gets its stateless reset: the datagram reaches, by
/// its connection ID, the worker that issued the ID, whose reset key made
/// the token the client holds. (Picked by address, it would reach another
/// worker three times in four, which drops an ID it did not issue.)
#[test]
fn a_forgotten_connection_on_a_new_port_gets_the_reset_of_its_worker() {
    let (relay, fingerprint) = relay_on(4, &[]);
    assert_eq!(relay.metric("skiff_relay_quic_steering"), 1);
    let audience = Audience::start(relay.addr, fingerprint);
    for _ in 0..3 {
        gets_a_stateless_reset(&relay, fingerprint, true);
    }
    assert_eq!(relay.metric("skiff_relay_quic_connections"), 2);
    audience.finish();
}

#[test]
fn a_quic_client_without_setup_or_trickling_it_is_closed_at_the_handshake_timeout() {
    let (relay, fingerprint) = relay(&[]);
    let audience = Audience::start(relay.addr, fingerprint);
    // Handshake done, then no SETUP, or one trickled a byte at a time:
    // CONTROL_MESSAGE_TIMEOUT at the deadline.
    for trickle in [false, true] {
        let (after, code) = silent_client(relay.addr, fingerprint, trickle);
        eprintln!("closed {after:?} after the handshake with {code:?} (trickle: {trickle})");
        assert_eq!(code, Some(CONTROL_MESSAGE_TIMEOUT));
        assert!(
            after < HANDSHAKE * 3,
            "closed {after:?} after the handshake"
        );
    }
    // An Initial and nothing more: the connection the relay made for it is
    // gone by the same deadline, not held for QUIC's 30 s idle timeout.
    let socket = udp();
    socket
        .send_to(&initial(relay.addr, fingerprint), relay.addr)
        .unwrap();
    let sent = Instant::now();
    eventually_within(WAIT, "the half-open connection counted", || {
        relay.metric("skiff_relay_quic_connections") == 3
    });
    eventually_within(WAIT, "the half-open connection gone", || {
        relay.metric("skiff_relay_quic_connections") == 2
    });
    // Until the deadline, not through the close's draining period (three
    // probe timeouts, about a second each without an RTT sample) nor
    // QUIC's idle timeout.
    let held = sent.elapsed();
    eprintln!("half-open connection held {held:?}");
    assert!(held >= HANDSHAKE, "closed before the deadline: {held:?}");
    assert!(held < HANDSHAKE * 2, "held {held:?}");
    audience.finish();
}

#[test]
fn handshakes_take_a_retry_when_asked_and_still_connect() {
    let (relay, fingerprint) = relay(&["--quic-retry-above", "0"]);
    let audience = Audience::start(relay.addr, fingerprint);
    // The publisher and the viewer each proved their address first.
    eventually_within(WAIT, "two retries counted", || {
        relay.metric("skiff_relay_quic_retries_total") >= 2
    });
    // A spoofed Initial gets a Retry and no connection.
    let socket = udp();
    socket
        .send_to(&initial(relay.addr, fingerprint), relay.addr)
        .unwrap();
    let (n, bytes) = received_for(&socket, Duration::from_millis(500));
    assert_eq!(n, 1, "one Retry");
    assert!(bytes < 200, "a Retry of {bytes} bytes");
    assert_eq!(relay.metric("skiff_relay_quic_connections"), 2);
    eventually_within(WAIT, "three retries counted", || {
        relay.metric("skiff_relay_quic_retries_total") >= 3
    });
    audience.finish();
}

#[test]
fn garbage_and_truncated_datagrams_are_dropped() {
    let (relay, fingerprint) = relay(&[]);
    let audience = Audience::start(relay.addr, fingerprint);
    let dropped_before = relay.metric("skiff_relay_quic_dropped_datagrams_total");
    let socket = udp();
    let mut noise = Noise(0x5eed_1234_abcd_0001);
    let real = initial(relay.addr, fingerprint);
    let (mut sent, mut sent_bytes) = (0u64, 0u64);
    for k in 0..3000u64 {
        let datagram = match k % 3 {
            // Random bytes of any length.
            0 => {
                let len = 1 + (noise.next() % 1400) as usize;
                noise.bytes(len)
            }
            // A real Initial cut short: below the 1200 bytes an Initial
            // must fill.
            1 => {
                let len = 1 + (noise.next() % 1199) as usize;
                real[..len].to_vec()
            }
            // Short-header packets for connection IDs nobody issued.
            _ => {
                let len = 20 + (noise.next() % 1200) as usize;
                let mut p = noise.bytes(len);
                p[0] = 0x40 | (p[0] & 0x3f);
                p
            }
        };
        sent += 1;
        sent_bytes += datagram.len() as u64;
        socket.send_to(&datagram, relay.addr).unwrap();
        if k % 100 == 99 {
            // Paced a little, so the kernel's socket buffer keeps them all.
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    let (answers, answer_bytes) = received_for(&socket, Duration::from_millis(500));
    eprintln!(
        "{answers} answers ({answer_bytes} bytes) to {sent} datagrams ({sent_bytes} bytes), {} dropped",
        relay.metric("skiff_relay_quic_dropped_datagrams_total") - dropped_before
    );
    // Answers are the library's stateless resets and version negotiations
    // only: fewer and smaller than what provoked them.
    assert!(answers < sent, "{answers} answers to {sent}");
    assert!(
        answer_bytes < sent_bytes,
        "{answer_bytes} bytes back for {sent_bytes}"
    );
    eventually_within(WAIT, "the dropped datagrams counted", || {
        relay.metric("skiff_relay_quic_dropped_datagrams_total") >= dropped_before + sent
    });
    assert_eq!(relay.metric("skiff_relay_quic_connections"), 2);
    audience.finish();
}

#[test]
fn quic_handshakes_past_the_per_address_quota_are_refused() {
    let (relay, fingerprint) = relay(&["--max-connections-per-ip", "4"]);
    let audience = Audience::start(relay.addr, fingerprint);
    let refused_before = relay.metric("skiff_relay_connections_refused_total");
    let quota_before = relay.metric("skiff_relay_quota_refused_total");
    // Thirty handshakes from 127.0.0.1, which has two connections open.
    let sockets: Vec<UdpSocket> = (0..30).map(|_| udp()).collect();
    for s in &sockets {
        s.send_to(&initial(relay.addr, fingerprint), relay.addr)
            .unwrap();
    }
    eventually_within(WAIT, "the handshakes past the quota refused", || {
        relay.metric("skiff_relay_connections_refused_total") >= refused_before + 28
    });
    assert!(relay.metric("skiff_relay_quic_connections") <= 4);
    assert!(relay.metric("skiff_relay_quota_refused_total") >= quota_before + 28);
    // Each one hears back at once: the two admitted their server's flight,
    // the refused a CONNECTION_REFUSED smaller than their Initial.
    let answered = sockets
        .iter()
        .filter(|s| received_for(s, Duration::from_millis(100)).0 > 0)
        .count();
    assert_eq!(answered, sockets.len());
    eprintln!(
        "refused {}, open {}",
        relay.metric("skiff_relay_connections_refused_total") - refused_before,
        relay.metric("skiff_relay_quic_connections")
    );
    audience.finish();
}

#[test]
fn a_flood_of_initials_past_the_threshold_takes_retries_and_holds_no_state() {
    let (relay, fingerprint) = relay(&["--quic-retry-above", "50"]);
    let audience = Audience::start(relay.addr, fingerprint);
    let retries_before = relay.metric("skiff_relay_quic_retries_total");
    // A thousand Initials from addresses that never answer: the first fifty
    // make connections (half-open until the deadline), every later one
    // gets a Retry and costs the relay nothing more.
    let sockets: Vec<UdpSocket> = (0..1000).map(|_| udp()).collect();
    let initials: Vec<Vec<u8>> = sockets
        .iter()
        .map(|_| initial(relay.addr, fingerprint))
        .collect();
    for (s, i) in sockets.iter().zip(&initials) {
        s.send_to(i, relay.addr).unwrap();
    }
    eventually_within(WAIT, "the Retries counted", || {
        relay.metric("skiff_relay_quic_retries_total") >= retries_before + 950
    });
    let open = relay.metric("skiff_relay_quic_connections");
    eprintln!("{open} QUIC connections open during the flood");
    assert!(open <= 2 + 50, "{open} open");
    eventually_within(WAIT, "the half-open connections gone", || {
        relay.metric("skiff_relay_quic_connections") == 2
    });
    audience.finish();
}

#[test]
fn quic_handshakes_count_against_max_handshakes_until_setup() {
    three_handshakes_until_setup(&[
        "--max-handshakes",
        "3",
        "--max-handshakes-per-ip",
        "3",
        "--quic-retry-above",
        "100",
    ]);
}

#[test]
fn quic_handshakes_count_against_max_handshakes_per_ip_until_setup() {
    three_handshakes_until_setup(&["--max-handshakes-per-ip", "3", "--quic-retry-above", "100"]);
}

/// With `flags` allowing three handshakes (in all or from 127.0.0.1), five
/// Initials from there: two are refused, the three hold their slots until
/// the handshake deadline, and a new one is admitted after.
fn three_handshakes_until_setup(flags: &[&str]) {
    let (relay, fingerprint) = relay(flags);
    // The publisher and the viewer are set up: neither counts.
    let audience = Audience::start(relay.addr, fingerprint);
    let quota_before = relay.metric("skiff_relay_quota_refused_total");
    let sockets: Vec<UdpSocket> = (0..5).map(|_| udp()).collect();
    for s in &sockets {
        s.send_to(&initial(relay.addr, fingerprint), relay.addr)
            .unwrap();
    }
    eventually_within(WAIT, "two handshakes past the quota refused", || {
        relay.metric("skiff_relay_quota_refused_total") >= quota_before + 2
    });
    assert_eq!(relay.metric("skiff_relay_quic_connections"), 2 + 3);
    assert_eq!(
        relay.metric("skiff_relay_quota_refused_total"),
        quota_before + 2
    );
    // At the deadline the three give their slots back.
    eventually_within(WAIT, "the half-open handshakes gone", || {
        relay.metric("skiff_relay_quic_connections") == 2
    });
    let late = udp();
    late.send_to(&initial(relay.addr, fingerprint), relay.addr)
        .unwrap();
    eventually_within(WAIT, "a new handshake admitted", || {
        relay.metric("skiff_relay_quic_connections") == 3
    });
    assert_eq!(
        relay.metric("skiff_relay_quota_refused_total"),
        quota_before + 2
    );
    audience.finish();
}

#[test]
fn an_unvalidated_address_gets_at_most_three_times_what_it_sent() {
    let (relay, fingerprint) = relay(&[]);
    let audience = Audience::start(relay.addr, fingerprint);
    let socket = udp();
    let first = initial(relay.addr, fingerprint);
    socket.send_to(&first, relay.addr).unwrap();
    // The relay's flight, its retransmissions and its close at the
    // handshake deadline, to an address that never answers.
    let (n, bytes) = received_for(&socket, HANDSHAKE * 3);
    eprintln!("{n} datagrams, {bytes} bytes back for {}", first.len());
    assert!(n >= 1, "the relay answered");
    assert!(
        bytes <= 3 * first.len() as u64,
        "{bytes} bytes back for {}",
        first.len()
    );
    audience.finish();
}

/// Half-open QUIC connections the memory test makes.
const HALF_OPEN: u64 = 1000;

#[test]
fn a_half_open_quic_connection_holds_under_64_kib() {
    // Every protection that would refuse or Retry them out of the way, and
    // a deadline past the measurement.
    let relay = start_relay(&[
        "--tls-generate",
        "localhost",
        "--max-handshakes",
        "100000",
        "--max-connections-per-ip",
        "100000",
        "--quic-retry-above",
        "100000",
        "--handshake-timeout",
        "60s",
    ]);
    let (_, body) = http_get(relay.addr, "/certificate.sha256");
    let fingerprint: Fingerprint = body.parse().expect("a fingerprint");
    let audience = Audience::start(relay.addr, fingerprint);
    let before = relay.settled_rss();
    let sockets: Vec<UdpSocket> = (0..HALF_OPEN).map(|_| udp()).collect();
    for s in &sockets {
        s.send_to(&initial(relay.addr, fingerprint), relay.addr)
            .unwrap();
        // Paced, so the relay's handshakes share the CPU with the audience.
        std::thread::sleep(Duration::from_millis(1));
    }
    eventually_within(WAIT, "the half-open connections made", || {
        relay.metric("skiff_relay_quic_connections") == 2 + HALF_OPEN
    });
    let each = relay.settled_rss().saturating_sub(before) / HALF_OPEN;
    eprintln!("a half-open QUIC connection holds {each} bytes");
    // The library's connection and its TLS state: the session's tables
    // wait for a completed handshake.
    assert!(each < 64 * 1024, "{each} bytes each");
    audience.finish();
}
