//! What a [`State`] offers its owner: starting, clearing and aborting the
//! group in its slot, handing out its producer and consumers, and its counters
//! and limits.

use core::cell::Cell;
use core::fmt;

use super::{Consumer, Producer, State, Status};
use crate::pool::Pool;

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
            pace_limit: Cell::new(None),
            paced_readers: Cell::new(0),
            pace_wanted: Cell::new(false),
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
        self.pace_limit.set(None);
        self.paced_readers.set(0);
        self.pace_wanted.set(false);
        self.wake_producer();
    }

    /// Abandons an open group with stream error `code`; returns false if it was not open.
    ///
    /// The group's blocks are released at once (consumers drop theirs at their
    /// next read, which returns [`ReadError::Aborted`](super::ReadError::Aborted)). A parked producer is woken.
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
    /// block). On an idle slot, its reads return [`ReadError::Evicted`](super::ReadError::Evicted); on a
    /// trimmed group, [`ReadError::Trimmed`](super::ReadError::Trimmed).
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
            paced: false,
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
    /// bytes, and new consumers cannot read it ([`ReadError::Trimmed`](super::ReadError::Trimmed)).
    pub fn is_trimmed(&self) -> bool {
        self.trimmed.get()
    }

    /// How many more bytes the producer may write before it is a window ahead
    /// of its fastest reader (see the module docs on pacing); `u64::MAX` while
    /// no reader paces it.
    pub(super) fn allowance(&self) -> u64 {
        self.pace_limit
            .get()
            .map_or(u64::MAX, |limit| limit.saturating_sub(self.written.get()))
    }

    /// The position the paced readers accept up to, if one paces (tests).
    #[cfg(test)]
    pub(crate) fn pace_limit(&self) -> Option<u64> {
        self.pace_limit.get()
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
            .field("pace_limit", &self.pace_limit.get())
            .finish_non_exhaustive()
    }
}
