//! An in-memory stream transport shaped like a QUIC library (tests only): the
//! second [`Transport`] the session's suite runs over.
//!
//! Each stream keeps its received bytes in a queue of its own, the way a
//! QUIC library does, and the library returns stream credit to the peer
//! when bytes leave that queue (half a window at a time), not when the
//! session releases them. The window it grants is small ([`LIB_WINDOW`]). The
//! driver ([`pump`]) reads from a stream no more than the session has room
//! for: the bytes the session released so far plus the window the session's
//! QMux configuration names for that kind of stream, less what it already
//! handed over (docs/protocol.md §2.4). So a parked reader holds the peer to
//! that window plus the library's.
//!
//! The driver hands stream data over in the order its frames arrived (a
//! stream that cannot take its frame yet keeps it, and its later ones,
//! without holding up the other streams): the order QMux gives. A QUIC
//! library promises no order across streams, and there a subscribe stream's
//! SUBSCRIBE_END and FIN may overtake the group streams they cover. `Mem`
//! with `ORDERED` false models that: it hands request streams' frames over
//! before the group streams' frames of the same step and says it does not
//! order streams, so the session keeps an ended subscription open for late
//! groups (docs/protocol.md §11.7). Without that grace, the §6 clock session
//! and two other suite cases lose groups over it.
//!
//! Writes copy into the transport's own send queue and report `out: 0`;
//! what the transport sends is a list of [`Frame`]s that [`encode`] and
//! [`decode`] turn into bytes for the harness's links, which give them
//! latency and cut them into pieces. There is no connection-level credit,
//! no stream-count limit and no timer.

extern crate std;

use std::collections::{BTreeMap, VecDeque};
use std::string::String;
use std::vec::Vec;

use super::super::Session;
use super::Tap;
use crate::conn;
use crate::time::Instant;
use crate::transport::{
    CloseCause, Closed, Event, OpenError, StreamError, Transport, WriteError, Written,
};
use crate::wire::qmux::{Dir, Side, StreamId};

/// The stream receive window the library grants its peer.
pub const LIB_WINDOW: u64 = 1024;

/// The protocol the transport reports as agreed.
const PROTOCOL: &str = conn::MOQ_LITE_05;

/// What one transport sends the other.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// The sender is ready; its per-stream receive window.
    Hello { window: u64 },
    /// Stream bytes from `offset`, with FIN if `fin`.
    Data {
        id: u64,
        offset: u64,
        bytes: Vec<u8>,
        fin: bool,
    },
    /// The receiver of `id` accepts bytes up to `max`.
    Credit { id: u64, max: u64 },
    /// The sender abandoned `id` after `final_size` bytes.
    Reset { id: u64, code: u64, final_size: u64 },
    /// The receiver will not read `id`.
    Stop { id: u64, code: u64 },
    /// The sender closed the whole transport.
    Close { code: u64, reason: String },
}

/// One stream's state, both halves.
#[derive(Debug, Default)]
struct Stream {
    /// Bytes written (the next offset to send).
    sent: u64,
    /// The peer's credit: bytes it accepts in all.
    send_max: u64,
    /// FIN written, reset, or stopped by the peer: nothing more to write.
    send_done: bool,
    /// Received bytes not yet read by the driver.
    buf: VecDeque<u8>,
    /// Bytes read by the driver (the stream offset of `buf[0]`).
    read: u64,
    /// The credit last granted to the peer.
    granted: u64,
    /// Where the peer's FIN lies, once it arrived.
    fin_at: Option<u64>,
    /// The FIN was handed to the session.
    fin_read: bool,
    /// Reset by the peer or stopped by us: received bytes are dropped.
    recv_done: bool,
    /// Bytes the session released ([`Transport::release`]).
    released: u64,
}

