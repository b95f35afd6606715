//! `copy_relay`: the baseline that skiff-relay's CPU cost is measured against.
//!
//! A plain blocking relay (std threads, blocking sockets, no protocol): one
//! publisher's bytes are copied to every subscriber. One copier thread reads
//! a chunk from the publisher and writes it to each subscriber in turn, so
//! the CPU it spends is close to the floor for "read once, write N times"
//! through the kernel's socket API.
//!
//! Modes:
//! - `relay`: serve on `--listen`, print `listening on ADDR`, run until killed.
//! - `load`: connect N subscribers and one publisher to `--relay`, publish
//!   fixed-size frames at `--fps` (0 = as fast as possible), and print the
//!   delivered MB/s and, with `--relay-pid`, the relay's CPU seconds per
//!   delivered GB (from `/proc/PID/stat`).
//! - `bench`: for each `--subscribers` count, start a fresh `relay` child
//!   process, run `load` against it, and print one table row.
//!
//! Wire: a client's first byte is its role (`P` publisher, `S` subscriber);
//! the relay answers `K` once the client is registered, so the load only
//! starts publishing when every subscriber is in place. After that the
//! publisher sends raw bytes and subscribers receive them.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};

/// Copy buffer of the relay: one read from the publisher at most.
const RELAY_BUFFER: usize = 64 * 1024;
/// Time allowed for a client's role byte and for handshakes.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Socket timeout of the load generator, so a stuck relay cannot hang it.
const LOAD_IO_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Parser)]
#[command(
    about = "Blocking copy relay and load generator: the CPU-per-GB baseline for skiff-relay."
)]
struct Cli {
    #[command(subcommand)]
    mode: Mode,
}

#[derive(Debug, Subcommand)]
enum Mode {
    /// Serve as the copy relay until killed.
    Relay {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: SocketAddr,
    },
    /// Drive a running relay and measure.
    Load {
        /// The relay's address.
        #[arg(long)]
        relay: SocketAddr,
        /// The relay's process id, to report its CPU time.
        #[arg(long)]
        relay_pid: Option<u32>,
        #[command(flatten)]
        load: LoadArgs,
    },
    /// Start a relay child per subscriber count and measure each.
    Bench {
        /// Subscriber counts, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1,10,100")]
        subscribers: Vec<usize>,
        #[command(flatten)]
        load: LoadArgs,
    },
}

#[derive(Debug, Clone, Copy, clap::Args)]
struct LoadArgs {
    /// Subscribers (ignored by `bench`, which takes a list).
    #[arg(long, default_value_t = 10)]
    subs: usize,
    /// Bytes per published frame.
    #[arg(long, default_value_t = 65536)]
    frame_bytes: usize,
    /// Frames per second; 0 publishes as fast as the relay takes them.
    #[arg(long, default_value_t = 0)]
    fps: u32,
    /// Measured seconds (after a warm-up of a quarter of that, at most 1 s).
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
}

fn main() {
    let cli = Cli::parse();
    let res = match cli.mode {
        Mode::Relay { listen } => relay(listen),
        Mode::Load {
            relay,
            relay_pid,
            load,
        } => load_run(relay, relay_pid, load).map(|r| println!("{}\n{}", Row::HEADER, r.row(load))),
        Mode::Bench { subscribers, load } => bench(&subscribers, load),
    };
    if let Err(e) = res {
        eprintln!("copy_relay: error: {e}");
        std::process::exit(1);
    }
}

// ---------------------------------------------------------------------------
// Relay
// ---------------------------------------------------------------------------

