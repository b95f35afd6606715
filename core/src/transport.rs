//! The seam between a moq-lite [`Session`](crate::session::Session) and the
//! transport that carries its streams.
//!
//! A session needs streams from its transport and nothing else: it opens
//! streams of its own, learns of the peer's, writes within the credit the peer
//! grants, gives credit back as local readers consume, resets and stops
//! streams, closes the whole, and runs the transport's timers. [`Transport`]
//! is that list. The QMux [`Connection`](crate::conn::Connection) over one
//! TCP or WebSocket byte stream is the first implementation; a QUIC or
//! WebTransport library wrapped in a small adapter is another.
//!
//! # Receiving
//!
//! Receiving is the driver's part, because every transport receives in its
//! own way. The driver turns what its transport received into [`Event`]s and
//! hands each to [`Session::handle_event`](crate::session::Session::handle_event),
//! which takes stream data and says how many bytes it used. For QMux,
//! [`Session::handle_input`](crate::session::Session::handle_input) does this
//! for the received bytes itself: it decodes the records in place and keeps
//! what the session could not take yet at the front of the input.
//!
//! # Writing
//!
//! [`Transport::write_stream`] takes the longest prefix of the caller's data
//! that the peer's credit allows, and reports it as [`Written::data`]. A
//! transport that frames its own records (QMux) writes the record into the
//! caller's `out` buffer, which the session hands on to the driver through
//! [`poll_transmit`](crate::session::Session::poll_transmit), and reports
//! its length as [`Written::out`]. A stream library with a send buffer of its
//! own (a QUIC library) copies the bytes there and reports `out: 0`: the
//! session's `poll_transmit` then returns 0 and the driver lets the library
//! send. Writing the payload without a copy, as a record header in `out`
//! followed by the payload where it lies (a gathered write), is an optional
//! capability ([`Transport::GATHER`]); without it the session copies.
//!
//! # Flow control
//!
//! Both kinds of transport hold a sender to the credit its peer grants, but
//! they give the credit back at different moments, and that decides how far
//! a publisher gets ahead of a subscriber whose reader is parked:
//!
//! * **QMux** returns credit when the session calls [`Transport::release`]:
//!   for a group stream that happens as the group's local readers advance
//!   (its furthest-read position), so a parked reader holds the peer to one
//!   stream window of that group, with nothing else to arrange.
//! * **A QUIC library** returns credit when data leaves its receive buffer,
//!   that is when the driver reads it, whatever the session later does with
//!   it; `release` has nothing to give back there. A parked reader then
//!   still holds its peer to about one window only if the driver gives the
//!   library a small receive window per stream and reads only what the
//!   session has room for: on a stream, no more than the bytes the session
//!   released so far plus one window, less what it already handed over.
//!   Anything the driver reads beyond that is credit handed to the peer that
//!   no reader asked for.
//!
//! Credit the peer grants reaches the session the same way: QMux's arrives
//! with the input, whose handling lets the session write again; a library
//! that takes the peer's credit by itself reports it as
//! [`Event::StreamWritable`], since a session that found nothing it could
//! write skips its tables until something it is told about changes.
//!
//! docs/protocol.md §2.4 states the same rule per transport.

use crate::time::Instant;
use crate::wire::qmux::{Dir, StreamId};

pub use crate::conn::{CloseCause, Closed, Event, OpenError, StreamError, WriteError, Written};

/// What a moq-lite session needs from the transport carrying its streams
/// (see the [module documentation](self), which also covers how credit
/// flows back to the peer on each kind of transport).
///
/// Flow control differs between the two kinds in when credit goes back to
/// the peer. QMux returns it when the local reader releases (advances): a
/// parked reader holds its peer to one window by itself. A QUIC library
/// returns it when data leaves its receive buffer: a parked reader holds its
/// peer to about one window only if the driver gives the library a small
/// receive window and reads only what the session has room for (the bytes
/// released on the stream plus one window, less what it handed over).
///
/// Stream IDs follow QUIC's numbering (docs/protocol.md §1.6): the two low
/// bits name the opener and the direction. The session calls the methods
/// from its own calls (`handle_event`, `poll_transmit`, `handle_timeout`,
/// requests); every method returns at once, and none may block.
pub trait Transport {
    /// True if [`write_stream_header`](Self::write_stream_header) works: the
    /// session then writes group payload without copying it when the driver
    /// asks for a gathered transmit. False (the default): the session copies
    /// the payload with [`write_stream`](Self::write_stream) instead.
    const GATHER: bool = false;

    /// True if the peer's streams reach the session in the order the peer
    /// wrote them across streams (QMux: records on one byte stream). A QUIC
    /// library's streams do not: a subscription's END may overtake the group
    /// streams it covers, so the session keeps an ended subscription open
    /// for those for a short grace (docs/protocol.md §11.7).
    const ORDERED: bool = true;

    /// True once the transport may open and write streams (for QMux: the
    /// parameters went both ways and a protocol was agreed).
    fn is_established(&self) -> bool;

    /// True once the transport is over (closed by either side, or timed out).
    fn is_closed(&self) -> bool;

    /// True once closed and everything that had to be said (the close
    /// itself) went out: the driver may drop the transport.
    fn is_drained(&self) -> bool;

    /// Opens a stream of our own in direction `dir` and returns its ID.
    ///
    /// # Errors
    /// [`OpenError::Limit`] while the peer's stream grant is used up,
    /// [`OpenError::TableFull`] when no slot is left for it, or
    /// [`OpenError::Closed`].
    fn open_stream(&mut self, dir: Dir) -> Result<StreamId, OpenError>;

