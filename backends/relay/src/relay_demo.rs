//! `skiff-relay demo`: the relay, a synthetic camera publisher and viewers in
//! one process, over loopback TCP (or WebSocket, or QUIC with
//! `--transport quic`), with a live progress line and a summary.
//!
//! The relay runs exactly as `serve` does ([`server::start`] with
//! [`RelayHandler`]); over QUIC it serves a generated certificate
//! (`--tls-generate`) on UDP at its TCP port, and every client pins that
//! certificate's fingerprint, while the TCP port stays plain for browsers. One client thread runs a monoio runtime with a client
//! of the SDK ([`skiff_monoio::connect`]) for the camera and one per viewer,
//! each with its own session. The camera writes a frame per tick (`--fps`)
//! and starts a group every second (its first frame 4x larger, like a key
//! frame). Each payload carries its
//! send time, group and index, then a byte pattern; every viewer checks
//! every frame's bytes and order and measures publish-to-read latency into a
//! fixed-size histogram ([`LatencyHistogram`]): average, p50, p99 and max,
//! per second on the live line and for the whole run in the summary.
//!
//! Beside them, on a thread of its own, a browser camera publishes H.264 in
//! moq-dev's hang format as [`BROWSER_BROADCAST`]: the core's moving test
//! card ([`TestCard`], I_PCM pictures with the frame number drawn in), which
//! needs no encoder, so the relay builds without one. The demo prints the URL
//! of the relay's watch page, where a browser plays it with moq-dev's player.
//!
//! The page is built from `web/` into the web directory (`web/dist`), which
//! is not in the repository, nor is the player's third-party code. When the
//! directory has no `index.html` and `web/package-lock.json` is beside it, the
//! demo builds it first ([`build_page`]): `npm ci` (the packages the lock file
//! pins, from the npm registry) and `npm run build`, their progress on the
//! terminal; without `npm` it names what to install and runs without the page.

use std::cell::{Cell, RefCell};
use std::io::{IsTerminal, Write};
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use skiff_core::hang::{self, testcard::TestCard};
use skiff_core::model::track::Info;
use skiff_monoio::driver;
use skiff_monoio::sdk::{GroupProducer, Request};
use skiff_monoio::tls::Fingerprint;
use skiff_monoio::{Client, Config, Error, connect};

use crate::config::{ConfigError, DemoTransport, RelayConfig, RelayDemoArgs};
use crate::error::RelayError;
use crate::relay::RelayHandler;
use crate::server;
use crate::tls::TlsServer;

/// Counters shared by the client thread and the progress printer.
#[derive(Debug, Default)]
pub struct DemoStats {
    /// Frames the camera wrote.
    pub frames_sent: AtomicU64,
    /// Frames read by all viewers together.
    pub frames_received: AtomicU64,
    /// Payload bytes read by all viewers together.
    pub bytes_received: AtomicU64,
    /// Viewers whose subscription started.
    pub viewers_live: AtomicU64,
    /// Sum of latencies of live frames, µs.
    pub latency_sum_us: AtomicU64,
    /// Live frames measured.
    pub latency_count: AtomicU64,
    /// Highest latency, µs.
    pub latency_max_us: AtomicU64,
    /// Latencies of live frames, for percentiles.
    pub latency: LatencyHistogram,
    /// Frames with wrong bytes or out of order.
    pub bad_frames: AtomicU64,
}

/// Sub-buckets per power of two above [`LINEAR_US`]: a bucket spans at most
/// 1/32 of its values (about 3 %).
const SUB_BUCKETS: u64 = 32;

/// Latencies below this (µs) get a bucket each.
const LINEAR_US: u64 = 2 * SUB_BUCKETS;

/// Latencies at or above this (µs, about 19 hours) share the last bucket.
const LATENCY_CAP_US: u64 = 1 << 36;

/// Buckets of a [`LatencyHistogram`].
pub const LATENCY_BUCKETS: usize =
    (LINEAR_US + (36 - LINEAR_US.ilog2() as u64) * SUB_BUCKETS) as usize;

