//! A track: a ring of recent groups, one producer, any number of readers.
//!
//! # API summary
//!
//! * [`Info`] (with [`Name`]): the TRACK_INFO values plus the track name, `Copy`.
//!   [`Info::new`]`(name)` gives moq-dev's defaults; [`Info::from_wire`] /
//!   [`Info::to_wire`] convert from/to [`TrackInfo`].
//! * [`State<'p, G>`]: the storage, a ring of `G` group slots (the cache of
//!   recent groups) over one [`Pool`]. [`State::new`]`(pool, info)`,
//!   [`State::with_limits`]`(pool, info, `[`Limits`]`)`; [`State::handle`] gives a
//!   [`Ref`]. Implements [`Timeline`] (and so does [`Ref`]).
//! * [`Ref<'t, 'p>`]: a `Copy`, size-erased handle to a `State` (what broadcasts
//!   store). Everything else starts here:
//!   [`Ref::producer`] `-> Result<Producer, ProducerTaken>`,
//!   [`Ref::consumer`]`(Start) -> Consumer`, [`Ref::info`], [`Ref::status`],
//!   [`Ref::latest`], [`Ref::version`], [`Ref::poll_changed`]`(cx, since)`,
//!   [`Ref::group`]`(seq)`, [`Ref::latest_group`] (PROTOCOL.md §4.8 Latest start),
//!   [`Ref::next_wanted`]`(&Window)` (newest wanted group, for a session),
//!   [`Ref::reopen`]`(info)` (reuse the slot for another track),
//!   [`Ref::subscribers`] / [`Ref::demand`] (the subscriptions sessions serve
//!   from the track and their aggregate request, PROTOCOL.md §4.5).
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
//! they arrive in: relays receive them newest first, PROTOCOL.md §3.9, §4.8)
//! and drops the oldest non-latest ones when
//!
//! * a new group needs a slot and the ring is full,
//! * the bytes held (counted in whole pool blocks) would exceed the byte budget
//!   ([`Limits::cache_bytes`]), or
//! * they are older than the publisher max age ([`Info::max_age`]), measured
//!   in presentation time as moq-dev does (PROTOCOL.md §4.7): a group is stale
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

use core::cell::Cell;
use core::fmt;
use core::num::NonZeroU64;
use core::ops::Deref;
use core::task::{Context, Poll, Waker};

use super::frame::Header;
use super::group;
use crate::pool::{Block, Pool};
use crate::time::{Duration, Instant};
use crate::window::{End, Request, Start, Timeline, Window};
use crate::wire::lite::TrackInfo;

/// The longest track name a [`Name`] holds, in bytes.
pub const MAX_NAME_LEN: usize = 128;

/// How many tasks a track remembers to wake at once (see [`Wakers`]).
pub const WAKERS: usize = 4;

/// moq-dev's default publisher priority (PROTOCOL.md §3.7).
pub const DEFAULT_PRIORITY: u8 = 127;

/// moq-dev's default publisher max age: 5 s (PROTOCOL.md §3.7).
pub const DEFAULT_MAX_AGE: Duration = Duration::from_millis(5000);

/// moq-dev's default timescale: milliseconds (PROTOCOL.md §3.7).
pub const DEFAULT_TIMESCALE: NonZeroU64 = match NonZeroU64::new(1000) {
    Some(t) => t,
    None => panic!("1000 is not zero"),
};

// ---------------------------------------------------------------------------
// Names and info
// ---------------------------------------------------------------------------

/// A name longer than [`MAX_NAME_LEN`] bytes was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct NameTooLong;

impl fmt::Display for NameTooLong {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("track name too long")
    }
}

impl core::error::Error for NameTooLong {}

/// A track name: an opaque string of at most [`MAX_NAME_LEN`] bytes, stored inline.
///
/// PROTOCOL.md §3.2: track names are compared byte for byte and never
/// normalized. The name is owned (a relay builds it from a network buffer it
/// cannot keep) and `Copy` (so a track slot can be reused for another track).
#[derive(Clone, Copy)]
pub struct Name {
    len: u8,
    bytes: [u8; MAX_NAME_LEN],
}

const _: () = assert!(MAX_NAME_LEN <= u8::MAX as usize);

impl Name {
    /// The empty name.
    pub const EMPTY: Name = Name {
        len: 0,
        bytes: [0; MAX_NAME_LEN],
    };

    /// Copies `name`.
    ///
    /// # Errors
    /// [`NameTooLong`] beyond [`MAX_NAME_LEN`] bytes.
    pub const fn new(name: &str) -> Result<Name, NameTooLong> {
        let src = name.as_bytes();
        if src.len() > MAX_NAME_LEN {
            return Err(NameTooLong);
        }
        let mut bytes = [0u8; MAX_NAME_LEN];
        let mut i = 0;
        while i < src.len() {
            bytes[i] = src[i];
            i += 1;
        }
        Ok(Name {
            len: src.len() as u8,
            bytes,
        })
    }

    /// The name's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        self.bytes.get(..self.len as usize).unwrap_or(&[])
    }

    /// The name as a string slice.
    pub fn as_str(&self) -> &str {
        // Always valid: the bytes were copied from a `&str`.
        core::str::from_utf8(self.as_bytes()).unwrap_or("")
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Whether the name is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Default for Name {
    fn default() -> Self {
        Name::EMPTY
    }
}

impl PartialEq for Name {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for Name {}

impl core::hash::Hash for Name {
    fn hash<H: core::hash::Hasher>(&self, state: &mut H) {
        self.as_bytes().hash(state);
    }
}

impl PartialEq<str> for Name {
    fn eq(&self, other: &str) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl PartialEq<&str> for Name {
    fn eq(&self, other: &&str) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(feature = "defmt")]
impl defmt::Format for Name {
    fn format(&self, f: defmt::Formatter<'_>) {
        defmt::write!(f, "{=str}", self.as_str())
    }
}

/// What a track is: its name and the TRACK_INFO values (PROTOCOL.md §3.7).
///
/// The values are immutable for the life of the track; a relay re-serves
/// exactly what it received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Info {
    /// The track name within its broadcast.
    pub name: Name,
    /// Publisher priority, a tie-break only (default [`DEFAULT_PRIORITY`]).
    pub priority: u8,
    /// How long non-latest groups are kept, in presentation time (default [`DEFAULT_MAX_AGE`]).
    pub max_age: Duration,
    /// Timestamp units per second (default [`DEFAULT_TIMESCALE`]).
    pub timescale: NonZeroU64,
}

impl Info {
    /// A track called `name` with moq-dev's defaults.
    ///
    /// # Errors
    /// [`NameTooLong`] beyond [`MAX_NAME_LEN`] bytes.
    pub const fn new(name: &str) -> Result<Info, NameTooLong> {
        match Name::new(name) {
            Ok(name) => Ok(Info {
                name,
                priority: DEFAULT_PRIORITY,
                max_age: DEFAULT_MAX_AGE,
                timescale: DEFAULT_TIMESCALE,
            }),
            Err(e) => Err(e),
        }
    }

    /// A track called `name` with the values of a received TRACK_INFO.
    ///
    /// # Errors
    /// [`NameTooLong`] beyond [`MAX_NAME_LEN`] bytes.
    pub const fn from_wire(name: &str, info: TrackInfo) -> Result<Info, NameTooLong> {
        match Name::new(name) {
            Ok(name) => Ok(Info {
                name,
                priority: info.priority,
                max_age: info.max_age,
                timescale: info.timescale,
            }),
            Err(e) => Err(e),
        }
    }

    /// The TRACK_INFO message for this track.
    pub const fn to_wire(&self) -> TrackInfo {
        TrackInfo {
            priority: self.priority,
            max_age: self.max_age,
            timescale: self.timescale,
        }
    }

    /// Sets the publisher priority.
    pub const fn with_priority(mut self, priority: u8) -> Self {
        self.priority = priority;
        self
    }

    /// Sets the publisher max age.
    pub const fn with_max_age(mut self, max_age: Duration) -> Self {
        self.max_age = max_age;
        self
    }

    /// Sets the timescale.
    pub const fn with_timescale(mut self, timescale: NonZeroU64) -> Self {
        self.timescale = timescale;
        self
    }

    /// `timestamp` (in this track's timescale) as an instant in microseconds, saturating.
    pub const fn instant(&self, timestamp: u64) -> Instant {
        let micros = timestamp as u128 * 1_000_000 / self.timescale.get() as u128;
        Instant::from_micros(if micros > u64::MAX as u128 {
            u64::MAX
        } else {
            micros as u64
        })
    }
}

/// Memory limits of a track.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Limits {
    /// The largest group in bytes (FRAME headers included); a write past it
    /// fails with [`group::WriteError::GroupTooLarge`].
    pub group_bytes: u64,
    /// The byte budget of the cache: pool blocks held by this track's groups,
    /// times the block size. Writing past it evicts the oldest non-latest
    /// groups. It is also each group's retain limit: a group that grows past
    /// it is trimmed (see the module docs) instead of holding all its bytes.
    pub cache_bytes: u64,
}

impl Limits {
    /// No limit but the pool's.
    pub const NONE: Limits = Limits {
        group_bytes: u64::MAX,
        cache_bytes: u64::MAX,
    };
}

impl Default for Limits {
    fn default() -> Self {
        Limits::NONE
    }
}

// ---------------------------------------------------------------------------
// Statuses, outcomes and errors
// ---------------------------------------------------------------------------

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
    /// A group with this sequence number is held already (PROTOCOL.md §3.9: deduplicate).
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

// ---------------------------------------------------------------------------
// Wakers
// ---------------------------------------------------------------------------

/// Up to `W` wakers to wake on a change, registered without allocating.
///
/// Registering a waker that will wake the same task as one already held is a
/// no-op. When all `W` places are taken, registering wakes every registered
/// task and clears them (they re-register when polled), then keeps the new
/// one: with any `W`, including 0, no task is ever forgotten, only woken early.
pub struct Wakers<const W: usize> {
    slots: [Cell<Option<Waker>>; W],
}

impl<const W: usize> Wakers<W> {
    /// An empty registration.
    pub const fn new() -> Self {
        Wakers {
            slots: [const { Cell::new(None) }; W],
        }
    }

    /// Remembers `waker` until the next [`Wakers::wake`].
    pub fn register(&self, waker: &Waker) {
        let mut free = None;
        for (i, slot) in self.slots.iter().enumerate() {
            match slot.take() {
                Some(w) => {
                    let same = w.will_wake(waker);
                    slot.set(Some(w));
                    if same {
                        return;
                    }
                }
                None => {
                    if free.is_none() {
                        free = Some(i);
                    }
                }
            }
        }
        let i = match free {
            Some(i) => i,
            None => {
                self.wake();
                0
            }
        };
        match self.slots.get(i) {
            Some(slot) => slot.set(Some(waker.clone())),
            None => waker.wake_by_ref(),
        }
    }

    /// Wakes and forgets every registered waker.
    pub fn wake(&self) {
        for slot in &self.slots {
            if let Some(w) = slot.take() {
                w.wake();
            }
        }
    }

    /// How many wakers are registered.
    pub fn len(&self) -> usize {
        self.slots
            .iter()
            .filter(|slot| {
                let w = slot.take();
                let some = w.is_some();
                slot.set(w);
                some
            })
            .count()
    }

    /// Whether no waker is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<const W: usize> Default for Wakers<W> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const W: usize> fmt::Debug for Wakers<W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Wakers")
            .field("registered", &self.len())
            .field("capacity", &W)
            .finish()
    }
}

// ---------------------------------------------------------------------------
// State
// ---------------------------------------------------------------------------

/// Distinct values a [`Tally`] counts exactly.
const TALLY_VALUES: usize = 4;

/// A multiset of up to [`TALLY_VALUES`] distinct values with their counts,
/// so the extremes come back down when values leave. A value that finds no
/// entry is kept as a bound ([`Tally::spill`]) until the tally is emptied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Tally {
    /// `(value, count)`, counts > 0, for the first `len`.
    values: [(u64, u32); TALLY_VALUES],
    len: usize,
    /// The lowest and highest values that found no entry, if any.
    spill: Option<(u64, u64)>,
}

impl Tally {
    const EMPTY: Tally = Tally {
        values: [(0, 0); TALLY_VALUES],
        len: 0,
        spill: None,
    };

    fn counted(&self) -> &[(u64, u32)] {
        self.values.get(..self.len).unwrap_or(&[])
    }

    fn add(&mut self, v: u64) {
        let len = self.len;
        if let Some(e) = self.values.iter_mut().take(len).find(|e| e.0 == v) {
            e.1 = e.1.saturating_add(1);
        } else if let Some(e) = self.values.get_mut(len) {
            *e = (v, 1);
            self.len += 1;
        } else {
            self.spill = Some(self.spill.map_or((v, v), |(lo, hi)| (lo.min(v), hi.max(v))));
        }
    }

