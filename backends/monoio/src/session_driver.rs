//! Runs one sans-IO moq-lite [`Session`] over a TCP connection on monoio.
//!
//! Two tasks per connection:
//!
//! * a **reader** task ([`ByteRead`]) appends what the socket delivers to the
//!   connection's `Inbox` and wakes the session task; it stops reading while
//!   the inbox holds `INBOX_BYTES` (the session is backpressured, see
//!   skiff-core's session docs), so a slow session slows its peer down;
//! * the **session** task ([`drive`]) feeds the inbox to
//!   [`Session::handle_input`] (unconsumed bytes stay at the front and are
//!   presented again), runs timers, hands events to the [`App`], writes what
//!   [`Session::poll_transmit`] produces into the [`ByteWrite`] buffer and
//!   flushes it, then sleeps until new bytes, a timer, the drain signal or
//!   a change that concerns it on the thread's [`Notify`].
//!
//! What wakes a session for local media is exact, not guessed: before it
//! reads the tracks it serves, the session registers the thread's track
//! waker on each (`Notify::track_waker`, the core's own track wakers), so
//! any write to them wakes it; its place on the [`Notify`] follows the media
//! of those tracks and the media and consumption of the tracks it fills; and
//! after each pass it forwards the changes the session lists
//! ([`Session::poll_changed`]). An app whose events may concern other tasks
//! wakes them all ([`App::EVENTS_WAKE_ALL`]).
//!
//! An untrusted peer (a relay connection: [`ByteRead::guard`]) is held to
//! two more deadlines: the QMux handshake and its SETUP must complete, and a
//! QMux record once begun must complete, within the handshake timeout; else
//! the session closes with CONTROL_MESSAGE_TIMEOUT (a slowloris peer resets
//! the idle timer with every byte, so that alone would not catch it). A peer
//! that stops reading is caught by the writer ([`ByteWrite::flush`]
//! fails with `TimedOut`), which ends the session and returns its memory.
//!
//! On drain the session sends GOAWAY and keeps serving until the peer closes
//! (the server drops it at the drain timeout). A protocol error closes the
//! session with its code (the close frame is flushed before the socket
//! closes). Storage for a session comes from a per-thread free list
//! ([`StoragePool`]): after warm-up, a new connection allocates none, and no
//! frame ever does.

use std::cell::{Cell, RefCell};
use std::future::{Future, poll_fn};
use std::io;
use std::pin::pin;
use std::rc::Rc;
use std::task::{Poll, Waker};
use std::time::{Duration as StdDuration, Instant as StdInstant};

use monoio::io::{
    AsyncReadRent, AsyncWriteRent, CancelableAsyncWriteRent, Canceller, OwnedReadHalf,
    OwnedWriteHalf, Split, Splitable,
};
use skiff_core::pool::Slice;
use skiff_core::session::{Change, Event, Gather, LISTED_CHANGES, Session, Storage};
use skiff_core::time::Instant;
use skiff_core::wire::lite::{Role, SessionCode};
use skiff_core::wire::qmux::Side;

use crate::buffers::InboxSize;
use crate::cancel::{race, write_all_or_stall};
use crate::clock::Clock;
use crate::notify::{Notify, TrackKey};
use crate::shutdown::Shutdown;
use crate::staging::Staging;

/// Stream slots of one session's QMux connection (a quarter each are
/// advertised as the peer's bidi and uni stream limits: 20 requests and 20
/// group streams at once).
pub const STREAMS: usize = 80;

/// The tables of one client's session: 24 control streams sharing 8 control
/// buffers of 1 KiB (a stream holds one only while a message is on its way
/// or a prefix is kept; an answer takes the buffer its request leaves), 16
/// subscriptions each way, 16 group streams each way: 23 KiB. A limit
/// reached is refused on the wire, or waits (a control buffer), never grown.
pub type SessionStorage = Storage<'static, 'static, 24, 1024, 16, CLIENT_SUBSCRIPTIONS, 16, 16, 8>;

/// Subscriptions a client's session holds on its peer's tracks at once (the
/// `SUBS` of [`SessionStorage`]).
pub const CLIENT_SUBSCRIPTIONS: usize = 16;

/// A session whose media (origin, tracks, pool) lives for the whole thread.
pub type MoqSession<'s> = Session<'s, 'static, 'static, STREAMS>;

/// The reader stops reading while this many received bytes wait in the inbox.
use crate::buffers::INBOX_BYTES;

/// Most bytes one [`ByteRead::read`] of a connection returns (its read
/// buffer's capacity): the inbox has room for the bytes at which the reader
/// stops (256 KiB) plus one.
pub const READ_BUFFER_BYTES: usize = crate::buffers::INBOX_READ;

/// Capacity of a connection's staging buffer ([`ByteWrite::buffer`]).
pub const WRITE_BUFFER_BYTES: usize = crate::buffers::STAGING_CAPACITY;

/// Room offered to one `poll_transmit` call. Group payload is gathered from
/// the pool, not staged, so this holds record headers and control messages
/// (a longer control message is cut into several records); each call that
/// fills it is followed by another.
const TRANSMIT_CHUNK: usize = 1024;

/// Bytes to send (staged and gathered) are flushed to the socket once they
/// reach this much.
const FLUSH_AT: usize = 128 * 1024;

// `transmit` flushes once less than a [`TRANSMIT_CHUNK`] is left in the
// staging buffer, so the buffer never grows.
const _: () = assert!(WRITE_BUFFER_BYTES >= 2 * TRANSMIT_CHUNK);

// ---------------------------------------------------------------------------
// Storage pool
// ---------------------------------------------------------------------------

/// A per-thread free list of session tables (a [`SessionStorage`] by
/// default), so accepting a connection does not allocate them again.
pub struct StoragePool<T = SessionStorage> {
    free: RefCell<Vec<Box<T>>>,
}

impl<T> Default for StoragePool<T> {
    fn default() -> Self {
        StoragePool {
            free: RefCell::new(Vec::new()),
        }
    }
}

impl<T> std::fmt::Debug for StoragePool<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoragePool")
            .field("free", &self.free.borrow().len())
            .finish()
    }
}

/// Most storages a thread keeps for reuse.
const MAX_POOLED_STORAGE: usize = 256;

impl<T: Default> StoragePool<T> {
    /// An empty pool.
    pub fn new() -> Self {
        Self::default()
    }