/// A fixed-size, log-linear histogram of latencies in µs, shared between
/// threads: recording is one relaxed atomic add and never allocates.
///
/// Values under 64 µs are exact; above, a bucket spans 1/32 of its power of
/// two, so a percentile is within about 3 % (reported as the bucket's
/// highest value, i.e. rounded up).
#[derive(Debug)]
pub struct LatencyHistogram {
    buckets: [AtomicU64; LATENCY_BUCKETS],
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

/// The bucket of latency `us`.
fn bucket_of(us: u64) -> usize {
    let us = us.min(LATENCY_CAP_US - 1);
    if us < LINEAR_US {
        return us as usize;
    }
    let exp = u64::from(us.ilog2());
    let shift = exp - SUB_BUCKETS.ilog2() as u64;
    let sub = (us >> shift) - SUB_BUCKETS;
    (LINEAR_US + (exp - LINEAR_US.ilog2() as u64) * SUB_BUCKETS + sub) as usize
}

/// The highest latency that falls in bucket `i`.
fn bucket_high(i: usize) -> u64 {
    let i = i as u64;
    if i < LINEAR_US {
        return i;
    }
    let exp = (i - LINEAR_US) / SUB_BUCKETS + LINEAR_US.ilog2() as u64;
    let sub = (i - LINEAR_US) % SUB_BUCKETS;
    let shift = exp - SUB_BUCKETS.ilog2() as u64;
    ((SUB_BUCKETS + sub + 1) << shift) - 1
}

/// The `q` quantile (0..=1) of bucket counts `counts(i)`, `None` if empty.
fn quantile(q: f64, counts: impl Fn(usize) -> u64) -> Option<u64> {
    let total: u64 = (0..LATENCY_BUCKETS).map(&counts).sum();
    if total == 0 {
        return None;
    }
    // The rank of the quantile, 1-based: the smallest value with at least q of the samples.
    let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
    let mut seen = 0;
    for i in 0..LATENCY_BUCKETS {
        seen += counts(i);
        if seen >= rank {
            return Some(bucket_high(i));
        }
    }
    Some(bucket_high(LATENCY_BUCKETS - 1))
}

impl LatencyHistogram {
    /// Records one latency.
    pub fn record(&self, us: u64) {
        self.buckets[bucket_of(us)].fetch_add(1, Ordering::Relaxed);
    }

    /// Copies the bucket counts into `out` (for [`LatencyHistogram::quantile_since`]).
    pub fn load(&self, out: &mut [u64; LATENCY_BUCKETS]) {
        for (o, b) in out.iter_mut().zip(&self.buckets) {
            *o = b.load(Ordering::Relaxed);
        }
    }

    /// The `q` quantile (0..=1) of everything recorded, in µs; `None` if nothing was.
    pub fn quantile(&self, q: f64) -> Option<u64> {
        quantile(q, |i| self.buckets[i].load(Ordering::Relaxed))
    }

    /// The `q` quantile of what was recorded between two [`LatencyHistogram::load`]s.
    pub fn quantile_since(
        before: &[u64; LATENCY_BUCKETS],
        after: &[u64; LATENCY_BUCKETS],
        q: f64,
    ) -> Option<u64> {
        quantile(q, |i| after[i].saturating_sub(before[i]))
    }
}

/// The result of a demo run.
#[derive(Debug)]
pub struct RelayDemoReport {
    /// Where the relay listened.
    pub addr: SocketAddr,
    /// How the camera and viewers reached it.
    pub transport: DemoTransport,
    /// Relay worker threads.
    pub threads: usize,
    /// Viewers.
    pub viewers: usize,
    /// Wall time.
    pub elapsed: Duration,
    /// Final counters.
    pub frames_sent: u64,
    /// Frames read by all viewers.
    pub frames_received: u64,
    /// Payload bytes read by all viewers.
    pub bytes_received: u64,
    /// Mean latency, µs.
    pub latency_avg_us: u64,
    /// Median latency, µs (within about 3 %).
    pub latency_p50_us: u64,
    /// 99th percentile latency, µs (within about 3 %).
    pub latency_p99_us: u64,
    /// Highest latency, µs.
    pub latency_max_us: u64,
    /// H.264 frames the browser camera published ([`BROWSER_BROADCAST`]).
    pub video_frames: u64,
    /// What went wrong (empty = success).
    pub failures: Vec<String>,
}

/// The broadcast the demo's H.264 camera publishes for browsers.
pub const BROWSER_BROADCAST: &str = "demo/cam.hang";

/// The watch page's URL of the demo's browser broadcast on a relay at `addr`.
pub fn watch_url(addr: SocketAddr) -> String {
    format!("http://{addr}/?name={BROWSER_BROADCAST}")
}

impl std::fmt::Display for RelayDemoReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secs = self.elapsed.as_secs_f64().max(1e-9);
        writeln!(
            f,
            "demo: relay on {} ({} worker threads), 1 publisher, {} viewers over {}, {:.1} s",
            self.addr,
            self.threads,
            self.viewers,
            self.transport.scheme(),
            secs
        )?;
        writeln!(
            f,
            "demo: {} frames published, {} frames delivered and verified ({:.1} per viewer-second), {:.1} Mbit/s to viewers",
            self.frames_sent,
            self.frames_received,
            self.frames_received as f64 / secs / self.viewers.max(1) as f64,
            self.bytes_received as f64 * 8.0 / 1e6 / secs
        )?;
        writeln!(
            f,
            "demo: latency publish→viewer avg {:.2} ms, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            self.latency_avg_us as f64 / 1e3,
            self.latency_p50_us as f64 / 1e3,
            self.latency_p99_us as f64 / 1e3,
            self.latency_max_us as f64 / 1e3
        )?;
        writeln!(
            f,
            "demo: {} frames of H.264 published as {BROWSER_BROADCAST} for browsers",
            self.video_frames
        )?;
        for fail in &self.failures {
            writeln!(f, "demo: failure: {fail}")?;
        }
        Ok(())
    }
}