    fn remove(&mut self, v: u64) {
        let len = self.len;
        if let Some(i) = self.values.iter().take(len).position(|e| e.0 == v)
            && let Some(e) = self.values.get_mut(i)
        {
            e.1 -= 1;
            if e.1 == 0 {
                self.values.swap(i, len - 1);
                self.len -= 1;
            }
        }
        // Not found: it was spilled, and the spill stays a bound.
    }

    fn max(&self) -> Option<u64> {
        let counted = self.counted().iter().map(|e| e.0).max();
        counted.max(self.spill.map(|(_, hi)| hi))
    }

    fn min(&self) -> Option<u64> {
        let counted = self.counted().iter().map(|e| e.0).min();
        match (counted, self.spill.map(|(lo, _)| lo)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// The subscriptions served from a track and what they ask for together
/// (PROTOCOL.md §4.5); see [`Ref::demand`].
///
/// Counters are exact, and so are the extremes (priority, max latency,
/// explicit starts and ends) while each takes at most [`TALLY_VALUES`]
/// distinct values among the subscriptions served; past that, the values
/// that did not fit bound them until the track has no subscriber.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Demand {
    subscribers: u32,
    /// Subscriptions starting at the latest group.
    latest_starts: u32,
    /// Subscriptions without an end.
    open_ends: u32,
    priorities: Tally,
    /// Max latencies, in microseconds.
    latencies: Tally,
    /// Explicit starts.
    starts: Tally,
    /// Explicit ends.
    ends: Tally,
}

impl Demand {
    const NONE: Demand = Demand {
        subscribers: 0,
        latest_starts: 0,
        open_ends: 0,
        priorities: Tally::EMPTY,
        latencies: Tally::EMPTY,
        starts: Tally::EMPTY,
        ends: Tally::EMPTY,
    };

    /// Counts `request` in (`sign` true) or out.
    fn count(&mut self, request: &Request, sign: bool) {
        let step = |n: &mut u32| {
            *n = if sign {
                n.saturating_add(1)
            } else {
                n.saturating_sub(1)
            }
        };
        let tally = |t: &mut Tally, v: u64| if sign { t.add(v) } else { t.remove(v) };
        step(&mut self.subscribers);
        match request.start {
            Start::Latest => step(&mut self.latest_starts),
            Start::Group(s) => tally(&mut self.starts, s),
        }
        match request.end {
            End::Open => step(&mut self.open_ends),
            End::Group(e) => tally(&mut self.ends, e),
        }
        tally(&mut self.priorities, u64::from(request.priority));
        tally(&mut self.latencies, request.max_latency.as_micros());
    }
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

/// The storage of one track: a ring of `G` group slots over a pool, plus its bookkeeping.
///
/// Put it where it outlives every handle (a `static`, the stack of the task
/// that runs the node, a relay's table of tracks) and share it through
/// [`State::handle`]. See the module docs for the model.
pub struct State<'p, const G: usize> {
    core: Core,
    slots: [Slot<'p>; G],
}

impl<'p, const G: usize> State<'p, G> {
    const RING_OK: () = assert!(G > 0, "track::State needs at least one group slot");

    /// A track described by `info`, without limits but the pool's.
    pub fn new(pool: &'p Pool<'p>, info: Info) -> Self {
        Self::with_limits(pool, info, Limits::NONE)
    }

    /// A track described by `info`, with `limits`.
    pub fn with_limits(pool: &'p Pool<'p>, info: Info, limits: Limits) -> Self {
        let () = Self::RING_OK;
        State {
            core: Core {
                info: Cell::new(info),
                info_known: Cell::new(true),
                status: Cell::new(Status::Open),
                epoch: Cell::new(0),
                latest: Cell::new(None),
                evicted_max: Cell::new(None),
                evicted: Cell::new(0),
                version: Cell::new(0),
                budget: Cell::new(limits.cache_bytes),
                has_producer: Cell::new(false),
                producer_id: Cell::new(0),
                failover: Cell::new(false),
                demand: Cell::new(Demand::NONE),
                wakers: Wakers::new(),
            },
            slots: core::array::from_fn(|_| {
                let group = group::State::new(pool, limits.group_bytes);
                group.set_retain(limits.cache_bytes);
                Slot {
                    group,
                    begin: Cell::new(None),
                }
            }),
        }
    }

    /// The size-erased handle every producer, consumer and broadcast uses.
    pub fn handle(&self) -> Ref<'_, 'p> {
        Ref {
            core: &self.core,
            slots: &self.slots,
            epoch: self.core.epoch.get(),
        }
    }

    /// The track's one producer; see [`Ref::producer`].
    ///
    /// # Errors
    /// [`ProducerTaken`] while another producer of this track is alive.
    pub fn producer(&self) -> Result<Producer<'_, 'p>, ProducerTaken> {
        self.handle().producer()
    }

    /// A new reader; see [`Ref::consumer`].
    pub fn consumer(&self, start: Start) -> Consumer<'_, 'p> {
        self.handle().consumer(start)
    }
}

impl<'t, 'p, const G: usize> From<&'t State<'p, G>> for Ref<'t, 'p> {
    fn from(state: &'t State<'p, G>) -> Self {
        state.handle()
    }
}

impl<const G: usize> Timeline for State<'_, G> {
    fn latest(&self) -> Option<u64> {
        self.handle().latest()
    }

    fn newest(&self) -> Instant {
        Timeline::newest(&self.handle())
    }

    fn superseded_at(&self, seq: u64) -> Option<Instant> {
        self.handle().superseded_at(seq)
    }
}

impl<const G: usize> fmt::Debug for State<'_, G> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.handle(), f)
    }
}

// ---------------------------------------------------------------------------
// Ref
// ---------------------------------------------------------------------------

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

/// The identity of one track: its state's address and the generation of it,
/// so a table keyed by track never confuses a reused state with the track it
/// held before.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Key {
    addr: usize,
    epoch: u64,
}

impl Key {
    /// A key no track has (a placeholder in fixed tables).
    pub const NONE: Key = Key { addr: 0, epoch: 0 };

    /// A key from raw parts (an address and a generation), for tests of
    /// tables keyed by track; real keys come from [`Ref::key`].
    pub const fn from_parts(addr: usize, epoch: u64) -> Key {
        Key { addr, epoch }
    }

    /// The address part (where the track's state lives).
    pub(crate) fn addr(&self) -> usize {
        self.addr
    }
}

impl<'t, 'p> Ref<'t, 'p> {
    /// The identity of this track (state and generation), for tables keyed by
    /// track: the same for every handle to it, different from every handle to
    /// another track or to another generation of the same state.
    pub fn key(&self) -> Key {
        Key {
            addr: core::ptr::from_ref(self.core) as usize,
            epoch: self.epoch,
        }
    }

    /// True while the state still holds the track this handle was made for
    /// (it was not reopened for another one since).
    pub fn is_current(&self) -> bool {
        self.core.epoch.get() == self.epoch
    }

    /// A handle to whatever track the state holds now (this one's state, the
    /// current generation).
    pub fn current(&self) -> Ref<'t, 'p> {
        Ref {
            epoch: self.core.epoch.get(),
            ..*self
        }
    }

    /// The track's one producer.
    ///
    /// # Errors
    /// Once the previous producer finished, was dropped or detached, this
    /// succeeds again: in failover mode ([`Ref::set_failover`]) the new producer
    /// continues the open track (any sequence the ring still accepts; see
    /// [`Producer::create_group`]).
    ///
    /// # Errors
    /// [`ProducerTaken`] while another producer of this track is alive, or
    /// when the handle is stale ([`Ref::is_current`]). A second writer would race the first for sequence numbers; a relay that
    /// re-splices a track onto a new upstream (PROTOCOL.md §4.4) either keeps
    /// the producer and feeds it from the new source, or sets failover mode
    /// and lets the old producer go first.
    pub fn producer(self) -> Result<Producer<'t, 'p>, ProducerTaken> {
        if self.core.has_producer.get() || !self.is_current() {
            return Err(ProducerTaken);
        }
        self.core.has_producer.set(true);
        let id = self.core.producer_id.get().wrapping_add(1);
        self.core.producer_id.set(id);
        Ok(Producer {
            track: self,
            epoch: self.epoch,
            id,
        })
    }

    /// True while a [`Producer`] of this track is alive and attached.
    pub fn has_producer(&self) -> bool {
        self.core.has_producer.get()
    }

    /// Sets failover mode (off by default and after [`Ref::reopen`]).
    ///
    /// While it is on, losing the producer does not end the track:
    /// [`Producer::abort`] and dropping an unfinished [`Producer`] abort the
    /// groups still open (with the abort code, or [`group::ABORT_DROPPED`] for
    /// a drop), detach the producer and leave the track's [`Status`] as it was;
    /// a later [`Ref::producer`] continues the track. [`Producer::finish`]
    /// still finishes it. With the mode off, abort and drop end the track
    /// ([`Status::Aborted`]) as usual.
    pub fn set_failover(&self, on: bool) {
        self.core.failover.set(on);
    }

    /// Whether failover mode is on (see [`Ref::set_failover`]).
    pub fn failover(&self) -> bool {
        self.core.failover.get()
    }

    /// A new reader positioned at `start`.
    ///
    /// [`Start::Latest`] begins at the latest group (PROTOCOL.md §3.8: delivered
    /// from its first frame), or at whichever group comes first if there is none
    /// yet; [`Start::Group`] at that sequence (groups before it are never given).
    pub fn consumer(self, start: Start) -> Consumer<'t, 'p> {
        let cursor = match start {
            Start::Latest => self.core.latest.get().unwrap_or(0),
            Start::Group(seq) => seq,
        };
        Consumer {
            track: self,
            epoch: self.epoch,
            cursor,
            exhausted: false,
        }
    }

    /// Whether `self` and `other` are handles to the same track (same state,
    /// same generation).
    pub fn same_track(&self, other: &Ref<'_, '_>) -> bool {
        core::ptr::eq(self.core, other.core) && self.epoch == other.epoch
    }

    /// The track's name and TRACK_INFO values.
    pub fn info(&self) -> Info {
        self.core.info.get()
    }

    /// False while the track's TRACK_INFO values are still to come (a relay
    /// track made before its upstream answered, see [`Ref::await_info`]):
    /// [`Ref::info`] then holds defaults, not to be served as the track's.
    pub fn info_known(&self) -> bool {
        self.core.info_known.get()
    }

    /// Marks the TRACK_INFO values as still to come (until [`Ref::set_info`]):
    /// a relay track made on demand re-serves its upstream's values
    /// (PROTOCOL.md §3.7), so TRACK requests for it wait for them.
    pub fn await_info(&self) {
        self.core.info_known.set(false);
    }

    /// Sets the TRACK_INFO values (the name is kept) and wakes the track's
    /// pollers: what a relay received from upstream.
    pub fn set_info(&self, wire: crate::wire::lite::TrackInfo) {
        let mut info = self.core.info.get();
        info.priority = wire.priority;
        info.max_age = wire.max_age;
        info.timescale = wire.timescale;
        self.core.info.set(info);
        self.core.info_known.set(true);
        self.changed();
    }

    /// Whether the track is called `name` (byte-wise, PROTOCOL.md §3.2).
    pub fn has_name(&self, name: &str) -> bool {
        self.core.info.get().name == name
    }

    /// Where the track is in its life.
    pub fn status(&self) -> Status {
        self.core.status.get()
    }

    /// The highest group sequence created so far (always held), or `None`.
    pub fn latest(&self) -> Option<u64> {
        self.core.latest.get()
    }

    /// The lowest group sequence held, or `None`.
    pub fn oldest(&self) -> Option<u64> {
        self.oldest_slot(None).map(|i| self.seq(i))
    }

    /// How many groups are held.
    pub fn len(&self) -> usize {
        self.slots.iter().filter(|s| s.held()).count()
    }

    /// Whether no group is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The ring size `G`.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// The sequence numbers held, in slot order (not sorted).
    pub fn sequences(&self) -> impl Iterator<Item = u64> + use<'t, 'p> {
        self.slots
            .iter()
            .filter(|s| s.held())
            .map(|s| s.group.sequence())
    }

    /// Pool bytes the track's group states hold (whole blocks): every block of
    /// an untrimmed group, the tail block of an open trimmed one; blocks only
    /// readers hold are not counted (see the module docs).
    pub fn held_bytes(&self) -> u64 {
        self.slots.iter().map(Slot::bytes).sum()
    }

