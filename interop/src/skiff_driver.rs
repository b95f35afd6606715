//! A small blocking driver that runs one sans-IO skiff [`Session`] over a real
//! loopback [`TcpStream`], on the calling (test) thread.
//!
//! The session performs no I/O and reads no clock (see `skiff_core::session`); this
//! module supplies both, as simply as possible:
//!
//! * **Clock.** [`Clock`] maps `std::time::Instant` onto skiff's microsecond
//!   [`Instant`], counted from when the clock was made. Create it before the session
//!   and pass [`Clock::now`] to `Session::new`.
//! * **Socket.** The stream is switched to non-blocking mode. Each turn of the loop
//!   reads what the kernel has, writes what it will take, and sleeps a little only
//!   when nothing moved.
//! * **Input.** A fixed read buffer, a core [`Inbox`], keeps every byte the session has
//!   not consumed yet: `handle_input` may take fewer bytes than offered (a partial
//!   record, or backpressure while local readers lag), and the inbox presents the rest
//!   again, oldest first. While the buffer is full and the session takes nothing, the
//!   driver stops reading, which backpressures the peer through TCP.
//! * **Output.** `poll_transmit` is drained into a write buffer, which is written to
//!   the socket fully (across turns if the kernel's buffer is full).
//! * **Timers.** `poll_timeout` / `handle_timeout` with the clock above.
//! * **Events.** Every event is copied into an owned [`Ev`] (events borrow the session)
//!   and handed to the caller's step closure of [`Driver::run_until`], together with
//!   `&mut Session`, so the closure may react with new requests or read local tracks.
//!   [`Driver::events`] keeps the whole log.
//! * **Deadline.** Everything is bounded by the deadline given to [`Driver::new`];
//!   a run that does not finish by then fails with [`DriveError::Timeout`].
//!
//! [`SkiffPublication`] puts a [`Publication`] into skiff's media model (a pool, a
//! track, a broadcast and an origin), and [`TrackReader`] reads a local track's groups frame by frame as they fill in, which
//! is also what lets the session return flow-control credit to the peer (credit for a
//! received group goes back only as local readers advance).
//!
//! This is test code: clarity over performance. Only loopback addresses are used.

use std::collections::BTreeMap;
use std::fmt;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::time::Duration as StdDuration;

use skiff_core::conn::Connection;
use skiff_core::model::group::{self, Next};
use skiff_core::model::path::Path;
use skiff_core::model::{broadcast, origin, track};
use skiff_core::pool::{BlockMeta, Pool};
use skiff_core::session::{Event, Gather, Handler, Inbox, Out, Session};
use skiff_core::time::Instant;
use skiff_core::wire::lite::SessionCode;

use crate::reference::{Frame, Group, Publication};

/// Size of the read buffer: several whole QMux records (one is at most 16 390 bytes).
const RX_BUF: usize = 128 * 1024;

/// Scratch for one `poll_transmit` call: at least one full record (16 390 bytes).
const TX_SCRATCH: usize = 32 * 1024;

/// Stop collecting `poll_transmit` output while this much waits to be written.
const TX_HIGH: usize = 256 * 1024;

/// How long an idle turn sleeps before looking at the socket again.
const IDLE_SLEEP: StdDuration = StdDuration::from_micros(500);

/// Bound on flushing our close frame and waiting for the peer's EOF in [`Driver::close`].
const CLOSE_GRACE: StdDuration = StdDuration::from_secs(3);

// ---------------------------------------------------------------------------
// Clock and sockets
// ---------------------------------------------------------------------------

/// Converts the std monotonic clock into skiff's [`Instant`] (µs since the clock was made).
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    start: std::time::Instant,
}

impl Clock {
    /// A clock whose zero is now.
    pub fn new() -> Self {
        Self {
            start: std::time::Instant::now(),
        }
    }

