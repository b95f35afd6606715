//! What the interop tests over QUIC (docs/protocol.md §11) share: the frames
//! every publisher writes and every subscriber checks (bytes, order and
//! timestamp), moq-tokio 0.19.31's own QUIC client (its noq transport) as a
//! publisher and as a subscriber, and a relay's certificate fingerprint read
//! from its `GET /certificate.sha256`.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use skiff_monoio::tls::Fingerprint;

/// The ALPN of moq-lite-05 over QUIC: what skiff speaks, and so what a
/// moq-tokio client offering every version agrees on with skiff-relay.
pub const MOQ_LITE_05: &str = "moq-lite-05";
/// What the same client agrees on with moq-relay 0.17.10, the newest both know.
pub const MOQ_LITE_06: &str = "moq-lite-06";
/// Bound on every wait of a client.
pub const WAIT: Duration = Duration::from_secs(20);
/// SETUP path of every client; with `--auth-public '**'` (moq-relay) or no
/// access control (skiff-relay) it is the session's root.
pub const PATH: &str = "/anon";
pub const BROADCAST: &str = "live";
pub const TRACK: &str = "video";
pub const GROUPS: u64 = 6;
pub const FRAMES: u64 = 8;
/// Milliseconds between two frames, and the step of their timestamps: the
/// media runs at the pace it is written.
pub const FRAME_MS: u64 = 10;
/// Group and frame of the one big frame, and its size: more than a stream
/// window of skiff's (256 KiB), so QUIC flow control is crossed both ways.
pub const BIG_AT: (u64, u64) = (2, 3);
pub const BIG: usize = 300 * 1024 + 11;

/// The payload of frame `i` of group `g`: its coordinates, then a pattern.
pub fn payload(g: u64, i: u64) -> Vec<u8> {
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

/// The timestamp of frame `i` of group `g`, in milliseconds (the default
/// timescale of moq-net and of skiff's SDK).
pub fn timestamp(g: u64, i: u64) -> u64 {
    (g * FRAMES + i) * FRAME_MS
}

/// The coordinates a payload starts with.
pub fn coordinates(payload: &[u8]) -> Option<(u64, u64)> {
    let g = u64::from_le_bytes(payload.get(..8)?.try_into().ok()?);
    let i = u64::from_le_bytes(payload.get(8..16)?.try_into().ok()?);
    Some((g, i))
}

/// Checks one received frame against the next one expected (`next`, then
/// advanced): its place, its bytes and its timestamp. A mismatch is an error
/// line in `errors`.
pub fn check_frame(
    next: &mut (u64, u64),
    errors: &mut Vec<String>,
    group: u64,
    ts: u64,
    bytes: &[u8],
) {
    let at = coordinates(bytes);
    let (g, i) = *next;
    if group != g || at != Some((g, i)) {
        errors.push(format!(
            "group {group} frame {at:?} arrived where group {g} frame {i} was due"
        ));
    } else if bytes != payload(g, i).as_slice() {
        errors.push(format!(
            "group {g} frame {i}: {} bytes damaged",
            bytes.len()
        ));
    } else if ts != timestamp(g, i) {
        errors.push(format!(
            "group {g} frame {i}: timestamp {ts}, want {}",
            timestamp(g, i)
        ));
    }
    *next = if i + 1 == FRAMES {
        (g + 1, 0)
    } else {
        (g, i + 1)
    };
}

// ---------------------------------------------------------------------------
// A relay's fingerprint
// ---------------------------------------------------------------------------

/// The answer body of `GET /certificate.sha256` over `stream`.
fn get_fingerprint<S: Read + Write>(mut stream: S) -> Fingerprint {
    stream
        .write_all(
            b"GET /certificate.sha256 HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
        )
        .expect("send the request");
    stream.flush().expect("send the request");
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
            // A close without close_notify ends the answer too.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(e) => panic!("reading the answer: {e}"),
        }
    }
    let text = String::from_utf8(answer).expect("a text answer");
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP answer");
    assert!(head.starts_with("HTTP/1.1 200"), "answer: {head}");
    body.trim().parse().expect("64 hex digits")
}

/// The fingerprint skiff-relay at `addr` answers at `GET
/// /certificate.sha256` on its plain TCP port (a `--tls-generate`
/// certificate serves QUIC only).
pub fn skiff_relay_fingerprint(addr: SocketAddr) -> Fingerprint {
    let sock = TcpStream::connect(addr).expect("connect to the relay's TCP port");
    sock.set_read_timeout(Some(WAIT)).expect("socket timeout");
    get_fingerprint(sock)
}

