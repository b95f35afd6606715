//! The byte-stream half of the session driver: TCP, TLS and WebSocket.
//!
//! A byte stream carries the session's QMux records. Its receiving side is a
//! **reader** task ([`ByteRead`]) that appends what the socket delivers to
//! the connection's [`Inbox`] and wakes the session task; it stops reading
//! while the inbox holds `INBOX_BYTES` (the session is backpressured, see
//! skiff-core's session docs), so a slow session slows its peer down. Its
//! sending side is a [`ByteWrite`] with a staging buffer: [`transmit`] lets
//! the session write record headers and control bytes into the buffer's
//! spare room and leaves group payload in the pool as gathered ranges, sent
//! with one `writev` per flush.
//!
//! The transport-neutral half (the session task, app hooks, wake-ups,
//! shutdown, timers: [`super`]) reaches this half only through the inbox
//! and [`transmit`].

use std::cell::{Cell, RefCell};
use std::future::{Future, poll_fn};
use std::io;
use std::rc::Rc;
use std::task::{Poll, Waker};

use monoio::io::{AsyncReadRent, AsyncWriteRent, OwnedReadHalf, OwnedWriteHalf, Split, Splitable};
use skiff_core::pool::Slice;
use skiff_core::session::{Gather, Out, Session};
use skiff_core::time::Instant;

use super::{App, Guard, HandshakeToken};
use crate::buffers::InboxSize;
use crate::cancel::{race, write_all_or_stall};
use crate::staging::Staging;

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
    /// reader cannot (then [`drive`](super::drive) uses [`ByteRead::read`]). The default:
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
    /// What [`drive`](super::drive) enforces on the peer at the other end (nothing by default:
    /// a trusted link or our own client).
    fn guard(&self) -> Guard {
        Guard::default()
    }
    /// The token counting the connection among those still in their
    /// handshake, if the peer is counted ([`HandshakeToken`]); [`drive`](super::drive)
    /// marks it done once the session is established.
    fn take_handshake(&mut self) -> Option<HandshakeToken> {
        None
    }
    /// Whether the peer's data deserves an ACK at once after a read that
    /// drained the socket ([`drive`](super::drive) says false once the peer's SETUP says
    /// it only subscribes: its records are small, nothing waits on their
    /// ACK, and ACKs ride on the media sent to it). The default ignores it.
    fn set_prompt_acks(&mut self, on: bool) {
        let _ = on;
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
    /// keep-alive ping, its idle deadline): [`drive`](super::drive) wakes and flushes. The
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
}

impl<S: AsyncWriteRent> std::fmt::Debug for HalfWriter<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HalfWriter")
            .field("staged", &self.buf.len())
            .finish_non_exhaustive()
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

impl<S: AsyncWriteRent> ByteWrite for HalfWriter<S> {
    fn buffer(&mut self) -> &mut Staging {
        &mut self.buf
    }
    async fn flush(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let out = self.buf.take();
        // No stall limit: a client's session waits for its peer to read.
        let (res, out) = write_all_or_stall(&mut self.half, out, None).await;
        self.buf.restore(out);
        res
    }
    async fn close(&mut self) -> io::Result<()> {
        self.flush().await?;
        self.half.shutdown().await
    }
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

    /// Feeds everything the session has not consumed yet to `session`,
    /// oldest first, and wakes the reader if the pass freed room or saw the
    /// bytes it waits on; `None` once the session is closed.
    pub(super) fn feed<const N: usize>(
        &self,
        session: &mut Session<'_, 'static, 'static, N>,
        now: Instant,
    ) -> Option<Taken> {
        self.fresh.set(false);
        if session.is_closed() {
            return None;
        }
        let mut slot = self.data.borrow_mut();
        let mut consumed = false;
        let mut empty = true;
        let mut more = false;
        // A session stalled on input it already took (data passed by
        // reference) is called with no new bytes too.
        if slot.is_some() || session.is_stalled() {
            let data = slot.get_or_insert_with(|| pooled_inbox(InboxSize::Tiny));
            if let Ok(fed) = data.feed(session, now)
                && fed.progress()
            {
                consumed = true;
                self.wake_reader();
            }
            empty = data.is_empty();
            more = consumed && (!empty || session.is_stalled());
        }
        drop(slot);
        if empty {
            self.release_if_empty();
        }
        // The pass saw the bytes the reader waits on: if it took none,
        // the reader moves them to a larger buffer and reads on.
        if !consumed && self.reader_parked.get() {
            self.wake_reader();
        }
        Some(Taken {
            consumed,
            more,
            settled: consumed || empty || session.is_stalled(),
        })
    }