    /// The current time as a skiff instant.
    pub fn now(&self) -> Instant {
        let micros = self.start.elapsed().as_micros();
        Instant::from_micros(u64::try_from(micros).unwrap_or(u64::MAX))
    }

    /// How long until skiff instant `at` (zero if it has passed).
    pub fn until(&self, at: Instant) -> StdDuration {
        StdDuration::from_micros(at.as_micros().saturating_sub(self.now().as_micros()))
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

/// Bind a listener on `127.0.0.1:0`.
///
/// # Errors
///
/// Binding failed.
pub fn listen() -> io::Result<(TcpListener, SocketAddr)> {
    let listener = TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))?;
    let addr = listener.local_addr()?;
    Ok((listener, addr))
}

/// Accept one connection on `listener`, waiting at most `timeout`.
///
/// # Errors
///
/// [`io::ErrorKind::TimedOut`] if nobody connected in time, or the accept failed.
pub fn accept(listener: &TcpListener, timeout: StdDuration) -> io::Result<TcpStream> {
    listener.set_nonblocking(true)?;
    let deadline = std::time::Instant::now() + timeout;
    loop {
        match listener.accept() {
            Ok((stream, _)) => return Ok(stream),
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => {
                if std::time::Instant::now() >= deadline {
                    return Err(io::Error::new(io::ErrorKind::TimedOut, "no connection"));
                }
                std::thread::sleep(StdDuration::from_millis(1));
            }
            Err(err) => return Err(err),
        }
    }
}

/// Dial `addr` (loopback only), waiting at most `timeout`.
///
/// # Errors
///
/// `addr` is not loopback, or the connection failed.
pub fn dial(addr: SocketAddr, timeout: StdDuration) -> io::Result<TcpStream> {
    if !addr.ip().is_loopback() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "interop tests dial loopback only",
        ));
    }
    TcpStream::connect_timeout(&addr, timeout)
}

// ---------------------------------------------------------------------------
// Owned events
// ---------------------------------------------------------------------------

/// A session [`Event`] with its borrowed text copied out (shared with skiff-core's tests).
pub use skiff_core::session::OwnedEvent as Ev;

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

/// Why [`Driver::run_until`] gave up.
#[derive(Debug)]
pub enum DriveError {
    /// The deadline passed before the named step finished.
    Timeout(&'static str),
    /// A socket operation failed.
    Io(io::Error),
}

impl fmt::Display for DriveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Timeout(what) => write!(f, "timed out: {what}"),
            Self::Io(err) => write!(f, "io: {err}"),
        }
    }
}

impl std::error::Error for DriveError {}

impl From<io::Error> for DriveError {
    fn from(err: io::Error) -> Self {
        Self::Io(err)
    }
}

// ---------------------------------------------------------------------------
// Driver
// ---------------------------------------------------------------------------

/// Byte counts of one driver, for assertions and debugging.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Bytes read from the socket.
    pub read: u64,
    /// Bytes the session consumed.
    pub consumed: u64,
    /// Bytes written to the socket.
    pub written: u64,
    /// `handle_input` calls that consumed nothing while bytes were waiting.
    pub stalls: u64,
}

/// The events of a turn, as the handler of the session's events.
struct Log<'l>(&'l mut Vec<Ev>);

impl<'s, 'a, 'p, const N: usize> Handler<'s, 'a, 'p, N, Connection<N>> for Log<'_> {
    fn on_event(&mut self, _now: Instant, event: &Event<'_>) {
        self.0.push((*event).into());
    }
}

/// The write buffer as the session's output: each call writes into the
/// scratch buffer and its bytes are appended, until [`TX_HIGH`] bytes wait.
struct WriteBuffer<'b> {
    tx: &'b mut Vec<u8>,
    /// Bytes of `tx` already written to the socket.
    sent: usize,
    scratch: &'b mut [u8],
}