    /// A storage, reused if one is free (the session clears it).
    pub fn take(&self) -> Box<T> {
        let reused = self.free.borrow_mut().pop();
        reused.unwrap_or_default()
    }

    /// Gives a storage back.
    pub fn give(&self, storage: Box<T>) {
        let mut free = self.free.borrow_mut();
        if free.len() < MAX_POOLED_STORAGE {
            free.push(storage);
        }
    }
}

// ---------------------------------------------------------------------------
// Byte I/O seams
// ---------------------------------------------------------------------------

/// The receiving half of a byte stream.
///
/// A reader either hands out bytes it read into a buffer of its own
/// ([`ByteRead::read`]), or, if it can, reads straight into the inbox
/// without waiting ([`ByteRead::try_read_into`]) and waits for readiness
/// holding no buffer ([`ByteRead::readable`]): an idle connection then holds
/// no read buffer at all, and received bytes are copied once fewer.
pub trait ByteRead: 'static {
    /// The next bytes received; empty at end of stream.
    fn read(&mut self) -> impl Future<Output = io::Result<&[u8]>>;
    /// Reads what has already arrived into `dst` without waiting:
    /// `Some(Ok(n))` (0 at end of stream), `Some(Err(e))` with
    /// [`io::ErrorKind::WouldBlock`] if nothing waits, or `None` if this
    /// reader cannot (then [`drive`] uses [`ByteRead::read`]). The default:
    /// `None`.
    fn try_read_into(&mut self, dst: &mut [u8]) -> Option<io::Result<usize>> {
        let _ = dst;
        None
    }
    /// Waits until [`ByteRead::try_read_into`] has bytes or the end to
    /// report (it may still find none: call it again). The default is ready.
    fn readable(&mut self) -> impl Future<Output = io::Result<()>> {
        std::future::ready(Ok(()))
    }
    /// What [`drive`] enforces on the peer at the other end (nothing by default:
    /// a trusted link or our own client).
    fn guard(&self) -> Guard {
        Guard::default()
    }
    /// The token counting the connection among those still in their
    /// handshake, if the peer is counted ([`HandshakeToken`]); [`drive`]
    /// marks it done once the session is established.
    fn take_handshake(&mut self) -> Option<HandshakeToken> {
        None
    }
    /// Whether the peer's data deserves an ACK at once after a read that
    /// drained the socket ([`drive`] says false once the peer's SETUP says
    /// it only subscribes: its records are small, nothing waits on their
    /// ACK, and ACKs ride on the media sent to it). The default ignores it.
    fn set_prompt_acks(&mut self, on: bool) {
        let _ = on;
    }
}

/// Deadlines [`drive`] enforces on an untrusted peer, beyond the session's own
/// timers (the QMux idle timeout is reset by any byte, so it does not catch a
/// peer that trickles them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Guard {
    /// The connection's id, for logs.
    pub conn: u64,
    /// The QMux handshake and the peer's SETUP must complete within this of
    /// the start, and a QMux record, once its first byte arrived, within this
    /// of it (a slowloris peer trickling bytes); otherwise the session is
    /// closed with CONTROL_MESSAGE_TIMEOUT 0x11 (docs/protocol.md §2.6, §3.15).
    /// `None`: no such deadline.
    pub handshake: Option<StdDuration>,
}

/// Counts one connection among those that have not finished their handshake
/// (a server's quota of such connections) until [`HandshakeToken::done`] or
/// its drop.
pub struct HandshakeToken {
    count: Rc<Cell<u32>>,
    counted: bool,
}

impl std::fmt::Debug for HandshakeToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandshakeToken")
            .field("counted", &self.counted)
            .finish()
    }
}

impl HandshakeToken {
    /// Counts one more connection in `count` until the token is done.
    pub fn new(count: Rc<Cell<u32>>) -> Self {
        count.set(count.get().saturating_add(1));
        HandshakeToken {
            count,
            counted: true,
        }
    }

    /// The handshake is over: the connection no longer counts.
    pub fn done(&mut self) {
        if std::mem::take(&mut self.counted) {
            self.count.set(self.count.get().saturating_sub(1));
        }
    }
}

impl Drop for HandshakeToken {
    fn drop(&mut self) {
        self.done();
    }
}

/// The sending half of a byte stream, with a staging buffer.
pub trait ByteWrite {
    /// The staging buffer (`poll_transmit` writes into its spare room).
    fn buffer(&mut self) -> &mut Staging;
    /// Sends and empties the staging buffer.
    fn flush(&mut self) -> impl Future<Output = io::Result<()>>;
    /// Flushes, then closes the sending direction.
    fn close(&mut self) -> impl Future<Output = io::Result<()>>;
    /// `Ready` once the transport has work of its own (a WebSocket pong or
    /// keep-alive ping, its idle deadline): [`drive`] wakes and flushes. The
    /// default (a plain byte stream) never has any.
    fn poll_transport(&mut self, cx: &mut std::task::Context<'_>) -> Poll<()> {
        let _ = cx;
        Poll::Pending
    }
    /// True when [`ByteWrite::flush`] has bytes of the transport's own to
    /// send although nothing is staged (default: never).
    fn wants_flush(&self) -> bool {
        false
    }
    /// Nothing is staged: a writer whose staging buffer comes from a pool
    /// may give it back until the next [`ByteWrite::buffer`] (default: keeps
    /// it).
    fn release(&mut self) {}
}

/// The receiving half of a split monoio stream (TCP to a peer, or a Unix
/// socket between workers), with the one read buffer it hands to the kernel.
#[derive(Debug)]
pub struct HalfReader<S> {
    half: OwnedReadHalf<S>,
    buf: Vec<u8>,
}

/// The sending half of a split monoio stream, with its staging buffer.
pub struct HalfWriter<S: AsyncWriteRent> {
    half: OwnedWriteHalf<S>,
    buf: Staging,
    /// The write-stall limit and the canceller it uses, if set.
    stall: Option<(StdDuration, Canceller)>,
}

impl<S: AsyncWriteRent> std::fmt::Debug for HalfWriter<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HalfWriter")
            .field("staged", &self.buf.len())
            .field("stall", &self.stall.as_ref().map(|s| s.0))
            .finish_non_exhaustive()
    }
}

