//! A track: a ring of recent groups, one producer, any number of readers.
//!
//! # API summary
//!
//! * [`Info`] (with [`Name`]): the TRACK_INFO values plus the track name, `Copy`.
//!   [`Info::new`]`(name)` gives moq-dev's defaults; [`Info::from_wire`] /
//!   [`Info::to_wire`] convert from/to [`TrackInfo`](crate::wire::lite::TrackInfo).
//! * [`State<'p, G>`]: the storage, a ring of `G` group slots (the cache of
//!   recent groups) over one [`Pool`](crate::pool::Pool). [`State::new`]`(pool, info)`,
//!   [`State::with_limits`]`(pool, info, `[`Limits`]`)`; [`State::handle`] gives a
//!   [`Ref`]. Implements [`Timeline`](crate::window::Timeline) (and so does [`Ref`]).
//! * [`Ref<'t, 'p>`]: a `Copy`, size-erased handle to a `State` (what broadcasts
//!   store). Everything else starts here:
//!   [`Ref::producer`] `-> Result<Producer, ProducerTaken>`,
//!   [`Ref::consumer`]`(Start) -> Consumer`, [`Ref::info`], [`Ref::status`],
//!   [`Ref::latest`], [`Ref::version`], [`Ref::poll_changed`]`(cx, since)`,
//!   [`Ref::group`]`(seq)`, [`Ref::latest_group`] (docs/protocol.md §4.8 Latest start),
//!   [`Ref::next_wanted`]`(&Window)` (newest wanted group, for a session),
//!   [`Ref::reopen`]`(info)` (reuse the slot for another track),
//!   [`Ref::subscribers`] / [`Ref::demand`] (the subscriptions sessions serve
//!   from the track and their aggregate request, docs/protocol.md §4.5).
//! * [`Producer`]: [`Producer::create_group`]`(seq)` (any order),
//!   [`Producer::append_group`] (latest + 1), [`Producer::finish`],
//!   [`Producer::abort`]`(code)`; at most one per track ([`ProducerTaken`]),
//!   dropping it unfinished aborts the track (or, in failover mode, detaches
//!   it: [`Ref::set_failover`]). Errors: [`CreateError`].
//! * [`GroupProducer`]: writes one group ([`GroupProducer::write_frame`],
//!   [`GroupProducer::begin_frame`] + [`GroupProducer::write_payload`],
//!   [`GroupProducer::finish`], [`GroupProducer::abort`]) and keeps the track's
//!   books (version, byte budget, max age); derefs to [`group::Producer`] for
//!   pacing ([`group::Producer::poll_paced`]).
//! * [`Consumer`]: one reader at its own position: [`Consumer::next_group`]
//!   `-> Result<`[`Next`]`, `[`ReadError`]`>` with `Ready(group::Consumer)`,
//!   `Pending`, `Lagged(n)` or `Finished`; [`Consumer::poll_next_group`] for async.
//! * [`Wakers<W>`]: a fixed-capacity waker registration (no allocation).
//!
//! # Model
//!
//! A group is stored once, in its wire form, in blocks of the pool
//! ([`group`]); every reader of every subscriber reads the same blocks. The
//! track keeps the `G` most recent groups (by sequence number, whatever order
//! they arrive in: relays receive them newest first, docs/protocol.md §3.9, §4.8)
//! and drops the oldest non-latest ones when
//!
//! * a new group needs a slot and the ring is full,
//! * the bytes held (counted in whole pool blocks) would exceed the byte budget
//!   ([`Limits::cache_bytes`]), or
//! * they are older than the publisher max age ([`Info::max_age`]), measured
//!   in presentation time as moq-dev does (docs/protocol.md §4.7): a group is stale
//!   once the point where its successor begins is more than max age behind
//!   the newest frame of the latest group.
//!
//! The latest group is never dropped. A dropped group's slot is cleared:
//! readers of it get [`group::ReadError::Evicted`] at their next read, and its
//! blocks go back to the pool when the last reader lets go of them.
//!
//! # Groups larger than the budget: trimming
//!
//! The byte budget is also every group's retain limit
//! ([`group::State::set_retain`]): a group that grows past
//! [`Limits::cache_bytes`] is not refused, and does not push everything else
//! out, it is *trimmed*: the track stops holding its first bytes, each block
//! goes back to the pool once every reader of it has moved on, and readers
//! that ask for it afterwards get [`group::ReadError::Trimmed`] (a session
//! skips such a group). So a 64 MiB group in a 1 MiB budget costs about one
//! pacing window per reader, not 64 MiB. The group size limit
//! ([`Limits::group_bytes`]) is separate and still refuses writes with
//! [`group::WriteError::GroupTooLarge`].
//!
//! [`Ref::held_bytes`] counts what the track itself keeps alive: all the
//! blocks of an untrimmed group, only the tail block being written of an open
//! trimmed group, nothing for a finished trimmed one (blocks a reader still
//! holds are the reader's, as for an evicted group). It is what the budget
//! bounds; the blocks readers hold are bounded by pacing.
//!
//! # Failover: keeping a track across the loss of its source
//!
//! With [`Ref::set_failover`]`(true)` (a relay that will re-subscribe
//! upstream elsewhere), losing the producer ([`Producer::abort`] or dropping
//! an unfinished [`Producer`]) does not end the track: the groups still open
//! are aborted (their readers get [`group::ReadError::Aborted`], their
//! streams are reset downstream), the producer is detached, the track stays
//! [`Status::Open`], and a later [`Ref::producer`] continues it. Track
//! readers see no end across the hand-over; readers waiting for a group get
//! the new producer's next one.
//!
//! # Change notification
//!
//! Every change (new group, frame or payload bytes, group end, eviction, track
//! end) bumps [`Ref::version`] and wakes the tasks registered with
//! [`Ref::poll_changed`] / [`Consumer::poll_next_group`] (at most [`WAKERS`];
//! on overflow every registered task is woken and the registration cleared, so
//! nobody is lost). A poller that does not use wakers compares versions.
//!
//! # Costs
//!
//! Nothing here allocates. Lookups scan the `G` slots (O(G)); a frame write
//! costs O(G) for the age check. `G` is meant to be small (a few to a few
//! dozen groups).
//!
//! # Layout
//!
//! This module holds the types every part shares: the statuses, outcomes and
//! errors, [`Ref`] and the track-wide state behind it. `info` names and
//! describes a track, `wakers` remembers the tasks to wake, `state` is the
//! storage, `handle` what a [`Ref`] does, `ring` the ring of groups and
//! its eviction, `subscriber_books` (over the tallies of `demand`) the
//! subscriptions served from a track, `producer` and `consumer` its writers
//! and readers.