impl<'p> Out<'p> for WriteBuffer<'_> {
    fn must_flush(&self) -> bool {
        self.tx.len() - self.sent >= TX_HIGH
    }

    fn write<F>(&mut self, write: F) -> (usize, usize)
    where
        F: FnOnce(&mut [u8], Option<&mut dyn Gather<'p>>) -> usize,
    {
        (self.scratch.len(), write(&mut *self.scratch, None))
    }

    fn commit(&mut self, _room: usize, n: usize) -> bool {
        self.tx.extend_from_slice(&self.scratch[..n]);
        true
    }
}

/// One skiff session over one TCP connection, driven on the calling thread.
pub struct Driver<'s, 'a, 'p, const N: usize> {
    session: Session<'s, 'a, 'p, N>,
    stream: TcpStream,
    clock: Clock,
    deadline: std::time::Instant,
    rx: Inbox<Vec<u8>>,
    tx: Vec<u8>,
    tx_sent: usize,
    scratch: Vec<u8>,
    peer_eof: bool,
    events: Vec<Ev>,
    /// Events logged after the last step call of a run, not yet shown to a step.
    unseen: Vec<Ev>,
    stats: Stats,
}

impl<'s, 'a, 'p, const N: usize> Driver<'s, 'a, 'p, N> {
    /// Drive `session` over `stream` until `timeout` from now at the latest.
    ///
    /// `clock` must be the clock whose `now()` created the session.
    ///
    /// # Errors
    ///
    /// The socket could not be made non-blocking.
    pub fn new(
        session: Session<'s, 'a, 'p, N>,
        stream: TcpStream,
        clock: Clock,
        timeout: StdDuration,
    ) -> io::Result<Self> {
        stream.set_nonblocking(true)?;
        stream.set_nodelay(true)?;
        Ok(Self {
            session,
            stream,
            clock,
            deadline: std::time::Instant::now() + timeout,
            rx: Inbox::new(vec![0; RX_BUF]),
            tx: Vec::with_capacity(TX_HIGH + TX_SCRATCH),
            tx_sent: 0,
            scratch: vec![0; TX_SCRATCH],
            peer_eof: false,
            events: Vec::new(),
            unseen: Vec::new(),
            stats: Stats::default(),
        })
    }

