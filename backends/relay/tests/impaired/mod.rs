//! What the tests on an impaired link share (issue 34, "Loss and delay"):
//! two network namespaces, the relays run in one of them, skiff's SDK as one
//! publisher and ten viewers in the other, the checks on every frame and
//! the report.
//!
//! - The relays run in the relay's namespace (`ip netns exec`); the clients
//!   run on a thread that joined the clients' namespace (`setns`), so both
//!   clients share one clock and a frame's timestamp (microseconds since the
//!   test began) gives its latency on arrival.
//! - Every row is a relay and a transport: skiff-relay over TCP (`tcp://`)
//!   and QUIC (`moql://`, pinned to its `--tls-generate` certificate), and
//!   the published moq-relay the same way when it is installed.
//! - Asserted (deterministic): every frame of every group a viewer reads
//!   arrives intact and in order, a group that ends cleanly holds all its
//!   frames, no group arrives twice, and every viewer sees the track end.
//!   Groups cut or skipped by the live-edge rule (`Request::LIVE`) are
//!   counted and printed, with p50/p99 frame latency and frames within
//!   500 ms, as medians and spread over the runs.
//!
//! A test names its environment variables with a prefix (`LOSS`, `DELAY`):
//! `PREFIX_RUNS` sets the runs per row, `PREFIX_BUDGET_SECS` the time after
//! which no further run starts at one link condition, `PREFIX_VERBOSE`
//! prints each cut group's viewer history, `PREFIX_TRACE` the clients'
//! debug log (and keeps the relays' debug logs), and `PREFIX_ROWS=TEXT`
//! keeps only the rows whose name contains TEXT.
#![allow(dead_code)]

pub mod emulator;

use std::cell::{Cell, RefCell};
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::rc::Rc;
use std::time::{Duration, Instant};

use skiff_core::model::track::Info;
use skiff_monoio::driver::{self, DriverKind};
use skiff_monoio::sdk::Request;
use skiff_monoio::tls::Fingerprint;
use skiff_monoio::{Config, connect};

/// Viewers per run.
pub const VIEWERS: usize = 10;
/// Bytes per frame.
pub const FRAME_BYTES: usize = 16 * 1024;
/// Frames per second the publisher writes.
pub const FPS: u64 = 30;
/// Frames per group (half a second).
pub const PER_GROUP: u64 = 15;
/// Groups per run (three seconds of media).
pub const GROUPS: u64 = 6;
/// A frame is on time if it arrives within this of its timestamp.
pub const ON_TIME: Duration = Duration::from_millis(500);
/// Bound on one run past its media (connecting, then draining).
const RUN_SLACK: Duration = Duration::from_secs(15);

/// skiff-relay's port (TCP QMux and HTTP; UDP QUIC).
const SKIFF_PORT: u16 = 4443;
/// moq-relay's QUIC, TCP and HTTP ports.
const MOQ_QUIC_PORT: u16 = 4453;
const MOQ_TCP_PORT: u16 = 4454;
const MOQ_WEB_PORT: u16 = 4455;

/// Frame `i` of group `g`: both indices, then a pattern of them.
fn payload(g: u64, i: u64) -> Vec<u8> {
    let mut p = Vec::with_capacity(FRAME_BYTES);
    p.extend_from_slice(&g.to_le_bytes());
    p.extend_from_slice(&i.to_le_bytes());
    for k in p.len()..FRAME_BYTES {
        p.push((g as usize * 13 + i as usize * 7 + k) as u8);
    }
    p
}

// ---------------------------------------------------------------------------
// Commands, namespaces, relay processes
// ---------------------------------------------------------------------------

/// Runs a command; its stderr on failure.
pub fn run(program: &str, args: &[&str]) -> Result<(), String> {
    run_input(program, args, None).map(|_| ())
}