impl<S: AsyncWriteRent> HalfWriter<S> {
    /// Makes [`ByteWrite::flush`] fail with [`io::ErrorKind::TimedOut`] once
    /// the stream accepted no byte for `limit` while bytes wait (the peer
    /// stopped reading); `None` (the default) waits forever.
    pub fn set_write_timeout(&mut self, limit: Option<StdDuration>) {
        self.stall = limit.map(|l| (l, Canceller::new()));
    }
}

/// Splits `stream` into halves with `capacity`-byte buffers, allocated once here.
pub fn split_halves<S: Split + AsyncWriteRent>(
    stream: S,
    capacity: usize,
) -> (HalfReader<S>, HalfWriter<S>) {
    let (r, w) = stream.into_split();
    (
        HalfReader {
            half: r,
            buf: Vec::with_capacity(capacity),
        },
        HalfWriter {
            half: w,
            buf: Staging::new(Vec::with_capacity(capacity)),
            stall: None,
        },
    )
}

impl<S: AsyncReadRent + 'static> ByteRead for HalfReader<S> {
    async fn read(&mut self) -> io::Result<&[u8]> {
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        let (res, buf) = self.half.read(buf).await;
        self.buf = buf;
        let n = res?;
        Ok(self.buf.get(..n).unwrap_or(&[]))
    }
}

impl<S: CancelableAsyncWriteRent> ByteWrite for HalfWriter<S> {
    fn buffer(&mut self) -> &mut Staging {
        &mut self.buf
    }
    async fn flush(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let out = self.buf.take();
        let (res, out) = match &mut self.stall {
            Some((limit, canceller)) => {
                write_all_or_stall(&mut self.half, out, Some((*limit, canceller))).await
            }
            None => write_all_or_stall(&mut self.half, out, None).await,
        };
        self.buf.restore(out);
        res
    }
    async fn close(&mut self) -> io::Result<()> {
        self.flush().await?;
        self.half.shutdown().await
    }
}

// ---------------------------------------------------------------------------
// The application seam
// ---------------------------------------------------------------------------

/// What a session takes once its peer's SETUP declared the peer's
/// [`Role`]: [`drive`] calls [`SetupTables::attach`] after handing the SETUP
/// event to the app and before the session reads on, so tables attached
/// there are in place before the peer's first request. A server that sizes
/// a session's media tables by what the peer does implements it; `()`
/// attaches nothing, and `Option<T>` what `T` does if it is `Some`.
pub trait SetupTables<'s, const N: usize> {
    /// Gives `session` what a peer of `role` needs.
    fn attach(self, session: &mut Session<'s, 'static, 'static, N>, role: Role);
}

impl<'s, const N: usize> SetupTables<'s, N> for () {
    fn attach(self, _session: &mut Session<'s, 'static, 'static, N>, _role: Role) {}
}

impl<'s, T: SetupTables<'s, N>, const N: usize> SetupTables<'s, N> for Option<T> {
    fn attach(self, session: &mut Session<'s, 'static, 'static, N>, role: Role) {
        if let Some(tables) = self {
            tables.attach(session, role);
        }
    }
}