/// A QUIC-like in-memory transport, one end of a pair. With `ORDERED`
/// false it reports that it does not order streams
/// ([`Transport::ORDERED`]), and [`pump`] hands over the frames of request
/// (bidi) streams before those of group (uni) streams that arrived in the
/// same step, as a QUIC library may: a subscription's END can overtake the
/// group streams it covers.
pub struct Mem<const ORDERED: bool = true> {
    side: Side,
    /// The session's read windows for uni, our bidi and the peer's bidi streams.
    read_window: [u64; 3],
    peer_window: Option<u64>,
    hello_sent: bool,
    established: bool,
    closed: bool,
    next: [u64; 2],
    streams: BTreeMap<u64, Stream>,
    /// Frames to send, oldest first.
    out: VecDeque<Frame>,
    /// Events for the session other than stream data, oldest first.
    events: VecDeque<Owned>,
    /// Data frames not yet handed to the session, in order of arrival: the
    /// stream and where the frame ends in it.
    readable: VecDeque<(u64, u64)>,
}

/// A transport event kept until the driver hands it over.
#[derive(Debug, Clone)]
enum Owned {
    Established,
    Reset { id: u64, code: u64, final_size: u64 },
    Stop { id: u64, code: u64 },
    Writable { id: u64 },
    Closed { code: u64, reason: String },
}

fn slot(dir: Dir) -> usize {
    match dir {
        Dir::Bidi => 0,
        Dir::Uni => 1,
    }
}

impl<const ORDERED: bool> Mem<ORDERED> {
    /// One end, `side`, with the session's read windows from `config`.
    pub fn new(side: Side, config: &conn::Config) -> Self {
        Mem::<ORDERED> {
            side,
            read_window: [
                config.max_stream_data_uni,
                config.max_stream_data_bidi_local,
                config.max_stream_data_bidi_remote,
            ],
            peer_window: None,
            hello_sent: false,
            established: false,
            closed: false,
            next: [0; 2],
            streams: BTreeMap::new(),
            out: VecDeque::new(),
            events: VecDeque::new(),
            readable: VecDeque::new(),
        }
    }

    /// The session's read window for stream `id`.
    fn window_of(&self, id: StreamId) -> u64 {
        match (id.dir(), id.is_local(self.side)) {
            (Dir::Uni, _) => self.read_window[0],
            (Dir::Bidi, true) => self.read_window[1],
            (Dir::Bidi, false) => self.read_window[2],
        }
    }

    /// The next frame to send, if any (the hello first).
    pub fn pop_frame(&mut self) -> Option<Frame> {
        if !self.hello_sent && !self.closed {
            self.hello_sent = true;
            self.check_established();
            return Some(Frame::Hello { window: LIB_WINDOW });
        }
        self.out.pop_front()
    }

    /// Puts back the unsent rest of a frame, to go first.
    pub fn unpop_frame(&mut self, frame: Frame) {
        self.out.push_front(frame);
    }

    fn check_established(&mut self) {
        if !self.established && self.hello_sent && self.peer_window.is_some() && !self.closed {
            self.established = true;
            self.events.push_back(Owned::Established);
        }
    }

    /// A stream the peer's frame names, created when the peer opens it.
    fn peer_stream(&mut self, id: u64) -> Option<&mut Stream> {
        let sid = StreamId(id);
        if !self.streams.contains_key(&id) {
            if sid.is_local(self.side) {
                return None;
            }
            let send_max = match sid.dir() {
                Dir::Bidi => self.peer_window.unwrap_or(0),
                Dir::Uni => 0,
            };
            self.streams.insert(
                id,
                Stream {
                    send_max,
                    send_done: sid.dir() == Dir::Uni,
                    granted: LIB_WINDOW,
                    ..Stream::default()
                },
            );
        }
        self.streams.get_mut(&id)
    }