/// Runs a command with `input` on its stdin; its stdout on success.
pub fn run_input(program: &str, args: &[&str], input: Option<&str>) -> Result<String, String> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{program}: {e}"))?;
    if let Some(text) = input {
        let mut stdin = child.stdin.take().expect("piped stdin");
        stdin
            .write_all(text.as_bytes())
            .map_err(|e| format!("{program} stdin: {e}"))?;
    }
    drop(child.stdin.take());
    let out = child
        .wait_with_output()
        .map_err(|e| format!("{program}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{program} {}: {}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Whether `program` runs at all.
pub fn has(program: &str) -> bool {
    Command::new(program)
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

/// Prints why the test named `test` does not run.
pub fn skip(test: &str, reason: &str) {
    println!("SKIPPED {test} test: {reason}");
}

/// Why the test cannot run here, if it cannot: it needs root and `tools`.
pub fn missing(tools: &[&str]) -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root (namespaces and links need it)".to_owned());
    }
    tools
        .iter()
        .find(|tool| !has(tool))
        .map(|tool| format!("`{tool}` is not installed (apt-get install iproute2 nftables)"))
}

/// Two network namespaces named after this test and process (the relay's
/// and the clients'), each with its loopback up; both are deleted on drop,
/// which removes every link and rule inside them.
pub struct Namespaces {
    /// The relays' namespace.
    pub relay: String,
    /// The clients' namespace.
    pub client: String,
}

impl Namespaces {
    /// Makes `skiff-TAG-PID-r` and `skiff-TAG-PID-c`.
    pub fn create(tag: &str) -> Result<Namespaces, String> {
        let pid = std::process::id();
        let ns = Namespaces {
            relay: format!("skiff-{tag}-{pid}-r"),
            client: format!("skiff-{tag}-{pid}-c"),
        };
        for name in [&ns.relay, &ns.client] {
            run("ip", &["netns", "add", name])?;
            run("ip", &["-n", name, "link", "set", "lo", "up"])?;
        }
        Ok(ns)
    }

    /// Joins the calling thread to namespace `name` (sockets and devices it
    /// opens after live there).
    pub fn enter(name: &str) -> Result<(), String> {
        let path = format!("/run/netns/{name}");
        let file = std::fs::File::open(&path).map_err(|e| format!("{path}: {e}"))?;
        // SAFETY: setns on a descriptor this thread owns; it changes only the
        // calling thread's network namespace.
        let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
        if rc == 0 {
            Ok(())
        } else {
            Err(format!("setns {name}: {}", std::io::Error::last_os_error()))
        }
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for ns in [&self.relay, &self.client] {
            let _ = run("ip", &["netns", "del", ns]);
        }
    }
}

/// A relay process in the relay's namespace, killed on drop; its output
/// goes to a log file, printed if the test fails.
struct RelayChild {
    child: Child,
    log: PathBuf,
    keep_log: bool,
}

impl RelayChild {
    fn spawn(ns: &str, binary: &Path, args: &[&str], name: &str, keep_log: bool) -> RelayChild {
        let log = std::env::temp_dir().join(format!("{ns}-{name}.log"));
        let out = std::fs::File::create(&log).expect("log file");
        let err = out.try_clone().expect("log file");
        let child = Command::new("ip")
            .args(["netns", "exec", ns])
            .arg(binary)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", binary.display()));
        RelayChild {
            child,
            log,
            keep_log,
        }
    }
}

impl Drop for RelayChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(40).collect();
            eprintln!("--- {} ---", self.log.display());
            for l in tail.into_iter().rev() {
                eprintln!("{l}");
            }
        }
        if self.keep_log {
            eprintln!("relay log kept: {}", self.log.display());
        } else {
            let _ = std::fs::remove_file(&self.log);
        }
    }
}

/// The body of a 200 answer to `GET path` at `addr`; `None` while nothing
/// answers there.
fn http_get(addr: SocketAddr, path: &str) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(300)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut answer = String::new();
    s.read_to_string(&mut answer).ok()?;
    let (head, body) = answer.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200")
        .then(|| body.trim().to_owned())
}