    /// Takes the longest prefix of `data` that the credit of `id` allows, with
    /// FIN if `fin` is set and all of `data` was taken. A transport that frames
    /// records writes the record at the front of `out` ([`Written::out`] its
    /// length); one that buffers the bytes itself leaves `out` alone and
    /// reports `out: 0`. An empty `data` with `fin` finishes the stream.
    ///
    /// # Errors
    /// [`WriteError::Blocked`] when no credit is left for non-empty data;
    /// [`WriteError::BufferTooSmall`] when `out` cannot hold a record with one
    /// byte; the stream-state errors. Nothing is taken on error.
    fn write_stream(
        &mut self,
        now: Instant,
        id: StreamId,
        data: &[u8],
        fin: bool,
        out: &mut [u8],
    ) -> Result<Written, WriteError>;

    /// Like [`write_stream`](Self::write_stream) for a payload of `len` bytes
    /// that stays where it lies: writes into `out` only what goes on the wire
    /// before the first [`Written::data`] payload bytes, which the driver sends
    /// right after those [`Written::out`] bytes (a gathered write). Called only
    /// when [`GATHER`](Self::GATHER) is true; the default refuses with
    /// [`WriteError::Unsupported`].
    ///
    /// # Errors
    /// As [`write_stream`](Self::write_stream).
    fn write_stream_header(
        &mut self,
        now: Instant,
        id: StreamId,
        len: usize,
        fin: bool,
        out: &mut [u8],
    ) -> Result<Written, WriteError> {
        let _ = (now, id, len, fin, out);
        Err(WriteError::Unsupported)
    }

    /// True if the transport can take stream data by reference
    /// ([`write_stream_ref`](Self::write_stream_ref)): passing it to a peer
    /// in the same process, or keeping the pool block itself in a send
    /// buffer until the peer acknowledges the bytes (QUIC); false (the
    /// default) for a transport that copies everything it sends.
    fn lends(&self) -> bool {
        false
    }

    /// Writes a reference to up to `len` bytes of `id` instead of the bytes:
    /// `lend` is told how many the credit allows and returns the token naming
    /// them (the session's [`Gather`](crate::session::Gather) keeps the
    /// range); [`Written::data`] says how many of them the stream took.
    /// `Ok(None)` (the default) if nothing was lent: the session sends the
    /// bytes instead.
    ///
    /// # Errors
    /// As [`write_stream_header`](Self::write_stream_header).
    fn write_stream_ref<F: FnOnce(usize) -> Option<u64>>(
        &mut self,
        now: Instant,
        id: StreamId,
        len: usize,
        fin: bool,
        out: &mut [u8],
        lend: F,
    ) -> Result<Option<Written>, WriteError> {
        let _ = (now, id, len, fin, out, lend);
        Ok(None)
    }

    /// Sets the sending priority of our stream `id` (higher first), for a
    /// transport that schedules its streams' bytes itself (a QUIC library):
    /// the session gives request streams the highest and group streams the
    /// order it sends them in (docs/protocol.md §11.5). QMux sends what the
    /// session writes in the order written, so the default does nothing.
    fn set_priority(&mut self, id: StreamId, priority: i32) {
        let _ = (id, priority);
    }

    /// Bytes [`write_stream`](Self::write_stream) may take on `id` right now
    /// (what the peer may take: stream and connection credit); 0 for a stream
    /// that is unknown, finished, reset or receive-only.
    fn send_credit(&self, id: StreamId) -> u64;

    /// Bytes the peer may still send on `id` before it runs out of the credit
    /// granted to it (0 for a stream that is unknown or done receiving).
    fn recv_credit(&self, id: StreamId) -> u64;

    /// The session has finished with `n` more received bytes of `id`: a
    /// transport that returns credit as the reader advances (QMux) grants it
    /// to the peer now; one that returned it when the bytes left its buffer
    /// has nothing to do.
    fn release(&mut self, id: StreamId, n: u64);

    /// Abandons our sending half of `id` with an application error code.
    ///
    /// # Errors
    /// [`StreamError::UnknownStream`], [`StreamError::WrongDirection`] for a
    /// receive-only stream, or [`StreamError::Closed`].
    fn reset_stream(&mut self, id: StreamId, code: u64) -> Result<(), StreamError>;

    /// Tells the peer we will not read `id` any more; what it still sends is
    /// dropped and its credit returned.
    ///
    /// # Errors
    /// [`StreamError::UnknownStream`], [`StreamError::WrongDirection`] for a
    /// send-only stream, or [`StreamError::Closed`].
    fn stop_sending(&mut self, id: StreamId, code: u64) -> Result<(), StreamError>;

    /// Closes the whole transport with an application code (a moq-lite session
    /// code) and a reason; a second call does nothing.
    fn close(&mut self, code: u64, reason: &str);

    /// Writes what the transport itself has to send (its parameters, credit,
    /// resets, the close) into `out` and returns how many bytes it wrote; a
    /// transport that sends on its own returns 0.
    #[must_use]
    fn poll_transmit(&mut self, now: Instant, out: &mut [u8]) -> usize;

    /// Room in a transmit buffer that takes any one write of this transport
    /// whole (QMux: a record at the peer's size limit, with its header). A
    /// transmit whose last round wrote nothing with this much room left had
    /// nothing more to send, not too little room, so the session's next
    /// transmit may skip its tables until something changes. The default,
    /// `usize::MAX`, never allows that: after writing, the next transmit
    /// walks the tables once more.
    fn whole_write_room(&self) -> usize {
        usize::MAX
    }

    /// When [`handle_timeout`](Self::handle_timeout) is next due, if ever.
    #[must_use]
    fn poll_timeout(&self) -> Option<Instant>;

    /// Runs the timers due at `now`; returns how the transport ended if one
    /// of them ended it (a handshake or idle timeout).
    #[must_use]
    fn handle_timeout(&mut self, now: Instant) -> Option<Closed<'static>>;
}