    /// The session (read-only).
    pub fn session(&self) -> &Session<'s, 'a, 'p, N> {
        &self.session
    }

    /// The session, to make requests outside [`Driver::run_until`].
    pub fn session_mut(&mut self) -> &mut Session<'s, 'a, 'p, N> {
        &mut self.session
    }

    /// Every event reported so far, in order.
    pub fn events(&self) -> &[Ev] {
        &self.events
    }

    /// Byte counts so far.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// True once the peer shut its sending side down (we read EOF).
    pub fn peer_eof(&self) -> bool {
        self.peer_eof
    }

    /// Run the session until `step` returns `Some`, and return that.
    ///
    /// `step` is called once per turn of the loop with the session and the events that
    /// turn produced (often none); it may make requests, read local tracks, or decide
    /// the run is over. `what` names the step in a timeout error.
    ///
    /// # Errors
    ///
    /// [`DriveError::Timeout`] at the driver's deadline; [`DriveError::Io`] if the
    /// socket failed.
    pub fn run_until<T>(
        &mut self,
        what: &'static str,
        mut step: impl FnMut(&mut Session<'s, 'a, 'p, N>, &[Ev]) -> Option<T>,
    ) -> Result<T, DriveError> {
        // Events of the flush at the end of the previous run are this run's first news.
        let mut fresh = std::mem::take(&mut self.unseen);
        let mut logged = fresh.len();
        loop {
            let progress = self.turn(&mut fresh)?;
            self.events.extend(fresh[logged..].iter().cloned());
            logged = 0;
            if let Some(done) = step(&mut self.session, &fresh) {
                // Whatever the step asked for goes out before returning; events that
                // flush produces are handed to the next run's step.
                fresh.clear();
                self.turn(&mut fresh)?;
                self.events.extend(fresh.iter().cloned());
                self.unseen = fresh;
                return Ok(done);
            }
            fresh.clear();
            if std::time::Instant::now() >= self.deadline {
                return Err(DriveError::Timeout(what));
            }
            if !progress {
                let next_timer = self
                    .session
                    .poll_timeout()
                    .map_or(IDLE_SLEEP, |at| self.clock.until(at));
                std::thread::sleep(next_timer.min(IDLE_SLEEP));
            }
        }
    }

    /// Close the session with `code`, write the close frame, shut our sending side and
    /// wait (bounded) for the peer to close the connection (see [`Driver::finish`]).
    /// The close does nothing if the session is already closed.
    ///
    /// # Errors
    ///
    /// A socket failure while flushing the close.
    pub fn close(&mut self, code: SessionCode, reason: &str) -> Result<(), DriveError> {
        self.session.close(code, reason);
        self.finish()
    }

    /// Flush what is left to send (a close frame, if the session ended), shut our
    /// sending side down, and read until the peer's EOF; bounded by a short grace period.
    ///
    /// # Errors
    ///
    /// A socket failure while flushing.
    pub fn finish(&mut self) -> Result<(), DriveError> {
        let until = std::time::Instant::now() + CLOSE_GRACE;
        let mut fresh = Vec::new();
        while std::time::Instant::now() < until {
            fresh.clear();
            let progress = self.turn(&mut fresh)?;
            self.events.extend(fresh.iter().cloned());
            // Done once everything queued is written and, if the session ended, its
            // close frame went out.
            let closing = self.session.is_closed() && !self.session.is_drained();
            if self.tx_sent == self.tx.len() && !closing {
                break;
            }
            if !progress {
                std::thread::sleep(IDLE_SLEEP);
            }
        }
        let _ = self.stream.shutdown(Shutdown::Write);
        while !self.peer_eof && std::time::Instant::now() < until {
            fresh.clear();
            if !self.turn(&mut fresh)? {
                std::thread::sleep(IDLE_SLEEP);
            }
            self.events.extend(fresh.iter().cloned());
        }
        Ok(())
    }

    /// One turn: timers, socket read, session input, session output, socket write.
    /// Returns whether anything moved.
    fn turn(&mut self, fresh: &mut Vec<Ev>) -> Result<bool, DriveError> {
        let mut progress = false;
        let now = self.clock.now();

        progress |= self.session.run_timers(now);
        self.drain_events(fresh);

        progress |= self.read_socket()?;
        progress |= self.feed(now, fresh);

        progress |= self.collect_output(now);
        self.drain_events(fresh);
        progress |= self.write_socket()?;
        Ok(progress)
    }

    /// Read what the kernel has into the free end of the read buffer.
    fn read_socket(&mut self) -> Result<bool, DriveError> {
        if self.peer_eof || self.rx.is_full() {
            return Ok(false);
        }
        match self.stream.read(self.rx.spare_mut()) {
            Ok(0) => {
                self.peer_eof = true;
                Ok(true)
            }
            Ok(n) => {
                self.rx.commit(n);
                self.stats.read += n as u64;
                Ok(true)
            }
            Err(err) if is_transient(&err) => Ok(false),
            // The peer went away abruptly; the session notices through its own timers.
            Err(err) if is_disconnect(&err) => {
                self.peer_eof = true;
                Ok(true)
            }
            Err(err) => Err(err.into()),
        }
    }

    /// Present the unconsumed input to the session until it takes no more; the inbox
    /// keeps the rest.
    fn feed(&mut self, now: Instant, fresh: &mut Vec<Ev>) -> bool {
        let mut progress = false;
        loop {
            let result = self.rx.feed(&mut self.session, now);
            let events_before = fresh.len();
            self.drain_events(fresh);
            let fed = match result {
                Ok(fed) => fed,
                // The session is over: the inbox dropped what the peer still sent.
                Err(_) => return true,
            };
            if !fed.progress() {
                // A partial record, or backpressure. Polling events may have made room,
                // so try once more if any came out; otherwise wait for the next turn.
                if fresh.len() > events_before {
                    continue;
                }
                if self.session.is_stalled() {
                    self.stats.stalls += 1;
                }
                break;
            }
            self.stats.consumed += fed.consumed as u64;
            progress = true;
        }
        progress
    }

    /// Append `poll_transmit` output to the write buffer (up to [`TX_HIGH`]).
    fn collect_output(&mut self, now: Instant) -> bool {
        if self.tx_sent == self.tx.len() {
            self.tx.clear();
            self.tx_sent = 0;
        }
        let mut out = WriteBuffer {
            tx: &mut self.tx,
            sent: self.tx_sent,
            scratch: &mut self.scratch,
        };
        // A full buffer waits for the socket: the next turn collects more.
        self.session.transmit_to(now, &mut out).wrote
    }

    /// Write as much of the write buffer as the kernel takes.
    fn write_socket(&mut self) -> Result<bool, DriveError> {
        let mut progress = false;
        while self.tx_sent < self.tx.len() {
            match self.stream.write(&self.tx[self.tx_sent..]) {
                Ok(0) => {
                    return Err(io::Error::new(io::ErrorKind::WriteZero, "socket closed").into());
                }
                Ok(n) => {
                    self.tx_sent += n;
                    self.stats.written += n as u64;
                    progress = true;
                }
                Err(err) if is_transient(&err) => break,
                Err(err) if is_disconnect(&err) => {
                    // Nobody is listening any more: drop what was queued.
                    self.tx_sent = self.tx.len();
                    break;
                }
                Err(err) => return Err(err.into()),
            }
        }
        Ok(progress)
    }

    fn drain_events(&mut self, fresh: &mut Vec<Ev>) {
        // The log does not read the instant.
        self.session.deliver(Instant::ZERO, &mut Log(fresh));
    }
}

