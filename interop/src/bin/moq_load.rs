//! `moq_load`: fan-out load through a relay with the published moq-net 0.3.18
//! client on both ends, so the figures are not flattered by skiff's own client.
//!
//! For each relay (`skiff-relay serve`, the published `moq-relay`, or both in
//! turn) and each subscriber count N, it starts the relay as a child process on
//! a free loopback port, connects one moq-net publisher and N moq-net
//! subscribers over QMux over TCP (qmux's TCP transport as it is: this tool sets
//! no socket option on the clients' sockets) or, with `--transport quic`, over
//! raw QUIC (moq-tokio's noq client dialing `moql://127.0.0.1:PORT/anon`, ALPN
//! `moq-lite-05`, each client on its own UDP socket, the relay's certificate
//! pinned by the SHA-256 its TCP port serves at `/certificate.sha256`),
//! publishes fixed-size frames at
//! `--fps` (or, with `max`, as fast as the slowest live subscriber reads them,
//! at most `--window` frames ahead), waits until every subscriber has read a
//! frame, lets `--warmup` pass, and measures over `--seconds`. `--relay
//! direct` runs the same with no relay: the publisher's process serves the
//! subscribers with moq-net's own server (one hop instead of two), the floor
//! the published client and server set on this machine. It measures:
//!
//! - delivered MB/s: payload bytes of frames read by all subscribers, each
//!   frame's length and its sequence byte checked; the delivered ratio is
//!   frames read over frames published × live subscribers;
//! - latency publish → complete frame at the subscriber (the publisher writes
//!   its send time, nanoseconds since an epoch of this process, into the
//!   payload's first 8 bytes): p50, p99, max;
//! - the relay's CPU (utime + stime of `/proc/PID/stat`) over the window, per
//!   delivered GB and as a share of one core, and the part of it spent in
//!   the kernel (`sys_%`, stime over utime + stime: on loopback the sockets'
//!   send path, receivers' input included);
//! - the relay's RSS (`VmRSS`) before the subscribers and at the end of the
//!   window, and the growth per live subscriber;
//! - this tool's own CPU share, so a reader sees how much of the machine the
//!   clients took.
//!
//! With `--hops N` (over TCP) the relay is a chain of N relays of one kind,
//! each dialing the one before with `--cluster-connect tcp://ADDR/` and its
//! own `--cluster-id`: the publisher on the first, the subscribers on the last
//! (`--spread`: spread over all), the relay columns summing every relay's CPU
//! and RSS. `--kill` (over TCP) runs a ring of five relays of one kind, A-B-C
//! the shortest path and A-D-E-C the other, the publisher on A and the
//! subscribers on C, sends B SIGKILL a second into the measured window and
//! prints each subscriber's time from the kill to its first frame after the
//! gap (subscribers whose subscription ends subscribe again, and are counted).
//!
//! With `--broadcasts N` the publisher announces N broadcasts (`load/0` to
//! `load/N-1`), each on a session of its own (as N cameras would) with one
//! track paced at `--fps` on its own tick (the ticks spread over the frame
//! interval) and its group boundaries spread over a group's frames (unless
//! `--aligned-groups`), and subscriber i reads broadcast i mod N.
//! `--hang` makes them hang broadcasts a recording relay stores (`skiff-relay
//! --record`): each gets a `catalog.json` track naming one H.264 rendition
//! (1280x720, with the avcC record of skiff's test card) and its frames become
//! hang legacy frames, a presentation time then one length-prefixed NAL unit
//! (an IDR slice heading each group, non-IDR slices after it) whose body is
//! the timing header and filler, not a decodable picture; every frame keeps
//! `--frame-bytes`. The presentation times advance at `--content-fps`
//! (default `--fps`): `--fps 1800 --content-fps 30` stores an hour of 30 fps
//! video in a minute. After such a row the tool prints what the relay
//! wrote to disk over the window (`/proc/PID/io` `write_bytes` and `wchar`)
//! against the media published, and, with `--relay-metrics`, what its
//! recorder counted (`skiff_relay_record_*`).
//!
//! The clients run on one multi-threaded tokio runtime with `--client-threads`
//! workers (default 2). Subscribers that fail to connect or subscribe are
//! counted and printed; they never abort the run.
//!
//! ```text
//! cargo build --release -p skiff-relay --bin skiff-relay
//! cargo build --release -p skiff-interop --bin moq_load
//! target/release/moq_load --relay both --subscribers 10 --frame-bytes 16384 --fps 60
//! target/release/moq_load --relay moq-relay --transport quic --moq-relay-runtime io-uring
//! target/release/moq_load --relay both --hops 3 --subscribers 10 --fps 60
//! target/release/moq_load --relay both --kill --subscribers 10 --fps 60 --seconds 8
//! target/release/moq_load --relay skiff --broadcasts 100 --hang --subscribers 100 \
//!     --frame-bytes 8333 --fps 30 --group-frames 60 \
//!     --skiff-args="--max-connections-per-ip 100000 --record anon/load/** --record-dir /tmp/rec"
//! ```
//!
//! Over QUIC, skiff-relay is started with `--skiff-quic-args` (default
//! `--tls-generate localhost`) and moq-relay with `--listen` (UDP) and
//! `--web-http-listen` (which serves the fingerprint) on one port number: on
//! its default runtime with `--listen-tls-generate localhost`, and with
//! `--moq-relay-runtime workers|io-uring` on `--runtime-workers N` (plus
//! `--runtime-io-uring`) with an ECDSA P-256 certificate this tool writes to a
//! temporary directory, since those runtimes take certificate files only.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use skiff_interop::ALPN_LITE_05;
use skiff_interop::reference::qmux_tcp;
use skiff_testkit::every::Every;

/// Broadcast path the publisher announces.
const BROADCAST: &str = "load";
/// Track name of the load.
const TRACK: &str = "video";
/// SETUP path of every client (the root with anonymous access on both relays).
const PATH: &str = "/anon";
/// Payload header: send time (ns since the epoch), then the frame's sequence number.
const HEADER: usize = 16;
/// With `--hang`, the bytes before the header in a frame's access unit: the
/// NAL unit's 4-byte length and its 1-byte NAL header.
const NAL_HEAD: usize = 5;
/// With `--hang`, the picture size the catalog names.
const HANG_WIDTH: usize = 1280;
const HANG_HEIGHT: usize = 720;
/// Bound on one client's connect and handshake.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a client keeps a group nobody reads when its cache is bounded
/// (`--client-cache-kib`).
const CLIENT_CACHE_EXPIRY: Duration = Duration::from_secs(2);

/// Which relay a row runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Which {
    /// `skiff-relay serve`.
    Skiff,
    /// The published moq-relay.
    MoqRelay,
    /// Both, alternating, in one invocation.
    Both,
    /// No relay: the publisher's process serves the subscribers itself, one
    /// hop of moq-net's own client and server, for the floor the clients set.
    Direct,
}

impl Which {
    /// The row's name in the table.
    fn name(self) -> &'static str {
        match self {
            Which::Skiff => "skiff-relay",
            Which::MoqRelay => "moq-relay",
            Which::Both => "both",
            Which::Direct => "direct",
        }
    }
}

/// The clients' transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Link {
    /// QMux over TCP (qmux-01), the relay's TCP port.
    Tcp,
    /// moq-lite-05 over raw QUIC (`moql://`), the relay's UDP port.
    Quic,
}

/// moq-relay's QUIC runtime (`--moq-relay-runtime`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum MoqRuntime {
    /// Its default: QUIC on the shared multi-threaded tokio runtime.
    Tokio,
    /// `--runtime-workers N`: single-threaded tokio workers, one socket each.
    Workers,
    /// `--runtime-workers N --runtime-io-uring`: the same workers on io_uring.
    IoUring,
}

/// How a client reaches the relay.
#[derive(Clone)]
enum Dial {
    /// QMux over TCP to this address.
    Tcp(SocketAddr),
    /// moq-lite-05 over raw QUIC to this `moql://` URL, pinning the
    /// certificate with this SHA-256 (hex).
    Quic { url: url::Url, fingerprint: String },
}

/// Where the publisher sends its broadcast.
enum Target {
    /// A relay, dialled as a client.
    Relay(Dial),
    /// A listener the publisher serves subscribers on itself.
    Serve(tokio::net::TcpListener),
}

#[derive(Debug, Parser)]
#[command(
    about = "Fan-out load through skiff-relay and moq-relay with the published moq-net client."
)]
struct Cli {
    /// The relay(s) to measure, comma-separated (`both` is skiff and moq-relay).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "both")]
    relay: Vec<Which>,
    /// Subscriber counts, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "10")]
    subscribers: Vec<usize>,
    /// Bytes per frame (at least 17: the header and a check byte).
    #[arg(long, default_value_t = 16384)]
    frame_bytes: usize,
    /// Frames per second, or `max`: as fast as the slowest live subscriber reads.
    #[arg(long, default_value = "60")]
    fps: String,
    /// Frames per group.
    #[arg(long, default_value_t = 30)]
    group_frames: u64,
    /// Measured seconds per row.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Seconds between every subscriber being live and the measured window.
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// With `--fps max`: most frames the publisher runs ahead of the slowest live subscriber.
    #[arg(long, default_value_t = 8)]
    window: u64,
    /// Rounds: each runs every (subscriber count, relay) once, relays alternating.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// The skiff-relay binary [default: `skiff-relay` next to this one].
    #[arg(long)]
    skiff_relay: Option<PathBuf>,
    /// Worker threads of skiff-relay (`--threads`).
    #[arg(long, default_value_t = 1)]
    skiff_threads: usize,
    /// Extra flags for `skiff-relay serve`, space-separated (write
    /// `--skiff-args=...`). The default lifts the per-address connection limit
    /// (256 per worker), since every client here comes from 127.0.0.1.
    #[arg(
        long,
        allow_hyphen_values = true,
        default_value = "--max-connections-per-ip 100000"
    )]
    skiff_args: String,
    /// Further flags for `skiff-relay serve` with `--transport quic`,
    /// space-separated (write `--skiff-quic-args=...`): its certificate.
    #[arg(
        long,
        allow_hyphen_values = true,
        default_value = "--tls-generate localhost"
    )]
    skiff_quic_args: String,
    /// The clients' transport: `tcp` (QMux) or `quic` (moq-lite-05 over raw
    /// QUIC, the relay's certificate fingerprint pinned).
    #[arg(long, value_enum, default_value = "tcp")]
    transport: Link,
    /// moq-relay's QUIC runtime with `--transport quic`: `tokio` (its
    /// default, a generated certificate), `workers` (`--runtime-workers`) or
    /// `io-uring` (`--runtime-workers --runtime-io-uring`, which needs a build
    /// with its `io-uring` feature, as `.ci/moq-relay` makes); the last two
    /// get certificate files this tool writes.
    #[arg(long, value_enum, default_value = "tokio")]
    moq_relay_runtime: MoqRuntime,
    /// Workers of moq-relay's `workers` and `io-uring` runtimes.
    #[arg(long, default_value_t = 1)]
    moq_relay_workers: usize,
    /// The moq-relay binary [default: $MOQ_RELAY, then ~/.cache/skiff/moq-relay-0.17.10/bin/moq-relay].
    #[arg(long)]
    moq_relay: Option<PathBuf>,
    /// Worker threads of the clients' tokio runtime.
    #[arg(long, default_value_t = 2)]
    client_threads: usize,
    /// Subscribers connecting at once.
    #[arg(long, default_value_t = 32)]
    connect_parallel: usize,
    /// While the subscribers connect, print every this many seconds (to
    /// stderr) how many are live and how many failed, with the relay's
    /// open descriptors and RSS, so a reader sees the connection rate over
    /// time; 0: no such lines.
    #[arg(long, default_value_t = 0.0)]
    progress: f64,
    /// After each row, print every subscriber's median latency (ms) in the
    /// order they connected: a relay that serves them in a fixed order shows
    /// as a rising line.
    #[arg(long)]
    per_subscriber: bool,
    /// Seconds the subscribers get to read their first frame.
    #[arg(long, default_value_t = 60.0)]
    live_timeout: f64,
    /// Each client's cache of groups in KiB (the capacity of its origin's
    /// moq-net cache pool, with a 2 s idle expiry), or 0 for moq-net's
    /// default pool, under which each client here kept every frame it read
    /// for as long as we watched (a minute). The default holds two groups of
    /// the largest frames measured, so a thousand clients in one process do
    /// not fault in fresh memory for every frame; nothing on the wire changes.
    #[arg(long, default_value_t = 4096)]
    client_cache_kib: u64,
    /// Append every frame read while measuring to this file, one line each:
    /// the publisher's send time and the time the subscriber had the whole
    /// frame, both `CLOCK_MONOTONIC` nanoseconds, the clock of
    /// `benches/timeline`'s logs (`timeline-split --marks` lines them up with
    /// the socket calls).
    #[arg(long)]
    marks: Option<PathBuf>,
    /// Count the relay's system calls over the measured window with `perf
    /// stat -p` (all of them, and the socket and io_uring calls by name)
    /// and print them per delivered GB. Needs `perf` and the right to trace
    /// the relay (root, or a low `perf_event_paranoid`).
    #[arg(long)]
    relay_syscalls: bool,
    /// skiff-relay's metrics address (give the relay `--metrics ADDR`
    /// through `--skiff-args`): the `skiff_relay_quic_*` counters' change
    /// over the measured window is printed per delivered GB and per call.
    #[arg(long)]
    relay_metrics: Option<SocketAddr>,
    /// Relays in a chain (over TCP only): relay k dials relay k-1 with
    /// `--cluster-connect tcp://ADDR/` and `--cluster-id k+1`; the publisher
    /// is on the first, the subscribers on the last (or on all, `--spread`).
    /// The relay columns sum every relay's CPU and RSS; a line after the row
    /// gives each relay's share.
    #[arg(long, default_value_t = 1)]
    hops: usize,
    /// With `--hops`: subscriber i on relay i mod hops instead of all on the
    /// last.
    #[arg(long)]
    spread: bool,
    /// Recovery after a node is killed (over TCP only): a ring of five
    /// relays of one kind, A-B-C the shortest path and A-D-E-C the other; the
    /// publisher on A, the subscribers on C. A second into the measured
    /// window B gets SIGKILL; the row is followed by the time from the kill to
    /// each subscriber's first frame after its gap. A subscriber whose
    /// subscription ends subscribes again on the same session.
    #[arg(long)]
    kill: bool,
    /// Broadcasts the publisher announces: `load` alone, or `load/0` to
    /// `load/N-1`, each one track at `--fps` (ticks spread over the frame
    /// interval) on a session of its own; subscriber i reads broadcast i mod
    /// N. Above one, `--fps` must be a number.
    #[arg(long, default_value_t = 1)]
    broadcasts: usize,
    /// Publish hang broadcasts, which `skiff-relay --record` stores: a
    /// `catalog.json` track naming one H.264 rendition (1280x720, an avcC
    /// record) and video frames in hang's legacy container (a presentation
    /// time, then one length-prefixed NAL unit: an IDR slice first in each
    /// group, non-IDR slices after; a filler body, not a decodable picture),
    /// each `--frame-bytes` long. Prints the relay's disk writes per byte of
    /// media published.
    #[arg(long)]
    hang: bool,
    /// With `--hang`: the frame rate the presentation times advance at
    /// (frame n at n / RATE s) [default: `--fps`]. Above `--fps` the content
    /// runs faster than wall time: `--fps 1800 --content-fps 30` stores an
    /// hour of 30 fps video in a minute.
    #[arg(long)]
    content_fps: Option<u32>,
    /// With `--broadcasts`: every broadcast's groups start on the same frame
    /// number. Without it broadcast i's first group is i/N of a group
    /// shorter, so group ends (and a recorder's segment writes) spread over
    /// the group's duration as independent cameras' would.
    #[arg(long)]
    aligned_groups: bool,
}