mod consumer;
mod demand;
mod handle;
mod info;
mod producer;
mod ring;
mod state;
mod subscriber_books;
mod wakers;

#[cfg(test)]
mod tests;

use core::cell::Cell;
use core::fmt;

pub use consumer::Consumer;
pub use handle::Key;
pub use info::{
    DEFAULT_MAX_AGE, DEFAULT_PRIORITY, DEFAULT_TIMESCALE, Info, Limits, MAX_NAME_LEN, Name,
    NameTooLong,
};
pub use producer::{GroupProducer, Producer};
pub use state::State;
pub use wakers::{WAKERS, Wakers};

use super::group;
use demand::Demand;

/// Where a track is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Status {
    /// Groups may still be created.
    Open,
    /// No group will be created any more; the groups held can still be read
    /// (and open ones still written).
    Finished,
    /// The track was abandoned with this stream error code; its open groups were aborted.
    Aborted(u64),
}

/// Why [`Producer::create_group`] refused a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum CreateError {
    /// A group with this sequence number is held already (docs/protocol.md §3.9: deduplicate).
    Duplicate,
    /// The group is older than every group held and the ring is full, or it is
    /// already stale for the publisher max age: skip it (reset the stream with OLD).
    TooOld,
    /// [`Producer::append_group`] after group `u64::MAX`.
    SequenceOverflow,
    /// The track is finished.
    Finished,
    /// The track was aborted with this code.
    Aborted(u64),
    /// The track slot was reopened for another track, or this producer was
    /// detached in failover mode; this producer is stale.
    Stale,
}

impl fmt::Display for CreateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CreateError::Duplicate => f.write_str("duplicate group"),
            CreateError::TooOld => f.write_str("group older than the cache"),
            CreateError::SequenceOverflow => f.write_str("group sequence overflow"),
            CreateError::Finished => f.write_str("track finished"),
            CreateError::Aborted(code) => write!(f, "track aborted with code {code:#x}"),
            CreateError::Stale => f.write_str("track slot was reopened"),
        }
    }
}