/// Payload of frame `index` of group `group`, sent at `sent_us`.
fn fill(buf: &mut Vec<u8>, len: usize, sent_us: u64, group: u64, index: u64) {
    buf.clear();
    buf.extend_from_slice(&sent_us.to_le_bytes());
    buf.extend_from_slice(&group.to_le_bytes());
    buf.extend_from_slice(&index.to_le_bytes());
    let seed = (group as usize)
        .wrapping_mul(31)
        .wrapping_add(index as usize * 17);
    buf.extend((buf.len()..len.max(24)).map(|k| seed.wrapping_add(k) as u8));
}

fn check(p: &[u8], group: u64, index: u64) -> Option<u64> {
    let word = |i: usize| {
        p.get(i * 8..i * 8 + 8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
    };
    if word(1)? != group || word(2)? != index {
        return None;
    }
    let seed = (group as usize)
        .wrapping_mul(31)
        .wrapping_add(index as usize * 17);
    let ok = p
        .iter()
        .enumerate()
        .skip(24)
        .all(|(k, b)| *b == seed.wrapping_add(k) as u8);
    if ok { word(0) } else { None }
}

/// Whether the demo's watch page can be served, after [`build_page`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PageStatus {
    /// `index.html` is in the web directory.
    Ready,
    /// It is not, and could not be built; the reason, for a person.
    Missing(String),
}

/// Builds the watch page into `web_dir` when it has no `index.html` and is
/// the build output of an npm project (`web_dir`'s parent holds
/// `package.json` and `package-lock.json`, as the repository's `web/dist`
/// does): `npm ci --no-audit --no-fund`, then `npm run build`, both in that
/// project with their output on this process's standard error, so standard
/// output keeps only the demo's own lines. Two demos starting at once build
/// once: the build holds an exclusive lock on `.build-lock` in the project,
/// and the second finds the page built when it gets the lock. Without `npm`
/// on the `PATH`, or when a step fails, the page stays missing and the status
/// says what to do.
pub fn build_page(web_dir: &std::path::Path) -> PageStatus {
    if web_dir.join("index.html").is_file() {
        return PageStatus::Ready;
    }
    let Some(project) = web_dir
        .parent()
        .filter(|p| p.join("package.json").is_file() && p.join("package-lock.json").is_file())
    else {
        return PageStatus::Missing(format!(
            "{} has no index.html and is not an npm project's output to build",
            web_dir.display()
        ));
    };
    use std::process::{Command, Stdio};
    let npm = |args: &[&str], out: Stdio| {
        Command::new("npm")
            .arg("--prefix")
            .arg(project)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .status()
    };
    match npm(&["--version"], Stdio::null()) {
        Ok(s) if s.success() => {}
        Ok(_) | Err(_) => {
            return PageStatus::Missing(
                "the watch page is built once with Node.js's npm, which is not installed: install the `npm` package (Debian and Ubuntu: `sudo apt-get install npm`; macOS: `brew install node`), then run the demo again".into(),
            );
        }
    }
    // Held until the build ends (the lock goes with the file).
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(project.join(".build-lock"))
        .and_then(|f| f.lock().map(|()| f));
    let _lock = match lock {
        Ok(f) => f,
        Err(e) => return PageStatus::Missing(format!("cannot lock {}: {e}", project.display())),
    };
    if web_dir.join("index.html").is_file() {
        return PageStatus::Ready;
    }
    eprintln!(
        "demo: building the watch page once: npm ci (the player's packages from the npm registry, pinned by {}), then npm run build",
        project.join("package-lock.json").display()
    );
    for step in [&["ci", "--no-audit", "--no-fund"][..], &["run", "build"]] {
        match npm(step, Stdio::from(std::io::stderr())) {
            Ok(s) if s.success() => {}
            Ok(s) => {
                return PageStatus::Missing(format!(
                    "`npm --prefix {} {}` failed ({s})",
                    project.display(),
                    step.join(" ")
                ));
            }
            Err(e) => {
                return PageStatus::Missing(format!("cannot run npm: {e}"));
            }
        }
    }
    if web_dir.join("index.html").is_file() {
        PageStatus::Ready
    } else {
        PageStatus::Missing(format!(
            "npm run build left no index.html in {}",
            web_dir.display()
        ))
    }
}

