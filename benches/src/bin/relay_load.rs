//! `relay_load`: fan-out load on `skiff-relay` over loopback, side by side
//! with the `copy_relay` baseline on the same workload.
//!
//! For each subscriber count N it starts `skiff-relay serve` as a child
//! process (`--threads`, default 1) on `127.0.0.1:0`, connects one moq-lite
//! publisher and N moq-lite subscribers (the `skiff-monoio` client, over real
//! TCP), publishes fixed-size frames (30 per group) at `--fps`, and measures
//! over `--seconds` after the subscribers are live and a warm-up:
//!
//! - delivered MB/s: frame payload bytes read by all subscribers together
//!   (each frame's length checked and its content spot-checked);
//! - the relay's CPU seconds (utime + stime of `/proc/PID/stat`) per
//!   delivered GB;
//! - the relay's RSS (`VmRSS`) at the end minus at start, divided by N;
//! - publish-to-read latency p50 and p99 (each payload carries its send
//!   time; a fixed-size histogram, `skiff_relay::relay_demo::LatencyHistogram`).
//!
//! Then it runs `copy_relay bench` (a plain blocking one-to-many byte copier,
//! one thread) for the same N, frame size, rate and duration and prints both
//! with the ratio of CPU per delivered GB. Only the relays' CPU is counted;
//! the load generator runs in other threads of this process.
//!
//! With `--transport quic` every client (the publisher and each subscriber)
//! dials `moql://` instead, from a UDP socket and QUIC endpoint of its own,
//! pinning the certificate the relay (started with `--tls-generate
//! localhost`) answers at `GET /certificate.sha256`; the copy_relay
//! baseline, TCP only, is skipped. `--progress` prints, while the
//! subscribers connect, how many are live with the relay's RSS and CPU.
//!
//! ```text
//! relay_load --subscribers 1,10,100 --frame-bytes 65536 --fps 100 --seconds 4
//! relay_load --transport quic --subscribers 10000 --frame-bytes 2048 --fps 5 --no-baseline
//! ```

use std::future::poll_fn;
use std::io::{self, BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::Poll;
use std::time::{Duration, Instant};

use clap::Parser;
use skiff_monoio::driver::{self, DriverKind};
use skiff_relay::relay_demo::{LATENCY_BUCKETS, LatencyHistogram};
use skiff_testkit::client::{
    self, ClientCtx, ClientLimits, FrameReader, Publisher, ReadState, Subscriber,
};
use skiff_testkit::every::Every;

/// Frames per group, like a 30-frame GOP.
const FRAMES_PER_GROUP: u64 = 30;
/// Broadcast path and track name of the load.
const BROADCAST: &str = "bench";
/// Track name of the load.
const TRACK: &str = "video";
/// Groups a subscriber's local track keeps besides the one being written.
const BUDGET_GROUPS: u64 = 2;
/// Handshakes one client thread keeps in flight while its subscribers
/// connect over TCP (`--connect-parallel` unset).
const CONNECTING: usize = 256;
/// The same over QUIC: the relay's per-address handshake quota (256 per
/// worker by default) stays above the handshakes of two client threads.
const CONNECTING_QUIC: usize = 32;

/// The clients' transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Link {
    /// moq-lite over QMux over TCP (`tcp://`).
    Tcp,
    /// moq-lite-05 over QUIC (`moql://`), the relay's certificate pinned.
    Quic,
}

