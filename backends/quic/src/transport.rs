//! [`QuicTransport`]: a quinn-proto connection behind skiff-core's
//! [`Transport`] trait, and [`pump`], which hands what the connection
//! received to the session.
//!
//! The session writes into the library's send buffers (`out: 0`: the driver
//! sends the library's datagrams) and is fed by [`pump`], which reads a
//! stream only as far as the session has room for: the bytes the session
//! released on it plus one receive window, less what was handed over
//! (docs/protocol.md §2.4, §11.4). The library gives a stream's credit back
//! as bytes leave its buffer, so a parked reader holds its peer to the
//! library's window plus that one.

use std::cell::Cell;
use std::collections::{HashMap, HashSet, VecDeque};
use std::string::String;
use std::time::Instant as StdInstant;

use bytes::Bytes;
use quinn_proto::{
    Connection, ConnectionError, Dir as QuicDir, ReadError, ReadableError, StreamEvent, VarInt,
    WriteError as QuicWriteError,
};
use skiff_core::session::Session;
use skiff_core::time::Instant;
use skiff_core::transport::{
    CloseCause, Closed, Event, OpenError, StreamError, Transport, WriteError, Written,
};
use skiff_core::wire::qmux::{Dir, StreamId};

use crate::config::{ALPNS, STREAM_WINDOW};

/// Streams a new connection's tables have room for before they grow: a
/// viewer's control streams (its SETUP, announcement and subscription
/// requests) fit.
const INITIAL_STREAMS: usize = 8;

/// One stream's receiving state, as the driver hands it to the session.
#[derive(Debug, Default)]
struct Recv {
    /// Bytes read from the library (handed over or pending).
    read: u64,
    /// Bytes the session took.
    taken: u64,
    /// Bytes the session released ([`Transport::release`]).
    released: u64,
    /// Bytes read from the library that the session did not take yet.
    pending: Option<Bytes>,
    /// The library reported the end of the stream.
    fin: bool,
    /// The end was handed to the session (or the stream was reset or
    /// stopped): nothing more comes.
    done: bool,
    /// Listed in [`QuicTransport::revisit`].
    listed: bool,
}

/// An event kept until [`pump`] hands it over.
#[derive(Debug)]
enum Owned {
    Established(&'static str),
    Stop { id: u64, code: u64 },
    Writable { id: u64 },
    Closed(OwnedClose),
}

/// How the connection ended, kept for [`Event::Closed`].
#[derive(Debug, Clone)]
struct OwnedClose {
    code: u64,
    reason: String,
    application: bool,
    cause: CloseCause,
}

/// A QUIC connection carrying one moq-lite session.
///
/// The driver owns the socket: it feeds the connection the datagrams the
/// endpoint routes to it ([`connection_mut`](Self::connection_mut)), runs
/// its timers ([`poll_timeout`](Self::quic_timeout),
/// [`handle_timeout`](Self::quic_handle_timeout)), sends what
/// `poll_transmit` of the library gives, and calls [`pump`] after each of
/// those.
pub struct QuicTransport {
    conn: Connection,
    /// The instant the core's [`Instant::ZERO`] stands for.
    epoch: StdInstant,
    /// The latest instant a call carried (for calls that carry none).
    now: Instant,
    protocol: Option<&'static str>,
    recv: HashMap<u64, Recv>,
    /// Streams with bytes to hand over, or waiting for the session to make
    /// room, in the order they became so.
    revisit: VecDeque<u64>,
    /// Streams whose last write found no credit.
    blocked: HashSet<u64>,
    events: VecDeque<Owned>,
    /// The budget this connection shares with the others of its worker
    /// ([`set_send_budget`](Self::set_send_budget)); `None`: the window
    /// stays as configured.
    send_budget: Option<u64>,
    /// The send window last given to the library.
    send_window: u64,
}

thread_local! {
    /// Connections of this thread that share a send budget
    /// ([`QuicTransport::set_send_budget`]).
    static SHARING: Cell<usize> = const { Cell::new(0) };
}

impl Drop for QuicTransport {
    fn drop(&mut self) {
        if self.send_budget.is_some() {
            let _ = SHARING.try_with(|n| n.set(n.get().saturating_sub(1)));
        }
    }
}

impl core::fmt::Debug for QuicTransport {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("QuicTransport")
            .field("protocol", &self.protocol)
            .field("closed", &self.conn.is_closed())
            .field("streams", &self.recv.len())
            .field("readable", &self.revisit.len())
            .field("blocked", &self.blocked.len())
            .finish()
    }
}