/// The fingerprint an HTTP listener at `addr` (moq-relay's
/// `--web-http-listen`) answers at `GET /certificate.sha256`, or `None`
/// while it does not listen yet.
pub fn http_fingerprint(addr: SocketAddr) -> Option<Fingerprint> {
    let sock = TcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok()?;
    sock.set_read_timeout(Some(WAIT)).ok()?;
    Some(get_fingerprint(sock))
}

// ---------------------------------------------------------------------------
// moq-tokio's QUIC client
// ---------------------------------------------------------------------------

/// A moq-tokio client that dials `url` (`moql://…`, or `https://…` for
/// WebTransport) over its noq QUIC transport, offering every version it
/// knows (the server picks moq-lite-05 by ALPN or `WT-Protocol`), the
/// server's certificate pinned to `fingerprint` (for `http://…`, to what the
/// server's `/certificate.sha256` answers), dialing once.
/// Call it inside a tokio runtime: it binds its UDP socket.
pub fn moq_client(url: &str, fingerprint: Fingerprint) -> Result<moq_tokio::Client, String> {
    let mut config = moq_tokio::connect::Config::default();
    config.url = Some(url.parse().map_err(|e| format!("url {url}: {e}"))?);
    // An `http://` URL fetches the pin from the server's
    // `/certificate.sha256` itself (then dials `https://`), which moq-tokio
    // does only while no pin is configured.
    if !url.starts_with("http://") {
        config.tls.fingerprint = vec![fingerprint.to_string()];
    }
    config.once = Some(true);
    config
        .init(moq_tokio::quic::Config::default())
        .map_err(|e| format!("moq-tokio client: {e}"))
}

/// A moq-tokio publisher of [`BROADCAST`]/[`TRACK`] over QUIC: dials `url`,
/// announces, checks the session runs `version`, waits for `ready` to fire
/// and for a subscription to reach it,
/// then writes every frame at [`FRAME_MS`] intervals, one group per
/// [`FRAMES`], and stays connected until `done` fires.
pub async fn moq_publisher(
    url: String,
    fingerprint: Fingerprint,
    version: &'static str,
    ready: tokio::sync::oneshot::Receiver<()>,
    done: tokio::sync::oneshot::Receiver<()>,
) -> Result<(), String> {
    let hop = moq_net::Hop::new(0x5151).map_err(|e| format!("hop: {e}"))?;
    let origin = moq_tokio::origin::spawn_config(moq_net::origin::Config::new(hop));
    let info = moq_net::track::Info::default();
    let timescale = info.timescale;
    let broadcast = origin
        .create_broadcast(BROADCAST)
        .map_err(|e| format!("broadcast: {e}"))?;
    let track = broadcast
        .create_track(TRACK, info)
        .map_err(|e| format!("track: {e}"))?;
    broadcast
        .announce(moq_net::origin::Route::default())
        .map_err(|e| format!("announce: {e}"))?;
    let client = moq_client(&url, fingerprint)?;
    let connection = client
        .clone()
        .publish(origin.consume())
        .ok_or("the client has no URL")?;
    let connection = tokio::time::timeout(WAIT, connection.established())
        .await
        .map_err(|_| "the publisher's QUIC connect timed out".to_owned())?
        .map_err(|e| format!("publisher connect: {e}"))?;
    check_version(&connection, version)?;
    tokio::time::timeout(WAIT, ready)
        .await
        .map_err(|_| "the subscribers were not ready in time".to_owned())?
        .map_err(|_| "the subscribers gave up".to_owned())?;
    tokio::time::timeout(WAIT, track.used())
        .await
        .map_err(|_| "no subscription reached the publisher".to_owned())?
        .map_err(|e| format!("used: {e}"))?;
    for g in 0..GROUPS {
        let mut group = track
            .create_group(moq_net::group::Info::from(g))
            .map_err(|e| format!("group: {e}"))?;
        for i in 0..FRAMES {
            let ts = moq_net::Timestamp::new(timestamp(g, i), timescale)
                .map_err(|_| "timestamp overflow".to_owned())?;
            group
                .write_frame(ts, bytes::Bytes::from(payload(g, i)))
                .map_err(|e| format!("frame: {e}"))?;
            tokio::time::sleep(Duration::from_millis(FRAME_MS)).await;
        }
        group.finish().map_err(|e| format!("finish group: {e}"))?;
    }
    let result = tokio::select! {
        _ = done => Ok(()),
        err = connection.closed() => Err(format!("the relay closed the publisher's session: {err:?}")),
        () = tokio::time::sleep(WAIT) => Err("the publisher was not released in time".to_owned()),
    };
    let _ = track.finish();
    let _ = tokio::time::timeout(Duration::from_secs(2), connection.close()).await;
    let _ = tokio::time::timeout(Duration::from_secs(2), client.close()).await;
    result
}