    /// Sets whether the reader acknowledges a draining read at once
    /// ([`ByteRead::set_prompt_acks`]).
    pub(super) fn set_prompt_acks(&self, on: bool) {
        self.prompt_acks.set(on);
    }

    /// Whether something came the session has not seen: bytes, the end of
    /// the stream, or a failure.
    pub(super) fn is_ready(&self) -> bool {
        self.fresh.get() || self.eof.get() || self.error.get()
    }

    /// Whether the socket failed.
    pub(super) fn failed(&self) -> bool {
        self.error.get()
    }

    /// Whether the peer closed its sending side.
    pub(super) fn ended(&self) -> bool {
        self.eof.get()
    }

    /// Whether no received byte waits.
    pub(super) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The session task waits on `waker` for the reader's news.
    pub(super) fn set_session_waker(&self, waker: &Waker) {
        Inbox::set_waker(&self.session_waker, waker);
    }

    /// Stops the reader task (its in-flight read is dropped with it).
    pub(super) fn stop(&self) {
        self.stop.set(true);
        self.wake_reader();
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

/// What [`Inbox::feed`] came to.
#[derive(Debug, Clone, Copy)]
pub(super) struct Taken {
    /// The session took input.
    pub(super) consumed: bool,
    /// It took input and more waits, or it is stalled: another pass may
    /// take more at once.
    pub(super) more: bool,
    /// No partial record waits that the session could take (it took
    /// input, none waits, or it is stalled): the incomplete-record deadline
    /// does not run.
    pub(super) settled: bool,
}

/// Starts the reader task of `reader` and returns the inbox it fills and
/// the task's handle: it is done once the task ended and dropped the reader
/// (its socket half and read buffer).
pub(super) fn spawn_reader<R: ByteRead>(reader: R) -> (Rc<Inbox>, monoio::task::JoinHandle<()>) {
    let inbox = Rc::new(Inbox::new());
    let task = monoio::spawn(read_loop(reader, inbox.clone()));
    (inbox, task)
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
                    // A read larger than the minimum room still fits once the
                    // consumed front is given back.
                    match bytes.spare_for(data.len()) {
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

/// A writer's staging buffer as the session's [`Out`]: record headers and
/// control bytes go into its spare room, group payload stays in the pool as
/// gathered ranges (or is lent, [`App::lend`]).
struct StagingOut<'o, A, const N: usize> {
    staging: &'o mut Staging,
    app: &'o A,
}

impl<A: App<N>, const N: usize> Out<'static> for StagingOut<'_, A, N> {
    fn must_flush(&self) -> bool {
        let staging = &*self.staging;
        !staging.is_empty()
            && (staging.len() >= FLUSH_AT
                || staging.is_gather_full()
                || staging.room_left() < TRANSMIT_CHUNK)
    }

    fn write<F>(&mut self, write: F) -> (usize, usize)
    where
        F: FnOnce(&mut [u8], Option<&mut dyn Gather<'static>>) -> usize,
    {
        let staging = &mut *self.staging;
        // Initializes the room the first time a buffer offers it (within
        // its capacity: a flush keeps a chunk free).
        staging.reserve(staging.staged().len() + TRANSMIT_CHUNK);
        let (spare, gather) = staging.spare_and_gather();
        let room = spare.len();
        let mut lending = Lending::<_, A, N> {
            gather,
            app: self.app,
        };
        (room, write(spare, Some(&mut lending)))
    }

    fn commit(&mut self, room: usize, n: usize) -> bool {
        let staging = &mut *self.staging;
        staging.commit(n);
        // A call that stopped with room for two full QMux records and for more
        // ranges left had nothing more to send (each round writes whatever
        // fits), so another call would only walk the session's tables again.
        room - n < TRANSMIT_CHUNK || staging.is_gather_full()
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
pub(super) async fn transmit<W: ByteWrite, A: App<N>, const N: usize>(
    session: &mut Session<'_, 'static, 'static, N>,
    now: Instant,
    writer: &mut W,
    app: &A,
) -> io::Result<bool> {
    let mut any = false;
    loop {
        let mut out = StagingOut::<A, N> {
            staging: writer.buffer(),
            app,
        };
        let sent = session.transmit_to(now, &mut out);
        any |= sent.wrote;
        if !sent.flush {
            break;
        }
        writer.flush().await?;
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