#[derive(Debug, Parser)]
#[command(about = "Fan-out load on skiff-relay, side by side with the copy_relay baseline.")]
struct Cli {
    /// Subscriber counts, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,10,100")]
    subscribers: Vec<usize>,
    /// Bytes per frame.
    #[arg(long, default_value_t = 65536)]
    frame_bytes: usize,
    /// Frames per second published (0: as fast as the publisher's runtime goes).
    #[arg(long, default_value_t = 100)]
    fps: u32,
    /// Measured seconds per row (after the subscribers are live and a 1 s warm-up).
    #[arg(long, default_value_t = 4.0)]
    seconds: f64,
    /// Worker threads of skiff-relay.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Client threads the subscribers are spread over.
    #[arg(long, default_value_t = 2)]
    client_threads: usize,
    /// The skiff-relay binary [default: next to this one].
    #[arg(long)]
    relay_bin: Option<PathBuf>,
    /// The copy_relay binary [default: next to this one].
    #[arg(long)]
    copy_bin: Option<PathBuf>,
    /// Skip the copy_relay baseline.
    #[arg(long)]
    no_baseline: bool,
    /// Broadcasts published at once (one track each, every one at `--fps`);
    /// subscriber k takes broadcast k mod B. With more than one, the
    /// copy_relay baseline (one stream) is skipped.
    #[arg(long, default_value_t = 1)]
    broadcasts: usize,
    /// Seconds the subscribers get to go live (each has read the start of
    /// its subscription); the window is measured over those live by then.
    #[arg(long, default_value_t = 60.0)]
    live_timeout: f64,
    /// The clients' transport: `tcp` (QMux) or `quic` (`moql://`, each
    /// client on a UDP socket of its own, the relay's certificate pinned;
    /// no copy_relay baseline).
    #[arg(long, value_enum, default_value = "tcp")]
    transport: Link,
    /// Handshakes each client thread keeps in flight while its subscribers
    /// connect [default: 256 over TCP; over QUIC 32, below the relay's
    /// per-address handshake quota, since every client comes from 127.0.0.1].
    #[arg(long)]
    connect_parallel: Option<usize>,
    /// Further flags for `skiff-relay serve`, space-separated (write
    /// `--relay-args=...`), e.g. `--metrics 127.0.0.1:9464`.
    #[arg(long, allow_hyphen_values = true, default_value = "")]
    relay_args: String,
    /// While the subscribers connect, print every this many seconds how
    /// many are live, with the relay's RSS and the CPU seconds it and this
    /// process have used; 0: no such lines.
    #[arg(long, default_value_t = 0.0)]
    progress: f64,
}

fn main() {
    let cli = Cli::parse();
    if let Err(e) = run(&cli) {
        eprintln!("relay_load: error: {e}");
        std::process::exit(1);
    }
}

fn sibling(name: &str) -> io::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    Ok(exe.with_file_name(name))
}

