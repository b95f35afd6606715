//! The published `moq-relay` 0.17.10 as a child process, for the interop tests
//! that run against it (docs/protocol.md §7.1).
//!
//! The binary is taken from `$MOQ_RELAY`, else the per-machine cache `.ci/moq-relay`
//! installs into (`${XDG_CACHE_HOME:-$HOME/.cache}/skiff/moq-relay-0.17.10/bin/moq-relay`),
//! else `moq-relay` on `PATH`. A test without one prints [`INSTALL`] in a skip line and
//! passes; its `_required` twin (ignored by default) fails instead.
#![allow(dead_code)]

use std::fs::File;
use std::io::Read;
use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub use skiff_testkit::relay_process::moq_relay_binary;

/// How to get the relay (docs/protocol.md §7.1).
pub const INSTALL: &str = "bash .ci/moq-relay (or set MOQ_RELAY=/path/to/moq-relay)";
/// Bound on the relay coming up.
const STARTUP: Duration = Duration::from_secs(15);

/// A running `moq-relay`, killed on drop; its output goes to a log file.
pub struct MoqRelay {
    child: Child,
    /// Its plain-TCP QMux listener, or its QUIC (UDP) one
    /// ([`MoqRelay::start_quic`]).
    pub addr: SocketAddr,
    /// The SHA-256 of its generated certificate, as its `GET
    /// /certificate.sha256` answers it (64 hex digits; QUIC only).
    pub fingerprint: Option<String>,
    log: PathBuf,
}

impl MoqRelay {
    /// Starts `bin` on a free loopback port: TCP-only (no QUIC, so no certificates),
    /// anonymous publish and subscribe everywhere (docs/protocol.md §7.1).
    pub fn start(bin: &Path) -> Self {
        Self::start_public(bin, "**")
    }

    /// As [`MoqRelay::start`], anonymous access limited to the paths `public`
    /// matches (`--auth-public`, e.g. `anon/**`).
    pub fn start_public(bin: &Path, public: &str) -> Self {
        Self::start_with(bin, None, public, &[])
    }

    /// Starts `bin` with a plain-TCP listener on `addr` (a free loopback port
    /// when `None`; a given one lets a killed relay start again where its
    /// peers dial it), anonymous access to what `public` matches, and `extra`
    /// flags after those (e.g. `--cluster-connect URL`, `--cluster-id N`).
    pub fn start_with(bin: &Path, addr: Option<SocketAddr>, public: &str, extra: &[&str]) -> Self {
        let addr = addr.unwrap_or_else(|| {
            let port = TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("free port")
                .port();
            SocketAddr::from(([127, 0, 0, 1], port))
        });
        let log = std::env::temp_dir().join(format!(
            "skiff-moq-relay-{}-{}.log",
            std::process::id(),
            addr.port()
        ));
        let out = File::create(&log).expect("relay log file");
        let err = out.try_clone().expect("relay log file");
        let child = Command::new(bin)
            .args(["--listen-tcp-bind", &addr.to_string()])
            .args(["--auth-public", public])
            .args(["--log-level", "info"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", bin.display()));
        let mut relay = MoqRelay {
            child,
            addr,
            fingerprint: None,
            log,
        };
        relay.wait_listening();
        relay
    }

    /// The URL a peer or client dials for its root (`tcp://ADDR/`).
    pub fn url(&self) -> String {
        format!("tcp://{}/", self.addr)
    }

    /// Kills it at once (SIGKILL), as a crashed node. Drop it before starting
    /// another relay on its port: the two share a log file, which a drop removes.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts `bin` serving moq-lite over QUIC only, on a free loopback UDP
    /// port with a certificate it generates for `localhost`
    /// (`--listen-tls-generate`), anonymous access everywhere, and its HTTP
    /// listener on a free TCP port for `GET /certificate.sha256`, which is
    /// read once it answers (docs/protocol.md §11.3).
    pub fn start_quic(bin: &Path) -> Self {
        Self::start_quic_with(bin, &["--listen-tls-generate", "localhost"])
    }

    /// As [`MoqRelay::start_quic`], with `args` (the certificate's flags,
    /// the runtime's) instead of `--listen-tls-generate localhost`.
    pub fn start_quic_with(bin: &Path, args: &[&str]) -> Self {
        let port = UdpSocket::bind("127.0.0.1:0")
            .and_then(|s| s.local_addr())
            .expect("free UDP port")
            .port();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let web = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free TCP port");
        let log = std::env::temp_dir().join(format!(
            "skiff-moq-relay-quic-{}-{port}.log",
            std::process::id()
        ));
        let out = File::create(&log).expect("relay log file");
        let err = out.try_clone().expect("relay log file");
        let child = Command::new(bin)
            .args(["--listen", &addr.to_string()])
            .args(args)
            .args(["--web-http-listen", &web.to_string()])
            .args(["--auth-public", "**"])
            .args(["--log-level", "info"])
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", bin.display()));
        let mut relay = MoqRelay {
            child,
            addr,
            fingerprint: None,
            log,
        };
        let deadline = Instant::now() + STARTUP;
        loop {
            if let Ok(Some(status)) = relay.child.try_wait() {
                panic!(
                    "moq-relay exited during startup ({status}):\n{}",
                    relay.log_text()
                );
            }
            if let Some(body) = http_get(web, "/certificate.sha256") {
                relay.fingerprint = Some(body.trim().to_owned());
                return relay;
            }
            assert!(
                Instant::now() < deadline,
                "moq-relay's web listener {web} did not answer after {STARTUP:?}:\n{}",
                relay.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Polls until the listener accepts a connection (the probe connection is dropped
    /// at once; the relay just logs a failed handshake).
    fn wait_listening(&mut self) {
        let deadline = Instant::now() + STARTUP;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "moq-relay exited during startup ({status}):\n{}",
                    self.log_text()
                );
            }
            if TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)).is_ok() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "moq-relay not listening on {} after {STARTUP:?}:\n{}",
                self.addr,
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The relay's output so far.
    pub fn log_text(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = File::open(&self.log) {
            let _ = f.read_to_string(&mut s);
        }
        s
    }
}

/// The body of a 200 answer to `GET path` from the HTTP listener at `addr`;
/// `None` while it does not listen or answers anything else.
fn http_get(addr: SocketAddr, path: &str) -> Option<String> {
    let mut sock = TcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok()?;
    sock.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        sock,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut answer = String::new();
    sock.read_to_string(&mut answer).ok()?;
    let (head, body) = answer.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| body.to_owned())
}

impl Drop for MoqRelay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- moq-relay log ({}) ---\n{}", self.log.display(), {
                let text = self.log_text();
                let tail: Vec<&str> = text.lines().rev().take(60).collect();
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            });
        } else {
            let _ = std::fs::remove_file(&self.log);
        }
    }
}
