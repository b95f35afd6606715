//! A group: a sequence of frames stored once, in wire format, in a chain of pool blocks.
//!
//! # Layout
//! A group's bytes are exactly what follows the GROUP header on a moq-lite-05
//! group stream (PROTOCOL.md §3.9): FRAME headers (`Timestamp Delta ZZ(i)`,
//! `Payload Length (i)`) and payloads, back to back. A relay forwards the
//! stored bytes verbatim to every subscriber, nothing is re-encoded per reader,
//! and byte counts here equal stream credit on the wire.
//!
//! The bytes live in a chain of [`pool`](crate::pool) blocks. The [`State`]
//! holds the head (keeping the whole chain alive, until the group is trimmed)
//! and the writer of the tail block. Every [`Consumer`] holds a handle to the
//! block it is reading, from the moment it is created (its start is anchored
//! then, not at its first read), so many consumers read the same blocks
//! without copying, and a consumer keeps only the blocks from its position on
//! alive.
//!
//! # Trimming: memory bounded by windows
//! A group's retain limit ([`State::set_retain`], `u64::MAX` by default: never)
//! bounds how much of it the [`State`] itself keeps. Once
//! [`State::bytes_written`] exceeds it, the state lets go of its head block:
//! the group is *trimmed* ([`State::is_trimmed`]), and from then on each block
//! goes back to the pool as soon as every consumer has moved past it (chain
//! links count as references, see [`crate::pool`]). The memory of a trimmed
//! group is the blocks from the slowest live consumer to the tail; with
//! pacing against the furthest reader ([`Producer::poll_paced`]) and one
//! reader, about one window plus two blocks. The consequences:
//! * a consumer created before the trim keeps reading from byte 0, and while
//!   it stays parked there it keeps the whole group alive (as before);
//! * a consumer created on a still empty group has no block to anchor yet:
//!   trimming waits until it takes the first block (its first read) or is
//!   dropped, so it too reads from byte 0;
//! * a consumer created after the trim cannot start at byte 0: its reads
//!   return [`ReadError::Trimmed`] ([`Consumer::is_trimmed`] tells at once).
//!   Treat it like a group that cannot be served (a session skips it).
//!
//! The retain limit is not a size limit: [`State::max_bytes`] still refuses
//! writes past it with [`WriteError::GroupTooLarge`].
//!
//! # Roles
//! * [`State`]: the shared state of one group, a plain struct of `Cell`s meant
//!   to sit in a fixed-capacity ring owned by a track. A slot is (re)used with
//!   [`State::reset`]; the old group's consumers and producer notice through a
//!   generation counter and get [`ReadError::Evicted`] / [`WriteError::Evicted`].
//! * [`Producer`]: the one writer ([`State::producer`]). Whole frames
//!   ([`Producer::write_frame`], all or nothing) or streamed frames for a relay
//!   ([`Producer::begin_frame`], [`Producer::write_payload`], partial writes
//!   allowed), then [`Producer::finish`] (FIN) or [`Producer::abort`] (reset).
//! * [`Consumer`]: any number ([`State::consumer`]), each with its own
//!   position; raw chunks for a relay ([`Consumer::chunk`] + [`Consumer::advance`])
//!   or frames for a viewer ([`Consumer::read_frame_header`] + payload chunks).
//!
//! # Backpressure and pacing
//! An empty pool is backpressure: writes fail with [`WriteError::PoolExhausted`]
//! (whole frames write nothing). Pacing bounds how far the producer runs ahead
//! of the *furthest* reader: [`Producer::poll_paced`] is ready while
//! `bytes_written - furthest_read < window` (see [`crate::pacing`]) and
//! otherwise parks the producer's waker, which a consumer's advance wakes.
//! Consumers are not woken by this module: their owner (track, session)
//! polls them when it learns of new data (e.g. [`State::bytes_written`] grew).
//!
//! No operation here allocates; all of them are O(1) except reading a frame
//! header that spans blocks (O(header bytes)) and freeing a chain (O(blocks
//! freed), including the blocks a trim releases).

use core::cell::Cell;
use core::fmt;
use core::task::{Context, Poll, Waker};

use super::frame::{Header, MAX_HEADER_LEN};
use crate::pacing::Pacer;
use crate::pool::{Block, BlockMut, Pool, Slice};
use crate::wire::{DecodeError, Reader, Writer};

/// The code a group is aborted with when its [`Producer`] is dropped before
/// finishing: CANCEL (PROTOCOL.md §3.15, stream codes).
pub const ABORT_DROPPED: u64 = 0x1;

/// Where a group is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Status {
    /// The slot holds no group (never reset, or cleared).
    Idle,
    /// The producer may still append frames.
    Open,
    /// The producer finished on a frame boundary (FIN); no more bytes will come.
    Finished,
    /// The group was abandoned with this stream error code (RESET_STREAM).
    Aborted(u64),
}

/// What a read found: an item, nothing yet, or the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Next<T> {
    /// The next item.
    Ready(T),
    /// Nothing yet: the producer has not written it (poll again later).
    Pending,
    /// Nothing more: the group is finished and everything was read (for payload
    /// reads: this frame's payload is complete).
    Finished,
}

impl<T> Next<T> {
    /// The item, if ready.
    pub fn ready(self) -> Option<T> {
        match self {
            Next::Ready(t) => Some(t),
            _ => None,
        }
    }

    /// Maps the item.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Next<U> {
        match self {
            Next::Ready(t) => Next::Ready(f(t)),
            Next::Pending => Next::Pending,
            Next::Finished => Next::Finished,
        }
    }
}

/// Why a write was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum WriteError {
    /// The pool has too few free blocks; nothing was written (retry later: backpressure).
    PoolExhausted,
    /// The frame would take the group past its configured maximum size; nothing was written.
    GroupTooLarge,
    /// The group was already finished.
    Finished,
    /// The group was aborted with this code.
    Aborted(u64),
    /// The slot was reset for another group (or cleared); this producer is stale.
    Evicted,
    /// A streamed frame still misses payload bytes ([`Producer::write_payload`] them first).
    InFrame,
    /// [`Producer::write_payload`] without a streamed frame in progress.
    NoFrame,
    /// More payload than the streamed frame declared; nothing was written.
    PayloadOverrun,
    /// The timestamp is more than ±2^61 away from the previous frame's (PROTOCOL.md §0 zigzag).
    TimestampRange,
}

impl fmt::Display for WriteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WriteError::PoolExhausted => f.write_str("block pool exhausted"),
            WriteError::GroupTooLarge => f.write_str("group over its maximum size"),
            WriteError::Finished => f.write_str("group already finished"),
            WriteError::Aborted(code) => write!(f, "group aborted with code {code:#x}"),
            WriteError::Evicted => f.write_str("group slot was reused"),
            WriteError::InFrame => f.write_str("a streamed frame is incomplete"),
            WriteError::NoFrame => f.write_str("no streamed frame in progress"),
            WriteError::PayloadOverrun => f.write_str("payload longer than the frame declared"),
            WriteError::TimestampRange => f.write_str("timestamp delta out of range"),
        }
    }
}

impl core::error::Error for WriteError {}

/// Why a read failed (as opposed to [`Next::Pending`] / [`Next::Finished`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum ReadError {
    /// The group was abandoned with this stream error code; forward it as a reset.
    Aborted(u64),
    /// The slot was reset for another group (or cleared); this consumer is stale.
    Evicted,
    /// A frame read off a frame boundary: raw [`Consumer::advance`] calls moved
    /// past the frame the frame reader was tracking.
    Misaligned,
    /// The consumer was created after the group was trimmed (see the module
    /// docs): its first bytes are gone, so it cannot read the group from byte 0.
    /// Treat the group as one that cannot be served.
    Trimmed,
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadError::Aborted(code) => write!(f, "group aborted with code {code:#x}"),
            ReadError::Evicted => f.write_str("group slot was reused"),
            ReadError::Misaligned => f.write_str("frame read off a frame boundary"),
            ReadError::Trimmed => f.write_str("group start already trimmed"),
        }
    }
}

impl core::error::Error for ReadError {}

// ---------------------------------------------------------------------------
// State
// ---------------------------------------------------------------------------

/// The shared state of one group, designed to live in a fixed ring slot of a track.
///
/// Producer and consumers borrow it (`&State`); it holds the group's block
/// chain, counters, status, the furthest read position and the producer's
/// pacing waker. A slot starts [`Status::Idle`]; [`State::reset`] starts a new
/// group in it.
pub struct State<'p> {
    pool: &'p Pool<'p>,
    /// Bumped by every reset/clear; handles compare it to detect reuse.
    generation: Cell<u64>,
    sequence: Cell<u64>,
    status: Cell<Status>,
    /// First block; keeps the chain alive until the group is trimmed.
    head: Cell<Option<Block<'p>>>,
    /// Writer of the last block.
    tail: Cell<Option<BlockMut<'p>>>,
    written: Cell<u64>,
    frames: Cell<u64>,
    last_timestamp: Cell<u64>,
    furthest_read: Cell<u64>,
    max_bytes: Cell<u64>,
    /// Past this many bytes written, the head is released (see the module docs).
    retain: Cell<u64>,
    /// The head was released for the retain limit.
    trimmed: Cell<bool>,
    /// The chain holds a block that is not full before its tail (a piece of
    /// a foreign block, or the block it was linked after).
    patched: Cell<bool>,
    /// Live consumers of this generation created before the head block existed
    /// and that have not taken it yet; trimming waits for them.
    unanchored: Cell<usize>,
    has_producer: Cell<bool>,
    /// The producer parked by [`Producer::poll_paced`], and the window it waits for.
    waker: Cell<Option<Waker>>,
    pace_window: Cell<u64>,
}

