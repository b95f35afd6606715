//! A leaf `skiff-relay` dials its upstream `skiff-relay` over QUIC
//! (`--upstream moql://…`, docs/protocol.md §11): trusting the upstream's
//! CA (`--upstream-ca`), or its generated certificate pinned by the
//! fingerprint its `GET /certificate.sha256` answers
//! (`--upstream-fingerprint`). A publisher on the upstream reaches a viewer
//! on the leaf, every frame intact, in order, with its timestamp, one frame
//! larger than a stream window.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use skiff_core::model::track::Info;
use skiff_monoio::driver::{self, DriverKind};
use skiff_monoio::sdk::Request;
use skiff_monoio::tls::Fingerprint;
use skiff_monoio::{Config, connect};
use skiff_relay::config::RelayConfig;
use skiff_relay::relay::RelayHandler;
use skiff_relay::server;

const GROUPS: u64 = 4;
const PER_GROUP: u64 = 10;

/// Frame `i`'s payload: its index, then a pattern; frame 13 is 300 KiB,
/// more than one stream window.
fn payload(i: u64) -> Vec<u8> {
    let len = if i == 13 { 300 * 1024 } else { 1200 };
    let mut p: Vec<u8> = (0..len).map(|k| (k as u64 * 29 + i) as u8).collect();
    p[..8].copy_from_slice(&i.to_le_bytes());
    p
}

fn relay_config(threads: usize, driver: DriverKind) -> RelayConfig {
    RelayConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        threads: NonZeroUsize::new(threads).unwrap(),
        driver,
        drain_timeout: Duration::from_secs(2),
        ..RelayConfig::default()
    }
}

/// The fingerprint `relay` answers at `GET /certificate.sha256` on its TCP
/// port, which a generated certificate leaves plain (it serves QUIC only);
/// the leaf's handshake then checks it against the certificate QUIC serves.
fn served_fingerprint(relay: &server::ServerHandle) -> Fingerprint {
    use std::io::{Read, Write};

    let mut sock = std::net::TcpStream::connect(relay.local_addr()).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    sock.write_all(b"GET /certificate.sha256 HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    sock.read_to_string(&mut answer).expect("the answer");
    let (head, body) = answer.split_once("\r\n\r\n").expect("an HTTP answer");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    body.trim().parse().expect("64 hex digits")
}

/// An SDK publisher on `up_url` and an SDK viewer on `leaf_url`: the frame
/// indices the viewer read, each checked.
fn publish_and_view(up_url: String, up_config: Config, leaf_url: String) -> Vec<u64> {
    driver::block_on(DriverKind::Legacy, move |_| async move {
        let (viewer, runner) = connect(&leaf_url, Config::default()).unwrap();
        monoio::spawn(runner.run());
        let watching = monoio::spawn({
            let viewer = viewer.clone();
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
                        assert_eq!(frame.timestamp, i * 10, "frame {i}'s timestamp");
                        seen.push(i);
                    }
                }
                seen
            }
        });
        let (publisher, runner) = connect(&up_url, up_config).unwrap();
        monoio::spawn(runner.run());
        let broadcast = publisher.publish("camera").unwrap();
        let mut track = broadcast.create_track(Info::new("video").unwrap()).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while track.subscribers() == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "no subscription through the leaf"
            );
            monoio::time::sleep(Duration::from_millis(5)).await;
        }
        for g in 0..GROUPS {
            let mut group = track.create_group(g).unwrap();
            for i in g * PER_GROUP..(g + 1) * PER_GROUP {
                group.write_frame(i * 10, &payload(i)).await.unwrap();
                monoio::time::sleep(Duration::from_millis(5)).await;
            }
            group.finish().unwrap();
        }
        let seen = monoio::time::timeout(Duration::from_secs(20), watching)
            .await
            .expect("the viewer got every frame in time");
        publisher.close().await;
        viewer.close().await;
        seen
    })
    .expect("runtime")
}

/// Both relays on epoll; the leaf has two workers, each with its own
/// upstream session.
#[test]
fn a_leaf_dials_its_upstream_over_quic_trusting_its_ca() {
    let dir = std::env::temp_dir().join(format!("skiff-quic-upstream-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let pki = skiff_testkit::pki::Pki::write(&dir, "up");
    let upstream = server::start(
        RelayConfig {
            tls: Some(skiff_relay::tls::TlsFiles {
                cert: pki.cert.clone(),
                key: pki.key.clone(),
            }),
            ..relay_config(1, DriverKind::Legacy)
        },
        RelayHandler::factory(1).unwrap(),
    )
    .expect("start the upstream");
    let up_url = format!("moql://{}/anon", upstream.local_addr());
    let mut leaf_config = relay_config(2, DriverKind::Legacy);
    leaf_config.upstream = Some(up_url.parse().unwrap());
    leaf_config.upstream_ca = Some(pki.ca.clone());
    let leaf = server::start(leaf_config, RelayHandler::factory(2).unwrap()).expect("start leaf");
    // The leaf's root is the upstream's `anon` (docs/protocol.md §4.1).
    let leaf_url = format!("tcp://{}/", leaf.local_addr());
    let mut up_config = Config::default();
    up_config.tls_roots = Some(Arc::new(
        skiff_monoio::tls::roots_from_pem_file(&pki.ca).unwrap(),
    ));
    let seen = publish_and_view(up_url, up_config, leaf_url);
    leaf.shutdown().expect("leaf stops");
    upstream.shutdown().expect("upstream stops");
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(seen, (0..GROUPS * PER_GROUP).collect::<Vec<_>>());
}

/// Both relays on io_uring.
#[test]
fn a_leaf_dials_its_upstream_over_quic_with_its_certificate_pinned() {
    let upstream = server::start(
        RelayConfig {
            tls_generate: vec!["localhost".to_owned()],
            ..relay_config(1, DriverKind::IoUring)
        },
        RelayHandler::factory(1).unwrap(),
    )
    .expect("start the upstream");
    let pin = served_fingerprint(&upstream);
    let up_url = format!("moql://{}/anon", upstream.local_addr());
    let mut leaf_config = relay_config(1, DriverKind::IoUring);
    leaf_config.upstream = Some(up_url.parse().unwrap());
    leaf_config.upstream_fingerprint = Some(pin);
    let leaf = server::start(leaf_config, RelayHandler::factory(1).unwrap()).expect("start leaf");
    let leaf_url = format!("tcp://{}/", leaf.local_addr());
    let mut up_config = Config::default();
    up_config.tls_fingerprint = Some(pin);
    let seen = publish_and_view(up_url, up_config, leaf_url);
    leaf.shutdown().expect("leaf stops");
    upstream.shutdown().expect("upstream stops");
    assert_eq!(seen, (0..GROUPS * PER_GROUP).collect::<Vec<_>>());
}