/// Runs the demo; see the module docs.
///
/// # Errors
/// The relay could not start or stop, or the client runtime failed.
pub fn run(
    config: RelayConfig,
    args: RelayDemoArgs,
    stop: Arc<AtomicBool>,
) -> Result<RelayDemoReport, RelayError> {
    let kind = config.driver;
    let threads = config.threads.get();
    let transport = args.transport();
    let page = build_page(&config.web_dir);
    // Over QUIC: the configuration's certificate, its fingerprint pinned by every client.
    let (tls, pin) = match transport {
        DemoTransport::Quic => {
            let (tls, pin) = quic_certificate(&config)?;
            (Some(tls), Some(pin))
        }
        DemoTransport::Tcp | DemoTransport::Ws => (None, None),
    };
    let server = server::start(
        config,
        RelayHandler::factory_with_tls(threads, tls).map_err(RelayError::Spawn)?,
    )?;
    let addr = server.local_addr();
    // The origin's root, where the watch page's players dial too (docs/protocol.md §4.1).
    let url = format!("{}://{addr}/", transport.scheme());
    if let Some(pin) = pin {
        println!("demo: camera and viewers dial {url} (QUIC on UDP, certificate sha256 {pin})");
    }
    let stats = Arc::new(DemoStats::default());
    let done = Arc::new(AtomicBool::new(false));
    let epoch = Instant::now();
    let camera_stop = Arc::new(AtomicBool::new(false));
    let camera = {
        let (url, fps, stop) = (url.clone(), args.fps.max(1), camera_stop.clone());
        std::thread::Builder::new()
            .name("skiff-demo-camera".into())
            .spawn(move || driver::block_on(kind, move |_| browser_camera(url, pin, fps, stop)))
            .map_err(RelayError::Spawn)?
    };
    match &page {
        PageStatus::Ready => println!(
            "demo: watch in a browser: {} (--seconds N runs longer)",
            watch_url(addr)
        ),
        PageStatus::Missing(why) => println!("demo: no watch page at {}: {why}", watch_url(addr)),
    }
    let client = {
        let (stats, done, stop) = (stats.clone(), done.clone(), stop.clone());
        std::thread::Builder::new()
            .name("skiff-demo-clients".into())
            .spawn(move || {
                let r =
                    driver::block_on(kind, move |_| clients(url, pin, args, stats, stop, epoch));
                done.store(true, Ordering::Relaxed);
                r
            })
            .map_err(RelayError::Spawn)?
    };

    // Progress line once a second.
    let tty = std::io::stdout().is_terminal();
    let mut last = (Instant::now(), 0u64, 0u64, 0u64, 0u64);
    // Bucket counts at the last line and now (sized once, outside the loop).
    let mut hist_last = Box::new([0u64; LATENCY_BUCKETS]);
    let mut hist_now = Box::new([0u64; LATENCY_BUCKETS]);
    while !done.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(200));
        let now = Instant::now();
        if now.duration_since(last.0) < Duration::from_secs(1) {
            continue;
        }
        let dt = now.duration_since(last.0).as_secs_f64();
        let sent = stats.frames_sent.load(Ordering::Relaxed);
        let bytes = stats.bytes_received.load(Ordering::Relaxed);
        let n = stats.latency_count.load(Ordering::Relaxed);
        let sum = stats.latency_sum_us.load(Ordering::Relaxed);
        let lat = if n > last.3 {
            (sum - last.2) as f64 / (n - last.3) as f64 / 1e3
        } else {
            0.0
        };
        stats.latency.load(&mut hist_now);
        // A percentile is its bucket's highest value: never more than the maximum seen.
        let max = stats.latency_max_us.load(Ordering::Relaxed);
        let ms = |q| {
            LatencyHistogram::quantile_since(&hist_last, &hist_now, q)
                .unwrap_or(0)
                .min(max) as f64
                / 1e3
        };
        let (p50, p99) = (ms(0.5), ms(0.99));
        std::mem::swap(&mut hist_last, &mut hist_now);
        let line = format!(
            "t={:>3}s  {}  camera {:>5.1} fps  {:>7.2} Mbit/s to viewers  viewers {}/{}  latency avg {:.2} p50 {:.2} p99 {:.2} ms",
            epoch.elapsed().as_secs(),
            transport.scheme(),
            (sent - last.1) as f64 / dt,
            bytes.saturating_sub(last.4) as f64 * 8.0 / 1e6 / dt,
            stats.viewers_live.load(Ordering::Relaxed),
            args.viewers,
            lat,
            p50,
            p99
        );
        let mut out = std::io::stdout().lock();
        if tty {
            let _ = write!(out, "\r{line}   ");
        } else {
            let _ = writeln!(out, "{line}");
        }
        let _ = out.flush();
        last = (now, sent, sum, n, bytes);
    }
    if tty {
        println!();
    }
    let res = client
        .join()
        .map_err(|_| RelayError::Spawn(std::io::Error::other("client thread panicked")))?;
    let elapsed = epoch.elapsed();
    camera_stop.store(true, Ordering::Relaxed);
    let video = camera
        .join()
        .map_err(|_| RelayError::Spawn(std::io::Error::other("camera thread panicked")))?;
    server.shutdown()?;
    let mut failures = match res {
        Ok(f) => f,
        Err(e) => vec![format!("client runtime: {e}")],
    };
    let video_frames = match video {
        Ok(Ok(frames)) => frames,
        Ok(Err(e)) => {
            failures.push(format!("browser camera: {e}"));
            0
        }
        Err(e) => {
            failures.push(format!("browser camera runtime: {e}"));
            0
        }
    };
    let bad = stats.bad_frames.load(Ordering::Relaxed);
    if bad > 0 {
        failures.push(format!("{bad} frames had wrong bytes or order"));
    }
    let n = stats.latency_count.load(Ordering::Relaxed).max(1);
    let max = stats.latency_max_us.load(Ordering::Relaxed);
    Ok(RelayDemoReport {
        addr,
        transport,
        threads,
        viewers: args.viewers,
        elapsed,
        frames_sent: stats.frames_sent.load(Ordering::Relaxed),
        frames_received: stats.frames_received.load(Ordering::Relaxed),
        bytes_received: stats.bytes_received.load(Ordering::Relaxed),
        latency_avg_us: stats.latency_sum_us.load(Ordering::Relaxed) / n,
        latency_p50_us: stats.latency.quantile(0.5).unwrap_or(0).min(max),
        latency_p99_us: stats.latency.quantile(0.99).unwrap_or(0).min(max),
        latency_max_us: max,
        video_frames,
        failures,
    })
}