fn run(cli: &Cli) -> io::Result<()> {
    let relay_bin = match &cli.relay_bin {
        Some(p) => p.clone(),
        None => sibling("skiff-relay")?,
    };
    let copy_bin = match &cli.copy_bin {
        Some(p) => p.clone(),
        None => sibling("copy_relay")?,
    };
    println!(
        "relay_load: {} broadcast(s), frame {} B, {} frames/group, fps {}, {} s measured, skiff-relay --threads {}, {} cores",
        cli.broadcasts,
        cli.frame_bytes,
        FRAMES_PER_GROUP,
        if cli.fps == 0 {
            "max".to_owned()
        } else {
            cli.fps.to_string()
        },
        cli.seconds,
        cli.threads,
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    println!(
        "{:<5} | {:>10} {:>9} {:>10} {:>11} {:>7} {:>7} {:>6} {:>8} | {:>10} {:>10} | {:>6}",
        "subs",
        "skiff_MB/s",
        "skiff_cpu",
        "skiff_s/GB",
        "rss/sub_KiB",
        "p50_ms",
        "p99_ms",
        "lag",
        "load_cpu",
        "copy_MB/s",
        "copy_s/GB",
        "ratio"
    );
    for &n in &cli.subscribers {
        let s = skiff_row(cli, &relay_bin, n)?;
        let c = if cli.no_baseline || cli.broadcasts > 1 || cli.transport == Link::Quic {
            None
        } else {
            Some(copy_row(cli, &copy_bin, n)?)
        };
        let secs = s.elapsed.as_secs_f64().max(1e-9);
        let s_gb = s.delivered as f64 / 1e9;
        let s_per = if s_gb > 0.0 { s.cpu / s_gb } else { f64::NAN };
        let (c_mbs, c_per) = c.unwrap_or((f64::NAN, f64::NAN));
        println!(
            "{:<5} | {:>10.1} {:>9.2} {:>10.3} {:>11.1} {:>7.2} {:>7.2} {:>6} {:>8.2} | {:>10.1} {:>10.3} | {:>6.2}",
            n,
            s.delivered as f64 / 1e6 / secs,
            s.cpu,
            s_per,
            s.rss_delta_kib as f64 / n.max(1) as f64,
            s.p50_us.map_or(f64::NAN, |us| us as f64 / 1e3),
            s.p99_us.map_or(f64::NAN, |us| us as f64 / 1e3),
            s.lagged,
            s.load_cpu,
            c_mbs,
            c_per,
            s_per / c_per
        );
        println!(
            "      {} of {} subscribers live {:.1} s after they started; relay RSS {:.1} KiB per live subscriber",
            s.live,
            n,
            s.connect.as_secs_f64(),
            s.rss_delta_kib as f64 / s.live.max(1) as f64
        );
        let expected = s.published_window * s.live;
        println!(
            "      relay RSS {:.1} MiB at the end ({:.1} MiB before the subscribers, peak VmHWM {:.1} MiB); frames read in the window {} of {} expected ({:.4}), {} lagged; {} sessions dialed again before they subscribed",
            s.rss_end_kib as f64 / 1024.0,
            s.rss_start_kib as f64 / 1024.0,
            s.hwm_kib as f64 / 1024.0,
            s.frames_window,
            expected,
            s.frames_window as f64 / expected.max(1) as f64,
            s.lagged,
            s.redials
        );
        if s.live < n as u64 || s.bad > 0 || s.delivered == 0 {
            println!(
                "      note: {} of {} subscribers live, {} bad frames, {} bytes delivered in the window",
                s.live, n, s.bad, s.delivered
            );
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Process helpers
// ---------------------------------------------------------------------------

struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn bad_data(m: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, m)
}

/// CPU seconds (user + system, all threads) of `pid` so far.
fn cpu_seconds(pid: u32) -> io::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // stat(5): utime is field 14, stime 15; `rest` starts at field 3.
    let tick = |i: usize| -> io::Result<u64> {
        fields
            .get(i)
            .and_then(|f| f.parse().ok())
            .ok_or_else(|| bad_data("unexpected /proc/PID/stat".into()))
    };
    // SAFETY: sysconf only reads a configuration value.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let hz = if hz > 0 { hz as f64 } else { 100.0 };
    Ok((tick(11)? + tick(12)?) as f64 / hz)
}

/// Resident set of `pid` in KiB (`VmRSS`).
fn rss_kib(pid: u32) -> io::Result<u64> {
    status_kib(pid, "VmRSS:")
}

/// The KiB figure of the `field` line (`VmRSS:`, `VmHWM:`) of `pid`'s status.
fn status_kib(pid: u32, field: &str) -> io::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| bad_data(format!("no {field}")))
}

// ---------------------------------------------------------------------------
// skiff-relay row
// ---------------------------------------------------------------------------

#[derive(Debug)]
struct Shared {
    /// The clock of the payloads' send times.
    epoch: Instant,
    /// Publish-to-read latency of every frame read, µs.
    latency: LatencyHistogram,
    stop: AtomicBool,
    live: AtomicU64,
    delivered: AtomicU64,
    bad: AtomicU64,
    lagged: AtomicU64,
    published: AtomicU64,
    /// Frames read by all subscribers (checked ones).
    frames: AtomicU64,
    /// Frames published, over all broadcasts.
    published_frames: AtomicU64,
    /// Subscribers' sessions dialed again after ending before they subscribed.
    redials: AtomicU64,
}

impl Shared {
    fn new() -> Shared {
        Shared {
            epoch: Instant::now(),
            latency: LatencyHistogram::default(),
            stop: AtomicBool::new(false),
            live: AtomicU64::new(0),
            delivered: AtomicU64::new(0),
            bad: AtomicU64::new(0),
            lagged: AtomicU64::new(0),
            published: AtomicU64::new(0),
            frames: AtomicU64::new(0),
            published_frames: AtomicU64::new(0),
            redials: AtomicU64::new(0),
        }
    }