fn relay(listen: SocketAddr) -> io::Result<()> {
    let listener = TcpListener::bind(listen)?;
    println!("listening on {}", listener.local_addr()?);
    io::stdout().flush()?;
    let subscribers: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
    let publishing = Arc::new(AtomicBool::new(false));
    for conn in listener.incoming() {
        let mut s = match conn {
            Ok(s) => s,
            Err(e) => {
                eprintln!("copy_relay: accept: {e}");
                continue;
            }
        };
        s.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
        let mut role = [0u8; 1];
        if s.read_exact(&mut role).is_err() {
            continue;
        }
        s.set_read_timeout(None)?;
        let _ = s.set_nodelay(true);
        match &role {
            b"S" => {
                // Register before acknowledging, so the publisher's first byte reaches it.
                let ack = s.try_clone().and_then(|mut c| c.write_all(b"K"));
                if ack.is_ok() {
                    lock(&subscribers).push(s);
                }
            }
            b"P" if !publishing.swap(true, Ordering::AcqRel) => {
                let subs = subscribers.clone();
                let publishing = publishing.clone();
                std::thread::spawn(move || {
                    if let Err(e) = copy_from(s, &subs) {
                        eprintln!("copy_relay: publisher: {e}");
                    }
                    // Publisher gone: end every subscriber's stream.
                    for sub in lock(&subs).drain(..) {
                        let _ = sub.shutdown(Shutdown::Both);
                    }
                    publishing.store(false, Ordering::Release);
                });
            }
            _ => {} // Unknown role or second publisher: close.
        }
    }
    Ok(())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Copies the publisher's bytes to every subscriber until the publisher closes.
fn copy_from(mut publisher: TcpStream, subs: &Mutex<Vec<TcpStream>>) -> io::Result<()> {
    publisher.write_all(b"K")?;
    let mut buf = vec![0u8; RELAY_BUFFER];
    loop {
        let n = publisher.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        let chunk = &buf[..n];
        // A subscriber that fails is dropped; the rest go on.
        lock(subs).retain_mut(|s| s.write_all(chunk).is_ok());
    }
}

// ---------------------------------------------------------------------------
// Load generator
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy)]
struct LoadResult {
    subs: usize,
    delivered_bytes: u64,
    published_bytes: u64,
    elapsed: Duration,
    relay_cpu: Option<f64>,
}

struct Row;

impl Row {
    const HEADER: &'static str = "subs  frame_bytes  fps   published_MB/s  delivered_MB/s  relay_cpu_s  relay_cpu_s_per_delivered_GB";
}

impl LoadResult {
    fn row(&self, a: LoadArgs) -> String {
        let secs = self.elapsed.as_secs_f64().max(1e-9);
        let fps = if a.fps == 0 {
            "max".to_owned()
        } else {
            a.fps.to_string()
        };
        let (cpu, per_gb) = match self.relay_cpu {
            Some(c) if self.delivered_bytes > 0 => (
                format!("{c:.2}"),
                format!("{:.3}", c / (self.delivered_bytes as f64 / 1e9)),
            ),
            Some(c) => (format!("{c:.2}"), "-".into()),
            None => ("-".into(), "-".into()),
        };
        format!(
            "{:<5} {:<12} {:<5} {:<15.1} {:<15.1} {:<12} {}",
            self.subs,
            a.frame_bytes,
            fps,
            self.published_bytes as f64 / 1e6 / secs,
            self.delivered_bytes as f64 / 1e6 / secs,
            cpu,
            per_gb
        )
    }
}

/// CPU seconds (user + system, all threads) a process has used so far.
fn process_cpu_seconds(pid: u32) -> io::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // stat(5): utime is field 14, stime 15; `rest` starts at field 3.
    let ticks = |i: usize| -> io::Result<u64> {
        fields.get(i).and_then(|f| f.parse().ok()).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                "unexpected /proc/PID/stat format",
            )
        })
    };
    let total = ticks(11)? + ticks(12)?;
    Ok(total as f64 / clock_ticks_per_second())
}

fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf only reads a configuration value.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz > 0 { hz as f64 } else { 100.0 }
}