fn main() {
    let cli = Cli::parse();
    if let Err(e) = run(&cli) {
        eprintln!("moq_load: error: {e}");
        std::process::exit(1);
    }
}

// ---------------------------------------------------------------------------
// Relays as child processes
// ---------------------------------------------------------------------------

/// How long a relay gets to start listening.
const STARTUP: Duration = Duration::from_secs(15);

/// A relay child, killed when dropped.
struct RelayChild {
    child: Child,
    /// Its TCP port (and, over QUIC, its UDP port of the same number).
    addr: SocketAddr,
    /// Over QUIC: the SHA-256 (hex) of the certificate it serves.
    fingerprint: Option<String>,
    /// A directory of certificate files written for it, removed with it.
    files: Option<PathBuf>,
}

impl RelayChild {
    /// How clients reach it over `link`.
    fn dial(&self, link: Link) -> Result<Dial, String> {
        match link {
            Link::Tcp => Ok(Dial::Tcp(self.addr)),
            Link::Quic => {
                let url = format!("moql://{}{PATH}", self.addr);
                let url = url::Url::parse(&url).map_err(|e| format!("{url}: {e}"))?;
                let fingerprint = self
                    .fingerprint
                    .clone()
                    .ok_or("the relay's certificate fingerprint is unknown")?;
                Ok(Dial::Quic { url, fingerprint })
            }
        }
    }

    /// An error if the child has exited (it said why on stderr).
    fn check_running(&mut self, name: &str) -> Result<(), String> {
        match self.child.try_wait() {
            Ok(Some(status)) => Err(format!("{name} exited at startup ({status})")),
            _ => Ok(()),
        }
    }
}

impl Drop for RelayChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(dir) = &self.files {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn skiff_path(cli: &Cli) -> Result<PathBuf, String> {
    if let Some(p) = &cli.skiff_relay {
        return Ok(p.clone());
    }
    let exe = std::env::current_exe().map_err(|e| format!("current exe: {e}"))?;
    Ok(exe.with_file_name("skiff-relay"))
}

fn moq_relay_path(cli: &Cli) -> Option<PathBuf> {
    if let Some(p) = &cli.moq_relay {
        return Some(p.clone());
    }
    if let Some(p) = std::env::var_os("MOQ_RELAY") {
        return Some(PathBuf::from(p));
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    let p = cache.join("skiff/moq-relay-0.17.10/bin/moq-relay");
    p.exists().then_some(p)
}

fn start_skiff(cli: &Cli, bin: &Path, extra: &[String]) -> Result<RelayChild, String> {
    let mut cmd = Command::new(bin);
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--log", "error"])
        .args(["--threads", &cli.skiff_threads.to_string()])
        .args(cli.skiff_args.split_whitespace())
        .args(extra);
    if cli.transport == Link::Quic {
        cmd.args(cli.skiff_quic_args.split_whitespace());
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("spawn {}: {e}", bin.display()))?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut line = String::new();
    let read = BufReader::new(stdout).read_line(&mut line);
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .and_then(|a| a.parse().ok());
    let mut relay = RelayChild {
        child,
        addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        fingerprint: None,
        files: None,
    };
    match (read, addr) {
        (Ok(_), Some(addr)) => relay.addr = addr,
        _ => {
            return Err(format!(
                "skiff-relay did not say where it listens: {line:?}"
            ));
        }
    }
    if cli.transport == Link::Quic {
        let (fingerprint, _) = wait_fingerprint(&mut relay, "skiff-relay")?;
        relay.fingerprint = Some(fingerprint.ok_or_else(|| {
            format!(
                "skiff-relay has no certificate fingerprint at http://{}/certificate.sha256",
                relay.addr
            )
        })?);
    }
    Ok(relay)
}

/// A loopback port free on both TCP and UDP.
fn free_port() -> Result<u16, String> {
    for _ in 0..20 {
        let tcp = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("free port: {e}"))?;
        let addr = tcp.local_addr().map_err(|e| format!("free port: {e}"))?;
        if std::net::UdpSocket::bind(addr).is_ok() {
            return Ok(addr.port());
        }
    }
    Err("no loopback port free on both TCP and UDP".into())
}

fn start_moq_relay(cli: &Cli, bin: &Path, extra: &[String]) -> Result<RelayChild, String> {
    let port = free_port()?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let at = addr.to_string();
    let mut cmd = Command::new(bin);
    let mut files = None;
    let mut local_fingerprint = None;
    match cli.transport {
        Link::Tcp => {
            cmd.args(["--listen-tcp-bind", &at]);
        }
        Link::Quic => {
            // QUIC on UDP and the web listener, which serves the certificate's
            // fingerprint, on TCP: one port number, as skiff-relay listens.
            cmd.args(["--listen", &at, "--web-http-listen", &at]);
            match cli.moq_relay_runtime {
                MoqRuntime::Tokio => {
                    cmd.args(["--listen-tls-generate", "localhost"]);
                }
                runtime => {
                    let (dir, fingerprint) = write_certificate(port)?;
                    cmd.arg("--listen-tls-cert")
                        .arg(dir.join("cert.pem"))
                        .arg("--listen-tls-key")
                        .arg(dir.join("key.pem"))
                        .args(["--runtime-workers", &cli.moq_relay_workers.to_string()]);
                    if runtime == MoqRuntime::IoUring {
                        cmd.arg("--runtime-io-uring");
                    }
                    files = Some(dir);
                    local_fingerprint = Some(fingerprint);
                }
            }
        }
    }
    let spawned = cmd
        .args(["--auth-public", "**", "--log-level", "error"])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn();
    let child = match spawned {
        Ok(child) => child,
        Err(e) => {
            if let Some(dir) = &files {
                let _ = std::fs::remove_dir_all(dir);
            }
            return Err(format!("spawn {}: {e}", bin.display()));
        }
    };
    let mut relay = RelayChild {
        child,
        addr,
        fingerprint: None,
        files,
    };
    if cli.transport == Link::Tcp {
        let deadline = Instant::now() + STARTUP;
        while Instant::now() < deadline {
            relay.check_running("moq-relay")?;
            if TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_ok() {
                return Ok(relay);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        return Err(format!("moq-relay did not listen on {addr}"));
    }
    let (served, status) = wait_fingerprint(&mut relay, "moq-relay")?;
    relay.fingerprint = match (served, local_fingerprint) {
        (Some(served), Some(local)) if served != local => {
            return Err(format!(
                "moq-relay serves fingerprint {served}, its certificate file has {local}"
            ));
        }
        (Some(fingerprint), _) | (None, Some(fingerprint)) => Some(fingerprint),
        (None, None) => {
            return Err(format!(
                "moq-relay answered {status} at http://{addr}/certificate.sha256"
            ));
        }
    };
    Ok(relay)
}

/// Waits until the relay's TCP port answers `GET /certificate.sha256` (over
/// plain HTTP, as moq-relay's web listener serves it, or over TLS, as a port
/// with a certificate serves it), and returns the fingerprint it served (None
/// if it answered something else than 200) and the HTTP status. Over TLS the
/// answer must be the SHA-256 of the certificate the handshake showed.
fn wait_fingerprint(relay: &mut RelayChild, name: &str) -> Result<(Option<String>, u16), String> {
    let deadline = Instant::now() + STARTUP;
    let url = format!("http(s)://{}/certificate.sha256", relay.addr);
    loop {
        relay.check_running(name)?;
        match fetch_fingerprint(relay.addr) {
            Ok(Answer {
                status: 200,
                body,
                leaf,
            }) => {
                let hex = body.trim().to_ascii_lowercase();
                if let Err(e) = moq_tokio::tls::parse_fingerprint(&hex) {
                    return Err(format!(
                        "{name}'s {url} is not a SHA-256 in hex ({e}): {body:?}"
                    ));
                }
                return match leaf {
                    Some(leaf) if leaf != hex => Err(format!(
                        "{name}'s {url} says {hex}, its TLS certificate's SHA-256 is {leaf}"
                    )),
                    _ => Ok((Some(hex), 200)),
                };
            }
            Ok(answer) => return Ok((None, answer.status)),
            Err(e) if Instant::now() > deadline => {
                return Err(format!("{name} did not answer {url}: {e}"));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// An answer to `GET /certificate.sha256`.
struct Answer {
    /// The HTTP status code.
    status: u16,
    /// The body (at most 64 KiB).
    body: String,
    /// Over TLS: the SHA-256 (hex) of the leaf certificate the handshake showed.
    leaf: Option<String>,
}

/// `GET /certificate.sha256` on `addr`, over plain HTTP first, then over TLS
/// (no verification: what it fetches is checked against the handshake's
/// certificate instead).
fn fetch_fingerprint(addr: SocketAddr) -> std::io::Result<Answer> {
    const PATH: &str = "/certificate.sha256";
    let connect = || -> std::io::Result<TcpStream> {
        let stream = TcpStream::connect_timeout(&addr, Duration::from_millis(200))?;
        stream.set_read_timeout(Some(Duration::from_secs(2)))?;
        stream.set_write_timeout(Some(Duration::from_secs(2)))?;
        Ok(stream)
    };
    let plain = connect().and_then(|mut tcp| http_get(&mut tcp, addr, PATH));
    let plain_err = match plain {
        Ok((status, body)) => {
            return Ok(Answer {
                status,
                body,
                leaf: None,
            });
        }
        Err(e) => e,
    };
    let leaf = Arc::new(Mutex::new(None));
    let verifier = AnyCertificate {
        provider: moq_tokio::crypto::provider(),
        leaf: leaf.clone(),
    };
    let tls = || -> std::io::Result<(u16, String)> {
        let mut config =
            moq_tokio::rustls::ClientConfig::builder_with_provider(verifier.provider.clone())
                .with_safe_default_protocol_versions()
                .map_err(std::io::Error::other)?
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(verifier))
                .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let name = moq_tokio::rustls::pki_types::ServerName::try_from("localhost")
            .map_err(std::io::Error::other)?;
        let conn = moq_tokio::rustls::ClientConnection::new(Arc::new(config), name)
            .map_err(std::io::Error::other)?;
        let mut stream = moq_tokio::rustls::StreamOwned::new(conn, connect()?);
        http_get(&mut stream, addr, PATH)
    };
    let (status, body) =
        tls().map_err(|e| std::io::Error::other(format!("http: {plain_err}; https: {e}")))?;
    let der = leaf.lock().ok().and_then(|mut l| l.take());
    let leaf = match der {
        Some(der) => Some(sha256_hex(&der).map_err(std::io::Error::other)?),
        None => None,
    };
    Ok(Answer { status, body, leaf })
}

/// A TLS certificate verifier that accepts any certificate whose handshake
/// signature verifies, and keeps the leaf's DER: how this tool reads a
/// self-signed relay's `/certificate.sha256` before it knows what to pin.
#[derive(Debug)]
struct AnyCertificate {
    provider: moq_tokio::crypto::Provider,
    leaf: Arc<Mutex<Option<Vec<u8>>>>,
}

impl moq_tokio::rustls::client::danger::ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        end_entity: &moq_tokio::rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[moq_tokio::rustls::pki_types::CertificateDer<'_>],
        _server_name: &moq_tokio::rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: moq_tokio::rustls::pki_types::UnixTime,
    ) -> Result<moq_tokio::rustls::client::danger::ServerCertVerified, moq_tokio::rustls::Error>
    {
        if let Ok(mut leaf) = self.leaf.lock() {
            *leaf = Some(end_entity.to_vec());
        }
        Ok(moq_tokio::rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &moq_tokio::rustls::pki_types::CertificateDer<'_>,
        dss: &moq_tokio::rustls::DigitallySignedStruct,
    ) -> Result<moq_tokio::rustls::client::danger::HandshakeSignatureValid, moq_tokio::rustls::Error>
    {
        moq_tokio::rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &moq_tokio::rustls::pki_types::CertificateDer<'_>,
        dss: &moq_tokio::rustls::DigitallySignedStruct,
    ) -> Result<moq_tokio::rustls::client::danger::HandshakeSignatureValid, moq_tokio::rustls::Error>
    {
        moq_tokio::rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<moq_tokio::rustls::SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// `GET path` over HTTP/1.1 on `stream` (to `host`): the status code and the
/// body (at most 64 KiB, read to the end of its `Content-Length` or of the
/// connection).
fn http_get(
    stream: &mut (impl std::io::Read + std::io::Write),
    host: SocketAddr,
    path: &str,
) -> std::io::Result<(u16, String)> {
    use std::io::{Error, ErrorKind};
    const LIMIT: usize = 64 * 1024;
    let bad = |what: &str| Error::new(ErrorKind::InvalidData, what.to_owned());
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )?;
    stream.flush()?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let (head_len, body_len) = loop {
        // A TLS peer that closes without close_notify ends the response too.
        let n = match stream.read(&mut chunk) {
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => 0,
            read => read?,
        };
        buf.extend_from_slice(chunk.get(..n).unwrap_or_default());
        let head_end = buf.windows(4).position(|w| w == b"\r\n\r\n");
        if let Some(end) = head_end {
            let head = String::from_utf8_lossy(buf.get(..end).unwrap_or_default()).into_owned();
            let length = head.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.trim()
                    .eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse::<usize>().ok())?
            });
            if length.is_some_and(|len| buf.len() >= end + 4 + len) || n == 0 {
                break (end + 4, length);
            }
        } else if n == 0 {
            return Err(bad("connection closed before the headers ended"));
        }
        if buf.len() > LIMIT {
            return Err(bad("response over 64 KiB"));
        }
    };
    let head = String::from_utf8_lossy(buf.get(..head_len).unwrap_or_default()).into_owned();
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return Err(bad("chunked response"));
    }
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| bad("no status line"))?;
    let body = buf.get(head_len..).unwrap_or_default();
    let body = body_len.and_then(|len| body.get(..len)).unwrap_or(body);
    Ok((status, String::from_utf8_lossy(body).into_owned()))
}

/// Writes a self-signed ECDSA P-256 certificate for `localhost` and its key
/// (`cert.pem`, `key.pem`) to a fresh temporary directory, and returns the
/// directory and the certificate's SHA-256 (hex).
fn write_certificate(port: u16) -> Result<(PathBuf, String), String> {
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()])
        .map_err(|e| format!("certificate: {e}"))?;
    let fingerprint = sha256_hex(certified.cert.der())?;
    let dir = std::env::temp_dir().join(format!("moq_load-{}-{port}", std::process::id()));
    let write = || -> std::io::Result<()> {
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("cert.pem"), certified.cert.pem())?;
        std::fs::write(dir.join("key.pem"), certified.signing_key.serialize_pem())
    };
    if let Err(e) = write() {
        let _ = std::fs::remove_dir_all(&dir);
        return Err(format!("{}: {e}", dir.display()));
    }
    Ok((dir, fingerprint))
}

