//! moq-lite over QUIC (docs/protocol.md §11) through `skiff-relay`: the
//! SDK's publisher and subscriber both dial `moql://`, and every frame
//! arrives intact, in order, with its timestamp, including frames larger
//! than a stream's receive window.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use skiff_core::model::track::Info;
use skiff_monoio::driver::{self, DriverKind};
use skiff_monoio::sdk::Request;
use skiff_monoio::{Config, connect};
use skiff_relay::config::RelayConfig;
use skiff_relay::relay::RelayHandler;
use skiff_relay::server;

const GROUPS: u64 = 4;
const PER_GROUP: u64 = 10;

/// Frame `i`'s payload: its index, then a pattern; every seventh frame is
/// 300 KiB, more than one stream window.
fn payload(i: u64) -> Vec<u8> {
    let len = if i % 7 == 3 { 300 * 1024 } else { 1200 };
    let mut p: Vec<u8> = (0..len).map(|k| (k as u64 * 31 + i) as u8).collect();
    p[..8].copy_from_slice(&i.to_le_bytes());
    p
}

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
    let seen = driver::block_on(driver, move |_| async move {
        let (viewer, runner) = connect(&url, client_config.clone()).unwrap();
        monoio::spawn(runner.run());
        // Frames the viewer read: the publisher starts a group once the
        // viewer has the one before, so no group is left behind by the live
        // edge (the relay's upstream subscription wants the newest group).
        let read = std::rc::Rc::new(std::cell::Cell::new(0u64));
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
        seen
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
