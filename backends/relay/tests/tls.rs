//! TLS on the relay's listen port (docs/protocol.md §9.8), against a
//! `skiff-relay` process started with `--tls-cert`/`--tls-key` and
//! certificates made here: a publisher over `tls://` and a viewer over
//! `wss://`; a plaintext client and a client trusting another CA refused
//! while a good session streams on; the certificate reloaded on SIGHUP
//! without touching the sessions that run.

mod common;
mod peers;

use std::cell::{Cell, RefCell};
use std::io::{BufRead, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use skiff_core::model::track::Info;
use skiff_monoio::driver::{self, DriverKind};
use skiff_monoio::sdk::Request;
use skiff_monoio::tls::rustls::RootCertStore;
use skiff_monoio::{Client, Config, Error, connect};
use skiff_testkit::pki::Pki;

/// Generous bound on every wait (they end as soon as the outcome is there).
const WAIT: Duration = Duration::from_secs(30);

fn temp_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("skiff-tls-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A relay process serving TLS with the files at `cert` and `key`, its log
/// lines (stderr) sent to a channel.
struct TlsRelay {
    child: std::process::Child,
    addr: SocketAddr,
    log: Receiver<String>,
}

impl TlsRelay {
    fn start(cert: &Path, key: &Path) -> TlsRelay {
        Self::start_with(cert, key, &[])
    }

    fn start_with(cert: &Path, key: &Path, extra: &[&str]) -> TlsRelay {
        let mut child = std::process::Command::new(peers::relay_binary())
            .args(["serve", "--listen", "127.0.0.1:0", "--threads", "2"])
            .args(["--log", "info", "--tls-cert"])
            .arg(cert)
            .arg("--tls-key")
            .arg(key)
            .args(extra)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn skiff-relay");
        let stdout = child.stdout.take().unwrap();
        let mut first = String::new();
        std::io::BufReader::new(stdout)
            .read_line(&mut first)
            .unwrap();
        let addr = first
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("startup line {first:?}"))
            .parse()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, log) = channel();
        std::thread::spawn(move || {
            let echo = std::env::var_os("SKIFF_RELAY_LOG").is_some();
            for l in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                if echo {
                    eprintln!("relay: {l}");
                }
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        TlsRelay { child, addr, log }
    }

    /// Sends SIGHUP to the relay.
    fn hangup(&self) {
        let pid = libc::pid_t::try_from(self.child.id()).unwrap();
        // SAFETY: kill(2) with a pid this test spawned and still owns.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGHUP) }, 0);
    }

    /// Waits (asynchronously, bounded) for a log line containing `text`.
    async fn wait_log(&self, text: &str) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            while let Ok(line) = self.log.try_recv() {
                if line.contains(text) {
                    return line;
                }
            }
            assert!(Instant::now() < deadline, "no log line with {text:?}");
            monoio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for TlsRelay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn trusting(ca: &Path) -> Config {
    let roots: RootCertStore = skiff_monoio::tls::roots_from_pem_file(ca).unwrap();
    let mut config = Config::default();
    config.tls_roots = Some(Arc::new(roots));
    config
}

/// The payload of frame `i`: its index, then a pattern; every 10th frame is
/// 20 KiB (several QMux records, two TLS records).
fn payload(i: u64) -> Vec<u8> {
    let len = if i % 10 == 9 { 20 * 1024 } else { 1200 };
    let mut p: Vec<u8> = (0..len).map(|k| (k as u64 * 7 + i) as u8).collect();
    p[..8].copy_from_slice(&i.to_le_bytes());
    p
}

/// Connects a client and spawns its runner.
fn client(url: &str, config: Config) -> Client {
    let (client, runner) = connect(url, config).unwrap();
    monoio::spawn(runner.run());
    client
}

/// Milliseconds between two frames, and the step of their timestamps: the
/// track keeps the default timescale (milliseconds), so presentation time
/// runs at the pace frames are written and a group the viewer is reading
/// stays cached for the publisher's max age (5 s of it) after the next one
/// starts.
const FRAME_MS: u64 = 20;

/// What the viewers ask for: the live edge on, and every group after it
/// for as long as the publisher keeps it (its 5 s max age), not the live
/// edge only (max latency 0, with which a relay resets a group it has not
/// finished sending once the next one has a second frame: a viewer would
/// lose frames whenever a loaded machine delays the relay by two frames).
const VIEW: Request = Request {
    max_latency: skiff_core::time::Duration::from_secs(5),
    ..Request::LIVE
};

/// Publishes `camera/video` until `stop`: a group of 10 frames every 200 ms,
/// each frame checkable with [`payload`]; frames written are counted.
async fn publish_until(client: Client, stop: Rc<Cell<bool>>, written: Rc<Cell<u64>>) {
    let broadcast = client.publish("camera").unwrap();
    let mut track = broadcast.create_track(Info::new("video").unwrap()).unwrap();
    let mut i = 0u64;
    while !stop.get() {
        let mut group = track.append_group().unwrap();
        for _ in 0..10 {
            group.write_frame(i * FRAME_MS, &payload(i)).await.unwrap();
            i += 1;
            written.set(i);
            monoio::time::sleep(Duration::from_millis(FRAME_MS)).await;
        }
        group.finish().unwrap();
    }
    track.finish();
    client.flushed().await;
    client.close().await;
}

/// Reads `camera/video` until `stop`, checking every frame's bytes; the
/// frame indexes are pushed to `seen`.
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

/// Waits (bounded) until `done` holds.
async fn until(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        monoio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits (bounded) for `client`'s first failed attempt and returns its error.
async fn first_error(client: &Client) -> Rc<Error> {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(e) = client.last_error() {
            return e;
        }
        assert!(
            Instant::now() < deadline,
            "the client neither failed nor gave up"
        );
        monoio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Frames seen after the first `from`, in order and without a gap.
fn consecutive_after(seen: &[u64], from: usize) -> bool {
    seen[from..].windows(2).all(|w| w[1] == w[0] + 1)
}

#[test]
fn publisher_over_tls_viewer_over_wss() {
    let dir = temp_dir("pubsub");
    let pki = Pki::write(&dir, "a");
    let relay = TlsRelay::start(&pki.cert, &pki.key);
    let tls_url = format!("tls://{}/anon", relay.addr);
    let wss_url = format!("wss://{}/anon", relay.addr);
    let ca = pki.ca.clone();
    let seen = driver::block_on(DriverKind::Legacy, move |_| async move {
        let stop = Rc::new(Cell::new(false));
        let seen = Rc::new(RefCell::new(Vec::new()));
        let written = Rc::new(Cell::new(0));
        let viewer = client(&wss_url, trusting(&ca));
        let watching = monoio::spawn(watch_until(viewer.clone(), stop.clone(), seen.clone()));
        let publisher = client(&tls_url, trusting(&ca));
        let publishing = monoio::spawn(publish_until(
            publisher.clone(),
            stop.clone(),
            written.clone(),
        ));
        until("60 frames over wss://", || seen.borrow().len() >= 60).await;
        assert_eq!(publisher.sessions(), 1);
        assert_eq!(viewer.sessions(), 1);
        stop.set(true);
        publishing.await;
        watching.await;
        seen.take()
    })
    .unwrap();
    assert!(consecutive_after(&seen, 0), "frames lost: {seen:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn plaintext_and_untrusted_clients_are_refused_while_a_good_session_streams() {
    let dir = temp_dir("refused");
    let pki = Pki::write(&dir, "a");
    let other = Pki::write(&dir, "b");
    let relay = TlsRelay::start(&pki.cert, &pki.key);
    let addr = relay.addr;
    let ca = pki.ca.clone();
    let other_ca = other.ca.clone();
    driver::block_on(DriverKind::Legacy, move |_| async move {
        let stop = Rc::new(Cell::new(false));
        let seen = Rc::new(RefCell::new(Vec::new()));
        let written = Rc::new(Cell::new(0));
        let viewer = client(&format!("tls://{addr}/anon"), trusting(&ca));
        let watching = monoio::spawn(watch_until(viewer.clone(), stop.clone(), seen.clone()));
        let publisher = client(&format!("tls://{addr}/anon"), trusting(&ca));
        let publishing = monoio::spawn(publish_until(
            publisher.clone(),
            stop.clone(),
            written.clone(),
        ));
        until("the good session's first frames", || {
            seen.borrow().len() >= 10
        })
        .await;

        // QMux in plain text on the TLS port: the attempt fails, no session.
        let plain = client(&format!("tcp://{addr}/anon"), Config::default());
        let e = first_error(&plain).await;
        assert!(matches!(*e, Error::Io(_)), "plaintext client: {e}");
        assert_eq!(plain.sessions(), 0);
        plain.close().await;

        // WebSocket in plain text: refused the same way.
        let plain_ws = client(&format!("ws://{addr}/anon"), Config::default());
        let e = first_error(&plain_ws).await;
        assert!(matches!(*e, Error::Io(_)), "plaintext ws client: {e}");
        plain_ws.close().await;

        // A client that trusts another CA: the TLS handshake fails.
        for url in [format!("tls://{addr}/anon"), format!("wss://{addr}/anon")] {
            let untrusting = client(&url, trusting(&other_ca));
            let e = first_error(&untrusting).await;
            assert!(
                matches!(
                    *e,
                    Error::Tls(skiff_monoio::tls::rustls::Error::InvalidCertificate(_))
                ),
                "{url} with the wrong CA: {e}"
            );
            assert_eq!(untrusting.sessions(), 0);
            untrusting.close().await;
        }

        // The good session went on meanwhile.
        let before = seen.borrow().len();
        until("frames after the refusals", || {
            seen.borrow().len() >= before + 20
        })
        .await;
        assert_eq!(viewer.sessions(), 1);
        assert_eq!(publisher.sessions(), 1);
        stop.set(true);
        publishing.await;
        watching.await;
        assert!(consecutive_after(&seen.borrow(), 0), "frames lost");
    })
    .unwrap();

    // A raw plaintext peer: the relay closes the connection (after a TLS
    // alert) instead of leaving it open.
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    s.write_all(&[0x05, 0xff, 0x00, 0x01, 0x02, 0x03]).unwrap();
    let mut got = Vec::new();
    let end = s.read_to_end(&mut got);
    assert!(
        end.is_ok(),
        "the relay did not close the connection: {end:?}"
    );
    // Nothing, or one TLS alert record (content type 21).
    assert!(got.len() < 64, "{} bytes answered", got.len());
    assert!(got.is_empty() || got[0] == 21, "not an alert: {got:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sighup_reloads_the_certificate_and_keeps_sessions() {
    let dir = temp_dir("reload");
    let a = Pki::write(&dir, "a");
    let b = Pki::write(&dir, "b");
    // The relay reads these two paths; the test swaps what they hold.
    let cert = dir.join("cert.pem");
    let key = dir.join("key.pem");
    std::fs::copy(&a.cert, &cert).unwrap();
    std::fs::copy(&a.key, &key).unwrap();
    let relay = TlsRelay::start(&cert, &key);
    let addr = relay.addr;
    driver::block_on(DriverKind::Legacy, move |_| async move {
        let url = format!("tls://{addr}/anon");
        let stop = Rc::new(Cell::new(false));
        let seen = Rc::new(RefCell::new(Vec::new()));
        let written = Rc::new(Cell::new(0));
        let viewer = client(&url, trusting(&a.ca));
        let watching = monoio::spawn(watch_until(viewer.clone(), stop.clone(), seen.clone()));
        let publisher = client(&url, trusting(&a.ca));
        let publishing = monoio::spawn(publish_until(
            publisher.clone(),
            stop.clone(),
            written.clone(),
        ));
        until("frames with certificate A", || seen.borrow().len() >= 10).await;

        // Certificate B in the files, then SIGHUP.
        std::fs::copy(&b.cert, &cert).unwrap();
        std::fs::copy(&b.key, &key).unwrap();
        relay.hangup();
        relay.wait_log("TLS certificate reloaded").await;
        let at_reload = seen.borrow().len();

        // A new client trusting only B gets in and reads frames.
        let stop_b = Rc::new(Cell::new(false));
        let seen_b = Rc::new(RefCell::new(Vec::new()));
        let viewer_b = client(&url, trusting(&b.ca));
        let watching_b = monoio::spawn(watch_until(
            viewer_b.clone(),
            stop_b.clone(),
            seen_b.clone(),
        ));
        until("frames with certificate B", || seen_b.borrow().len() >= 10).await;
        // New handshakes no longer offer A.
        let only_a = client(&url, trusting(&a.ca));
        let e = first_error(&only_a).await;
        assert!(matches!(*e, Error::Tls(_)), "a client trusting only A: {e}");
        only_a.close().await;

        // A bad file: the reload fails and B stays.
        std::fs::write(&cert, "not a certificate\n").unwrap();
        relay.hangup();
        let line = relay.wait_log("TLS certificate not reloaded").await;
        assert!(
            line.contains("cert.pem"),
            "the error names the file: {line}"
        );
        let again = client(&url, trusting(&b.ca));
        until("a session with B after the failed reload", || {
            again.sessions() >= 1
        })
        .await;
        again.close().await;

        // The first viewer streamed on through both reloads, never reconnecting.
        until("frames after the reloads", || {
            seen.borrow().len() >= at_reload + 20
        })
        .await;
        assert_eq!(viewer.sessions(), 1);
        assert_eq!(publisher.sessions(), 1);
        stop.set(true);
        stop_b.set(true);
        publishing.await;
        watching.await;
        watching_b.await;
        assert!(
            consecutive_after(&seen.borrow(), 0),
            "the first viewer lost frames"
        );
    })
    .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_certificate_files_stop_the_relay_with_status_2() {
    let dir = temp_dir("badfiles");
    let pki = Pki::write(&dir, "a");
    let missing = dir.join("missing.pem");
    let garbage = dir.join("garbage.pem");
    std::fs::write(&garbage, "garbage\n").unwrap();
    let other = Pki::write(&dir, "b");
    for (cert, key, names) in [
        (&missing, &pki.key, &missing),
        (&garbage, &pki.key, &garbage),
        (&pki.cert, &garbage, &garbage),
        // A key that is not the certificate's.
        (&pki.cert, &other.key, &other.key),
    ] {
        let out = std::process::Command::new(peers::relay_binary())
            .args(["serve", "--listen", "127.0.0.1:0", "--tls-cert"])
            .arg(cert)
            .arg("--tls-key")
            .arg(key)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(
            err.contains(&*names.to_string_lossy()),
            "the error names {}: {err}",
            names.display()
        );
    }
    let out = std::process::Command::new(peers::relay_binary())
        .args(["serve", "--listen", "127.0.0.1:0", "--tls-cert"])
        .arg(&pki.cert)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_leaf_relay_dials_its_upstream_over_tls() {
    let dir = temp_dir("upstream");
    let pki = Pki::write(&dir, "a");
    let upstream = TlsRelay::start(&pki.cert, &pki.key);
    let up_url = format!("tls://{}/anon", upstream.addr);
    let leaf = peers::start_relay(&[
        "--upstream",
        &up_url,
        "--upstream-ca",
        pki.ca.to_str().unwrap(),
    ]);
    // The leaf's root is the upstream's `anon` (docs/protocol.md §4.1).
    let leaf_url = format!("tcp://{}/", leaf.addr);
    let ca = pki.ca.clone();
    let seen = driver::block_on(DriverKind::Legacy, move |_| async move {
        let stop = Rc::new(Cell::new(false));
        let seen = Rc::new(RefCell::new(Vec::new()));
        let written = Rc::new(Cell::new(0));
        // The publisher on the TLS upstream, the viewer on the plain leaf.
        let publisher = client(&up_url, trusting(&ca));
        let publishing = monoio::spawn(publish_until(
            publisher.clone(),
            stop.clone(),
            written.clone(),
        ));
        let viewer = client(&leaf_url, Config::default());
        let watching = monoio::spawn(watch_until(viewer.clone(), stop.clone(), seen.clone()));
        until("30 frames through the leaf", || seen.borrow().len() >= 30).await;
        stop.set(true);
        publishing.await;
        watching.await;
        seen.take()
    })
    .unwrap();
    assert!(consecutive_after(&seen, 0), "frames lost: {seen:?}");
    drop(leaf);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_stalled_tls_handshake_is_closed_at_the_handshake_timeout() {
    let dir = temp_dir("stall");
    let pki = Pki::write(&dir, "a");
    let relay = TlsRelay::start_with(&pki.cert, &pki.key, &["--handshake-timeout", "300ms"]);
    // The start of a ClientHello record, and then nothing.
    let mut s = TcpStream::connect(relay.addr).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    s.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01]).unwrap();
    let mut got = Vec::new();
    let end = s.read_to_end(&mut got);
    assert!(
        end.is_ok(),
        "the relay kept a stalled handshake open: {end:?}"
    );
    assert!(got.is_empty(), "{} bytes answered", got.len());
    driver::block_on(DriverKind::Legacy, move |_| async move {
        relay.wait_log("TLS handshake not finished").await;
    })
    .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn http_endpoints_answer_over_tls() {
    let dir = temp_dir("https");
    let pki = Pki::write(&dir, "a");
    let relay = TlsRelay::start(&pki.cert, &pki.key);
    let addr = relay.addr;
    let ca = pki.ca.clone();
    let answer = driver::block_on(DriverKind::Legacy, move |_| async move {
        use skiff_monoio::session_driver::{ByteRead, ByteWrite, split_halves};
        let roots = Arc::new(skiff_monoio::tls::roots_from_pem_file(&ca).unwrap());
        let config =
            skiff_monoio::tls::client_config(roots, &[skiff_monoio::tls::ALPN_HTTP1]).unwrap();
        let conn = skiff_monoio::tls::client_connection(Arc::new(config), "127.0.0.1").unwrap();
        let stream = monoio::net::TcpStream::connect(addr).await.unwrap();
        let (reader, writer) = split_halves(stream, 16 * 1024);
        let (mut reader, mut writer) = skiff_monoio::tls::handshake(conn, reader, writer)
            .await
            .expect("TLS handshake");
        assert_eq!(reader.alpn().as_deref(), Some(&b"http/1.1"[..]));
        writer
            .buffer()
            .extend_from_slice(b"GET /health HTTP/1.1\r\nHost: test\r\n\r\n");
        writer.flush().await.unwrap();
        let mut answer = Vec::new();
        loop {
            let data = reader.read().await.unwrap();
            if data.is_empty() {
                break;
            }
            answer.extend_from_slice(data);
        }
        String::from_utf8(answer).unwrap()
    })
    .unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("ok\n"), "{answer}");
    let _ = std::fs::remove_dir_all(&dir);
}