/// SHA-256 of `data` in lower-case hex, from the crypto provider the QUIC
/// client verifies with.
fn sha256_hex(data: &[u8]) -> Result<String, String> {
    use moq_tokio::rustls::crypto::hash::HashAlgorithm;
    let provider = moq_tokio::crypto::provider();
    let hash = provider
        .cipher_suites
        .iter()
        .filter_map(|suite| suite.tls13())
        .map(|suite| suite.common.hash_provider)
        .find(|h| h.algorithm() == HashAlgorithm::SHA256)
        .ok_or("the crypto provider has no SHA-256")?;
    Ok(hash
        .hash(data)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

// ---------------------------------------------------------------------------
// /proc
// ---------------------------------------------------------------------------

/// CPU seconds of `pid` so far, all threads, in user and in system (kernel)
/// mode, or zeros if unreadable.
fn cpu_seconds(pid: u32) -> Cpu {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return Cpu::default();
    };
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // stat(5): utime is field 14 and stime 15; `rest` starts at field 3.
    let tick = |i: usize| -> u64 { fields.get(i).and_then(|f| f.parse().ok()).unwrap_or(0) };
    // /proc reports in USER_HZ, which the Linux ABI fixes at 100 per second.
    Cpu {
        user: tick(11) as f64 / 100.0,
        system: tick(12) as f64 / 100.0,
    }
}

/// CPU seconds a process spent, by mode.
#[derive(Clone, Copy, Default)]
struct Cpu {
    user: f64,
    system: f64,
}

impl Cpu {
    /// User and system seconds together.
    fn total(self) -> f64 {
        self.user + self.system
    }
}

/// `VmRSS` of `pid` in KiB, or 0 if unreadable.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// Bytes `pid` had the storage layer write (`write_bytes` of
/// `/proc/PID/io`, counted when pages are dirtied) and bytes it passed to
/// write calls (`wchar`), or zeros if unreadable.
fn io_written(pid: u32) -> (u64, u64) {
    let Ok(io) = std::fs::read_to_string(format!("/proc/{pid}/io")) else {
        return (0, 0);
    };
    let field = |key: &str| {
        io.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    (field("write_bytes:"), field("wchar:"))
}

// ---------------------------------------------------------------------------
// Shared counters
// ---------------------------------------------------------------------------

/// One subscriber's progress, written by its task, read by the measurer.
#[derive(Default)]
struct SubStat {
    /// It has read its first frame.
    live: AtomicBool,
    /// It stopped with an error (connect, subscribe or read).
    failed: AtomicBool,
    /// Frames read with the right length and check byte.
    frames: AtomicU64,
    /// Payload bytes of those frames.
    bytes: AtomicU64,
    /// Frames with a wrong length or check byte.
    bad: AtomicU64,
    /// Groups given up as old (a newer group started while one was being read).
    old: AtomicU64,
    /// Of those, the groups whose stream the relay reset with moq-lite's Old
    /// code outside the HTTP/3 error-code mapping moq-tokio's QUIC client reads
    /// codes through (see [`unmapped_old`]).
    unmapped_old: AtomicU64,
    /// Sequence number of the last frame read, plus one.
    next: AtomicU64,
    /// Latencies (µs) of frames read while measuring.
    latencies: Mutex<Vec<u32>>,
    /// Send and read times (ns since the epoch) and sequence numbers of
    /// frames read while measuring, kept only with `--marks` and `--kill`.
    reads: Mutex<Vec<(u64, u64, u64)>>,
    /// Subscriptions made again after one ended (`--kill`).
    resubscribed: AtomicU64,
    /// How the first subscription made again had ended (`--kill`).
    ended: Mutex<Option<String>>,
    /// Groups whose read failed with an error other than Old (`--kill`).
    group_errors: AtomicU64,
    /// The first of those errors.
    group_error: Mutex<Option<String>>,
    /// Why it failed, if it did.
    error: Mutex<Option<String>>,
}

/// State shared by the publisher, the subscribers and the measurer.
struct Shared {
    epoch: Instant,
    /// `CLOCK_MONOTONIC` at `epoch`, in nanoseconds.
    epoch_monotonic_ns: u64,
    /// Whether subscribers keep `SubStat::reads` (`--marks`, `--kill`).
    marks: bool,
    /// Whether a subscriber whose subscription ends subscribes again (`--kill`).
    resubscribe: bool,
    measuring: AtomicBool,
    stop: AtomicBool,
    /// Frames published so far.
    published: AtomicU64,
    subs: Vec<SubStat>,
    /// Wakes a publisher waiting for the slowest subscriber (`--fps max`).
    progress: tokio::sync::Notify,
    /// Each client's cache capacity in KiB, 0 for moq-net's default pool.
    cache_kib: u64,
    /// Broadcasts published (`--broadcasts`).
    broadcasts: usize,
    /// Frames are hang legacy frames (`--hang`).
    hang: bool,
}

impl Shared {
    fn now_ns(&self) -> u64 {
        nanos(self.epoch.elapsed())
    }

    /// The next sequence number the slowest live subscriber waits for.
    fn slowest(&self) -> Option<u64> {
        self.subs
            .iter()
            .filter(|s| s.live.load(Ordering::Relaxed) && !s.failed.load(Ordering::Relaxed))
            .map(|s| s.next.load(Ordering::Relaxed))
            .min()
    }
}

// ---------------------------------------------------------------------------
// Clients
// ---------------------------------------------------------------------------

type QmuxTransport = moq_tokio::transport::Session<qmux::Session>;

fn versions() -> Result<moq_net::Versions, String> {
    let v = moq_net::Version::from_alpn(ALPN_LITE_05).ok_or("moq-lite-05 unknown")?;
    Ok(moq_net::Versions::from(vec![v]))
}

fn origin(hop: u64, cache_kib: u64) -> Result<moq_net::origin::Producer, String> {
    let hop = moq_net::Hop::new(hop).map_err(|e| format!("hop: {e}"))?;
    let mut config = moq_net::origin::Config::new(hop);
    if cache_kib > 0 {
        config.pool = moq_net::cache::Pool::new(
            moq_net::cache::Config::default()
                .with_capacity(cache_kib.saturating_mul(1024))
                .with_expiry(CLIENT_CACHE_EXPIRY),
        );
    }
    Ok(moq_tokio::origin::spawn_config(config))
}

/// The name of broadcast `i` of `n`: [`BROADCAST`] alone, else `load/i`.
fn broadcast_name(i: usize, n: usize) -> String {
    if n <= 1 {
        BROADCAST.to_owned()
    } else {
        format!("{BROADCAST}/{i}")
    }
}

/// The hang catalog of every `--hang` broadcast: one H.264 rendition,
/// track [`TRACK`], with the avcC record of skiff's test card at
/// [`HANG_WIDTH`]x[`HANG_HEIGHT`] and `fps`.
fn hang_catalog(fps: u32) -> Result<Vec<u8>, String> {
    use skiff_core::hang::testcard::{CATALOG_MAX_LEN, TestCard};
    let card =
        TestCard::new(HANG_WIDTH, HANG_HEIGHT, fps).map_err(|e| format!("catalog: {e:?}"))?;
    let mut json = [0u8; CATALOG_MAX_LEN];
    let len = card
        .catalog(TRACK, &mut json)
        .map_err(|e| format!("catalog: {e:?}"))?;
    Ok(json[..len].to_vec())
}

/// Writes frame `seq` of a `--hang` track into `payload` (`frame_bytes`
/// long): the legacy prefix for `pts_us`, then one NAL unit filling the rest
/// (IDR when `key`); returns where the timing header goes, or `None` if the
/// frame is too short for it.
fn hang_frame(payload: &mut [u8], pts_us: u64, key: bool) -> Option<usize> {
    use skiff_core::hang::{avc, frame};
    let prefix = frame::encode_prefix(pts_us, payload).ok()?;
    let nal_len = payload.len().checked_sub(prefix + 4)?;
    if nal_len < 1 + HEADER + 1 {
        return None;
    }
    payload
        .get_mut(prefix..prefix + 4)?
        .copy_from_slice(&u32::try_from(nal_len).ok()?.to_be_bytes());
    // nal_ref_idc 3 for the IDR slice, 2 for the others.
    *payload.get_mut(prefix + 4)? = if key {
        (3 << 5) | avc::NAL_IDR
    } else {
        (2 << 5) | avc::NAL_SLICE
    };
    Some(prefix + NAL_HEAD)
}

/// Where the timing header of a received frame starts: 0, or with `--hang`
/// after the legacy prefix and the NAL unit's length and header.
fn header_offset(payload: &[u8], hang: bool) -> Option<usize> {
    if !hang {
        return Some(0);
    }
    let (_, au) = skiff_core::hang::frame::decode(payload).ok()?;
    Some(payload.len() - au.len() + NAL_HEAD)
}

/// A client's session, closed when its task ends.
enum Session {
    /// QMux over TCP.
    Tcp(moq_net::Session),
    /// Raw QUIC: moq-tokio's connection and the client that owns its endpoint.
    Quic {
        connection: moq_tokio::Connection,
        client: Box<moq_tokio::Client>,
    },
}

impl Session {
    /// Closes the session (and over QUIC the client's endpoint), a second at
    /// most for each.
    async fn close(self) {
        let grace = Duration::from_secs(1);
        match self {
            Session::Tcp(session) => {
                let _ = tokio::time::timeout(grace, session.close()).await;
            }
            Session::Quic { connection, client } => {
                let _ = tokio::time::timeout(grace, connection.close()).await;
                let _ = tokio::time::timeout(grace, (*client).close()).await;
            }
        }
    }
}

/// Sets up a moq-lite session with the relay publishing or subscribing `origin`.
async fn connect(
    dial: &Dial,
    origin: &moq_net::origin::Producer,
    publish: bool,
) -> Result<Session, String> {
    match dial {
        Dial::Tcp(addr) => connect_tcp(*addr, origin, publish).await.map(Session::Tcp),
        Dial::Quic { url, fingerprint } => connect_quic(url, fingerprint, origin, publish).await,
    }
}

/// Dials `url` with moq-tokio's QUIC client (its noq transport and its
/// default QUIC settings) from a UDP socket of its own, pinning the
/// certificate whose SHA-256 is `fingerprint`, once (no redial), offering
/// moq-lite-05 only.
async fn connect_quic(
    url: &url::Url,
    fingerprint: &str,
    origin: &moq_net::origin::Producer,
    publish: bool,
) -> Result<Session, String> {
    let version = moq_net::Version::from_alpn(ALPN_LITE_05).ok_or("moq-lite-05 unknown")?;
    let mut config = moq_tokio::connect::Config::default();
    config.bind = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
    config.timeout = CONNECT_TIMEOUT;
    config.once = Some(true);
    config.version = vec![version];
    config.tls.fingerprint = vec![fingerprint.to_owned()];
    let client = config
        .init(moq_tokio::quic::Config::default())
        .map_err(|e| format!("quic client: {e}"))?;
    let client = if publish {
        client.with_publisher(origin)
    } else {
        client.with_subscriber(origin.clone())
    };
    let connection =
        tokio::time::timeout(CONNECT_TIMEOUT, client.connect(url.clone()).established())
            .await
            .map_err(|_| "quic connect timed out".to_owned())?
            .map_err(|e| format!("quic connect: {e}"))?;
    Ok(Session::Quic {
        connection,
        client: Box::new(client),
    })
}

/// Dials `addr` with qmux's TCP client (moq-tokio's settings) and sets up a
/// moq-lite session publishing or subscribing `origin`.
async fn connect_tcp(
    addr: SocketAddr,
    origin: &moq_net::origin::Producer,
    publish: bool,
) -> Result<moq_net::Session, String> {
    let qmux = tokio::time::timeout(CONNECT_TIMEOUT, qmux_tcp([ALPN_LITE_05]).connect(addr))
        .await
        .map_err(|_| "qmux connect timed out".to_owned())?
        .map_err(|e| format!("qmux connect: {e}"))?;
    let transport: QmuxTransport = moq_tokio::transport::Session::new(qmux);
    let client = moq_net::Client::new()
        .with_versions(versions()?)
        .with_path(PATH.to_owned());
    let client = if publish {
        client.with_publisher(origin)
    } else {
        client.with_subscriber(origin.clone())
    };
    let (session, driver) = tokio::time::timeout(
        CONNECT_TIMEOUT,
        client.connect(std::time::Instant::now(), transport),
    )
    .await
    .map_err(|_| "moq connect timed out".to_owned())?
    .map_err(|e| format!("moq connect: {e}"))?;
    tokio::spawn(moq_net::time::run(driver));
    Ok(session)
}

/// Frame pacing of the publisher.
#[derive(Clone, Copy)]
enum Pace {
    Fps(u32),
    Max { window: u64 },
}

/// What each track of the publisher sends.
#[derive(Clone)]
struct Publish {
    frame_bytes: usize,
    group_frames: u64,
    pace: Pace,
    /// With `--hang`: the catalog, and the microseconds between
    /// presentation times.
    hang: Option<(Arc<[u8]>, f64)>,
    /// Every broadcast's groups start together (`--aligned-groups`).
    aligned: bool,
}

/// One broadcast's producers, kept alive while it publishes.
type Published = (
    moq_net::broadcast::Producer,
    moq_net::track::Producer,
    Option<moq_net::track::Producer>,
);

/// Makes broadcast `i` of `n` in `origin` (its track, and with `--hang` its
/// catalog track) and announces it.
fn make_broadcast(
    origin: &moq_net::origin::Producer,
    i: usize,
    n: usize,
    hang: bool,
) -> Result<Published, String> {
    let broadcast = origin
        .create_broadcast(broadcast_name(i, n))
        .map_err(|e| format!("broadcast: {e}"))?;
    let track = broadcast
        .create_track(TRACK, moq_net::track::Info::default())
        .map_err(|e| format!("track: {e}"))?;
    let catalog = if hang {
        Some(
            broadcast
                .create_track(
                    skiff_core::hang::CATALOG_TRACK,
                    moq_net::track::Info::default(),
                )
                .map_err(|e| format!("catalog track: {e}"))?,
        )
    } else {
        None
    };
    broadcast
        .announce(moq_net::origin::Route::default())
        .map_err(|e| format!("announce: {e}"))?;
    Ok((broadcast, track, catalog))
}

/// Connects, announces the broadcasts and publishes frames until `stop`.
/// Through a relay each broadcast has a session of its own, as separate
/// cameras would (and a relay's tables for one session's subscriptions stay
/// out of the measure); `--relay direct` serves them all from one origin.
async fn publisher(
    target: Target,
    shared: Arc<Shared>,
    publish: Publish,
    ready: tokio::sync::oneshot::Sender<Result<(), String>>,
) {
    let n = shared.broadcasts.max(1);
    let hang = publish.hang.is_some();
    let setup = async {
        let mut tracks = Vec::with_capacity(n);
        let mut sessions = Vec::new();
        match target {
            Target::Relay(dial) => {
                for i in 0..n {
                    let origin = origin(0x5151, shared.cache_kib)?;
                    tracks.push(make_broadcast(&origin, i, n, hang)?);
                    let session = connect(&dial, &origin, true)
                        .await
                        .map_err(|e| format!("publisher: {e}"))?;
                    sessions.push(session);
                }
            }
            Target::Serve(listener) => {
                let origin = origin(0x5151, shared.cache_kib)?;
                for i in 0..n {
                    tracks.push(make_broadcast(&origin, i, n, hang)?);
                }
                tokio::spawn(serve(listener, origin.consume(), versions()?));
            }
        }
        Ok::<_, String>((tracks, sessions))
    };
    let (tracks, sessions) = match setup.await {
        Ok(v) => v,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let _ = ready.send(Ok(()));
    let mut tasks = tokio::task::JoinSet::new();
    for (i, published) in tracks.into_iter().enumerate() {
        // Broadcast i ticks i/n of a frame interval after the first, as
        // independent cameras would, rather than all at once.
        let offset = match publish.pace {
            Pace::Fps(fps) => Duration::from_secs_f64(i as f64 / n as f64 / f64::from(fps)),
            Pace::Max { .. } => Duration::ZERO,
        };
        // Broadcast i's first group is i/n of a group shorter, so the
        // groups of all of them do not end together (`--aligned-groups`:
        // they do).
        let phase = if publish.aligned {
            0
        } else {
            (i as u64 * publish.group_frames) / n as u64
        };
        tasks.spawn(publish_track(
            shared.clone(),
            publish.clone(),
            published,
            offset,
            phase,
        ));
    }
    while tasks.join_next().await.is_some() {}
    for session in sessions {
        session.close().await;
    }
}

/// Publishes one broadcast's frames until `stop`, its first tick `offset`
/// after now, frame `seq` starting a group when `seq + phase` is a multiple
/// of the group's frames (and the first); with `--hang`, the catalog again
/// at the head of every group (so a subscriber arriving late finds one in
/// any cache).
async fn publish_track(
    shared: Arc<Shared>,
    publish: Publish,
    (broadcast, track, catalog): Published,
    offset: Duration,
    phase: u64,
) {
    let Publish {
        frame_bytes,
        group_frames,
        pace,
        ref hang,
        ..
    } = publish;
    let scale = moq_net::Timescale::MICRO;
    let mut template = vec![0u8; frame_bytes];
    for (i, b) in template.iter_mut().enumerate().skip(HEADER) {
        *b = (i % 251) as u8;
    }
    let mut interval = match pace {
        Pace::Fps(fps) => {
            let period = Duration::from_secs_f64(1.0 / f64::from(fps));
            let mut i = tokio::time::interval_at(tokio::time::Instant::now() + offset, period);
            i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            Some(i)
        }
        Pace::Max { .. } => None,
    };
    let mut group: Option<moq_net::group::Producer> = None;
    let mut seq: u64 = 0;
    while !shared.stop.load(Ordering::Relaxed) {
        match (&mut interval, pace) {
            (Some(i), _) => {
                i.tick().await;
            }
            (None, Pace::Max { window }) => loop {
                if shared.stop.load(Ordering::Relaxed) {
                    break;
                }
                let notified = shared.progress.notified();
                match shared.slowest() {
                    Some(next) if seq < next + window => break,
                    Some(_) => {
                        // Wait for a read, but look again now and then (a
                        // subscriber that fails leaves the minimum).
                        let _ = tokio::time::timeout(Duration::from_millis(50), notified).await;
                    }
                    // Nobody reads yet: publish at 100 fps until someone does.
                    None => {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        break;
                    }
                }
            },
            (None, Pace::Fps(_)) => {}
        }
        if shared.stop.load(Ordering::Relaxed) {
            break;
        }
        let sent = shared.now_ns();
        let place = seq + phase;
        let key = seq == 0 || place.is_multiple_of(group_frames);
        if key {
            if let Some(g) = group.take() {
                let _ = g.finish();
            }
            match track.create_group(moq_net::group::Info::from(place / group_frames)) {
                Ok(g) => group = Some(g),
                Err(e) => {
                    eprintln!("moq_load: publisher group: {e}");
                    break;
                }
            }
            if let (Some(catalog), Some((json, _))) = (&catalog, hang) {
                let written = catalog.append_group().and_then(|mut g| {
                    g.write_frame(
                        moq_net::Timestamp::ZERO,
                        bytes::Bytes::copy_from_slice(json),
                    )?;
                    g.finish()
                });
                if let Err(e) = written {
                    eprintln!("moq_load: publisher catalog: {e}");
                    break;
                }
            }
        }
        let mut payload = bytes::BytesMut::from(&template[..]);
        // The presentation time: the send time, or with `--hang` the
        // frame's place in the content (`--content-fps`).
        let (pts_us, at) = match hang {
            Some((_, frame_us)) => {
                let pts = (seq as f64 * frame_us) as u64;
                match hang_frame(&mut payload, pts, key) {
                    Some(at) => (pts, at),
                    None => {
                        eprintln!("moq_load: --frame-bytes too small for a hang frame");
                        break;
                    }
                }
            }
            None => (sent / 1000, 0),
        };
        payload[at..at + 8].copy_from_slice(&sent.to_le_bytes());
        payload[at + 8..at + HEADER].copy_from_slice(&seq.to_le_bytes());
        if let Some(last) = payload.last_mut() {
            *last = seq as u8;
        }
        let ts = moq_net::Timestamp::new(pts_us, scale).unwrap_or(moq_net::Timestamp::ZERO);
        if let Some(g) = group.as_mut()
            && let Err(e) = g.write_frame(ts, payload.freeze())
        {
            eprintln!("moq_load: publisher frame: {e}");
            break;
        }
        seq += 1;
        shared.published.fetch_add(1, Ordering::Relaxed);
    }
    if let Some(g) = group.take() {
        let _ = g.finish();
    }
    let _ = track.finish();
    if let Some(c) = &catalog {
        let _ = c.finish();
    }
    drop((track, catalog, broadcast));
}

/// Accepts subscribers on `listener` with qmux's TCP server and moq-net's
/// server, serving them `origin`: the direct row's stand-in for a relay.
async fn serve(
    listener: tokio::net::TcpListener,
    origin: moq_net::origin::Consumer,
    versions: moq_net::Versions,
) {
    let server = moq_net::Server::new()
        .with_versions(versions)
        .with_publisher(origin);
    let server = Arc::new(server);
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            return;
        };
        // Without it, moq-net's writes hit the Nagle / delayed-ACK stall
        // (40 ms and more) a relay avoids: the floor wants the clients' own cost.
        let _ = stream.set_nodelay(true);
        let server = server.clone();
        tokio::spawn(async move {
            let qmux = match qmux_tcp([ALPN_LITE_05]).accept(stream).await {
                Ok(q) => q,
                Err(e) => {
                    eprintln!("moq_load: direct accept: {e}");
                    return;
                }
            };
            let transport: QmuxTransport = moq_tokio::transport::Session::new(qmux);
            match server.accept(std::time::Instant::now(), transport).await {
                Ok((session, driver)) => {
                    moq_net::time::run(driver).await;
                    drop(session);
                }
                Err(e) => eprintln!("moq_load: direct session: {e}"),
            }
        });
    }
}

/// One subscriber: connect, find the broadcast, subscribe at the live edge and
/// read frames until `stop`.
async fn subscriber(
    dial: Dial,
    shared: Arc<Shared>,
    index: usize,
    frame_bytes: usize,
    permit: tokio::sync::OwnedSemaphorePermit,
) {
    let Some(stat) = shared.subs.get(index) else {
        return;
    };
    let name = broadcast_name(index % shared.broadcasts.max(1), shared.broadcasts);
    let result = subscribe_and_read(&dial, &shared, stat, &name, frame_bytes, Some(permit)).await;
    if let Err(e) = result {
        stat.failed.store(true, Ordering::Relaxed);
        if let Ok(mut slot) = stat.error.lock() {
            *slot = Some(e);
        }
        shared.progress.notify_one();
    }
}

async fn subscribe_and_read(
    dial: &Dial,
    shared: &Shared,
    stat: &SubStat,
    name: &str,
    frame_bytes: usize,
    mut permit: Option<tokio::sync::OwnedSemaphorePermit>,
) -> Result<(), String> {
    let origin = origin(0x2000, shared.cache_kib)?;
    let session = connect(dial, &origin, false).await?;
    let consumer = origin.consume();
    let mut announced = consumer.announced();
    let found = tokio::time::timeout(CONNECT_TIMEOUT, async {
        while let Some(update) = announced.next().await {
            if update.kind.is_active() && update.prefix.as_str() == name {
                return true;
            }
        }
        false
    })
    .await;
    if !matches!(found, Ok(true)) {
        return Err("no announcement".into());
    }
    let result = loop {
        let result = subscribe_once(&consumer, shared, stat, name, frame_bytes, &mut permit).await;
        // With `--kill`, a subscription cut by a dead node is made again on
        // the same session, as a player would.
        if !shared.resubscribe || shared.stop.load(Ordering::Relaxed) {
            break result;
        }
        if stat.resubscribed.fetch_add(1, Ordering::Relaxed) == 0
            && let Ok(mut why) = stat.ended.lock()
        {
            *why = Some(match &result {
                Ok(()) => "the subscription ended".to_owned(),
                Err(e) => e.clone(),
            });
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    session.close().await;
    result
}

/// Resolves the broadcast, subscribes to its track at the live edge and reads
/// frames until `stop` or the subscription ends.
async fn subscribe_once(
    consumer: &moq_net::origin::Consumer,
    shared: &Shared,
    stat: &SubStat,
    name: &str,
    frame_bytes: usize,
    permit: &mut Option<tokio::sync::OwnedSemaphorePermit>,
) -> Result<(), String> {
    let broadcast = consumer
        .routed_broadcast(name)
        .await
        .map_err(|e| format!("broadcast: {e}"))?;
    let track = broadcast.track(TRACK).map_err(|e| format!("track: {e}"))?;
    let mut sub = tokio::time::timeout(
        CONNECT_TIMEOUT,
        track.subscribe(moq_net::track::Subscription::default()),
    )
    .await
    .map_err(|_| "subscribe timed out".to_owned())?
    .map_err(|e| format!("subscribe: {e}"))?;
    // Subscribed: let the next subscriber connect.
    drop(permit.take());
    let result = loop {
        if shared.stop.load(Ordering::Relaxed) {
            break Ok(());
        }
        let mut group = match sub.recv_group().await {
            Ok(Some(g)) => g,
            Ok(None) => break Ok(()),
            Err(e) => break Err(format!("group: {e}")),
        };
        loop {
            let frame = match group.read_frame().await {
                Ok(Some(f)) => f,
                Ok(None) => break,
                // A live subscription (max age 0) gives up a group still being
                // read once a newer one starts: go on with the newer one.
                Err(moq_net::Error::Old | moq_net::Error::Stream(moq_net::StreamError::Old)) => {
                    stat.old.fetch_add(1, Ordering::Relaxed);
                    break;
                }
                Err(moq_net::Error::Transport(m)) if unmapped_old(&m) => {
                    stat.old.fetch_add(1, Ordering::Relaxed);
                    stat.unmapped_old.fetch_add(1, Ordering::Relaxed);
                    break;
                }
                Err(e) => {
                    if shared.stop.load(Ordering::Relaxed) {
                        break;
                    }
                    // With `--kill`, a group cut by the dead node is given
                    // up and the subscription goes on with the next group.
                    if shared.resubscribe {
                        if stat.group_errors.fetch_add(1, Ordering::Relaxed) == 0
                            && let Ok(mut why) = stat.group_error.lock()
                        {
                            *why = Some(format!("{e} ({e:?})"));
                        }
                        break;
                    }
                    return Err(format!("frame: {e} ({e:?})"));
                }
            };
            let now = shared.now_ns();
            let p = &frame.payload[..];
            let header = header_offset(p, shared.hang)
                .and_then(|at| p.get(at..at + HEADER))
                .map(|h| {
                    let (a, b) = h.split_at(8);
                    (
                        u64::from_le_bytes(a.try_into().unwrap_or([0; 8])),
                        u64::from_le_bytes(b.try_into().unwrap_or([0; 8])),
                    )
                })
                .filter(|_| p.len() == frame_bytes);
            let Some((sent, seq)) = header.filter(|&(_, seq)| p.last() == Some(&(seq as u8)))
            else {
                stat.bad.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            stat.frames.fetch_add(1, Ordering::Relaxed);
            stat.bytes.fetch_add(p.len() as u64, Ordering::Relaxed);
            stat.next.fetch_max(seq + 1, Ordering::Relaxed);
            stat.live.store(true, Ordering::Relaxed);
            if shared.measuring.load(Ordering::Relaxed) {
                let us = now.saturating_sub(sent) / 1000;
                if let Ok(mut l) = stat.latencies.lock() {
                    l.push(u32::try_from(us).unwrap_or(u32::MAX));
                }
                if shared.marks
                    && let Ok(mut r) = stat.reads.lock()
                {
                    r.push((sent, now, seq));
                }
            }
            shared.progress.notify_one();
        }
    };
    drop(sub);
    result
}

/// Whether a group read's transport error is a RESET_STREAM carrying
/// moq-lite's Old code (0x34) as is. moq-tokio's QUIC client reads stream
/// codes through the HTTP/3 (WebTransport) error-code mapping on raw QUIC as
/// well, and moq-relay's tokio runtime sends them mapped; its io_uring runtime
/// sends them unmapped on raw QUIC, which the client reports as this error
/// instead of `Old`. Counting it as an old group lets that runtime be measured
/// on the loads where it drops groups (full speed).
fn unmapped_old(message: &str) -> bool {
    message
        .strip_prefix("invalid RESET_STREAM: ")
        .and_then(|code| code.parse::<u32>().ok())
        == Some(moq_net::StreamError::Old.to_code())
}

// ---------------------------------------------------------------------------
// One row
// ---------------------------------------------------------------------------

/// What one (relay, N) run measured.
struct Row {
    which: Which,
    n: usize,
    live: usize,
    failed: usize,
    first_error: Option<String>,
    secs: f64,
    frames: u64,
    bytes: u64,
    bad: u64,
    old: u64,
    /// Of `old`, the groups reset with the Old code unmapped.
    unmapped_old: u64,
    published: u64,
    lat: Vec<u32>,
    /// Each subscriber's median latency in ms, in connection order (with
    /// `--per-subscriber` only).
    per_sub_p50: Vec<f64>,
    relay_cpu: f64,
    /// The part of `relay_cpu` spent in the kernel (system time).
    relay_sys: f64,
    tool_cpu: f64,
    rss_before: u64,
    rss_after: u64,
    /// `--relay-syscalls`: each event counted over the window.
    syscalls: Vec<(String, u64)>,
    /// `--relay-metrics`: each `skiff_relay_quic_*` counter's change over
    /// the window.
    quic_io: Vec<(String, u64)>,
    /// With more than one relay: each relay's CPU seconds over the window.
    per_relay_cpu: Vec<f64>,
    /// `--kill`: each subscriber's recovery.
    recovery: Option<Vec<Recovery>>,
    /// Subscriptions made again (`--kill`).
    resubscribed: u64,
    /// How the first subscription made again had ended (`--kill`).
    ended: Option<String>,
    /// Groups given up on an error other than Old, and the first error (`--kill`).
    group_errors: (u64, Option<String>),
    /// Broadcasts published, each read by subscribers `i mod broadcasts`.
    broadcasts: usize,
    /// Bytes of every frame published.
    frame_bytes: usize,
    /// The frames were hang frames (`--hang`).
    hang: bool,
    /// Every relay's `write_bytes` and `wchar` growth over the window.
    disk: (u64, u64),
}

/// When `--kill` ends its relay: a second into the measured window.
const KILL_AFTER: Duration = Duration::from_secs(1);

/// One subscriber's gap around the kill.
#[derive(Clone, Copy)]
struct Recovery {
    /// From the kill to the first frame read after the longest pause in
    /// reading that ends after the kill (ms); `None` if it read nothing after
    /// the kill.
    ms: Option<f64>,
    /// That pause (ms).
    gap_ms: f64,
    /// Frames never read across it (sequence numbers skipped).
    skipped: u64,
}

/// Each subscriber's recovery after the kill at `killed_ns`: the longest
/// pause between consecutive reads that ends after the kill. A pause shorter
/// than three frame intervals counts as none (the subscriber's path did not
/// cross the killed relay): recovery 0.
fn recoveries(shared: &Shared, killed_ns: u64, pace: Pace) -> Vec<Recovery> {
    let interval_ns = match pace {
        Pace::Fps(f) => 1_000_000_000 / u64::from(f.max(1)),
        Pace::Max { .. } => 1_000_000,
    };
    shared
        .subs
        .iter()
        .map(|s| {
            let mut reads = s.reads.lock().map(|r| r.clone()).unwrap_or_default();
            reads.sort_unstable_by_key(|r| r.1);
            let mut best: Option<(u64, u64, u64)> = None;
            for w in reads.windows(2) {
                let (a, b) = (w[0], w[1]);
                if b.1 <= killed_ns {
                    continue;
                }
                let gap = b.1 - a.1;
                if best.is_none_or(|(g, _, _)| gap > g) {
                    best = Some((gap, b.1, b.2.saturating_sub(a.2 + 1)));
                }
            }
            match best {
                Some((gap, _, _)) if gap < 3 * interval_ns => Recovery {
                    ms: Some(0.0),
                    gap_ms: gap as f64 / 1e6,
                    skipped: 0,
                },
                Some((gap, at, skipped)) => Recovery {
                    ms: Some(at.saturating_sub(killed_ns) as f64 / 1e6),
                    gap_ms: gap as f64 / 1e6,
                    skipped,
                },
                None => Recovery {
                    ms: None,
                    gap_ms: f64::NAN,
                    skipped: 0,
                },
            }
        })
        .collect()
}

/// The relay's system calls counted by `perf stat` while it runs.
struct SyscallCount {
    perf: Child,
    out: PathBuf,
}

/// The events `--relay-syscalls` counts.
const SYSCALL_EVENTS: &str = "raw_syscalls:sys_enter,syscalls:sys_enter_recvmmsg,syscalls:sys_enter_recvfrom,syscalls:sys_enter_recvmsg,syscalls:sys_enter_sendmsg,syscalls:sys_enter_sendto,syscalls:sys_enter_io_uring_enter,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_poll";

impl SyscallCount {
    /// Starts counting `pid`'s system calls.
    fn start(pid: u32) -> Result<Self, String> {
        let out = std::env::temp_dir().join(format!("moq_load-perf-{}-{pid}", std::process::id()));
        let perf = Command::new("perf")
            .args(["stat", "-x", ",", "-e", SYSCALL_EVENTS, "-p"])
            .arg(pid.to_string())
            .arg("-o")
            .arg(&out)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("perf: {e}"))?;
        // perf attaches to the threads before it counts.
        std::thread::sleep(Duration::from_millis(200));
        Ok(SyscallCount { perf, out })
    }

    /// Stops counting (perf prints on SIGINT) and reads each event's count.
    fn finish(mut self) -> Vec<(String, u64)> {
        if let Ok(pid) = i32::try_from(self.perf.id()) {
            // SAFETY: a signal to the perf child this tool started.
            unsafe { libc::kill(pid, libc::SIGINT) };
        }
        let _ = self.perf.wait();
        let text = std::fs::read_to_string(&self.out).unwrap_or_default();
        let _ = std::fs::remove_file(&self.out);
        // CSV lines: count, unit, event, ...
        text.lines()
            .filter_map(|l| {
                let mut f = l.split(',');
                let count = f.next()?.trim().parse::<u64>().ok()?;
                let _unit = f.next()?;
                let event = f.next()?.trim();
                let name = event.rsplit(':').next().unwrap_or(event);
                Some((name.trim_start_matches("sys_enter_").to_owned(), count))
            })
            .collect()
    }
}

/// skiff-relay's `skiff_relay_quic_*` and `skiff_relay_record_*` counters
/// (totals, no labels) from its metrics at `addr`; empty if it does not answer.
fn relay_counters(addr: SocketAddr) -> Vec<(String, u64)> {
    let Ok(mut tcp) = TcpStream::connect_timeout(&addr, Duration::from_millis(500)) else {
        return Vec::new();
    };
    let _ = tcp.set_read_timeout(Some(Duration::from_secs(2)));
    let Ok((_, body)) = http_get(&mut tcp, addr, "/metrics") else {
        return Vec::new();
    };
    body.lines()
        .filter(|l| {
            (l.starts_with("skiff_relay_quic_") || l.starts_with("skiff_relay_record_"))
                && l.contains("_total ")
        })
        .filter_map(|l| {
            let (name, value) = l.split_once(' ')?;
            Some((name.to_owned(), value.trim().parse().ok()?))
        })
        .collect()
}

/// Where the relays of a row sit: which relays each one dials (always ones
/// started before it), where the publisher and each subscriber connect, and
/// which relay `--kill` ends.
struct Layout {
    dials: Vec<Vec<usize>>,
    publisher: usize,
    /// The relay of subscriber i is `subscribers[i % len]`.
    subscribers: Vec<usize>,
    kill: Option<usize>,
}

impl Layout {
    fn new(cli: &Cli) -> Layout {
        if cli.kill {
            // A=0, B=1, D=2, E=3, C=4: C dials B and E, B and D dial A, E
            // dials D. A-B-C is two links, A-D-E-C three.
            return Layout {
                dials: vec![vec![], vec![0], vec![0], vec![2], vec![1, 3]],
                publisher: 0,
                subscribers: vec![4],
                kill: Some(1),
            };
        }
        let hops = cli.hops.max(1);
        Layout {
            dials: (0..hops)
                .map(|k| if k == 0 { vec![] } else { vec![k - 1] })
                .collect(),
            publisher: 0,
            subscribers: if cli.spread {
                (0..hops).collect()
            } else {
                vec![hops - 1]
            },
            kill: None,
        }
    }

    /// Whether the row has more than the one relay of the plain rows.
    fn clustered(&self) -> bool {
        self.dials.len() > 1
    }
}

/// Starts the relays of `layout`, each clustered node with its hop id and
/// its `--cluster-connect` peers.
fn start_relays(
    cli: &Cli,
    which: Which,
    bin: &Path,
    layout: &Layout,
) -> Result<Vec<RelayChild>, String> {
    let mut relays: Vec<RelayChild> = Vec::new();
    for (k, dials) in layout.dials.iter().enumerate() {
        let mut extra = Vec::new();
        if layout.clustered() {
            extra.extend(["--cluster-id".to_owned(), (k + 1).to_string()]);
            for &d in dials {
                let peer = relays
                    .get(d)
                    .ok_or_else(|| format!("relay {k} dials relay {d}, not started yet"))?;
                extra.extend([
                    "--cluster-connect".to_owned(),
                    format!("tcp://{}/", peer.addr),
                ]);
            }
        }
        relays.push(match which {
            Which::Skiff => start_skiff(cli, bin, &extra)?,
            _ => start_moq_relay(cli, bin, &extra)?,
        });
    }
    Ok(relays)
}

fn run_row(
    cli: &Cli,
    which: Which,
    bin: &Path,
    n: usize,
    pace: Pace,
    catalog: Option<&Arc<[u8]>>,
) -> Result<Row, String> {
    let layout = Layout::new(cli);
    let mut relays = match which {
        Which::Direct => Vec::new(),
        _ => start_relays(cli, which, bin, &layout)?,
    };
    if layout.clustered() {
        // The peers dial, announce and learn routes before the publisher comes.
        std::thread::sleep(Duration::from_millis(1000));
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cli.client_threads.max(1))
        .enable_all()
        .build()
        .map_err(|e| format!("runtime: {e}"))?;
    // The direct row has no relay process: its relay columns stay empty.
    let (target, dials) = match relays.get(layout.publisher) {
        Some(r) => {
            let dials = layout
                .subscribers
                .iter()
                .map(|&k| relays.get(k).ok_or("no such relay")?.dial(cli.transport))
                .collect::<Result<Vec<_>, String>>()?;
            (Target::Relay(r.dial(cli.transport)?), dials)
        }
        None => {
            let listener = rt
                .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
                .map_err(|e| format!("direct listener: {e}"))?;
            let addr = listener
                .local_addr()
                .map_err(|e| format!("direct listener: {e}"))?;
            (Target::Serve(listener), vec![Dial::Tcp(addr)])
        }
    };
    let pids: Vec<u32> = relays.iter().map(|r| r.child.id()).collect();
    let pid = pids.first().copied();
    // Every relay's CPU summed, and each one's.
    let relay_cpus = || pids.iter().map(|&p| cpu_seconds(p)).collect::<Vec<Cpu>>();
    let sum = |v: &[Cpu]| Cpu {
        user: v.iter().map(|c| c.user).sum(),
        system: v.iter().map(|c| c.system).sum(),
    };
    let relay_rss = || pids.iter().map(|&p| rss_kib(p)).sum::<u64>();
    let epoch = Instant::now();
    let shared = Arc::new(Shared {
        epoch,
        epoch_monotonic_ns: monotonic_ns().saturating_sub(nanos(epoch.elapsed())),
        marks: cli.marks.is_some() || cli.kill,
        resubscribe: cli.kill,
        measuring: AtomicBool::new(false),
        stop: AtomicBool::new(false),
        published: AtomicU64::new(0),
        subs: (0..n).map(|_| SubStat::default()).collect(),
        progress: tokio::sync::Notify::new(),
        cache_kib: cli.client_cache_kib,
        broadcasts: cli.broadcasts.max(1),
        hang: catalog.is_some(),
    });
    let content_fps = cli.content_fps.or(match pace {
        Pace::Fps(f) => Some(f),
        Pace::Max { .. } => None,
    });
    let publish = Publish {
        frame_bytes: cli.frame_bytes,
        group_frames: cli.group_frames.max(1),
        pace,
        aligned: cli.aligned_groups,
        hang: catalog.map(|c| (c.clone(), 1e6 / f64::from(content_fps.unwrap_or(30).max(1)))),
    };
    let relay_io = || {
        pids.iter()
            .map(|&p| io_written(p))
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    };
    let me = std::process::id();
    let result = rt.block_on(async {
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        tokio::spawn(publisher(target, shared.clone(), publish, ready_tx));
        ready_rx
            .await
            .map_err(|_| "publisher task ended".to_owned())??;
        // Let the announcement settle before taking the baseline RSS.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let rss_before = relay_rss();
        let connecting = Instant::now();
        let gate = Arc::new(tokio::sync::Semaphore::new(cli.connect_parallel.max(1)));
        let mut every = Every::new(cli.progress, connecting);
        for i in 0..n {
            let permit = gate
                .clone()
                .acquire_owned()
                .await
                .map_err(|_| "semaphore closed".to_owned())?;
            let dial = dials.get(i % dials.len()).ok_or("no relay to dial")?;
            tokio::spawn(subscriber(
                dial.clone(),
                shared.clone(),
                i,
                cli.frame_bytes,
                permit,
            ));
            if every.due() {
                progress_line(&shared, connecting, pid);
            }
        }
        let deadline = Instant::now() + Duration::from_secs_f64(cli.live_timeout);
        loop {
            let settled = shared
                .subs
                .iter()
                .all(|s| s.live.load(Ordering::Relaxed) || s.failed.load(Ordering::Relaxed));
            if settled || Instant::now() > deadline {
                break;
            }
            if every.due() {
                progress_line(&shared, connecting, pid);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if every.is_on() {
            progress_line(&shared, connecting, pid);
        }
        tokio::time::sleep(Duration::from_secs_f64(cli.warmup)).await;

        let snap = |s: &Shared| {
            let f: u64 = s
                .subs
                .iter()
                .map(|x| x.frames.load(Ordering::Relaxed))
                .sum();
            let b: u64 = s.subs.iter().map(|x| x.bytes.load(Ordering::Relaxed)).sum();
            let bad: u64 = s.subs.iter().map(|x| x.bad.load(Ordering::Relaxed)).sum();
            let old: u64 = s.subs.iter().map(|x| x.old.load(Ordering::Relaxed)).sum();
            let unmapped: u64 = s
                .subs
                .iter()
                .map(|x| x.unmapped_old.load(Ordering::Relaxed))
                .sum();
            (
                f,
                b,
                bad,
                old,
                unmapped,
                s.published.load(Ordering::Relaxed),
            )
        };
        let (f0, b0, bad0, old0, un0, p0) = snap(&shared);
        let io0 = cli.relay_metrics.map(relay_counters).unwrap_or_default();
        let disk0 = relay_io();
        let perf = match (cli.relay_syscalls, pid) {
            (true, Some(pid)) => Some(SyscallCount::start(pid)?),
            _ => None,
        };
        let (c0, t0) = (relay_cpus(), cpu_seconds(me));
        let start = Instant::now();
        shared.measuring.store(true, Ordering::Relaxed);
        let mut killed_ns = None;
        if let Some(k) = layout.kill {
            tokio::time::sleep(KILL_AFTER).await;
            if let Some(r) = relays.get_mut(k) {
                // Child::kill sends SIGKILL.
                r.child.kill().map_err(|e| format!("kill relay {k}: {e}"))?;
                killed_ns = Some(shared.now_ns());
            }
            let rest = Duration::from_secs_f64(cli.seconds).saturating_sub(KILL_AFTER);
            tokio::time::sleep(rest).await;
        } else {
            tokio::time::sleep(Duration::from_secs_f64(cli.seconds)).await;
        }
        shared.measuring.store(false, Ordering::Relaxed);
        let secs = start.elapsed().as_secs_f64();
        let (f1, b1, bad1, old1, un1, p1) = snap(&shared);
        let (c1, t1) = (relay_cpus(), cpu_seconds(me));
        let syscalls = perf.map(SyscallCount::finish).unwrap_or_default();
        let io1 = cli.relay_metrics.map(relay_counters).unwrap_or_default();
        let disk1 = relay_io();
        let quic_io = io1
            .into_iter()
            .map(|(name, v1)| {
                let v0 = io0.iter().find(|(n, _)| *n == name).map_or(0, |p| p.1);
                (name, v1.saturating_sub(v0))
            })
            .collect();
        let rss_after = relay_rss();
        shared.stop.store(true, Ordering::Relaxed);
        shared.progress.notify_one();

        let live = shared
            .subs
            .iter()
            .filter(|s| s.live.load(Ordering::Relaxed))
            .count();
        let failed = shared
            .subs
            .iter()
            .filter(|s| s.failed.load(Ordering::Relaxed))
            .count();
        let first_error = shared
            .subs
            .iter()
            .find_map(|s| s.error.lock().ok().and_then(|e| e.clone()));
        if let Some(path) = &cli.marks {
            write_marks(path, &shared).map_err(|e| format!("{}: {e}", path.display()))?;
        }
        let recovery = killed_ns.map(|k| recoveries(&shared, k, pace));
        let resubscribed = shared
            .subs
            .iter()
            .map(|s| s.resubscribed.load(Ordering::Relaxed))
            .sum();
        let mut lat = Vec::new();
        let mut per_sub_p50 = Vec::new();
        for s in &shared.subs {
            if let Ok(mut l) = s.latencies.lock() {
                if cli.per_subscriber {
                    l.sort_unstable();
                    per_sub_p50.push(percentile(&l, 0.50));
                }
                lat.append(&mut l);
            }
        }
        Ok::<Row, String>(Row {
            which,
            n,
            live,
            failed,
            first_error,
            secs,
            frames: f1 - f0,
            bytes: b1 - b0,
            bad: bad1 - bad0,
            old: old1 - old0,
            unmapped_old: un1 - un0,
            published: p1 - p0,
            lat,
            per_sub_p50,
            relay_cpu: sum(&c1).total() - sum(&c0).total(),
            relay_sys: sum(&c1).system - sum(&c0).system,
            per_relay_cpu: if layout.clustered() {
                c0.iter()
                    .zip(&c1)
                    .map(|(a, b)| b.total() - a.total())
                    .collect()
            } else {
                Vec::new()
            },
            recovery,
            resubscribed,
            group_errors: (
                shared
                    .subs
                    .iter()
                    .map(|s| s.group_errors.load(Ordering::Relaxed))
                    .sum(),
                shared
                    .subs
                    .iter()
                    .find_map(|s| s.group_error.lock().ok().and_then(|e| e.clone())),
            ),
            ended: shared
                .subs
                .iter()
                .find_map(|s| s.ended.lock().ok().and_then(|e| e.clone())),
            tool_cpu: t1.total() - t0.total(),
            broadcasts: shared.broadcasts,
            frame_bytes: cli.frame_bytes,
            hang: shared.hang,
            disk: (
                disk1.0.saturating_sub(disk0.0),
                disk1.1.saturating_sub(disk0.1),
            ),
            rss_before,
            rss_after,
            syscalls,
            quic_io,
        })
    });
    rt.shutdown_timeout(Duration::from_secs(2));
    drop(relays);
    result
}

// ---------------------------------------------------------------------------
// Output
// ---------------------------------------------------------------------------

/// One `--progress` line: seconds since the subscribers started, how many
/// are live and failed, this process's open descriptors (one UDP socket per
/// QUIC client), the relay's RSS, and the CPU seconds this process and the
/// relay have used so far.
fn progress_line(shared: &Shared, since: Instant, relay: Option<u32>) {
    let count = |f: fn(&SubStat) -> bool| shared.subs.iter().filter(|s| f(s)).count();
    let live = count(|s| s.live.load(Ordering::Relaxed));
    let failed = count(|s| s.failed.load(Ordering::Relaxed));
    let me = std::process::id();
    let fds = std::fs::read_dir(format!("/proc/{me}/fd")).map_or(0, |d| d.count());
    let (relay_rss, relay_cpu) = relay.map_or((0, 0.0), |p| (rss_kib(p), cpu_seconds(p).total()));
    eprintln!(
        "moq_load: {:7.1} s: {live} of {} live, {failed} failed; client descriptors {fds}; relay RSS {:.1} MB; CPU s so far: clients {:.1}, relay {relay_cpu:.1}",
        since.elapsed().as_secs_f64(),
        shared.subs.len(),
        relay_rss as f64 / 1024.0,
        cpu_seconds(me).total(),
    );
}

fn command_line(args: &[&str]) -> Option<String> {
    let (cmd, rest) = args.split_first()?;
    let out = Command::new(cmd).args(rest).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// The clients' transport and, over QUIC, how each relay serves it.
fn transport_line(cli: &Cli) -> String {
    match cli.transport {
        Link::Tcp => "tcp (QMux, qmux-01)".to_owned(),
        Link::Quic => {
            let moq = match cli.moq_relay_runtime {
                MoqRuntime::Tokio => "its tokio runtime, --listen-tls-generate".to_owned(),
                MoqRuntime::Workers => format!(
                    "--runtime-workers {}, certificate files",
                    cli.moq_relay_workers
                ),
                MoqRuntime::IoUring => format!(
                    "--runtime-workers {} --runtime-io-uring, certificate files",
                    cli.moq_relay_workers
                ),
            };
            format!(
                "quic (moql://, moq-lite-05, noq, fingerprint pinned); skiff-relay {}; moq-relay {moq}",
                cli.skiff_quic_args.trim()
            )
        }
    }
}

fn machine_line() -> String {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let load = std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default();
    let commit = command_line(&["git", "rev-parse", "--short", "HEAD"]).unwrap_or("?".into());
    let dirty = command_line(&["git", "status", "--porcelain", "--untracked-files=no"])
        .is_some_and(|s| !s.is_empty());
    let date = command_line(&["date", "-u", "+%Y-%m-%dT%H:%M:%SZ"]).unwrap_or_default();
    format!(
        "machine: {cores} cores, load average {load}, commit {commit}{}, {date}",
        if dirty { " (modified)" } else { "" }
    )
}

/// A duration in nanoseconds, saturating.
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// `CLOCK_MONOTONIC` now, in nanoseconds: the clock `Instant` reads on
/// Linux and `benches/timeline` logs by.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call's duration.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    if rc != 0 {
        return 0;
    }
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let sub = u64::try_from(ts.tv_nsec).unwrap_or(0);
    secs.saturating_mul(1_000_000_000).saturating_add(sub)
}

/// Appends the row's reads to `path` as `sent read` lines of
/// `CLOCK_MONOTONIC` nanoseconds (`--marks`).
fn write_marks(path: &std::path::Path, shared: &Shared) -> std::io::Result<()> {
    use std::io::Write as _;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    let mut out = std::io::BufWriter::new(file);
    let base = shared.epoch_monotonic_ns;
    for s in &shared.subs {
        if let Ok(reads) = s.reads.lock() {
            for &(sent, read, _) in reads.iter() {
                writeln!(out, "{} {}", base + sent, base + read)?;
            }
        }
    }
    out.flush()
}

fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    f64::from(sorted[i.min(sorted.len() - 1)]) / 1000.0
}

fn header() {
    println!(
        "{:<11} {:>5} {:>9} {:>9} {:>7} {:>7} {:>7} {:>8} {:>9} {:>8} {:>8} {:>6} {:>9} {:>11} {:>8} {:>6}",
        "relay",
        "subs",
        "live/fail",
        "MB/s",
        "ratio",
        "p50_ms",
        "p99_ms",
        "max_ms",
        "relay_cpu",
        "core_%",
        "CPU-s/GB",
        "sys_%",
        "rss0_MiB",
        "rss/sub_KiB",
        "tool_%",
        "old"
    );
}

fn print_row(r: &mut Row) {
    r.lat.sort_unstable();
    let gb = r.bytes as f64 / 1e9;
    // Each subscriber reads one broadcast's share of the frames published.
    let expected = r.published as f64 / r.broadcasts.max(1) as f64 * r.live as f64;
    let rss_per = (r.rss_after as f64 - r.rss_before as f64) / r.live.max(1) as f64;
    // The direct row has no relay process to measure.
    let col = |v: f64, prec: usize| {
        if r.which != Which::Direct {
            format!("{v:.prec$}")
        } else {
            "-".to_owned()
        }
    };
    println!(
        "{:<11} {:>5} {:>9} {:>9.1} {:>7.3} {:>7.2} {:>7.2} {:>8.2} {:>9} {:>8} {:>8} {:>6} {:>9} {:>11} {:>8.1} {:>6}",
        r.which.name(),
        r.n,
        format!("{}/{}", r.live, r.failed),
        r.bytes as f64 / 1e6 / r.secs,
        if expected > 0.0 {
            r.frames as f64 / expected
        } else {
            f64::NAN
        },
        percentile(&r.lat, 0.50),
        percentile(&r.lat, 0.99),
        r.lat.last().map_or(f64::NAN, |&m| f64::from(m) / 1000.0),
        col(r.relay_cpu, 2),
        col(100.0 * r.relay_cpu / r.secs, 1),
        col(if gb > 0.0 { r.relay_cpu / gb } else { f64::NAN }, 3),
        col(
            if r.relay_cpu > 0.0 {
                100.0 * r.relay_sys / r.relay_cpu
            } else {
                f64::NAN
            },
            1
        ),
        col(r.rss_before as f64 / 1024.0, 1),
        col(rss_per, 1),
        100.0 * r.tool_cpu / r.secs,
        r.old,
    );
    if r.failed > 0 || r.bad > 0 || r.live < r.n {
        println!(
            "            note: {} of {} live, {} failed ({}), {} bad frames",
            r.live,
            r.n,
            r.failed,
            r.first_error.as_deref().unwrap_or("-"),
            r.bad
        );
    }
    if !r.syscalls.is_empty() && gb > 0.0 {
        let per_gb: Vec<String> = r
            .syscalls
            .iter()
            .map(|(name, n)| format!("{name} {:.0}", *n as f64 / gb))
            .collect();
        println!("            syscalls per GB: {}", per_gb.join(", "));
    }
    let media = r.published as f64 * r.frame_bytes as f64;
    let record = |name: &str| {
        r.quic_io
            .iter()
            .find(|(n, _)| n == name)
            .map(|p| p.1 as f64)
    };
    if r.hang && r.which != Which::Direct && media > 0.0 {
        println!(
            "            media published {:.2} MB/s ({} broadcasts); relay disk writes over the window: write_bytes {:.1} MB ({:.3} × media), wchar {:.1} MB ({:.3} ×)",
            media / 1e6 / r.secs,
            r.broadcasts,
            r.disk.0 as f64 / 1e6,
            r.disk.0 as f64 / media,
            r.disk.1 as f64 / 1e6,
            r.disk.1 as f64 / media,
        );
    }
    if let Some(recorded) = record("skiff_relay_record_groups_recorded_total") {
        let written = record("skiff_relay_record_bytes_written_total").unwrap_or(0.0);
        println!(
            "            recorder over the window: {recorded:.0} groups recorded, {:.0} dropped, {:.0} write errors, {:.1} MB of segments ({:.3} × media)",
            record("skiff_relay_record_groups_dropped_total").unwrap_or(0.0),
            record("skiff_relay_record_write_errors_total").unwrap_or(0.0),
            written / 1e6,
            if media > 0.0 {
                written / media
            } else {
                f64::NAN
            },
        );
    }
    if r.quic_io
        .iter()
        .any(|(n, _)| n.starts_with("skiff_relay_quic_"))
        && gb > 0.0
    {
        let get = |name: &str| {
            r.quic_io
                .iter()
                .find(|(n, _)| n == name)
                .map_or(0.0, |p| p.1 as f64)
        };
        let (rc, rd) = (
            get("skiff_relay_quic_receive_calls_total"),
            get("skiff_relay_quic_received_datagrams_total"),
        );
        let (sc, sd) = (
            get("skiff_relay_quic_send_calls_total"),
            get("skiff_relay_quic_sent_datagrams_total"),
        );
        println!(
            "            quic per GB: receive calls {:.0}, datagrams {:.0} ({:.2} per call); send calls {:.0}, datagrams {:.0} ({:.2} per call)",
            rc / gb,
            rd / gb,
            rd / rc.max(1.0),
            sc / gb,
            sd / gb,
            sd / sc.max(1.0),
        );
    }
    if !r.per_relay_cpu.is_empty() {
        let each: Vec<String> = r
            .per_relay_cpu
            .iter()
            .map(|c| {
                format!(
                    "{:.2} s ({:.3}/GB)",
                    c.max(0.0),
                    if gb > 0.0 { c.max(0.0) / gb } else { f64::NAN }
                )
            })
            .collect();
        println!(
            "            {} relays, CPU each (first = publisher's): {}",
            r.per_relay_cpu.len(),
            each.join(", ")
        );
    }
    if let Some(rec) = &r.recovery {
        let mut ms: Vec<f64> = rec.iter().filter_map(|x| x.ms).collect();
        ms.sort_unstable_by(f64::total_cmp);
        let pick = |p: f64| {
            ms.get(((ms.len().max(1) - 1) as f64 * p).round() as usize)
                .map_or(f64::NAN, |v| *v)
        };
        let each: Vec<String> = rec
            .iter()
            .map(|x| match x.ms {
                Some(ms) => format!("{ms:.0}/{:.0}/{}", x.gap_ms, x.skipped),
                None => "none".to_owned(),
            })
            .collect();
        println!(
            "            recovery after the kill: {} of {} subscribers read again; min {:.0} ms, median {:.0} ms, max {:.0} ms; {} resubscribed",
            ms.len(),
            rec.len(),
            pick(0.0),
            pick(0.5),
            pick(1.0),
            r.resubscribed
        );
        if let (n, Some(why)) = &r.group_errors {
            println!("            {n} groups cut by an error other than Old, the first: {why}");
        }
        if let Some(why) = &r.ended {
            println!("            a subscription made again had ended with: {why}");
        }
        println!(
            "            each (ms from kill to first frame after the gap / gap ms / frames skipped): {}",
            each.join(" ")
        );
    }
    if r.unmapped_old > 0 {
        println!(
            "            note: {} of the {} old groups were reset with the Old code unmapped (read as \"invalid RESET_STREAM: 52\")",
            r.unmapped_old, r.old
        );
    }
}

fn run(cli: &Cli) -> Result<(), String> {
    if cli.frame_bytes <= HEADER {
        return Err(format!("--frame-bytes must be more than {HEADER}"));
    }
    // The longest legacy prefix, the NAL unit's length and header, the
    // timing header and the check byte.
    let hang_min = skiff_core::hang::frame::MAX_PREFIX_LEN + NAL_HEAD + HEADER + 1;
    if cli.hang && cli.frame_bytes < hang_min {
        return Err(format!("--hang needs --frame-bytes of at least {hang_min}"));
    }
    if cli.broadcasts == 0 {
        return Err("--broadcasts must be at least 1".into());
    }
    if cli.content_fps.is_some() && !cli.hang {
        return Err("--content-fps sets hang presentation times: add --hang".into());
    }
    let pace = match cli.fps.as_str() {
        "max" => Pace::Max {
            window: cli.window.max(1),
        },
        s => match s.parse::<u32>() {
            Ok(f) if f > 0 => Pace::Fps(f),
            _ => return Err(format!("--fps: {s:?} is neither a positive number nor max")),
        },
    };
    if cli.transport == Link::Tcp && cli.moq_relay_runtime != MoqRuntime::Tokio {
        return Err(
            "--moq-relay-runtime chooses how moq-relay serves QUIC: add --transport quic".into(),
        );
    }
    if cli.transport == Link::Quic && cli.relay.contains(&Which::Direct) {
        return Err("--relay direct serves over TCP only".into());
    }
    if (cli.hops > 1 || cli.kill) && cli.transport == Link::Quic {
        return Err(
            "--hops and --kill peer the relays over TCP: leave out --transport quic".into(),
        );
    }
    if (cli.hops > 1 || cli.kill) && cli.relay.contains(&Which::Direct) {
        return Err("--hops and --kill need relays, not --relay direct".into());
    }
    if cli.kill && cli.hops > 1 {
        return Err("--kill has its own five-relay ring: leave out --hops".into());
    }
    if cli.broadcasts > 1 && matches!(pace, Pace::Max { .. }) {
        return Err("--fps max paces one broadcast: give --broadcasts 1 or a number of fps".into());
    }
    let catalog: Option<Arc<[u8]>> = if cli.hang {
        let fps = cli.content_fps.or(match pace {
            Pace::Fps(f) => Some(f),
            Pace::Max { .. } => None,
        });
        Some(hang_catalog(fps.unwrap_or(30))?.into())
    } else {
        None
    };
    let skiff = skiff_path(cli)?;
    let moq = moq_relay_path(cli);
    let mut relays: Vec<(Which, PathBuf)> = Vec::new();
    let wants = |w: Which| cli.relay.contains(&w);
    let both = wants(Which::Both);
    if wants(Which::Skiff) || both {
        relays.push((Which::Skiff, skiff));
    }
    if wants(Which::MoqRelay) || both {
        match moq {
            Some(p) => relays.push((Which::MoqRelay, p)),
            None if !wants(Which::MoqRelay) => {
                println!("moq_load: no moq-relay found (--moq-relay, $MOQ_RELAY); skiff-relay only")
            }
            None => return Err("no moq-relay found (--moq-relay, $MOQ_RELAY)".into()),
        }
    }
    if wants(Which::Direct) {
        relays.push((Which::Direct, PathBuf::new()));
    }
    println!(
        "moq_load: moq-net 0.3.18 clients, frame {} B, {} frames/group, fps {}, warm-up {} s, {} s measured, skiff-relay --threads {}, {} client threads, client cache {}",
        cli.frame_bytes,
        cli.group_frames,
        cli.fps,
        cli.warmup,
        cli.seconds,
        cli.skiff_threads,
        cli.client_threads,
        match cli.client_cache_kib {
            0 => "moq-net's default".to_owned(),
            kib => format!("{kib} KiB"),
        }
    );
    println!("transport: {}", transport_line(cli));
    if cli.broadcasts > 1 || cli.hang {
        println!(
            "broadcasts: {}{}",
            cli.broadcasts,
            if cli.hang {
                format!(
                    ", hang (catalog.json + H.264 track {TRACK}, {HANG_WIDTH}x{HANG_HEIGHT}), content at {} fps",
                    cli.content_fps
                        .map_or_else(|| cli.fps.clone(), |f| f.to_string())
                )
            } else {
                String::new()
            }
        );
    }
    if cli.kill {
        println!(
            "layout: ring of five relays (A-B-C and A-D-E-C, peered with --cluster-connect tcp://), publisher on A, subscribers on C, B killed (SIGKILL) {} s into the window; relay columns sum all five",
            KILL_AFTER.as_secs()
        );
    } else if cli.hops > 1 {
        println!(
            "layout: chain of {} relays (each dials the one before with --cluster-connect tcp://), publisher on the first, subscribers on {}; relay columns sum all of them",
            cli.hops,
            if cli.spread {
                "all of them, round robin"
            } else {
                "the last"
            }
        );
    }
    println!("{}", machine_line());
    header();
    for round in 0..cli.rounds.max(1) {
        for &n in &cli.subscribers {
            // Alternate which relay goes first from round to round.
            let order: Vec<&(Which, PathBuf)> = if round % 2 == 0 {
                relays.iter().collect()
            } else {
                relays.iter().rev().collect()
            };
            for (which, bin) in order {
                match run_row(cli, *which, bin, n, pace, catalog.as_ref()) {
                    Ok(mut row) => {
                        print_row(&mut row);
                        if cli.per_subscriber {
                            let p50s: Vec<String> =
                                row.per_sub_p50.iter().map(|v| format!("{v:.2}")).collect();
                            println!("  p50_ms by subscriber: {}", p50s.join(" "));
                        }
                    }
                    Err(e) => println!("{:<11} {:>5} failed: {e}", which.name(), n),
                }
            }
        }
    }
    println!("{}", machine_line());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A byte stream that answers with `input` and keeps what is written.
    struct Scripted {
        input: std::io::Cursor<Vec<u8>>,
        written: Vec<u8>,
    }

    impl Scripted {
        fn new(input: &str) -> Self {
            Self {
                input: std::io::Cursor::new(input.as_bytes().to_vec()),
                written: Vec::new(),
            }
        }
    }

    impl std::io::Read for Scripted {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            self.input.read(buf)
        }
    }

    impl std::io::Write for Scripted {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.written.extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    const HOST: SocketAddr =
        SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 4443);

    #[test]
    fn http_get_reads_the_body_its_content_length_gives() {
        let mut s = Scripted::new(
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\ncontent-length: 4\r\n\r\nabcdTRAILING",
        );
        let (status, body) = http_get(&mut s, HOST, "/certificate.sha256").unwrap();
        assert_eq!((status, body.as_str()), (200, "abcd"));
        assert_eq!(
            String::from_utf8(s.written).unwrap(),
            "GET /certificate.sha256 HTTP/1.1\r\nHost: 127.0.0.1:4443\r\nConnection: close\r\n\r\n"
        );
    }

    #[test]
    fn http_get_without_a_length_reads_to_the_end() {
        let mut s = Scripted::new("HTTP/1.1 404 Not Found\r\n\r\nno certificate");
        let (status, body) = http_get(&mut s, HOST, "/certificate.sha256").unwrap();
        assert_eq!((status, body.as_str()), (404, "no certificate"));
    }

    #[test]
    fn http_get_refuses_cut_and_chunked_answers() {
        let mut cut = Scripted::new("HTTP/1.1 200 OK\r\nContent-Le");
        assert!(http_get(&mut cut, HOST, "/").is_err());
        let mut empty = Scripted::new("");
        assert!(http_get(&mut empty, HOST, "/").is_err());
        let mut chunked = Scripted::new(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n0\r\n\r\n",
        );
        assert!(http_get(&mut chunked, HOST, "/").is_err());
        let mut garbage = Scripted::new("\u{16}\u{3}\u{1}\r\n\r\n");
        assert!(http_get(&mut garbage, HOST, "/").is_err());
    }

    #[test]
    fn only_the_old_code_unmapped_counts_as_an_old_group() {
        assert!(unmapped_old("invalid RESET_STREAM: 52"));
        assert!(!unmapped_old("invalid RESET_STREAM: 1"));
        assert!(!unmapped_old("invalid RESET_STREAM: 52x"));
        assert!(!unmapped_old("RESET_STREAM: 52"));
        assert!(!unmapped_old("connection lost"));
    }

    #[test]
    fn a_written_certificate_has_the_fingerprint_of_its_der() {
        let (dir, fingerprint) = write_certificate(0).unwrap();
        let pem = std::fs::read_to_string(dir.join("cert.pem")).unwrap();
        let key = std::fs::read_to_string(dir.join("key.pem")).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(key.starts_with("-----BEGIN PRIVATE KEY-----"));
        let der: Vec<u8> =
            moq_tokio::rustls::pki_types::pem::PemObject::from_pem_slice(pem.as_bytes())
                .map(|c: moq_tokio::rustls::pki_types::CertificateDer<'static>| c.to_vec())
                .unwrap();
        assert_eq!(fingerprint, sha256_hex(&der).unwrap());
        assert_eq!(fingerprint.len(), 64);
        assert!(moq_tokio::tls::parse_fingerprint(&fingerprint).is_ok());
    }

    fn shared_with_reads(reads: Vec<Vec<(u64, u64, u64)>>) -> Shared {
        let subs = reads
            .into_iter()
            .map(|r| {
                let s = SubStat::default();
                *s.reads.lock().unwrap() = r;
                s
            })
            .collect();
        Shared {
            epoch: Instant::now(),
            epoch_monotonic_ns: 0,
            marks: true,
            resubscribe: true,
            measuring: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            published: AtomicU64::new(0),
            subs,
            progress: tokio::sync::Notify::new(),
            cache_kib: 0,
            broadcasts: 1,
            hang: false,
        }
    }

    #[test]
    fn recovery_is_the_longest_pause_ending_after_the_kill() {
        const MS: u64 = 1_000_000;
        // Frames every 10 ms until 100 ms, then from 300 ms with sequence
        // numbers 5 on; a short pause at 320..340 ms does not count.
        let cut = vec![
            (0, 90 * MS, 9),
            (0, 100 * MS, 10),
            (0, 300 * MS, 15),
            (0, 320 * MS, 16),
            (0, 340 * MS, 17),
        ];
        // Frames every 10 ms across the kill: no gap.
        let steady = (0..40).map(|i| (0, i * 10 * MS, i)).collect();
        let silent = vec![(0, 50 * MS, 5)];
        let shared = shared_with_reads(vec![cut, steady, silent]);
        let r = recoveries(&shared, 110 * MS, Pace::Fps(100));
        assert_eq!(r[0].ms, Some(190.0));
        assert_eq!(r[0].gap_ms, 200.0);
        assert_eq!(r[0].skipped, 4);
        assert_eq!(r[1].ms, Some(0.0));
        assert_eq!(r[1].skipped, 0);
        assert_eq!(r[2].ms, None);
    }

    #[test]
    fn hang_frames_keep_their_size_and_carry_the_header_after_the_nal_head() {
        for (pts, key) in [(0u64, true), (33_333, false), (3_600_000_000, false)] {
            let mut payload = vec![0u8; 8333];
            let at = hang_frame(&mut payload, pts, key).unwrap();
            let (decoded, au) = skiff_core::hang::frame::decode(&payload).unwrap();
            assert_eq!(decoded, pts);
            assert_eq!(at, payload.len() - au.len() + NAL_HEAD);
            assert_eq!(header_offset(&payload, true), Some(at));
            let nal_len = u32::from_be_bytes(au[..4].try_into().unwrap()) as usize;
            assert_eq!(nal_len, au.len() - 4);
            let nal_type = skiff_core::hang::avc::nal_type(au[4]);
            assert_eq!(nal_type, if key { 5 } else { 1 });
        }
        assert_eq!(header_offset(&[1, 2, 3], false), Some(0));
        // Too short for the NAL head, the header and the check byte.
        assert_eq!(hang_frame(&mut [0u8; 20], 0, true), None);
    }

    #[test]
    fn the_hang_catalog_is_one_h264_rendition_the_recorder_stores() {
        let json = hang_catalog(30).unwrap();
        let (renditions, skipped) = skiff_relay::record::fmp4::catalog(&json).unwrap();
        assert!(skipped.is_empty());
        assert_eq!(renditions.len(), 1);
        match &renditions[0] {
            skiff_relay::record::fmp4::Rendition::Video(v) => {
                assert_eq!(v.name, TRACK);
                assert_eq!((v.width, v.height), (1280, 720));
            }
            other => panic!("not video: {other:?}"),
        }
    }

    #[test]
    fn broadcasts_are_named_load_or_load_slash_i() {
        assert_eq!(broadcast_name(0, 1), "load");
        assert_eq!(broadcast_name(7, 100), "load/7");
    }

    #[test]
    fn layouts_chain_spread_and_ring() {
        let cli = |args: &[&str]| {
            Cli::parse_from(std::iter::once("moq_load").chain(args.iter().copied()))
        };
        let one = Layout::new(&cli(&[]));
        assert!(!one.clustered());
        assert_eq!(one.subscribers, vec![0]);
        let chain = Layout::new(&cli(&["--hops", "3"]));
        assert_eq!(chain.dials, vec![vec![], vec![0], vec![1]]);
        assert_eq!((chain.publisher, chain.subscribers), (0, vec![2]));
        let spread = Layout::new(&cli(&["--hops", "3", "--spread"]));
        assert_eq!(spread.subscribers, vec![0, 1, 2]);
        let ring = Layout::new(&cli(&["--kill"]));
        assert_eq!(ring.dials.len(), 5);
        assert_eq!(ring.kill, Some(1));
        // Every relay dials only relays started before it.
        for (k, d) in ring.dials.iter().enumerate() {
            assert!(d.iter().all(|&p| p < k));
        }
    }
}