fn connect(addr: SocketAddr, role: &[u8; 1]) -> io::Result<TcpStream> {
    let mut s = TcpStream::connect_timeout(&addr, LOAD_IO_TIMEOUT)?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(LOAD_IO_TIMEOUT))?;
    s.set_write_timeout(Some(LOAD_IO_TIMEOUT))?;
    s.write_all(role)?;
    let mut ack = [0u8; 1];
    s.read_exact(&mut ack)?;
    if &ack != b"K" {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "relay did not acknowledge",
        ));
    }
    Ok(s)
}

fn load_run(addr: SocketAddr, relay_pid: Option<u32>, a: LoadArgs) -> io::Result<LoadResult> {
    let delivered = Arc::new(AtomicU64::new(0));
    let mut readers = Vec::with_capacity(a.subs);
    for _ in 0..a.subs {
        let mut s = connect(addr, b"S")?;
        let delivered = delivered.clone();
        readers.push(std::thread::spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        delivered.fetch_add(n as u64, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    let mut publisher = connect(addr, b"P")?;
    let published = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (published, stop) = (published.clone(), stop.clone());
        let frame: Vec<u8> = (0..a.frame_bytes).map(|i| i as u8).collect();
        let period = (a.fps > 0).then(|| Duration::from_secs_f64(1.0 / f64::from(a.fps)));
        std::thread::spawn(move || -> io::Result<()> {
            let start = Instant::now();
            let mut sent_frames = 0u32;
            while !stop.load(Ordering::Relaxed) {
                if let Some(p) = period {
                    let due = start + p * sent_frames;
                    let now = Instant::now();
                    if due > now {
                        std::thread::sleep(due - now);
                    }
                }
                publisher.write_all(&frame)?;
                published.fetch_add(frame.len() as u64, Ordering::Relaxed);
                sent_frames = sent_frames.wrapping_add(1);
            }
            publisher.shutdown(Shutdown::Write)
        })
    };

    let seconds = a.seconds.max(0.1);
    std::thread::sleep(Duration::from_secs_f64((seconds / 4.0).min(1.0)));
    let cpu0 = relay_pid.map(process_cpu_seconds).transpose()?;
    let (d0, p0, t0) = (
        delivered.load(Ordering::Relaxed),
        published.load(Ordering::Relaxed),
        Instant::now(),
    );
    std::thread::sleep(Duration::from_secs_f64(seconds));
    let (d1, p1, elapsed) = (
        delivered.load(Ordering::Relaxed),
        published.load(Ordering::Relaxed),
        t0.elapsed(),
    );
    let cpu1 = relay_pid.map(process_cpu_seconds).transpose()?;

    stop.store(true, Ordering::Relaxed);
    let wres = writer
        .join()
        .map_err(|_| io::Error::other("publisher thread panicked"))?;
    for r in readers {
        let _ = r.join();
    }
    wres?;
    Ok(LoadResult {
        subs: a.subs,
        delivered_bytes: d1 - d0,
        published_bytes: p1 - p0,
        elapsed,
        relay_cpu: cpu0.zip(cpu1).map(|(a, b)| b - a),
    })
}

// ---------------------------------------------------------------------------
// Bench: relay child per configuration
// ---------------------------------------------------------------------------

struct RelayChild(Child);

impl Drop for RelayChild {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_relay() -> io::Result<(RelayChild, SocketAddr)> {
    let exe = std::env::current_exe()?;
    let mut child = Command::new(exe)
        .args(["relay", "--listen", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| io::Error::other("no stdout"))?;
    let child = RelayChild(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| io::Error::other(format!("unexpected relay output `{}`", line.trim())))?;
    Ok((child, addr))
}

fn bench(counts: &[usize], a: LoadArgs) -> io::Result<()> {
    println!(
        "copy relay baseline: {} s measured per row, {} cores, relay = 1 blocking copier thread",
        a.seconds,
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    println!("{}", Row::HEADER);
    for &subs in counts {
        let (child, addr) = spawn_relay()?;
        let args = LoadArgs { subs, ..a };
        let r = load_run(addr, Some(child.0.id()), args)?;
        println!("{}", r.row(args));
        drop(child);
    }
    Ok(())
}
