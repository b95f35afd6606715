//! `--tls-generate` against a `skiff-relay` process (docs/protocol.md §9.6,
//! §11.3): QUIC on the listen port's UDP side serves a self-signed
//! certificate made at start for the named hosts, valid 14 days at most,
//! while the TCP port stays plain; `GET /certificate.sha256` there answers
//! the SHA-256 of the leaf the QUIC handshake presents; SDK clients that pin
//! it publish and watch over `moql://`, one that pins another digest is
//! refused with a clear error; bad `--tls-generate` values stop the relay
//! with status 2.

mod common;
mod peers;
mod trust_any;

use std::cell::{Cell, RefCell};
use std::io::{BufRead, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use skiff_core::model::track::Info;
use skiff_monoio::driver::{self, DriverKind};
use skiff_monoio::sdk::Request;
use skiff_monoio::tls::Fingerprint;
use skiff_monoio::tls::rustls;
use skiff_monoio::{Client, Config, Error, connect};

const WAIT: Duration = Duration::from_secs(30);

/// A relay process serving TLS with a certificate it generated for
/// `localhost` and `127.0.0.1`.
struct Generated {
    child: std::process::Child,
    addr: SocketAddr,
    /// The relay's log lines (stderr).
    log: std::sync::mpsc::Receiver<String>,
}

impl Generated {
    fn start() -> Generated {
        let mut child = std::process::Command::new(peers::relay_binary())
            .args(["serve", "--listen", "127.0.0.1:0", "--threads", "2"])
            .args(["--log", "info", "--tls-generate", "localhost,127.0.0.1"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn skiff-relay");
        let mut first = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut first)
            .unwrap();
        let addr = first
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("startup line {first:?}"))
            .parse()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, log) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Generated { child, addr, log }
    }

    /// Waits (bounded) for a log line containing `text`.
    fn wait_log(&self, text: &str) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.log.recv_timeout(left) {
                Ok(line) if line.contains(text) => return line,
                Ok(_) => {}
                Err(e) => panic!("no log line with {text:?}: {e}"),
            }
        }
    }
}