    /// Applies a frame from the peer.
    pub fn receive(&mut self, frame: Frame) {
        if self.closed {
            return;
        }
        match frame {
            Frame::Hello { window } => {
                self.peer_window = Some(window);
                self.check_established();
            }
            Frame::Data {
                id,
                offset,
                bytes,
                fin,
            } => {
                let Some(s) = self.peer_stream(id) else {
                    return;
                };
                if s.recv_done {
                    return;
                }
                let end = offset + bytes.len() as u64;
                assert_eq!(offset, s.read + s.buf.len() as u64, "data in order");
                assert!(end <= s.granted, "the peer kept to its credit");
                s.buf.extend(bytes);
                if fin {
                    s.fin_at = Some(end);
                }
                self.readable.push_back((id, end));
            }
            Frame::Credit { id, max } => {
                if let Some(s) = self.streams.get_mut(&id)
                    && max > s.send_max
                {
                    s.send_max = max;
                    self.events.push_back(Owned::Writable { id });
                }
            }
            Frame::Reset {
                id,
                code,
                final_size,
            } => {
                let Some(s) = self.peer_stream(id) else {
                    return;
                };
                if s.recv_done || s.fin_read {
                    return;
                }
                s.recv_done = true;
                s.buf.clear();
                self.readable.retain(|r| r.0 != id);
                self.events.push_back(Owned::Reset {
                    id,
                    code,
                    final_size,
                });
            }
            Frame::Stop { id, code } => {
                if let Some(s) = self.streams.get_mut(&id)
                    && !s.send_done
                {
                    self.events.push_back(Owned::Stop { id, code });
                }
            }
            Frame::Close { code, reason } => {
                self.closed = true;
                self.out.clear();
                self.events.push_back(Owned::Closed { code, reason });
            }
        }
    }

    /// Up to `max` bytes waiting on `id` for the session, and whether they end the stream.
    fn peek(&self, id: u64, max: u64) -> (Vec<u8>, bool) {
        let Some(s) = self.streams.get(&id) else {
            return (Vec::new(), false);
        };
        let n = usize::try_from(max).unwrap_or(usize::MAX).min(s.buf.len());
        let fin = s.fin_at == Some(s.read + n as u64);
        (s.buf.iter().take(n).copied().collect(), fin)
    }

    /// The driver read `n` bytes of `id` (and the FIN with them if `fin`):
    /// they leave the receive queue, which returns their credit.
    fn consume(&mut self, id: u64, n: usize, fin: bool) {
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        s.buf.drain(..n.min(s.buf.len()));
        s.read += n as u64;
        if fin {
            s.fin_read = true;
        }
        // Half a window read since the last grant: grant a whole one again.
        if !s.recv_done && s.fin_at.is_none() && s.read + LIB_WINDOW >= s.granted + LIB_WINDOW / 2 {
            s.granted = s.read + LIB_WINDOW;
            self.out.push_back(Frame::Credit { id, max: s.granted });
        }
    }

    /// True if a stream holds bytes (or a FIN) the session has room for.
    pub fn has_room(&self) -> bool {
        self.readable.iter().any(|(id, _)| {
            self.streams.get(id).is_some_and(|s| {
                (!s.buf.is_empty() && self.room(*id) > 0)
                    || (s.fin_at == Some(s.read) && !s.fin_read)
            })
        })
    }

    /// Received bytes not yet handed to the session, over all streams.
    pub fn held(&self) -> usize {
        self.streams.values().map(|s| s.buf.len()).sum()
    }

    /// How many bytes of `id` the session has room for now.
    fn room(&self, id: u64) -> u64 {
        let Some(s) = self.streams.get(&id) else {
            return 0;
        };
        (s.released + self.window_of(StreamId(id))).saturating_sub(s.read)
    }
}

impl<const ORDERED: bool> Transport for Mem<ORDERED> {
    const ORDERED: bool = ORDERED;

    fn is_established(&self) -> bool {
        self.established && !self.closed
    }

    fn is_closed(&self) -> bool {
        self.closed
    }

    fn is_drained(&self) -> bool {
        self.closed && self.out.is_empty()
    }