impl QuicTransport {
    /// Wraps `conn`; `epoch` is the std instant the core's instants count from.
    pub fn new(conn: Connection, epoch: StdInstant) -> Self {
        QuicTransport {
            conn,
            epoch,
            now: Instant::ZERO,
            protocol: None,
            // Room for a viewer's few streams that carry data in: a
            // connection with more grows them once, then keeps them.
            recv: HashMap::with_capacity(INITIAL_STREAMS),
            revisit: VecDeque::with_capacity(INITIAL_STREAMS),
            blocked: HashSet::new(),
            events: VecDeque::with_capacity(INITIAL_STREAMS),
            send_budget: None,
            send_window: crate::config::SEND_WINDOW,
        }
    }

    /// Shares `budget` bytes of unacknowledged or unsent data with the
    /// thread's other connections that have one: from the next
    /// [`fit_send_window`](Self::fit_send_window) on, this connection's
    /// send window is its share ([`send_window_for`](crate::config::send_window_for)).
    /// Only connections with a session share it: a handshake that was never
    /// finished takes no one's window.
    pub fn set_send_budget(&mut self, budget: Option<u64>) {
        match (self.send_budget.is_some(), budget.is_some()) {
            (false, true) => SHARING.with(|n| n.set(n.get() + 1)),
            (true, false) => SHARING.with(|n| n.set(n.get().saturating_sub(1))),
            _ => {}
        }
        self.send_budget = budget;
    }

    /// Gives the library this connection's share of its budget, among the
    /// thread's connections that share one, as its send window (writes past
    /// it are refused until acknowledgements come); nothing without a
    /// budget, or when the share did not change.
    pub fn fit_send_window(&mut self) {
        let Some(budget) = self.send_budget else {
            return;
        };
        let connections = SHARING.with(Cell::get);
        let window = crate::config::send_window_for(budget, connections);
        if window != self.send_window {
            self.send_window = window;
            self.conn.set_send_window(window);
        }
    }

    /// The library's connection (to hand it datagrams and endpoint events,
    /// and take its datagrams to send).
    pub fn connection_mut(&mut self) -> &mut Connection {
        &mut self.conn
    }

    /// The library's connection.
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    /// The std instant of a core instant.
    pub fn std_at(&self, at: Instant) -> StdInstant {
        self.epoch + std::time::Duration::from_micros(at.as_micros())
    }

    /// The core instant of a std instant.
    pub fn core_at(&self, at: StdInstant) -> Instant {
        let micros = at.saturating_duration_since(self.epoch).as_micros();
        Instant::from_micros(u64::try_from(micros).unwrap_or(u64::MAX))
    }

    /// When the library's timers are next due.
    pub fn quic_timeout(&mut self) -> Option<Instant> {
        let at = self.conn.poll_timeout()?;
        Some(self.core_at(at))
    }

    /// Runs the library's timers due at `now`.
    pub fn quic_handle_timeout(&mut self, now: Instant) {
        self.now = now;
        let at = self.std_at(now);
        self.conn.handle_timeout(at);
    }