    /// The byte budget (see [`Limits::cache_bytes`]).
    pub fn budget(&self) -> u64 {
        self.core.budget.get()
    }

    /// Changes the byte budget; evictions apply from the next group or write.
    ///
    /// It is also every group's retain limit, which applies at once: a held
    /// group already past `bytes` is trimmed now (see the module docs).
    pub fn set_budget(&self, bytes: u64) {
        self.core.budget.set(bytes);
        for s in self.slots {
            s.group.set_retain(bytes);
        }
    }

    /// How many groups were dropped to make room or by age.
    pub fn evicted_count(&self) -> u64 {
        self.core.evicted.get()
    }

    /// A counter bumped on every change (group, frame, payload, end, eviction).
    pub fn version(&self) -> u64 {
        self.core.version.get()
    }

    /// Ready with the current version once it differs from `since`; otherwise
    /// registers the task (see [`Wakers`]) and returns `Pending`.
    #[must_use = "Pending means: poll again when woken"]
    pub fn poll_changed(&self, cx: &mut Context<'_>, since: u64) -> Poll<u64> {
        let v = self.core.version.get();
        if v != since {
            return Poll::Ready(v);
        }
        self.core.wakers.register(cx.waker());
        Poll::Pending
    }

    /// A reader of group `seq` from its first byte, if held.
    pub fn group(&self, seq: u64) -> Option<group::Consumer<'t, 'p>> {
        self.find(seq).map(|i| self.slot(i).group.consumer())
    }

    /// A reader of the latest group from its first byte: the first group of a
    /// [`Start::Latest`] subscription (PROTOCOL.md §4.8).
    pub fn latest_group(&self) -> Option<group::Consumer<'t, 'p>> {
        self.group(self.core.latest.get()?)
    }

    /// The newest held group that `window` still wants and that is not expired
    /// for its max latency (PROTOCOL.md §4.6: newest first; §4.7).
    ///
    /// This is how a session serves a subscription: take this group, remove
    /// it from the window ([`Window::remove`]), open its stream, repeat until
    /// `None`, then wait for [`Ref::version`] to change. Aborted groups are
    /// returned too (their reads report the code to forward). Costs O(G·N).
    pub fn next_wanted<const N: usize>(
        &self,
        window: &Window<N>,
    ) -> Option<group::Consumer<'t, 'p>> {
        let mut best: Option<(usize, u64)> = None;
        for (i, s) in self.slots.iter().enumerate() {
            if !s.held() {
                continue;
            }
            let seq = s.group.sequence();
            if window.contains(seq) && best.is_none_or(|(_, b)| seq > b) {
                best = Some((i, seq));
            }
        }
        let (i, seq) = best?;
        // Staleness is monotonic in the sequence: if the newest wanted group is
        // expired, every older wanted one is too.
        if window.is_expired(seq, self) {
            return None;
        }
        Some(self.slot(i).group.consumer())
    }

    /// Ends the track: no group will be created any more (SUBSCRIBE_END is the
    /// latest group + 1). Returns false if it was not open.
    fn finish(&self) -> bool {
        if self.core.status.get() != Status::Open {
            return false;
        }
        self.core.status.set(Status::Finished);
        self.changed();
        true
    }

    /// Abandons the track with stream error `code`, aborting its open groups.
    /// Returns false if it was already aborted.
    fn abort(&self, code: u64) -> bool {
        if let Status::Aborted(_) = self.core.status.get() {
            return false;
        }
        debug!("track aborted, code {}", code);
        self.core.status.set(Status::Aborted(code));
        for s in self.slots {
            s.group.abort(code);
        }
        self.changed();
        true
    }

    /// Failover: lets the producer go without ending the track. Aborts the
    /// open groups with `code`, marks the producer detached (any handle to it
    /// is stale from now on) and notifies readers. Returns false if the track
    /// was already aborted (nothing to keep).
    fn detach(&self, code: u64) -> bool {
        if let Status::Aborted(_) = self.core.status.get() {
            return false;
        }
        debug!("track producer detached, code {}", code);
        for s in self.slots {
            s.group.abort(code);
        }
        self.core.has_producer.set(false);
        let c = self.core;
        c.producer_id.set(c.producer_id.get().wrapping_add(1));
        self.changed();
        true
    }

    /// How many subscriptions are served from this track now (every session
    /// registers each subscription it serves for as long as it serves it).
    ///
    /// A relay cancels its upstream subscription once this stays 0
    /// (PROTOCOL.md §4.5).
    pub fn subscribers(&self) -> u32 {
        if !self.is_current() {
            return 0;
        }
        self.core.demand.get().subscribers
    }

    /// The aggregate of the requests served from this track, or `None`
    /// without a subscriber: what a relay asks its upstream for (PROTOCOL.md
    /// §4.5). Priority and max latency are the highest requested (each
    /// already clamped to this track's max age by the serving session); the
    /// start is [`Start::Latest`] if any subscription starts at the latest
    /// group, else the lowest explicit start; the end is [`End::Open`] if any
    /// subscription is unbounded, else the highest explicit end.
    ///
    /// O(1), no scan of the subscriptions, and exact while each value takes
    /// at most 4 distinct values among them (past that, an upper bound
    /// until the track has no subscriber). Counts are always exact.
    pub fn demand(&self) -> Option<Request> {
        let d = self.core.demand.get();
        if d.subscribers == 0 || !self.is_current() {
            return None;
        }
        Some(Request {
            start: if d.latest_starts > 0 {
                Start::Latest
            } else {
                Start::Group(d.starts.min().unwrap_or(0))
            },
            end: if d.open_ends > 0 {
                End::Open
            } else {
                End::Group(d.ends.max().unwrap_or(0))
            },
            ordered: false,
            priority: u8::try_from(d.priorities.max().unwrap_or(0)).unwrap_or(u8::MAX),
            max_latency: Duration::from_micros(d.latencies.max().unwrap_or(0)),
        })
    }

    /// Registers a subscription served from this track with `request` (a
    /// session calls it when it starts serving one; balance it with
    /// [`Ref::remove_subscriber`] with the same request).
    pub(crate) fn add_subscriber(&self, request: &Request) {
        if !self.is_current() {
            return;
        }
        let mut d = self.core.demand.get();
        d.count(request, true);
        self.core.demand.set(d);
    }

    /// Unregisters a subscription registered with `request` (it is no longer
    /// served). The last one leaving clears the aggregate.
    pub(crate) fn remove_subscriber(&self, request: &Request) {
        if !self.is_current() {
            return;
        }
        let mut d = self.core.demand.get();
        d.count(request, false);
        if d.subscribers == 0 {
            d = Demand::NONE;
        }
        self.core.demand.set(d);
    }

    /// Replaces registered request `old` with `new` (a SUBSCRIBE_UPDATE).
    pub(crate) fn update_subscriber(&self, old: &Request, new: &Request) {
        if old == new || !self.is_current() {
            return;
        }
        let mut d = self.core.demand.get();
        d.count(old, false);
        d.count(new, true);
        self.core.demand.set(d);
    }

    /// Reuses the storage for the track `info` and returns the handle to it:
    /// every group is dropped, the track is open and empty, failover mode is
    /// off, its subscriber books are empty, and every existing handle (this
    /// one, producers, consumers, group producers and readers) becomes stale.
    /// The byte budget is kept.
    ///
    /// A relay keeps a fixed table of track states and reopens a free one when
    /// a new track appears, instead of allocating; it reopens a state only once
    /// no subscription is served from it ([`Ref::subscribers`] is 0), since
    /// stale handles no longer unregister.
    pub fn reopen(&self, info: Info) -> Ref<'t, 'p> {
        let c = self.core;
        c.epoch.set(c.epoch.get().wrapping_add(1));
        c.info.set(info);
        c.info_known.set(true);
        c.status.set(Status::Open);
        c.latest.set(None);
        c.evicted_max.set(None);
        c.has_producer.set(false);
        c.failover.set(false);
        c.demand.set(Demand::NONE);
        for s in self.slots {
            s.group.clear();
            s.begin.set(None);
        }
        self.changed();
        self.current()
    }

    // --- internals ---

    fn slot(&self, i: usize) -> &'t Slot<'p> {
        // Indices come from iterating `self.slots`.
        &self.slots[i]
    }

    fn seq(&self, i: usize) -> u64 {
        self.slot(i).group.sequence()
    }

    fn find(&self, seq: u64) -> Option<usize> {
        self.slots
            .iter()
            .position(|s| s.held() && s.group.sequence() == seq)
    }

    /// The held slot with the lowest sequence, skipping sequence `except`.
    fn oldest_slot(&self, except: Option<u64>) -> Option<usize> {
        self.oldest_where(|s| Some(s.group.sequence()) != except)
    }

    fn oldest_where(&self, ok: impl Fn(&Slot<'p>) -> bool) -> Option<usize> {
        let mut best: Option<(usize, u64)> = None;
        for (i, s) in self.slots.iter().enumerate() {
            if !s.held() || !ok(s) {
                continue;
            }
            let seq = s.group.sequence();
            if best.is_none_or(|(_, b)| seq < b) {
                best = Some((i, seq));
            }
        }
        best.map(|(i, _)| i)
    }

    /// Bumps the version and wakes the registered tasks.
    fn changed(&self) {
        self.core
            .version
            .set(self.core.version.get().wrapping_add(1));
        self.core.wakers.wake();
    }

    fn evict(&self, i: usize) {
        let s = self.slot(i);
        let seq = s.group.sequence();
        trace!("evicting group {}", seq);
        s.group.clear();
        s.begin.set(None);
        let c = self.core;
        c.evicted.set(c.evicted.get() + 1);
        if c.evicted_max.get().is_none_or(|m| seq > m) {
            c.evicted_max.set(Some(seq));
        }
    }

    /// Timestamp of the newest frame of the latest group (PROTOCOL.md §4.7);
    /// while the latest group has no frame, the newest frame of any held group.
    fn newest_ts(&self) -> u64 {
        if let Some(i) = self.core.latest.get().and_then(|l| self.find(l)) {
            let g = &self.slot(i).group;
            if g.frames_written() > 0 {
                return g.last_timestamp();
            }
        }
        self.slots
            .iter()
            .filter(|s| s.held() && s.group.frames_written() > 0)
            .map(|s| s.group.last_timestamp())
            .max()
            .unwrap_or(0)
    }

    /// Where the successors of `seq` begin: the earliest first frame of the held
    /// groups after it, or the newest frame if none has begun. Non-decreasing in `seq`.
    fn superseded_ts(&self, seq: u64) -> u64 {
        self.slots
            .iter()
            .filter(|s| s.held() && s.group.sequence() > seq)
            .filter_map(|s| s.begin.get())
            .min()
            .unwrap_or_else(|| self.newest_ts())
    }

    /// Whether a group `seq` (not the latest) is past the publisher max age.
    fn is_stale(&self, seq: u64) -> bool {
        let info = self.core.info.get();
        let newest = info.instant(self.newest_ts());
        let at = info.instant(self.superseded_ts(seq));
        newest.saturating_duration_since(at) > info.max_age
    }

    /// Drops the oldest non-latest groups while they are past the publisher max age.
    fn expire(&self) -> bool {
        let Some(latest) = self.core.latest.get() else {
            return false;
        };
        let mut any = false;
        while let Some(i) = self.oldest_slot(Some(latest)) {
            if !self.is_stale(self.seq(i)) {
                break;
            }
            self.evict(i);
            any = true;
        }
        any
    }

    /// Evicts the oldest non-latest groups holding bytes until `extra` more
    /// bytes for the group in `writing` fit the budget (or nothing is left to
    /// evict). The group being written is a candidate like any other: if it is
    /// the oldest, it goes, and its write fails with `Evicted`.
    fn make_room(&self, extra: u64, writing: Option<&Slot<'p>>) -> bool {
        let budget = self.core.budget.get();
        if budget == u64::MAX {
            return false;
        }
        let latest = self.core.latest.get();
        let mut held = self.held_bytes();
        let mut extra = extra;
        let mut any = false;
        while held.saturating_add(extra) > budget {
            let Some(i) = self.oldest_where(|s| {
                Some(s.group.sequence()) != latest
                    && (s.bytes() > 0 || writing.is_some_and(|w| core::ptr::eq(w, s)))
            }) else {
                break;
            };
            let victim = self.slot(i);
            if writing.is_some_and(|w| core::ptr::eq(w, victim)) {
                extra = 0;
            }
            held -= victim.bytes();
            self.evict(i);
            any = true;
        }
        any
    }

    fn create(self, epoch: u64, seq: u64) -> Result<GroupProducer<'t, 'p>, CreateError> {
        let c = self.core;
        if c.epoch.get() != epoch {
            return Err(CreateError::Stale);
        }
        match c.status.get() {
            Status::Open => {}
            Status::Finished => return Err(CreateError::Finished),
            Status::Aborted(code) => return Err(CreateError::Aborted(code)),
        }
        // Failover: a group the lost source left aborted may come again from
        // the new one; it takes the aborted group's slot.
        let again = match self.find(seq) {
            Some(i)
                if c.failover.get()
                    && matches!(self.slot(i).group.status(), group::Status::Aborted(_)) =>
            {
                Some(i)
            }
            Some(_) => return Err(CreateError::Duplicate),
            None => None,
        };
        let latest = c.latest.get();
        let is_latest = latest.is_none_or(|l| seq > l);
        // PROTOCOL.md §4.8: a late older group is kept only while within max age.
        if !is_latest && self.is_stale(seq) {
            return Err(CreateError::TooOld);
        }
        let free = again.or_else(|| self.slots.iter().position(|s| !s.held()));
        let i = match free {
            Some(i) => i,
            None => {
                // Full ring: the oldest group goes, unless the new one would be older.
                let except = if is_latest { None } else { latest };
                match self.oldest_slot(except) {
                    Some(i) if is_latest || self.seq(i) < seq => {
                        self.evict(i);
                        i
                    }
                    _ => return Err(CreateError::TooOld),
                }
            }
        };
        let slot = self.slot(i);
        slot.group.reset(seq);
        slot.begin.set(None);
        if is_latest {
            c.latest.set(Some(seq));
        }
        self.make_room(0, None);
        self.changed();
        trace!("group {} created", seq);
        let inner = slot.group.producer().ok_or(CreateError::Stale)?;
        Ok(GroupProducer {
            inner,
            track: self,
            slot,
            generation: slot.group.generation(),
            unannounced: 0,
            announce_step: 0,
        })
    }
}

impl Timeline for Ref<'_, '_> {
    fn latest(&self) -> Option<u64> {
        self.core.latest.get()
    }