/// The certificate the relay serves QUIC with (its `--tls-generate` or
/// files) and the fingerprint the demo's clients pin.
fn quic_certificate(config: &RelayConfig) -> Result<(Arc<TlsServer>, Fingerprint), RelayError> {
    let invalid = |reason: String| {
        RelayError::Config(ConfigError::Invalid {
            key: "tls-generate",
            reason,
        })
    };
    let source = config.tls_source().ok_or_else(|| {
        invalid("--transport quic needs a certificate (--tls-generate HOST)".into())
    })?;
    let tls = TlsServer::load(source).map_err(|e| invalid(e.to_string()))?;
    let pin = tls
        .cert()
        .fingerprint()
        .ok_or_else(|| invalid("no certificate to pin".into()))?;
    Ok((Arc::new(tls), pin))
}

/// A client's configuration: `pool_bytes` of buffers, and the relay's
/// certificate pinned when it is dialed over QUIC.
fn client_config(pool_bytes: u64, pin: Option<Fingerprint>) -> Config {
    let mut config = Config::default();
    config.pool_bytes = pool_bytes;
    config.tls_fingerprint = pin;
    config
}

/// How long the camera waits, at the end, for the relay to read the track's end.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(2);

/// The client thread: publisher and viewers; returns the failures.
async fn clients(
    url: String,
    pin: Option<Fingerprint>,
    args: RelayDemoArgs,
    stats: Arc<DemoStats>,
    stop: Arc<AtomicBool>,
    epoch: Instant,
) -> Vec<String> {
    let fps = u64::from(args.fps.max(1));
    let delta = usize::try_from(args.frame_bytes.0)
        .unwrap_or(usize::MAX)
        .clamp(24, 1 << 20);
    // A group: a key frame 4x a delta, then fps - 1 deltas.
    let group_bytes = (delta as u64) * (fps + 3);
    let failures: Rc<RefCell<Vec<String>>> = Rc::default();
    let finished = Rc::new(Cell::new(0usize));
    let mut viewers = Vec::with_capacity(args.viewers);
    let mut tasks = Vec::with_capacity(args.viewers);
    for v in 0..args.viewers {
        let config = client_config((group_bytes * 8).max(16 << 20), pin);
        let (client, runner) = match connect(&url, config) {
            Ok(c) => c,
            Err(e) => return vec![format!("viewer {v}: {e}")],
        };
        tasks.push(monoio::spawn(runner.run()));
        viewers.push(client.clone());
        let (stats, failures, finished) = (stats.clone(), failures.clone(), finished.clone());
        tasks.push(monoio::spawn(async move {
            let mut frames = 0u64;
            if let Err(e) = view(&client, &stats, epoch, &mut frames).await {
                // A viewer closed at the end did not see the end of the track:
                // that is reported below.
                if !matches!(e, Error::Closed) {
                    failures.borrow_mut().push(format!("viewer {v}: {e}"));
                }
            } else {
                finished.set(finished.get() + 1);
            }
            if frames == 0 {
                failures.borrow_mut().push(format!("viewer {v}: no frame"));
            }
        }));
    }

    // The camera.
    let config = client_config((group_bytes * 16).max(256 << 20), pin);
    let (camera, runner) = match connect(&url, config) {
        Ok(c) => c,
        Err(e) => return vec![format!("camera: {e}")],
    };
    tasks.push(monoio::spawn(runner.run()));
    if let Err(e) = publish(&camera, args, fps, delta, &stats, &stop, epoch).await {
        failures.borrow_mut().push(format!("camera: {e}"));
    }
    // Let the end reach the relay, then give it a moment to reach every viewer.
    monoio::select! {
        () = camera.flushed() => {}
        () = monoio::time::sleep(FLUSH_TIMEOUT) => {}
    }
    let deadline = Instant::now() + Duration::from_secs(3);
    while finished.get() < args.viewers && Instant::now() < deadline {
        monoio::time::sleep(Duration::from_millis(20)).await;
    }
    if finished.get() < args.viewers {
        failures.borrow_mut().push(format!(
            "{} viewers did not see the end of the track",
            args.viewers - finished.get()
        ));
    }
    // Close every session cleanly, then wait for the tasks to end.
    for client in viewers.iter().chain([&camera]) {
        client.close().await;
    }
    for task in tasks {
        task.await;
    }
    failures.take()
}