    /// The protocol agreed in the handshake (the ALPN), once established.
    pub fn protocol(&self) -> Option<&'static str> {
        self.protocol
    }

    /// Moves the library's events into this transport's queues: new and
    /// readable streams, credit, resets, the handshake's end and the close.
    fn poll_library(&mut self) {
        while let Some(event) = self.conn.poll() {
            match event {
                quinn_proto::Event::HandshakeDataReady => {}
                quinn_proto::Event::Connected => {
                    let protocol = self
                        .conn
                        .crypto_session()
                        .handshake_data()
                        .and_then(|d| {
                            d.downcast::<quinn_proto::crypto::rustls::HandshakeData>()
                                .ok()
                        })
                        .and_then(|d| d.protocol)
                        .and_then(|p| ALPNS.iter().copied().find(|a| a.as_bytes() == p));
                    match protocol {
                        Some(p) => {
                            self.protocol = Some(p);
                            self.events.push_back(Owned::Established(p));
                        }
                        None => {
                            // rustls refuses a handshake without a common
                            // ALPN; a peer that offered none is refused here.
                            let at = self.std_at(self.now);
                            self.conn.close(
                                at,
                                VarInt::from_u32(crate::config::VERSION_NEGOTIATION_FAILED),
                                Bytes::from_static(b"no common protocol"),
                            );
                        }
                    }
                }
                quinn_proto::Event::ConnectionLost { reason } => {
                    self.events.push_back(Owned::Closed(close_of(&reason)));
                }
                quinn_proto::Event::Stream(s) => self.on_stream_event(s),
                quinn_proto::Event::DatagramReceived | quinn_proto::Event::DatagramsUnblocked => {}
            }
        }
    }

    fn on_stream_event(&mut self, event: StreamEvent) {
        match event {
            StreamEvent::Opened { dir } => {
                while let Some(id) = self.conn.streams().accept(dir) {
                    self.list(id.into());
                }
            }
            StreamEvent::Readable { id } => self.list(id.into()),
            StreamEvent::Writable { id } => {
                let id = u64::from(id);
                self.blocked.remove(&id);
                self.events.push_back(Owned::Writable { id });
            }
            StreamEvent::Finished { .. } => {}
            StreamEvent::Stopped { id, error_code } => {
                let id = u64::from(id);
                self.blocked.remove(&id);
                self.events.push_back(Owned::Stop {
                    id,
                    code: code_from_wire(error_code.into_inner()).unwrap_or(0),
                });
            }
            StreamEvent::Available { .. } => {
                // More streams may be opened: the session looks at what waits
                // to be opened on its next pass, which any event causes.
                self.events.push_back(Owned::Writable { id: u64::MAX });
            }
        }
    }

    /// Puts stream `id` on the list of streams to read.
    fn list(&mut self, id: u64) {
        let r = self.recv.entry(id).or_default();
        if !r.listed && !r.done {
            r.listed = true;
            self.revisit.push_back(id);
        }
    }

    /// Bytes of `id` that may be read from the library now.
    fn room(r: &Recv) -> u64 {
        r.released
            .saturating_add(STREAM_WINDOW)
            .saturating_sub(r.read)
    }

    /// The next bytes of `id` for the session: what it left last time, or
    /// what the library holds within the room; `None` when there is nothing
    /// (the stream stays listed only if it waits for room).
    fn next_data(&mut self, id: u64) -> Next {
        let Some(r) = self.recv.get_mut(&id) else {
            return Next::Nothing;
        };
        if r.done {
            return Next::Nothing;
        }
        if let Some(p) = r.pending.take() {
            return Next::Data {
                offset: r.taken,
                data: p,
                fin: r.fin,
            };
        }
        if r.fin {
            return Next::Data {
                offset: r.taken,
                data: Bytes::new(),
                fin: true,
            };
        }
        let room = Self::room(r);
        if room == 0 {
            return Next::Wait;
        }
        let qid = quinn_proto::StreamId::from(VarInt::from_u64(id).unwrap_or(VarInt::MAX));
        let mut stream = self.conn.recv_stream(qid);
        let mut chunks = match stream.read(true) {
            Ok(c) => c,
            Err(ReadableError::ClosedStream) | Err(ReadableError::IllegalOrderedRead) => {
                r.done = true;
                return Next::Nothing;
            }
        };
        let max = usize::try_from(room).unwrap_or(usize::MAX);
        let got = chunks.next(max);
        // Credit for what was read goes to the peer with the next datagram.
        let _ = chunks.finalize();
        match got {
            Ok(Some(chunk)) => {
                let len = chunk.bytes.len() as u64;
                let offset = r.read;
                r.read += len;
                Next::Data {
                    offset,
                    data: chunk.bytes,
                    fin: false,
                }
            }
            Ok(None) => {
                r.fin = true;
                Next::Data {
                    offset: r.taken,
                    data: Bytes::new(),
                    fin: true,
                }
            }
            Err(ReadError::Blocked) => Next::Nothing,
            Err(ReadError::Reset(code)) => {
                r.done = true;
                Next::Reset {
                    code: code_from_wire(code.into_inner()).unwrap_or(0),
                    final_size: r.read,
                }
            }
        }
    }
}