impl<'p> State<'p> {
    /// An idle slot whose groups take blocks from `pool` and hold at most
    /// `max_bytes` (FRAME headers included); no retain limit (never trimmed).
    pub const fn new(pool: &'p Pool<'p>, max_bytes: u64) -> Self {
        State {
            pool,
            generation: Cell::new(0),
            sequence: Cell::new(0),
            status: Cell::new(Status::Idle),
            head: Cell::new(None),
            tail: Cell::new(None),
            written: Cell::new(0),
            frames: Cell::new(0),
            last_timestamp: Cell::new(0),
            furthest_read: Cell::new(0),
            max_bytes: Cell::new(max_bytes),
            retain: Cell::new(u64::MAX),
            trimmed: Cell::new(false),
            patched: Cell::new(false),
            unanchored: Cell::new(0),
            has_producer: Cell::new(false),
            waker: Cell::new(None),
            pace_window: Cell::new(0),
        }
    }

    /// Starts group `sequence` in this slot, [`Status::Open`] and empty.
    ///
    /// Whatever the slot held is released: the old group's producer and
    /// consumers become stale (they get `Evicted`); blocks they still hold stay
    /// alive until they drop them. A parked producer is woken so it notices.
    pub fn reset(&self, sequence: u64) {
        self.replace(Status::Open, sequence);
    }

    /// Empties the slot ([`Status::Idle`]), releasing the group like [`State::reset`].
    pub fn clear(&self) {
        self.replace(Status::Idle, 0);
    }

    fn replace(&self, status: Status, sequence: u64) {
        self.release_chain();
        self.generation.set(self.generation.get().wrapping_add(1));
        self.sequence.set(sequence);
        self.status.set(status);
        self.written.set(0);
        self.frames.set(0);
        self.last_timestamp.set(0);
        self.furthest_read.set(0);
        self.trimmed.set(false);
        self.patched.set(false);
        self.unanchored.set(0);
        self.has_producer.set(false);
        self.wake_producer();
    }

    /// Abandons an open group with stream error `code`; returns false if it was not open.
    ///
    /// The group's blocks are released at once (consumers drop theirs at their
    /// next read, which returns [`ReadError::Aborted`]). A parked producer is woken.
    pub fn abort(&self, code: u64) -> bool {
        if self.status.get() != Status::Open {
            return false;
        }
        debug!("group {} aborted, code {}", self.sequence.get(), code);
        self.status.set(Status::Aborted(code));
        self.release_chain();
        self.wake_producer();
        true
    }

    /// The group's one producer, or `None` if the group is not open or already has one.
    pub fn producer(&self) -> Option<Producer<'_, 'p>> {
        if self.status.get() != Status::Open || self.has_producer.get() {
            return None;
        }
        self.has_producer.set(true);
        Some(Producer {
            state: self,
            generation: self.generation.get(),
            frame_left: 0,
        })
    }

    /// A new consumer reading the group from its first byte.
    ///
    /// It anchors its start now: it takes a handle to the head block (or, on a
    /// group with no byte yet, holds trimming off until it takes the first
    /// block). On an idle slot, its reads return [`ReadError::Evicted`]; on a
    /// trimmed group, [`ReadError::Trimmed`].
    pub fn consumer(&self) -> Consumer<'_, 'p> {
        let block = self.head();
        let live = matches!(self.status.get(), Status::Open | Status::Finished);
        let trimmed = block.is_none() && live && self.trimmed.get();
        let waiting = block.is_none() && live && !trimmed;
        if waiting {
            self.unanchored.set(self.unanchored.get() + 1);
        }
        Consumer {
            state: self,
            generation: self.generation.get(),
            sequence: self.sequence.get(),
            block,
            waiting,
            trimmed,
            offset: 0,
            pos: 0,
            frame_end: 0,
            timestamp: 0,
        }
    }

    /// The pool the group's blocks come from.
    pub fn pool(&self) -> &'p Pool<'p> {
        self.pool
    }

    /// The group sequence number (meaningless while [`Status::Idle`]).
    pub fn sequence(&self) -> u64 {
        self.sequence.get()
    }

    /// A counter bumped each time the slot is reset or cleared.
    pub fn generation(&self) -> u64 {
        self.generation.get()
    }

    /// Where the group is in its life.
    pub fn status(&self) -> Status {
        self.status.get()
    }

    /// True while the producer may append.
    pub fn is_open(&self) -> bool {
        self.status.get() == Status::Open
    }

    /// True while a [`Producer`] for the current group exists.
    pub fn has_producer(&self) -> bool {
        self.has_producer.get()
    }

    /// Bytes stored so far (FRAME headers and payloads; the wire size after the GROUP header).
    pub fn bytes_written(&self) -> u64 {
        self.written.get()
    }

    /// Frames begun so far (a streamed frame counts once its header is written).
    pub fn frames_written(&self) -> u64 {
        self.frames.get()
    }

    /// Timestamp of the last frame begun (0 before the first).
    pub fn last_timestamp(&self) -> u64 {
        self.last_timestamp.get()
    }

    /// The furthest position any consumer has advanced to.
    pub fn furthest_read(&self) -> u64 {
        self.furthest_read.get()
    }

    /// The maximum group size in bytes.
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes.get()
    }

    /// Changes the maximum group size; applies to later writes (bytes already
    /// stored are kept even if over).
    pub fn set_max_bytes(&self, max_bytes: u64) {
        self.max_bytes.set(max_bytes);
    }

    /// The retain limit: past this many bytes written, the group is trimmed
    /// (`u64::MAX`: never; see the module docs).
    pub fn retain(&self) -> u64 {
        self.retain.get()
    }

    /// Sets the retain limit for this slot's groups (kept across [`State::reset`]).
    ///
    /// Applies at once: a group already past it is trimmed now (unless a
    /// consumer created on the empty group has not taken its first block yet).
    /// A trimmed group stays trimmed if the limit is raised.
    pub fn set_retain(&self, bytes: u64) {
        self.retain.set(bytes);
        self.trim_if_due();
    }

    /// True once the group was trimmed: the state no longer holds its first
    /// bytes, and new consumers cannot read it ([`ReadError::Trimmed`]).
    pub fn is_trimmed(&self) -> bool {
        self.trimmed.get()
    }

    /// How many more bytes the producer may write under `window` (see [`crate::pacing`]).
    pub fn allowance(&self, window: u64) -> u64 {
        Pacer::new(window).allowance(self.written.get(), self.furthest_read.get())
    }

    // --- internals ---

    fn release_chain(&self) {
        // Dropping the head frees the chain iteratively (pool::Pool::release).
        drop(self.tail.take());
        drop(self.head.take());
    }

    /// Releases the head once the group is past its retain limit and no
    /// consumer still waits to anchor its start. O(1) plus the blocks freed.
    fn trim_if_due(&self) {
        if self.trimmed.get()
            || self.unanchored.get() > 0
            || self.written.get() <= self.retain.get()
            || !matches!(self.status.get(), Status::Open | Status::Finished)
        {
            return;
        }
        if let Some(head) = self.head.take() {
            trace!(
                "group {} trimmed at {} bytes",
                self.sequence.get(),
                self.written.get()
            );
            self.trimmed.set(true);
            // Frees every block no consumer holds, up to the tail (iteratively).
            drop(head);
        }
    }

    /// A consumer of generation `generation` that waited for the head took it
    /// or went away.
    fn anchored(&self, generation: u64) {
        if generation != self.generation.get() {
            return;
        }
        self.unanchored.set(self.unanchored.get().saturating_sub(1));
        self.trim_if_due();
    }

    fn wake_producer(&self) {
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }

    fn head(&self) -> Option<Block<'p>> {
        let head = self.head.take();
        let out = head.clone();
        self.head.set(head);
        out
    }

    fn tail_spare(&self) -> usize {
        let tail = self.tail.take();
        let n = tail.as_ref().map_or(0, BlockMut::spare_len);
        self.tail.set(tail);
        n
    }

    /// Refuses `n` more bytes over the configured maximum.
    fn check_room(&self, n: u64) -> Result<(), WriteError> {
        match self.written.get().checked_add(n) {
            Some(total) if total <= self.max_bytes.get() => Ok(()),
            _ => Err(WriteError::GroupTooLarge),
        }
    }

    /// Makes sure `n` bytes can be appended without running out of blocks.
    fn reserve(&self, n: u64) -> Result<(), WriteError> {
        let spare = self.tail_spare() as u64;
        if n <= spare {
            return Ok(());
        }
        let blocks = (n - spare).div_ceil(self.pool.block_size() as u64);
        let blocks = usize::try_from(blocks).unwrap_or(usize::MAX);
        self.pool
            .try_reserve(blocks)
            .map_err(|_| WriteError::PoolExhausted)
    }

    /// Appends as much of `data` as the pool allows, growing the chain; returns the count.
    fn write_bytes(&self, data: &[u8]) -> usize {
        let mut tail = self.tail.take();
        let mut done = 0;
        while done < data.len() {
            if let Some(t) = tail.as_mut().filter(|t| t.spare_len() > 0) {
                done += t.append(&data[done..]);
                continue;
            }
            let Ok(block) = self.pool.alloc() else {
                break;
            };
            self.link_after(&mut tail, block);
        }
        self.tail.set(tail);
        self.written.set(self.written.get() + done as u64);
        self.trim_if_due();
        done
    }

    /// Links `block` (fresh from this pool) after the chain's `tail` and makes
    /// it the tail (the head, if the chain was empty).
    fn link_after(&self, tail: &mut Option<BlockMut<'p>>, block: BlockMut<'p>) {
        match tail.as_mut() {
            Some(old) => {
                // Cannot fail: same pool, `old` is the chain's tail (no
                // successor) and `block` is fresh.
                let linked = old.link(block.as_block());
                debug_assert!(linked.is_ok());
            }
            None => self.head.set(Some(block.share())),
        }
        *tail = Some(block);
    }

    /// Appends bytes `start..end` of the foreign block `src` without a copy:
    /// the tail grows if it is a piece ending just before them, else a new
    /// piece is linked after it. False (nothing written) if no metadata slot
    /// is free or `src` is not a foreign block of this pool.
    fn append_foreign(&self, src: &Block<'p>, start: usize, end: usize) -> bool {
        let mut tail = self.tail.take();
        let grown = tail.as_mut().is_some_and(|t| t.grow_piece(src, start, end));
        if !grown {
            let piece = match src.piece(start, end) {
                Ok(p) if core::ptr::eq(src.pool(), self.pool) => p,
                _ => {
                    self.tail.set(tail);
                    return false;
                }
            };
            self.link_after(&mut tail, piece);
        }
        self.patched.set(true);
        self.tail.set(tail);
        self.written.set(self.written.get() + (end - start) as u64);
        self.trim_if_due();
        true
    }

    /// A consumer of generation `generation` reached `pos`.
    fn note_read(&self, generation: u64, pos: u64) {
        if generation != self.generation.get() || pos <= self.furthest_read.get() {
            return;
        }
        self.furthest_read.set(pos);
        if let Some(w) = self.waker.take() {
            if self.allowance(self.pace_window.get()) > 0 {
                w.wake();
            } else {
                self.waker.set(Some(w));
            }
        }
    }
}