/// What runs on top of a driven session of `N` stream slots (the relay, a
/// client; [`MoqSession`] unless it is a trunk).
pub trait App<const N: usize = STREAMS> {
    /// An event from the session (its text is borrowed for this call only).
    fn on_event(&mut self, event: &Event<'_>);
    /// Called after every round of events and whenever the thread's media
    /// changed: make requests on the session here.
    fn act(&mut self, session: &mut Session<'_, 'static, 'static, N>);
    /// The session is over.
    fn on_close(&mut self) {}
    /// Lends `slice` of group payload to the peer instead of sending its
    /// bytes, on a link inside one process whose session passes data by
    /// reference (STREAM_REF): the token that names it, or `None` to send
    /// the bytes (the default, and what a link does with every slot lent).
    fn lend(&self, slice: Slice<'static>) -> Option<u64> {
        let _ = slice;
        None
    }
    /// An instant at which the driver makes a pass although nothing woke
    /// the session, asked once before each wait (`now`: the pass's instant).
    /// The relay's worker links use it to look for lent blocks the other
    /// worker gave back. The default is `None`.
    fn wake_at(&mut self, now: Instant) -> Option<Instant> {
        let _ = now;
        None
    }
    /// Whether the app's events may change what other tasks of the thread
    /// wait on, so a pass that delivered events wakes every task. An app
    /// that wakes whom its events concern itself (the relay, by its policy's
    /// [`Effect`](skiff_core::relay::Effect)) says false. The default is true.
    const EVENTS_WAKE_ALL: bool = true;
}

// ---------------------------------------------------------------------------
// Inbox
// ---------------------------------------------------------------------------

/// Bytes the reader task received and the session has not consumed yet,
/// and the flags and wakers the two tasks share.
#[derive(Debug)]
pub(crate) struct Inbox {
    /// The received bytes, in a buffer from the thread's pool
    /// ([`crate::buffers::take_inbox`], of the [`InboxSize`] they need; the
    /// reader stops at [`INBOX_BYTES`]) while any wait; `None` while the
    /// session has taken everything.
    data: RefCell<Option<skiff_core::session::Inbox<Vec<u8>>>>,
    fresh: Cell<bool>,
    /// Whether the reader acknowledges a draining read at once
    /// ([`ByteRead::set_prompt_acks`]): until the peer's SETUP says it
    /// only subscribes.
    prompt_acks: Cell<bool>,
    /// The reader waits for the session to see the bytes of a full tiny
    /// buffer before it reads more ([`Inbox::waits_for_session`]).
    reader_parked: Cell<bool>,
    /// The size of buffer the next bytes go into: small once a buffer held
    /// more than a tiny buffer's worth, until [`TINY_RUN`] buffers in a row
    /// held no more than that; else tiny. So a publisher's frames start in
    /// a small buffer (even though its kernel sends each frame's first few
    /// bytes on their own, Nagle holding back the rest until they are
    /// acknowledged, and those bytes are taken by themselves) and a
    /// viewer's records in a tiny one, each without a move per frame.
    next_size: Cell<InboxSize>,
    /// Buffers in a row given back with no more than a tiny buffer's worth
    /// waiting in them at once (see [`Inbox::next_size`]).
    tiny_run: Cell<u8>,
    /// The most bytes waiting at once since the buffer was taken.
    peak: Cell<usize>,
    eof: Cell<bool>,
    error: Cell<bool>,
    stop: Cell<bool>,
    session_waker: RefCell<Option<Waker>>,
    reader_waker: RefCell<Option<Waker>>,
}

impl Inbox {
    /// An empty inbox (its buffer is taken when bytes arrive).
    fn new() -> Self {
        Inbox {
            data: RefCell::new(None),
            fresh: Cell::new(false),
            prompt_acks: Cell::new(true),
            reader_parked: Cell::new(false),
            next_size: Cell::new(InboxSize::Tiny),
            tiny_run: Cell::new(0),
            peak: Cell::new(0),
            eof: Cell::new(false),
            error: Cell::new(false),
            stop: Cell::new(false),
            session_waker: RefCell::new(None),
            reader_waker: RefCell::new(None),
        }
    }

    /// Bytes waiting.
    fn len(&self) -> usize {
        self.data.borrow().as_ref().map_or(0, |d| d.len())
    }

    /// Whether a tiny or small buffer holds more than its size is for
    /// ([`InboxSize::most_waiting`]: a viewer's records, a whole record) and
    /// the session has not seen those bytes yet: the reader then waits for
    /// the session's pass rather than moving them to a larger buffer, since
    /// most likely they are whole records the pass takes (a publisher's
    /// frame read in one go). Only bytes a pass left (the start of a long
    /// record, a stalled session's input) make the buffer move up a size,
    /// so a steady publisher costs no copy between buffers per frame.
    fn waits_for_session(&self) -> bool {
        self.fresh.get()
            && self.data.borrow().as_ref().is_some_and(|d| {
                InboxSize::of(d.capacity())
                    .is_some_and(|size| size < InboxSize::Large && d.len() > size.most_waiting())
            })
    }

    /// Gives the buffer back to the thread's pool if no byte waits in it.
    /// The size the next buffer is taken at follows this one's
    /// ([`Inbox::next_size`]; never large: a backlog is met when it comes).
    fn release_if_empty(&self) {
        let mut data = self.data.borrow_mut();
        if data.as_ref().is_some_and(|d| d.is_empty())
            && let Some(d) = data.take()
        {
            let size = InboxSize::of(d.capacity()).unwrap_or(InboxSize::Tiny);
            crate::buffers::give_inbox(d.into_inner());
            let peak = self.peak.replace(0);
            if size > InboxSize::Tiny && peak > crate::buffers::TINY_RECORD {
                self.tiny_run.set(0);
                self.next_size.set(InboxSize::Small);
            } else {
                let run = self.tiny_run.get().saturating_add(1);
                self.tiny_run.set(run);
                if run >= TINY_RUN {
                    self.next_size.set(InboxSize::Tiny);
                }
            }
        }
    }

    /// Notes that `waiting` bytes wait after a read (for
    /// [`Inbox::release_if_empty`]).
    fn note_waiting(&self, waiting: usize) {
        self.peak.set(self.peak.get().max(waiting));
    }

    fn wake_session(&self) {
        if let Some(w) = self.session_waker.borrow_mut().take() {
            w.wake();
        }
    }

    fn wake_reader(&self) {
        if let Some(w) = self.reader_waker.borrow_mut().take() {
            w.wake();
        }
    }

    fn set_waker(place: &RefCell<Option<Waker>>, waker: &Waker) {
        let mut p = place.borrow_mut();
        match &*p {
            Some(w) if w.will_wake(waker) => {}
            _ => *p = Some(waker.clone()),
        }
    }
}

impl Drop for Inbox {
    fn drop(&mut self) {
        if let Some(d) = self.data.get_mut().take() {
            crate::buffers::give_inbox(d.into_inner());
        }
    }
}

/// Buffers in a row that held no more than a tiny buffer's worth after which
/// a connection's next buffer is tiny again ([`Inbox::next_size`]): more
/// than the two buffers a publisher's frame may come in.
const TINY_RUN: u8 = 16;

/// A core inbox over a pooled buffer of `size`, with that size's room kept
/// free after the bytes waiting.
fn pooled_inbox(size: InboxSize) -> skiff_core::session::Inbox<Vec<u8>> {
    skiff_core::session::Inbox::with_min_room(crate::buffers::take_inbox(size), size.min_room())
}

/// Moves the bytes waiting in an inbox buffer to a larger one once more
/// waits than its size is for (a long record starting in a tiny buffer, a
/// backlog: a publisher's burst, a session that stopped taking bytes), so a
/// whole read fits after them again. `incoming`: the size of a read about
/// to be copied in, which must fit too. A buffer never moves down while
/// bytes wait; it goes back to its pool once they are all taken.
fn grow_if_backlogged(inbox: &mut skiff_core::session::Inbox<Vec<u8>>, incoming: usize) {
    let now = InboxSize::of(inbox.capacity()).unwrap_or(InboxSize::Large);
    let wanted = InboxSize::for_waiting(inbox.len(), incoming);
    if wanted <= now {
        return;
    }
    let mut larger = pooled_inbox(wanted);
    let waiting = inbox.unconsumed();
    if let Some(room) = larger.spare_mut().get_mut(..waiting.len()) {
        room.copy_from_slice(waiting);
        larger.commit(waiting.len());
        let smaller = std::mem::replace(inbox, larger);
        crate::buffers::give_inbox(smaller.into_inner());
    }
}

/// What one read into the inbox came to.
enum Received {
    /// Bytes were appended.
    Bytes,
    /// Nothing waits on the socket now (a direct reader only).
    Nothing,
    /// The peer closed its sending side.
    End,
    /// The socket failed, or a read did not fit.
    Failed,
}

/// The reader task: socket → inbox, until EOF, an error or the stop flag.
///
/// A direct read that returned less than the room it was offered drained the
/// socket: unless the read asked for a prompt ACK (which can release a
/// publisher's held-back segment at once, so that the next read finds it),
/// the task waits for readiness next instead of making a read that would find
/// nothing. A viewer's credit records then cost one read each, not two.
async fn read_loop<R: ByteRead>(mut reader: R, inbox: Rc<Inbox>) {
    let mut drained = false;
    loop {
        // Wait for room (backpressure) or the stop.
        poll_fn(|cx| {
            if inbox.stop.get() || (inbox.len() < INBOX_BYTES && !inbox.waits_for_session()) {
                inbox.reader_parked.set(false);
                Poll::Ready(())
            } else {
                inbox.reader_parked.set(true);
                Inbox::set_waker(&inbox.reader_waker, cx.waker());
                Poll::Pending
            }
        })
        .await;
        if inbox.stop.get() {
            return;
        }
        reader.set_prompt_acks(inbox.prompt_acks.get());
        let stopped = poll_fn(|cx| {
            if inbox.stop.get() {
                Poll::Ready(())
            } else {
                Inbox::set_waker(&inbox.reader_waker, cx.waker());
                Poll::Pending
            }
        });
        // Straight into the inbox if the reader can; the buffer is taken
        // only for bytes that arrived and given back while none wait.
        let direct = if std::mem::take(&mut drained) {
            Some(Received::Nothing)
        } else {
            let mut data = inbox.data.borrow_mut();
            let bytes = data.get_or_insert_with(|| pooled_inbox(inbox.next_size.get()));
            grow_if_backlogged(bytes, 0);
            let room = bytes.spare_mut().len();
            reader
                .try_read_into(bytes.spare_mut())
                .map(|res| match res {
                    Ok(0) => Received::End,
                    Ok(n) => {
                        bytes.commit(n);
                        drained = n < room && !inbox.prompt_acks.get();
                        Received::Bytes
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => Received::Nothing,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => Received::Nothing,
                    Err(e) => {
                        tracing::debug!(error = %e, "read failed");
                        Received::Failed
                    }
                })
        };
        let received = match direct {
            Some(Received::Nothing) => {
                inbox.release_if_empty();
                match race(reader.readable(), stopped).await {
                    Err(()) => return,
                    Ok(Ok(())) => continue,
                    Ok(Err(e)) => {
                        tracing::debug!(error = %e, "waiting for bytes failed");
                        Received::Failed
                    }
                }
            }
            Some(received) => received,
            None => match race(reader.read(), stopped).await {
                Err(()) => return,
                Ok(Ok([])) => Received::End,
                Ok(Ok(data)) => {
                    // Below INBOX_BYTES waiting, the spare room holds a whole read.
                    let mut slot = inbox.data.borrow_mut();
                    let bytes = slot.get_or_insert_with(|| {
                        pooled_inbox(
                            InboxSize::for_waiting(0, data.len()).max(inbox.next_size.get()),
                        )
                    });
                    grow_if_backlogged(bytes, data.len());
                    match bytes.spare_mut().get_mut(..data.len()) {
                        Some(room) => {
                            room.copy_from_slice(data);
                            bytes.commit(data.len());
                            Received::Bytes
                        }
                        None => {
                            tracing::warn!(len = data.len(), "read larger than the inbox's room");
                            Received::Failed
                        }
                    }
                }
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "read failed");
                    Received::Failed
                }
            },
        };
        match received {
            Received::Bytes => {
                inbox.note_waiting(inbox.len());
                inbox.fresh.set(true);
                inbox.wake_session();
            }
            Received::Nothing => {}
            Received::End => {
                inbox.eof.set(true);
                inbox.wake_session();
                return;
            }
            Received::Failed => {
                inbox.error.set(true);
                inbox.wake_session();
                return;
            }
        }
    }
}

// ---------------------------------------------------------------------------
// The session task
// ---------------------------------------------------------------------------

/// How a driven session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// The session closed (either side) and its close was sent.
    Closed,
    /// The peer closed the TCP connection without closing the session.
    PeerEof,
    /// The socket failed.
    SocketError,
}