/// What [`QuicTransport::next_data`] found on a stream.
enum Next {
    /// Bytes from `offset` (and the end if `fin`).
    Data { offset: u64, data: Bytes, fin: bool },
    /// The peer reset the stream.
    Reset { code: u64, final_size: u64 },
    /// The session has no room on it yet.
    Wait,
    /// Nothing to read now.
    Nothing,
}

fn close_of(reason: &ConnectionError) -> OwnedClose {
    let (code, text, application, cause) = match reason {
        ConnectionError::ApplicationClosed(c) => (
            c.error_code.into_inner(),
            String::from_utf8_lossy(&c.reason).into_owned(),
            true,
            CloseCause::Peer,
        ),
        ConnectionError::ConnectionClosed(c) => (
            u64::from(c.error_code),
            String::from_utf8_lossy(&c.reason).into_owned(),
            false,
            CloseCause::Peer,
        ),
        ConnectionError::TimedOut => (
            0,
            String::from("idle timeout"),
            false,
            CloseCause::IdleTimeout,
        ),
        other => (0, other.to_string(), false, CloseCause::Peer),
    };
    OwnedClose {
        code,
        reason: text,
        application,
        cause,
    }
}

/// The first stream error code of the range WebTransport maps application
/// codes into; moq-dev's QUIC stacks send stream codes in this form on raw
/// QUIC too (docs/protocol.md §11.6).
const H3_FIRST: u64 = 0x52e4_a40f_a8db;
/// The last code of that range.
const H3_LAST: u64 = 0x52e5_ac98_3162;

/// A moq-lite stream code as it goes on the wire (the mapped form, which
/// every moq-dev peer reads).
pub fn code_to_wire(code: u32) -> u64 {
    let c = u64::from(code);
    H3_FIRST + c + c / 0x1e
}

/// A moq-lite stream code from the wire: a code in the mapped range is
/// mapped back (its reserved points, and codes past `u32`, give `None`);
/// any other is taken as it is.
pub fn code_from_wire(wire: u64) -> Option<u64> {
    if !(H3_FIRST..=H3_LAST).contains(&wire) {
        return Some(wire);
    }
    let shifted = wire - H3_FIRST;
    if shifted % 0x1f == 0x1e {
        return None;
    }
    Some(shifted - shifted / 0x1f)
}

/// A stream code for the library, in the mapped form.
fn wire_code(code: u64) -> VarInt {
    let code = u32::try_from(code).unwrap_or(0);
    VarInt::from_u64(code_to_wire(code)).unwrap_or(VarInt::MAX)
}

fn quic_id(id: StreamId) -> quinn_proto::StreamId {
    quinn_proto::StreamId::from(VarInt::from_u64(id.0).unwrap_or(VarInt::MAX))
}