    fn newest(&self) -> Instant {
        self.core.info.get().instant(self.newest_ts())
    }

    fn superseded_at(&self, seq: u64) -> Option<Instant> {
        self.find(seq)?;
        Some(self.core.info.get().instant(self.superseded_ts(seq)))
    }
}

impl fmt::Debug for Ref<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("track::Ref")
            .field("name", &self.core.info.get().name)
            .field("status", &self.core.status.get())
            .field("latest", &self.core.latest.get())
            .field("held", &self.len())
            .field("capacity", &self.slots.len())
            .field("version", &self.core.version.get())
            .finish()
    }
}

// ---------------------------------------------------------------------------
// Producer
// ---------------------------------------------------------------------------

/// The one writer of a track (from [`Ref::producer`]).
///
/// Dropping it while the track is open aborts the track with
/// [`group::ABORT_DROPPED`] (CANCEL); [`Producer::finish`] first for a clean
/// end. In failover mode ([`Ref::set_failover`]) the drop only aborts the open
/// groups and detaches the producer; the track stays open for the next one.
pub struct Producer<'t, 'p> {
    track: Ref<'t, 'p>,
    epoch: u64,
    /// Which producer of the track this is (`Core::producer_id`).
    id: u64,
}

impl<'t, 'p> Producer<'t, 'p> {
    /// The track this producer writes.
    pub fn track(&self) -> Ref<'t, 'p> {
        self.track
    }

    /// Starts group `sequence`, in any order (a relay receives groups newest first).
    ///
    /// A newer group than the latest always gets a slot (the oldest group is
    /// evicted if the ring is full). An older one gets a free slot, or the
    /// slot of an even older group. Both may evict old groups over the byte budget.
    /// In failover mode ([`Ref::set_failover`]) a held group that was aborted
    /// (e.g. cut off by the loss of the previous producer) may be created
    /// again: it takes that group's slot, whose old readers then get
    /// [`group::ReadError::Evicted`].
    ///
    /// # Errors
    /// [`CreateError::Duplicate`] if `sequence` is held (and not an aborted
    /// group in failover mode);
    /// [`CreateError::TooOld`] if it is older than every group held and the
    /// ring is full, or already past the publisher max age;
    /// [`CreateError::Finished`] / [`CreateError::Aborted`] / [`CreateError::Stale`]
    /// for the track's state. Nothing changes on error.
    pub fn create_group(&self, sequence: u64) -> Result<GroupProducer<'t, 'p>, CreateError> {
        if !self.is_current() {
            return Err(CreateError::Stale);
        }
        self.track.create(self.epoch, sequence)
    }

    /// Starts the group after the latest one (group 0 on an empty track).
    ///
    /// # Errors
    /// As [`Producer::create_group`], and [`CreateError::SequenceOverflow`]
    /// after group `u64::MAX`.
    pub fn append_group(&self) -> Result<GroupProducer<'t, 'p>, CreateError> {
        let seq = match self.track.core.latest.get() {
            None => 0,
            Some(l) => l.checked_add(1).ok_or(CreateError::SequenceOverflow)?,
        };
        self.create_group(seq)
    }

    /// Ends the track: no group will be created any more (SUBSCRIBE_END is the
    /// latest group + 1); groups still open can be completed. False if it was
    /// not open or this producer is stale.
    pub fn finish(&mut self) -> bool {
        self.is_current() && self.track.finish()
    }

    /// Abandons the track with stream error `code`, aborting its open groups;
    /// readers get [`ReadError::Aborted`]. False if already aborted or this
    /// producer is stale.
    ///
    /// In failover mode ([`Ref::set_failover`]) the track is not ended: the
    /// open groups are aborted with `code` (their readers get
    /// [`group::ReadError::Aborted`]), this producer is detached (stale from
    /// now on: its calls fail with [`CreateError::Stale`] or return false) and
    /// the track keeps its status, so [`Ref::producer`] can continue it.
    pub fn abort(&mut self, code: u64) -> bool {
        if !self.is_current() {
            return false;
        }
        if self.track.core.failover.get() {
            self.track.detach(code)
        } else {
            self.track.abort(code)
        }
    }

    /// Whether this producer still writes the track: not stale after
    /// [`Ref::reopen`] and not detached in failover mode.
    pub fn is_current(&self) -> bool {
        let c = self.track.core;
        c.epoch.get() == self.epoch && c.producer_id.get() == self.id
    }
}

impl Drop for Producer<'_, '_> {
    fn drop(&mut self) {
        if !self.is_current() {
            return;
        }
        self.track.core.has_producer.set(false);
        if self.track.status() == Status::Open {
            if self.track.core.failover.get() {
                self.track.detach(group::ABORT_DROPPED);
            } else {
                self.track.abort(group::ABORT_DROPPED);
            }
        }
    }
}

impl fmt::Debug for Producer<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("track::Producer")
            .field("track", &self.track)
            .field("epoch", &self.epoch)
            .finish()
    }
}

/// The writer of one group of a track (from [`Producer::create_group`]).
///
/// A [`group::Producer`] that also keeps the track's books: every write bumps
/// the track version and wakes its readers (payload of a streamed frame may be
/// announced in steps, see [`GroupProducer::set_announce_step`]), evicts old
/// groups over the byte budget before writing, and drops groups past the
/// publisher max age after.
/// Derefs to the [`group::Producer`] for its read-only methods and pacing.
/// Dropping it before [`GroupProducer::finish`] aborts the group with
/// [`group::ABORT_DROPPED`].
pub struct GroupProducer<'t, 'p> {
    inner: group::Producer<'t, 'p>,
    track: Ref<'t, 'p>,
    slot: &'t Slot<'p>,
    generation: u64,
    /// Bytes of the streamed frame (header and payload) written since the
    /// last version bump.
    unannounced: u64,
    /// Bump the version once this many payload bytes are unannounced (0: every write).
    announce_step: u64,
}

impl<'t, 'p> GroupProducer<'t, 'p> {
    /// The track this group belongs to.
    pub fn track(&self) -> Ref<'t, 'p> {
        self.track
    }

    fn is_current(&self) -> bool {
        self.slot.group.generation() == self.generation
    }

    /// Bytes `n` more stored bytes add to the group's held footprint (whole
    /// blocks; a group that is or will then be trimmed holds its tail only).
    fn growth(&self, n: u64) -> u64 {
        let g = &self.slot.group;
        let bs = g.pool().block_size() as u64;
        let now = g.bytes_written();
        let after = now.saturating_add(n);
        if g.is_trimmed() || after > g.retain() {
            return bs.saturating_sub(self.slot.bytes());
        }
        after.div_ceil(bs).saturating_sub(now.div_ceil(bs)) * bs
    }

    fn before_write(&self, n: u64) {
        if self.is_current() && self.track.make_room(self.growth(n), Some(self.slot)) {
            self.track.changed();
        }
    }

    /// Books a frame's start; bumps the version unless `announce` is false
    /// (and nothing expired): a streamed frame's start is then announced
    /// with its payload.
    fn after_frame(&self, timestamp: u64, first: bool, announce: bool) {
        if first {
            self.slot.begin.set(Some(timestamp));
        }
        if self.track.expire() || announce {
            self.track.changed();
        }
    }

    /// Appends one whole frame at absolute `timestamp`, all or nothing (see
    /// [`group::Producer::write_frame`]).
    ///
    /// # Errors
    /// As [`group::Producer::write_frame`]; [`group::WriteError::Evicted`] if
    /// the group itself was the oldest one evicted to make room.
    pub fn write_frame(&mut self, timestamp: u64, payload: &[u8]) -> Result<(), group::WriteError> {
        let g = &self.slot.group;
        let first = g.frames_written() == 0;
        let header = Header::new(timestamp, payload.len())
            .encoded_len(g.last_timestamp())
            .unwrap_or(0);
        self.before_write((header + payload.len()) as u64);
        self.inner.write_frame(timestamp, payload)?;
        self.after_frame(timestamp, first, true);
        Ok(())
    }

    /// Starts a frame of `len` payload bytes to fill with
    /// [`GroupProducer::write_payload`] (see [`group::Producer::begin_frame`]).
    ///
    /// # Errors
    /// As [`group::Producer::begin_frame`].
    pub fn begin_frame(&mut self, timestamp: u64, len: usize) -> Result<(), group::WriteError> {
        self.begin_frame_with(timestamp, len, |inner| inner.begin_frame(timestamp, len))
    }

    /// Like [`GroupProducer::begin_frame`], with the header taken from bytes
    /// `start..end` of a foreign block (see [`group::Producer::begin_frame_from`]).
    ///
    /// # Errors
    /// As [`group::Producer::begin_frame`].
    pub fn begin_frame_from(
        &mut self,
        timestamp: u64,
        len: usize,
        src: &Block<'p>,
        start: usize,
        end: usize,
    ) -> Result<(), group::WriteError> {
        self.begin_frame_with(timestamp, len, |inner| {
            inner.begin_frame_from(timestamp, len, src, start, end)
        })
    }

    fn begin_frame_with(
        &mut self,
        timestamp: u64,
        len: usize,
        begin: impl FnOnce(&mut group::Producer<'t, 'p>) -> Result<(), group::WriteError>,
    ) -> Result<(), group::WriteError> {
        let g = &self.slot.group;
        let first = g.frames_written() == 0;
        let header = Header::new(timestamp, len)
            .encoded_len(g.last_timestamp())
            .unwrap_or(0);
        self.before_write(header as u64);
        begin(&mut self.inner)?;
        // With an announce step, the header goes out with the payload after it.
        let defer = self.announce_step > 0 && len > 0;
        if defer {
            self.unannounced = self.unannounced.saturating_add(header as u64);
        }
        self.after_frame(timestamp, first, !defer);
        Ok(())
    }

    /// Appends payload bytes of the streamed frame; returns how many were taken
    /// (see [`group::Producer::write_payload`]).
    ///
    /// # Errors
    /// As [`group::Producer::write_payload`].
    pub fn write_payload(&mut self, data: &[u8]) -> Result<usize, group::WriteError> {
        self.before_write(data.len() as u64);
        let res = self.inner.write_payload(data);
        self.after_payload(res)
    }

    /// Announces payload just written once a step or the frame is complete.
    fn after_payload(
        &mut self,
        res: Result<usize, group::WriteError>,
    ) -> Result<usize, group::WriteError> {
        match res {
            Ok(n) => {
                self.unannounced = self.unannounced.saturating_add(n as u64);
                if self.inner.frame_remaining() == 0 || self.unannounced >= self.announce_step {
                    self.announce();
                }
                Ok(n)
            }
            Err(e) => {
                // A writer that cannot go on must not leave bytes unannounced:
                // the readers it waits for would not be woken to read them.
                self.announce();
                Err(e)
            }
        }
    }