impl fmt::Debug for State<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("State")
            .field("sequence", &self.sequence.get())
            .field("generation", &self.generation.get())
            .field("status", &self.status.get())
            .field("written", &self.written.get())
            .field("frames", &self.frames.get())
            .field("furthest_read", &self.furthest_read.get())
            .field("max_bytes", &self.max_bytes.get())
            .field("retain", &self.retain.get())
            .field("trimmed", &self.trimmed.get())
            .finish_non_exhaustive()
    }
}

// ---------------------------------------------------------------------------
// Producer
// ---------------------------------------------------------------------------

/// The one writer of a group (from [`State::producer`]).
///
/// Dropping it before [`Producer::finish`] aborts the group with [`ABORT_DROPPED`].
pub struct Producer<'a, 'p> {
    state: &'a State<'p>,
    generation: u64,
    /// Payload bytes the streamed frame still needs.
    frame_left: usize,
}

impl<'a, 'p> Producer<'a, 'p> {
    /// The shared state this producer writes.
    pub fn state(&self) -> &'a State<'p> {
        self.state
    }

    /// The group sequence number.
    pub fn sequence(&self) -> u64 {
        self.state.sequence()
    }

    /// Payload bytes the streamed frame still needs (0 outside a streamed frame).
    pub fn frame_remaining(&self) -> usize {
        self.frame_left
    }

    fn check(&self) -> Result<(), WriteError> {
        if self.state.generation.get() != self.generation {
            return Err(WriteError::Evicted);
        }
        match self.state.status.get() {
            Status::Open => Ok(()),
            Status::Finished => Err(WriteError::Finished),
            Status::Aborted(code) => Err(WriteError::Aborted(code)),
            Status::Idle => Err(WriteError::Evicted),
        }
    }

    /// Encodes the FRAME header for `timestamp`/`len` after the previous frame.
    fn header(
        &self,
        timestamp: u64,
        len: usize,
    ) -> Result<([u8; MAX_HEADER_LEN], usize), WriteError> {
        let mut buf = [0u8; MAX_HEADER_LEN];
        let mut w = Writer::new(&mut buf);
        // PROTOCOL.md §3.9: the delta is from the previous frame of this group (first: from 0).
        let n = Header::new(timestamp, len)
            .encode(self.state.last_timestamp.get(), &mut w)
            .map_err(|_| WriteError::TimestampRange)?;
        Ok((buf, n))
    }

    fn begun(&self, timestamp: u64) {
        self.state.frames.set(self.state.frames.get() + 1);
        self.state.last_timestamp.set(timestamp);
    }

    /// Appends one whole frame at absolute `timestamp`, all or nothing.
    ///
    /// # Errors
    /// [`WriteError::PoolExhausted`] if the pool lacks the blocks it needs,
    /// [`WriteError::GroupTooLarge`] over the group's maximum,
    /// [`WriteError::InFrame`] while a streamed frame is incomplete,
    /// [`WriteError::TimestampRange`], or the group's state
    /// ([`WriteError::Finished`], [`WriteError::Aborted`], [`WriteError::Evicted`]).
    /// Nothing is written on error.
    pub fn write_frame(&mut self, timestamp: u64, payload: &[u8]) -> Result<(), WriteError> {
        self.check()?;
        if self.frame_left > 0 {
            return Err(WriteError::InFrame);
        }
        let (header, n) = self.header(timestamp, payload.len())?;
        let total = n as u64 + payload.len() as u64;
        self.state.check_room(total)?;
        self.state.reserve(total)?;
        let written = self.state.write_bytes(&header[..n]) + self.state.write_bytes(payload);
        debug_assert_eq!(written as u64, total);
        self.begun(timestamp);
        Ok(())
    }

    /// Starts a frame of `len` payload bytes at absolute `timestamp`, to be
    /// filled by [`Producer::write_payload`] (a relay receiving a large frame in pieces).
    ///
    /// The header is written all or nothing; the whole frame must fit the
    /// group's maximum. Readers see the payload as it arrives. A frame with
    /// `len == 0` is complete at once.
    ///
    /// # Errors
    /// As [`Producer::write_frame`]; nothing is written on error.
    pub fn begin_frame(&mut self, timestamp: u64, len: usize) -> Result<(), WriteError> {
        self.check()?;
        if self.frame_left > 0 {
            return Err(WriteError::InFrame);
        }
        let (header, n) = self.header(timestamp, len)?;
        self.state.check_room(n as u64 + len as u64)?;
        self.state.reserve(n as u64)?;
        let written = self.state.write_bytes(&header[..n]);
        debug_assert_eq!(written, n);
        self.begun(timestamp);
        self.frame_left = len;
        Ok(())
    }

    /// Appends payload bytes of the streamed frame; returns how many were taken,
    /// which is fewer than `data.len()` when the pool runs dry.
    ///
    /// # Errors
    /// [`WriteError::PoolExhausted`] if not one byte could be stored,
    /// [`WriteError::NoFrame`] outside a streamed frame,
    /// [`WriteError::PayloadOverrun`] if `data` is longer than the frame's
    /// remaining payload (nothing written), or the group's state.
    pub fn write_payload(&mut self, data: &[u8]) -> Result<usize, WriteError> {
        self.check()?;
        if self.frame_left == 0 {
            return Err(WriteError::NoFrame);
        }
        if data.len() > self.frame_left {
            return Err(WriteError::PayloadOverrun);
        }
        let n = self.state.write_bytes(data);
        if n == 0 && !data.is_empty() {
            return Err(WriteError::PoolExhausted);
        }
        self.frame_left -= n;
        Ok(n)
    }

    /// Appends payload of the streamed frame that already lies in memory:
    /// bytes `start..end` of the foreign block `src` (see
    /// [`crate::pool::Pool::adopt`]) join the chain without a copy; returns
    /// their count.
    ///
    /// # Errors
    /// [`WriteError::NoFrame`] outside a streamed frame,
    /// [`WriteError::PayloadOverrun`] if the range is longer than the frame's
    /// remaining payload, [`WriteError::PoolExhausted`] if no metadata slot is
    /// free or `src` is not a foreign block of this group's pool (nothing
    /// written in these cases), or the group's state.
    pub fn write_payload_from(
        &mut self,
        src: &Block<'p>,
        start: usize,
        end: usize,
    ) -> Result<usize, WriteError> {
        self.check()?;
        if self.frame_left == 0 {
            return Err(WriteError::NoFrame);
        }
        let n = end.saturating_sub(start);
        if n > self.frame_left {
            return Err(WriteError::PayloadOverrun);
        }
        if n > 0 && !self.state.append_foreign(src, start, end) {
            return Err(WriteError::PoolExhausted);
        }
        self.frame_left -= n;
        Ok(n)
    }