impl<const N: usize> fmt::Debug for Driver<'_, '_, '_, N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Driver")
            .field("session", &self.session)
            .field("rx_len", &self.rx.len())
            .field("tx_pending", &(self.tx.len() - self.tx_sent))
            .field("peer_eof", &self.peer_eof)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

fn is_transient(err: &io::Error) -> bool {
    matches!(
        err.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted | io::ErrorKind::TimedOut
    )
}

fn is_disconnect(err: &io::Error) -> bool {
    matches!(
        err.kind(),
        io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::NotConnected
    )
}

// ---------------------------------------------------------------------------
// Reading a local track
// ---------------------------------------------------------------------------

/// A frame being read.
struct Partial {
    timestamp: u64,
    len: usize,
    payload: Vec<u8>,
}

/// A group being read.
struct Reading<'t, 'p> {
    consumer: group::Consumer<'t, 'p>,
    frames: Vec<Frame>,
    current: Option<Partial>,
}

/// Reads every group of a local track frame by frame, as the groups fill in.
///
/// Call [`TrackReader::poll`] often (e.g. in every [`Driver::run_until`] step): it picks
/// up new groups, reads whatever bytes have arrived and thereby lets the session give
/// flow-control credit back to the peer.
pub struct TrackReader<'t, 'p> {
    track: track::Ref<'t, 'p>,
    reading: BTreeMap<u64, Reading<'t, 'p>>,
    complete: BTreeMap<u64, Vec<Frame>>,
    failed: BTreeMap<u64, String>,
    arrival: Vec<u64>,
}

impl<'t, 'p> TrackReader<'t, 'p> {
    /// A reader of `track` that has seen nothing yet.
    pub fn new(track: track::Ref<'t, 'p>) -> Self {
        Self {
            track,
            reading: BTreeMap::new(),
            complete: BTreeMap::new(),
            failed: BTreeMap::new(),
            arrival: Vec::new(),
        }
    }