/// Width and height of the browser camera's test card: small, since I_PCM
/// pictures are uncompressed (about 41 KiB a picture, 10 Mbit/s at 30 fps).
const CARD_SIZE: (usize, usize) = (192, 144);

/// The browser camera: the core's test card as a hang broadcast
/// ([`BROWSER_BROADCAST`]: `catalog.json` in one open group, and `video`, a
/// group per picture since every picture is an IDR), a picture per tick
/// until `stop` is set. Returns the pictures published.
async fn browser_camera(
    url: String,
    pin: Option<Fingerprint>,
    fps: u32,
    stop: Arc<AtomicBool>,
) -> Result<u64, Error> {
    let card = TestCard::new(CARD_SIZE.0, CARD_SIZE.1, fps)
        .map_err(|e| Error::Io(std::io::Error::other(format!("test card: {e}"))))?;
    // Room for a second of pictures.
    let config = client_config(
        (card.max_frame_len() as u64 * u64::from(fps) * 2).max(16 << 20),
        pin,
    );
    let (client, runner) = connect(&url, config)?;
    let runner = monoio::spawn(runner.run());
    let broadcast = client.publish(BROWSER_BROADCAST)?;
    let mut catalog_track = broadcast.create_track(hang::catalog_info())?;
    let video =
        hang::video_info(VIDEO_TRACK).map_err(|_| Error::InvalidName(VIDEO_TRACK.into()))?;
    let mut track = broadcast.create_track(video)?;
    let mut json = [0u8; hang::testcard::CATALOG_MAX_LEN];
    let len = card
        .catalog(VIDEO_TRACK, &mut json)
        .map_err(|e| Error::Io(std::io::Error::other(format!("test card catalog: {e}"))))?;
    let mut catalog = catalog_track.append_group()?;
    catalog.write_frame(0, &json[..len]).await?;
    let mut buf = vec![0u8; card.max_frame_len()];
    let tick = Duration::from_micros(1_000_000 / u64::from(fps));
    let start = Instant::now();
    let mut n: u32 = 0;
    while !stop.load(Ordering::Relaxed) {
        let pts = card.pts_us(u64::from(n));
        let frame = card
            .frame(n, pts, &mut buf)
            .map_err(|e| Error::Io(std::io::Error::other(format!("test card: {e}"))))?;
        let mut group = track.append_group()?;
        group.write_frame(pts, frame).await?;
        group.finish()?;
        n = n.wrapping_add(1);
        monoio::time::sleep_until(monoio::time::Instant::from_std(start + tick * n)).await;
    }
    catalog.finish()?;
    catalog_track.finish();
    track.finish();
    monoio::select! {
        () = client.flushed() => {}
        () = monoio::time::sleep(FLUSH_TIMEOUT) => {}
    }
    client.close().await;
    runner.await;
    Ok(u64::from(n))
}

