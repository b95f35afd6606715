//! A group: a sequence of frames stored once, in wire format, in a chain of pool blocks.
//!
//! # Layout
//! A group's bytes are exactly what follows the GROUP header on a moq-lite-05
//! group stream (docs/protocol.md §3.9): FRAME headers (`Timestamp Delta ZZ(i)`,
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
//!   it stays parked there it keeps the whole group alive;
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
//!
//! # Modules
//! This module holds the statuses, outcomes and errors and the [`State`]
//! struct every part shares; `state` is what a state offers its owner,
//! `chain` its block chain, `producer` and `consumer` the writer and readers.

mod chain;
mod consumer;
mod producer;
mod state;

#[cfg(test)]
mod tests;

use core::cell::Cell;
use core::fmt;
use core::task::Waker;

pub use consumer::Consumer;
pub use producer::Producer;

use crate::pool::{Block, BlockMut, Pool};

/// The code a group is aborted with when its [`Producer`] is dropped before
/// finishing: CANCEL (docs/protocol.md §3.15, stream codes).
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
    /// The timestamp is more than ±2^61 away from the previous frame's (docs/protocol.md §0 zigzag).
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
    /// The producer parked by [`Producer::poll_paced`].
    waker: Cell<Option<Waker>>,
    /// The group position the paced readers' transports accept up to: the
    /// largest of each reader's position plus its window ([`Consumer::pace`]);
    /// `None` while no reader paces (the producer is not held).
    pace_limit: Cell<Option<u64>>,
    /// Live consumers of this generation that reported a window.
    paced_readers: Cell<usize>,
    /// The producer paces itself ([`Producer::poll_paced`] or
    /// [`Producer::allowance`] was called): only then do readers report windows.
    pace_wanted: Cell<bool>,
}