    /// Microseconds since [`Shared::epoch`].
    fn now_us(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX)
    }
}

struct SkiffResult {
    delivered: u64,
    /// Latency percentiles over the measured window, µs.
    p50_us: Option<u64>,
    p99_us: Option<u64>,
    elapsed: Duration,
    cpu: f64,
    load_cpu: f64,
    rss_delta_kib: i64,
    live: u64,
    bad: u64,
    lagged: u64,
    /// From starting the subscribers until all were live (or the timeout).
    connect: Duration,
    /// Frames read by all subscribers in the window.
    frames_window: u64,
    /// Frames published per broadcast in the window (each live subscriber
    /// should read as many).
    published_window: u64,
    /// Subscribers' sessions dialed again before they subscribed.
    redials: u64,
    /// Relay RSS before the subscribers, at the end, and its peak (KiB).
    rss_start_kib: u64,
    rss_end_kib: u64,
    hwm_kib: u64,
}

fn spawn_skiff(cli: &Cli, bin: &PathBuf) -> io::Result<(ChildGuard, SocketAddr)> {
    let threads = cli.threads;
    let mut cmd = Command::new(bin);
    cmd.args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--threads",
        &threads.to_string(),
        "--log",
        "error",
        // Every subscriber comes from 127.0.0.1: lift the per-address
        // and total limits above the largest row.
        "--max-connections-per-ip",
        "100000",
        "--max-connections",
        "100000",
    ])
    .args(cli.relay_args.split_whitespace());
    if cli.transport == Link::Quic {
        cmd.args(["--tls-generate", "localhost"]);
    }
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", bin.display())))?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| io::Error::other("no stdout"))?;
    let child = ChildGuard(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| bad_data(format!("unexpected relay output `{}`", line.trim())))?;
    Ok((child, addr))
}

