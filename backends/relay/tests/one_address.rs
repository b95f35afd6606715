//! Many viewers behind one address, against real `skiff-relay` processes:
//! with the default limits, 1,000 viewers from 127.0.0.1 are all admitted
//! and served; a flood of half-open connections from one address is still
//! refused past `--max-handshakes-per-ip` while admitted viewers stream;
//! and behind a load balancer of `--proxy-protocol-from`, the PROXY
//! header's address (v1 and v2) is what the per-address limits count and
//! the log lines name (before TLS too), while a PROXY header from anyone
//! else, or a malformed one, closes that connection alone.

mod common;
mod peers;
mod trust_any;

use std::cell::{Cell, RefCell};
use std::io::{BufRead, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use peers::*;
use skiff_core::session::Config;
use skiff_monoio::context::ClientLimits;
use skiff_monoio::driver::{self, DriverKind};
use skiff_testkit::client::{self, ClientCtx, Publisher, ReadState};

// ---------------------------------------------------------------------------
// 1,000 viewers from one address
// ---------------------------------------------------------------------------

/// Viewers, all from 127.0.0.1.
const VIEWERS: usize = 1000;
/// Viewers that connect at once: fewer than a worker's default handshakes
/// per address (a quarter of 1024), so none may be refused.
const WAVE: usize = 100;
/// Groups published after every viewer is in (group 0 is open before).
const GROUPS: u64 = 3;
/// Frames per group.
const FRAMES: u64 = 4;
/// Bytes per frame.
const BYTES: usize = 1024;

/// The payload of frame `i` of group `g`.
fn frame(g: u64, i: u64) -> Vec<u8> {
    (0..BYTES)
        .map(|k| (g as usize * 31 + i as usize * 7 + k) as u8)
        .collect()
}

/// What one viewer received.
#[derive(Debug, Default)]
struct Got {
    /// Frames whose group, index and payload were the ones expected next.
    good: u64,
    /// Frames that were not.
    bad: u64,
    /// How its track ended.
    end: Option<ReadState>,
}

/// A publisher of `crowd`/`video` and [`VIEWERS`] viewers of it through
/// `url`, joining in waves of [`WAVE`]; returns what each viewer received
/// and how many frames were published.
async fn crowd(url: String) -> (Vec<Got>, u64, usize) {
    let ctx = Rc::new(ClientCtx::with_limits(
        256 << 20,
        ClientLimits {
            tracks: VIEWERS + 8,
            publications: 1,
        },
    ));
    let notify = ctx.notify().clone();
    let (origin, mut producer) = ctx.publication("crowd", "video");
    {
        let (ctx, url) = (ctx.clone(), url.clone());
        monoio::spawn(async move {
            let mut app = Publisher::default();
            let _ = client::run(&url, Some(origin), &mut app, &ctx).await;
        });
    }
    let mut g0 = producer.create_group(0).unwrap();
    g0.write_frame(0, &frame(0, 0)).unwrap();
    notify.bump();

    let mut states = Vec::new();
    let mut got = Vec::new();
    for _ in 0..VIEWERS / WAVE {
        for _ in 0..WAVE {
            let local = ctx.track("video");
            local.set_budget(1 << 20);
            let seen = Rc::new(RefCell::new(Got::default()));
            got.push(seen.clone());
            let next = Rc::new(Cell::new((0u64, 0u64)));
            let ended = seen.clone();
            states.push(spawn_subscriber(
                &ctx,
                &url,
                "crowd",
                local,
                move |f| {
                    let (g, i) = next.get();
                    let mut s = seen.borrow_mut();
                    if (f.group, f.index) == (g, i) && f.payload == frame(g, i).as_slice() {
                        s.good += 1;
                    } else {
                        s.bad += 1;
                    }
                    next.set(if f.index + 1 == FRAMES {
                        (f.group + 1, 0)
                    } else {
                        (f.group, f.index + 1)
                    });
                },
                move |end| ended.borrow_mut().end = Some(end),
            ));
        }
        // The wave is in (or was turned away) before the next one dials.
        skiff_testkit::wait::until(&notify, || {
            states.iter().all(|s| {
                s.started.get().is_some() || s.session_over.get() || s.closed.get().is_some()
            })
        })
        .await;
    }
    let admitted = states.iter().filter(|s| s.started.get() == Some(0)).count();
    if admitted < VIEWERS {
        // Refused viewers would wait for their track forever.
        ctx.close_all();
        return (Vec::new(), 0, admitted);
    }

    let mut published = 1;
    let mut current = Some(g0);
    for g in 0..=GROUPS {
        let mut w = match current.take() {
            Some(w) => w,
            None => producer.create_group(g).unwrap(),
        };
        let first = if g == 0 { 1 } else { 0 };
        for i in first..FRAMES {
            w.write_frame(g * 1000 + i, &frame(g, i)).unwrap();
            published += 1;
            notify.bump();
            monoio::time::sleep(Duration::from_millis(5)).await;
        }
        w.finish().unwrap();
        notify.bump();
    }
    producer.finish();
    notify.bump();
    skiff_testkit::wait::until(&notify, || got.iter().all(|s| s.borrow().end.is_some())).await;
    ctx.close_all();
    monoio::time::sleep(Duration::from_millis(100)).await;
    let got = got
        .into_iter()
        .map(|s| std::mem::take(&mut *s.borrow_mut()))
        .collect();
    (got, published, admitted)
}

/// With the default limits on two workers, 1,000 viewers from 127.0.0.1
/// are all admitted and receive every frame; nothing is refused.
#[test]
fn a_thousand_viewers_from_one_address_are_all_served() {
    within(240, || {
        let relay = RelayProcess::start_threads(relay_binary(), 2, &[]);
        let url = format!("tcp://{}/", relay.addr);
        let (got, published, admitted) = std::thread::spawn(move || {
            driver::block_on(DriverKind::Legacy, move |_| crowd(url)).expect("client runtime")
        })
        .join()
        .expect("viewers");
        assert_eq!(admitted, VIEWERS, "viewers admitted");
        for (i, g) in got.iter().enumerate() {
            assert_eq!(
                (g.good, g.bad, g.end),
                (published, 0, Some(ReadState::Finished)),
                "viewer {i}"
            );
        }
        eprintln!("{VIEWERS} viewers from 127.0.0.1: {published} frames each, all delivered");
        assert_eq!(relay.metric("skiff_relay_quota_refused_total"), 0);
        assert_eq!(relay.metric("skiff_relay_connections_refused_total"), 0);
    });
}

// ---------------------------------------------------------------------------
// A half-open flood from one address
// ---------------------------------------------------------------------------

/// A TCP connection to `relay` from the loopback address `from`.
fn connect_from(from: Ipv4Addr, relay: SocketAddr) -> TcpStream {
    let sock = socket2::Socket::new(
        socket2::Domain::IPV4,
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )
    .expect("socket");
    sock.bind(&SocketAddr::new(IpAddr::V4(from), 0).into())
        .expect("bind a loopback address");
    sock.connect_timeout(&relay.into(), IO_TIMEOUT)
        .expect("connect");
    let s: TcpStream = sock.into();
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    s.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
    s
}

/// Silent connections from one address past its handshakes (the default: a
/// quarter of --max-handshakes, 256 on one worker) are refused; admitted
/// viewers from that address lose no frame, another address is admitted
/// during the flood, and the address is admitted again once it ends.
#[test]
fn a_half_open_flood_from_one_address_is_refused_while_viewers_stream() {
    const FLOOD: usize = 400;
    const HELD: u64 = 256;
    within(120, || {
        let relay = start_relay(&[]);
        let audience = SteadyAudience::start(relay.addr);
        let established = GOOD as u64 + 1;
        let flood: Vec<TcpStream> = (0..FLOOD).map(|_| connect(relay.addr)).collect();
        eventually_within(Duration::from_secs(20), "the flood counted", || {
            relay.metric("skiff_relay_quota_refused_total") == FLOOD as u64 - HELD
        });
        assert_eq!(
            relay.metric("skiff_relay_connections_open"),
            established + HELD
        );
        let mut more = connect(relay.addr);
        assert!(
            closed_by_peer(&mut more),
            "a handshake past the address's quota was let in"
        );
        let mut other = Raw::over(
            connect_from(Ipv4Addr::new(127, 0, 0, 2), relay.addr),
            Config::new(),
            None,
        );
        other.handshake();
        drop(flood);
        eventually_within(Duration::from_secs(20), "the flood gone", || {
            relay.metric("skiff_relay_connections_open") == established + 1
        });
        let mut again = Raw::connect(relay.addr, Config::new(), None);
        again.handshake();
        check_good(&audience.finish());
        assert_eq!(
            relay.metric("skiff_relay_quota_refused_total"),
            FLOOD as u64 - HELD + 1
        );
    });
}

// ---------------------------------------------------------------------------
// Behind a load balancer: the PROXY protocol
// ---------------------------------------------------------------------------

/// A relay process whose log lines (on its stderr) the test reads.
struct Logged {
    child: Child,
    addr: SocketAddr,
    metrics: SocketAddr,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Logged {
    /// `skiff-relay serve` on 127.0.0.1 with one worker, debug logs and
    /// `extra` flags.
    fn start(extra: &[&str]) -> Logged {
        let mut child = Command::new(relay_binary())
            .args(["serve", "--listen", "127.0.0.1:0", "--threads", "1"])
            .args(["--metrics", "127.0.0.1:0", "--log", "debug"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn skiff-relay");
        let lines = Arc::new(Mutex::new(Vec::new()));
        {
            let (stderr, lines) = (child.stderr.take().expect("stderr"), lines.clone());
            std::thread::spawn(move || {
                for l in std::io::BufReader::new(stderr)
                    .lines()
                    .map_while(Result::ok)
                {
                    lines.lock().unwrap().push(l);
                }
            });
        }
        // The binary prints "listening on ADDR", then "metrics on ADDR".
        let mut out = std::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
        let mut after = |marker: &str| -> SocketAddr {
            let l = out.next().expect("a startup line").expect("stdout");
            let i = l.find(marker).expect("the startup line") + marker.len();
            l[i..].trim().parse().expect("an address")
        };
        let addr = after("listening on ");
        let metrics = after("metrics on ");
        Logged {
            child,
            addr,
            metrics,
            lines,
        }
    }

    fn metric(&self, series: &str) -> u64 {
        let (_, body) = http_get(self.metrics, "/metrics");
        sample(&body, series).unwrap_or_else(|| panic!("no {series} in the metrics"))
    }

    /// Waits until a log line holds every one of `words`.
    fn logged(&self, words: &[&str]) {
        eventually_within(
            Duration::from_secs(10),
            &format!("a log line with {words:?}"),
            || {
                self.lines
                    .lock()
                    .unwrap()
                    .iter()
                    .any(|l| words.iter().all(|w| l.contains(w)))
            },
        );
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A PROXY protocol v1 header for a TCP connection from `client`.
fn v1(client: &str) -> Vec<u8> {
    let (ip, port) = client.rsplit_once(':').unwrap();
    format!("PROXY TCP4 {ip} 192.0.2.1 {port} 4443\r\n").into_bytes()
}

/// A PROXY protocol v2 header: PROXY from `client` (IPv4), or LOCAL.
fn v2(client: Option<SocketAddr>) -> Vec<u8> {
    let mut h = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    match client {
        Some(SocketAddr::V4(c)) => {
            h.extend_from_slice(&[0x21, 0x11, 0, 12]);
            h.extend_from_slice(&c.ip().octets());
            h.extend_from_slice(&[192, 0, 2, 1]);
            h.extend_from_slice(&c.port().to_be_bytes());
            h.extend_from_slice(&4443u16.to_be_bytes());
        }
        _ => h.extend_from_slice(&[0x20, 0x00, 0, 0]),
    }
    h
}

/// A connection from `from` to the relay that sends `header` first.
fn with_header(from: Ipv4Addr, relay: SocketAddr, header: &[u8]) -> TcpStream {
    let mut s = connect_from(from, relay);
    s.write_all(header).expect("write the header");
    s
}

/// A raw session over a connection from the balancer (127.0.0.1) whose
/// PROXY header is `header`.
fn proxied(relay: SocketAddr, header: &[u8]) -> Raw {
    let mut raw = Raw::over(
        with_header(Ipv4Addr::LOCALHOST, relay, header),
        Config::new(),
        None,
    );
    raw.handshake();
    raw
}

/// Whether the relay closed a raw session that sent `header` (the QMux
/// handshake sent after it).
fn refused(relay: SocketAddr, from: Ipv4Addr, header: &[u8]) -> bool {
    let mut raw = Raw::over(with_header(from, relay, header), Config::new(), None);
    raw.send_output();
    raw.wait_closed(IO_TIMEOUT).is_some() && !raw.session.is_setup()
}

/// Behind a balancer at 127.0.0.1 with one connection per address: v1 and
/// v2 clients are counted by the header's address (two addresses pass, a
/// second connection from either is refused and logged under it), a LOCAL
/// header counts as the balancer, HTTP and WebSocket work after a header; a PROXY header
/// from another address and a malformed one close that connection alone.
#[test]
fn proxy_headers_from_the_balancer_name_the_client() {
    within(120, || {
        let relay = Logged::start(&[
            "--proxy-protocol-from",
            "127.0.0.1/32",
            "--max-connections-per-ip",
            "1",
        ]);
        let addr = relay.addr;
        let a = proxied(addr, &v1("203.0.113.7:50312"));
        let b = proxied(addr, &v2(Some("198.51.100.9:6000".parse().unwrap())));
        relay.logged(&["tcp 203.0.113.7:50312", "PROXY header"]);
        relay.logged(&["tcp 198.51.100.9:6000", "PROXY header"]);
        assert!(refused(addr, Ipv4Addr::LOCALHOST, &v1("203.0.113.7:50313")));
        relay.logged(&[
            "connection refused",
            "203.0.113.7:50313",
            "max-connections-per-ip",
        ]);
        let second_b = v2(Some("198.51.100.9:6001".parse().unwrap()));
        assert!(refused(addr, Ipv4Addr::LOCALHOST, &second_b));
        relay.logged(&[
            "connection refused",
            "198.51.100.9:6001",
            "max-connections-per-ip",
        ]);
        assert_eq!(relay.metric("skiff_relay_quota_refused_total"), 2);

        // A LOCAL header (a health check) counts as the balancer itself.
        let local = proxied(addr, &v2(None));

        // HTTP after a header: the page is served.
        let mut http = with_header(Ipv4Addr::LOCALHOST, addr, &v1("192.0.2.200:1000"));
        http.write_all(b"GET /health HTTP/1.1\r\nHost: relay\r\n\r\n")
            .unwrap();
        let mut answer = String::new();
        http.read_to_string(&mut answer).expect("HTTP answer");
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");

        // A WebSocket upgrade after a header: upgraded, named by the header.
        {
            let mut ws = with_header(Ipv4Addr::LOCALHOST, addr, &v1("192.0.2.201:1001"));
            ws.write_all(
                b"GET /anon HTTP/1.1\r\nHost: relay\r\nUpgrade: websocket\r\n\
                  Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
                  Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: qmux-01.moq-lite-05\r\n\r\n",
            )
            .unwrap();
            let mut head = [0u8; 12];
            ws.read_exact(&mut head).expect("an answer to the upgrade");
            assert_eq!(&head, b"HTTP/1.1 101");
            relay.logged(&["ws 192.0.2.201:1001", "websocket: upgraded"]);
        }

        // From an address that is no balancer, a PROXY header is not the
        // relay's protocol: v1 reads as HTTP and is refused, v2 as QMux.
        let stranger = Ipv4Addr::new(127, 0, 0, 3);
        let mut s = with_header(stranger, addr, &v1("203.0.113.99:1"));
        s.write_all(b"\r\n").unwrap();
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        assert!(answer.starts_with("HTTP/1.1 400"), "{answer:?}");
        assert!(refused(
            addr,
            stranger,
            &v2(Some("203.0.113.99:2".parse().unwrap()))
        ));

        // A malformed header from the balancer closes that connection.
        let refused_before = relay.metric("skiff_relay_connections_refused_total");
        assert!(refused(
            addr,
            Ipv4Addr::LOCALHOST,
            b"PROXY TCP4 300.0.0.1 192.0.2.1 1 4443\r\n"
        ));
        relay.logged(&["PROXY header refused", "malformed PROXY v1 header"]);
        assert_eq!(
            relay.metric("skiff_relay_connections_refused_total"),
            refused_before + 1
        );

        // Nothing else was touched: the three sessions are open and answer.
        let mut sessions = [("v1", a), ("v2", b), ("local", local)];
        for (name, raw) in &mut sessions {
            assert!(
                !raw.pump_until(Duration::from_millis(200), |r| r.close.is_some()),
                "the {name} session was closed"
            );
        }
        eventually_within(Duration::from_secs(10), "three sessions open", || {
            relay.metric("skiff_relay_connections_open") == 3
        });
        // Its connection gone, an address is admitted again.
        let [(_, a), ..] = sessions;
        drop(a);
        eventually_within(Duration::from_secs(10), "the v1 session gone", || {
            relay.metric("skiff_relay_connections_open") == 2
        });
        let _again = proxied(addr, &v1("203.0.113.7:50314"));
    });
}

/// `GET /health` over TLS on `s` (a PROXY header already sent): the answer.
fn https_health(s: TcpStream) -> String {
    let provider = rustls::crypto::aws_lc_rs::default_provider();
    let verifier = Arc::new(trust_any::TrustAny::new(
        provider.signature_verification_algorithms,
    ));
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, s);
    // A refused handshake leaves nothing to read.
    if tls
        .write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .is_err()
    {
        return String::new();
    }
    let mut answer = Vec::new();
    let _ = tls.read_to_end(&mut answer);
    String::from_utf8_lossy(&answer).into_owned()
}

/// On a TLS port, the PROXY header comes before the TLS handshake: the
/// request over TLS is served and logged under the header's address, and
/// the address's limit counts it.
#[test]
fn a_proxy_header_precedes_tls() {
    within(60, || {
        let dir = std::env::temp_dir().join(format!("skiff-proxy-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pki = skiff_testkit::pki::Pki::write(&dir, "proxy");
        let relay = Logged::start(&[
            "--tls-cert",
            pki.cert.to_str().unwrap(),
            "--tls-key",
            pki.key.to_str().unwrap(),
            "--proxy-protocol-from",
            "127.0.0.0/8",
        ]);
        let header = v2(Some("203.0.113.50:7000".parse().unwrap()));
        let answer = https_health(with_header(Ipv4Addr::LOCALHOST, relay.addr, &header));
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
        relay.logged(&["https 203.0.113.50:7000", "http request"]);
        // Without its header, the balancer's TLS is a malformed header.
        let answer = https_health(connect_from(Ipv4Addr::new(127, 0, 0, 5), relay.addr));
        assert!(answer.is_empty(), "{answer:?}");
        relay.logged(&["PROXY header refused", "127.0.0.5"]);
        let _ = std::fs::remove_dir_all(&dir);
    });
}
