//! moq-lite over QUIC (docs/protocol.md §11) through `skiff-relay`: the
//! SDK's publisher and subscriber both dial `moql://`, and every frame
//! arrives intact, in order, with its timestamp, including frames larger
//! than a stream's receive window; the per-transport metrics; and what a
//! frame costs the relay in system calls.

mod common;
mod sdk_stream;

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use sdk_stream::Stream;
use skiff_core::model::track::Info;
use skiff_monoio::driver::{self, DriverKind};
use skiff_monoio::sdk::Request;
use skiff_monoio::{Config, connect};
use skiff_relay::config::RelayConfig;
use skiff_relay::relay::RelayHandler;
use skiff_relay::server;

const GROUPS: u64 = 4;
const PER_GROUP: u64 = 10;

/// Frames checked with their timestamps, some larger than a stream window,
/// [`PER_GROUP`] a group.
const STREAM: Stream = Stream {
    per_group: PER_GROUP,
    ..sdk_stream::PACED
};

fn relay_with_certificate(
    dir: &std::path::Path,
    driver: DriverKind,
) -> (server::ServerHandle, Config) {
    let pki = skiff_testkit::pki::Pki::write(dir, "quic");
    let config = RelayConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        threads: NonZeroUsize::MIN,
        driver,
        drain_timeout: Duration::from_secs(2),
        tls: Some(skiff_relay::tls::TlsFiles {
            cert: pki.cert,
            key: pki.key,
        }),
        ..RelayConfig::default()
    };
    let relay = server::start(config, RelayHandler::factory(1).unwrap()).expect("start relay");
    let mut client = Config::default();
    client.tls_roots = Some(Arc::new(
        skiff_monoio::tls::roots_from_pem_file(&pki.ca).unwrap(),
    ));
    (relay, client)
}

/// A one-worker relay with a metrics port and a certificate it generates for
/// `hosts`; the relay, its metrics address, and the certificate's pin as a
/// client reads it from the TCP port.
fn relay_with_generated_certificate(
    hosts: &[&str],
) -> (
    server::ServerHandle,
    std::net::SocketAddr,
    skiff_monoio::tls::Fingerprint,
) {
    let config = RelayConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        metrics: Some("127.0.0.1:0".parse().unwrap()),
        threads: NonZeroUsize::MIN,
        drain_timeout: Duration::from_secs(2),
        tls_generate: hosts.iter().map(|h| (*h).to_owned()).collect(),
        ..RelayConfig::default()
    };
    let relay = server::start(config, RelayHandler::factory(1).unwrap()).expect("start relay");
    let metrics = relay.metrics_addr().expect("a metrics port");
    let (_, hex) = common::http_get(relay.local_addr(), "/certificate.sha256");
    let pin = hex.trim().parse().expect("a fingerprint");
    (relay, metrics, pin)
}

/// Two SDK clients dialing `moql://` at `addr` with `pin` pinned, their
/// runners spawned on the current runtime: (publisher, viewer).
fn pinned_publisher_and_viewer(
    addr: std::net::SocketAddr,
    pin: skiff_monoio::tls::Fingerprint,
) -> (skiff_monoio::Client, skiff_monoio::Client) {
    let mut quic = Config::default();
    quic.tls_fingerprint = Some(pin);
    let dial = || {
        let (client, runner) = connect(&format!("moql://{addr}/"), quic.clone()).unwrap();
        monoio::spawn(runner.run());
        client
    };
    (dial(), dial())
}