    /// Pick up new groups and read every byte that has arrived.
    pub fn poll(&mut self) {
        for seq in self.track.sequences().collect::<Vec<_>>() {
            let known = self.reading.contains_key(&seq)
                || self.complete.contains_key(&seq)
                || self.failed.contains_key(&seq);
            if known {
                continue;
            }
            if let Some(consumer) = self.track.group(seq) {
                self.arrival.push(seq);
                self.reading.insert(
                    seq,
                    Reading {
                        consumer,
                        frames: Vec::new(),
                        current: None,
                    },
                );
            }
        }
        let mut finished = Vec::new();
        for (&seq, group) in &mut self.reading {
            match read_available(group) {
                Ok(true) => finished.push((seq, None)),
                Ok(false) => {}
                Err(err) => finished.push((seq, Some(err))),
            }
        }
        for (seq, err) in finished {
            if let Some(group) = self.reading.remove(&seq) {
                match err {
                    None => {
                        self.complete.insert(seq, group.frames);
                    }
                    Some(err) => {
                        self.failed.insert(seq, err);
                    }
                }
            }
        }
    }

    /// Groups read completely, by sequence.
    pub fn groups(&self) -> Vec<Group> {
        self.complete
            .iter()
            .map(|(&sequence, frames)| Group {
                sequence,
                frames: frames.clone(),
            })
            .collect()
    }

    /// How many groups were read completely.
    pub fn complete_count(&self) -> usize {
        self.complete.len()
    }

    /// Groups that failed to read (evicted, aborted), with the reason.
    pub fn failed(&self) -> &BTreeMap<u64, String> {
        &self.failed
    }

    /// Group sequences in the order the reader first saw them.
    pub fn arrival(&self) -> &[u64] {
        &self.arrival
    }

    /// Groups seen but not read to their end yet.
    pub fn pending_groups(&self) -> usize {
        self.reading.len()
    }
}

impl fmt::Debug for TrackReader<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TrackReader")
            .field("reading", &self.reading.keys().collect::<Vec<_>>())
            .field("complete", &self.complete.keys().collect::<Vec<_>>())
            .field("failed", &self.failed)
            .finish()
    }
}

/// Read what is available of one group; `Ok(true)` once it is complete.
fn read_available(group: &mut Reading<'_, '_>) -> Result<bool, String> {
    loop {
        if let Some(partial) = group.current.as_mut() {
            let done = loop {
                if partial.payload.len() == partial.len {
                    break true;
                }
                let taken = match group.consumer.payload_chunk() {
                    Ok(Next::Ready(chunk)) => {
                        partial.payload.extend_from_slice(chunk);
                        chunk.len()
                    }
                    Ok(Next::Pending) => break false,
                    Ok(Next::Finished) => break true,
                    Err(err) => return Err(format!("payload: {err}")),
                };
                group.consumer.advance(taken);
            };
            if !done {
                return Ok(false);
            }
            if let Some(partial) = group.current.take() {
                if partial.payload.len() != partial.len {
                    return Err("payload shorter than its header".into());
                }
                group.frames.push(Frame {
                    timestamp: partial.timestamp,
                    payload: partial.payload,
                });
            }
        }
        match group.consumer.read_frame_header() {
            Ok(Next::Ready(header)) => {
                group.current = Some(Partial {
                    timestamp: header.timestamp,
                    len: header.len,
                    payload: Vec::with_capacity(header.len),
                });
            }
            Ok(Next::Pending) => return Ok(false),
            Ok(Next::Finished) => return Ok(true),
            Err(err) => return Err(format!("header: {err}")),
        }
    }
}

// ---------------------------------------------------------------------------
// Local media (leaked: test-only)
// ---------------------------------------------------------------------------
//
// skiff's media model borrows caller-provided storage (a pool borrows its bytes, a
// track its pool, a broadcast and an origin their tracks and broadcasts). To keep the
// tests free of long chains of local borrows, these helpers leak the storage and hand
// out `'static` handles: a few megabytes per test, returned when the process exits.