fn skiff_row(cli: &Cli, bin: &PathBuf, n: usize) -> io::Result<SkiffResult> {
    let (child, addr) = spawn_skiff(cli, bin)?;
    let pid = child.0.id();
    let dial = match cli.transport {
        Link::Tcp => Dial::Tcp(format!("tcp://{addr}/anon")),
        Link::Quic => {
            let pin = fingerprint(addr)?;
            Dial::Quic(
                format!("moql://{addr}/anon"),
                Arc::new(client::quic_config(pin)?),
            )
        }
    };
    let parallel = cli.connect_parallel.unwrap_or(match cli.transport {
        Link::Tcp => CONNECTING,
        Link::Quic => CONNECTING_QUIC,
    });
    let rss0 = rss_kib(pid)?;
    let shared = Arc::new(Shared::new());
    let frame_bytes = cli.frame_bytes.max(HEADER + 8);

    let mut threads = Vec::new();
    let broadcasts = cli.broadcasts.max(1);
    {
        let (dial, shared, fps) = (dial.clone(), shared.clone(), cli.fps);
        threads.push(std::thread::spawn(move || {
            driver::block_on(DriverKind::Auto, move |_| {
                publisher(dial, broadcasts, frame_bytes, fps, shared)
            })
        }));
    }
    let k = cli.client_threads.clamp(1, n.max(1));
    let mut first = 0;
    for t in 0..k {
        let m = n / k + usize::from(t < n % k);
        let (dial, shared) = (dial.clone(), shared.clone());
        let placed = (first, broadcasts, parallel);
        threads.push(std::thread::spawn(move || {
            driver::block_on(DriverKind::Auto, move |_| {
                subscribers(dial, placed, m, frame_bytes, shared)
            })
        }));
        first += m;
    }

    let started = Instant::now();
    let me = std::process::id();
    let live_timeout = Duration::from_secs_f64(cli.live_timeout.max(0.1));
    let mut every = Every::new(cli.progress, started);
    while shared.live.load(Ordering::Relaxed) < n as u64 && started.elapsed() < live_timeout {
        std::thread::sleep(Duration::from_millis(20));
        if every.due() {
            progress_line(&shared, started, n, pid, me);
        }
    }
    let connect = started.elapsed();
    if every.is_on() {
        progress_line(&shared, started, n, pid, me);
    }
    std::thread::sleep(Duration::from_secs(1));
    let gen0 = cpu_seconds(me)?;
    let (mut hist0, mut hist1) = (
        Box::new([0u64; LATENCY_BUCKETS]),
        Box::new([0u64; LATENCY_BUCKETS]),
    );
    shared.latency.load(&mut hist0);
    let (f0, p0) = (
        shared.frames.load(Ordering::Relaxed),
        shared.published_frames.load(Ordering::Relaxed),
    );
    let (cpu0, d0, t0) = (
        cpu_seconds(pid)?,
        shared.delivered.load(Ordering::Relaxed),
        Instant::now(),
    );
    std::thread::sleep(Duration::from_secs_f64(cli.seconds.max(0.1)));
    let (cpu1, d1, elapsed) = (
        cpu_seconds(pid)?,
        shared.delivered.load(Ordering::Relaxed),
        t0.elapsed(),
    );
    let (f1, p1) = (
        shared.frames.load(Ordering::Relaxed),
        shared.published_frames.load(Ordering::Relaxed),
    );
    shared.latency.load(&mut hist1);
    let rss1 = rss_kib(pid)?;
    let hwm = status_kib(pid, "VmHWM:")?;
    let load_cpu = cpu_seconds(me)? - gen0;
    shared.stop.store(true, Ordering::Relaxed);
    for t in threads {
        match t.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("relay_load: client runtime: {e}"),
            Err(_) => eprintln!("relay_load: client thread panicked"),
        }
    }
    drop(child);
    Ok(SkiffResult {
        delivered: d1 - d0,
        p50_us: LatencyHistogram::quantile_since(&hist0, &hist1, 0.5),
        p99_us: LatencyHistogram::quantile_since(&hist0, &hist1, 0.99),
        elapsed,
        cpu: cpu1 - cpu0,
        load_cpu,
        rss_delta_kib: rss1 as i64 - rss0 as i64,
        live: shared.live.load(Ordering::Relaxed),
        connect,
        bad: shared.bad.load(Ordering::Relaxed),
        lagged: shared.lagged.load(Ordering::Relaxed),
        redials: shared.redials.load(Ordering::Relaxed),
        frames_window: f1 - f0,
        published_window: p1 - p0,
        rss_start_kib: rss0,
        rss_end_kib: rss1,
        hwm_kib: hwm,
    })
}

/// One `--progress` line: seconds since the subscribers started, how many
/// are live, the relay's RSS, and the CPU seconds the relay and this
/// process have used so far.
fn progress_line(shared: &Shared, since: Instant, n: usize, relay: u32, me: u32) {
    println!(
        "      {:7.1} s: {} of {n} live; relay RSS {:.1} MiB; CPU s so far: relay {:.1}, clients {:.1}",
        since.elapsed().as_secs_f64(),
        shared.live.load(Ordering::Relaxed),
        rss_kib(relay).unwrap_or(0) as f64 / 1024.0,
        cpu_seconds(relay).unwrap_or(0.0),
        cpu_seconds(me).unwrap_or(0.0),
    );
}

/// How a client reaches the relay.
#[derive(Clone)]
enum Dial {
    /// `tcp://` URL.
    Tcp(String),
    /// `moql://` URL and the QUIC configuration pinning the relay's certificate.
    Quic(String, Arc<quinn_proto::ClientConfig>),
}

impl Dial {
    /// Dials and runs a client session with `app` until it ends.
    async fn run<A: skiff_monoio::session_driver::App>(
        &self,
        origin: Option<skiff_core::model::origin::Ref<'static, 'static>>,
        app: &mut A,
        ctx: &ClientCtx,
    ) -> io::Result<skiff_monoio::session_driver::Ended> {
        match self {
            Dial::Tcp(url) => client::run(url, origin, app, ctx).await,
            Dial::Quic(url, config) => client::run_quic(url, config, origin, app, ctx).await,
        }
    }
}