    /// Appends payload of the streamed frame from bytes `start..end` of a
    /// foreign block, without copying them: see
    /// [`group::Producer::write_payload_from`]; the track version changes as
    /// for [`GroupProducer::write_payload`].
    ///
    /// # Errors
    /// As [`group::Producer::write_payload_from`].
    pub fn write_payload_from(
        &mut self,
        src: &Block<'p>,
        start: usize,
        end: usize,
    ) -> Result<usize, group::WriteError> {
        self.before_write(end.saturating_sub(start) as u64);
        let res = self.inner.write_payload_from(src, start, end);
        self.after_payload(res)
    }

    /// Lets a streamed frame ([`GroupProducer::begin_frame`], then
    /// [`GroupProducer::write_payload`]) bump the track version only once
    /// `bytes` of it are unannounced, or it is complete, instead of on every
    /// write (0, the default).
    ///
    /// Readers woken by version changes then run once per frame (or per
    /// `bytes`) rather than once per piece a relay receives: the bytes are
    /// readable at once all the same. Keep `bytes` below the credit the writer
    /// still has, and call [`GroupProducer::announce`] when it has less (see
    /// [`GroupProducer::unannounced`]): a writer out of credit waits for readers
    /// that only a bump wakes.
    pub fn set_announce_step(&mut self, bytes: u64) {
        self.announce_step = bytes;
    }

    /// Bytes of the streamed frame (its header and payload) written since
    /// the track version last changed for this group.
    pub fn unannounced(&self) -> u64 {
        self.unannounced
    }

    /// Bumps the track version for unannounced payload bytes, if any.
    pub fn announce(&mut self) {
        if self.unannounced > 0 {
            self.unannounced = 0;
            self.track.changed();
        }
    }

    /// Ends the group on a frame boundary (FIN).
    ///
    /// # Errors
    /// As [`group::Producer::finish`].
    pub fn finish(&mut self) -> Result<(), group::WriteError> {
        self.inner.finish()?;
        self.unannounced = 0;
        self.track.changed();
        Ok(())
    }

    /// Abandons the group with stream error `code` (RESET_STREAM); no-op unless it is open.
    pub fn abort(&mut self, code: u64) {
        if self.is_current() && self.slot.group.is_open() {
            self.inner.abort(code);
            self.unannounced = 0;
            self.track.changed();
        }
    }
}

impl<'t, 'p> Deref for GroupProducer<'t, 'p> {
    type Target = group::Producer<'t, 'p>;
    fn deref(&self) -> &Self::Target {
        &self.inner
    }
}

impl Drop for GroupProducer<'_, '_> {
    fn drop(&mut self) {
        // Abort here rather than in the inner producer's drop so readers are notified.
        self.abort(group::ABORT_DROPPED);
    }
}

impl fmt::Debug for GroupProducer<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("track::GroupProducer")
            .field("group", &self.inner)
            .finish()
    }
}

// ---------------------------------------------------------------------------
// Consumer
// ---------------------------------------------------------------------------

/// One reader of a track at its own position (from [`Ref::consumer`]).
///
/// It is given groups in increasing sequence order, each once; a group that
/// arrives after the consumer moved past its sequence is not given (a
/// session that wants late groups uses [`Ref::next_wanted`] with a window).
/// Cloning gives an independent reader at the same position.
#[derive(Clone)]
pub struct Consumer<'t, 'p> {
    track: Ref<'t, 'p>,
    epoch: u64,
    /// The next sequence wanted.
    cursor: u64,
    /// Group `u64::MAX` was given: nothing can follow.
    exhausted: bool,
}

impl<'t, 'p> Consumer<'t, 'p> {
    /// The track this consumer reads.
    pub fn track(&self) -> Ref<'t, 'p> {
        self.track
    }

    /// The next sequence number this consumer wants.
    pub fn position(&self) -> u64 {
        self.cursor
    }

    /// Moves the consumer so that the next group it is given is the first held at or after `seq`.
    pub fn seek(&mut self, seq: u64) {
        self.cursor = seq;
        self.exhausted = false;
    }

    /// The next group for this reader.
    ///
    /// * `Ready(group)`: the lowest held group at or after the position; the
    ///   position moves past it.
    /// * `Lagged(n)`: a group the reader had not been given yet was evicted;
    ///   it skips `n` sequence numbers to the latest group, which the next call returns.
    /// * `Pending`: nothing yet; wait for [`Ref::version`] to change.
    /// * `Finished`: the track is finished and nothing is left at or after the position.
    ///
    /// O(G).
    ///
    /// # Errors
    /// [`ReadError::Aborted`] once the track is aborted; [`ReadError::Stale`]
    /// if the track slot was reopened.
    pub fn next_group(&mut self) -> Result<Next<'t, 'p>, ReadError> {
        let c = self.track.core;
        if c.epoch.get() != self.epoch {
            return Err(ReadError::Stale);
        }
        if let Status::Aborted(code) = c.status.get() {
            return Err(ReadError::Aborted(code));
        }
        if !self.exhausted {
            if let (Some(evicted), Some(latest)) = (c.evicted_max.get(), c.latest.get())
                && self.cursor <= evicted
                && self.cursor < latest
            {
                let skipped = latest - self.cursor;
                debug!("consumer lagged by {} groups", skipped);
                self.cursor = latest;
                return Ok(Next::Lagged(skipped));
            }
            let mut best: Option<(usize, u64)> = None;
            for (i, s) in self.track.slots.iter().enumerate() {
                if !s.held() {
                    continue;
                }
                let seq = s.group.sequence();
                if seq >= self.cursor && best.is_none_or(|(_, b)| seq < b) {
                    best = Some((i, seq));
                }
            }
            if let Some((i, seq)) = best {
                match seq.checked_add(1) {
                    Some(next) => self.cursor = next,
                    None => self.exhausted = true,
                }
                return Ok(Next::Ready(self.track.slot(i).group.consumer()));
            }
        }
        if self.exhausted || c.status.get() == Status::Finished {
            Ok(Next::Finished)
        } else {
            Ok(Next::Pending)
        }
    }

    /// [`Consumer::next_group`] for async readers: `Pending` registers the
    /// task to be woken at the track's next change.
    ///
    /// # Errors
    /// As [`Consumer::next_group`].
    pub fn poll_next_group(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Next<'t, 'p>, ReadError>> {
        match self.next_group() {
            Ok(Next::Pending) => {
                self.track.core.wakers.register(cx.waker());
                Poll::Pending
            }
            other => Poll::Ready(other),
        }
    }
}

impl fmt::Debug for Consumer<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("track::Consumer")
            .field("cursor", &self.cursor)
            .field("epoch", &self.epoch)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    extern crate std;

    use super::*;
    use crate::pool::PoolStorage;
    use crate::window::{End, GroupRange, Request};
    use proptest::prelude::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;
    use std::vec::Vec;

    fn info(name: &str) -> Info {
        Info::new(name).unwrap()
    }

    /// Held sequences, sorted.
    fn held(t: Ref<'_, '_>) -> Vec<u64> {
        let mut v: Vec<u64> = t.sequences().collect();
        v.sort_unstable();
        v
    }

    /// The sequence of the next group, or a description of what came instead.
    fn next(c: &mut Consumer<'_, '_>) -> Result<u64, std::string::String> {
        match c.next_group() {
            Ok(Next::Ready(g)) => Ok(g.sequence()),
            other => Err(std::format!("{other:?}")),
        }
    }

    /// Writes one frame per group for `seqs` (timestamp = 10 × seq) and finishes them.
    fn fill(p: &Producer<'_, '_>, seqs: impl IntoIterator<Item = u64>) {
        for seq in seqs {
            let mut g = p.create_group(seq).unwrap();
            g.write_frame(seq * 10, b"frame").unwrap();
            g.finish().unwrap();
        }
    }

    struct Counter(AtomicUsize);

    impl Wake for Counter {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn counter() -> (Arc<Counter>, Waker) {
        let c = Arc::new(Counter(AtomicUsize::new(0)));
        (c.clone(), Waker::from(c))
    }

    fn woken(c: &Arc<Counter>) -> usize {
        c.0.load(Ordering::SeqCst)
    }

    // --- info -----------------------------------------------------------------------

    #[test]
    fn info_defaults_and_wire_values() {
        let i = info("video");
        assert_eq!(i.name, "video");
        assert_eq!(i.name.as_str(), "video");
        assert_eq!(
            (i.priority, i.max_age, i.timescale.get()),
            (127, Duration::from_millis(5000), 1000)
        );
        let wire = TrackInfo {
            priority: 3,
            max_age: Duration::from_millis(250),
            timescale: NonZeroU64::new(90_000).unwrap(),
        };
        let j = Info::from_wire("audio", wire).unwrap();
        assert_eq!(j.to_wire(), wire);
        assert_eq!(j.name, "audio");
        let long = [b'x'; MAX_NAME_LEN + 1];
        let long = core::str::from_utf8(&long).unwrap();
        assert_eq!(Info::new(long), Err(NameTooLong));
        assert!(Info::new(&long[1..]).is_ok());
        // 90 kHz: 90_000 units are one second.
        assert_eq!(j.instant(90_000), Instant::from_micros(1_000_000));
        assert_eq!(info("x").instant(u64::MAX), Instant::from_micros(u64::MAX));
        assert_eq!(std::format!("{}", i.name), "video");
        assert_ne!(Name::new("a").unwrap(), Name::new("a ").unwrap());
    }

    // --- creating groups ------------------------------------------------------------

    #[test]
    fn append_creates_consecutive_groups() {
        let mut storage = PoolStorage::<16, 32>::new();
        let pool = Pool::new(&mut storage);
        let track = State::<4>::new(&pool, info("v"));
        let p = track.producer().unwrap();
        for expect in 0..3 {
            let g = p.append_group().unwrap();
            assert_eq!(g.sequence(), expect);
        }
        assert_eq!(held(track.handle()), [0, 1, 2]);
        assert_eq!(track.handle().latest(), Some(2));
        assert_eq!(track.handle().oldest(), Some(0));
        // Every group was dropped unfinished, so it was aborted.
        assert_eq!(
            track.handle().group(1).unwrap().chunk().unwrap_err(),
            group::ReadError::Aborted(group::ABORT_DROPPED)
        );
    }

    #[test]
    fn out_of_order_groups_newest_first() {
        let mut storage = PoolStorage::<16, 32>::new();
        let pool = Pool::new(&mut storage);
        let track = State::<3>::new(&pool, info("v"));
        let t = track.handle();
        let p = track.producer().unwrap();
        fill(&p, [10, 8, 9]);
        assert_eq!(held(t), [8, 9, 10]);
        assert_eq!(t.latest(), Some(10));
        assert_eq!(p.create_group(9).unwrap_err(), CreateError::Duplicate);
        // Full ring: an older group than everything kept is skipped, typed.
        assert_eq!(p.create_group(7).unwrap_err(), CreateError::TooOld);
        assert_eq!(held(t), [8, 9, 10], "unchanged on error");
        // A newer one evicts the oldest.
        fill(&p, [12]);
        assert_eq!(held(t), [9, 10, 12]);
        // A late group between kept ones replaces the oldest kept.
        fill(&p, [11]);
        assert_eq!(held(t), [10, 11, 12]);
        assert_eq!(t.latest(), Some(12));
        assert_eq!(t.evicted_count(), 2);
        // The latest group is never evicted, even with a ring of one.
        let mut storage = PoolStorage::<4, 32>::new();
        let pool = Pool::new(&mut storage);
        let one = State::<1>::new(&pool, info("v"));
        let p = one.producer().unwrap();
        fill(&p, [5]);
        assert_eq!(p.create_group(4).unwrap_err(), CreateError::TooOld);
        fill(&p, [6]);
        assert_eq!(held(one.handle()), [6]);
        assert_eq!(pool.in_use(), 1);
    }