    fn open_stream(&mut self, dir: Dir) -> Result<StreamId, OpenError> {
        if self.closed {
            return Err(OpenError::Closed);
        }
        let Some(window) = self.peer_window.filter(|_| self.established) else {
            return Err(OpenError::Limit);
        };
        let id = StreamId::new(self.side, dir, self.next[slot(dir)]).ok_or(OpenError::Limit)?;
        self.next[slot(dir)] += 1;
        self.streams.insert(
            id.value(),
            Stream {
                send_max: window,
                granted: LIB_WINDOW,
                recv_done: dir == Dir::Uni,
                ..Stream::default()
            },
        );
        Ok(id)
    }

    fn write_stream(
        &mut self,
        _now: Instant,
        id: StreamId,
        data: &[u8],
        fin: bool,
        _out: &mut [u8],
    ) -> Result<Written, WriteError> {
        if self.closed {
            return Err(WriteError::Closed);
        }
        if !self.established {
            return Err(WriteError::NotReady);
        }
        if !id.can_send(self.side) {
            return Err(WriteError::NotSendable);
        }
        let s = self
            .streams
            .get_mut(&id.value())
            .ok_or(WriteError::UnknownStream)?;
        if s.send_done {
            return Err(WriteError::Finished);
        }
        let credit = usize::try_from(s.send_max - s.sent).unwrap_or(usize::MAX);
        let n = data.len().min(credit);
        if n == 0 && !data.is_empty() {
            return Err(WriteError::Blocked);
        }
        let fin = fin && n == data.len();
        self.out.push_back(Frame::Data {
            id: id.value(),
            offset: s.sent,
            bytes: data[..n].to_vec(),
            fin,
        });
        s.sent += n as u64;
        s.send_done |= fin;
        Ok(Written { data: n, out: 0 })
    }

    fn send_credit(&self, id: StreamId) -> u64 {
        match self.streams.get(&id.value()) {
            Some(s) if self.is_established() && !s.send_done => s.send_max - s.sent,
            _ => 0,
        }
    }

    fn recv_credit(&self, id: StreamId) -> u64 {
        // What the peer may send before it waits for the session's readers:
        // up to the session's window past what it released, which the
        // driver reads, and the library's window past that.
        // A FIN counts once the session has it, as over QMux.
        match self.streams.get(&id.value()) {
            Some(s) if !s.recv_done && !s.fin_read => {
                let received = s.read + s.buf.len() as u64;
                (s.released + self.window_of(id) + LIB_WINDOW).saturating_sub(received)
            }
            _ => 0,
        }
    }

    fn release(&mut self, id: StreamId, n: u64) {
        if let Some(s) = self.streams.get_mut(&id.value()) {
            // The session releases bytes while it handles them, before the
            // driver marks them read: bound by what arrived.
            s.released = (s.released + n).min(s.read + s.buf.len() as u64);
        }
    }

    fn reset_stream(&mut self, id: StreamId, code: u64) -> Result<(), StreamError> {
        if self.closed {
            return Err(StreamError::Closed);
        }
        if !id.can_send(self.side) {
            return Err(StreamError::WrongDirection);
        }
        let s = self
            .streams
            .get_mut(&id.value())
            .ok_or(StreamError::UnknownStream)?;
        if !s.send_done {
            s.send_done = true;
            self.out.push_back(Frame::Reset {
                id: id.value(),
                code,
                final_size: s.sent,
            });
        }
        Ok(())
    }

    fn stop_sending(&mut self, id: StreamId, code: u64) -> Result<(), StreamError> {
        if self.closed {
            return Err(StreamError::Closed);
        }
        if !id.can_recv(self.side) {
            return Err(StreamError::WrongDirection);
        }
        let s = self
            .streams
            .get_mut(&id.value())
            .ok_or(StreamError::UnknownStream)?;
        if s.recv_done {
            return Ok(());
        }
        s.recv_done = true;
        s.buf.clear();
        self.readable.retain(|r| r.0 != id.value());
        if s.fin_at.is_none() {
            self.out.push_back(Frame::Stop {
                id: id.value(),
                code,
            });
        }
        Ok(())
    }