/// Everything [`drive`] needs besides the session and the socket.
///
/// `shutdown`: a server session sends GOAWAY when it fires; a client session
/// closes with NO_ERROR.
#[derive(Debug, Clone)]
pub struct DriveCtx {
    /// The clock the session's instants come from.
    pub clock: Clock,
    /// The thread's media-change signal.
    pub notify: Rc<Notify>,
    /// The server's drain signal (`None` for clients).
    pub shutdown: Option<Shutdown>,
}

/// Runs `session` over `reader`/`writer` until it ends; see the module docs.
///
/// # Errors
/// The writer's error if sending failed.
///
/// The session comes boxed: it is the largest part of a connection, and a
/// future that took it by value would hold a copy of it in every caller's
/// state as well.
///
/// `tables`: what the session takes at the peer's SETUP ([`SetupTables`]:
/// the media tables of a session built without them); `()` for a session
/// whose storage has them already.
pub async fn drive<
    's,
    R: ByteRead,
    W: ByteWrite,
    A: App<N>,
    T: SetupTables<'s, N>,
    const N: usize,
>(
    mut session: Box<Session<'s, 'static, 'static, N>>,
    tables: T,
    mut reader: R,
    mut writer: W,
    app: &mut A,
    ctx: &DriveCtx,
) -> io::Result<Ended> {
    // Both buffers come from the thread's pools while bytes pass through.
    let inbox = Rc::new(Inbox::new());
    let guard = reader.guard();
    let mut handshake = reader.take_handshake();
    monoio::spawn(read_loop(reader, inbox.clone()));
    let res = session_loop(
        &mut session,
        Some(tables),
        &inbox,
        &mut writer,
        app,
        ctx,
        guard,
        &mut handshake,
    )
    .await;
    // Let the reader go (its in-flight read is dropped with it).
    inbox.stop.set(true);
    inbox.wake_reader();
    app.on_close();
    drop(session);
    ctx.notify.bump();
    let _ = writer.close().await;
    res
}

