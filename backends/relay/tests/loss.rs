//! Packet loss on a real link (issue 34, "Loss and delay"): one publisher and
//! ten viewers of skiff's SDK reach a relay over a veth pair between two
//! network namespaces this test makes, while nftables drops 1 %, then 3 %,
//! of the packets crossing it at random, in both directions.
//!
//! - The relay runs in one namespace (`ip netns exec`); the clients run on a
//!   thread that joined the other (`setns`), so both clients share one clock
//!   and a frame's timestamp (microseconds since the test began) gives its
//!   latency on arrival.
//! - Every row is a relay and a transport: skiff-relay over TCP (`tcp://`)
//!   and QUIC (`moql://`, pinned to its `--tls-generate` certificate), and
//!   the published moq-relay the same way when it is installed.
//! - The drop rule sits in each namespace's prerouting chain, on the packets
//!   arriving from the veth: there every packet is one wire packet (the
//!   veth's offloads are off), whereas an output hook sees a UDP GSO batch
//!   as one packet and would drop many datagrams at once.
//! - Asserted (deterministic): every frame of every group a viewer reads
//!   arrives intact and in order, a group that ends cleanly holds all its
//!   frames, no group arrives twice, and every viewer sees the track end.
//!   Groups cut or skipped by the live-edge rule (`Request::LIVE`) are
//!   counted and printed, with p50/p99 frame latency and frames within
//!   500 ms, as medians and spread over the runs.
//!
//! Bounded to about 100 s of runs: `LOSS_RUNS` (default 3; the issue asks
//! five for its medians) sets the runs per row, and runs that do not start
//! within 45 s per loss rate (`LOSS_BUDGET_SECS`) are left out, as the
//! report says. `LOSS_VERBOSE` prints each cut group's viewer history,
//! `LOSS_TRACE` the clients' debug log (and keeps the relays' debug logs), and `LOSS_ROWS=TEXT` keeps only the
//! rows whose name contains TEXT.
//! Without root, `ip` or `nft` the test prints why it skips.

mod common;
mod peers;

use std::cell::{Cell, RefCell};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
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
const VIEWERS: usize = 10;
/// Bytes per frame.
const FRAME_BYTES: usize = 16 * 1024;
/// Frames per second the publisher writes.
const FPS: u64 = 30;
/// Frames per group (half a second).
const PER_GROUP: u64 = 15;
/// Groups per run (three seconds of media).
const GROUPS: u64 = 6;
/// A frame is on time if it arrives within this of its timestamp.
const ON_TIME: Duration = Duration::from_millis(500);
/// Bound on the runs at one loss rate (`LOSS_BUDGET_SECS` sets another);
/// runs not started by then are not run, and the report says so.
const BUDGET_PER_RATE: Duration = Duration::from_secs(45);
/// Bound on one run past its media (connecting, then draining).
const RUN_SLACK: Duration = Duration::from_secs(15);
/// Loss rates, in packets per thousand.
const RATES: [u32; 2] = [10, 30];

/// The relay's and the clients' addresses on the veth pair.
const RELAY_IP: &str = "10.77.0.1";
const CLIENT_IP: &str = "10.77.0.2";
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
// The link: two namespaces, a veth pair, the drop rules
// ---------------------------------------------------------------------------

/// Runs a command; its stderr on failure.
fn run(program: &str, args: &[&str]) -> Result<(), String> {
    run_input(program, args, None).map(|_| ())
}