    #[test]
    fn one_producer_and_end_states() {
        let mut storage = PoolStorage::<8, 32>::new();
        let pool = Pool::new(&mut storage);
        let track = State::<2>::new(&pool, info("v"));
        let t = track.handle();
        let mut p = track.producer().unwrap();
        assert_eq!(t.producer().unwrap_err(), ProducerTaken);
        let mut open = p.append_group().unwrap();
        assert!(p.finish());
        assert!(!p.finish());
        assert_eq!(t.status(), Status::Finished);
        assert_eq!(p.append_group().unwrap_err(), CreateError::Finished);
        // An open group can still be completed after the track finished.
        open.write_frame(0, b"late").unwrap();
        open.finish().unwrap();
        drop(p);
        assert_eq!(
            t.status(),
            Status::Finished,
            "dropping after finish keeps it finished"
        );
        let p = t.producer().unwrap();
        assert_eq!(p.append_group().unwrap_err(), CreateError::Finished);
        drop(p);

        let other = State::<2>::new(&pool, info("w"));
        let p = other.producer().unwrap();
        let mut g = p.append_group().unwrap();
        g.write_frame(0, b"x").unwrap();
        drop(p);
        assert_eq!(
            other.handle().status(),
            Status::Aborted(group::ABORT_DROPPED),
            "dropping an open track's producer aborts it"
        );
        assert_eq!(
            g.write_frame(1, b"y"),
            Err(group::WriteError::Aborted(group::ABORT_DROPPED))
        );
        assert_eq!(
            other.consumer(Start::Group(0)).next_group().unwrap_err(),
            ReadError::Aborted(group::ABORT_DROPPED)
        );
    }

    // --- consumers ------------------------------------------------------------------

    #[test]
    fn consumer_reads_in_order_then_pending_then_finished() {
        let mut storage = PoolStorage::<16, 32>::new();
        let pool = Pool::new(&mut storage);
        let track = State::<4>::new(&pool, info("v"));
        let mut p = track.producer().unwrap();
        let mut from_start = track.consumer(Start::Group(0));
        let mut live = track.consumer(Start::Latest);
        assert!(matches!(from_start.next_group(), Ok(Next::Pending)));
        fill(&p, [0, 1]);
        let mut late_live = track.consumer(Start::Latest);
        assert_eq!(next(&mut from_start), Ok(0));
        assert_eq!(next(&mut from_start), Ok(1));
        assert_eq!(
            next(&mut live),
            Ok(0),
            "no group at start: the first to come"
        );
        assert_eq!(
            next(&mut late_live),
            Ok(1),
            "latest start: the latest group"
        );
        assert!(matches!(late_live.next_group(), Ok(Next::Pending)));
        // A late older group is not given to readers past it.
        fill(&p, [3]);
        assert_eq!(next(&mut late_live), Ok(3));
        fill(&p, [2]);
        assert!(matches!(late_live.next_group(), Ok(Next::Pending)));
        p.finish();
        assert!(matches!(late_live.next_group(), Ok(Next::Finished)));
        assert_eq!(next(&mut from_start), Ok(2));
        assert_eq!(next(&mut from_start), Ok(3));
        assert!(matches!(from_start.next_group(), Ok(Next::Finished)));
        // Each reader reads the group from its first byte.
        let mut g = track
            .consumer(Start::Group(2))
            .next_group()
            .unwrap()
            .ready()
            .unwrap();
        let mut buf = [0u8; 16];
        assert_eq!(
            g.read_frame_header().unwrap().ready().unwrap().timestamp,
            20
        );
        assert_eq!(g.read_payload(&mut buf), Ok(group::Next::Ready(5)));
    }

    #[test]
    fn lagging_consumer_jumps_to_the_latest() {
        let mut storage = PoolStorage::<16, 32>::new();
        let pool = Pool::new(&mut storage);
        let track = State::<2>::new(&pool, info("v"));
        let p = track.producer().unwrap();
        let mut slow = track.consumer(Start::Group(0));
        let mut fast = track.consumer(Start::Group(0));
        fill(&p, [0]);
        assert_eq!(next(&mut slow), Ok(0));
        assert_eq!(next(&mut fast), Ok(0));
        for seq in 1..6 {
            fill(&p, [seq]);
            assert_eq!(
                next(&mut fast),
                Ok(seq),
                "a reader that keeps up never lags"
            );
        }
        assert_eq!(held(track.handle()), [4, 5]);
        // slow wants 1, which is gone: it skips 1..=4 and lands on 5.
        assert!(matches!(slow.next_group(), Ok(Next::Lagged(4))));
        assert_eq!(slow.position(), 5);
        assert_eq!(next(&mut slow), Ok(5));
        assert!(matches!(slow.next_group(), Ok(Next::Pending)));
        // Seeking back into the evicted range lags again.
        slow.seek(2);
        assert!(matches!(slow.next_group(), Ok(Next::Lagged(3))));
    }

    #[test]
    fn reading_an_evicted_group_fails_and_the_next_one_follows() {
        let mut storage = PoolStorage::<16, 8>::new();
        let pool = Pool::new(&mut storage);
        let track = State::<2>::new(&pool, info("v"));
        let p = track.producer().unwrap();
        let mut c = track.consumer(Start::Group(0));
        fill(&p, [0]);
        let mut g0 = c.next_group().unwrap().ready().unwrap();
        let first = g0.chunk().unwrap().ready().unwrap().len();
        g0.advance(first);
        fill(&p, [1, 2]);
        assert_eq!(g0.chunk().unwrap_err(), group::ReadError::Evicted);
        assert_eq!(next(&mut c), Ok(1), "no lag: group 0 had been given");
    }

    // --- byte budget ----------------------------------------------------------------

    #[test]
    fn byte_budget_evicts_the_oldest_non_latest() {
        let mut storage = PoolStorage::<32, 16>::new();
        let pool = Pool::new(&mut storage);
        let limits = Limits {
            group_bytes: 1024,
            cache_bytes: 64, // 4 blocks
        };
        let track = State::<8>::with_limits(&pool, info("v"), limits);
        let t = track.handle();
        let p = track.producer().unwrap();
        // Each group: header (2 bytes) + 20 bytes = 22 bytes = 2 blocks.
        for seq in 0..2 {
            let mut g = p.create_group(seq).unwrap();
            g.write_frame(seq, &[seq as u8; 20]).unwrap();
            g.finish().unwrap();
        }
        assert_eq!((t.held_bytes(), pool.in_use()), (64, 4));
        let mut g = p.create_group(2).unwrap();
        assert_eq!(held(t), [0, 1, 2], "an empty group costs nothing");
        g.write_frame(2, &[2; 20]).unwrap();
        assert_eq!(held(t), [1, 2]);
        assert_eq!((t.held_bytes(), pool.in_use()), (64, 4));
        // A latest group growing past the budget is trimmed, not kept whole:
        // it then holds only its tail block, and nothing else had to go for it.
        g.write_frame(3, &[3; 36]).unwrap(); // 22 + 38 bytes: 4 blocks, at the budget
        assert_eq!(held(t), [2]);
        assert_eq!((t.held_bytes(), pool.in_use()), (64, 4));
        g.write_frame(4, &[4; 14]).unwrap(); // 76 bytes > 64: trimmed
        assert!(g.state().is_trimmed());
        assert_eq!((t.held_bytes(), pool.in_use()), (16, 1));
        assert_eq!(
            t.group(2).unwrap().chunk().unwrap_err(),
            group::ReadError::Trimmed
        );
        g.finish().unwrap();
        assert_eq!((t.held_bytes(), pool.in_use()), (0, 0));
        // A late older group is a candidate for eviction too, even while empty.
        t.set_budget(48);
        fill(&p, [3]);
        let mut late = p.create_group(1).unwrap();
        late.write_frame(1, &[1; 10]).unwrap(); // 1 block: 32 bytes held
        assert_eq!(held(t), [1, 2, 3]);
        assert_eq!(
            late.write_frame(1, &[1; 30]), // 2 more blocks: it is the oldest
            Err(group::WriteError::Evicted)
        );
        assert_eq!(held(t), [2, 3]);
        // Raising the budget stops evictions.
        t.set_budget(u64::MAX);
        fill(&p, [4, 5]);
        assert_eq!(held(t), [2, 3, 4, 5]);
    }

    #[test]
    fn group_over_the_budget_is_trimmed_and_held_bytes_stay_bounded() {
        // A 16 MiB group in a 256 KiB budget, through a 512 KiB pool of 16 KiB
        // blocks, read by one track consumer under a 256 KiB pacing window.
        let bs: usize = if cfg!(miri) { 64 } else { 16 << 10 };
        const BLOCKS: usize = 32;
        let budget = 16 * bs as u64;
        let window = budget;
        let total = if cfg!(miri) { 64 * bs } else { 1024 * bs } as u64;
        let frame = bs / 2 + 1;
        let mut bytes = std::vec![0u8; BLOCKS * bs];
        let mut meta: Vec<crate::pool::BlockMeta> =
            (0..BLOCKS).map(|_| crate::pool::BlockMeta::new()).collect();
        let pool = Pool::from_parts(&mut bytes, &mut meta).unwrap();
        let limits = Limits {
            group_bytes: u64::MAX,
            cache_bytes: budget,
        };
        let track = State::<4>::with_limits(&pool, info("v"), limits);
        let t = track.handle();
        let p = track.producer().unwrap();
        let mut c = track.consumer(Start::Group(0));
        let mut g = p.create_group(0).unwrap();
        let mut r = c.next_group().unwrap().ready().unwrap();
        let payload = std::vec![0x5a; frame];
        let (mut read, mut max_held, mut ts) = (0u64, 0u64, 0u64);
        let mut buf = std::vec![0u8; bs + 7];
        loop {
            while g.state().bytes_written() < total && g.allowance(window) >= frame as u64 + 4 {
                g.write_frame(ts, &payload).unwrap();
                ts += 1;
                max_held = max_held.max(t.held_bytes());
            }
            if g.state().bytes_written() >= total && g.state().is_open() {
                g.finish().unwrap();
            }
            match r.read(&mut buf).unwrap() {
                group::Next::Ready(n) => read += n as u64,
                group::Next::Finished => break,
                group::Next::Pending => panic!("stalled at {read}"),
            }
        }
        assert_eq!(read, g.state().bytes_written());
        assert!(g.state().is_trimmed());
        assert!(max_held <= budget, "held {max_held}");
        assert!(pool.high_water() <= window as usize / bs + 2);
        assert_eq!(
            t.held_bytes(),
            0,
            "finished and trimmed: only the reader's block"
        );
        assert_eq!(pool.in_use(), 1);
        // A reader that comes now cannot start at byte 0.
        assert_eq!(
            t.group(0).unwrap().chunk().unwrap_err(),
            group::ReadError::Trimmed
        );
        // Later groups within the budget are held whole again.
        fill(&p, [1, 2]);
        assert_eq!(held(t), [0, 1, 2]);
        assert_eq!(
            t.group(1)
                .unwrap()
                .chunk()
                .unwrap()
                .ready()
                .map(<[u8]>::len),
            Some(7)
        );
        drop(r);
        assert_eq!(pool.in_use(), 2);
    }

    // --- max age ----------------------------------------------------------------------

    #[test]
    fn groups_expire_by_presentation_time() {
        let mut storage = PoolStorage::<32, 32>::new();
        let pool = Pool::new(&mut storage);
        // Timescale 1000: timestamps in ms; max age 100 ms.
        let track = State::<8>::new(&pool, info("v").with_max_age(Duration::from_millis(100)));
        let t = track.handle();
        let p = track.producer().unwrap();
        let frame = |seq: u64, ts: &[u64]| {
            let mut g = p.create_group(seq).unwrap();
            for &x in ts {
                g.write_frame(x, b"f").unwrap();
            }
            g.finish().unwrap();
        };
        frame(0, &[0, 20]);
        frame(1, &[50, 90]);
        frame(2, &[140]);
        // Group 0 is superseded at 50 (group 1 begins), newest is 140: 90 ms old.
        assert_eq!(held(t), [0, 1, 2]);
        assert_eq!(t.superseded_at(0), Some(Instant::from_millis(50)));
        assert_eq!(t.superseded_at(1), Some(Instant::from_millis(140)));
        assert_eq!(Timeline::newest(&t), Instant::from_millis(140));
        assert_eq!(t.superseded_at(7), None);
        let mut g = p.create_group(3).unwrap();
        g.write_frame(151, b"f").unwrap();
        // 151 - 50 = 101 ms > 100 ms: group 0 goes; group 1 (140) stays.
        assert_eq!(held(t), [1, 2, 3]);
        g.write_frame(400, b"f").unwrap();
        assert_eq!(held(t), [3], "the latest group is never stale");
        // A late group already past max age is refused, typed.
        assert_eq!(p.create_group(2).unwrap_err(), CreateError::TooOld);
        assert_eq!(t.evicted_count(), 3);
    }

    #[test]
    fn timeline_with_an_empty_latest_group() {
        let mut storage = PoolStorage::<8, 32>::new();
        let pool = Pool::new(&mut storage);
        let track = State::<4>::new(&pool, info("v"));
        let t = track.handle();
        assert_eq!(t.latest(), None);
        assert_eq!(Timeline::newest(&t), Instant::ZERO);
        let p = track.producer().unwrap();
        fill(&p, [0]);
        let _g1 = p.create_group(1).unwrap();
        // Group 1 has no frame yet: the newest frame is group 0's.
        assert_eq!(Timeline::newest(&t), Instant::from_millis(0));
        assert_eq!(t.superseded_at(0), Some(Instant::from_millis(0)));
    }