/// Hands what the connection received to `session`: the handshake's end,
/// stream data (no more per stream than the session has room for), resets,
/// credit and the close. Returns true if anything was handed over. Call it
/// after every datagram, timer and write the connection saw.
pub fn pump<const N: usize>(
    session: &mut Session<'_, '_, '_, N, QuicTransport>,
    now: Instant,
) -> bool {
    let mut moved = false;
    session.transport_mut().now = now;
    session.transport_mut().poll_library();
    while let Some(e) = session.transport_mut().events.pop_front() {
        moved = true;
        let event = match &e {
            Owned::Established(p) => Event::Established { protocol: p },
            Owned::Stop { id, code } => Event::StopSending {
                id: StreamId(*id),
                code: *code,
            },
            Owned::Writable { id } => Event::StreamWritable { id: StreamId(*id) },
            Owned::Closed(c) => Event::Closed(Closed {
                code: c.code,
                reason: &c.reason,
                application: c.application,
                cause: c.cause,
            }),
        };
        if session.handle_event(now, event).is_err() {
            return moved;
        }
    }
    // Streams in the order they became readable; one that cannot take its
    // bytes whole keeps them and stays listed, the others go on.
    let count = session.transport().revisit.len();
    for _ in 0..count {
        let Some(id) = session.transport_mut().revisit.pop_front() else {
            break;
        };
        let keep = loop {
            match session.transport_mut().next_data(id) {
                Next::Nothing => break false,
                Next::Wait => break true,
                Next::Reset { code, final_size } => {
                    moved = true;
                    let event = Event::StreamReset {
                        id: StreamId(id),
                        code,
                        final_size,
                    };
                    if session.handle_event(now, event).is_err() {
                        return moved;
                    }
                    break false;
                }
                Next::Data { offset, data, fin } => {
                    let event = Event::StreamData {
                        id: StreamId(id),
                        offset,
                        data: &data,
                        at: 0,
                        fin,
                    };
                    let Ok(taken) = session.handle_event(now, event) else {
                        return true;
                    };
                    let t = session.transport_mut();
                    let Some(r) = t.recv.get_mut(&id) else {
                        break false;
                    };
                    r.taken += taken as u64;
                    moved |= taken > 0 || (fin && data.is_empty());
                    if taken < data.len() {
                        r.pending = Some(data.slice(taken..));
                        break true;
                    }
                    if fin {
                        r.done = true;
                        break false;
                    }
                }
            }
        };
        let t = session.transport_mut();
        match t.recv.get_mut(&id) {
            Some(_) if keep => t.revisit.push_back(id),
            Some(r) => {
                r.listed = false;
                if r.done {
                    t.recv.remove(&id);
                }
            }
            None => {}
        }
    }
    moved
}

impl Transport for QuicTransport {
    // QUIC delivers each stream in order, not the streams in the order the
    // peer wrote them.
    const ORDERED: bool = false;

    fn is_established(&self) -> bool {
        self.protocol.is_some() && !self.conn.is_closed()
    }

    fn is_closed(&self) -> bool {
        self.conn.is_closed()
    }

    fn is_drained(&self) -> bool {
        self.conn.is_drained()
    }

    fn open_stream(&mut self, dir: Dir) -> Result<StreamId, OpenError> {
        if self.is_closed() {
            return Err(OpenError::Closed);
        }
        let d = match dir {
            Dir::Bidi => QuicDir::Bi,
            Dir::Uni => QuicDir::Uni,
        };
        match self.conn.streams().open(d) {
            Some(id) => {
                let id = u64::from(id);
                if d == QuicDir::Bi {
                    self.recv.entry(id).or_default();
                }
                Ok(StreamId(id))
            }
            None => Err(OpenError::Limit),
        }
    }

    fn write_stream(
        &mut self,
        now: Instant,
        id: StreamId,
        data: &[u8],
        fin: bool,
        _out: &mut [u8],
    ) -> Result<Written, WriteError> {
        self.now = now;
        if self.is_closed() {
            return Err(WriteError::Closed);
        }
        let mut stream = self.conn.send_stream(quic_id(id));
        let taken = if data.is_empty() {
            0
        } else {
            match stream.write(data) {
                Ok(n) => n,
                Err(QuicWriteError::Blocked) => {
                    self.blocked.insert(id.0);
                    return Err(WriteError::Blocked);
                }
                Err(QuicWriteError::Stopped(_)) => return Err(WriteError::Reset),
                Err(QuicWriteError::ClosedStream) => return Err(WriteError::UnknownStream),
            }
        };
        if fin && taken == data.len() {
            match stream.finish() {
                Ok(()) => {}
                Err(quinn_proto::FinishError::Stopped(_)) => return Err(WriteError::Reset),
                Err(quinn_proto::FinishError::ClosedStream) => {
                    return Err(WriteError::Finished);
                }
            }
        }
        Ok(Written {
            data: taken,
            out: 0,
        })
    }

    fn set_priority(&mut self, id: StreamId, priority: i32) {
        // A stream the library no longer knows has nothing left to order.
        let _ = self.conn.send_stream(quic_id(id)).set_priority(priority);
    }