    /// Like [`Producer::begin_frame`], taking the FRAME header from bytes
    /// `start..end` of the foreign block `src` without a copy when they are
    /// exactly the header this call would write (else it writes its own).
    ///
    /// # Errors
    /// As [`Producer::begin_frame`].
    pub fn begin_frame_from(
        &mut self,
        timestamp: u64,
        len: usize,
        src: &Block<'p>,
        start: usize,
        end: usize,
    ) -> Result<(), WriteError> {
        self.check()?;
        if self.frame_left > 0 {
            return Err(WriteError::InFrame);
        }
        let (header, n) = self.header(timestamp, len)?;
        let same = src.data().get(start..end) == header.get(..n);
        if !same {
            return self.begin_frame(timestamp, len);
        }
        self.state.check_room(n as u64 + len as u64)?;
        if !self.state.append_foreign(src, start, end) {
            return Err(WriteError::PoolExhausted);
        }
        self.begun(timestamp);
        self.frame_left = len;
        Ok(())
    }

    /// Ends the group on a frame boundary (FIN): consumers reading to the end get [`Next::Finished`].
    ///
    /// # Errors
    /// [`WriteError::InFrame`] while a streamed frame is incomplete (the group
    /// stays open), or the group's state.
    pub fn finish(&mut self) -> Result<(), WriteError> {
        self.check()?;
        if self.frame_left > 0 {
            return Err(WriteError::InFrame);
        }
        self.state.status.set(Status::Finished);
        drop(self.state.tail.take());
        drop(self.state.waker.take());
        Ok(())
    }

    /// Abandons the group with stream error `code` (RESET_STREAM); no-op unless it is open.
    pub fn abort(&mut self, code: u64) {
        if self.check().is_ok() {
            self.state.abort(code);
        }
    }

    /// Ready while the producer is less than `window` bytes ahead of the
    /// furthest reader; otherwise parks the task's waker (one slot: the latest
    /// caller's) and returns `Pending` until a reader catches up.
    ///
    /// Also ready once the group is no longer open or the slot was reused, so
    /// the caller's next write reports why. A `window` of 0 never becomes
    /// ready by reading alone: poll again when the window changes.
    #[must_use = "Pending means: do not write until woken"]
    pub fn poll_paced(&self, cx: &mut Context<'_>, window: u64) -> Poll<()> {
        if self.check().is_err() || self.state.allowance(window) > 0 {
            return Poll::Ready(());
        }
        let parked = match self.state.waker.take() {
            Some(w) if w.will_wake(cx.waker()) => w,
            _ => cx.waker().clone(),
        };
        self.state.waker.set(Some(parked));
        self.state.pace_window.set(window);
        Poll::Pending
    }

    /// True while the producer may write under `window` (what [`Producer::poll_paced`]
    /// reports as ready), for callers that do not use wakers.
    pub fn is_paced(&self, window: u64) -> bool {
        self.state.allowance(window) > 0
    }

    /// How many more bytes the producer may write under `window`.
    pub fn allowance(&self, window: u64) -> u64 {
        self.state.allowance(window)
    }
}

impl Drop for Producer<'_, '_> {
    fn drop(&mut self) {
        if self.state.generation.get() != self.generation {
            return;
        }
        self.state.has_producer.set(false);
        drop(self.state.waker.take());
        if self.state.is_open() {
            self.state.abort(ABORT_DROPPED);
        }
    }
}

impl fmt::Debug for Producer<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Producer")
            .field("sequence", &self.state.sequence())
            .field("generation", &self.generation)
            .field("frame_left", &self.frame_left)
            .finish()
    }
}

// ---------------------------------------------------------------------------
// Consumer
// ---------------------------------------------------------------------------

/// One reader of a group, with its own position (from [`State::consumer`]).
///
/// Use one of two styles:
/// * raw wire bytes (a relay): [`Consumer::chunk`] (or [`Consumer::chunk_slice`])
///   then [`Consumer::advance`] by what was sent;
/// * frames (a viewer): [`Consumer::read_frame_header`], then
///   [`Consumer::payload_chunk`] + [`Consumer::advance`] or
///   [`Consumer::read_payload`]. Unread payload is skipped by the next
///   `read_frame_header`.
///
/// A consumer holds the block at its position from its creation on (see the
/// module docs on trimming), so a consumer that is never read keeps the group's
/// bytes from its position on alive: drop consumers you do not read.
///
/// Cloning gives an independent reader at the same position.
pub struct Consumer<'a, 'p> {
    state: &'a State<'p>,
    generation: u64,
    sequence: u64,
    /// The block holding `pos` (None before the first block exists, after a
    /// read error, or when created on a trimmed group).
    block: Option<Block<'p>>,
    /// Created before the group had a block; counted in `State::unanchored`
    /// until it takes the head.
    waiting: bool,
    /// Created after the group was trimmed: it cannot start at byte 0.
    trimmed: bool,
    offset: usize,
    pos: u64,
    /// Where the current frame's payload ends (= where the next FRAME header starts).
    frame_end: u64,
    /// Timestamp of the last frame header read (0 before the first).
    timestamp: u64,
}

impl<'a, 'p> Consumer<'a, 'p> {
    /// The group sequence number this consumer reads.
    pub fn sequence(&self) -> u64 {
        self.sequence
    }

    /// Bytes read (advanced over) so far.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Payload bytes of the current frame not read yet.
    pub fn payload_remaining(&self) -> u64 {
        self.frame_end.saturating_sub(self.pos)
    }

    /// True if this consumer was created after its group was trimmed: it
    /// cannot read from byte 0 and its reads return [`ReadError::Trimmed`].
    pub fn is_trimmed(&self) -> bool {
        self.trimmed
    }

    fn check(&mut self) -> Result<(), ReadError> {
        let s = self.state;
        let err = if s.generation.get() != self.generation {
            ReadError::Evicted
        } else {
            match s.status.get() {
                Status::Open | Status::Finished if self.trimmed => ReadError::Trimmed,
                Status::Open | Status::Finished => return Ok(()),
                Status::Aborted(code) => ReadError::Aborted(code),
                Status::Idle => ReadError::Evicted,
            }
        };
        self.block = None;
        Err(err)
    }

    /// What to report when no committed byte is left to read.
    fn end<T>(&self) -> Next<T> {
        if self.state.status.get() == Status::Finished && self.pos >= self.state.written.get() {
            Next::Finished
        } else {
            Next::Pending
        }
    }

    /// Moves `block`/`offset` onto an unread committed byte; false if there is none yet.
    fn settle(&mut self) -> bool {
        loop {
            match &self.block {
                // Only a consumer created on an empty group gets here with no
                // block (`check` stops the others); trimming waited for it,
                // so the head is still there once written.
                None if self.waiting => match self.state.head() {
                    Some(head) => {
                        self.block = Some(head);
                        self.offset = 0;
                        self.waiting = false;
                        self.state.anchored(self.generation);
                    }
                    None => return false,
                },
                None => return false,
                Some(b) => {
                    if self.offset < b.len() {
                        return true;
                    }
                    match b.next() {
                        Some(next) => {
                            self.block = Some(next);
                            self.offset = 0;
                        }
                        None => return false,
                    }
                }
            }
        }
    }

    /// The next contiguous committed bytes (up to a block boundary), without consuming them.
    ///
    /// # Errors
    /// [`ReadError::Aborted`] (forward the code as a reset) or [`ReadError::Evicted`].
    pub fn chunk(&mut self) -> Result<Next<&[u8]>, ReadError> {
        self.check()?;
        if !self.settle() {
            return Ok(self.end());
        }
        match &self.block {
            Some(b) => Ok(Next::Ready(b.data().get(self.offset..).unwrap_or(&[]))),
            None => Ok(self.end()),
        }
    }

