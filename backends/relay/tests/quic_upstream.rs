//! A leaf `skiff-relay` dials its upstream `skiff-relay` over QUIC
//! (`--upstream moql://…`, docs/protocol.md §11): trusting the upstream's
//! CA (`--upstream-ca`), or its generated certificate pinned by the
//! fingerprint its `GET /certificate.sha256` answers
//! (`--upstream-fingerprint`). A publisher on the upstream reaches a viewer
//! on the leaf, every frame intact, in order, with its timestamp, one frame
//! larger than a stream window.

mod sdk_stream;

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use sdk_stream::Stream;
use skiff_monoio::Config;
use skiff_monoio::driver::{self, DriverKind};
use skiff_monoio::tls::Fingerprint;
use skiff_relay::config::RelayConfig;
use skiff_relay::relay::RelayHandler;
use skiff_relay::server;

const GROUPS: u64 = 4;
const PER_GROUP: u64 = 10;

/// Frame `i`'s payload: its index, then a pattern; frame 13 is 300 KiB,
/// more than one stream window.
fn payload(i: u64) -> Vec<u8> {
    sdk_stream::pattern(i, 29, if i == 13 { 300 * 1024 } else { 1200 })
}

/// Frames with their timestamps (`i * 5`, milliseconds) checked, written
/// 5 ms apart: stamped at the pace they are written, so a group still being
/// read is not expired by the publisher's max age of media time.
const STREAM: Stream = Stream {
    payload,
    tick: 5,
    frame_gap: Duration::from_millis(5),
    paced: false,
    ..sdk_stream::PACED
};

fn relay_config(threads: usize, driver: DriverKind) -> RelayConfig {
    RelayConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        threads: NonZeroUsize::new(threads).unwrap(),
        driver,
        drain_timeout: Duration::from_secs(2),
        ..RelayConfig::default()
    }
}

/// The fingerprint `relay` answers at `GET /certificate.sha256` on its
/// plain TCP port (a generated certificate serves QUIC only); pinning it
/// below checks it against the certificate QUIC serves.
fn served_fingerprint(relay: &server::ServerHandle) -> Fingerprint {
    use std::io::{Read, Write};
    let mut sock = std::net::TcpStream::connect(relay.local_addr()).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    sock.write_all(b"GET /certificate.sha256 HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    sock.read_to_string(&mut answer).unwrap();
    let body = answer.split_once("\r\n\r\n").expect("an HTTP answer").1;
    body.trim().parse().expect("64 hex digits")
}

/// An SDK publisher on `up_url` and an SDK viewer on `leaf_url`: the frame
/// indices the viewer read, each checked.
fn publish_and_view(up_url: String, up_config: Config, leaf_url: String) -> Vec<u64> {
    driver::block_on(DriverKind::Legacy, move |_| {
        STREAM.view_groups(
            (leaf_url, Config::default()),
            (up_url, up_config),
            GROUPS,
            || {},
        )
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