/// The browser camera's video track.
const VIDEO_TRACK: &str = "video";

/// The camera: a frame per tick until `args.seconds` passed or `stop` is set,
/// a group per second; then the track's end.
async fn publish(
    client: &Client,
    args: RelayDemoArgs,
    fps: u64,
    delta: usize,
    stats: &DemoStats,
    stop: &AtomicBool,
    epoch: Instant,
) -> Result<(), Error> {
    let broadcast = client.publish("demo")?;
    let info = Info::new("camera").map_err(|_| Error::InvalidName("camera".into()))?;
    let mut track = broadcast.create_track(info)?;
    let tick = Duration::from_micros(1_000_000 / fps);
    let mut buf = Vec::with_capacity(delta * 4);
    let start = Instant::now();
    let end = start + Duration::from_secs(args.seconds);
    let mut group: Option<GroupProducer> = None;
    let mut n: u64 = 0;
    while Instant::now() < end && !stop.load(Ordering::Relaxed) {
        let (seq, index) = (n / fps, n % fps);
        if index == 0 {
            if let Some(g) = group.take() {
                g.finish()?;
            }
            let g = track.append_group()?;
            debug_assert_eq!(g.sequence(), seq);
            group = Some(g);
        }
        let len = if index == 0 { delta * 4 } else { delta };
        fill(
            &mut buf,
            len,
            epoch.elapsed().as_micros() as u64,
            seq,
            index,
        );
        if let Some(g) = group.as_mut() {
            g.write_frame(n * 1000 / fps, &buf).await?;
        }
        stats.frames_sent.fetch_add(1, Ordering::Relaxed);
        n += 1;
        monoio::time::sleep_until(monoio::time::Instant::from_std(start + tick * n as u32)).await;
    }
    if let Some(g) = group.take() {
        g.finish()?;
    }
    track.finish();
    Ok(())
}