/// The SHA-256 of the certificate the relay at `addr` serves, from its
/// `GET /certificate.sha256`.
fn fingerprint(addr: SocketAddr) -> io::Result<client::Fingerprint> {
    use std::io::{Read, Write};
    let mut tcp = std::net::TcpStream::connect(addr)?;
    tcp.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        tcp,
        "GET /certificate.sha256 HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut answer = String::new();
    tcp.read_to_string(&mut answer)?;
    let body = answer
        .split_once("\r\n\r\n")
        .filter(|(head, _)| head.starts_with("HTTP/1.1 200"))
        .map(|(_, body)| body.trim())
        .ok_or_else(|| bad_data(format!("no certificate fingerprint from {addr}")))?;
    body.parse()
        .map_err(|e| bad_data(format!("certificate fingerprint `{body}`: {e:?}")))
}

/// Byte `k` of frame `index` of group `group`.
fn pattern(group: u64, index: u64, k: usize) -> u8 {
    (group.wrapping_mul(31).wrapping_add(index * 17) as usize).wrapping_add(k) as u8
}

/// Bytes of a payload's header: group, index, send time (µs), u64 little-endian each.
const HEADER: usize = 24;

fn fill(buf: &mut [u8], group: u64, index: u64, sent_us: u64) {
    for (k, b) in buf.iter_mut().enumerate().skip(HEADER) {
        *b = pattern(group, index, k);
    }
    if let Some(h) = buf.get_mut(..HEADER) {
        h[..8].copy_from_slice(&group.to_le_bytes());
        h[8..16].copy_from_slice(&index.to_le_bytes());
        h[16..].copy_from_slice(&sent_us.to_le_bytes());
    }
}

/// Spot-check: header words and three pattern bytes; returns the send time.
fn spot_check(p: &[u8], group: u64, index: u64) -> Option<u64> {
    let word = |i: usize| {
        p.get(i * 8..i * 8 + 8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
    };
    let ok = word(0) == Some(group)
        && word(1) == Some(index)
        && [HEADER, p.len() / 2, p.len().saturating_sub(1)]
            .iter()
            .filter(|&&k| k >= HEADER)
            .all(|&k| p.get(k).is_some_and(|&b| b == pattern(group, index, k)));
    if ok { word(2) } else { None }
}

/// The name of broadcast `b`.
fn broadcast_name(b: usize) -> String {
    format!("{BROADCAST}/{b}")
}

async fn publisher(
    dial: Dial,
    broadcasts: usize,
    frame_bytes: usize,
    fps: u32,
    shared: Arc<Shared>,
) {
    let group_bytes = frame_bytes as u64 * FRAMES_PER_GROUP;
    let ctx = Rc::new(ClientCtx::new(
        (group_bytes * 8 * broadcasts as u64).max(64 << 20),
    ));
    let notify = ctx.notify().clone();
    // One publishing session per broadcast, all on this thread.
    let mut producers = Vec::new();
    for b in 0..broadcasts {
        let (origin, producer) = ctx.publication(&broadcast_name(b), TRACK);
        let group: Option<skiff_core::model::track::GroupProducer<'static, 'static>> = None;
        producers.push((producer, group));
        let (ctx, dial) = (ctx.clone(), dial.clone());
        monoio::spawn(async move {
            let mut app = Publisher::default();
            if let Err(e) = dial.run(Some(origin), &mut app, &ctx).await {
                eprintln!("relay_load: publisher session: {e}");
            }
        });
    }
    let mut buf = vec![0u8; frame_bytes];
    let tick = (fps > 0).then(|| Duration::from_secs_f64(1.0 / f64::from(fps)));
    let start = Instant::now();
    let mut n: u64 = 0;
    // Broadcast b's frames go out b/B of a frame interval after broadcast
    // 0's, as independent sources would (not all in one burst).
    let slots = producers.len().max(1) as u32;
    let mut slot: u32 = 0;
    'frames: while !shared.stop.load(Ordering::Relaxed) {
        let (seq, index) = (n / FRAMES_PER_GROUP, n % FRAMES_PER_GROUP);
        let Some((producer, group)) = producers.get_mut(slot as usize) else {
            break;
        };
        fill(&mut buf, seq, index, shared.now_us());
        let ts = start.elapsed().as_millis() as u64;
        if index == 0 {
            if let Some(mut g) = group.take() {
                let _ = g.finish();
            }
            match producer.create_group(seq) {
                Ok(g) => *group = Some(g),
                Err(e) => {
                    eprintln!("relay_load: create_group: {e}");
                    break 'frames;
                }
            }
        }
        if let Some(g) = group.as_mut()
            && let Err(e) = g.write_frame(ts, &buf)
        {
            eprintln!("relay_load: write_frame: {e}");
            break 'frames;
        }
        shared
            .published
            .fetch_add(frame_bytes as u64, Ordering::Relaxed);
        notify.bump();
        slot += 1;
        if slot == slots {
            slot = 0;
            n += 1;
            shared.published_frames.store(n, Ordering::Relaxed);
        }
        let due = n as u32 * slots + slot;
        match tick {
            Some(t) => {
                monoio::time::sleep_until(monoio::time::Instant::from_std(start + t * due / slots))
                    .await
            }
            None => monoio::time::sleep(Duration::ZERO).await,
        }
    }
    ctx.close_all();
    monoio::time::sleep(Duration::from_millis(100)).await;
}