    /// Like [`Consumer::chunk`], but as a [`Slice`] that owns a block reference and
    /// outlives this borrow (hand it to an asynchronous send, then [`Consumer::advance`]).
    ///
    /// # Errors
    /// As [`Consumer::chunk`].
    pub fn chunk_slice(&mut self) -> Result<Next<Slice<'p>>, ReadError> {
        self.check()?;
        if !self.settle() {
            return Ok(self.end());
        }
        let slice = self.block.as_ref().and_then(|b| {
            let end = b.len();
            b.clone().slice(self.offset, end)
        });
        Ok(slice.map_or_else(|| self.end(), Next::Ready))
    }

    /// Committed bytes readable now from the current position in at most
    /// `chunks` contiguous pieces, the first being the last chunk returned
    /// (every block but the chain's tail is full).
    pub fn readable_within(&self, chunks: usize) -> usize {
        let Some(b) = &self.block else {
            return 0;
        };
        let unread = usize::try_from(self.state.written.get().saturating_sub(self.pos))
            .unwrap_or(usize::MAX);
        let first = b.len().saturating_sub(self.offset);
        if !self.state.patched.get() {
            let rest = chunks
                .saturating_sub(1)
                .saturating_mul(self.state.pool.block_size());
            return unread.min(first.saturating_add(rest));
        }
        // Blocks before the tail may be short: count them one by one.
        let mut total = first;
        let mut cur = b.next();
        for _ in 1..chunks {
            let Some(block) = cur.take().filter(|_| total < unread) else {
                break;
            };
            total += block.len();
            cur = block.next();
        }
        unread.min(total)
    }

    /// Consumes `n` bytes of the last chunk; may wake a producer waiting for pacing.
    ///
    /// # Panics
    /// If `n` exceeds the bytes of the last chunk returned (a caller bug).
    pub fn advance(&mut self, n: usize) {
        if n == 0 {
            return;
        }
        let avail = self.block.as_ref().map_or(0, |b| b.len() - self.offset);
        assert!(n <= avail, "advance past the last chunk");
        self.offset += n;
        self.pos += n as u64;
        self.state.note_read(self.generation, self.pos);
    }

    /// Copies committed bytes into `out` and consumes them; `Ready(n)` with `n > 0`
    /// unless nothing is available.
    ///
    /// # Errors
    /// As [`Consumer::chunk`].
    pub fn read(&mut self, out: &mut [u8]) -> Result<Next<usize>, ReadError> {
        self.copy_out(out, false)
    }

    /// Reads the next FRAME header (skipping any unread payload of the current
    /// frame), even if it spans blocks; returns the absolute timestamp and length.
    ///
    /// `Pending` while the header (or the payload being skipped) is not written
    /// yet; `Finished` after the last frame.
    ///
    /// # Errors
    /// As [`Consumer::chunk`], and [`ReadError::Misaligned`] if raw advances
    /// moved this consumer past the frame it was tracking.
    pub fn read_frame_header(&mut self) -> Result<Next<Header>, ReadError> {
        self.check()?;
        while self.pos < self.frame_end {
            if !self.settle() {
                return Ok(self.end());
            }
            let avail = self.block.as_ref().map_or(0, |b| b.len() - self.offset);
            let skip = (avail as u64).min(self.frame_end - self.pos);
            self.advance(skip as usize);
        }
        if self.pos > self.frame_end {
            return Err(ReadError::Misaligned);
        }
        let mut buf = [0u8; MAX_HEADER_LEN];
        let n = self.peek(&mut buf);
        if n == 0 {
            return Ok(self.end());
        }
        let mut r = Reader::new(&buf[..n]);
        // PROTOCOL.md §3.9: the delta is from the previous frame's timestamp (first: from 0).
        match Header::decode(&mut r, self.timestamp, usize::MAX) {
            Ok(header) => {
                self.skip(r.position());
                self.timestamp = header.timestamp;
                self.frame_end = self.pos + header.len as u64;
                Ok(Next::Ready(header))
            }
            // The producer writes a header all at once; a partial one means the
            // rest is still to come.
            Err(DecodeError::Incomplete) => Ok(Next::Pending),
            Err(_) => Err(ReadError::Misaligned),
        }
    }

    /// The next contiguous committed bytes of the current frame's payload;
    /// `Finished` once the payload has been read to its end.
    ///
    /// # Errors
    /// As [`Consumer::chunk`].
    pub fn payload_chunk(&mut self) -> Result<Next<&[u8]>, ReadError> {
        let left = self.payload_remaining();
        if left == 0 {
            self.check()?;
            return Ok(Next::Finished);
        }
        Ok(self.chunk()?.map(|c| {
            let n = (c.len() as u64).min(left) as usize;
            &c[..n]
        }))
    }

    /// Copies payload bytes of the current frame into `out` and consumes them;
    /// `Finished` once the payload has been read to its end.
    ///
    /// # Errors
    /// As [`Consumer::chunk`].
    pub fn read_payload(&mut self, out: &mut [u8]) -> Result<Next<usize>, ReadError> {
        self.copy_out(out, true)
    }

    fn copy_out(&mut self, out: &mut [u8], payload: bool) -> Result<Next<usize>, ReadError> {
        let mut n = 0;
        while n < out.len() {
            let next = if payload {
                self.payload_chunk()?
            } else {
                self.chunk()?
            };
            let k = match next {
                Next::Ready(c) => {
                    let k = c.len().min(out.len() - n);
                    out[n..n + k].copy_from_slice(&c[..k]);
                    k
                }
                Next::Pending | Next::Finished if n > 0 => break,
                Next::Pending => return Ok(Next::Pending),
                Next::Finished => return Ok(Next::Finished),
            };
            self.advance(k);
            n += k;
        }
        Ok(Next::Ready(n))
    }

    /// Copies up to `buf.len()` committed bytes from the current position, across blocks.
    fn peek(&mut self, buf: &mut [u8]) -> usize {
        if !self.settle() {
            return 0;
        }
        let mut n = 0;
        let mut offset = self.offset;
        let mut cur = self.block.clone();
        while let Some(b) = cur {
            let src = b.data().get(offset..).unwrap_or(&[]);
            let k = src.len().min(buf.len() - n);
            buf[n..n + k].copy_from_slice(&src[..k]);
            n += k;
            if n == buf.len() {
                break;
            }
            cur = b.next();
            offset = 0;
        }
        n
    }

    /// Consumes `n` committed bytes that [`Consumer::peek`] saw, across blocks.
    fn skip(&mut self, mut n: usize) {
        while n > 0 && self.settle() {
            let avail = self.block.as_ref().map_or(0, |b| b.len() - self.offset);
            let k = avail.min(n);
            self.advance(k);
            n -= k;
        }
    }
}

impl Clone for Consumer<'_, '_> {
    fn clone(&self) -> Self {
        if self.waiting && self.generation == self.state.generation.get() {
            self.state.unanchored.set(self.state.unanchored.get() + 1);
        }
        Consumer {
            state: self.state,
            generation: self.generation,
            sequence: self.sequence,
            block: self.block.clone(),
            waiting: self.waiting,
            trimmed: self.trimmed,
            offset: self.offset,
            pos: self.pos,
            frame_end: self.frame_end,
            timestamp: self.timestamp,
        }
    }
}

impl Drop for Consumer<'_, '_> {
    fn drop(&mut self) {
        if self.waiting {
            self.state.anchored(self.generation);
        }
    }
}