/// Runs a command with `input` on its stdin; its stdout on success.
fn run_input(program: &str, args: &[&str], input: Option<&str>) -> Result<String, String> {
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
fn has(program: &str) -> bool {
    Command::new(program)
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

/// Two namespaces named after this process, joined by a veth pair; both are
/// deleted on drop (which removes the pair and the rules with them).
struct Link {
    relay_ns: String,
    client_ns: String,
    relay_if: String,
    client_if: String,
}

impl Link {
    fn create() -> Result<Link, String> {
        let pid = std::process::id();
        let link = Link {
            relay_ns: format!("skiff-loss-{pid}-r"),
            client_ns: format!("skiff-loss-{pid}-c"),
            relay_if: format!("slr{pid}"),
            client_if: format!("slc{pid}"),
        };
        let (r, c) = (link.relay_ns.as_str(), link.client_ns.as_str());
        run("ip", &["netns", "add", r])?;
        run("ip", &["netns", "add", c])?;
        // Made inside the relay's namespace with its peer placed in the
        // client's: the host's interfaces are never touched.
        run(
            "ip",
            &[
                "-n",
                r,
                "link",
                "add",
                &link.relay_if,
                "type",
                "veth",
                "peer",
                "name",
                &link.client_if,
                "netns",
                c,
            ],
        )?;
        for (ns, dev, ip) in [
            (r, &link.relay_if, RELAY_IP),
            (c, &link.client_if, CLIENT_IP),
        ] {
            run(
                "ip",
                &["-n", ns, "addr", "add", &format!("{ip}/24"), "dev", dev],
            )?;
            run("ip", &["-n", ns, "link", "set", "lo", "up"])?;
            run("ip", &["-n", ns, "link", "set", dev, "up"])?;
        }
        Ok(link)
    }

    /// Turns the veth's segmentation and receive offloads off, so every
    /// packet the drop rule sees is one on the wire; says what it did.
    fn offloads_off(&self) -> String {
        if !has("ethtool") {
            return "ethtool absent: veth offloads left as they are".to_owned();
        }
        let mut off = Vec::new();
        let mut kept = Vec::new();
        for (ns, dev) in [
            (&self.relay_ns, &self.relay_if),
            (&self.client_ns, &self.client_if),
        ] {
            for feature in ["tso", "gso", "gro", "tx-udp-segmentation"] {
                let args = ["netns", "exec", ns, "ethtool", "-K", dev, feature, "off"];
                match run("ip", &args) {
                    Ok(()) => off.push(feature),
                    Err(_) => kept.push(feature),
                }
            }
        }
        off.sort_unstable();
        off.dedup();
        kept.sort_unstable();
        kept.dedup();
        format!("veth offloads off: {off:?}; not changeable: {kept:?}")
    }

    /// Drops `per_mille` of the packets arriving from the veth in each
    /// namespace (so in both directions), counting what it sees; replaces
    /// any earlier rule and its counters.
    fn set_loss(&self, per_mille: u32) -> Result<(), String> {
        for (ns, dev) in [
            (&self.relay_ns, &self.relay_if),
            (&self.client_ns, &self.client_if),
        ] {
            let rules = format!(
                "table inet skiff_loss\n\
                 delete table inet skiff_loss\n\
                 table inet skiff_loss {{\n\
                   chain pre {{\n\
                     type filter hook prerouting priority -300; policy accept;\n\
                     iifname \"{dev}\" counter\n\
                     iifname \"{dev}\" numgen random mod 1000 < {per_mille} counter drop\n\
                   }}\n\
                 }}\n"
            );
            run_input("ip", &["netns", "exec", ns, "nft", "-f", "-"], Some(&rules))?;
        }
        Ok(())
    }

    /// Packets seen and dropped by the rules since [`Link::set_loss`].
    fn counters(&self) -> (u64, u64) {
        let mut total = (0, 0);
        for ns in [&self.relay_ns, &self.client_ns] {
            let args = [
                "netns",
                "exec",
                ns,
                "nft",
                "list",
                "chain",
                "inet",
                "skiff_loss",
                "pre",
            ];
            let Ok(text) = run_input("ip", &args, None) else {
                continue;
            };
            let counts: Vec<u64> = text
                .split_whitespace()
                .collect::<Vec<_>>()
                .windows(2)
                .filter(|w| w[0] == "packets")
                .filter_map(|w| w[1].parse().ok())
                .collect();
            if let [seen, dropped, ..] = counts[..] {
                total.0 += seen;
                total.1 += dropped;
            }
        }
        total
    }

    /// Joins this thread to the clients' namespace (sockets it opens after
    /// live there).
    fn enter_client_ns(&self) {
        let path = format!("/run/netns/{}", self.client_ns);
        let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        // SAFETY: setns on a descriptor this thread owns; it changes only the
        // calling thread's network namespace.
        let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        for ns in [&self.relay_ns, &self.client_ns] {
            let _ = run("ip", &["netns", "del", ns]);
        }
    }
}

/// A relay process in the relay's namespace, killed on drop; its output
/// goes to a log file, printed if the test fails.
struct RelayChild {
    child: Child,
    log: PathBuf,
}

impl RelayChild {
    fn spawn(ns: &str, binary: &Path, args: &[&str], name: &str) -> RelayChild {
        let log =
            std::env::temp_dir().join(format!("skiff-loss-{}-{name}.log", std::process::id()));
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
        RelayChild { child, log }
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
        if std::env::var_os("LOSS_TRACE").is_some() {
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
    /// Whether the track's end arrived.
    ended: bool,
    /// Groups that arrived again after their first copy was cut (the
    /// relay served them anew, e.g. after a reconnection).
    resent: u64,
    /// Sessions the viewer set up (1 without reconnections).
    sessions: u64,
    /// Why its last session ended, if one did.
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
    resent: u64,
    /// Sessions set up beyond one per client (reconnections).
    reconnections: u64,
    /// Why the sessions that ended early did (each reason once).
    reasons: Vec<String>,
    frames: u64,
    errors: Vec<String>,
}

/// A viewer: subscribes at the live edge, then reads and checks every frame
/// until the track ends.
async fn view(
    url: String,
    config: Config,
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
    let mut track = match client.subscribe("loss", "video", Request::LIVE).await {
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
fn run_once(url: &str, config: &Config, epoch: Instant) -> RunResult {
    let url = url.to_owned();
    let config = config.clone();
    driver::block_on(DriverKind::Legacy, move |_| async move {
        let mut result = RunResult::default();
        let deadline = Instant::now() + RUN_SLACK + Duration::from_secs(GROUPS * PER_GROUP / FPS);
        let (publisher, runner) = connect(&url, config.clone()).expect("publisher URL");
        monoio::spawn(runner.run());
        let broadcast = publisher.publish("loss").expect("broadcast");
        let mut track = broadcast
            .create_track(Info::new("video").unwrap())
            .expect("track");
        let subscribed = Rc::new(Cell::new(0));
        let viewers: Vec<Rc<RefCell<Viewer>>> = (0..VIEWERS).map(|_| Rc::default()).collect();
        let mut tasks = Vec::new();
        for v in &viewers {
            tasks.push(monoio::spawn(view(
                url.clone(),
                config.clone(),
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
            if std::env::var_os("LOSS_VERBOSE").is_some() && v.cut > 0 {
                println!("    viewer {k}: {:?}", v.history);
            }
            result.latencies.extend_from_slice(&v.latencies);
            result.groups_lost += GROUPS - v.complete;
            result.cut += v.cut;
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
// Rows and the report
// ---------------------------------------------------------------------------

/// One relay and transport: its URL and client configuration.
struct Row {
    name: &'static str,
    url: String,
    config: Config,
}

/// The figures of one row at one loss rate, one entry per run.
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

fn skip(reason: &str) {
    println!("SKIPPED loss test: {reason}");
}

#[test]
fn frames_survive_random_loss_through_each_relay() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return skip("not root (namespaces, veth and nftables need it)");
    }
    for tool in ["ip", "nft"] {
        if !has(tool) {
            return skip(&format!(
                "`{tool}` is not installed (apt-get install iproute2 nftables)"
            ));
        }
    }
    if std::env::var_os("LOSS_TRACE").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_writer(std::io::stderr)
            .try_init();
        if log::set_logger(&StderrLog).is_ok() {
            log::set_max_level(log::LevelFilter::Debug);
        }
    }
    let runs: usize = std::env::var("LOSS_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
        .max(1);
    let budget = std::env::var("LOSS_BUDGET_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(BUDGET_PER_RATE, Duration::from_secs);
    let link = match Link::create() {
        Ok(l) => l,
        Err(e) => return skip(&format!("could not make the namespaces: {e}")),
    };
    println!(
        "link: veth {RELAY_IP} ({}) <-> {CLIENT_IP} ({}); {}",
        link.relay_ns,
        link.client_ns,
        link.offloads_off()
    );

    // The relays' log level: their debug log with LOSS_TRACE.
    let log_level = if std::env::var_os("LOSS_TRACE").is_some() {
        "debug"
    } else {
        "warn"
    };
    let mut relays = Vec::new();
    relays.push(RelayChild::spawn(
        &link.relay_ns,
        peers::relay_binary(),
        &[
            "serve",
            "--listen",
            &format!("{RELAY_IP}:{SKIFF_PORT}"),
            "--threads",
            "1",
            "--tls-generate",
            RELAY_IP,
            "--log",
            log_level,
        ],
        "skiff-relay",
    ));
    let moq_relay = skiff_testkit::relay_process::moq_relay_binary();
    match &moq_relay {
        Some(bin) => relays.push(RelayChild::spawn(
            &link.relay_ns,
            bin,
            &[
                "--listen",
                &format!("{RELAY_IP}:{MOQ_QUIC_PORT}"),
                "--listen-tls-generate",
                "localhost",
                "--listen-tcp-bind",
                &format!("{RELAY_IP}:{MOQ_TCP_PORT}"),
                "--web-http-listen",
                &format!("{RELAY_IP}:{MOQ_WEB_PORT}"),
                "--auth-public",
                "**",
                "--log-level",
                log_level,
            ],
            "moq-relay",
        )),
        None => println!(
            "SKIPPED moq-relay rows: no moq-relay (bash .ci/moq-relay, or set MOQ_RELAY=/path/to/moq-relay)"
        ),
    }

    let epoch = Instant::now();
    let outcome = std::thread::scope(|scope| {
        scope
            .spawn(|| {
                link.enter_client_ns();
                let ip = |port: u16| SocketAddr::new(RELAY_IP.parse().unwrap(), port);
                let mut rows = Vec::new();
                let skiff_pin = fingerprint(ip(SKIFF_PORT), &mut relays[0]);
                rows.push(Row {
                    name: "skiff-relay TCP",
                    url: format!("tcp://{}/", ip(SKIFF_PORT)),
                    config: Config::default(),
                });
                let mut pinned = Config::default();
                pinned.tls_fingerprint = Some(skiff_pin);
                rows.push(Row {
                    name: "skiff-relay QUIC",
                    url: format!("moql://{}/", ip(SKIFF_PORT)),
                    config: pinned,
                });
                if relays.len() > 1 {
                    let moq_pin = fingerprint(ip(MOQ_WEB_PORT), &mut relays[1]);
                    rows.push(Row {
                        name: "moq-relay TCP",
                        url: format!("tcp://{}/anon", ip(MOQ_TCP_PORT)),
                        config: Config::default(),
                    });
                    let mut pinned = Config::default();
                    pinned.tls_fingerprint = Some(moq_pin);
                    rows.push(Row {
                        name: "moq-relay QUIC",
                        url: format!("moql://{}/anon", ip(MOQ_QUIC_PORT)),
                        config: pinned,
                    });
                }
                if let Ok(only) = std::env::var("LOSS_ROWS") {
                    rows.retain(|r| r.name.contains(only.as_str()));
                }
                let mut failures = Vec::new();
                let mut table = Vec::new();
                for rate in RATES {
                    link.set_loss(rate).expect("nft rule");
                    let mut figures: Vec<Figures> = rows.iter().map(|_| Figures::default()).collect();
                    let began = Instant::now();
                    'runs: for _ in 0..runs {
                        for (row, fig) in rows.iter().zip(figures.iter_mut()) {
                            if began.elapsed() > budget {
                                break 'runs;
                            }
                            let before = link.counters();
                            let mut r = run_once(&row.url, &row.config, epoch);
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
                                "  {:.1} % {}: {} frames, p50 {:.2} ms, p99 {:.2} ms, {on_time} on time, \
                                 {} groups skipped or cut ({} cut, {} served again), {} reconnections, \
                                 link {} of {} packets dropped",
                                rate as f64 / 10.0,
                                row.name,
                                r.frames,
                                percentile(&r.latencies, 0.50),
                                percentile(&r.latencies, 0.99),
                                r.groups_lost,
                                r.cut,
                                r.resent,
                                r.reconnections,
                                after.1 - before.1,
                                after.0 - before.0,
                            );
                            if !r.reasons.is_empty() {
                                println!("    sessions ended: {}", r.reasons.join("; "));
                            }
                            for e in r.errors.iter().take(5) {
                                failures.push(format!("{:.1} % {}: {e}", rate as f64 / 10.0, row.name));
                            }
                        }
                    }
                    table.push((rate, figures));
                }
                (rows.iter().map(|r| r.name).collect::<Vec<_>>(), table, failures)
            })
            .join()
    });
    drop(relays);
    drop(link);
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
        "| loss | relay, transport | runs | p50 ms | p99 ms | frames within 500 ms, % | groups skipped | reconnections | packets dropped / seen |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for (rate, figures) in &table {
        for (name, f) in names.iter().zip(figures) {
            let lost: Vec<f64> = f.groups_lost.iter().map(|&g| g as f64).collect();
            let again: Vec<f64> = f.reconnections.iter().map(|&g| g as f64).collect();
            let link: Vec<String> = f.link.iter().map(|(s, d)| format!("{d}/{s}")).collect();
            println!(
                "| {:.1} % | {name} | {} | {} | {} | {} | {} | {} | {} |",
                *rate as f64 / 10.0,
                f.p50.len(),
                spread(&f.p50, 2),
                spread(&f.p99, 2),
                spread(&f.on_time, 1),
                spread(&lost, 0),
                spread(&again, 0),
                link.join(", ")
            );
        }
        if figures.iter().any(|f| f.p50.len() < runs) {
            println!(
                "(at {:.1} %: runs that had not started within {budget:?} were left out; {runs} per row asked)",
                *rate as f64 / 10.0
            );
        }
    }
    assert!(
        failures.is_empty(),
        "frames damaged or missing:\n{}",
        failures.join("\n")
    );
}