/// `m` subscribers, numbered from `placed.0`; subscriber k takes broadcast
/// k mod `placed.1`; at most `placed.2` of them connecting at once.
async fn subscribers(
    dial: Dial,
    placed: (usize, usize, usize),
    m: usize,
    frame_bytes: usize,
    shared: Arc<Shared>,
) {
    let group_bytes = frame_bytes as u64 * FRAMES_PER_GROUP;
    // Each local track keeps about BUDGET_GROUPS groups besides the latest.
    let per_track = group_bytes * (BUDGET_GROUPS + 1) + 64 * 1024;
    let ctx = Rc::new(ClientCtx::with_limits(
        (per_track * m as u64 + group_bytes).max(64 << 20),
        ClientLimits {
            tracks: m + 16,
            ..ClientLimits::default()
        },
    ));
    let notify = ctx.notify().clone();
    // Subscribers of this thread started and not live yet.
    let connecting = Rc::new(std::cell::Cell::new(0usize));
    for k in 0..m {
        // At most CONNECTING handshakes at a time, so the relay's listen
        // backlog never overflows however fast it accepts (a dropped SYN
        // is retried a second later, then 3, 7, 15 s...).
        while connecting.get() >= placed.2.max(1) && !shared.stop.load(Ordering::Relaxed) {
            monoio::time::sleep(Duration::from_millis(2)).await;
        }
        if shared.stop.load(Ordering::Relaxed) {
            // The window is over before every subscriber connected.
            break;
        }
        connecting.set(connecting.get() + 1);
        // Frees this subscriber's place once: when it goes live or its session ends.
        let unsettled = Rc::new(std::cell::Cell::new(true));
        let settle = {
            let (connecting, unsettled) = (connecting.clone(), unsettled.clone());
            move || {
                if unsettled.replace(false) {
                    connecting.set(connecting.get() - 1);
                }
            }
        };
        let local = ctx.track(TRACK);
        local.set_budget(group_bytes * BUDGET_GROUPS + frame_bytes as u64);
        let name = broadcast_name((placed.0 + k) % placed.1.max(1));
        let app = Subscriber::new(&name, local);
        let state = app.state.clone();
        {
            let (ctx, dial, shared) = (ctx.clone(), dial.clone(), shared.clone());
            let settle = settle.clone();
            monoio::spawn(async move {
                let mut app = app;
                loop {
                    if let Err(e) = dial.run(None, &mut app, &ctx).await {
                        eprintln!("relay_load: subscriber session: {e}");
                    }
                    // A session that ended before it subscribed (refused,
                    // or closed by the relay's handshake timeout on a busy
                    // host) dials again, as a player would; the local track
                    // and its reader stay.
                    if app.state.subscribed.get() || shared.stop.load(Ordering::Relaxed) {
                        break;
                    }
                    shared.redials.fetch_add(1, Ordering::Relaxed);
                    let state = app.state.clone();
                    app = Subscriber::new(&name, local);
                    app.state = state;
                    monoio::time::sleep(Duration::from_millis(100)).await;
                }
                settle();
            });
        }
        let (notify, shared) = (notify.clone(), shared.clone());
        monoio::spawn(async move {
            let key = local.key();
            let mut reader = FrameReader::new(local);
            let waiter = notify.waiter();
            // This reader wakes for its own track's media only (and for its
            // session's start, which changes every track): a flush for
            // another subscriber's frame leaves it asleep, so the clients'
            // cost per frame does not grow with the subscribers on a thread.
            // It follows the track as a session serving it does: its media
            // concerns the reader, its consumption does not.
            let task = poll_fn(|cx| Poll::Ready(cx.waker().clone())).await;
            waiter.register_session(&task, [key], std::iter::empty());
            let mut live = false;
            loop {
                if !live && state.started.get().is_some() {
                    live = true;
                    settle();
                    shared.live.fetch_add(1, Ordering::Relaxed);
                }
                let mut got = false;
                let st = reader.poll(|f| {
                    got = true;
                    let sent = spot_check(f.payload, f.group, f.index)
                        .filter(|_| f.payload.len() == frame_bytes);
                    if let Some(sent) = sent {
                        shared
                            .delivered
                            .fetch_add(f.payload.len() as u64, Ordering::Relaxed);
                        shared.frames.fetch_add(1, Ordering::Relaxed);
                        shared.latency.record(shared.now_us().saturating_sub(sent));
                    } else {
                        shared.bad.fetch_add(1, Ordering::Relaxed);
                    }
                });
                let lagged = std::mem::take(&mut reader.lagged);
                if lagged > 0 {
                    shared.lagged.fetch_add(lagged, Ordering::Relaxed);
                }
                if st != ReadState::Pending {
                    break;
                }
                if got {
                    // The session filling the track may owe its peer credit.
                    notify.bump_consumed_tracks([key]);
                }
                poll_fn(|cx| {
                    if waiter.take_concerned() || (!live && state.started.get().is_some()) {
                        Poll::Ready(())
                    } else {
                        waiter.rearm(cx.waker());
                        Poll::Pending
                    }
                })
                .await;
            }
        });
    }
    while !shared.stop.load(Ordering::Relaxed) {
        monoio::time::sleep(Duration::from_millis(50)).await;
    }
    ctx.close_all();
    monoio::time::sleep(Duration::from_millis(100)).await;
}

// ---------------------------------------------------------------------------
// copy_relay row
// ---------------------------------------------------------------------------

/// Runs `copy_relay bench` for `n` subscribers; returns (delivered MB/s, CPU s per GB).
fn copy_row(cli: &Cli, bin: &PathBuf, n: usize) -> io::Result<(f64, f64)> {
    let out = Command::new(bin)
        .args([
            "bench",
            "--subscribers",
            &n.to_string(),
            "--frame-bytes",
            &cli.frame_bytes.to_string(),
            "--fps",
            &cli.fps.to_string(),
            "--seconds",
            &cli.seconds.to_string(),
        ])
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", bin.display())))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let row = text
        .lines()
        .last()
        .ok_or_else(|| bad_data("copy_relay printed nothing".into()))?;
    // subs frame_bytes fps published_MB/s delivered_MB/s relay_cpu_s per_GB
    let f: Vec<&str> = row.split_whitespace().collect();
    let num = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok());
    match (num(4), num(6)) {
        (Some(mbs), Some(per)) => Ok((mbs, per)),
        _ => Err(bad_data(format!("unexpected copy_relay row `{row}`"))),
    }
}