/// Polls `GET /certificate.sha256` at `addr` until it answers (bounded).
fn fingerprint(addr: SocketAddr, child: &mut RelayChild) -> Fingerprint {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(Some(status)) = child.child.try_wait() {
            panic!("the relay exited at startup: {status}");
        }
        if let Some(body) = http_get(addr, "/certificate.sha256") {
            return body.parse().expect("64 hex digits");
        }
        assert!(Instant::now() < deadline, "no fingerprint at {addr}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

// ---------------------------------------------------------------------------
// One run: a publisher and ten viewers through one relay and transport
// ---------------------------------------------------------------------------

/// What one viewer saw.
#[derive(Debug, Default)]
struct Viewer {
    /// Latency of every frame read, in microseconds.
    latencies: Vec<u64>,
    /// Groups read to their end.
    complete: u64,
    /// Groups the relay or the SDK ended early (the live-edge rule).
    cut: u64,
    /// Groups that ended cleanly short of their frames, where the row
    /// allows it (see [`Row::truncates`]).
    truncated: u64,
    /// Whether the track's end arrived.
    ended: bool,
    /// Groups that arrived again after their first copy was cut (the
    /// relay served them anew, e.g. after a reconnection).
    resent: u64,
    /// Sessions the viewer set up (1 without reconnections).
    sessions: u64,
    /// Why its most recent session ended, if one did.
    last_error: Option<String>,
    /// Each group read: its sequence, the frames read, and how it ended
    /// (`None`: cleanly).
    history: Vec<(u64, u64, Option<String>)>,
    errors: Vec<String>,
}

/// What a run measured, over all its viewers.
#[derive(Debug, Default)]
struct RunResult {
    latencies: Vec<u64>,
    /// Published groups no viewer read whole, summed over viewers.
    groups_lost: u64,
    cut: u64,
    truncated: u64,
    resent: u64,
    /// Sessions set up beyond one per client (reconnections).
    reconnections: u64,
    /// Why the sessions that ended early did (each reason once).
    reasons: Vec<String>,
    frames: u64,
    /// How far behind its schedule the publisher's last frame began, in
    /// microseconds (the SDK paces a publisher whose uplink falls behind).
    publisher_late: u64,
    errors: Vec<String>,
}

/// A viewer: subscribes at the live edge, then reads and checks every frame
/// until the track ends.
async fn view(
    url: String,
    path: String,
    config: Config,
    truncates: bool,
    epoch: Instant,
    subscribed: Rc<Cell<usize>>,
    out: Rc<RefCell<Viewer>>,
) {
    let (client, runner) = match connect(&url, config) {
        Ok(c) => c,
        Err(e) => {
            out.borrow_mut().errors.push(format!("connect: {e}"));
            return;
        }
    };
    monoio::spawn(runner.run());
    let mut track = match client.subscribe(&path, "video", Request::LIVE).await {
        Ok(t) => t,
        Err(e) => {
            out.borrow_mut().errors.push(format!("subscribe: {e}"));
            return;
        }
    };
    subscribed.set(subscribed.get() + 1);
    let mut groups_seen = Vec::new();
    loop {
        let mut group = match track.next_group().await {
            Ok(Some(g)) => g,
            Ok(None) => {
                out.borrow_mut().ended = true;
                break;
            }
            Err(e) => {
                out.borrow_mut().errors.push(format!("next_group: {e}"));
                break;
            }
        };
        let g = group.sequence();
        if groups_seen.contains(&g) {
            // A cut group may be served again (a new subscription after a
            // reconnection starts at the latest group); one that ended
            // cleanly must not come twice.
            let mut v = out.borrow_mut();
            if v.history.iter().any(|(h, _, end)| *h == g && end.is_none()) {
                let before = format!("{:?}", v.history);
                v.errors.push(format!(
                    "group {g} arrived again after it was whole: {before}"
                ));
            } else {
                v.resent += 1;
            }
        }
        groups_seen.push(g);
        let mut next = 0u64;
        loop {
            match group.read_frame().await {
                Ok(Some(frame)) => {
                    let arrived = epoch.elapsed().as_micros() as u64;
                    let bytes = frame.payload.to_vec();
                    let mut v = out.borrow_mut();
                    if bytes != payload(g, next) {
                        let head = bytes.get(..16).map(|h| {
                            (
                                u64::from_le_bytes(h[..8].try_into().unwrap()),
                                u64::from_le_bytes(h[8..].try_into().unwrap()),
                            )
                        });
                        v.errors.push(format!(
                            "group {g} frame {next}: {} bytes, header {head:?}",
                            bytes.len()
                        ));
                    }
                    v.latencies.push(arrived.saturating_sub(frame.timestamp));
                    next += 1;
                }
                Ok(None) => {
                    let mut v = out.borrow_mut();
                    v.history.push((g, next, None));
                    if next == PER_GROUP {
                        v.complete += 1;
                    } else if truncates {
                        v.truncated += 1;
                    } else {
                        v.errors
                            .push(format!("group {g} ended cleanly after {next} frames"));
                    }
                    break;
                }
                Err(e) => {
                    let mut v = out.borrow_mut();
                    v.history.push((g, next, Some(e.to_string())));
                    v.cut += 1;
                    break;
                }
            }
        }
    }
    {
        let mut v = out.borrow_mut();
        v.sessions = client.sessions();
        v.last_error = client.last_error().map(|e| e.to_string());
    }
    client.close().await;
}

/// One run: the publisher writes [`GROUPS`] groups at [`FPS`] once all
/// viewers subscribed, then ends the track; the viewers read until its end.
///
/// Each run publishes its own broadcast path (`path`): a relay that has not
/// yet seen an earlier run's publisher go (its close lost on the link)
/// keeps that session as the path's source, and the new publisher waits as
/// a spare until the old session times out (skiff-relay's routing rule,
/// docs/protocol.md §4.4), which would starve the run of its subscribers.
fn run_once(row: &Row, path: &str, epoch: Instant, verbose: bool) -> RunResult {
    let url = row.url.clone();
    let path = path.to_owned();
    let config = row.config.clone();
    let truncates = row.truncates;
    driver::block_on(DriverKind::Legacy, move |_| async move {
        let mut result = RunResult::default();
        let deadline = Instant::now() + RUN_SLACK + Duration::from_secs(GROUPS * PER_GROUP / FPS);
        let (publisher, runner) = connect(&url, config.clone()).expect("publisher URL");
        monoio::spawn(runner.run());
        let broadcast = publisher.publish(&path).expect("broadcast");
        let mut track = broadcast
            .create_track(Info::new("video").unwrap())
            .expect("track");
        let subscribed = Rc::new(Cell::new(0));
        let viewers: Vec<Rc<RefCell<Viewer>>> = (0..VIEWERS).map(|_| Rc::default()).collect();
        let mut tasks = Vec::new();
        for v in &viewers {
            tasks.push(monoio::spawn(view(
                url.clone(),
                path.clone(),
                config.clone(),
                truncates,
                epoch,
                subscribed.clone(),
                v.clone(),
            )));
        }
        while subscribed.get() < VIEWERS || track.subscribers() == 0 {
            if Instant::now() > deadline {
                result.errors.push(format!(
                    "only {} of {VIEWERS} viewers subscribed",
                    subscribed.get()
                ));
                publisher.close().await;
                return result;
            }
            monoio::time::sleep(Duration::from_millis(5)).await;
        }
        let start = Instant::now();
        let gap = Duration::from_micros(1_000_000 / FPS);
        let mut n = 0u32;
        for g in 0..GROUPS {
            let mut group = track.create_group(g).expect("group");
            for i in 0..PER_GROUP {
                let due = start + gap * n;
                let now = Instant::now();
                if due > now {
                    monoio::time::sleep(due - now).await;
                }
                result.publisher_late = now.saturating_duration_since(due).as_micros() as u64;
                let ts = epoch.elapsed().as_micros() as u64;
                group.write_frame(ts, &payload(g, i)).await.expect("write");
                n += 1;
            }
            group.finish().expect("finish group");
        }
        track.finish();
        for task in tasks {
            let left = deadline.saturating_duration_since(Instant::now());
            if monoio::time::timeout(left, task).await.is_err() {
                result
                    .errors
                    .push("a viewer did not see the track end in time".to_owned());
            }
        }
        result.reconnections = publisher.sessions().saturating_sub(1);
        if result.reconnections > 0
            && let Some(e) = publisher.last_error()
        {
            result.reasons.push(format!("publisher: {e}"));
        }
        publisher.close().await;
        for (k, v) in viewers.iter().enumerate() {
            let v = v.borrow();
            if !v.ended && result.errors.is_empty() {
                result
                    .errors
                    .push(format!("viewer {k}: the track did not end"));
            }
            result
                .errors
                .extend(v.errors.iter().map(|e| format!("viewer {k}: {e}")));
            if verbose && v.cut > 0 {
                println!("    viewer {k}: {:?}", v.history);
            }
            result.latencies.extend_from_slice(&v.latencies);
            result.groups_lost += GROUPS - v.complete;
            result.cut += v.cut;
            result.truncated += v.truncated;
            result.resent += v.resent;
            result.reconnections += v.sessions.saturating_sub(1);
            if v.sessions > 1
                && let Some(e) = &v.last_error
                && !result.reasons.contains(e)
            {
                result.reasons.push(e.clone());
            }
            result.frames += v.latencies.len() as u64;
        }
        result
    })
    .expect("client runtime")
}

// ---------------------------------------------------------------------------
// The link, the rows, the runs and the report
// ---------------------------------------------------------------------------

/// An impaired link between the two namespaces, with the conditions a test
/// measures on it.
pub trait Link: Sync {
    /// How the link is made, for the report's first line.
    fn describe(&self) -> String;
    /// The conditions, in the order they are measured, as the report names
    /// them.
    fn conditions(&self) -> Vec<String>;
    /// Puts condition `k` on the link and starts its counters anew.
    fn set_condition(&self, k: usize) -> Result<(), String>;
    /// Packets seen and dropped on the link since the condition was set.
    fn counters(&self) -> (u64, u64);
}

/// What a test's environment asks (see the module's documentation).
pub struct Settings {
    /// The test's name in messages.
    pub test: &'static str,
    /// Runs per row at each condition.
    pub runs: usize,
    /// Time after which no further run starts at one condition.
    pub budget: Duration,
    /// Print each cut group's viewer history.
    pub verbose: bool,
    /// The clients' and relays' debug logs.
    pub trace: bool,
    /// Only the rows whose name contains this.
    pub rows: Option<String>,
}

impl Settings {
    /// Reads `PREFIX_RUNS`, `PREFIX_BUDGET_SECS`, `PREFIX_VERBOSE`,
    /// `PREFIX_TRACE` and `PREFIX_ROWS`, with these defaults.
    pub fn from_env(test: &'static str, prefix: &str, runs: usize, budget: Duration) -> Settings {
        let var = |name: &str| std::env::var(format!("{prefix}_{name}")).ok();
        Settings {
            test,
            runs: var("RUNS")
                .and_then(|v| v.parse().ok())
                .unwrap_or(runs)
                .max(1),
            budget: var("BUDGET_SECS")
                .and_then(|v| v.parse().ok())
                .map_or(budget, Duration::from_secs),
            verbose: var("VERBOSE").is_some(),
            trace: var("TRACE").is_some(),
            rows: var("ROWS"),
        }
    }
}

/// One relay and transport: its URL and client configuration.
struct Row {
    name: &'static str,
    url: String,
    config: Config,
    /// The relay may end a group cleanly short of its frames. moq-relay
    /// 0.17.10 does over QUIC on a delayed lossy link: a viewer's copy of a
    /// group that expires (a newer group exists; max age 0) while the
    /// viewer has read every frame the relay holds so far is ended with a
    /// FIN, as if complete, though its last frame is still being
    /// retransmitted from the publisher. Such groups are counted and
    /// printed for its rows; for skiff-relay's rows they fail the test.
    truncates: bool,
}

/// The figures of one row at one condition, one entry per run.
#[derive(Default)]
struct Figures {
    p50: Vec<f64>,
    p99: Vec<f64>,
    on_time: Vec<f64>,
    groups_lost: Vec<u64>,
    reconnections: Vec<u64>,
    link: Vec<(u64, u64)>,
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let k = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[k] as f64 / 1000.0
}

/// `median (min–max)` of `v`.
fn spread(v: &[f64], digits: usize) -> String {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => "-".to_owned(),
        1 => format!("{:.digits$}", s[0]),
        n => format!(
            "{:.digits$} ({:.digits$}–{:.digits$})",
            s[n / 2],
            s[0],
            s[n - 1]
        ),
    }
}

/// The core's `log` records on stderr, with the time since the first.
struct StderrLog;

impl log::Log for StderrLog {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        let t = START.get_or_init(Instant::now).elapsed();
        eprintln!(
            "{:>10.3} {} {}: {}",
            t.as_secs_f64(),
            record.level(),
            record.target(),
            record.args()
        );
    }

    fn flush(&self) {}
}