impl fmt::Debug for Consumer<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Consumer")
            .field("sequence", &self.sequence)
            .field("generation", &self.generation)
            .field("pos", &self.pos)
            .field("frame_end", &self.frame_end)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    extern crate std;

    use super::*;
    use crate::model::frame::Frame;
    use crate::pool::{BlockMeta, PoolStorage};
    use core::ptr::NonNull;
    use proptest::prelude::*;
    use std::vec;
    use std::vec::Vec;

    /// PROTOCOL.md §6 V12: the group stream after its GROUP header.
    const V12: &[u8] = &[
        0x47, 0xd0, 0x05, b'h', b'e', b'l', b'l', b'o', //
        0x40, 0x42, 0x06, b'w', b'o', b'r', b'l', b'd', b'!',
    ];

    /// Reads every available raw byte.
    fn drain(c: &mut Consumer<'_, '_>) -> (Vec<u8>, Result<Next<()>, ReadError>) {
        let mut out = Vec::new();
        loop {
            match c.chunk() {
                Ok(Next::Ready(b)) => {
                    let n = b.len();
                    assert!(n > 0);
                    out.extend_from_slice(b);
                    c.advance(n);
                }
                Ok(Next::Pending) => return (out, Ok(Next::Pending)),
                Ok(Next::Finished) => return (out, Ok(Next::Finished)),
                Err(e) => return (out, Err(e)),
            }
        }
    }

    #[test]
    #[allow(unsafe_code)]
    fn foreign_payload_joins_the_chain_without_a_copy() {
        // Another pool's bytes: two frames' payloads, 10 and 7 bytes.
        let foreign = *b"0123456789abcdefg";
        let mut storage = PoolStorage::<8, 4>::new();
        let pool = Pool::new(&mut storage);
        let state = State::new(&pool, 1 << 20);
        state.reset(3);
        let mut c = state.consumer();
        let mut p = state.producer().unwrap();
        // SAFETY: `foreign` outlives the pool and is never written.
        let anchor = unsafe { pool.adopt(NonNull::from(&foreign).cast(), 17, 42) }.unwrap();
        p.begin_frame(5, 10).unwrap();
        p.write_payload(b"01").unwrap();
        assert_eq!(p.write_payload_from(&anchor, 2, 6), Ok(4));
        // Contiguous bytes grow the same piece.
        assert_eq!(p.write_payload_from(&anchor, 6, 10), Ok(4));
        assert_eq!(pool.in_use(), 3, "own block, foreign block, one piece");
        assert_eq!(
            p.write_payload_from(&anchor, 10, 11),
            Err(WriteError::NoFrame)
        );
        p.begin_frame(6, 7).unwrap();
        assert_eq!(
            p.write_payload_from(&anchor, 10, 17),
            Ok(7),
            "a piece may end the frame"
        );
        p.write_frame(7, b"xy").unwrap();
        p.finish().unwrap();
        drop(anchor);
        assert_eq!(state.bytes_written(), 2 + 10 + 2 + 7 + 4);
        // Records may gather short blocks: the count walks the chain.
        c.chunk().unwrap();
        assert_eq!(
            c.readable_within(1),
            4,
            "header (2) + `01` in the first block"
        );
        assert_eq!(c.readable_within(2), 12);
        assert_eq!(c.readable_within(4), 21);
        assert_eq!(c.readable_within(100), 25);
        assert_eq!(
            frames(&mut c),
            vec![
                (5, b"0123456789".to_vec()),
                (6, b"abcdefg".to_vec()),
                (7, b"xy".to_vec()),
            ]
        );
        drop((c, p));
        assert_eq!(
            pool.take_released(),
            None,
            "the group still holds the pieces"
        );
        state.clear();
        assert_eq!(pool.take_released(), Some(42));
        assert_eq!(pool.in_use(), 0);
    }

    /// Reads every available whole frame.
    fn frames(c: &mut Consumer<'_, '_>) -> Vec<(u64, Vec<u8>)> {
        let mut out = Vec::new();
        while let Next::Ready(h) = c.read_frame_header().unwrap() {
            let mut payload = vec![0u8; h.len];
            let mut got = 0;
            while got < h.len {
                match c.read_payload(&mut payload[got..]).unwrap() {
                    Next::Ready(n) => got += n,
                    other => panic!("payload stalled: {other:?}"),
                }
            }
            assert_eq!(c.read_payload(&mut [0u8; 1]).unwrap(), Next::Finished);
            out.push((h.timestamp, payload));
        }
        out
    }

    // --- wire layout ---------------------------------------------------------

    #[test]
    fn stores_v12_bytes_verbatim_across_blocks() {
        let mut storage = PoolStorage::<8, 4>::new();
        let pool = Pool::new(&mut storage);
        let group = State::new(&pool, 1024);
        group.reset(5);
        let mut p = group.producer().unwrap();
        p.write_frame(1000, b"hello").unwrap();
        p.write_frame(1033, b"world!").unwrap();
        p.finish().unwrap();
        assert_eq!(group.bytes_written(), V12.len() as u64);
        assert_eq!(group.frames_written(), 2);
        assert_eq!(group.last_timestamp(), 1033);
        assert_eq!(pool.in_use(), V12.len().div_ceil(4));

        let mut raw = group.consumer();
        assert_eq!(drain(&mut raw), (V12.to_vec(), Ok(Next::Finished)));
        let mut viewer = group.consumer();
        assert_eq!(
            frames(&mut viewer),
            vec![(1000, b"hello".to_vec()), (1033, b"world!".to_vec())]
        );
        assert_eq!(viewer.read_frame_header(), Ok(Next::Finished));
    }

    #[test]
    fn headers_spanning_many_blocks() {
        // Block size 1: every header spans blocks; timestamps need 8-byte varints.
        let mut storage = PoolStorage::<64, 1>::new();
        let pool = Pool::new(&mut storage);
        let group = State::new(&pool, 1024);
        group.reset(0);
        let mut p = group.producer().unwrap();
        p.write_frame(1 << 40, b"ab").unwrap();
        p.write_frame(5, b"").unwrap();
        p.write_frame(7, b"c").unwrap();
        let mut c = group.consumer();
        assert_eq!(
            frames(&mut c),
            vec![
                (1 << 40, b"ab".to_vec()),
                (5, Vec::new()),
                (7, b"c".to_vec())
            ]
        );
        assert_eq!(c.read_frame_header(), Ok(Next::Pending));
        p.finish().unwrap();
        assert_eq!(c.read_frame_header(), Ok(Next::Finished));
    }

    #[test]
    fn consumers_share_blocks() {
        let mut storage = PoolStorage::<4, 8>::new();
        let pool = Pool::new(&mut storage);
        let group = State::new(&pool, 1024);
        group.reset(1);
        let mut p = group.producer().unwrap();
        p.write_frame(0, b"0123456789").unwrap();
        let used = pool.in_use();
        let mut readers: Vec<_> = (0..10).map(|_| group.consumer()).collect();
        for r in &mut readers {
            let (bytes, _) = drain(r);
            assert_eq!(bytes.len(), 12);
        }
        assert_eq!(pool.in_use(), used);
        // A reader keeps only its current block: clearing the group frees the rest.
        group.clear();
        assert_eq!(pool.in_use(), 1);
        drop(readers);
        drop(p);
        assert_eq!(pool.in_use(), 0);
    }

    // --- statuses --------------------------------------------------------------

    #[test]
    fn pending_finished_and_aborted_are_distinct() {
        let mut storage = PoolStorage::<4, 8>::new();
        let pool = Pool::new(&mut storage);
        let group = State::new(&pool, 1024);
        group.reset(9);
        let mut c = group.consumer();
        assert_eq!(c.chunk(), Ok(Next::Pending));
        assert_eq!(c.read_frame_header(), Ok(Next::Pending));
        let mut p = group.producer().unwrap();
        assert!(group.producer().is_none(), "one producer per group");
        p.write_frame(3, b"x").unwrap();
        assert_eq!(drain(&mut c), (vec![0x06, 0x01, b'x'], Ok(Next::Pending)));
        p.finish().unwrap();
        assert_eq!(c.chunk(), Ok(Next::Finished));
        assert_eq!(p.write_frame(4, b"y"), Err(WriteError::Finished));
        assert!(!group.abort(1), "a finished group cannot be aborted");
        drop((c, p));

        group.reset(10);
        let mut p = group.producer().unwrap();
        let mut c = group.consumer();
        p.write_frame(0, b"abc").unwrap();
        p.abort(0x34);
        assert_eq!(group.status(), Status::Aborted(0x34));
        assert_eq!(c.chunk(), Err(ReadError::Aborted(0x34)));
        assert_eq!(p.write_frame(1, b""), Err(WriteError::Aborted(0x34)));
        assert_eq!(pool.in_use(), 0, "abort releases the blocks");
    }

    #[test]
    fn empty_group_finishes() {
        let mut storage = PoolStorage::<1, 8>::new();
        let pool = Pool::new(&mut storage);
        let group = State::new(&pool, 0);
        group.reset(0);
        let mut p = group.producer().unwrap();
        p.finish().unwrap();
        let mut c = group.consumer();
        assert_eq!(c.chunk(), Ok(Next::Finished));
        assert_eq!(c.read_frame_header(), Ok(Next::Finished));
        assert_eq!(pool.in_use(), 0);
    }

    #[test]
    fn dropped_producer_aborts() {
        let mut storage = PoolStorage::<2, 8>::new();
        let pool = Pool::new(&mut storage);
        let group = State::new(&pool, 64);
        group.reset(2);
        drop(group.producer().unwrap());
        assert_eq!(group.status(), Status::Aborted(ABORT_DROPPED));
        assert!(group.producer().is_none());
    }

    #[test]
    fn idle_slot_reads_evicted() {
        let mut storage = PoolStorage::<1, 8>::new();
        let pool = Pool::new(&mut storage);
        let group = State::new(&pool, 64);
        assert_eq!(group.status(), Status::Idle);
        assert!(group.producer().is_none());
        assert_eq!(group.consumer().chunk(), Err(ReadError::Evicted));
    }

    // --- eviction ----------------------------------------------------------------

    #[test]
    fn reset_evicts_old_handles() {
        let mut storage = PoolStorage::<4, 4>::new();
        let pool = Pool::new(&mut storage);
        let group = State::new(&pool, 64);
        group.reset(1);
        let mut old_p = group.producer().unwrap();
        old_p.write_frame(0, b"abcdef").unwrap();
        let mut old_c = group.consumer();
        let Next::Ready(chunk) = old_c.chunk().unwrap() else {
            panic!()
        };
        assert_eq!(chunk, &[0x00, 0x06, b'a', b'b']);

        group.reset(2);
        // The old consumer still holds its block, and through the link the next one.
        assert_eq!(pool.in_use(), 2);
        assert_eq!(old_c.chunk(), Err(ReadError::Evicted));
        assert_eq!(pool.in_use(), 0, "a stale consumer drops its blocks");
        assert_eq!(old_p.write_frame(1, b"x"), Err(WriteError::Evicted));
        assert_eq!(old_c.read_frame_header(), Err(ReadError::Evicted));

        // The new group is unaffected by the old handles, including their drop.
        let mut p = group.producer().unwrap();
        p.write_frame(0, b"new").unwrap();
        drop(old_p);
        drop(old_c);
        assert_eq!(group.status(), Status::Open);
        assert!(group.has_producer());
        let mut c = group.consumer();
        assert_eq!(c.sequence(), 2);
        assert_eq!(frames(&mut c), vec![(0, b"new".to_vec())]);
    }

    #[test]
    fn advancing_a_stale_consumer_does_not_touch_the_new_group() {
        let mut storage = PoolStorage::<4, 8>::new();
        let pool = Pool::new(&mut storage);
        let group = State::new(&pool, 64);
        group.reset(1);
        let mut p = group.producer().unwrap();
        p.write_frame(0, b"abcdef").unwrap();
        let mut c = group.consumer();
        let n = c.chunk().unwrap().ready().unwrap().len();
        group.reset(2);
        c.advance(n); // e.g. a send completed after the eviction
        assert_eq!(group.furthest_read(), 0);
    }

    // --- limits and backpressure -----------------------------------------------------

    #[test]
    fn whole_frames_are_all_or_nothing() {
        let mut storage = PoolStorage::<3, 4>::new();
        let pool = Pool::new(&mut storage);
        let group = State::new(&pool, 1024);
        group.reset(0);
        let mut p = group.producer().unwrap();
        p.write_frame(0, b"12345").unwrap(); // 7 bytes: 2 blocks, 1 spare byte
        assert_eq!(p.write_frame(0, b"123456"), Err(WriteError::PoolExhausted)); // needs 8
        assert_eq!(group.bytes_written(), 7);
        assert_eq!(pool.in_use(), 2);
        assert_eq!(pool.exhausted_count(), 1);
        p.write_frame(0, b"abc").unwrap(); // exactly fills 3 blocks
        assert_eq!(pool.in_use(), 3);
        assert_eq!(p.write_frame(0, b""), Err(WriteError::PoolExhausted));
        let mut c = group.consumer();
        assert_eq!(
            frames(&mut c),
            vec![(0, b"12345".to_vec()), (0, b"abc".to_vec())]
        );
    }

    #[test]
    fn group_size_limit() {
        let mut storage = PoolStorage::<8, 8>::new();
        let pool = Pool::new(&mut storage);
        let group = State::new(&pool, 10);
        group.reset(0);
        let mut p = group.producer().unwrap();
        assert_eq!(
            p.write_frame(0, b"123456789"),
            Err(WriteError::GroupTooLarge)
        );
        assert_eq!(p.begin_frame(0, 9), Err(WriteError::GroupTooLarge));
        p.write_frame(0, b"12345678").unwrap(); // exactly 10
        assert_eq!(p.write_frame(0, b""), Err(WriteError::GroupTooLarge));
        assert_eq!(group.bytes_written(), 10);
    }

    #[test]
    fn timestamp_range() {
        let mut storage = PoolStorage::<8, 8>::new();
        let pool = Pool::new(&mut storage);
        let group = State::new(&pool, 100);
        group.reset(0);
        let mut p = group.producer().unwrap();
        assert_eq!(p.write_frame(1 << 61, b""), Err(WriteError::TimestampRange));
        assert_eq!(group.bytes_written(), 0);
    }

    #[test]
    fn streamed_frame_with_partial_writes() {
        let mut storage = PoolStorage::<3, 4>::new();
        let pool = Pool::new(&mut storage);
        let group = State::new(&pool, 1024);
        group.reset(0);
        let mut p = group.producer().unwrap();
        assert_eq!(p.write_payload(b"x"), Err(WriteError::NoFrame));
        p.begin_frame(2, 20).unwrap(); // header `04 14`
        assert_eq!(p.write_frame(0, b""), Err(WriteError::InFrame));
        assert_eq!(p.begin_frame(0, 0), Err(WriteError::InFrame));
        assert_eq!(p.finish(), Err(WriteError::InFrame));
        assert_eq!(p.write_payload(&[7; 21]), Err(WriteError::PayloadOverrun));
        // Readers see the payload as it arrives.
        let mut c = group.consumer();
        assert_eq!(c.read_frame_header(), Ok(Next::Ready(Header::new(2, 20))));
        assert_eq!(p.write_payload(&[1; 6]), Ok(6));
        assert_eq!(c.read_payload(&mut [0; 32]), Ok(Next::Ready(6)));
        assert_eq!(c.payload_remaining(), 14);
        // 12 bytes of room: a partial write, then exhaustion.
        assert_eq!(p.write_payload(&[2; 14]), Ok(4));
        assert_eq!(p.write_payload(&[2; 10]), Err(WriteError::PoolExhausted));
        assert_eq!(p.frame_remaining(), 10);
        assert_eq!(group.bytes_written(), 12);
        assert_eq!(c.payload_chunk(), Ok(Next::Ready(&[2u8; 4][..])));
        c.advance(4);
        assert_eq!(c.payload_chunk(), Ok(Next::Pending));
    }

    #[test]
    fn zero_length_streamed_frame_is_complete() {
        let mut storage = PoolStorage::<2, 8>::new();
        let pool = Pool::new(&mut storage);
        let group = State::new(&pool, 64);
        group.reset(0);
        let mut p = group.producer().unwrap();
        p.begin_frame(1, 0).unwrap();
        assert_eq!(p.write_payload(b""), Err(WriteError::NoFrame));
        p.begin_frame(2, 3).unwrap();
        assert_eq!(p.write_payload(b""), Ok(0));
        assert_eq!(p.write_payload(b"abc"), Ok(3));
        p.finish().unwrap();
        let mut c = group.consumer();
        assert_eq!(frames(&mut c), vec![(1, Vec::new()), (2, b"abc".to_vec())]);
    }

    // --- frame reader details -------------------------------------------------------------

    #[test]
    fn header_reads_skip_unread_payload() {
        let mut storage = PoolStorage::<8, 3>::new();
        let pool = Pool::new(&mut storage);
        let group = State::new(&pool, 1024);
        group.reset(0);
        let mut p = group.producer().unwrap();
        p.write_frame(10, b"skip me please").unwrap();
        p.write_frame(20, b"keep").unwrap();
        p.finish().unwrap();
        let mut c = group.consumer();
        assert_eq!(c.read_frame_header(), Ok(Next::Ready(Header::new(10, 14))));
        let Next::Ready(first) = c.payload_chunk().unwrap() else {
            panic!()
        };
        assert_eq!(first, b"s"); // the rest of the first block
        c.advance(1);
        assert_eq!(c.read_frame_header(), Ok(Next::Ready(Header::new(20, 4))));
        let mut buf = [0u8; 8];
        assert_eq!(c.read_payload(&mut buf), Ok(Next::Ready(4)));
        assert_eq!(&buf[..4], b"keep");
        assert_eq!(c.read_frame_header(), Ok(Next::Finished));
    }

    #[test]
    fn raw_reads_past_a_frame_are_misaligned() {
        let mut storage = PoolStorage::<4, 16>::new();
        let pool = Pool::new(&mut storage);
        let group = State::new(&pool, 1024);
        group.reset(0);
        let mut p = group.producer().unwrap();
        p.write_frame(0, b"ab").unwrap();
        p.write_frame(0, b"cd").unwrap();
        let mut c = group.consumer();
        c.read_frame_header().unwrap();
        let n = c.chunk().unwrap().ready().unwrap().len();
        c.advance(n); // raw read through the next header
        assert_eq!(c.read_frame_header(), Err(ReadError::Misaligned));
    }

    #[test]
    fn chunk_slices_outlive_the_borrow() {
        let mut storage = PoolStorage::<8, 4>::new();
        let pool = Pool::new(&mut storage);
        let group = State::new(&pool, 1024);
        group.reset(0);
        let mut p = group.producer().unwrap();
        p.write_frame(1000, b"hello").unwrap();
        p.write_frame(1033, b"world!").unwrap();
        p.finish().unwrap();
        let mut c = group.consumer();
        let mut in_flight = Vec::new();
        while let Next::Ready(s) = c.chunk_slice().unwrap() {
            c.advance(s.len());
            in_flight.push(s);
        }
        let bytes: Vec<u8> = in_flight.iter().flat_map(|s| s.iter().copied()).collect();
        assert_eq!(bytes, V12);
        assert_eq!(c.chunk_slice().unwrap().ready().map(|s| s.len()), None);
    }

    #[test]
    fn furthest_read_is_the_max_over_readers() {
        let mut storage = PoolStorage::<4, 8>::new();
        let pool = Pool::new(&mut storage);
        let group = State::new(&pool, 1024);
        group.reset(0);
        let mut p = group.producer().unwrap();
        p.write_frame(0, b"0123456789").unwrap();
        let mut a = group.consumer();
        let mut b = group.consumer();
        a.read(&mut [0; 5]).unwrap();
        b.read(&mut [0; 3]).unwrap();
        assert_eq!(group.furthest_read(), 5);
        b.read(&mut [0; 4]).unwrap();
        assert_eq!(group.furthest_read(), 7);
        assert_eq!(group.allowance(10), 5);
    }

    // --- trimming -------------------------------------------------------------------------

    /// Payload byte `i` of frame `k`.
    fn pattern(k: u64, i: usize) -> u8 {
        (k.wrapping_mul(7).wrapping_add(i as u64 * 13) % 251) as u8
    }

    #[test]
    fn trimmed_group_memory_is_bounded_by_the_pacing_window() {
        // A 64 MiB group through a 2 MiB pool of 64 KiB blocks, one reader under a
        // 1 MiB window (smaller under Miri, same shape).
        let bs: usize = if cfg!(miri) { 64 } else { 64 << 10 };
        const BLOCKS: usize = 32;
        let window = 16 * bs as u64;
        let total = if cfg!(miri) { 64 * bs } else { 1024 * bs };
        let frame = bs / 4 + 3;
        let step = 3 * bs / 4 + 5;
        let mut bytes = vec![0u8; BLOCKS * bs];
        let mut meta: Vec<BlockMeta> = (0..BLOCKS).map(|_| BlockMeta::new()).collect();
        let pool = Pool::from_parts(&mut bytes, &mut meta).unwrap();
        let group = State::new(&pool, u64::MAX);
        group.set_retain(window);
        group.reset(3);
        let mut p = group.producer().unwrap();
        // Created on the empty group: it still reads from byte 0.
        let mut c = group.consumer();
        let mut payload = vec![0u8; frame];
        let mut buf = vec![0u8; step];
        let (mut k_out, mut k_in, mut got) = (0u64, 0u64, None::<usize>);
        let mut read_payload = 0usize;
        let mut late_checked = false;
        let mut done = false;
        while !done {
            // The producer writes whole frames while the window allows.
            while group.bytes_written() < total as u64 && p.allowance(window) >= frame as u64 + 4 {
                for (i, b) in payload.iter_mut().enumerate() {
                    *b = pattern(k_out, i);
                }
                p.write_frame(k_out, &payload).unwrap();
                k_out += 1;
                assert!(pool.in_use() <= window as usize / bs + 2);
            }
            if group.bytes_written() >= total as u64 && group.is_open() {
                p.finish().unwrap();
            }
            if group.is_trimmed() && !late_checked {
                // A consumer created after the trim cannot start at byte 0.
                let mut late = group.consumer();
                assert!(late.is_trimmed());
                assert_eq!(late.chunk(), Err(ReadError::Trimmed));
                assert_eq!(late.read_frame_header(), Err(ReadError::Trimmed));
                late_checked = true;
            }
            // The reader reads at most `step` payload bytes per turn.
            let mut budget = step;
            while budget > 0 {
                let left = match got {
                    Some(n) => frame - n,
                    None => match c.read_frame_header().unwrap() {
                        Next::Ready(h) => {
                            assert_eq!((h.timestamp, h.len), (k_in, frame));
                            got = Some(0);
                            frame
                        }
                        Next::Pending => break,
                        Next::Finished => {
                            done = true;
                            break;
                        }
                    },
                };
                let want = left.min(budget);
                let Next::Ready(n) = c.read_payload(&mut buf[..want]).unwrap() else {
                    break;
                };
                let at = got.unwrap_or(0);
                for (i, b) in buf[..n].iter().enumerate() {
                    assert_eq!(*b, pattern(k_in, at + i), "frame {k_in} byte {}", at + i);
                }
                budget -= n;
                read_payload += n;
                got = Some(at + n).filter(|&g| g < frame);
                if got.is_none() {
                    k_in += 1;
                }
            }
        }
        assert!(late_checked && group.is_trimmed());
        assert_eq!(k_in, k_out);
        assert_eq!(read_payload, k_out as usize * frame);
        assert!(group.bytes_written() >= total as u64);
        // Never more than one window plus the reader's block and the tail block.
        assert!(
            pool.high_water() <= window as usize / bs + 2,
            "high water {} blocks",
            pool.high_water()
        );
        assert_eq!(pool.exhausted_count(), 0);
        drop(c);
        assert_eq!(pool.in_use(), 0);
    }

    #[test]
    fn consumers_created_before_the_trim_read_from_zero() {
        let mut storage = PoolStorage::<16, 8>::new();
        let pool = Pool::new(&mut storage);
        let group = State::new(&pool, 1024);
        group.set_retain(16);
        group.reset(1);
        let mut p = group.producer().unwrap();
        // Created on the empty group, cloned, never read: trimming waits for them.
        let waiting = group.consumer();
        let waiting2 = waiting.clone();
        p.write_frame(0, b"0123456789").unwrap(); // 12 bytes: 2 blocks
        let mut parked = group.consumer(); // anchored at the head block now
        p.write_frame(1, b"abcdefghij").unwrap(); // 24 bytes > 16
        assert!(!group.is_trimmed(), "a waiting consumer holds trimming off");
        drop(waiting);
        assert!(!group.is_trimmed());
        drop(waiting2);
        assert!(group.is_trimmed(), "the last waiting consumer let go");
        assert!(group.consumer().is_trimmed());
        // The parked consumer keeps everything from byte 0 alive.
        p.write_frame(2, b"ABCDEFGHIJ").unwrap();
        assert_eq!(pool.in_use(), 36usize.div_ceil(8));
        p.finish().unwrap();
        assert_eq!(
            frames(&mut parked),
            vec![
                (0, b"0123456789".to_vec()),
                (1, b"abcdefghij".to_vec()),
                (2, b"ABCDEFGHIJ".to_vec())
            ]
        );
        assert_eq!(pool.in_use(), 1, "read blocks went back to the pool");
        drop(parked);
        assert_eq!(pool.in_use(), 0);
        // A consumer that waited and then read anchors the head, then trims.
        group.reset(2);
        let mut p = group.producer().unwrap();
        let mut first = group.consumer();
        p.write_frame(0, b"0123456789").unwrap();
        p.write_frame(1, b"0123456789").unwrap();
        assert!(!group.is_trimmed());
        assert_eq!(first.read(&mut [0u8; 3]), Ok(Next::Ready(3)));
        assert!(group.is_trimmed());
        assert_eq!(pool.in_use(), 3, "the reader's block and on");
        let (rest, end) = drain(&mut first);
        assert_eq!((rest.len(), end), (21, Ok(Next::Pending)));
        assert_eq!(pool.in_use(), 1, "only the tail is left");
        // Trimming is per group: a reset starts whole again; an abort still reports.
        group.reset(3);
        assert!(!group.is_trimmed());
        let mut p = group.producer().unwrap();
        p.write_frame(0, b"0123456789abcdef").unwrap();
        assert!(group.is_trimmed());
        let mut late = group.consumer();
        p.abort(0x9);
        assert_eq!(late.chunk(), Err(ReadError::Aborted(0x9)));
        assert_eq!(first.chunk(), Err(ReadError::Evicted));
    }

    #[test]
    fn retain_limit_applies_at_once_and_is_not_a_size_limit() {
        let mut storage = PoolStorage::<8, 8>::new();
        let pool = Pool::new(&mut storage);
        let group = State::new(&pool, 40);
        assert_eq!(group.retain(), u64::MAX);
        group.reset(0);
        let mut p = group.producer().unwrap();
        p.write_frame(0, &[1; 30]).unwrap(); // 32 bytes: 4 blocks
        assert!(!group.is_trimmed());
        assert_eq!(pool.in_use(), 4);
        group.set_retain(32);
        assert!(!group.is_trimmed(), "at the limit, not past it");
        group.set_retain(31);
        assert!(group.is_trimmed());
        assert_eq!(pool.in_use(), 1);
        group.set_retain(u64::MAX);
        assert!(
            group.is_trimmed(),
            "raising the limit does not bring bytes back"
        );
        // The size limit still refuses.
        assert_eq!(p.write_frame(1, &[2; 8]), Err(WriteError::GroupTooLarge));
        p.write_frame(1, &[2; 6]).unwrap();
        p.finish().unwrap();
        assert_eq!(pool.in_use(), 0);
        assert_eq!(group.retain(), u64::MAX, "kept across resets");
        group.reset(1);
        assert!(!group.is_trimmed());
    }

    // --- property: what goes in comes out ---------------------------------------------

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: if cfg!(miri) { 4 } else { 128 },
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        #[test]
        fn frames_round_trip(
            block_size in 1usize..24,
            frames_in in proptest::collection::vec(
                (0u64..100_000, proptest::collection::vec(any::<u8>(), 0..40), any::<bool>()),
                0..if cfg!(miri) { 4 } else { 16 }),
            read_step in 1usize..9,
            retain in prop_oneof![Just(u64::MAX), 0u64..64],
        ) {
            let blocks = 1024 / block_size + 1;
            let mut bytes = vec![0u8; blocks * block_size];
            let mut meta: Vec<BlockMeta> = (0..blocks).map(|_| BlockMeta::new()).collect();
            let pool = Pool::from_parts(&mut bytes, &mut meta).unwrap();
            let group = State::new(&pool, 4096);
            // Trimming must not change what consumers created early read.
            group.set_retain(retain);
            group.reset(7);
            let mut p = group.producer().unwrap();
            let mut raw = group.consumer();
            let mut viewer = group.consumer();
            let mut raw_bytes = Vec::new();
            let mut expect_wire = vec![0u8; 4096];
            let mut w = Writer::new(&mut expect_wire);
            let mut prev = 0;
            for (ts, payload, streamed) in &frames_in {
                if *streamed {
                    p.begin_frame(*ts, payload.len()).unwrap();
                    for piece in payload.chunks(read_step) {
                        prop_assert_eq!(p.write_payload(piece), Ok(piece.len()));
                    }
                } else {
                    p.write_frame(*ts, payload).unwrap();
                }
                Frame::new(*ts, payload).encode(prev, &mut w).unwrap();
                prev = *ts;
                // The raw reader trails in small steps.
                let mut buf = vec![0u8; read_step];
                while let Next::Ready(n) = raw.read(&mut buf).unwrap() {
                    raw_bytes.extend_from_slice(&buf[..n]);
                }
            }
            p.finish().unwrap();
            let (rest, end) = drain(&mut raw);
            raw_bytes.extend_from_slice(&rest);
            prop_assert_eq!(end, Ok(Next::Finished));
            let n = w.position();
            prop_assert_eq!(&raw_bytes[..], &expect_wire[..n]);
            prop_assert_eq!(group.bytes_written(), n as u64);
            let got = frames(&mut viewer);
            let want: Vec<(u64, Vec<u8>)> =
                frames_in.iter().map(|(t, p, _)| (*t, p.clone())).collect();
            prop_assert_eq!(got, want);
            prop_assert_eq!(viewer.read_frame_header(), Ok(Next::Finished));
            prop_assert_eq!(group.is_trimmed(), group.bytes_written() > retain);
            let mut late = group.consumer();
            if group.is_trimmed() {
                prop_assert_eq!(late.chunk(), Err(ReadError::Trimmed));
            } else {
                prop_assert_eq!(drain(&mut late).0, &expect_wire[..n]);
            }
            drop((raw, viewer, p, late));
            group.clear();
            prop_assert_eq!(pool.in_use(), 0);
        }
    }
}