    // --- window-driven reading ----------------------------------------------------------

    #[test]
    fn next_wanted_is_newest_first_within_the_window() {
        let mut storage = PoolStorage::<32, 32>::new();
        let pool = Pool::new(&mut storage);
        let track = State::<8>::new(&pool, info("v"));
        let t = track.handle();
        let p = track.producer().unwrap();
        fill(&p, [0, 1, 2, 3]);
        let req = Request {
            start: Start::Group(1),
            end: End::Group(2),
            max_latency: Duration::from_secs(10),
            ..Request::LIVE
        };
        let mut w = Window::<4>::resolve(req, &t).unwrap();
        let mut order = Vec::new();
        while let Some(g) = t.next_wanted(&w) {
            order.push(g.sequence());
            w.remove(GroupRange::single(g.sequence())).unwrap();
        }
        assert_eq!(order, [2, 1]);
        // Max latency 0: only the live edge is deliverable.
        let w = Window::<4>::resolve(
            Request {
                start: Start::Group(0),
                ..Request::LIVE
            },
            &t,
        )
        .unwrap();
        assert_eq!(t.next_wanted(&w).map(|g| g.sequence()), Some(3));
        let mut w = w;
        w.remove(GroupRange::single(3)).unwrap();
        assert!(
            t.next_wanted(&w).is_none(),
            "the rest is expired for max latency 0"
        );
        assert_eq!(t.latest_group().map(|g| g.sequence()), Some(3));
        assert!(t.group(9).is_none());
    }

    // --- notification -----------------------------------------------------------------

    #[test]
    fn version_bumps_and_wakers_fire() {
        let mut storage = PoolStorage::<8, 32>::new();
        let pool = Pool::new(&mut storage);
        let track = State::<4>::new(&pool, info("v"));
        let t = track.handle();
        let p = track.producer().unwrap();
        let (count, waker) = counter();
        let mut cx = Context::from_waker(&waker);
        let v0 = t.version();
        assert_eq!(t.poll_changed(&mut cx, v0), Poll::Pending);
        assert_eq!(
            t.poll_changed(&mut cx, v0),
            Poll::Pending,
            "same task: one place"
        );
        let mut g = p.append_group().unwrap();
        assert_eq!(woken(&count), 1);
        let v1 = t.version();
        assert!(v1 > v0);
        assert_eq!(t.poll_changed(&mut cx, v0), Poll::Ready(v1));
        for step in 0..3 {
            let before = t.version();
            match step {
                0 => g.write_frame(0, b"x").unwrap(),
                1 => {
                    g.begin_frame(1, 2).unwrap();
                    g.write_payload(b"ab").unwrap();
                }
                _ => g.finish().unwrap(),
            }
            assert!(t.version() > before, "step {step}");
        }
        // A consumer waiting for a group registers itself.
        let mut c = track.consumer(Start::Group(1));
        assert!(c.poll_next_group(&mut cx).is_pending());
        let woke = woken(&count);
        fill(&p, [1]);
        assert_eq!(woken(&count), woke + 1);
        assert!(matches!(
            c.poll_next_group(&mut cx),
            Poll::Ready(Ok(Next::Ready(_)))
        ));
    }

    #[test]
    fn announce_step_wakes_once_per_step_or_frame() {
        // 4 blocks of 32 bytes: room for one streamed frame of 100 bytes.
        let mut storage = PoolStorage::<4, 32>::new();
        let pool = Pool::new(&mut storage);
        let track = State::<4>::new(&pool, info("a"));
        let t = track.handle();
        let p = track.producer().unwrap();
        let mut g = p.append_group().unwrap();
        g.set_announce_step(40);
        let (count, waker) = counter();
        let mut cx = Context::from_waker(&waker);
        let v = t.version();
        assert_eq!(t.poll_changed(&mut cx, v), Poll::Pending);
        // The frame's start (3 header bytes) and pieces under the step:
        // stored and readable, nobody woken.
        g.begin_frame(0, 100).unwrap();
        assert_eq!(g.write_payload(&[1; 25]).unwrap(), 25);
        assert_eq!((t.version(), woken(&count), g.unannounced()), (v, 0, 28));
        let mut c = track.consumer(Start::Group(0));
        assert!(matches!(
            c.poll_next_group(&mut cx),
            Poll::Ready(Ok(Next::Ready(_)))
        ));
        // The step reached: one wake-up for both pieces.
        assert_eq!(g.write_payload(&[2; 25]).unwrap(), 25);
        assert_eq!((woken(&count), g.unannounced()), (1, 0));
        let v = t.version();
        // `announce` wakes for what is pending, and only then.
        assert_eq!(g.write_payload(&[3; 10]).unwrap(), 10);
        assert_eq!(t.version(), v);
        g.announce();
        assert!(t.version() != v && g.unannounced() == 0);
        let v = t.version();
        g.announce();
        assert_eq!(t.version(), v, "nothing pending: no bump");
        // A writer the pool turns away announces what it stored first.
        let mut held = Vec::new();
        while let Ok(b) = pool.alloc() {
            held.push(b);
        }
        let mut stored = 0;
        let err = loop {
            match g.write_payload(&[4; 1]) {
                Ok(n) => stored += n,
                Err(e) => break e,
            }
        };
        assert_eq!(err, group::WriteError::PoolExhausted);
        assert!(stored < 40);
        assert!(t.version() != v && g.unannounced() == 0);
        // The frame's end always wakes.
        drop(held);
        let v = t.version();
        let rest = g.frame_remaining();
        assert_eq!(g.write_payload(&[5; 100][..rest]).unwrap(), rest);
        assert!(t.version() != v && g.unannounced() == 0);
    }

    #[test]
    fn waker_overflow_wakes_everyone() {
        let wakers = Wakers::<2>::new();
        let tasks: Vec<_> = (0..3).map(|_| counter()).collect();
        wakers.register(&tasks[0].1);
        wakers.register(&tasks[1].1);
        assert_eq!(wakers.len(), 2);
        wakers.register(&tasks[2].1);
        assert_eq!(woken(&tasks[0].0) + woken(&tasks[1].0), 2);
        assert_eq!(wakers.len(), 1);
        wakers.wake();
        assert_eq!(woken(&tasks[2].0), 1);
        assert!(wakers.is_empty());
        // No place at all: woken at once.
        let none = Wakers::<0>::new();
        none.register(&tasks[0].1);
        assert_eq!(woken(&tasks[0].0), 2);
    }

    // --- reuse ------------------------------------------------------------------------

    #[test]
    fn reopen_makes_every_handle_stale() {
        let mut storage = PoolStorage::<8, 32>::new();
        let pool = Pool::new(&mut storage);
        let track = State::<4>::new(&pool, info("old"));
        let t = track.handle();
        let p = track.producer().unwrap();
        fill(&p, [0, 1]);
        let mut g = p.append_group().unwrap();
        let mut c = track.consumer(Start::Group(0));
        let mut reader = t.group(0).unwrap();
        let old = t;
        let t = t.reopen(info("new"));
        assert!(!old.is_current() && t.is_current());
        assert_ne!(old.key(), t.key());
        assert!(!old.same_track(&t));
        assert!(old.producer().is_err(), "a stale handle makes no producer");
        assert_eq!(
            old.consumer(Start::Latest).next_group().unwrap_err(),
            ReadError::Stale
        );
        assert_eq!(pool.in_use(), 1, "the reader anchors group 0's first block");
        assert!(t.has_name("new") && !t.has_name("old"));
        assert_eq!((t.latest(), t.len(), t.status()), (None, 0, Status::Open));
        assert_eq!(p.append_group().unwrap_err(), CreateError::Stale);
        assert_eq!(c.next_group().unwrap_err(), ReadError::Stale);
        assert_eq!(reader.chunk().unwrap_err(), group::ReadError::Evicted);
        assert_eq!(pool.in_use(), 0, "a stale reader lets go at its next read");
        assert_eq!(g.write_frame(0, b"x"), Err(group::WriteError::Evicted));
        // A new producer may start at once; the stale one's drop changes nothing.
        let q = t.producer().unwrap();
        drop(p);
        drop(g);
        assert_eq!(t.status(), Status::Open);
        fill(&q, [7]);
        assert_eq!(held(t), [7]);
    }

    #[test]
    fn dropped_group_producer_aborts_and_notifies() {
        let mut storage = PoolStorage::<8, 32>::new();
        let pool = Pool::new(&mut storage);
        let track = State::<4>::new(&pool, info("v"));
        let t = track.handle();
        let p = track.producer().unwrap();
        let mut g = p.append_group().unwrap();
        g.write_frame(0, b"x").unwrap();
        let v = t.version();
        drop(g);
        assert!(t.version() > v);
        assert_eq!(
            t.group(0).unwrap().chunk().unwrap_err(),
            group::ReadError::Aborted(group::ABORT_DROPPED)
        );
        assert_eq!(pool.in_use(), 0);
    }

    #[test]
    fn abort_reaches_groups_and_readers() {
        let mut storage = PoolStorage::<8, 32>::new();
        let pool = Pool::new(&mut storage);
        let track = State::<4>::new(&pool, info("v"));
        let t = track.handle();
        let mut p = track.producer().unwrap();
        fill(&p, [0]);
        let mut open = p.append_group().unwrap();
        open.write_frame(1, b"x").unwrap();
        assert!(p.abort(0x36));
        assert!(!p.abort(0x1));
        assert_eq!(
            open.write_frame(2, b"y"),
            Err(group::WriteError::Aborted(0x36))
        );
        assert_eq!(
            t.group(0).unwrap().chunk().unwrap().ready(),
            Some(&[0x00, 0x05, b'f', b'r', b'a', b'm', b'e'][..])
        );
        assert_eq!(
            track.consumer(Start::Group(0)).next_group().unwrap_err(),
            ReadError::Aborted(0x36)
        );
        assert_eq!(p.append_group().unwrap_err(), CreateError::Aborted(0x36));
    }

    // --- failover -------------------------------------------------------------------------

    #[test]
    fn failover_abort_detaches_and_a_new_producer_continues() {
        let mut storage = PoolStorage::<16, 32>::new();
        let pool = Pool::new(&mut storage);
        let track = State::<4>::new(&pool, info("v"));
        let t = track.handle();
        assert!(!t.failover());
        t.set_failover(true);
        assert!(t.failover());
        let mut p = track.producer().unwrap();
        assert!(t.has_producer());
        let mut c = track.consumer(Start::Group(0));
        fill(&p, [0]);
        let mut open = p.create_group(1).unwrap();
        open.write_frame(10, b"cut").unwrap();
        let mut cut = t.group(1).unwrap();
        assert_eq!(next(&mut c), Ok(0));
        let v = t.version();
        assert!(p.abort(0x36));
        // The track is not ended; the open group is, with the code.
        assert_eq!(t.status(), Status::Open);
        assert!(t.version() > v);
        assert!(!t.has_producer());
        assert_eq!(cut.chunk().unwrap_err(), group::ReadError::Aborted(0x36));
        assert_eq!(
            open.write_frame(11, b"x"),
            Err(group::WriteError::Aborted(0x36))
        );
        assert_eq!(
            t.group(0)
                .unwrap()
                .chunk()
                .unwrap()
                .ready()
                .map(<[u8]>::len),
            Some(7)
        );
        // The detached producer is stale; its drop changes nothing.
        assert!(!p.is_current());
        assert_eq!(p.append_group().unwrap_err(), CreateError::Stale);
        assert!(!p.finish());
        assert!(!p.abort(0x1));
        drop(p);
        assert_eq!(t.status(), Status::Open);
        // Readers see no end across the hand-over.
        assert_eq!(next(&mut c), Ok(1), "the aborted group is still given");
        let (count, waker) = counter();
        let mut cx = Context::from_waker(&waker);
        assert!(c.poll_next_group(&mut cx).is_pending());
        // A new producer continues: the cut group may come again, then new ones.
        let q = t.producer().unwrap();
        assert_eq!(q.create_group(0).unwrap_err(), CreateError::Duplicate);
        let mut again = q.create_group(1).unwrap();
        assert_eq!(
            cut.chunk().unwrap_err(),
            group::ReadError::Evicted,
            "the cut group's slot was reused"
        );
        again.write_frame(10, b"whole").unwrap();
        again.finish().unwrap();
        assert_eq!(
            t.group(1).unwrap().chunk().unwrap().ready(),
            Some(&[0x14, 0x05, b'w', b'h', b'o', b'l', b'e'][..])
        );
        assert!(woken(&count) > 0);
        fill(&q, [2]);
        assert_eq!(next(&mut c), Ok(2));
        assert!(matches!(c.next_group(), Ok(Next::Pending)));
        assert_eq!(held(t), [0, 1, 2]);
    }

