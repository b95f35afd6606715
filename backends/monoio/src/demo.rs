//! `skiff-relay demo`: the server with the echo handler plus a loopback
//! load, to watch the runtime, metrics and drain work end to end.
//!
//! Each client is an OS thread with a blocking socket that writes a message,
//! reads the echo back, checks it byte for byte and repeats until the time
//! is up. When the session handler lands, this turns into a publisher and
//! subscribers speaking moq-lite.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::config::{DemoArgs, RelayConfig};
use crate::error::RelayError;
use crate::handler::EchoHandler;
use crate::metrics::Snapshot;
use crate::server::{self, ServerHandle};

/// The result of a demo run.
#[derive(Debug, Clone)]
pub struct DemoReport {
    /// The address the server listened on.
    pub addr: SocketAddr,
    /// Client threads that ran.
    pub clients: usize,
    /// Wall time of the load.
    pub elapsed: Duration,
    /// Completed round trips, all clients.
    pub round_trips: u64,
    /// Bytes echoed back and verified, all clients.
    pub echoed_bytes: u64,
    /// Clients that failed (I/O error or wrong echo), with the reason.
    pub failures: Vec<String>,
    /// Server counters at the end.
    pub server: Snapshot,
    /// Driver name per worker.
    pub drivers: Vec<&'static str>,
}

impl DemoReport {
    /// Echoed megabytes (10^6 bytes) per second.
    pub fn mb_per_sec(&self) -> f64 {
        self.echoed_bytes as f64 / 1e6 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

impl std::fmt::Display for DemoReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "demo: echo server on {} ({} workers: {})",
            self.addr,
            self.drivers.len(),
            self.drivers.join(", ")
        )?;
        writeln!(
            f,
            "demo: {} clients, {:.2} s, {} round trips, {:.1} MB/s echoed and verified",
            self.clients,
            self.elapsed.as_secs_f64(),
            self.round_trips,
            self.mb_per_sec()
        )?;
        writeln!(
            f,
            "demo: server accepted {} connections, refused {}, read {} bytes, wrote {} bytes",
            self.server.accepted, self.server.refused, self.server.bytes_in, self.server.bytes_out
        )?;
        for fail in &self.failures {
            writeln!(f, "demo: client failed: {fail}")?;
        }
        Ok(())
    }
}

/// Starts the echo server from `config` and drives it with `args.clients`
/// loopback clients for `args.duration` (or until `stop_early` is set),
/// then stops the server through its normal drain path.
///
/// # Errors
/// The server could not start or stop cleanly.
pub fn run(
    config: RelayConfig,
    args: DemoArgs,
    stop_early: Arc<AtomicBool>,
) -> Result<DemoReport, RelayError> {
    let server = server::start(config, |_| EchoHandler)?;
    run_against(server, args, stop_early)
}

fn run_against(
    server: ServerHandle,
    args: DemoArgs,
    stop_early: Arc<AtomicBool>,
) -> Result<DemoReport, RelayError> {
    let addr = server.local_addr();
    let msg_len = usize::try_from(args.message_bytes.0)
        .unwrap_or(usize::MAX)
        .clamp(1, 16 << 20);
    let deadline = Instant::now() + args.duration.0;
    let started = Instant::now();
    let clients: Vec<_> = (0..args.clients.max(1))
        .map(|i| {
            let stop = stop_early.clone();
            std::thread::Builder::new()
                .name(format!("demo-client-{i}"))
                .spawn(move || client(addr, i, msg_len, deadline, &stop))
                .map_err(RelayError::Spawn)
        })
        .collect::<Result<_, _>>()?;
    let mut report = DemoReport {
        addr,
        clients: clients.len(),
        elapsed: Duration::ZERO,
        round_trips: 0,
        echoed_bytes: 0,
        failures: Vec::new(),
        server: Snapshot::default(),
        drivers: server.drivers().iter().map(|d| d.name()).collect(),
    };
    for (i, c) in clients.into_iter().enumerate() {
        match c.join() {
            Ok(Ok((trips, bytes))) => {
                report.round_trips += trips;
                report.echoed_bytes += bytes;
            }
            Ok(Err(e)) => report.failures.push(format!("client {i}: {e}")),
            Err(_) => report.failures.push(format!("client {i}: panicked")),
        }
    }
    report.elapsed = started.elapsed();
    let metrics = server.metrics().clone();
    server.shutdown()?;
    report.server = metrics.total();
    Ok(report)
}

/// One client: returns (round trips, bytes verified).
fn client(
    addr: SocketAddr,
    seed: usize,
    len: usize,
    deadline: Instant,
    stop: &AtomicBool,
) -> io::Result<(u64, u64)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut out = vec![0u8; len];
    let mut back = vec![0u8; len];
    let (mut trips, mut bytes) = (0u64, 0u64);
    while Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
        for (j, b) in out.iter_mut().enumerate() {
            *b = (j as u64)
                .wrapping_mul(31)
                .wrapping_add(trips)
                .wrapping_add(seed as u64) as u8;
        }
        s.write_all(&out)?;
        s.read_exact(&mut back)?;
        if back != out {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "echo differs from what was sent",
            ));
        }
        trips += 1;
        bytes += len as u64;
    }
    Ok((trips, bytes))
}
