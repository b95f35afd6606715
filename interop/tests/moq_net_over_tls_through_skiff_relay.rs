//! qmux 0.5.3's own TLS client (docs/protocol.md §9.8) with a moq-net 0.3.18
//! publisher on top, against skiff-relay's TLS port: the handshake agrees on
//! the ALPN name qmux offers for moq-lite-05 over qmux-01, neither side sends
//! `application_protocols`, SETUP carries the path, and skiff's SDK
//! subscriber (`tls://`) receives every frame intact.

mod moq_net_live;

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use skiff_interop::ALPN_LITE_05;
use skiff_monoio::driver::{self, DriverKind};
use skiff_monoio::sdk::Request;
use skiff_monoio::{Config, connect};
use skiff_relay::config::RelayConfig;
use skiff_relay::relay::RelayHandler;
use skiff_relay::server;

/// Bound on every wait in this test.
const WAIT: Duration = Duration::from_secs(20);
const BROADCAST: &str = "live";
const TRACK: &str = "video";
const FRAMES: u64 = 40;
/// Milliseconds between two frames, and the step of their timestamps in the
/// track's default timescale (milliseconds): presentation time runs at the
/// pace frames are written, so a group being read stays cached for the
/// publisher's max age (5 s of it) after the next one starts.
const FRAME_MS: u64 = 10;
/// What the subscriber asks for: the live edge on, and every group after it
/// for as long as the publisher keeps it (its 5 s max age), so a relay held
/// up for two frames finishes the group it was sending instead of resetting
/// it OLD (max latency 0, the live edge only).
const VIEW: Request = Request {
    max_latency: skiff_core::time::Duration::from_secs(5),
    ..Request::LIVE
};

/// The payload of frame `i`: its index, then a pattern (frame 7 is 20 KiB).
fn payload(i: u64) -> Vec<u8> {
    let len = if i == 7 { 20 * 1024 } else { 900 };
    let mut p: Vec<u8> = (0..len).map(|k| (k as u64 * 13 + i) as u8).collect();
    p[..8].copy_from_slice(&i.to_le_bytes());
    p
}

/// A CA and a certificate for 127.0.0.1 in `dir`: (ca, cert, key).
fn certificates(dir: &std::path::Path) -> [std::path::PathBuf; 3] {
    let pki = skiff_testkit::pki::Pki::write(dir, "moq-net");
    [pki.ca, pki.cert, pki.key]
}

/// A moq-net publisher over qmux's TLS client: one group per 10 frames, each
/// written once a subscriber reads the track, until `done` fires.
async fn publish_over_qmux_tls(
    addr: std::net::SocketAddr,
    roots: Arc<skiff_monoio::tls::rustls::RootCertStore>,
    done: tokio::sync::oneshot::Receiver<()>,
) -> Result<Option<String>, String> {
    let hop = moq_net::Hop::new(0x3333).map_err(|e| format!("hop: {e}"))?;
    let origin = moq_tokio::origin::spawn_config(moq_net::origin::Config::new(hop));
    let (broadcast, track, timescale) = moq_net_live::one_track(&origin, BROADCAST, TRACK)?;
    broadcast
        .announce(moq_net::origin::Route::default())
        .map_err(|e| format!("announce: {e}"))?;

    let tls = skiff_monoio::tls::client_config(roots, &[]).map_err(|e| format!("tls: {e}"))?;
    let client =
        qmux::tls::Client::new(Arc::new(tls)).with_protocol(ALPN_LITE_05, &[qmux::Version::QMux01]);
    let qmux = tokio::time::timeout(WAIT, client.connect(addr, "127.0.0.1"))
        .await
        .map_err(|_| "qmux TLS connect timed out".to_owned())?
        .map_err(|e| format!("qmux TLS connect: {e}"))?;
    let protocol = web_transport_protocol(&qmux);
    let transport = moq_tokio::transport::Session::new(qmux);
    let v = moq_net::Version::from_alpn(ALPN_LITE_05).ok_or("moq-lite-05 unknown")?;
    let client = moq_net::Client::new()
        .with_versions(moq_net::Versions::from(vec![v]))
        .with_publisher(&origin)
        .with_path("/anon".to_owned());
    let session = moq_net_live::moq_session(client, transport).await?;
    tokio::time::timeout(WAIT, track.used())
        .await
        .map_err(|_| "no subscription reached the publisher".to_owned())?
        .map_err(|e| format!("used: {e}"))?;
    let mut i = 0;
    while i < FRAMES {
        let mut group = track
            .create_group(moq_net::group::Info::from(i / 10))
            .map_err(|e| format!("group: {e}"))?;
        for _ in 0..10 {
            let ts = moq_net::Timestamp::new(i * FRAME_MS, timescale).map_err(|_| "timestamp")?;
            group
                .write_frame(ts, bytes::Bytes::from(payload(i)))
                .map_err(|e| format!("frame: {e}"))?;
            i += 1;
            tokio::time::sleep(Duration::from_millis(FRAME_MS)).await;
        }
        group.finish().map_err(|e| format!("finish group: {e}"))?;
    }
    let result = tokio::select! {
        _ = done => Ok(protocol),
        err = session.closed() => Err(format!("relay closed the session: {err}")),
        () = tokio::time::sleep(WAIT) => Err("publisher not released in time".to_owned()),
    };
    let _ = track.finish();
    let _ = tokio::time::timeout(Duration::from_secs(2), session.close()).await;
    result
}

