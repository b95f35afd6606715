//! The `skiff-relay` binary as a process: flag and file errors, flags
//! overriding the file, `demo`, and a clean exit on SIGTERM within the drain
//! timeout, on both drivers.

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::*;
use skiff_monoio::driver::DriverKind;

fn relay() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_skiff-relay"));
    c.stdin(Stdio::null());
    c
}

/// Runs to completion with a time bound (kills the process if exceeded).
fn run_bounded(cmd: &mut Command, secs: u64) -> Output {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn skiff-relay");
    let id = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(out) => out.expect("wait"),
        Err(_) => {
            signal(id, libc::SIGKILL);
            panic!("skiff-relay did not exit within {secs} s");
        }
    }
}

fn signal(pid: u32, sig: i32) {
    let pid = libc::pid_t::try_from(pid).unwrap();
    // SAFETY: kill(2) takes plain integers; the pid is our own child.
    let rc = unsafe { libc::kill(pid, sig) };
    assert_eq!(rc, 0, "kill failed");
}

/// Writes `name` into this test process's scratch folder, removed when
/// the returned guard drops.
fn temp_file(name: &str, text: &str) -> TempFile {
    // One folder per file, so concurrent tests never remove each other's.
    let dir = std::env::temp_dir().join(format!("skiff-relay-test-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    TempFile(p)
}

struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
        if let Some(dir) = self.0.parent() {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

// --- errors ---

#[test]
fn bad_flags_exit_2_with_a_message() {
    for args in [
        &["--listen", "not-an-address"][..],
        &["--threads", "many"],
        &["--max-frame-bytes", "12 parsecs"],
        &["--upstream", "http://x:1/"],
        &["--log", "loud"],
        &["--no-such-flag"],
        &["--threads", "0", "serve"],
        &["--cluster-id", "0", "serve"],
        &["--cluster-id", "4611686018427387904", "serve"],
        &["--cluster-max-hops", "0", "serve"],
        &["--cluster-max-hops", "33", "serve"],
        &["--cluster-connect", "relay.example:4443", "serve"],
        &["--cluster-connect", "tcp://b:1/?cost=cheap", "serve"],
        &["--cluster-connect-api", "ftp://peers/", "serve"],
        &["--cluster-token", "/nonexistent/cluster.jwt", "serve"],
        &[
            "--max-frame-bytes",
            "2MiB",
            "--max-group-bytes",
            "1MiB",
            "serve",
        ],
    ] {
        let out = run_bounded(relay().args(args), 20);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(err.contains("error"), "{args:?}: {err}");
    }
}

#[test]
fn bad_config_files_exit_2_with_a_message() {
    let cases = [
        (
            "unknown.toml",
            "listen = \"127.0.0.1:0\"\nmax-conections = 5\n",
            "max-conections",
        ),
        ("type.toml", "threads = \"two\"\n", "invalid config file"),
        ("syntax.toml", "threads = \n", "invalid config file"),
        ("value.toml", "threads = 0\n", "threads"),
    ];
    for (name, text, want) in cases {
        let path = temp_file(name, text);
        let out = run_bounded(relay().arg("serve").arg("--config").arg(&path.0), 20);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        assert!(err.contains(want), "{name}: {err}");
        assert!(!err.contains("panicked"), "{name}: {err}");
    }
    let out = run_bounded(relay().args(["--config", "/nonexistent/skiff.toml"]), 20);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("cannot read config file /nonexistent/skiff.toml"));
}

#[test]
fn serve_relays_and_exits_0_on_sigterm() {
    let mut r = Running::start(&["serve", "--listen", "127.0.0.1:0", "--log", "warn"], None);
    let addr = r.addr_line("listening on ");
    // A client that sends garbage is closed by the session (not the process).
    let mut c = connect(addr);
    std::io::Write::write_all(&mut c, &[0xff; 32]).unwrap();
    let mut reply = Vec::new();
    // The session writes its close, then the socket closes (timeouts bound it).
    let _ = std::io::Read::read_to_end(&mut c, &mut reply);
    assert!(!reply.is_empty(), "no close frame before the socket closed");
    signal(r.child.id(), libc::SIGTERM);
    let (code, _) = r.wait_exit(Duration::from_secs(10));
    assert_eq!(code, 0);
}

/// A web directory that has no page and is no npm project's output, so the
/// demo runs without building the watch page (`.ci/fresh-clone-demo` tests
/// that build on a fresh clone).
fn no_page_dir() -> PathBuf {
    std::env::temp_dir().join(format!("skiff-relay-test-{}-no-page", std::process::id()))
}

#[test]
fn relay_demo_delivers_and_exits_0() {
    let out = run_bounded(
        relay()
            .args(["demo", "--seconds", "2", "--viewers", "3", "--log", "warn"])
            .arg("--web-dir")
            .arg(no_page_dir()),
        60,
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}\n{}", stderr(&out));
    assert!(text.contains("3 viewers"), "{text}");
    assert!(text.contains("frames delivered and verified"), "{text}");
    assert!(!text.contains("failure"), "{text}");
}

#[test]
fn relay_demo_over_quic_delivers_with_tcp_kept_plain() {
    let mut r = Running::start(
        &[
            "demo",
            "--transport",
            "quic",
            "--seconds",
            "3",
            "--viewers",
            "3",
            "--log",
            "warn",
            "--web-dir",
            no_page_dir().to_str().unwrap(),
        ],
        None,
    );
    // "demo: camera and viewers dial moql://ADDR/ (QUIC on UDP, certificate sha256 HEX)".
    let line = r.next_line();
    let rest = line
        .strip_prefix("demo: camera and viewers dial moql://")
        .unwrap_or_else(|| panic!("no QUIC line: {line}"));
    let (addr, rest) = rest.split_once("/ (").unwrap();
    let addr: SocketAddr = addr.parse().unwrap();
    let pin = rest
        .strip_prefix("QUIC on UDP, certificate sha256 ")
        .and_then(|p| p.strip_suffix(')'))
        .unwrap_or_else(|| panic!("no fingerprint: {line}"));
    assert_eq!(pin.len(), 64, "{line}");
    // The browser's URL: the watch page on the same port, plain HTTP.
    let watch = r.next_line();
    assert!(
        watch.contains(&format!("http://{addr}/?name=demo/cam.hang")),
        "{watch}"
    );
    // The TCP port stays plain and answers the fingerprint the clients pinned.
    let (status, body) = http_get(addr, "/certificate.sha256");
    assert!(status.contains("200"), "{status}");
    assert_eq!(body.trim(), pin);
    let (code, _) = r.wait_exit(Duration::from_secs(60));
    let text: Vec<String> = r.lines.iter().collect();
    let text = text.join("\n");
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("  moql  camera"),
        "progress names the transport: {text}"
    );
    assert!(text.contains("3 viewers over moql"), "{text}");
    // Every viewer read every frame but those before its first group's start.
    let delivered = text
        .lines()
        .find_map(|l| {
            let (_, rest) = l.split_once(" frames published, ")?;
            rest.split_once(" frames delivered and verified")?
                .0
                .parse::<u64>()
                .ok()
        })
        .unwrap_or_else(|| panic!("no delivery line: {text}"));
    assert!(delivered >= 3 * 60, "{delivered} frames delivered: {text}");
    assert!(!text.contains("failure"), "{text}");
}

#[test]
fn relay_demo_refuses_certificate_files() {
    let dir =
        std::env::temp_dir().join(format!("skiff-relay-test-{}-demo-pki", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pki = skiff_testkit::pki::Pki::write(&dir, "demo");
    let out = run_bounded(
        relay()
            .args(["demo", "--transport", "quic", "--tls-cert"])
            .arg(&pki.cert)
            .arg("--tls-key")
            .arg(&pki.key),
        20,
    );
    let _ = std::fs::remove_dir_all(&dir);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("the demo keeps its TCP port plain"), "{err}");
}

#[test]
fn help_and_version_exit_0() {
    let out = run_bounded(relay().arg("--help"), 20);
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--listen",
        "--threads",
        "--upstream",
        "--cache-bytes",
        "--max-connections",
        "--metrics",
        "--config",
        "--max-connections-per-ip",
        "--max-handshakes-per-ip",
        "--max-handshakes",
        "--proxy-protocol-from",
        "--max-announces",
        "--max-pending-tracks",
        "--max-pending-tracks-per-broadcast",
        "--max-relay-tracks",
        "--max-waiting-track-requests",
    ] {
        assert!(help.contains(flag), "help lacks {flag}");
    }
    assert_eq!(
        run_bounded(relay().arg("--version"), 20).status.code(),
        Some(0)
    );
}

// --- running process ---

struct Running {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Running {
    fn start(args: &[&str], config: Option<&PathBuf>) -> Self {
        let mut cmd = relay();
        cmd.args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if let Some(p) = config {
            cmd.arg("--config").arg(p);
        }
        let mut child = cmd.spawn().expect("spawn");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Running { child, lines }
    }

    fn addr_line(&self, prefix: &str) -> SocketAddr {
        let l = self
            .lines
            .recv_timeout(Duration::from_secs(20))
            .expect("startup line");
        l.strip_prefix(prefix)
            .unwrap_or_else(|| panic!("expected `{prefix}…`, got `{l}`"))
            .parse()
            .unwrap()
    }

    /// The next line of stdout (fails after 20 s without one).
    fn next_line(&self) -> String {
        self.lines
            .recv_timeout(Duration::from_secs(20))
            .expect("a line of stdout")
    }

    /// Waits for exit; kills and fails after `limit`.
    fn wait_exit(&mut self, limit: Duration) -> (i32, Duration) {
        let t0 = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return (st.code().unwrap_or(-1), t0.elapsed());
            }
            if t0.elapsed() > limit {
                let _ = self.child.kill();
                panic!("skiff-relay did not exit within {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn sigterm_drains_and_exits_0_with_flags_over_file() {
    for kind in drivers() {
        let driver = if kind == DriverKind::IoUring {
            "io-uring"
        } else {
            "legacy"
        };
        // The file's listen address is not ours (bind would fail): the flag must win.
        let file = temp_file(
            &format!("run-{driver}.toml"),
            "listen = \"192.0.2.1:9\"\nthreads = 2\nmetrics = \"127.0.0.1:0\"\ndrain-timeout = \"3s\"\nlog = \"warn\"\n",
        );
        let mut r = Running::start(
            &["serve", "--listen", "127.0.0.1:0", "--driver", driver],
            Some(&file.0),
        );
        let addr = r.addr_line("listening on ");
        assert!(addr.ip().is_loopback());
        let maddr = r.addr_line("metrics on ");

        // A connection that has sent nothing yet: the drain closes it.
        let mut c = connect(addr);
        eventually("the connection counted open", || {
            let (_, body) = http_get(maddr, "/");
            sample(&body, "skiff_relay_connections_open") == Some(1)
        });
        let (_, body) = http_get(maddr, "/");
        assert_eq!(
            sample(&body, "skiff_relay_worker_threads"),
            Some(2),
            "threads from the file"
        );
        let uring = u64::from(kind == DriverKind::IoUring);
        assert_eq!(
            sample(&body, "skiff_relay_thread_io_uring{thread=\"0\"}"),
            Some(uring)
        );

        signal(r.child.id(), libc::SIGTERM);
        let (code, took) = r.wait_exit(Duration::from_secs(3 + 5));
        assert_eq!(code, 0, "{driver}: exit code");
        assert!(
            took < Duration::from_secs(3 + 2),
            "{driver}: exit took {took:?}"
        );
        assert!(
            closed_by_peer(&mut c),
            "{driver}: open connection closed on drain"
        );
    }
}

#[test]
fn sigint_before_any_connection_exits_0() {
    let mut r = Running::start(
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--threads",
            "1",
            "--log",
            "off",
        ],
        None,
    );
    let _ = r.addr_line("listening on ");
    signal(r.child.id(), libc::SIGINT);
    let (code, _) = r.wait_exit(Duration::from_secs(10));
    assert_eq!(code, 0);
}