/// Starts skiff-relay, and moq-relay when it is installed, in the relay's
/// namespace on `relay_ip`.
fn start_relays(ns: &Namespaces, relay_ip: IpAddr, trace: bool) -> Vec<RelayChild> {
    let log_level = if trace { "debug" } else { "warn" };
    let mut relays = vec![RelayChild::spawn(
        &ns.relay,
        crate::peers::relay_binary(),
        &[
            "serve",
            "--listen",
            &SocketAddr::new(relay_ip, SKIFF_PORT).to_string(),
            "--threads",
            "1",
            "--tls-generate",
            &relay_ip.to_string(),
            "--log",
            log_level,
        ],
        "skiff-relay",
        trace,
    )];
    match skiff_testkit::relay_process::moq_relay_binary() {
        Some(bin) => relays.push(RelayChild::spawn(
            &ns.relay,
            &bin,
            &[
                "--listen",
                &SocketAddr::new(relay_ip, MOQ_QUIC_PORT).to_string(),
                "--listen-tls-generate",
                "localhost",
                "--listen-tcp-bind",
                &SocketAddr::new(relay_ip, MOQ_TCP_PORT).to_string(),
                "--web-http-listen",
                &SocketAddr::new(relay_ip, MOQ_WEB_PORT).to_string(),
                "--auth-public",
                "**",
                "--log-level",
                log_level,
            ],
            "moq-relay",
            trace,
        )),
        None => println!(
            "SKIPPED moq-relay rows: no moq-relay (bash .ci/moq-relay, or set MOQ_RELAY=/path/to/moq-relay)"
        ),
    }
    relays
}

