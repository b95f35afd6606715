//! moq-lite over WebTransport (docs/protocol.md §12) through `skiff-relay`:
//! the SDK's publisher and viewer both dial `https://`, and every frame
//! arrives intact, in order, with its timestamp (frames larger than a
//! stream's receive window among them); the relay counts the connections
//! under the `webtransport` label; a CONNECT for a path or token the access
//! policy refuses is answered 401 or 403 and no session is set up; and peers
//! that break HTTP/3's rules lose their own connection, with the HTTP/3 code
//! for what they broke, while a viewer streams on beside them and loses
//! nothing.

mod sdk_stream;

use std::cell::Cell;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use sdk_stream::{Stream, Until};
use skiff_monoio::driver::{self, DriverKind};
use skiff_monoio::{Config, connect};
use skiff_relay::config::{AuthConfig, RelayConfig};
use skiff_relay::metrics::TransportLabel;
use skiff_relay::relay::RelayHandler;
use skiff_relay::server;

const GROUPS: u64 = 3;
const PER_GROUP: u64 = 10;

/// Frames checked with their timestamps, some larger than a stream window,
/// [`PER_GROUP`] a group.
const STREAM: Stream = Stream {
    per_group: PER_GROUP,
    ..sdk_stream::PACED
};

/// A relay on a free loopback port with a generated certificate, the
/// access policy `auth`, and a client configuration pinning the
/// certificate.
fn relay(auth: AuthConfig) -> (server::ServerHandle, Config) {
    relay_with(auth, Duration::from_secs(10))
}

/// [`relay`] with the handshake timeout `handshake`.
fn relay_with(auth: AuthConfig, handshake: Duration) -> (server::ServerHandle, Config) {
    let mut config = RelayConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        threads: NonZeroUsize::MIN,
        drain_timeout: Duration::from_secs(2),
        tls_generate: vec!["localhost".to_owned()],
        auth,
        ..RelayConfig::default()
    };
    config.timeouts.handshake = handshake;
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
        let open_during = Cell::new(0);
        let seen = STREAM
            .view_groups(
                (url.clone(), client_config.clone()),
                (url, client_config),
                GROUPS,
                // Both clients are connected: two WebTransport connections.
                || {
                    open_during
                        .set(metrics.total().transports[TransportLabel::WebTransport as usize].open)
                },
            )
            .await;
        (seen, open_during.get())
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

/// The status a WebTransport dial to `url` is refused with (the SDK's
/// error says it), or `None` once a session was set up there instead.
async fn refusal(url: String, config: Config) -> Option<String> {
    let (client, runner) = connect(&url, config).unwrap();
    let running = monoio::spawn(runner.run());
    let mut outcome = None;
    for _ in 0..1000 {
        if client.sessions() > 0 {
            break;
        }
        if let Some(e) = client.last_error() {
            outcome = Some(e.to_string());
            break;
        }
        monoio::time::sleep(Duration::from_millis(10)).await;
    }
    let sessions = client.sessions();
    client.close().await;
    let _ = running.await;
    match (outcome, sessions) {
        (_, 1..) => None,
        (Some(e), 0) => Some(e),
        (None, 0) => Some("neither a session nor an error".to_owned()),
    }
}

