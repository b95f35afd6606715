//! QMux over WebSocket through a real relay on loopback (docs/protocol.md §9):
//! the SDK publishing and subscribing over `ws://` (and a TCP publisher with
//! a WebSocket viewer), the HTTP endpoints on the same port, and bad
//! WebSocket peers, each closed cleanly while another session keeps
//! streaming every frame in order.

mod common;

#[path = "readme/publish.rs"]
mod publish;
#[path = "readme/subscribe.rs"]
mod subscribe;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use skiff_monoio::driver::{self, DriverKind};
use skiff_relay::relay::RelayHandler;
use skiff_relay::server::{self, ServerHandle};
use skiff_ws::frame::{self, Decoder, OP_BINARY, OP_CLOSE, OP_PING, Role};

/// The relay's handshake timeout here (the slow handshake case waits for it).
const HANDSHAKE: Duration = Duration::from_secs(1);

fn start(web_dir: &Path) -> ServerHandle {
    let mut cfg = config(1, DriverKind::Legacy);
    cfg.timeouts.handshake = HANDSHAKE;
    cfg.web_dir = web_dir.to_path_buf();
    server::start(cfg, RelayHandler::factory(1).unwrap()).expect("start relay")
}

/// A fresh directory for a test's web files.
fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("skiff-ws-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Checks `frames` (group, timestamp, bytes) as the README publisher writes
/// them: in order from where the viewer joined to the last of `total`.
fn check_frames(frames: &[(u64, u64, usize)], total: u64) {
    assert!(!frames.is_empty(), "the viewer saw no frame");
    // The README publisher stamps frame i at i * 1000 / 30 ms.
    let first = (frames[0].1 * 30).div_ceil(1000);
    for (k, &(_, timestamp, len)) in frames.iter().enumerate() {
        assert_eq!(
            timestamp,
            (first + k as u64) * 1000 / 30,
            "frame {k} out of order"
        );
        assert_eq!(len, 1200);
    }
    assert_eq!(
        frames.last().unwrap().1,
        (total - 1) * 1000 / 30,
        "the last frame is missing"
    );
    assert!(first < 30, "the viewer joined late: first frame {first}");
}

/// The README's viewer on `watch_url` and publisher on `publish_url`.
fn publish_and_watch(
    publish_url: String,
    watch_url: String,
    frames: u64,
) -> Vec<(u64, u64, usize)> {
    driver::block_on(DriverKind::Legacy, move |_| async move {
        let viewer = monoio::spawn(async move { subscribe::watch(&watch_url).await });
        monoio::time::sleep(Duration::from_millis(200)).await;
        publish::publish(&publish_url, frames)
            .await
            .expect("publish");
        viewer.await.expect("watch")
    })
    .expect("runtime")
}

#[test]
fn sdk_publishes_and_subscribes_over_websocket() {
    within(60, || {
        let dir = temp_dir("sdk");
        // Mixed too: a TCP publisher, a WebSocket viewer and the other way
        // round (a relay each: the README's broadcast name is fixed).
        for (publisher, viewer, frames) in [("ws", "ws", 75), ("tcp", "ws", 45), ("ws", "tcp", 45)]
        {
            let relay = start(&dir);
            let addr = relay.local_addr();
            let (p, v) = (
                format!("{publisher}://{addr}/"),
                format!("{viewer}://{addr}/"),
            );
            check_frames(&publish_and_watch(p, v, frames), frames);
            relay.shutdown().unwrap();
        }
    });
}

#[test]
fn sdk_refuses_other_schemes() {
    for url in ["http://127.0.0.1:1/x", "wss://nohost/x", "ws://nohost/x"] {
        let err = skiff_monoio::connect(url, skiff_monoio::Config::default()).err();
        assert!(
            matches!(err, Some(skiff_monoio::Error::InvalidUrl { .. })),
            "{url}: {err:?}"
        );
    }
}

// ---------------------------------------------------------------------------
// Endpoints
// ---------------------------------------------------------------------------

/// GETs `path` (with `method`): (status line, head, body).
fn request(addr: SocketAddr, method: &str, path: &str) -> (String, String, Vec<u8>) {
    let mut s = connect(addr);
    write!(s, "{method} {path} HTTP/1.1\r\nHost: test\r\n\r\n").unwrap();
    let mut resp = Vec::new();
    s.read_to_end(&mut resp).expect("read response");
    let at = resp
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a head");
    let head = String::from_utf8(resp[..at].to_vec()).unwrap();
    let status = head.lines().next().unwrap_or("").to_owned();
    (status, head, resp[at + 4..].to_vec())
}

#[test]
fn endpoints_on_the_listen_port() {
    within(60, || {
        let dir = temp_dir("endpoints");
        std::fs::write(dir.join("index.html"), "<moq-watch></moq-watch>").unwrap();
        std::fs::create_dir_all(dir.join("assets")).unwrap();
        std::fs::write(dir.join("assets/app.mjs"), "export {}").unwrap();
        std::fs::write(dir.parent().unwrap().join("secret.txt"), "no").unwrap();
        let relay = start(&dir);
        let addr = relay.local_addr();

        let (status, head, body) = request(addr, "GET", "/certificate.sha256");
        assert!(status.starts_with("HTTP/1.1 404"), "{status}");
        assert!(head.contains("Connection: close"));
        assert!(!body.is_empty());
        let (status, _, body) = request(addr, "GET", "/health");
        assert!(status.starts_with("HTTP/1.1 200"), "{status}");
        assert_eq!(body, b"ok\n");
        let (status, head, body) = request(addr, "GET", "/");
        assert!(status.starts_with("HTTP/1.1 200"));
        assert!(head.contains("Content-Type: text/html"));
        assert_eq!(body, b"<moq-watch></moq-watch>");
        let (status, head, body) = request(addr, "GET", "/assets/app.mjs");
        assert!(status.starts_with("HTTP/1.1 200"));
        assert!(head.contains("Content-Type: text/javascript"));
        assert_eq!(body, b"export {}");
        let (_, head, body) = request(addr, "HEAD", "/assets/app.mjs");
        assert!(head.contains("Content-Length: 9") && body.is_empty());
        for bad in [
            "/../secret.txt",
            "/assets/../../secret.txt",
            "/%2e%2e/secret.txt",
            "/missing.js",
        ] {
            let (status, _, _) = request(addr, "GET", bad);
            assert!(status.starts_with("HTTP/1.1 404"), "{bad}: {status}");
        }
        let (status, _, _) = request(addr, "POST", "/health");
        assert!(status.starts_with("HTTP/1.1 405"), "{status}");
        let (status, _, body) = request(addr, "GET", "/announced");
        assert!(status.starts_with("HTTP/1.1 200"));
        assert_eq!(body, b"[]");

        // A broadcast announced over WebSocket is listed while it lives.
        let url = format!("ws://{addr}/");
        let listed = driver::block_on(DriverKind::Legacy, move |_| async move {
            use skiff_core::model::track::Info;
            let (client, runner) =
                skiff_monoio::connect(&url, skiff_monoio::Config::default()).unwrap();
            monoio::spawn(runner.run());
            let broadcast = client.publish("demo/cam.hang").unwrap();
            let _track = broadcast.create_track(Info::new("video").unwrap()).unwrap();
            let mut listed = Vec::new();
            for _ in 0..200 {
                monoio::time::sleep(Duration::from_millis(20)).await;
                let body = std::thread::spawn(move || request(addr, "GET", "/announced").2)
                    .join()
                    .unwrap();
                if body != b"[]" {
                    listed = body;
                    break;
                }
            }
            client.close().await;
            listed
        })
        .unwrap();
        assert_eq!(String::from_utf8(listed).unwrap(), r#"["demo/cam.hang"]"#);
        relay.shutdown().unwrap();

        // Without index.html, `/` says how to build the player.
        let empty = temp_dir("endpoints-empty");
        let relay = start(&empty);
        let (status, _, body) = request(relay.local_addr(), "GET", "/");
        assert!(status.starts_with("HTTP/1.1 200"));
        let body = String::from_utf8(body).unwrap();
        assert!(
            body.contains("npm --prefix web ci && npm --prefix web run build")
                || body.contains("npm --prefix web ci &amp;&amp; npm --prefix web run build"),
            "{body}"
        );
        relay.shutdown().unwrap();
    });
}

// ---------------------------------------------------------------------------
// Bad WebSocket peers
// ---------------------------------------------------------------------------

const KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";

/// Sends an upgrade request offering `protocols` (if any); returns the
/// stream, the answer's status line and the bytes after its head.
fn upgrade(addr: SocketAddr, protocols: Option<&str>) -> (TcpStream, String, Vec<u8>) {
    let mut s = connect(addr);
    let offer = protocols.map_or(String::new(), |p| {
        format!("Sec-WebSocket-Protocol: {p}\r\n")
    });
    write!(
        s,
        "GET /anon HTTP/1.1\r\nHost: test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {KEY}\r\nSec-WebSocket-Version: 13\r\n{offer}\r\n"
    )
    .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let at = loop {
        if let Some(at) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            break at;
        }
        let n = s.read(&mut buf).expect("read answer");
        assert!(n > 0, "closed before answering");
        got.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8(got[..at].to_vec()).unwrap();
    (
        s,
        head.lines().next().unwrap().to_owned(),
        got[at + 4..].to_vec(),
    )
}

/// Sends one masked frame.
fn send_frame(s: &mut TcpStream, opcode: u8, payload: &[u8]) {
    let key = frame::new_mask();
    let mut head = [0u8; frame::MAX_HEADER];
    let n = frame::encode_header(opcode, payload.len() as u64, Some(key), &mut head);
    head[0] = (head[0] & 0xf0) | opcode;
    let mut out = head[..n].to_vec();
    let mut body = payload.to_vec();
    frame::apply_mask(&mut body, key, 0);
    out.extend_from_slice(&body);
    s.write_all(&out).unwrap();
}

/// Reads the server's frames until it closes: (the records of its binary
/// messages, its close code).
fn until_close(s: &mut TcpStream, early: &[u8]) -> (Vec<u8>, Option<u16>) {
    let (records, code, _) = until_close_counting(s, early);
    (records, code)
}

/// [`until_close`], and the Pongs the server sent.
fn until_close_counting(s: &mut TcpStream, early: &[u8]) -> (Vec<u8>, Option<u16>, u64) {
    let mut d = Decoder::new(Role::Client, 1 << 20, 1 << 16);
    d.feed(early).unwrap();
    let mut records = d.records().to_vec();
    d.consume(d.records().len());
    let mut buf = [0u8; 4096];
    while d.closed().is_none() {
        let n = match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        d.feed(&buf[..n]).expect("the server's frames decode");
        records.extend_from_slice(d.records());
        d.consume(d.records().len());
    }
    (records, d.closed().flatten(), d.pongs())
}

/// QMux transport and application CONNECTION_CLOSE frame types.
fn has_connection_close(records: &[u8]) -> bool {
    let mut rest = records;
    while let Ok((size, n)) = skiff_core::wire::varint::decode(rest) {
        let body = &rest[n..n + size as usize];
        if matches!(body.first(), Some(0x1c | 0x1d)) {
            return true;
        }
        rest = &rest[n + size as usize..];
    }
    false
}

#[test]
fn bad_peers_are_closed_while_a_stream_goes_on() {
    within(90, || {
        let dir = temp_dir("abuse");
        let relay = start(&dir);
        let addr = relay.local_addr();
        const FRAMES: u64 = 240;
        // A publisher paced at 30 fps and a viewer, both over WebSocket.
        let url = format!("ws://{addr}/");
        let stream = std::thread::spawn(move || publish_and_watch(url.clone(), url, FRAMES));
        std::thread::sleep(Duration::from_millis(600));

        // A wrong subprotocol: 400.
        let (_, status, _) = upgrade(addr, Some("qmux-00.moq-lite-05, qmux-01, webtransport"));
        assert!(status.starts_with("HTTP/1.1 400"), "{status}");

        // A non-upgrade request: answered and closed.
        let (status, head, _) = request(addr, "GET", "/nothing");
        assert!(status.starts_with("HTTP/1.1 404") && head.contains("Connection: close"));

        // Garbage that starts like a method: 400.
        let mut g = connect(addr);
        g.write_all(b"GARBAGE\x00\xff\r\n\r\n").unwrap();
        let mut answer = String::new();
        let _ = g.read_to_string(&mut answer);
        assert!(answer.starts_with("HTTP/1.1 400"), "{answer:?}");

        // Garbage that is neither HTTP nor QMux: the connection is closed.
        let mut g = connect(addr);
        g.write_all(&[0x01, 0x02, 0x03, 0x04]).unwrap();
        let mut rest = Vec::new();
        assert!(g.read_to_end(&mut rest).is_ok(), "not closed");

        // Upgraded with our subprotocol, then a text frame: close 1003.
        let (mut s, status, early) =
            upgrade(addr, Some("qmux-02.moq-lite-05, qmux-01.moq-lite-05"));
        assert!(status.starts_with("HTTP/1.1 101"), "{status}");
        send_frame(&mut s, 0x1, b"hello");
        assert_eq!(
            until_close(&mut s, &early).1,
            Some(frame::CLOSE_UNSUPPORTED)
        );

        // An oversized message: close 1009.
        let (mut s, _, early) = upgrade(addr, Some("qmux-01.moq-lite-05"));
        send_frame(&mut s, OP_BINARY, &vec![0u8; 20_000]);
        assert_eq!(until_close(&mut s, &early).1, Some(frame::CLOSE_TOO_BIG));

        // A record split across two messages: the first is a record whose
        // frame is cut short, a QMux violation; CONNECTION_CLOSE, then a close.
        let (mut s, _, early) = upgrade(addr, Some("qmux-01.moq-lite-05"));
        let params = [
            0xff, 0x51, 0x53, 0x30, 0x0d, 0x0a, 0x0d, 0x0a, 0x06, 0x04, 0x04, 0x80,
        ];
        send_frame(&mut s, OP_BINARY, &params[..9]);
        send_frame(&mut s, OP_BINARY, &params[9..]);
        let (records, code) = until_close(&mut s, &early);
        assert!(
            has_connection_close(&records),
            "no CONNECTION_CLOSE in {records:02x?}"
        );
        assert!(code.is_some());

        // A ping is answered with a pong before anything else goes wrong.
        let (mut s, _, early) = upgrade(addr, Some("qmux-01.moq-lite-05"));
        send_frame(&mut s, OP_PING, b"p1");
        send_frame(
            &mut s,
            OP_CLOSE,
            &frame::close_payload(frame::CLOSE_NORMAL, "bye").0[..5],
        );
        let (_, code, pongs) = until_close_counting(&mut s, &early);
        assert_eq!(code, Some(frame::CLOSE_NORMAL));
        assert_eq!(pongs, 1);

        // A slow handshake: half a request head, then nothing: 408 at the timeout.
        let mut slow = connect(addr);
        slow.write_all(b"GET /anon HTTP/1.1\r\nHost: te").unwrap();
        let started = std::time::Instant::now();
        let mut answer = String::new();
        let _ = slow.read_to_string(&mut answer);
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer:?}");
        assert!(started.elapsed() >= HANDSHAKE / 2);

        let frames = stream.join().expect("stream");
        check_frames(&frames, FRAMES);
        relay.shutdown().unwrap();
    });
}