#[allow(clippy::too_many_arguments)]
async fn session_loop<'s, W: ByteWrite, A: App<N>, T: SetupTables<'s, N>, const N: usize>(
    session: &mut Session<'s, 'static, 'static, N>,
    mut tables: Option<T>,
    inbox: &Inbox,
    writer: &mut W,
    app: &mut A,
    ctx: &DriveCtx,
    guard: Guard,
    handshake: &mut Option<HandshakeToken>,
) -> io::Result<Ended> {
    let notify = &*ctx.notify;
    let limit = guard.handshake.map(crate::clock::to_core);
    let started = ctx.clock.now();
    // Since when the front of the input is a record that has not completed.
    let mut partial_since: Option<Instant> = None;
    let waiter = notify.waiter();
    // This task's waker: the session's place stays registered while it runs.
    let task = poll_fn(|cx| Poll::Ready(cx.waker().clone())).await;
    // What the place follows: the session's track set version and whether it
    // follows every change ([`follow`]).
    let mut followed: Option<(u64, bool)> = None;
    let mut sleep = pin!(monoio::time::sleep(StdDuration::from_secs(3600)));
    let mut armed: Option<Instant> = None;
    let mut goaway_sent = false;
    // One drain wait for the whole session (dropping it would unregister it).
    let mut drain = pin!(async {
        match &ctx.shutdown {
            Some(s) => s.wait().await,
            None => std::future::pending().await,
        }
    });
    let mut drain_seen = false;
    loop {
        let now = ctx.clock.now();
        crate::buffers::trim_if_due(now);
        let mut progress = false;
        // Events reach the app, which may change what other tasks wait on
        // (see [`App::EVENTS_WAKE_ALL`]).
        let mut events = false;
        // Whether the pass left work another pass may do at once: input it
        // did not take, events the app saw, a timeout or a close.
        let mut more = false;
        // Input: everything not consumed yet, oldest first.
        inbox.fresh.set(false);
        if !session.is_closed() {
            let mut slot = inbox.data.borrow_mut();
            let mut consumed = false;
            let mut empty = true;
            // A session stalled on input it already took (data passed by
            // reference) is called with no new bytes too.
            if slot.is_some() || session.is_stalled() {
                let data = slot.get_or_insert_with(|| pooled_inbox(InboxSize::Tiny));
                if let Ok(fed) = data.feed(session, now)
                    && fed.progress()
                {
                    progress = true;
                    consumed = true;
                    inbox.wake_reader();
                }
                empty = data.is_empty();
                more |= consumed && (!empty || session.is_stalled());
            }
            drop(slot);
            if empty {
                inbox.release_if_empty();
            }
            // The pass saw the bytes the reader waits on: if it took none,
            // the reader moves them to a larger buffer and reads on.
            if !consumed && inbox.reader_parked.get() {
                inbox.wake_reader();
            }
            // Slowloris: bytes waiting that the session could take but that
            // do not complete a record.
            if consumed || empty || session.is_stalled() {
                partial_since = None;
            } else if partial_since.is_none() {
                partial_since = Some(now);
            }
        }
        if let Some(limit) = limit
            && !session.is_closed()
        {
            let reason = if !session.is_setup() && now >= started.saturating_add(limit) {
                Some("handshake timeout")
            } else if partial_since.is_some_and(|t| now >= t.saturating_add(limit)) {
                Some("incomplete record timeout")
            } else {
                None
            };
            if let Some(reason) = reason {
                tracing::info!(conn = guard.conn, "{reason}: closing the connection");
                // docs/protocol.md §3.15: CONTROL_MESSAGE_TIMEOUT.
                session.close(SessionCode::ControlMessageTimeout, reason);
                progress = true;
                more = true;
            }
        }
        if session.is_setup()
            && let Some(mut h) = handshake.take()
        {
            h.done();
        }
        if session.poll_timeout().is_some_and(|t| t <= now) {
            session.handle_timeout(now);
            more = true;
        }
        while let Some(ev) = session.poll_event() {
            let setup = match ev {
                Event::Setup { role, .. } => Some(role),
                _ => None,
            };
            app.on_event(&ev);
            progress = true;
            events = true;
            more = true;
            // The session reads on past the SETUP only now: its media tables
            // are in place before the peer's first request.
            if let Some(role) = setup {
                inbox.prompt_acks.set(role != Role::Subscriber);
                if let Some(tables) = tables.take() {
                    tables.attach(session, role);
                }
            }
        }
        app.act(session);
        if !goaway_sent && ctx.shutdown.as_ref().is_some_and(Shutdown::is_draining) {
            goaway_sent = true;
            // docs/protocol.md §3.12: a server tells the peer to move on and keeps
            // serving until it does; a client just closes.
            if session.side() == Side::Client || session.goaway("").is_err() {
                session.close(SessionCode::NoError, "shutting down");
            }
        }

        // Core wakers: the next change of a track this session serves, by
        // whoever makes it, wakes the session. Registered after the input
        // and the app (which may start serving) and before `transmit` reads
        // the tracks, so no change after the read is missed.
        // The session's place follows the same tracks from now on, so a
        // change while it runs is seen by its next wait.
        for track in session.served_tracks() {
            track.wake_on_change(&ctx.notify.track_waker(track.key()));
        }
        let version = session.tracks_version();
        if followed != Some((version, follows_every_change(session))) {
            followed = Some((version, follow(session, &waiter, &task)));
        } else {
            waiter.rearm(&task);
        }
        let sent = transmit(session, now, writer, &*app).await?;
        progress |= sent;
        if session.is_closed() && (session.is_drained() || !progress) {
            return Ok(Ended::Closed);
        }
        if inbox.error.get() {
            return Ok(Ended::SocketError);
        }
        if inbox.eof.get() && (inbox.len() == 0 || !progress) {
            return Ok(Ended::PeerEof);
        }
        if progress {
            forward_changes(session, notify, events && A::EVENTS_WAKE_ALL);
        }
        // A pass that took all its input and only sent besides (a
        // publisher's frame, a viewer's media and credit) left nothing it
        // could do at once: what lets it do more (bytes, media, credit)
        // wakes it, and the waiter it armed before sending keeps any change
        // since. So it goes to wait rather than walk its tables again for
        // nothing, and the tasks its changes woke run sooner.
        if more || (progress && session.is_closed()) {
            continue;
        }

        // Sleep until something can change.
        let mut deadline = session.poll_timeout();
        // A pass the app asks for although nothing wakes the task.
        if let Some(at) = app.wake_at(now) {
            deadline = Some(deadline.map_or(at, |d| d.min(at)));
        }
        if let Some(limit) = limit
            && !session.is_closed()
        {
            let guard_at = [
                (!session.is_setup()).then(|| started.saturating_add(limit)),
                partial_since.map(|t| t.saturating_add(limit)),
            ];
            for at in guard_at.into_iter().flatten() {
                deadline = Some(deadline.map_or(at, |d| d.min(at)));
            }
        }
        // Re-arm only for an earlier deadline: the idle deadline moves later
        // with every byte, and a timer that fires early costs one pass, which
        // arms it again for the deadline then.
        if let Some(at) = deadline
            && armed.is_none_or(|a| at < a)
        {
            armed = Some(at);
            let wait = crate::clock::to_std(at.saturating_duration_since(now));
            sleep
                .as_mut()
                .reset(monoio::time::Instant::from_std(StdInstant::now() + wait));
        }
        let shutdown = ctx.shutdown.as_ref().filter(|_| !goaway_sent);
        let session_ref = &*session;
        poll_fn(|cx| {
            if waiter.take_concerned()
                || inbox.fresh.get()
                || inbox.eof.get()
                || inbox.error.get()
                || shutdown.is_some_and(Shutdown::is_draining)
            {
                return Poll::Ready(());
            }
            // The place is still registered from before `transmit` (a flush
            // that concerned it since took its waker and left the mark seen
            // above); only a session that came to wait on every change since
            // registers again.
            let all = follows_every_change(session_ref);
            if followed.is_none_or(|(_, then)| then != all) {
                let now_all = follow(session_ref, &waiter, cx.waker());
                followed = Some((session_ref.tracks_version(), now_all));
            }
            Inbox::set_waker(&inbox.session_waker, cx.waker());
            if armed.is_some() && sleep.as_mut().poll(cx).is_ready() {
                armed = None;
                return Poll::Ready(());
            }
            if !drain_seen && drain.as_mut().poll(cx).is_ready() {
                drain_seen = true;
                return Poll::Ready(());
            }
            if writer.poll_transport(cx).is_ready() {
                return Poll::Ready(());
            }
            Poll::Pending
        })
        .await;
    }
}