/// Group slots of every track these helpers make.
pub const TRACK_GROUPS: usize = 16;

/// A `'static` block pool of `blocks` blocks of `block_size` bytes.
///
/// # Panics
///
/// If the layout is invalid (zero blocks or block size).
pub fn leak_pool(blocks: usize, block_size: usize) -> &'static Pool<'static> {
    let bytes = Box::leak(vec![0u8; blocks * block_size].into_boxed_slice());
    let meta = Box::leak((0..blocks).map(|_| BlockMeta::new()).collect::<Box<[_]>>());
    Box::leak(Box::new(
        Pool::from_parts(bytes, meta).expect("pool layout"),
    ))
}

/// A `'static` empty track with `info`, over `pool`.
pub fn leak_track(pool: &'static Pool<'static>, info: track::Info) -> track::Ref<'static, 'static> {
    let state: &'static track::State<'static, TRACK_GROUPS> =
        Box::leak(Box::new(track::State::new(pool, info)));
    state.handle()
}

/// skiff's track properties for a reference [`TrackInfo`](crate::reference::TrackInfo)
/// and track name.
///
/// # Panics
///
/// A name longer than skiff's limit, or timescale 0 (test inputs).
pub fn track_info(name: &str, info: crate::reference::TrackInfo) -> track::Info {
    track::Info::new(name)
        .expect("track name")
        .with_priority(info.priority)
        .with_max_age(skiff_core::time::Duration::from_millis(info.max_age_ms))
        .with_timescale(std::num::NonZeroU64::new(info.timescale).expect("timescale"))
}

/// A [`Publication`] in skiff's media model: one origin holding one broadcast with one
/// track, every group written (and the track finished if the publication says so)
/// *before* the broadcast is announced, as the reference publisher does.
pub struct SkiffPublication {
    /// The origin to hand to `Session::new`.
    pub origin: origin::Ref<'static, 'static>,
    /// The published track.
    pub track: track::Ref<'static, 'static>,
    /// The pool behind the track.
    pub pool: &'static Pool<'static>,
    /// The track's one producer: write more groups with it (a live publication), or
    /// finish it. Dropping it unfinished aborts the track.
    pub producer: track::Producer<'static, 'static>,
    _broadcast: broadcast::Producer<'static, 'static>,
}

impl SkiffPublication {
    /// Write `publication` into a fresh pool of `blocks` × `block_size` bytes.
    ///
    /// # Panics
    ///
    /// If the publication does not fit (pool too small, bad path) — a test bug.
    pub fn new(publication: &Publication, blocks: usize, block_size: usize) -> Self {
        let pool = leak_pool(blocks, block_size);
        let track = leak_track(pool, track_info(&publication.track, publication.info));
        let mut producer = track.producer().expect("fresh track");
        for group in &publication.groups {
            let mut writer = producer.create_group(group.sequence).expect("create group");
            for frame in &group.frames {
                writer
                    .write_frame(frame.timestamp, &frame.payload)
                    .expect("write frame");
            }
            writer.finish().expect("finish group");
        }
        if publication.finish {
            producer.finish();
        }
        let path = Path::new(&publication.broadcast).expect("broadcast path");
        let state: &'static broadcast::State<'static, 'static, 4> =
            Box::leak(Box::new(broadcast::State::new(path).expect("broadcast")));
        let broadcast = state.producer().expect("fresh broadcast");
        broadcast.add(track).expect("add track");
        let origin: &'static origin::State<'static, 'static, 8, 16> =
            Box::leak(Box::new(origin::State::new()));
        origin.handle().announce(state.handle()).expect("announce");
        Self {
            origin: origin.handle(),
            track,
            pool,
            producer,
            _broadcast: broadcast,
        }
    }
}

impl fmt::Debug for SkiffPublication {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SkiffPublication")
            .field("track", &self.track)
            .finish_non_exhaustive()
    }
}