    fn close(&mut self, code: u64, reason: &str) {
        if !self.closed {
            self.closed = true;
            self.out.clear();
            self.out.push_back(Frame::Close {
                code,
                reason: reason.into(),
            });
        }
    }

    fn poll_transmit(&mut self, _now: Instant, _out: &mut [u8]) -> usize {
        0
    }

    fn poll_timeout(&self) -> Option<Instant> {
        None
    }

    fn handle_timeout(&mut self, _now: Instant) -> Option<Closed<'static>> {
        None
    }
}

/// Hands what `session`'s transport received to the session: its events
/// first, then stream data in order of arrival, each stream no more than
/// the session has room for. Returns whether anything was handed over.
pub fn pump<const N: usize, const ORDERED: bool>(
    session: &mut Session<'_, '_, '_, N, Mem<ORDERED>>,
    now: Instant,
) -> bool {
    let mut moved = false;
    while let Some(e) = session.transport_mut().events.pop_front() {
        moved = true;
        let event = match &e {
            Owned::Established => Event::Established { protocol: PROTOCOL },
            Owned::Reset {
                id,
                code,
                final_size,
            } => Event::StreamReset {
                id: StreamId(*id),
                code: *code,
                final_size: *final_size,
            },
            Owned::Stop { id, code } => Event::StopSending {
                id: StreamId(*id),
                code: *code,
            },
            Owned::Writable { id } => Event::StreamWritable { id: StreamId(*id) },
            Owned::Closed { code, reason } => Event::Closed(Closed {
                code: *code,
                reason,
                application: true,
                cause: CloseCause::Peer,
            }),
        };
        if session.handle_event(now, event).is_err() {
            return moved;
        }
    }
    // Frames in order of arrival, as QMux delivers them: a stream whose
    // frame the session cannot take whole (no room, or stalled) keeps it and
    // its later frames; the other streams go on.
    let mut frames: Vec<(u64, u64)> = session.transport_mut().readable.drain(..).collect();
    if !ORDERED {
        // Request streams first (a stable sort keeps each stream's order).
        frames.sort_by_key(|&(id, _)| StreamId(id).dir() == Dir::Uni);
    }
    let mut kept = VecDeque::new();
    let mut blocked: Vec<u64> = Vec::new();
    for (id, end) in frames {
        if blocked.contains(&id) {
            kept.push_back((id, end));
            continue;
        }
        let t = session.transport();
        let Some(s) = t.streams.get(&id) else {
            continue;
        };
        if s.recv_done || end < s.read || (end == s.read && (s.fin_read || s.fin_at != Some(end))) {
            // Delivered with an earlier frame, or dropped.
            continue;
        }
        let offset = s.read;
        let (data, fin) = t.peek(id, (end - s.read).min(t.room(id)));
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
        let all = taken == data.len();
        session.transport_mut().consume(id, taken, fin && all);
        moved |= taken > 0 || (fin && all);
        if offset + (taken as u64) < end || (fin && !all) {
            blocked.push(id);
            kept.push_back((id, end));
        }
    }
    let t = session.transport_mut();
    kept.extend(t.readable.drain(..));
    t.readable = kept;
    moved
}