    fn send_credit(&self, id: StreamId) -> u64 {
        if self.conn.is_closed() || self.blocked.contains(&id.0) {
            0
        } else {
            STREAM_WINDOW
        }
    }

    fn recv_credit(&self, id: StreamId) -> u64 {
        match self.recv.get(&id.0) {
            Some(r) if !r.done => Self::room(r),
            Some(_) => 0,
            None => STREAM_WINDOW,
        }
    }

    fn release(&mut self, id: StreamId, n: u64) {
        let listed = match self.recv.get_mut(&id.0) {
            Some(r) => {
                r.released = r.released.saturating_add(n);
                r.listed || r.done
            }
            None => true,
        };
        // Room came back: the stream may have bytes the session can take now.
        if !listed {
            self.list(id.0);
        }
    }

    fn reset_stream(&mut self, id: StreamId, code: u64) -> Result<(), StreamError> {
        if self.is_closed() {
            return Err(StreamError::Closed);
        }
        if id.dir() == Dir::Uni && !id.is_local(self.side()) {
            return Err(StreamError::WrongDirection);
        }
        self.blocked.remove(&id.0);
        let code = wire_code(code);
        self.conn
            .send_stream(quic_id(id))
            .reset(code)
            .map_err(|_| StreamError::UnknownStream)
    }

    fn stop_sending(&mut self, id: StreamId, code: u64) -> Result<(), StreamError> {
        if self.is_closed() {
            return Err(StreamError::Closed);
        }
        if id.dir() == Dir::Uni && id.is_local(self.side()) {
            return Err(StreamError::WrongDirection);
        }
        // Nothing more is read: the entry goes now, unless the stream is
        // listed, whose next visit drops it.
        if self.recv.get(&id.0).is_some_and(|r| r.listed) {
            if let Some(r) = self.recv.get_mut(&id.0) {
                r.done = true;
                r.pending = None;
            }
        } else {
            self.recv.remove(&id.0);
        }
        let code = wire_code(code);
        self.conn
            .recv_stream(quic_id(id))
            .stop(code)
            .map_err(|_| StreamError::UnknownStream)
    }

    fn close(&mut self, code: u64, reason: &str) {
        if self.conn.is_closed() {
            return;
        }
        let at = self.std_at(self.now);
        let code = VarInt::from_u64(code).unwrap_or(VarInt::MAX);
        self.conn
            .close(at, code, Bytes::copy_from_slice(reason.as_bytes()));
    }

    fn poll_transmit(&mut self, now: Instant, _out: &mut [u8]) -> usize {
        self.now = now;
        0
    }

    fn poll_timeout(&self) -> Option<Instant> {
        // The library's timers are the driver's ([`QuicTransport::quic_timeout`]).
        None
    }

    fn handle_timeout(&mut self, now: Instant) -> Option<Closed<'static>> {
        self.now = now;
        None
    }
}

impl QuicTransport {
    /// Which end of the connection this is, in the core's terms.
    pub fn side(&self) -> skiff_core::wire::qmux::Side {
        match self.conn.side() {
            quinn_proto::Side::Client => skiff_core::wire::qmux::Side::Client,
            quinn_proto::Side::Server => skiff_core::wire::qmux::Side::Server,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_codes_map_both_ways() {
        // CANCEL, OLD, EVICTED as moq-dev's QUIC stacks send them.
        assert_eq!(code_to_wire(1), 0x52e4_a40f_a8dc);
        assert_eq!(code_to_wire(0x34), 0x52e4_a40f_a910);
        assert_eq!(code_to_wire(0x35), 0x52e4_a40f_a911);
        for c in [0u32, 1, 0x1d, 0x1e, 0x1f, 0x34, 0x35, 0xffff, u32::MAX] {
            assert_eq!(code_from_wire(code_to_wire(c)), Some(u64::from(c)));
        }
        // Plain codes (moq-relay's io_uring runtime, a dropped reader's 0).
        assert_eq!(code_from_wire(0), Some(0));
        assert_eq!(code_from_wire(0x34), Some(0x34));
        // A reserved point of the mapped range.
        assert_eq!(code_from_wire(H3_FIRST + 0x1e), None);
    }
}
