//! moq-lite over WebTransport (docs/protocol.md §12) through `skiff-relay`:
//! the SDK's publisher and viewer both dial `https://`, and every frame
//! arrives intact, in order, with its timestamp (frames larger than a
//! stream's receive window among them); the relay counts the connections
//! under the `webtransport` label; a CONNECT for a path the access policy
//! refuses is answered 401 and no session is set up.

use std::cell::Cell;
use std::num::NonZeroUsize;
use std::rc::Rc;
use std::time::Duration;

use skiff_core::model::track::Info;
use skiff_monoio::driver::{self, DriverKind};
use skiff_monoio::sdk::Request;
use skiff_monoio::{Config, connect};
use skiff_relay::config::{AuthConfig, RelayConfig};
use skiff_relay::metrics::TransportLabel;
use skiff_relay::relay::RelayHandler;
use skiff_relay::server;

const GROUPS: u64 = 3;
const PER_GROUP: u64 = 10;

/// Frame `i`'s payload: its index, then a pattern; every seventh frame is
/// 300 KiB, more than one stream window.
fn payload(i: u64) -> Vec<u8> {
    let len = if i % 7 == 3 { 300 * 1024 } else { 1200 };
    let mut p: Vec<u8> = (0..len).map(|k| (k as u64 * 31 + i) as u8).collect();
    p[..8].copy_from_slice(&i.to_le_bytes());
    p
}

/// A relay on a free loopback port with a generated certificate, the
/// access policy `auth`, and a client configuration pinning the
/// certificate.
fn relay(auth: AuthConfig) -> (server::ServerHandle, Config) {
    let config = RelayConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        threads: NonZeroUsize::MIN,
        drain_timeout: Duration::from_secs(2),
        tls_generate: vec!["localhost".to_owned()],
        auth,
        ..RelayConfig::default()
    };
    let relay = server::start(config, RelayHandler::factory(1).unwrap()).expect("start relay");
    let fingerprint = relay_fingerprint(relay.local_addr());
    let mut client = Config::default();
    client.tls_fingerprint = Some(fingerprint);
    (relay, client)
}