/// Whether the session waits on every change of the thread: its input is
/// stalled (room in the pool may come from any task) or a request waits for a
/// track it does not name.
fn follows_every_change<const N: usize>(session: &Session<'_, 'static, 'static, N>) -> bool {
    session.is_stalled() || session.has_deferred_requests()
}

/// Registers the session's task at its place: for the media of the tracks it
/// serves and for everything of the tracks it fills; for every change while
/// its input is stalled (room in the pool may come from any task) or a
/// request waits for a track it does not name. True in that last case.
fn follow<const N: usize>(
    session: &Session<'_, 'static, 'static, N>,
    waiter: &crate::notify::Waiter<'_>,
    waker: &std::task::Waker,
) -> bool {
    let all = follows_every_change(session);
    if all {
        waiter.register(waker);
    } else {
        waiter.register_session(
            waker,
            session.served_tracks().map(|t| t.key()),
            session.filled_tracks().map(|t| t.key()),
        );
    }
    all
}

/// Wakes the tasks waiting on what the pass changed, as the session lists
/// it ([`Session::poll_changed`]): the media and the demand of a track wake
/// the tasks following it, its consumption those following it for that;
/// `all` (or more changes than listed) wakes every task.
fn forward_changes<const N: usize>(
    session: &mut Session<'_, 'static, 'static, N>,
    notify: &Notify,
    mut all: bool,
) {
    let mut media = [TrackKey::NONE; LISTED_CHANGES];
    let mut consumed = [TrackKey::NONE; LISTED_CHANGES];
    let (mut m, mut c) = (0, 0);
    while let Some(change) = session.poll_changed() {
        match change {
            Change::Media(k) if m < LISTED_CHANGES => {
                media[m] = k;
                m += 1;
            }
            Change::Consumed(k) if c < LISTED_CHANGES => {
                consumed[c] = k;
                c += 1;
            }
            // A change of demand concerns the session filling the track.
            Change::Demand(k) if m < LISTED_CHANGES => {
                media[m] = k;
                m += 1;
            }
            _ => all = true,
        }
    }
    if all {
        notify.bump();
        return;
    }
    if m > 0 {
        notify.bump_tracks(media.into_iter().take(m));
    }
    if c > 0 {
        notify.bump_consumed_tracks(consumed.into_iter().take(c));
    }
}

/// A staging buffer's gather whose payload the app may lend instead
/// ([`App::lend`]).
struct Lending<'l, G, A, const N: usize> {
    gather: G,
    app: &'l A,
}

impl<G: Gather<'static>, A: App<N>, const N: usize> Gather<'static> for Lending<'_, G, A, N> {
    fn room(&self) -> usize {
        self.gather.room()
    }

    fn push(&mut self, at: usize, slice: Slice<'static>) {
        self.gather.push(at, slice);
    }

    fn lend(&mut self, slice: Slice<'static>) -> Option<u64> {
        self.app.lend(slice)
    }
}