/// One viewer: subscribes, then reads and checks every frame until the
/// track's end, counting into `stats` and `frames`.
async fn view(
    client: &Client,
    stats: &DemoStats,
    epoch: Instant,
    frames: &mut u64,
) -> Result<(), Error> {
    let mut track = client.subscribe("demo", "camera", Request::LIVE).await?;
    stats.viewers_live.fetch_add(1, Ordering::Relaxed);
    // A frame's bytes in one piece for the check (sized by the largest frame).
    let mut bytes = Vec::new();
    let mut first_group = None;
    let mut next: Option<(u64, u64)> = None;
    while let Some(mut g) = track.next_group().await? {
        let seq = g.sequence();
        let first = *first_group.get_or_insert(seq);
        let mut index = 0u64;
        while let Some(f) = g.read_frame().await? {
            *frames += 1;
            bytes.clear();
            f.payload.chunks().for_each(|c| bytes.extend_from_slice(c));
            let in_order = next.is_none_or(|n| n == (seq, index) || (index == 0 && seq > n.0));
            match check(&bytes, seq, index) {
                Some(sent) if in_order => {
                    stats.frames_received.fetch_add(1, Ordering::Relaxed);
                    stats
                        .bytes_received
                        .fetch_add(bytes.len() as u64, Ordering::Relaxed);
                    if seq > first {
                        let now = epoch.elapsed().as_micros() as u64;
                        let lat = now.saturating_sub(sent);
                        stats.latency_sum_us.fetch_add(lat, Ordering::Relaxed);
                        stats.latency_count.fetch_add(1, Ordering::Relaxed);
                        stats.latency_max_us.fetch_max(lat, Ordering::Relaxed);
                        stats.latency.record(lat);
                    }
                }
                _ => {
                    stats.bad_frames.fetch_add(1, Ordering::Relaxed);
                }
            }
            index += 1;
            next = Some((seq, index));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    // ---- the watch page ----

    /// A fresh directory under the system's temporary directory.
    fn scratch(name: &str) -> std::path::PathBuf {
        let dir =
            std::env::temp_dir().join(format!("skiff-demo-page-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_built_page_is_served_without_npm() {
        let dir = scratch("built");
        std::fs::write(dir.join("index.html"), "<!doctype html>").unwrap();
        assert_eq!(build_page(&dir), PageStatus::Ready);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_directory_outside_an_npm_project_is_not_built() {
        let dir = scratch("plain");
        let dist = dir.join("dist");
        match build_page(&dist) {
            PageStatus::Missing(why) => assert!(why.contains("not an npm project"), "{why}"),
            PageStatus::Ready => panic!("no page to serve"),
        }
        // package.json without its lock file: still not built (`npm ci` needs the lock).
        std::fs::write(dir.join("package.json"), "{}").unwrap();
        assert!(matches!(build_page(&dist), PageStatus::Missing(_)));
        assert!(!dist.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    // ---- latency histogram ----

    #[test]
    fn buckets_cover_every_value_in_order() {
        let mut prev = 0;
        for us in (0..5_000).chain([1 << 20, (1 << 20) + 1, LATENCY_CAP_US - 1, u64::MAX]) {
            let b = bucket_of(us);
            assert!(b < LATENCY_BUCKETS, "{us}");
            assert!(b >= prev || us >= 1 << 20, "{us}");
            prev = b;
            let high = bucket_high(b);
            assert!(
                high >= us.min(LATENCY_CAP_US - 1),
                "{us} in bucket {b} up to {high}"
            );
            // At most 1/32 above the value.
            assert!(high - us.min(high) <= us / 32 + 1, "{us}: {high}");
        }
        assert_eq!(bucket_of(u64::MAX), LATENCY_BUCKETS - 1);
        assert_eq!(bucket_high(LATENCY_BUCKETS - 1), LATENCY_CAP_US - 1);
        for i in 1..LATENCY_BUCKETS {
            assert_eq!(bucket_of(bucket_high(i)), i);
            assert_eq!(bucket_of(bucket_high(i - 1) + 1), i);
        }
    }

    #[test]
    fn quantiles_of_a_uniform_spread() {
        let h = LatencyHistogram::default();
        assert_eq!(h.quantile(0.5), None);
        for us in 1..=10_000 {
            h.record(us);
        }
        let p50 = h.quantile(0.5).unwrap();
        let p99 = h.quantile(0.99).unwrap();
        assert!((5_000..=5_000 + 5_000 / 32).contains(&p50), "{p50}");
        assert!((9_900..=9_900 + 9_900 / 32).contains(&p99), "{p99}");
        assert_eq!(h.quantile(0.0), Some(1));
        assert!(h.quantile(1.0).unwrap() >= 10_000);
    }

    #[test]
    fn quantiles_between_two_loads() {
        let h = LatencyHistogram::default();
        let (mut a, mut b) = ([0; LATENCY_BUCKETS], [0; LATENCY_BUCKETS]);
        for _ in 0..100 {
            h.record(10);
        }
        h.load(&mut a);
        for _ in 0..100 {
            h.record(40);
        }
        h.load(&mut b);
        assert_eq!(LatencyHistogram::quantile_since(&a, &b, 0.5), Some(40));
        assert_eq!(LatencyHistogram::quantile_since(&a, &a, 0.5), None);
        assert_eq!(h.quantile(0.25), Some(10));
    }
}
