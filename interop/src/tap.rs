//! A transparent loopback TCP forwarder that records both directions (docs/protocol.md §7.3).
//!
//! Put a [`Tap`] between a client and a server: the client dials [`Tap::addr`], the tap
//! dials the real server and copies bytes both ways on plain std threads, recording each
//! chunk (with its direction) in arrival order. [`Capture`] turns the recording into
//! QMux records and frames via [`crate::wire`], and saves/loads it as hex text.
//!
//! The tap proxies exactly one connection. It only binds and dials loopback addresses.

use std::collections::BTreeMap;
use std::fmt;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::wire::{self, Frame, StreamLog, WireError};

/// How often blocked socket operations re-check the stop flag.
const POLL: Duration = Duration::from_millis(20);

/// Which way bytes travelled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Direction {
    /// From the side that dialed (the client) to the side that accepted (the server).
    ClientToServer,
    /// From the server to the client.
    ServerToClient,
}

impl Direction {
    /// The one-letter tag used in capture files: `C` or `S` (the sender).
    pub fn tag(self) -> char {
        match self {
            Self::ClientToServer => 'C',
            Self::ServerToClient => 'S',
        }
    }
}

/// Bytes read from one side in one `read` call (or one record line of a capture file).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chunk {
    /// Direction of travel.
    pub dir: Direction,
    /// The bytes.
    pub bytes: Vec<u8>,
}

/// One whole QMux record from a capture, with its direction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// Direction of travel.
    pub dir: Direction,
    /// The record, including its `Size` prefix.
    pub bytes: Vec<u8>,
}

#[derive(Default)]
struct Shared {
    chunks: Mutex<Vec<Chunk>>,
    stop: AtomicBool,
    accepted: AtomicBool,
    open: AtomicUsize,
    forwarders: Mutex<Vec<JoinHandle<()>>>,
}

impl Shared {
    fn record(&self, dir: Direction, bytes: &[u8]) {
        self.chunks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Chunk {
                dir,
                bytes: bytes.to_vec(),
            });
    }
}

/// A running wire tap. Dropping it stops forwarding and closes both connections.
pub struct Tap {
    addr: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

impl fmt::Debug for Tap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tap").field("addr", &self.addr).finish()
    }
}