/// The application protocol the qmux session settled on.
fn web_transport_protocol(session: &qmux::Session) -> Option<String> {
    use web_transport_trait::Session as _;
    session.protocol().map(str::to_owned)
}

#[test]
fn moq_net_over_qmux_tls_reaches_a_skiff_sdk_subscriber() {
    let dir = std::env::temp_dir().join(format!("skiff-interop-tls-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let [ca, cert, key] = certificates(&dir);
    let config = RelayConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        threads: NonZeroUsize::MIN,
        driver: DriverKind::Legacy,
        drain_timeout: Duration::from_secs(2),
        tls: Some(skiff_relay::tls::TlsFiles { cert, key }),
        ..RelayConfig::default()
    };
    let relay = server::start(config, RelayHandler::factory(1).unwrap()).expect("start relay");
    let addr = relay.local_addr();
    let roots = Arc::new(skiff_monoio::tls::roots_from_pem_file(&ca).unwrap());

    let (release, done) = tokio::sync::oneshot::channel();
    let publisher = {
        let roots = roots.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| format!("runtime: {e}"))?;
            rt.block_on(publish_over_qmux_tls(addr, roots, done))
        })
    };
    let url = format!("tls://{addr}/anon");
    let seen = driver::block_on(DriverKind::Legacy, move |_| async move {
        let mut config = Config::default();
        config.tls_roots = Some(roots);
        let (client, runner) = connect(&url, config).unwrap();
        monoio::spawn(runner.run());
        let mut track = client
            .subscribe(BROADCAST, TRACK, VIEW)
            .await
            .expect("subscribe");
        let mut seen = Vec::new();
        let deadline = std::time::Instant::now() + WAIT;
        while (seen.len() as u64) < FRAMES && std::time::Instant::now() < deadline {
            let Some(mut group) = track.next_group().await.expect("group") else {
                break;
            };
            while let Some(frame) = group.read_frame().await.expect("frame") {
                let bytes = frame.payload.to_vec();
                let i = u64::from_le_bytes(bytes[..8].try_into().unwrap());
                assert_eq!(bytes, payload(i), "frame {i} damaged");
                seen.push(i);
            }
        }
        client.close().await;
        seen
    })
    .unwrap();
    let _ = release.send(());
    let published = publisher.join().expect("publisher thread");
    relay.shutdown().expect("relay stops");
    let _ = std::fs::remove_dir_all(&dir);
    // qmux settled on moq-lite-05 through ALPN (no in-band negotiation).
    assert_eq!(published, Ok(Some(ALPN_LITE_05.to_owned())), "publisher");
    assert_eq!(seen, (0..FRAMES).collect::<Vec<_>>());
}