/// A relay whose anonymous access reaches `anon/**` only, with a key for
/// tokens: a CONNECT without a token elsewhere, or with one that does not
/// verify, is answered 401; one whose token is for another root 403; the
/// SDK reports the status and sets up no session. `/anon` and a good token
/// are served.
#[test]
fn a_connect_the_access_policy_refuses_is_answered_401_or_403() {
    use moq_auth::{Algorithm, Claims, Key, KeyId};
    log();
    let dir = std::env::temp_dir().join(format!("skiff-wt-auth-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let key = Key::generate(Algorithm::ES256, Some(KeyId::decode("es").unwrap())).unwrap();
    key.to_file(dir.join("key.jwk")).unwrap();
    let token = |key: &Key, root: &str| {
        let all: Vec<moq_auth::Pattern> = vec!["**".parse().unwrap()];
        key.sign(
            &Claims::default()
                .with_root(root)
                .with_publish(all.clone())
                .with_subscribe(all)
                .with_expires(std::time::SystemTime::now() + Duration::from_secs(3600)),
        )
        .unwrap()
    };
    let stranger = Key::generate(Algorithm::ES256, None).unwrap();
    let forged = token(&stranger, "room");
    let other = token(&key, "other");
    let good = token(&key, "room");
    let (relay, client_config) = relay(AuthConfig {
        key: Some(dir.join("key.jwk")),
        public: ["anon/**".parse().unwrap()].into_iter().collect(),
        ..AuthConfig::default()
    });
    let port = relay.local_addr().port();
    let at = move |path: &str| format!("https://localhost:{port}/{path}");
    let outcomes = driver::block_on(DriverKind::Legacy, move |_| async move {
        let mut outcomes = Vec::new();
        for path in [
            "other".to_owned(),
            format!("room?jwt={forged}"),
            format!("room?jwt={other}"),
            "anon".to_owned(),
            format!("room?jwt={good}"),
        ] {
            outcomes.push(refusal(at(&path), client_config.clone()).await);
        }
        outcomes
    })
    .expect("runtime");
    relay.shutdown().expect("relay stops");
    let _ = std::fs::remove_dir_all(&dir);
    let statuses: Vec<Option<&str>> = outcomes
        .iter()
        .map(|o| {
            o.as_deref().map(|e| {
                ["401", "403"]
                    .into_iter()
                    .find(|s| e.contains(&format!("status {s}")))
                    .unwrap_or(e)
            })
        })
        .collect();
    assert_eq!(
        statuses,
        [Some("401"), Some("401"), Some("403"), None, None],
        "{outcomes:?}"
    );
}

// ---------------------------------------------------------------------------
// Peers that break HTTP/3's rules
// ---------------------------------------------------------------------------

use skiff_quic::quinn_proto::{Connection, ConnectionError, Dir, Event};
use skiff_quic::webtransport::code;

/// What a hostile peer writes once its handshake is done.
type Act = fn(&mut Connection);

/// Opens a uni stream on `conn` and writes `bytes` on it.
fn uni(conn: &mut Connection, bytes: &[u8]) {
    let id = conn.streams().open(Dir::Uni).expect("a uni stream");
    let n = conn.send_stream(id).write(bytes).expect("written");
    assert_eq!(n, bytes.len());
}

/// Our control stream with valid SETTINGS.
fn settings(conn: &mut Connection) {
    uni(conn, &skiff_quic::webtransport::settings());
}

/// Dials the relay at `port` over HTTP/3 from a bare quinn-proto
/// connection, lets `act` write on it once the handshake is done, and
/// returns the application code the relay closed it with (`None`: still
/// open after `within`).
async fn hostile(
    port: u16,
    pin: skiff_monoio::tls::Fingerprint,
    act: Act,
    within: Duration,
) -> Option<u64> {
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let tls = skiff_monoio::tls::client_config_for(
        &skiff_monoio::tls::Trust::Pinned(pin),
        &[skiff_quic::webtransport::ALPN_H3.as_bytes()],
    )
    .unwrap();
    let config =
        skiff_quic::config::client_config_webtransport(std::sync::Arc::new(tls), 64).unwrap();
    let clock = skiff_monoio::clock::Clock::new();
    let endpoint = skiff_monoio::quic::Endpoint::client(addr, clock).unwrap();
    let (mut conn, mut link) = endpoint.connect(config, addr, "localhost").unwrap();
    let receiving = monoio::spawn(endpoint.clone().run());
    let deadline = std::time::Instant::now() + within;
    let closed = loop {
        let now = std::time::Instant::now();
        if conn.poll_timeout().is_some_and(|t| t <= now) {
            conn.handle_timeout(now);
        }
        let mut lost = None;
        // One datagram at a time: the relay forgets a connection it closed
        // at once, so a stateless reset may follow its close, and the
        // library reports only the last of the two it was handed.
        loop {
            while let Some(event) = conn.poll() {
                match event {
                    Event::Connected => act(&mut conn),
                    Event::ConnectionLost { reason } => {
                        lost.get_or_insert(reason);
                    }
                    _ => {}
                }
            }
            if lost.is_some() || !link.deliver_one(&mut conn) {
                break;
            }
        }
        link.exchange(&mut conn);
        link.flush(&mut conn).await;
        if let Some(reason) = lost {
            break match reason {
                ConnectionError::ApplicationClosed(c) => Some(c.error_code.into_inner()),
                other => panic!("closed otherwise: {other}; {:?}", conn.stats().frame_rx),
            };
        }
        if now > deadline {
            break None;
        }
        monoio::time::sleep(Duration::from_millis(5)).await;
    };
    endpoint.stop();
    drop(receiving);
    closed
}

/// Hostile HTTP/3 peers against a relay (handshake timeout 1 s) while an
/// SDK publisher and viewer stream through it over WebTransport: each
/// hostile connection is closed with the code for its fault, and the viewer
/// gets every frame.
#[test]
fn peers_breaking_http3_lose_their_connection_and_nothing_else() {
    log();
    let (relay, client_config) = relay_with(AuthConfig::default(), Duration::from_secs(1));
    let port = relay.local_addr().port();
    let pin = client_config.tls_fingerprint.expect("pinned");
    let url = format!("https://localhost:{port}/room");
    let (closes, seen, written) = driver::block_on(DriverKind::Legacy, move |_| async move {
        let (viewer, runner) = connect(&url, client_config.clone()).unwrap();
        monoio::spawn(runner.run());
        let hostile_stream = Stream {
            check_timestamps: false,
            max_latency_secs: 30,
            ..STREAM
        };
        let watching = monoio::spawn(hostile_stream.view(
            viewer.clone(),
            Until::Frames(GROUPS * PER_GROUP),
            Arc::new(AtomicU64::new(0)),
        ));
        let (publisher, runner) = connect(&url, client_config).unwrap();
        monoio::spawn(runner.run());
        let (_broadcast, mut track) = hostile_stream.publish(&publisher).await;
        let mut group = track.create_group(0).unwrap();
        let mut closes = Vec::new();
        let cases: [(&str, Act); 6] = [
            ("GOAWAY before SETTINGS", |c| {
                uni(c, &[0x00, 0x07, 0x01, 0x00])
            }),
            ("a QPACK stream that does not end", |c| {
                settings(c);
                let mut qpack = vec![0x02];
                qpack.resize(8 * 1024, 0x3f);
                uni(c, &qpack);
            }),
            ("HEADERS that do not decode", |c| {
                settings(c);
                let id = c.streams().open(Dir::Bi).unwrap();
                let _ = c
                    .send_stream(id)
                    .write(&[0x01, 0x04, 0xff, 0xff, 0xff, 0xff]);
            }),
            ("a push stream from a client", |c| {
                settings(c);
                uni(c, &[0x01, 0x00]);
            }),
            ("no CONNECT", settings),
            ("every stream the relay grants, before any CONNECT", |c| {
                settings(c);
                // WebTransport uni streams for session 0: as many as the
                // relay's stream limit lets the library open, and more are
                // tried; each is held (bounded) until the handshake timeout.
                let mut header = [0u8; 16];
                let n = skiff_quic::webtransport::stream_header(false, 0, &mut header);
                for _ in 0..200 {
                    let Some(id) = c.streams().open(Dir::Uni) else {
                        break;
                    };
                    let _ = c.send_stream(id).write(&header[..n]);
                }
            }),
        ];
        let mut frame = 0;
        for (what, act) in cases {
            let code = hostile(port, pin, act, Duration::from_secs(5)).await;
            closes.push((what, code));
            // The viewer's frames go on between the attacks.
            for _ in 0..6 {
                hostile_stream.write_frame(&mut group, frame).await;
                frame += 1;
            }
        }
        while frame < GROUPS * PER_GROUP {
            hostile_stream.write_frame(&mut group, frame).await;
            frame += 1;
        }
        group.finish().unwrap();
        let seen = monoio::time::timeout(Duration::from_secs(20), watching)
            .await
            .expect("the viewer got every frame in time");
        publisher.close().await;
        viewer.close().await;
        (closes, seen, frame)
    })
    .expect("runtime");
    relay.shutdown().expect("relay stops");
    assert_eq!(
        closes,
        [
            ("GOAWAY before SETTINGS", Some(code::H3_MISSING_SETTINGS)),
            (
                "a QPACK stream that does not end",
                Some(code::H3_EXCESSIVE_LOAD)
            ),
            ("HEADERS that do not decode", Some(code::H3_MESSAGE_ERROR)),
            (
                "a push stream from a client",
                Some(code::H3_STREAM_CREATION_ERROR)
            ),
            ("no CONNECT", Some(code::H3_REQUEST_INCOMPLETE)),
            (
                "every stream the relay grants, before any CONNECT",
                Some(code::H3_REQUEST_INCOMPLETE)
            ),
        ]
    );
    assert_eq!(seen, (0..written).collect::<Vec<_>>());
}