    #[test]
    fn failover_drop_detaches_and_clearing_the_flag_restores_abort() {
        let mut storage = PoolStorage::<16, 32>::new();
        let pool = Pool::new(&mut storage);
        let track = State::<4>::new(&pool, info("v"));
        let t = track.handle();
        t.set_failover(true);
        let mut c = track.consumer(Start::Group(0));
        let p = track.producer().unwrap();
        fill(&p, [0]);
        let mut open = p.append_group().unwrap();
        open.write_frame(1, b"x").unwrap();
        drop(p);
        assert_eq!(t.status(), Status::Open);
        assert_eq!(
            open.write_frame(2, b"y"),
            Err(group::WriteError::Aborted(group::ABORT_DROPPED))
        );
        drop(open);
        assert_eq!(next(&mut c), Ok(0));
        assert_eq!(next(&mut c), Ok(1));
        // A second loss, then the flag is cleared: the next abort ends the track.
        let p = t.producer().unwrap();
        fill(&p, [2]);
        drop(p);
        assert_eq!(t.status(), Status::Open);
        assert_eq!(next(&mut c), Ok(2));
        t.set_failover(false);
        let mut p = t.producer().unwrap();
        assert!(p.abort(0x5));
        assert_eq!(t.status(), Status::Aborted(0x5));
        assert_eq!(c.next_group().unwrap_err(), ReadError::Aborted(0x5));
        drop(p);
        assert!(t.producer().is_ok());
        assert_eq!(t.status(), Status::Aborted(0x5));
    }

    #[test]
    fn failover_keeps_finish_and_reopen_clears_it() {
        let mut storage = PoolStorage::<16, 32>::new();
        let pool = Pool::new(&mut storage);
        let track = State::<4>::new(&pool, info("v"));
        let t = track.handle();
        t.set_failover(true);
        let mut p = track.producer().unwrap();
        let mut open = p.append_group().unwrap();
        assert!(p.finish());
        assert_eq!(t.status(), Status::Finished);
        // Finished: the drop leaves the open group to its writer, as without failover.
        drop(p);
        open.write_frame(0, b"late").unwrap();
        // An abort through a later producer only cuts open groups; the track stays finished.
        let mut q = t.producer().unwrap();
        assert!(q.abort(0x7));
        assert_eq!(t.status(), Status::Finished);
        assert_eq!(
            open.write_frame(1, b"x"),
            Err(group::WriteError::Aborted(0x7))
        );
        drop(q);
        let t = t.reopen(info("w"));
        assert!(!t.failover());
        let p = t.producer().unwrap();
        drop(p);
        assert_eq!(t.status(), Status::Aborted(group::ABORT_DROPPED));
    }

    // --- property: random interleavings ----------------------------------------------------

    #[derive(Debug, Clone)]
    enum Op {
        Create(u64),
        Append,
        Write(usize, usize),
        Finish(usize),
        Drop(usize),
        Read(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (0u64..24).prop_map(Op::Create),
            2 => Just(Op::Append),
            5 => (any::<usize>(), 0usize..40).prop_map(|(i, n)| Op::Write(i, n)),
            1 => any::<usize>().prop_map(Op::Finish),
            1 => any::<usize>().prop_map(Op::Drop),
            4 => any::<usize>().prop_map(Op::Read),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: if cfg!(miri) { 4 } else { 128 },
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        #[test]
        fn random_interleavings(
            ops in proptest::collection::vec(op(), 0..if cfg!(miri) { 30 } else { 120 }),
            budget in prop_oneof![Just(u64::MAX), 48u64..400],
            max_age_ms in prop_oneof![Just(5000u64), 0u64..60],
        ) {
            const G: usize = 4;
            let mut storage = PoolStorage::<48, 16>::new();
            let pool = Pool::new(&mut storage);
            {
                let limits = Limits { group_bytes: 200, cache_bytes: budget };
                let track = State::<G>::with_limits(
                    &pool,
                    info("v").with_max_age(Duration::from_millis(max_age_ms)),
                    limits,
                );
                let t = track.handle();
                let p = track.producer().unwrap();
                let mut writers: Vec<GroupProducer<'_, '_>> = Vec::new();
                let mut readers: Vec<Consumer<'_, '_>> =
                    (0..3).map(|i| t.consumer(Start::Group(i * 4))).collect();
                let mut last_given: Vec<Option<u64>> = std::vec![None; readers.len()];
                let mut max_created: Option<u64> = None;
                for op in ops {
                    let before: Vec<u64> = t.sequences().collect();
                    match op {
                        Op::Create(_) | Op::Append => {
                            let r = match op {
                                Op::Create(seq) => p.create_group(seq).map(|g| (seq, g)),
                                _ => p.append_group().map(|g| (g.sequence(), g)),
                            };
                            match r {
                                Ok((seq, g)) => {
                                    prop_assert!(!before.contains(&seq));
                                    if max_created.is_none_or(|m| seq > m) {
                                        max_created = Some(seq);
                                    }
                                    writers.push(g);
                                }
                                Err(CreateError::Duplicate) => {
                                    let Op::Create(seq) = op else { unreachable!() };
                                    prop_assert!(before.contains(&seq));
                                }
                                Err(CreateError::TooOld) => {
                                    prop_assert!(t.latest().is_some());
                                }
                                Err(e) => prop_assert!(false, "unexpected {:?}", e),
                            }
                        }
                        Op::Write(i, n) if !writers.is_empty() => {
                            let k = i % writers.len();
                            let w = &mut writers[k];
                            let ts = w.sequence() * 10 + w.state().frames_written();
                            let _ = w.write_frame(ts, &[7u8; 40][..n]);
                        }
                        Op::Finish(i) if !writers.is_empty() => {
                            let k = i % writers.len();
                            let _ = writers[k].finish();
                        }
                        Op::Drop(i) if !writers.is_empty() => {
                            let k = i % writers.len();
                            drop(writers.swap_remove(k));
                        }
                        Op::Read(i) => {
                            let k = i % readers.len();
                            match readers[k].next_group().unwrap() {
                                Next::Ready(g) => {
                                    prop_assert!(last_given[k].is_none_or(|l| g.sequence() > l));
                                    last_given[k] = Some(g.sequence());
                                }
                                Next::Lagged(n) => {
                                    prop_assert!(n > 0);
                                    prop_assert_eq!(Some(readers[k].position()), t.latest());
                                }
                                Next::Pending => {}
                                Next::Finished => prop_assert!(false, "never finished"),
                            }
                        }
                        _ => {}
                    }
                    // Invariants after every step.
                    prop_assert_eq!(t.latest(), max_created);
                    let mut held: Vec<u64> = t.sequences().collect();
                    held.sort_unstable();
                    prop_assert!(held.len() <= G);
                    if let Some(l) = t.latest() {
                        prop_assert_eq!(held.last(), Some(&l), "the latest group is kept");
                    }
                    let over_budget_evictable = held
                        .iter()
                        .filter(|&&s| Some(s) != t.latest())
                        .any(|&s| t.find(s).is_some_and(|i| t.slot(i).bytes() > 0));
                    prop_assert!(t.held_bytes() <= budget || !over_budget_evictable);
                    let times: Vec<Instant> = held
                        .iter()
                        .filter(|&&s| Some(s) != t.latest())
                        .map(|&s| t.superseded_at(s).unwrap())
                        .collect();
                    prop_assert!(times.windows(2).all(|w| w[0] <= w[1]), "monotonic: {:?}", times);
                }
                drop(writers);
                drop(readers);
                drop(p);
            }
            prop_assert_eq!(pool.in_use(), 0);
        }
    }

    // -----------------------------------------------------------------------
    // Subscriber books (PROTOCOL.md §4.5)
    // -----------------------------------------------------------------------

    #[test]
    fn demand_counts_and_aggregates_subscribers() {
        let mut storage = PoolStorage::<4, 32>::new();
        let pool = Pool::new(&mut storage);
        let track = State::<2>::new(&pool, info("v"));
        let t = track.handle();
        assert_eq!((t.subscribers(), t.demand()), (0, None));
        let a = Request::test(2, 10, Start::Group(5), End::Group(9));
        let b = Request::test(8, 0, Start::Group(3), End::Group(7));
        t.add_subscriber(&a);
        assert_eq!(t.demand(), Some(a));
        t.add_subscriber(&b);
        assert_eq!(t.subscribers(), 2);
        assert_eq!(
            t.demand(),
            Some(Request::test(8, 10, Start::Group(3), End::Group(9)))
        );
        // Latest and open win while anyone asks for them.
        let c = Request::test(0, 0, Start::Latest, End::Open);
        t.add_subscriber(&c);
        assert_eq!(
            t.demand(),
            Some(Request::test(8, 10, Start::Latest, End::Open))
        );
        t.remove_subscriber(&c);
        assert_eq!(
            t.demand(),
            Some(Request::test(8, 10, Start::Group(3), End::Group(9)))
        );
        // The aggregate follows the subscribers that are left (PROTOCOL.md
        // §4.5), and clears at zero.
        t.remove_subscriber(&b);
        assert_eq!(t.subscribers(), 1);
        assert_eq!(t.demand(), Some(a));
        t.remove_subscriber(&a);
        assert_eq!((t.subscribers(), t.demand()), (0, None));
        // Unbalanced removal saturates.
        t.remove_subscriber(&a);
        assert_eq!(t.subscribers(), 0);
        t.add_subscriber(&b);
        assert_eq!(t.demand(), Some(b));
    }

    #[test]
    fn demand_past_four_distinct_values_is_a_bound_until_empty() {
        let mut storage = PoolStorage::<4, 32>::new();
        let pool = Pool::new(&mut storage);
        let track = State::<2>::new(&pool, info("v"));
        let t = track.handle();
        let req = |p: u8| Request::test(p, 0, Start::Latest, End::Open);
        // Priorities 1 to 4 are counted; 9 and 0 find no place and bound the
        // extremes while anyone is left.
        for p in [1, 2, 3, 4, 9, 0] {
            t.add_subscriber(&req(p));
        }
        assert_eq!(t.demand().map(|d| d.priority), Some(9));
        t.remove_subscriber(&req(9));
        assert_eq!(t.demand().map(|d| d.priority), Some(9), "a bound");
        for p in [1, 2, 3, 4, 0] {
            t.remove_subscriber(&req(p));
        }
        assert_eq!(t.demand(), None);
        // Emptied, it is exact again.
        t.add_subscriber(&req(3));
        t.add_subscriber(&req(7));
        t.remove_subscriber(&req(7));
        assert_eq!(t.demand().map(|d| d.priority), Some(3));
    }

    #[test]
    fn demand_update_is_exact() {
        let mut storage = PoolStorage::<4, 32>::new();
        let pool = Pool::new(&mut storage);
        let track = State::<2>::new(&pool, info("v"));
        let t = track.handle();
        let a = Request::test(5, 100, Start::Latest, End::Open);
        let a2 = Request::test(1, 10, Start::Group(4), End::Group(6));
        t.add_subscriber(&a);
        t.update_subscriber(&a, &a2);
        assert_eq!(t.demand(), Some(a2));
        t.update_subscriber(&a2, &a2);
        assert_eq!(t.demand(), Some(a2));
        let b = Request::test(0, 0, Start::Latest, End::Open);
        t.add_subscriber(&b);
        let b2 = Request::test(9, 0, Start::Group(8), End::Group(8));
        t.update_subscriber(&b, &b2);
        assert_eq!(t.subscribers(), 2);
        assert_eq!(
            t.demand(),
            Some(Request::test(9, 10, Start::Group(4), End::Group(8)))
        );
        // Lowered again: the aggregate comes down with it.
        let b3 = Request::test(0, 0, Start::Group(8), End::Group(8));
        t.update_subscriber(&b2, &b3);
        assert_eq!(
            t.demand(),
            Some(Request::test(1, 10, Start::Group(4), End::Group(8)))
        );
        let b2 = b3;
        // Reopening empties the books; the stale handle's unregistering no
        // longer reaches the new track's.
        let old = t;
        let t = t.reopen(info("w"));
        assert_eq!(t.subscribers(), 0);
        t.add_subscriber(&a2);
        old.remove_subscriber(&b2);
        old.add_subscriber(&b2);
        assert_eq!(t.subscribers(), 1);
        assert_eq!(t.demand(), Some(a2));
        t.remove_subscriber(&a2);
        assert_eq!(t.demand(), None);
    }
}
