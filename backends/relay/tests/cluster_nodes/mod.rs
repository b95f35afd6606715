//! A small cluster of `skiff-relay serve` processes on loopback addresses
//! for the cluster tests: each node on a free port with its metrics, its
//! stderr kept for the log checks, killed when dropped.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use skiff_testkit::relay_process::RelayProcess;

/// One relay process of a test cluster.
pub struct Node {
    process: RelayProcess,
    /// Its listen address (QMux over TCP, HTTP).
    pub addr: SocketAddr,
    /// Its metrics address.
    pub metrics: SocketAddr,
    log: Arc<Mutex<String>>,
}

impl Node {
    /// Starts `skiff-relay serve` with `threads` workers and `args`; unless
    /// `args` give them, on free loopback ports (listen and metrics), info
    /// logs, a 1 s drain and a 3 s failover grace. Fails the test if it does
    /// not listen within 20 s.
    pub fn start(threads: usize, args: &[String]) -> Node {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_skiff-relay"));
        cmd.args(["serve", "--threads", &threads.to_string()]);
        // Defaults each test may override by giving the flag itself.
        for (flag, value) in [
            ("--listen", "127.0.0.1:0"),
            ("--metrics", "127.0.0.1:0"),
            ("--drain-timeout", "1s"),
            ("--failover-grace", "3s"),
            ("--log", "info"),
        ] {
            if !args.iter().any(|a| a == flag) {
                cmd.args([flag, value]);
            }
        }
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn skiff-relay");
        let stderr = child.stderr.take().expect("stderr");
        let log = Arc::new(Mutex::new(String::new()));
        {
            let log = log.clone();
            std::thread::spawn(move || {
                for l in BufReader::new(stderr).lines().map_while(Result::ok) {
                    if std::env::var_os("CLUSTER_TEST_LOG").is_some() {
                        eprintln!("{l}");
                    }
                    let mut g = log.lock().unwrap();
                    g.push_str(&l);
                    g.push('\n');
                }
            });
        }
        let process = RelayProcess::from_child(child, false);
        Node {
            addr: process.addr,
            metrics: process.metrics,
            process,
            log,
        }
    }

    /// The URL peers and clients dial (`tcp://127.0.0.1:PORT/`).
    pub fn url(&self) -> String {
        format!("tcp://{}/", self.addr)
    }

    /// What it logged so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Its Prometheus text.
    pub fn metrics_text(&self) -> String {
        get(self.metrics, "/").1
    }

    /// A sample of its metrics (`0` when the series is absent).
    pub fn sample(&self, series: &str) -> u64 {
        let text = self.metrics_text();
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .find_map(|l| {
                l.strip_prefix(series)?
                    .strip_prefix(' ')?
                    .trim()
                    .parse()
                    .ok()
            })
            .unwrap_or(0)
    }

    /// Sessions open with the cluster peer `peer` (a node).
    pub fn sessions_with(&self, peer: &Node) -> u64 {
        self.sample(&format!(
            "skiff_relay_peer_sessions_open{{peer=\"{}\"}}",
            peer.url()
        ))
    }

    /// Whether its metrics list the cluster peer `peer` at all.
    pub fn lists_peer(&self, peer: &Node) -> bool {
        self.metrics_text()
            .contains(&format!("{{peer=\"{}\"}}", peer.url()))
    }

    /// The broadcast paths it announces (`GET /announced`).
    pub fn announced(&self) -> Vec<String> {
        let (_, body) = get(self.addr, "/announced");
        serde_json::from_str(&body).unwrap_or_default()
    }

    /// Its resident memory, bytes (VmRSS).
    pub fn rss(&self) -> u64 {
        self.process.rss()
    }

    /// Its resident memory once its pools' trims (once a second) have run.
    pub fn settled_rss(&self) -> u64 {
        self.process.settled_rss()
    }

    /// Kills it at once (SIGKILL), as a crashed node.
    pub fn kill9(&mut self) {
        let _ = self.process.child.kill();
        let _ = self.process.child.wait();
    }
}

/// GETs `path` from the HTTP server at `addr`: (status line, body).
pub fn get(addr: SocketAddr, path: &str) -> (String, String) {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5)) else {
        return (String::new(), String::new());
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"
    );
    let mut resp = String::new();
    let _ = s.read_to_string(&mut resp);
    match resp.split_once("\r\n\r\n") {
        Some((head, body)) => (
            head.lines().next().unwrap_or("").to_owned(),
            body.to_owned(),
        ),
        None => (String::new(), String::new()),
    }
}

/// Waits (up to `secs`) until `cond` holds; fails the test naming `what`.
pub fn wait_for(what: &str, secs: u64, mut cond: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(secs);
    while !cond() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A scratch directory for this test process.
pub fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("skiff-cluster-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Writes `text` to `path` through a temporary file and a rename, so a
/// reader never sees half of it.
pub fn write_atomically(path: &std::path::Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Flags dialing each of `peers`.
pub fn connect_to(peers: &[&Node]) -> Vec<String> {
    peers
        .iter()
        .flat_map(|p| ["--cluster-connect".to_owned(), p.url()])
        .collect()
}

/// `count` nodes, each with a peer list file, `--cluster-id` 1 to `count`
/// and the flags `extra`; the files are then written with `links` (node
/// `i` dials node `j` for each `(i, j)`), and the test waits until every
/// dial has its session. Returns the nodes and the scratch directory that
/// holds the files (`peers-I.json`).
pub fn cluster_with(
    name: &str,
    count: usize,
    links: &[(usize, usize)],
    extra: &[&str],
) -> (Vec<Node>, std::path::PathBuf) {
    let dir = scratch(name);
    let nodes: Vec<Node> = (0..count)
        .map(|i| {
            let list = dir.join(format!("peers-{i}.json"));
            write_atomically(&list, "[]");
            let mut args = vec![
                "--cluster-connect-api".to_owned(),
                list.display().to_string(),
                "--cluster-id".to_owned(),
                (i + 1).to_string(),
            ];
            args.extend(extra.iter().map(|a| a.to_string()));
            Node::start(1, &args)
        })
        .collect();
    for i in 0..count {
        let peers: Vec<String> = links
            .iter()
            .filter(|(from, _)| *from == i)
            .map(|(_, to)| format!("\"{}\"", nodes[*to].url()))
            .collect();
        write_atomically(
            &dir.join(format!("peers-{i}.json")),
            &format!("[{}]", peers.join(",")),
        );
    }
    for &(i, j) in links {
        wait_for(&format!("node {i}'s session with node {j}"), 20, || {
            nodes[i].sessions_with(&nodes[j]) == 1
        });
    }
    (nodes, dir)
}
