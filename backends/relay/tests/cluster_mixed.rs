//! Mixed clusters of `skiff-relay` and the published `moq-relay` 0.17.10
//! (README "Running a cluster"): skiff — moq-relay — skiff and moq-relay —
//! skiff — moq-relay, peering with `--cluster-connect` over plain TCP, a
//! skiff SDK publisher on one end and a skiff SDK viewer on the other, every
//! frame checked (bytes, order, timestamp).
//!
//! moq-relay is found as `skiff_testkit::relay_process::moq_relay_binary`
//! says (`$MOQ_RELAY`, the per-machine cache, `PATH`); without one each test
//! prints a skip line and passes.

mod cluster_nodes;
mod sdk_stream;

use std::fs::File;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cluster_nodes::*;
use sdk_stream::PACED;
use skiff_monoio::Config;
use skiff_monoio::driver::{self, DriverKind};
use skiff_testkit::relay_process::moq_relay_binary;

/// Groups the publisher writes (ten frames each).
const GROUPS: u64 = 12;

/// A `moq-relay` process on a free loopback TCP port, anonymous access to
/// everything, dialing `peers`; killed when dropped.
struct MoqRelay {
    child: Child,
    addr: SocketAddr,
    log: std::path::PathBuf,
}

impl MoqRelay {
    fn start(bin: &Path, peers: &[String]) -> MoqRelay {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let log = std::env::temp_dir().join(format!(
            "skiff-cluster-moq-relay-{}-{port}.log",
            std::process::id()
        ));
        let out = File::create(&log).expect("log file");
        let err = out.try_clone().expect("log file");
        let mut cmd = Command::new(bin);
        cmd.args(["--listen-tcp-bind", &addr.to_string()])
            .args(["--auth-public", "**"])
            .args(["--log-level", "info"]);
        for p in peers {
            cmd.args(["--cluster-connect", p]);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("spawn moq-relay");
        let relay = MoqRelay { child, addr, log };
        let until = Instant::now() + Duration::from_secs(15);
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            assert!(
                Instant::now() < until,
                "moq-relay did not listen:\n{}",
                relay.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        relay
    }

    fn url(&self) -> String {
        format!("tcp://{}/", self.addr)
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for MoqRelay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// The moq-relay binary, or `None` after printing a skip line.
fn moq_relay() -> Option<std::path::PathBuf> {
    let bin = moq_relay_binary();
    if bin.is_none() {
        eprintln!("SKIP: no moq-relay (bash .ci/moq-relay, or set MOQ_RELAY)");
    }
    bin
}

/// An SDK publisher dialing `publisher` and an SDK viewer dialing `viewer`:
/// the frame indices the viewer read, each checked.
fn stream(publisher: String, viewer: String) -> Vec<u64> {
    driver::block_on(DriverKind::Legacy, move |_| {
        PACED.view_groups(
            (viewer, Config::default()),
            (publisher, Config::default()),
            GROUPS,
            || {},
        )
    })
    .expect("runtime")
}

/// skiff A ← moq-relay M ← skiff C (M dials A, C dials M): a publisher on
/// A reaches a viewer on C through moq-relay.
#[test]
fn skiff_moq_relay_skiff() {
    let Some(bin) = moq_relay() else { return };
    let a = Node::start(2, &[]);
    let m = MoqRelay::start(&bin, &[a.url()]);
    wait_for("M's session with A (a peer on A)", 20, || {
        a.sample("skiff_relay_cluster_peers_accepted_total") >= 1
    });
    let c = Node::start(2, &["--cluster-connect".to_owned(), m.url()]);
    wait_for("C's sessions with M", 20, || {
        c.sample(&format!(
            "skiff_relay_peer_sessions_open{{peer=\"{}\"}}",
            m.url()
        )) == 2
    });
    let seen = stream(a.url(), c.url());
    assert_eq!(
        seen,
        (0..GROUPS * 10).collect::<Vec<_>>(),
        "{}",
        m.log_text()
    );
}

/// moq-relay M1 ← skiff S ← moq-relay M2 (S dials M1, M2 dials S): a
/// publisher on M1 reaches a viewer on M2 through skiff.
#[test]
fn moq_relay_skiff_moq_relay() {
    let Some(bin) = moq_relay() else { return };
    let m1 = MoqRelay::start(&bin, &[]);
    let s = Node::start(2, &["--cluster-connect".to_owned(), m1.url()]);
    wait_for("S's sessions with M1", 20, || {
        s.sample(&format!(
            "skiff_relay_peer_sessions_open{{peer=\"{}\"}}",
            m1.url()
        )) == 2
    });
    let m2 = MoqRelay::start(&bin, &[s.url()]);
    wait_for("M2's session with S (a peer on S)", 20, || {
        s.sample("skiff_relay_cluster_peers_accepted_total") >= 1
    });
    let seen = stream(m1.url(), m2.url());
    assert_eq!(
        seen,
        (0..GROUPS * 10).collect::<Vec<_>>(),
        "M1:\n{}\nM2:\n{}",
        m1.log_text(),
        m2.log_text()
    );
}