impl Drop for Generated {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `GET path` over the plain TCP port (blocking): the whole answer.
fn http_get(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    answer
}

/// The leaf certificate the relay presents in a QUIC handshake on its UDP
/// port, learned by a client that trusts anything and keeps what it saw.
fn quic_leaf(addr: SocketAddr) -> Vec<u8> {
    let provider = rustls::crypto::aws_lc_rs::default_provider();
    let recording = Arc::new(trust_any::TrustAny::new(
        provider.signature_verification_algorithms,
    ));
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(recording.clone())
        .with_no_client_auth();
    config.alpn_protocols = skiff_quic::config::alpn_protocols();
    let quic = skiff_quic::config::client_config(Arc::new(config), 80).unwrap();
    let recorded = recording.clone();
    driver::block_on(DriverKind::Legacy, move |_| async move {
        let clock = skiff_monoio::clock::Clock::new();
        let endpoint = skiff_monoio::quic::Endpoint::client(addr, clock).unwrap();
        let (mut conn, mut link) = endpoint.connect(quic, addr, "localhost").unwrap();
        monoio::spawn(endpoint.clone().run());
        let deadline = Instant::now() + WAIT;
        while recorded.leaf.lock().unwrap().is_none() && Instant::now() < deadline {
            link.deliver(&mut conn);
            let now = Instant::now();
            if conn.poll_timeout().is_some_and(|t| t <= now) {
                conn.handle_timeout(now);
            }
            while conn.poll().is_some() {}
            link.exchange(&mut conn);
            link.flush(&mut conn).await;
            monoio::time::sleep(Duration::from_millis(2)).await;
        }
        endpoint.stop();
    })
    .unwrap();
    let leaf = recording.leaf.lock().unwrap().take();
    leaf.expect("a certificate in the QUIC handshake")
}

fn pinned(fingerprint: Fingerprint) -> Config {
    let mut config = Config::default();
    config.tls_fingerprint = Some(fingerprint);
    config
}

fn client(url: &str, config: Config) -> Client {
    let (client, runner) = connect(url, config).unwrap();
    monoio::spawn(runner.run());
    client
}

/// The payload of frame `i`: its index, then a pattern.
fn payload(i: u64) -> Vec<u8> {
    let mut p: Vec<u8> = (0..1500u64).map(|k| (k * 7 + i) as u8).collect();
    p[..8].copy_from_slice(&i.to_le_bytes());
    p
}

const FRAME_MS: u64 = 20;

const VIEW: Request = Request {
    max_latency: skiff_core::time::Duration::from_secs(5),
    ..Request::LIVE
};

/// Publishes `camera/video` until `stop`: groups of 10 frames.
async fn publish_until(client: Client, stop: Rc<Cell<bool>>) {
    let broadcast = client.publish("camera").unwrap();
    let mut track = broadcast.create_track(Info::new("video").unwrap()).unwrap();
    let mut i = 0u64;
    while !stop.get() {
        let mut group = track.append_group().unwrap();
        for _ in 0..10 {
            group.write_frame(i * FRAME_MS, &payload(i)).await.unwrap();
            i += 1;
            monoio::time::sleep(Duration::from_millis(FRAME_MS)).await;
        }
        group.finish().unwrap();
    }
    track.finish();
    client.flushed().await;
    client.close().await;
}

/// Reads `camera/video` until `stop`, checking every frame's bytes.
async fn watch_until(client: Client, stop: Rc<Cell<bool>>, seen: Rc<RefCell<Vec<u64>>>) {
    let mut track = client.subscribe("camera", "video", VIEW).await.unwrap();
    while !stop.get() {
        let Some(mut group) = track.next_group().await.unwrap() else {
            break;
        };
        while let Some(frame) = group.read_frame().await.unwrap() {
            let bytes = frame.payload.to_vec();
            let i = u64::from_le_bytes(bytes[..8].try_into().unwrap());
            assert_eq!(bytes, payload(i), "frame {i} damaged");
            assert_eq!(frame.timestamp, i * FRAME_MS);
            seen.borrow_mut().push(i);
        }
    }
    client.close().await;
}

async fn until(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        monoio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn first_error(client: &Client) -> Rc<Error> {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(e) = client.last_error() {
            return e;
        }
        assert!(Instant::now() < deadline, "the client did not fail");
        monoio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[test]
fn a_generated_certificate_is_served_answered_in_hex_and_pinned() {
    let relay = Generated::start();
    let addr = relay.addr;

    // The fingerprint endpoint (on the plain TCP port) answers the SHA-256
    // of the leaf QUIC serves, as moq-relay does: the hex alone, readable
    // cross-origin.
    let leaf = quic_leaf(addr);
    let answer = http_get(addr, "/certificate.sha256");
    let fingerprint = Fingerprint::of(&leaf);
    let (head, body) = answer.split_once("\r\n\r\n").expect("an HTTP answer");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.contains("Content-Type: text/plain; charset=utf-8"),
        "{head}"
    );
    assert!(head.contains("Access-Control-Allow-Origin: *"), "{head}");
    assert_eq!(body, fingerprint.to_string());
    assert_eq!(body.len(), 64);
    assert_eq!(body.parse::<Fingerprint>(), Ok(fingerprint));
    // Asked again (another worker, maybe), and after a SIGHUP (a generated
    // certificate is replaced when due, not on a signal): the same one.
    let answer = http_get(addr, "/certificate.sha256");
    assert!(answer.ends_with(&body), "{answer}");
    // The start-up line names the fingerprint too.
    let started = relay.wait_log("certificate for QUIC");
    assert!(started.contains(body), "{started}");
    let pid = libc::pid_t::try_from(relay.child.id()).unwrap();
    // SAFETY: kill(2) with a pid this test spawned and still owns.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGHUP) }, 0);
    relay.wait_log("SIGHUP received");
    assert_eq!(quic_leaf(addr), leaf);
    let answer = http_get(addr, "/certificate.sha256");
    assert!(answer.ends_with(&body), "{answer}");

    // The leaf: self-signed ECDSA P-256, for the two hosts, valid 14 days
    // at most and now.
    let (_, cert) = x509_parser::parse_x509_certificate(&leaf).expect("a certificate");
    let validity = cert.validity();
    let days = (validity.not_after.timestamp() - validity.not_before.timestamp()) as f64 / 86_400.0;
    assert!(days <= 14.0, "valid {days} days");
    assert!(validity.is_valid(), "not valid now");
    assert_eq!(cert.issuer(), cert.subject(), "self-signed");
    use x509_parser::extensions::GeneralName;
    use x509_parser::oid_registry::{
        OID_EC_P256, OID_KEY_TYPE_EC_PUBLIC_KEY, OID_SIG_ECDSA_WITH_SHA256,
    };
    let key = &cert.public_key().algorithm;
    assert_eq!(key.algorithm, OID_KEY_TYPE_EC_PUBLIC_KEY);
    let curve = key.parameters.as_ref().and_then(|p| p.as_oid().ok());
    assert_eq!(curve, Some(OID_EC_P256));
    assert_eq!(
        cert.signature_algorithm.algorithm,
        OID_SIG_ECDSA_WITH_SHA256
    );
    let (mut dns, mut ips) = (Vec::new(), Vec::new());
    for name in &cert
        .subject_alternative_name()
        .unwrap()
        .expect("subject alternative names")
        .value
        .general_names
    {
        match name {
            GeneralName::DNSName(d) => dns.push(d.to_string()),
            GeneralName::IPAddress(ip) => ips.push(ip.to_vec()),
            other => panic!("unexpected name {other}"),
        }
    }
    assert_eq!(dns, ["localhost"]);
    assert_eq!(ips, [vec![127u8, 0, 0, 1]]);

    let wrong = Fingerprint([0xab; 32]);
    let seen = driver::block_on(DriverKind::Legacy, move |_| async move {
        let stop = Rc::new(Cell::new(false));
        let seen = Rc::new(RefCell::new(Vec::new()));
        // Pinned clients over QUIC; the TCP port stays plain (a generated
        // certificate serves QUIC only).
        let viewer = client(&format!("moql://{addr}/anon"), pinned(fingerprint));
        let watching = monoio::spawn(watch_until(viewer.clone(), stop.clone(), seen.clone()));
        let publisher = client(&format!("moql://{addr}/anon"), pinned(fingerprint));
        let publishing = monoio::spawn(publish_until(publisher.clone(), stop.clone()));
        until("40 frames through the pinned sessions", || {
            seen.borrow().len() >= 40
        })
        .await;

        // Another digest pinned: refused in the QUIC handshake, which the
        // library reports as text.
        let url = format!("moql://{addr}/anon");
        let refused = client(&url, pinned(wrong));
        let e = first_error(&refused).await;
        assert!(
            e.to_string().contains("invalid peer certificate"),
            "{url} with a wrong pin: {e}"
        );
        assert_eq!(refused.sessions(), 0);
        refused.close().await;

        // The system's roots do not know a self-signed certificate.
        let untrusting = client(&format!("moql://{addr}/anon"), Config::default());
        let e = first_error(&untrusting).await;
        assert!(
            e.to_string().contains("invalid peer certificate"),
            "system roots: {e}"
        );
        untrusting.close().await;

        let before = seen.borrow().len();
        until("frames after the refusals", || {
            seen.borrow().len() >= before + 20
        })
        .await;
        assert_eq!((viewer.sessions(), publisher.sessions()), (1, 1));
        stop.set(true);
        publishing.await;
        watching.await;
        seen.take()
    })
    .unwrap();
    assert!(
        seen.windows(2).all(|w| w[1] == w[0] + 1),
        "frames lost: {seen:?}"
    );
}

#[test]
fn without_tls_the_fingerprint_is_404() {
    let relay = peers::start_relay(&[]);
    let mut s = TcpStream::connect(relay.addr).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    s.write_all(b"GET /certificate.sha256 HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 404"), "{answer}");
    assert!(answer.ends_with("no certificate\n"), "{answer}");
}

#[test]
fn bad_tls_generate_values_stop_the_relay_with_status_2() {
    for (args, says) in [
        (
            &["--tls-generate", "not a host"][..],
            "`not a host` is neither",
        ),
        (&["--tls-generate", ""][..], "at least one host"),
        (
            &[
                "--tls-generate",
                "localhost",
                "--tls-cert",
                "c.pem",
                "--tls-key",
                "k.pem",
            ][..],
            "not both",
        ),
    ] {
        let out = std::process::Command::new(peers::relay_binary())
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains("tls-generate") && err.contains(says),
            "{args:?}: {err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
}