/// The fingerprint the relay answers at `GET /certificate.sha256`.
fn relay_fingerprint(addr: std::net::SocketAddr) -> skiff_monoio::tls::Fingerprint {
    use std::io::{Read, Write};
    let mut sock = std::net::TcpStream::connect(addr).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    sock.write_all(b"GET /certificate.sha256 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    let _ = sock.read_to_string(&mut answer);
    let (_, body) = answer.split_once("\r\n\r\n").expect("an HTTP answer");
    body.trim().parse().expect("a fingerprint")
}

fn log() {
    if std::env::var_os("QUIC_TEST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_writer(std::io::stderr)
            .try_init();
    }
}

#[test]
fn sdk_publisher_reaches_sdk_viewer_over_webtransport() {
    log();
    let (relay, client_config) = relay(AuthConfig::default());
    let url = format!("https://localhost:{}/room", relay.local_addr().port());
    let metrics = relay.metrics().clone();
    let (seen, open_during) = driver::block_on(DriverKind::Legacy, move |_| async move {
        let (viewer, runner) = connect(&url, client_config.clone()).unwrap();
        monoio::spawn(runner.run());
        let read = Rc::new(Cell::new(0u64));
        let watching = monoio::spawn({
            let viewer = viewer.clone();
            let read = read.clone();
            async move {
                let request = Request {
                    max_latency: skiff_core::time::Duration::from_secs(10),
                    ..Request::LIVE
                };
                let mut track = viewer.subscribe("camera", "video", request).await.unwrap();
                let mut seen = Vec::new();
                while (seen.len() as u64) < GROUPS * PER_GROUP {
                    let Some(mut group) = track.next_group().await.unwrap() else {
                        break;
                    };
                    while let Ok(Some(frame)) = group.read_frame().await {
                        let bytes = frame.payload.to_vec();
                        let i = u64::from_le_bytes(bytes[..8].try_into().unwrap());
                        assert_eq!(bytes, payload(i), "frame {i} damaged");
                        assert_eq!(frame.timestamp, i * 1000, "frame {i}'s timestamp");
                        seen.push(i);
                        read.set(read.get() + 1);
                    }
                }
                seen
            }
        });
        let (publisher, runner) = connect(&url, client_config).unwrap();
        monoio::spawn(runner.run());
        let broadcast = publisher.publish("camera").unwrap();
        let mut track = broadcast.create_track(Info::new("video").unwrap()).unwrap();
        while track.subscribers() == 0 {
            monoio::time::sleep(Duration::from_millis(5)).await;
        }
        // Both clients are connected: two WebTransport connections.
        let open_during = metrics.total().transports[TransportLabel::WebTransport as usize].open;
        for g in 0..GROUPS {
            while read.get() < g * PER_GROUP {
                monoio::time::sleep(Duration::from_millis(2)).await;
            }
            let mut group = track.create_group(g).unwrap();
            for i in g * PER_GROUP..(g + 1) * PER_GROUP {
                group.write_frame(i * 1000, &payload(i)).await.unwrap();
            }
            group.finish().unwrap();
        }
        let seen = monoio::time::timeout(Duration::from_secs(20), watching)
            .await
            .expect("the viewer got every frame in time");
        publisher.close().await;
        viewer.close().await;
        (seen, open_during)
    })
    .expect("runtime");
    assert_eq!(seen, (0..GROUPS * PER_GROUP).collect::<Vec<_>>());
    assert_eq!(open_during, 2, "two connections under `webtransport`");
    // The connections' bytes are counted as they end.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let web = loop {
        let t = relay.metrics().total().transports[TransportLabel::WebTransport as usize];
        if t.open == 0 || std::time::Instant::now() > deadline {
            break t;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    relay.shutdown().expect("relay stops");
    assert_eq!(web.open, 0);
    let media = GROUPS * PER_GROUP * 1200;
    assert!(
        web.bytes_in > media && web.bytes_out > media,
        "webtransport bytes {web:?}"
    );
}

/// A relay whose anonymous access reaches `anon/**` only: a CONNECT to
/// `/other` without a token is answered 401 (the SDK reports the status
/// and sets up no session); `/anon` is served.
#[test]
fn a_connect_the_access_policy_refuses_is_answered_401() {
    log();
    let (relay, client_config) = relay(AuthConfig {
        public: ["anon/**".parse().unwrap()].into_iter().collect(),
        ..AuthConfig::default()
    });
    let port = relay.local_addr().port();
    let (refused, served) = driver::block_on(DriverKind::Legacy, move |_| async move {
        let (client, runner) = connect(
            &format!("https://localhost:{port}/other"),
            client_config.clone(),
        )
        .unwrap();
        let running = monoio::spawn(runner.run());
        let mut refused = None;
        for _ in 0..200 {
            if let Some(e) = client.last_error() {
                refused = Some(e.to_string());
                break;
            }
            monoio::time::sleep(Duration::from_millis(10)).await;
        }
        let sessions = client.sessions();
        client.close().await;
        let _ = running.await;
        let (client, runner) =
            connect(&format!("https://localhost:{port}/anon"), client_config).unwrap();
        monoio::spawn(runner.run());
        let mut served = 0;
        for _ in 0..500 {
            served = client.sessions();
            if served > 0 {
                break;
            }
            monoio::time::sleep(Duration::from_millis(10)).await;
        }
        client.close().await;
        ((refused, sessions), served)
    })
    .expect("runtime");
    relay.shutdown().expect("relay stops");
    let (error, sessions) = refused;
    let error = error.expect("the refused dial reports an error");
    assert!(error.contains("status 401"), "error: {error}");
    assert_eq!(sessions, 0, "no session at a refused path");
    assert_eq!(served, 1, "a session at the public path");
}