fn publish_and_view(driver: DriverKind) {
    if std::env::var_os("QUIC_TEST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_writer(std::io::stderr)
            .try_init();
    }
    let dir = std::env::temp_dir().join(format!("skiff-quic-{}-{driver:?}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (relay, client_config) = relay_with_certificate(&dir, driver);
    let url = format!("moql://{}/", relay.local_addr());
    let seen = driver::block_on(driver, move |_| {
        STREAM.view_groups(
            (url.clone(), client_config.clone()),
            (url, client_config),
            GROUPS,
            || {},
        )
    })
    .expect("runtime");
    relay.shutdown().expect("relay stops");
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(seen, (0..GROUPS * PER_GROUP).collect::<Vec<_>>());
}

#[test]
fn sdk_publisher_reaches_sdk_viewer_over_quic_epoll() {
    publish_and_view(DriverKind::Legacy);
}

#[test]
fn sdk_publisher_reaches_sdk_viewer_over_quic_io_uring() {
    publish_and_view(DriverKind::IoUring);
}

/// `GET /metrics` counts connections and bytes per transport: a publisher
/// over plain TCP, a viewer over QUIC and one over WebSocket, all connected,
/// are one `tcp`, one `quic` and one `ws` connection, and each transport's
/// bytes cover the frames it carried; once they close, nothing is open.
#[test]
fn metrics_count_connections_and_bytes_per_transport() {
    const FRAMES: u64 = 20;
    const FRAME_BYTES: usize = 10_000;
    let (relay, metrics, pin) = relay_with_generated_certificate(&["localhost", "127.0.0.1"]);
    let addr = relay.local_addr();

    let (ready_tx, ready) = std::sync::mpsc::channel::<u64>();
    let (done, done_rx) = std::sync::mpsc::channel::<()>();
    let clients = std::thread::spawn(move || {
        driver::block_on(DriverKind::Legacy, move |_| async move {
            let (publisher, runner) =
                connect(&format!("tcp://{addr}/"), Config::default()).unwrap();
            monoio::spawn(runner.run());
            let mut quic = Config::default();
            quic.tls_fingerprint = Some(pin);
            let (viewer, runner) = connect(&format!("moql://{addr}/"), quic).unwrap();
            monoio::spawn(runner.run());
            let (web, runner) = connect(&format!("ws://{addr}/"), Config::default()).unwrap();
            monoio::spawn(runner.run());
            let broadcast = publisher.publish("camera").unwrap();
            let mut track = broadcast.create_track(Info::new("video").unwrap()).unwrap();
            let mut subs = Vec::new();
            for v in [&viewer, &web] {
                subs.push(v.subscribe("camera", "video", Request::LIVE).await.unwrap());
            }
            common::write_numbered_group(&mut track, FRAMES, FRAME_BYTES).await;
            for mut sub in subs {
                let mut read = 0u64;
                let mut g = sub.next_group().await.unwrap().expect("a group");
                while let Some(f) = g.read_frame().await.unwrap() {
                    read += f.payload.to_vec().len() as u64;
                }
                ready_tx.send(read).unwrap();
            }
            // Both stay connected until the metrics are read.
            while done_rx.try_recv().is_err() {
                monoio::time::sleep(Duration::from_millis(10)).await;
            }
            for client in [publisher, viewer, web] {
                client.close().await;
            }
        })
        .expect("runtime");
    });
    let payload = FRAMES * FRAME_BYTES as u64;
    for viewer in ["quic", "ws"] {
        let read = ready
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("the {viewer} viewer read the group"));
        assert_eq!(read, payload, "{viewer}");
    }
    let series = |name: &str, t: &str| format!("skiff_relay_transport_{name}{{transport=\"{t}\"}}");
    let scrape = || common::http_get(metrics, "/metrics").1;
    // QUIC's bytes are sampled every 100 ms; the certificate's request closes
    // just after its answer.
    common::eventually("QUIC's bytes sampled, the request closed", || {
        let text = scrape();
        common::sample(&text, &series("sent_bytes_total", "quic")) >= Some(payload)
            && common::sample(&text, &series("connections_open", "tcp")) == Some(1)
    });
    let text = scrape();
    let value = |name: &str, t: &str| {
        common::sample(&text, &series(name, t)).unwrap_or_else(|| panic!("no {name} {t}: {text}"))
    };
    for (t, open) in [("tcp", 1), ("tls", 0), ("ws", 1), ("quic", 1)] {
        assert_eq!(value("connections_open", t), open, "{t}: {text}");
    }
    // The publisher's frames came in over TCP and went out over QUIC and WebSocket.
    assert!(value("received_bytes_total", "tcp") >= payload, "{text}");
    assert!(value("sent_bytes_total", "tcp") > 0, "{text}");
    assert!(value("sent_bytes_total", "ws") >= payload, "{text}");
    assert!(value("received_bytes_total", "ws") > 0, "{text}");
    assert!(value("received_bytes_total", "quic") > 0, "{text}");
    assert_eq!(value("sent_bytes_total", "tls"), 0, "{text}");
    assert_eq!(value("received_bytes_total", "tls"), 0, "{text}");
    // The TCP port's totals are the sum of its transports.
    assert_eq!(
        common::sample(&text, "skiff_relay_sent_bytes_total"),
        Some(value("sent_bytes_total", "tcp") + value("sent_bytes_total", "ws"))
    );
    done.send(()).unwrap();
    clients.join().expect("clients");
    common::eventually("both connections closed", || {
        let text = scrape();
        ["tcp", "ws", "quic"]
            .iter()
            .all(|t| common::sample(&text, &series("connections_open", t)) == Some(0))
    });
    relay.shutdown().expect("relay stops");
}

/// A frame's datagrams from the publisher cost the relay one pass of the
/// publisher's connection, not one per datagram (docs/protocol.md §11.8):
/// the endpoint queues every datagram a receive brought before the
/// connection runs, so the relay acknowledges a frame's train in one packet
/// and sends the frame on to its viewer in one GSO batch. Counted with the
/// relay's own system-call counters over frames of twelve datagrams each.
#[test]
fn a_frames_datagrams_cost_the_relay_one_pass() {
    const FRAMES: u64 = 40;
    const FRAME_BYTES: usize = 16 * 1024;
    /// Most relay sends per frame: the acknowledgement to the publisher
    /// and the frame to the viewer (2.0 measured), with room for the odd
    /// credit update or a frame that reached the socket in two receives.
    /// A pass per datagram acknowledges every second one: 7.1.
    const SENDS_PER_FRAME: f64 = 3.0;
    let (relay, metrics, pin) = relay_with_generated_certificate(&["localhost"]);
    let addr = relay.local_addr();
    let sends = move || {
        let text = common::http_get(metrics, "/metrics").1;
        common::sample(&text, "skiff_relay_quic_send_calls_total").unwrap_or(0)
    };
    // The relay's counters are sampled every 100 ms: a reading is taken
    // once it has been quiet that long.
    let settled = move || {
        let mut last = sends();
        for _ in 0..40 {
            std::thread::sleep(Duration::from_millis(250));
            let now = sends();
            if now == last {
                return now;
            }
            last = now;
        }
        panic!("the relay's send count still moving after 10 s");
    };
    let (phase_tx, phase) = std::sync::mpsc::channel::<u64>();
    let (go, go_rx) = std::sync::mpsc::channel::<()>();
    let clients = std::thread::spawn(move || {
        driver::block_on(DriverKind::Legacy, move |_| async move {
            let (publisher, viewer) = pinned_publisher_and_viewer(addr, pin);
            let broadcast = publisher.publish("camera").unwrap();
            let mut track = broadcast.create_track(Info::new("video").unwrap()).unwrap();
            let mut sub = viewer
                .subscribe("camera", "video", Request::LIVE)
                .await
                .unwrap();
            while track.subscribers() == 0 {
                monoio::time::sleep(Duration::from_millis(5)).await;
            }
            let mut group = track.create_group(0).unwrap();
            let mut g = None;
            let mut read = 0u64;
            // One frame of warm-up, then the measured ones, each read by the
            // viewer before the next is written.
            for i in 0..=FRAMES {
                if i == 1 {
                    phase_tx.send(read).unwrap();
                    while go_rx.try_recv().is_err() {
                        monoio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
                group
                    .write_frame(i, &vec![i as u8; FRAME_BYTES])
                    .await
                    .unwrap();
                if g.is_none() {
                    g = Some(sub.next_group().await.unwrap().expect("a group"));
                }
                let frame = g
                    .as_mut()
                    .unwrap()
                    .read_frame()
                    .await
                    .unwrap()
                    .expect("a frame");
                assert_eq!(frame.payload.to_vec().len(), FRAME_BYTES);
                read += 1;
                monoio::time::sleep(Duration::from_millis(20)).await;
            }
            phase_tx.send(read).unwrap();
            while go_rx.try_recv().is_err() {
                monoio::time::sleep(Duration::from_millis(10)).await;
            }
            group.finish().unwrap();
            for client in [publisher, viewer] {
                client.close().await;
            }
        })
        .expect("runtime");
    });
    let warm = phase
        .recv_timeout(Duration::from_secs(20))
        .expect("warm-up");
    assert_eq!(warm, 1);
    let before = settled();
    go.send(()).unwrap();
    let read = phase.recv_timeout(Duration::from_secs(30)).expect("frames");
    assert_eq!(read, FRAMES + 1);
    let after = settled();
    go.send(()).unwrap();
    clients.join().expect("clients");
    relay.shutdown().expect("relay stops");
    let per_frame = (after - before) as f64 / FRAMES as f64;
    eprintln!(
        "{} relay sends for {FRAMES} frames of {FRAME_BYTES} bytes: {per_frame:.2} per frame",
        after - before
    );
    assert!(
        per_frame <= SENDS_PER_FRAME,
        "{per_frame:.2} relay sends per frame"
    );
}

/// A publisher that writes a group of 2 MiB (eight times the relay's
/// stream window), finishes its track and closes as soon as
/// `Client::flushed` returns, to a viewer that reads slower than it writes:
/// the viewer still reads every byte. `flushed` waits for the finished
/// track's last group to be taken, the close waits until the relay
/// acknowledged it, and the relay's session goes on taking, after the
/// close, what its QUIC library received before it.
#[test]
fn a_group_finished_just_before_the_close_arrives_whole() {
    const FRAMES: u64 = 128;
    const FRAME_BYTES: usize = 16 * 1024;
    let (relay, _, pin) = relay_with_generated_certificate(&["localhost"]);
    let addr = relay.local_addr();
    let read = driver::block_on(DriverKind::Legacy, move |_| async move {
        let (publisher, viewer) = pinned_publisher_and_viewer(addr, pin);
        let broadcast = publisher.publish("camera").unwrap();
        let mut track = broadcast.create_track(Info::new("video").unwrap()).unwrap();
        let every_group = Request {
            max_latency: skiff_core::time::Duration::from_secs(30),
            ..Request::LIVE
        };
        let mut sub = viewer
            .subscribe("camera", "video", every_group)
            .await
            .unwrap();
        let reader = monoio::spawn(async move {
            let read =
                common::read_numbered_group(&mut sub, FRAME_BYTES, Duration::from_millis(2)).await;
            viewer.close().await;
            read
        });
        common::write_numbered_group(&mut track, FRAMES, FRAME_BYTES).await;
        track.finish();
        publisher.flushed().await;
        publisher.close().await;
        reader.await
    })
    .expect("runtime");
    relay.shutdown().expect("relay stops");
    assert_eq!(read, FRAMES);
}