/// Appends `frame` to `out` if `out` then holds at most `limit` bytes;
/// false (nothing appended) otherwise.
pub fn encode(frame: &Frame, out: &mut Vec<u8>, limit: usize) -> bool {
    let mut b = Vec::new();
    let put = |b: &mut Vec<u8>, v: u64| b.extend_from_slice(&v.to_le_bytes());
    match frame {
        Frame::Hello { window } => {
            b.push(0);
            put(&mut b, *window);
        }
        Frame::Data {
            id,
            offset,
            bytes,
            fin,
        } => {
            b.push(1);
            put(&mut b, *id);
            put(&mut b, *offset);
            b.push(u8::from(*fin));
            put(&mut b, bytes.len() as u64);
            b.extend_from_slice(bytes);
        }
        Frame::Credit { id, max } => {
            b.push(2);
            put(&mut b, *id);
            put(&mut b, *max);
        }
        Frame::Reset {
            id,
            code,
            final_size,
        } => {
            b.push(3);
            put(&mut b, *id);
            put(&mut b, *code);
            put(&mut b, *final_size);
        }
        Frame::Stop { id, code } => {
            b.push(4);
            put(&mut b, *id);
            put(&mut b, *code);
        }
        Frame::Close { code, reason } => {
            b.push(5);
            put(&mut b, *code);
            put(&mut b, reason.len() as u64);
            b.extend_from_slice(reason.as_bytes());
        }
    }
    if out.len() + b.len() > limit {
        return false;
    }
    out.extend_from_slice(&b);
    true
}

/// The bytes a data frame adds to its payload.
pub const DATA_OVERHEAD: usize = 1 + 8 + 8 + 1 + 8;

/// Reads fields from the front of a frame.
struct Fields<'b> {
    bytes: &'b [u8],
    pos: usize,
}

impl<'b> Fields<'b> {
    fn u64(&mut self) -> Option<u64> {
        let v = u64::from_le_bytes(self.bytes.get(self.pos..self.pos + 8)?.try_into().ok()?);
        self.pos += 8;
        Some(v)
    }

    fn take(&mut self, n: usize) -> Option<&'b [u8]> {
        let b = self.bytes.get(self.pos..self.pos + n)?;
        self.pos += n;
        Some(b)
    }
}

/// Decodes the frame at the front of `bytes`: the frame and its length, or
/// `None` while it is incomplete.
pub fn decode(bytes: &[u8]) -> Option<(Frame, usize)> {
    let mut f = Fields { bytes, pos: 1 };
    let frame = match *bytes.first()? {
        0 => Frame::Hello { window: f.u64()? },
        1 => {
            let id = f.u64()?;
            let offset = f.u64()?;
            let fin = f.take(1)?[0] != 0;
            let len = usize::try_from(f.u64()?).ok()?;
            let data = f.take(len)?.to_vec();
            Frame::Data {
                id,
                offset,
                bytes: data,
                fin,
            }
        }
        2 => Frame::Credit {
            id: f.u64()?,
            max: f.u64()?,
        },
        3 => Frame::Reset {
            id: f.u64()?,
            code: f.u64()?,
            final_size: f.u64()?,
        },
        4 => Frame::Stop {
            id: f.u64()?,
            code: f.u64()?,
        },
        5 => {
            let code = f.u64()?;
            let len = usize::try_from(f.u64()?).ok()?;
            let reason = std::str::from_utf8(f.take(len)?).ok()?.into();
            Frame::Close { code, reason }
        }
        t => panic!("unknown frame type {t}"),
    };
    Some((frame, f.pos))
}

/// The per-stream bytes of a logged direction of memory frames, as
/// [`Tap::new`] reads a QMux log.
pub fn tap(log: &[u8]) -> Tap {
    let mut tap = Tap::default();
    let mut rest = log;
    while !rest.is_empty() {
        let (frame, n) = decode(rest).expect("whole frames");
        match frame {
            Frame::Data { id, bytes, fin, .. } => {
                let e = tap.streams.entry(id).or_insert_with(|| {
                    tap.order.push(id);
                    (Vec::new(), false)
                });
                e.0.extend_from_slice(&bytes);
                e.1 |= fin;
            }
            Frame::Reset { id, code, .. } => tap.resets.push((id, code)),
            Frame::Stop { id, code } => tap.stops.push((id, code)),
            Frame::Close { code, .. } => tap.close = Some((true, code)),
            Frame::Hello { .. } | Frame::Credit { .. } => {}
        }
        rest = &rest[n..];
    }
    tap
}