/// Fails unless the session runs `version`, agreed by ALPN
/// (docs/protocol.md §11.1).
fn check_version(connection: &moq_tokio::Connection, version: &str) -> Result<(), String> {
    match connection.version().map(|v| v.alpn()) {
        Some(v) if v == version => Ok(()),
        other => Err(format!("the session runs {other:?}, not {version}")),
    }
}

/// What a moq-tokio subscriber received.
#[derive(Debug, Default)]
pub struct Received {
    /// The next frame due.
    pub next: (u64, u64),
    /// Frames that were not the one due, damaged, or with a wrong timestamp.
    pub errors: Vec<String>,
    /// Group sequences in the order they arrived.
    pub arrival: Vec<u64>,
}

/// A moq-tokio subscriber over QUIC: dials `url`, checks the session runs
/// `version`, waits for [`BROADCAST`]'s
/// announcement, subscribes to [`TRACK`] from group 0, says so on
/// `subscribed`, and reads [`GROUPS`] groups, checking every frame.
pub async fn moq_subscriber(
    url: String,
    fingerprint: Fingerprint,
    version: &'static str,
    subscribed: tokio::sync::mpsc::Sender<()>,
) -> Result<Received, String> {
    let hop = moq_net::Hop::new(0x5252).map_err(|e| format!("hop: {e}"))?;
    let origin = moq_tokio::origin::spawn_config(moq_net::origin::Config::new(hop));
    let client = moq_client(&url, fingerprint)?;
    let connection = client
        .clone()
        .consume(origin.clone())
        .ok_or("the client has no URL")?;
    let connection = tokio::time::timeout(WAIT, connection.established())
        .await
        .map_err(|_| "the subscriber's QUIC connect timed out".to_owned())?
        .map_err(|e| format!("subscriber connect: {e}"))?;
    check_version(&connection, version)?;
    let mut received = Received::default();
    let read = tokio::time::timeout(WAIT, read_track(&origin, subscribed, &mut received)).await;
    let _ = tokio::time::timeout(Duration::from_secs(2), connection.close()).await;
    let _ = tokio::time::timeout(Duration::from_secs(2), client.close()).await;
    match read {
        Ok(Ok(())) => Ok(received),
        Ok(Err(e)) => Err(format!("{e}; received {received:?}")),
        Err(_) => Err(format!("timed out; received {received:?}")),
    }
}

/// Waits for the announcement, subscribes, and reads [`GROUPS`] groups into
/// `received`.
async fn read_track(
    origin: &moq_net::origin::Producer,
    subscribed: tokio::sync::mpsc::Sender<()>,
    received: &mut Received,
) -> Result<(), String> {
    let consumer = origin.consume();
    let mut announced = consumer.announced();
    loop {
        let update = announced
            .next()
            .await
            .ok_or("origin closed before the announcement")?;
        if update.kind.is_active() && update.prefix.as_str() == BROADCAST {
            break;
        }
    }
    let broadcast = consumer
        .routed_broadcast(BROADCAST)
        .await
        .map_err(|e| format!("broadcast: {e}"))?;
    let track = broadcast.track(TRACK).map_err(|e| format!("track: {e}"))?;
    let subscription = moq_net::track::Subscription::default()
        .with_max_age(Duration::from_secs(10))
        .with_start(Some(moq_net::track::Position::group(0)));
    let mut subscriber = track
        .subscribe(subscription)
        .await
        .map_err(|e| format!("subscribe: {e}"))?;
    let _ = subscribed.send(()).await;
    let timescale = subscriber.info().timescale;
    while received.next.0 < GROUPS {
        let mut group = subscriber
            .recv_group()
            .await
            .map_err(|e| format!("group: {e}"))?
            .ok_or("the track ended early")?;
        received.arrival.push(group.sequence);
        while let Some(frame) = group
            .read_frame()
            .await
            .map_err(|e| format!("group {} frame: {e}", group.sequence))?
        {
            let ts = frame
                .timestamp
                .convert(timescale)
                .map_err(|_| "timestamp overflow")?
                .value();
            check_frame(
                &mut received.next,
                &mut received.errors,
                group.sequence,
                ts,
                &frame.payload,
            );
        }
    }
    Ok(())
}