impl core::error::Error for CreateError {}

/// [`Ref::producer`] refused: the track already has a live [`Producer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct ProducerTaken;

impl fmt::Display for ProducerTaken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("track already has a producer")
    }
}

impl core::error::Error for ProducerTaken {}

/// Why a [`Consumer`] cannot go on (as opposed to [`Next::Pending`] / [`Next::Finished`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum ReadError {
    /// The track was aborted with this stream error code.
    Aborted(u64),
    /// The track slot was reopened for another track; this consumer is stale.
    Stale,
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadError::Aborted(code) => write!(f, "track aborted with code {code:#x}"),
            ReadError::Stale => f.write_str("track slot was reopened"),
        }
    }
}

impl core::error::Error for ReadError {}

/// What [`Consumer::next_group`] found.
#[derive(Debug)]
pub enum Next<'t, 'p> {
    /// The next group, read from its first byte.
    Ready(group::Consumer<'t, 'p>),
    /// No new group yet: wait for [`Ref::version`] to change.
    Pending,
    /// The consumer fell behind the oldest kept group: groups it had not been
    /// given were evicted. It skipped this many sequence numbers and now stands
    /// at the latest group, which the next call returns (lag is data, not failure).
    Lagged(u64),
    /// The track is finished and every group after the consumer's position was given.
    Finished,
}

impl<'t, 'p> Next<'t, 'p> {
    /// The group, if ready.
    pub fn ready(self) -> Option<group::Consumer<'t, 'p>> {
        match self {
            Next::Ready(g) => Some(g),
            _ => None,
        }
    }
}

/// A borrowed handle to one generation of a [`State`] of any ring size;
/// `Copy`, two pointers and the generation.
///
/// Read-only queries, the producer and consumer constructors and the
/// session-facing helpers live here. Once the state is reused for another
/// track ([`Ref::reopen`]), the handle is stale ([`Ref::is_current`]): its
/// producer and consumers fail with `Stale`, and it no longer counts in or
/// changes the new track's subscriber books.
#[derive(Clone, Copy)]
pub struct Ref<'t, 'p> {
    core: &'t Core,
    slots: &'t [Slot<'p>],
    /// The generation this handle was made for.
    epoch: u64,
}

/// Track-wide bookkeeping, independent of the ring size.
struct Core {
    info: Cell<Info>,
    /// False while the TRACK_INFO values are still to come from upstream.
    info_known: Cell<bool>,
    status: Cell<Status>,
    /// Bumped by [`Ref::reopen`]; handles compare it to detect reuse.
    epoch: Cell<u64>,
    /// The highest sequence created (never evicted).
    latest: Cell<Option<u64>>,
    /// The highest sequence ever evicted (for lag detection).
    evicted_max: Cell<Option<u64>>,
    /// The first group the subscription filling the track said it delivers
    /// (SUBSCRIBE_START), see [`Ref::may_arrive`].
    upstream_first: Cell<Option<u64>>,
    evicted: Cell<u64>,
    version: Cell<u64>,
    budget: Cell<u64>,
    has_producer: Cell<bool>,
    /// Bumped each time a producer is handed out or detached; a producer whose
    /// number differs is stale.
    producer_id: Cell<u64>,
    /// Losing the producer detaches it instead of ending the track.
    failover: Cell<bool>,
    /// The subscriptions served from the track (see [`Ref::demand`]).
    demand: Cell<Demand>,
    wakers: Wakers<WAKERS>,
}

/// One cache slot: a group and the timestamp of its first frame.
struct Slot<'p> {
    group: group::State<'p>,
    /// Absolute timestamp of the group's first frame, once written.
    begin: Cell<Option<u64>>,
}

impl Slot<'_> {
    fn held(&self) -> bool {
        self.group.status() != group::Status::Idle
    }

    /// Pool bytes the group state holds: whole blocks (an aborted group holds
    /// none; a trimmed one only its tail while open, see the module docs).
    fn bytes(&self) -> u64 {
        let bs = self.group.pool().block_size() as u64;
        match self.group.status() {
            group::Status::Open if self.group.is_trimmed() => bs,
            group::Status::Finished if self.group.is_trimmed() => 0,
            group::Status::Open | group::Status::Finished => {
                self.group.bytes_written().div_ceil(bs) * bs
            }
            group::Status::Idle | group::Status::Aborted(_) => 0,
        }
    }
}