/// Writes everything the session has to send; true if it wrote anything.
///
/// `poll_transmit_gather` writes record headers and control bytes straight
/// into the spare room of the writer's staging buffer and leaves group
/// payload in the pool (the staging buffer keeps the ranges): the kernel
/// copies payload from the pool block, with no user-space copy. The whole
/// spare room is offered at once, so a frame of a few blocks takes one call;
/// the buffer is sent (one `writev`) once [`FLUSH_AT`] bytes or
/// [`GATHER_RANGES`](crate::staging::GATHER_RANGES) ranges wait, and at the end.
async fn transmit<W: ByteWrite, A: App<N>, const N: usize>(
    session: &mut Session<'_, 'static, 'static, N>,
    now: Instant,
    writer: &mut W,
    app: &A,
) -> io::Result<bool> {
    let mut any = false;
    loop {
        let staging = writer.buffer();
        if !staging.is_empty()
            && (staging.len() >= FLUSH_AT
                || staging.is_gather_full()
                || staging.room_left() < TRANSMIT_CHUNK)
        {
            writer.flush().await?;
            continue;
        }
        // Initializes the room the first time a buffer offers it (within
        // its capacity: the flush above keeps a chunk free).
        staging.reserve(staging.staged().len() + TRANSMIT_CHUNK);
        let (spare, gather) = staging.spare_and_gather();
        let room = spare.len();
        let n = session.poll_transmit_gather(now, spare, &mut Lending::<_, _, N> { gather, app });
        staging.commit(n);
        if n > 0 {
            any = true;
        }
        // A call that stopped with room for two full QMux records and for more
        // ranges left had nothing more to send (each round writes whatever
        // fits), so another call would only walk the session's tables again.
        if n == 0 || (room - n >= TRANSMIT_CHUNK && !staging.is_gather_full()) {
            break;
        }
    }
    if !writer.buffer().is_empty() || writer.wants_flush() {
        writer.flush().await?;
    }
    writer.release();
    Ok(any)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Puts `n` received bytes into the inbox's buffer (taken at its next
    /// size), as the reader does, and marks them unseen by the session.
    fn receive(inbox: &Inbox, n: usize) {
        let mut data = inbox.data.borrow_mut();
        let bytes = data.get_or_insert_with(|| pooled_inbox(inbox.next_size.get()));
        let room = bytes.spare_mut().len();
        assert!(room >= n, "{n} bytes do not fit the {room} free");
        bytes.commit(n);
        drop(data);
        inbox.note_waiting(inbox.len());
        inbox.fresh.set(true);
    }

    /// Lets the session take every byte waiting, as a pass does.
    fn take_all(inbox: &Inbox) {
        inbox.fresh.set(false);
        if let Some(d) = inbox.data.borrow_mut().as_mut() {
            let n = d.len();
            d.consume(n);
        }
        inbox.release_if_empty();
    }

    fn capacity(inbox: &Inbox) -> usize {
        inbox.data.borrow().as_ref().map_or(0, |d| d.capacity())
    }

    #[test]
    fn a_publishers_inbox_stays_small_across_the_bytes_nagle_sends_ahead() {
        let inbox = Inbox::new();
        // The first frame: its few bytes alone in a tiny buffer, then the
        // rest, which moves the buffer up once.
        receive(&inbox, 13);
        take_all(&inbox);
        assert_eq!(inbox.next_size.get(), InboxSize::Tiny);
        let mut data = inbox.data.borrow_mut();
        let mut bytes = pooled_inbox(InboxSize::Tiny);
        bytes.commit(1500);
        grow_if_backlogged(&mut bytes, 14_000);
        *data = Some(bytes);
        drop(data);
        inbox.note_waiting(1500);
        take_all(&inbox);
        assert_eq!(inbox.next_size.get(), InboxSize::Small);
        // Every later frame: the few bytes alone, then the whole frame, each
        // in a small buffer; the frame waits for the session's pass there
        // instead of moving to a large buffer.
        for _ in 0..2 * usize::from(TINY_RUN) {
            receive(&inbox, 13);
            assert_eq!(capacity(&inbox), crate::buffers::SMALL_INBOX);
            take_all(&inbox);
            receive(&inbox, 16_402);
            assert_eq!(capacity(&inbox), crate::buffers::SMALL_INBOX);
            assert!(
                inbox.waits_for_session(),
                "a whole unseen frame waits for the pass"
            );
            take_all(&inbox);
            assert_eq!(inbox.next_size.get(), InboxSize::Small);
        }
    }

    #[test]
    fn an_inbox_goes_back_to_tiny_after_a_run_of_short_buffers() {
        let inbox = Inbox::new();
        inbox.next_size.set(InboxSize::Small);
        receive(&inbox, 4096);
        take_all(&inbox);
        assert_eq!(inbox.next_size.get(), InboxSize::Small);
        for i in 1..=TINY_RUN {
            receive(&inbox, 40);
            take_all(&inbox);
            let want = if i < TINY_RUN {
                InboxSize::Small
            } else {
                InboxSize::Tiny
            };
            assert_eq!(inbox.next_size.get(), want, "after {i} short buffers");
        }
    }

    /// A reader that plays back a list of direct reads and logs each call,
    /// stopping the reader task once the list is spent and it waits.
    struct Scripted {
        reads: std::collections::VecDeque<usize>,
        log: Rc<std::cell::RefCell<Vec<&'static str>>>,
        inbox: Rc<Inbox>,
    }

    impl ByteRead for Scripted {
        async fn read(&mut self) -> io::Result<&[u8]> {
            Ok(&[])
        }
        fn try_read_into(&mut self, dst: &mut [u8]) -> Option<io::Result<usize>> {
            self.log.borrow_mut().push("read");
            Some(match self.reads.pop_front() {
                Some(n) => Ok(n.min(dst.len())),
                None => Err(io::ErrorKind::WouldBlock.into()),
            })
        }
        async fn readable(&mut self) -> io::Result<()> {
            self.log.borrow_mut().push("readable");
            if self.reads.is_empty() {
                self.inbox.stop.set(true);
            }
            Ok(())
        }
    }

    /// The calls the reader task makes on `reads`, for a peer whose reads
    /// ask for a prompt ACK or not.
    fn reader_calls(reads: &[usize], prompt_acks: bool) -> Vec<&'static str> {
        let inbox = Rc::new(Inbox::new());
        inbox.prompt_acks.set(prompt_acks);
        let log = Rc::new(std::cell::RefCell::new(Vec::new()));
        let reader = Scripted {
            reads: reads.iter().copied().collect(),
            log: log.clone(),
            inbox: inbox.clone(),
        };
        crate::driver::block_on(crate::driver::DriverKind::Legacy, |_| {
            read_loop(reader, inbox)
        })
        .expect("runtime");
        log.take()
    }

    #[test]
    fn a_short_read_of_a_viewer_waits_for_readiness_before_the_next() {
        // Two credit records, each alone on the socket: one read each.
        assert_eq!(
            reader_calls(&[14, 20], false),
            ["read", "readable", "read", "readable"]
        );
    }

    #[test]
    fn a_short_read_with_a_prompt_ack_reads_again_at_once() {
        // A publisher's few bytes, then the segment the ACK released.
        assert_eq!(
            reader_calls(&[14, 100], true),
            ["read", "read", "read", "readable"]
        );
    }

    #[test]
    fn bytes_a_pass_left_move_a_small_buffer_up() {
        let inbox = Inbox::new();
        inbox.next_size.set(InboxSize::Small);
        receive(&inbox, 20_000);
        assert!(inbox.waits_for_session());
        // The pass took nothing (a stalled session): the reader moves on.
        inbox.fresh.set(false);
        assert!(!inbox.waits_for_session());
        let mut data = inbox.data.borrow_mut();
        let bytes = data.as_mut().expect("bytes wait");
        grow_if_backlogged(bytes, 0);
        assert_eq!(bytes.capacity(), crate::buffers::LARGE_INBOX);
        assert_eq!(bytes.len(), 20_000);
    }
}