impl Tap {
    /// Listen on `127.0.0.1:0` and forward the first connection to `upstream`.
    ///
    /// # Errors
    ///
    /// `upstream` is not loopback, or binding failed.
    pub fn start(upstream: SocketAddr) -> io::Result<Self> {
        if !upstream.ip().is_loopback() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the tap only forwards to loopback",
            ));
        }
        let listener = TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared::default());
        let acceptor = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("tap-accept".into())
                .spawn(move || accept_one(&listener, upstream, &shared))?
        };
        Ok(Self {
            addr,
            shared,
            acceptor: Some(acceptor),
        })
    }

    /// The address clients should dial instead of the server.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A snapshot of everything recorded so far.
    pub fn capture(&self) -> Capture {
        Capture {
            chunks: self
                .shared
                .chunks
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
        }
    }

    /// Wait until a connection was proxied and both directions reached EOF or failed.
    /// Returns `false` if that did not happen within `timeout`.
    pub fn wait_closed(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.shared.accepted.load(Ordering::SeqCst)
                && self.shared.open.load(Ordering::SeqCst) == 0
            {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Tap {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
        let forwarders = std::mem::take(
            &mut *self
                .shared
                .forwarders
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for forwarder in forwarders {
            let _ = forwarder.join();
        }
    }
}

fn accept_one(listener: &TcpListener, upstream: SocketAddr, shared: &Arc<Shared>) {
    let client = loop {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        match listener.accept() {
            Ok((stream, _)) => break stream,
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(2))
            }
            Err(_) => return,
        }
    };
    let Ok(server) = TcpStream::connect_timeout(&upstream, Duration::from_secs(5)) else {
        shared.accepted.store(true, Ordering::SeqCst);
        return;
    };
    let pairs = (|| -> io::Result<_> {
        client.set_nonblocking(false)?;
        for stream in [&client, &server] {
            stream.set_nodelay(true)?;
            stream.set_read_timeout(Some(POLL))?;
        }
        Ok([
            (
                client.try_clone()?,
                server.try_clone()?,
                Direction::ClientToServer,
            ),
            (server, client, Direction::ServerToClient),
        ])
    })();
    let Ok(pairs) = pairs else {
        shared.accepted.store(true, Ordering::SeqCst);
        return;
    };
    shared.open.store(2, Ordering::SeqCst);
    shared.accepted.store(true, Ordering::SeqCst);
    for (from, to, dir) in pairs {
        let shared_fwd = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("tap-forward".into())
            .spawn(move || {
                forward(from, to, dir, &shared_fwd);
                shared_fwd.open.fetch_sub(1, Ordering::SeqCst);
            });
        match spawned {
            Ok(handle) => shared
                .forwarders
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(handle),
            Err(_) => {
                shared.open.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }
}

fn forward(mut from: TcpStream, mut to: TcpStream, dir: Direction, shared: &Shared) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if shared.stop.load(Ordering::SeqCst) {
            let _ = from.shutdown(Shutdown::Both);
            let _ = to.shutdown(Shutdown::Both);
            return;
        }
        match from.read(&mut buf) {
            Ok(0) => {
                // Half-close: pass the EOF on, keep the other direction running.
                let _ = to.shutdown(Shutdown::Write);
                return;
            }
            Ok(n) => {
                // Record before forwarding, so a reply can never be logged before its cause.
                shared.record(dir, &buf[..n]);
                if to.write_all(&buf[..n]).is_err() {
                    let _ = from.shutdown(Shutdown::Read);
                    return;
                }
            }
            Err(err)
                if matches!(
                    err.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) => {}
            Err(_) => {
                let _ = to.shutdown(Shutdown::Write);
                return;
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Captures
// ---------------------------------------------------------------------------

/// A recording of one TCP connection, both directions, in arrival order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Capture {
    /// Recorded chunks in the order they were read.
    pub chunks: Vec<Chunk>,
}

impl Capture {
    /// All bytes sent in one direction, concatenated.
    pub fn bytes(&self, dir: Direction) -> Vec<u8> {
        self.chunks
            .iter()
            .filter(|chunk| chunk.dir == dir)
            .flat_map(|chunk| chunk.bytes.iter().copied())
            .collect()
    }

    /// Whole QMux records of both directions, interleaved in the order they completed.
    /// Bytes of an unfinished last record are left out (see [`Capture::tail`]).
    pub fn records(&self) -> Vec<Record> {
        let mut pending: BTreeMap<Direction, Vec<u8>> = BTreeMap::new();
        let mut out = Vec::new();
        for chunk in &self.chunks {
            let buf = pending.entry(chunk.dir).or_default();
            buf.extend_from_slice(&chunk.bytes);
            let (records, tail) = wire::split_records(buf);
            out.extend(records.into_iter().map(|bytes| Record {
                dir: chunk.dir,
                bytes: bytes.to_vec(),
            }));
            *buf = tail.to_vec();
        }
        out
    }

    /// Bytes of an incomplete final record in `dir` (empty after a clean session).
    pub fn tail(&self, dir: Direction) -> Vec<u8> {
        let bytes = self.bytes(dir);
        wire::split_records(&bytes).1.to_vec()
    }

    /// Every frame sent in `dir`, in order.
    ///
    /// # Errors
    ///
    /// Any record that does not decode.
    pub fn frames(&self, dir: Direction) -> Result<Vec<Frame>, WireError> {
        let bytes = self.bytes(dir);
        let mut frames = Vec::new();
        for record in wire::split_records(&bytes).0 {
            frames.extend(wire::parse_frames(wire::record_payload(record)?)?);
        }
        Ok(frames)
    }

    /// STREAM data, FIN, resets and stop-sendings sent in `dir`, per stream ID.
    ///
    /// # Errors
    ///
    /// As [`Capture::frames`].
    pub fn streams(&self, dir: Direction) -> Result<BTreeMap<u64, StreamLog>, WireError> {
        Ok(wire::reassemble(&self.frames(dir)?))
    }

    /// Serialize as text: `#` comment lines from `header`, then one record per line,
    /// `C` or `S` (the sender) followed by the record's bytes in spaced lowercase hex.
    /// An unfinished tail, if any, is written as a final line of its direction.
    pub fn to_text(&self, header: &str) -> String {
        let mut out = String::new();
        for line in header.lines() {
            out.push_str("# ");
            out.push_str(line);
            out.push('\n');
        }
        for record in self.records() {
            out.push(record.dir.tag());
            out.push(' ');
            out.push_str(&wire::to_hex(&record.bytes));
            out.push('\n');
        }
        for dir in [Direction::ClientToServer, Direction::ServerToClient] {
            let tail = self.tail(dir);
            if !tail.is_empty() {
                out.push_str("# unfinished record\n");
                out.push(dir.tag());
                out.push(' ');
                out.push_str(&wire::to_hex(&tail));
                out.push('\n');
            }
        }
        out
    }

    /// Parse the format written by [`Capture::to_text`] (one chunk per line).
    ///
    /// # Errors
    ///
    /// A line that is not a comment, blank, or `C`/`S` plus hex; carries the line number.
    pub fn from_text(text: &str) -> Result<Self, String> {
        let mut chunks = Vec::new();
        for (number, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (tag, hex) = line.split_at(1);
            let dir = match tag {
                "C" => Direction::ClientToServer,
                "S" => Direction::ServerToClient,
                _ => return Err(format!("line {}: bad direction", number + 1)),
            };
            let bytes =
                wire::from_hex(hex).ok_or_else(|| format!("line {}: bad hex", number + 1))?;
            chunks.push(Chunk { dir, bytes });
        }
        Ok(Self { chunks })
    }
}