/// Subscribers [`moq_tokio_through_skiff_relay`] starts.
pub const SUBSCRIBERS: usize = 3;
/// Bound on [`moq_tokio_through_skiff_relay`]'s whole scenario.
pub const SCENARIO: Duration = Duration::from_secs(50);

/// A `skiff-relay` with `threads` workers and a `--tls-generate`
/// certificate, and moq-tokio's client on both ends of it: one publisher
/// and [`SUBSCRIBERS`] subscribers dial `scheme://` (`moql`, `https`, or
/// `http`: moq-tokio then fetches the pin from the relay's
/// `/certificate.sha256` on its TCP port) with the certificate pinned. Once
/// the scenario is done, `before_shutdown` checks the relay; then each
/// subscriber must have received every frame of every group, with its
/// bytes, order and timestamp.
pub fn moq_tokio_through_skiff_relay(
    threads: usize,
    scheme: &str,
    before_shutdown: impl FnOnce(&skiff_relay::server::ServerHandle),
) {
    let config = skiff_relay::config::RelayConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        threads: std::num::NonZeroUsize::new(threads).unwrap(),
        driver: skiff_monoio::driver::DriverKind::Legacy,
        drain_timeout: Duration::from_secs(2),
        tls_generate: vec!["localhost".to_owned()],
        ..skiff_relay::config::RelayConfig::default()
    };
    let relay = skiff_relay::server::start(
        config,
        skiff_relay::relay::RelayHandler::factory(threads).unwrap(),
    )
    .expect("start relay");
    let addr = relay.local_addr();
    let fingerprint = skiff_relay_fingerprint(addr);
    let url = format!("{scheme}://{addr}{PATH}");
    eprintln!("skiff-relay on {url}, certificate {fingerprint}");

    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let _ = tx.send(rt.block_on(moq_tokio_scenario(url, fingerprint)));
    });
    let (published, received) = rx
        .recv_timeout(SCENARIO)
        .unwrap_or_else(|e| panic!("the scenario did not finish within {SCENARIO:?}: {e}"));
    before_shutdown(&relay);
    relay.shutdown().expect("relay stops");
    assert_eq!(published, Ok(()), "publisher");
    assert_eq!(received.len(), SUBSCRIBERS);
    for (n, r) in received.into_iter().enumerate() {
        let r = r.unwrap_or_else(|e| panic!("subscriber {n}: {e}"));
        assert!(r.errors.is_empty(), "subscriber {n}: {:?}", r.errors);
        assert_eq!(r.next, (GROUPS, 0), "subscriber {n} missed frames");
        assert_eq!(
            r.arrival,
            (0..GROUPS).collect::<Vec<_>>(),
            "subscriber {n}'s groups"
        );
        eprintln!("subscriber {n}: {} frames", GROUPS * FRAMES);
    }
}

/// A moq-tokio publisher and [`SUBSCRIBERS`] moq-tokio subscribers at
/// `url`, on one tokio runtime; the publisher writes once every subscriber
/// holds its subscription.
async fn moq_tokio_scenario(
    url: String,
    fingerprint: Fingerprint,
) -> (Result<(), String>, Vec<Result<Received, String>>) {
    let (ready_tx, ready) = tokio::sync::oneshot::channel();
    let (done_tx, done) = tokio::sync::oneshot::channel();
    let publisher = tokio::spawn(moq_publisher(
        url.clone(),
        fingerprint,
        MOQ_LITE_05,
        ready,
        done,
    ));
    let (subscribed, mut subscriptions) = tokio::sync::mpsc::channel(SUBSCRIBERS);
    let subscribers: Vec<_> = (0..SUBSCRIBERS)
        .map(|_| {
            tokio::spawn(moq_subscriber(
                url.clone(),
                fingerprint,
                MOQ_LITE_05,
                subscribed.clone(),
            ))
        })
        .collect();
    drop(subscribed);
    let mut count = 0;
    while count < SUBSCRIBERS {
        match tokio::time::timeout(WAIT, subscriptions.recv()).await {
            Ok(Some(())) => count += 1,
            _ => break,
        }
    }
    let _ = ready_tx.send(());
    let mut received = Vec::new();
    for s in subscribers {
        received.push(s.await.unwrap_or_else(|e| Err(format!("task: {e}"))));
    }
    let _ = done_tx.send(());
    let published = publisher
        .await
        .unwrap_or_else(|e| Err(format!("task: {e}")));
    (published, received)
}