/// A relay's two rows: TCP at `tcp`, and QUIC at `quic` pinned to `pin`;
/// `truncates` as in [`Row`].
fn pair(
    names: [&'static str; 2],
    tcp: String,
    quic: String,
    pin: Fingerprint,
    truncates: bool,
) -> [Row; 2] {
    let mut pinned = Config::default();
    pinned.tls_fingerprint = Some(pin);
    [
        Row {
            name: names[0],
            url: tcp,
            config: Config::default(),
            truncates,
        },
        Row {
            name: names[1],
            url: quic,
            config: pinned,
            truncates,
        },
    ]
}

/// The rows the relays serve, from the clients' namespace (the QUIC rows
/// pin each relay's certificate, read over HTTP).
fn rows(relays: &mut [RelayChild], relay_ip: IpAddr, only: Option<&str>) -> Vec<Row> {
    let ip = |port: u16| SocketAddr::new(relay_ip, port);
    let mut rows = Vec::new();
    rows.extend(pair(
        ["skiff-relay TCP", "skiff-relay QUIC"],
        format!("tcp://{}/", ip(SKIFF_PORT)),
        format!("moql://{}/", ip(SKIFF_PORT)),
        fingerprint(ip(SKIFF_PORT), &mut relays[0]),
        false,
    ));
    if relays.len() > 1 {
        rows.extend(pair(
            ["moq-relay TCP", "moq-relay QUIC"],
            format!("tcp://{}/anon", ip(MOQ_TCP_PORT)),
            format!("moql://{}/anon", ip(MOQ_QUIC_PORT)),
            fingerprint(ip(MOQ_WEB_PORT), &mut relays[1]),
            true,
        ));
    }
    if let Some(only) = only {
        rows.retain(|r| r.name.contains(only));
    }
    rows
}

/// What the client thread brings back: the rows' names, each condition's
/// label and figures, and the failures.
type Outcome = (Vec<&'static str>, Vec<(String, Vec<Figures>)>, Vec<String>);

/// Every row at every condition of `link`, [`Settings::runs`] times each;
/// prints each run and then the table, and fails if any frame arrived
/// damaged or any viewer missed the track's end.
pub fn measure(ns: &Namespaces, relay_ip: IpAddr, link: &dyn Link, settings: &Settings) {
    if settings.trace {
        let _ = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_writer(std::io::stderr)
            .try_init();
        if log::set_logger(&StderrLog).is_ok() {
            log::set_max_level(log::LevelFilter::Debug);
        }
    }
    println!("link: {}", link.describe());
    let mut relays = start_relays(ns, relay_ip, settings.trace);
    let epoch = Instant::now();
    let outcome: std::thread::Result<Outcome> = std::thread::scope(|scope| {
        scope
            .spawn(|| {
                Namespaces::enter(&ns.client).expect("the clients' namespace");
                let rows = rows(&mut relays, relay_ip, settings.rows.as_deref());
                let mut failures = Vec::new();
                let mut table = Vec::new();
                let mut run = 0u32;
                for (k, label) in link.conditions().into_iter().enumerate() {
                    link.set_condition(k).expect("link condition");
                    let mut figures: Vec<Figures> =
                        rows.iter().map(|_| Figures::default()).collect();
                    let began = Instant::now();
                    'runs: for _ in 0..settings.runs {
                        for (row, fig) in rows.iter().zip(figures.iter_mut()) {
                            if began.elapsed() > settings.budget {
                                break 'runs;
                            }
                            let before = link.counters();
                            run += 1;
                            let path = format!("{}-{run}", settings.test);
                            let mut r = run_once(row, &path, epoch, settings.verbose);
                            let after = link.counters();
                            r.latencies.sort_unstable();
                            let on_time = r
                                .latencies
                                .iter()
                                .filter(|&&l| l <= ON_TIME.as_micros() as u64)
                                .count();
                            fig.p50.push(percentile(&r.latencies, 0.50));
                            fig.p99.push(percentile(&r.latencies, 0.99));
                            fig.on_time
                                .push(100.0 * on_time as f64 / r.frames.max(1) as f64);
                            fig.groups_lost.push(r.groups_lost);
                            fig.reconnections.push(r.reconnections);
                            fig.link.push((after.0 - before.0, after.1 - before.1));
                            println!(
                                "  {label} {}: {} frames, p50 {:.2} ms, p99 {:.2} ms, {on_time} on time, \
                                 {} groups skipped or cut ({} cut, {} served again), {} reconnections, \
                                 publisher {:.1} ms behind at the end, link {} of {} packets dropped",
                                row.name,
                                r.frames,
                                percentile(&r.latencies, 0.50),
                                percentile(&r.latencies, 0.99),
                                r.groups_lost,
                                r.cut,
                                r.resent,
                                r.reconnections,
                                r.publisher_late as f64 / 1000.0,
                                after.1 - before.1,
                                after.0 - before.0,
                            );
                            if r.truncated > 0 {
                                println!(
                                    "    {} groups ended cleanly short of their frames (allowed for this relay)",
                                    r.truncated
                                );
                            }
                            if !r.reasons.is_empty() {
                                println!("    sessions ended: {}", r.reasons.join("; "));
                            }
                            for e in r.errors.iter().take(5) {
                                failures.push(format!("{label} {}: {e}", row.name));
                            }
                        }
                    }
                    table.push((label, figures));
                }
                (rows.iter().map(|r| r.name).collect::<Vec<_>>(), table, failures)
            })
            .join()
    });
    drop(relays);
    let (names, table, failures) = match outcome {
        Ok(o) => o,
        Err(panic) => std::panic::resume_unwind(panic),
    };

    println!(
        "\n{VIEWERS} viewers, {} KiB x {FPS} fps, {GROUPS} groups of {PER_GROUP} frames, Request::LIVE; \
         median (min–max) over the runs; groups skipped summed over the viewers",
        FRAME_BYTES / 1024
    );
    println!(
        "| link | relay, transport | runs | p50 ms | p99 ms | frames within 500 ms, % | groups skipped | reconnections | packets dropped / seen |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for (label, figures) in &table {
        for (name, f) in names.iter().zip(figures) {
            let lost: Vec<f64> = f.groups_lost.iter().map(|&g| g as f64).collect();
            let again: Vec<f64> = f.reconnections.iter().map(|&g| g as f64).collect();
            let link: Vec<String> = f.link.iter().map(|(s, d)| format!("{d}/{s}")).collect();
            println!(
                "| {label} | {name} | {} | {} | {} | {} | {} | {} | {} |",
                f.p50.len(),
                spread(&f.p50, 2),
                spread(&f.p99, 2),
                spread(&f.on_time, 1),
                spread(&lost, 0),
                spread(&again, 0),
                link.join(", ")
            );
        }
        if figures.iter().any(|f| f.p50.len() < settings.runs) {
            println!(
                "(at {label}: runs that had not started within {:?} were left out; {} per row asked)",
                settings.budget, settings.runs
            );
        }
    }
    assert!(
        failures.is_empty(),
        "frames damaged or missing:\n{}",
        failures.join("\n")
    );
}
