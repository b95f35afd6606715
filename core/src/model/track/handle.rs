//! What a [`Ref`] does: its queries, the producer and consumer constructors,
//! the track's end and reuse; and [`Key`], the identity of one generation of
//! a track's state.

use core::fmt;
use core::task::{Context, Poll, Waker};

use super::demand::Demand;
use super::{Consumer, Info, Producer, ProducerTaken, Ref, Slot, Status};
use crate::model::group;
use crate::time::Instant;
use crate::window::{Start, Timeline, Window};

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

    /// The address part (where the track's state lives): the same for every
    /// generation of one state, so a per-state table may key by it.
    pub fn addr(&self) -> usize {
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
    /// re-splices a track onto a new upstream (docs/protocol.md §4.4) either keeps
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

    /// The number of the track's current (or last) producer: it changes
    /// whenever [`Ref::producer`] hands out a producer and whenever one is
    /// detached in failover mode ([`Ref::detach_producer`], or a failover
    /// abort or drop). Whoever had a producer made can tell, with one read,
    /// that it was let go since.
    pub fn producer_serial(&self) -> u64 {
        self.core.producer_id.get()
    }

    /// Lets the track's producer go without ending the track, as a failover
    /// abort of that producer would ([`Producer::abort`] in failover mode):
    /// its open groups are aborted with `code`, it is detached (stale from
    /// now on: its calls fail with [`CreateError::Stale`](super::CreateError::Stale)
    /// or return false), and [`Ref::producer`] can continue the track at
    /// once. A relay replacing a track's source calls it before subscribing
    /// the track from the new one. False (nothing changed) unless the handle
    /// is current, failover mode is on, the track is open and a producer is
    /// attached.
    pub fn detach_producer(&self, code: u64) -> bool {
        let c = self.core;
        self.is_current()
            && c.failover.get()
            && c.has_producer.get()
            && c.status.get() == Status::Open
            && self.detach(code)
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
    /// [`Start::Latest`] begins at the latest group (docs/protocol.md §3.8: delivered
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
    /// (docs/protocol.md §3.7), so TRACK requests for it wait for them.
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

    /// Whether the track is called `name` (byte-wise, docs/protocol.md §3.2).
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
    #[cfg(test)]
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

    /// The byte budget (see [`Limits::cache_bytes`](super::Limits::cache_bytes)).
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
    #[cfg(test)]
    pub fn evicted_count(&self) -> u64 {
        self.core.evicted.get()
    }

    /// A counter bumped on every change (group, frame, payload, end, eviction).
    pub fn version(&self) -> u64 {
        self.core.version.get()
    }

    /// Ready with the current version once it differs from `since`; otherwise
    /// registers the task (see [`Wakers`](super::Wakers)) and returns `Pending`.
    #[must_use = "Pending means: poll again when woken"]
    pub fn poll_changed(&self, cx: &mut Context<'_>, since: u64) -> Poll<u64> {
        let v = self.core.version.get();
        if v != since {
            return Poll::Ready(v);
        }
        self.core.wakers.register(cx.waker());
        Poll::Pending
    }

    /// Remembers `waker` until the track's next change (group, frame,
    /// payload, end, eviction), then wakes it once: register before reading
    /// the track, and a change after the read is never missed. Registering a
    /// waker that wakes the same task as one held is free (see
    /// [`Wakers`](super::Wakers)).
    pub fn wake_on_change(&self, waker: &Waker) {
        self.core.wakers.register(waker);
    }

    /// Bumps the version and wakes the registered tasks.
    pub(super) fn changed(&self) {
        self.core
            .version
            .set(self.core.version.get().wrapping_add(1));
        self.core.wakers.wake();
    }

    /// A reader of group `seq` from its first byte, if held.
    pub fn group(&self, seq: u64) -> Option<group::Consumer<'t, 'p>> {
        self.find(seq).map(|i| self.slot(i).group.consumer())
    }

    /// Records the first group the subscription filling this track said it
    /// delivers (its SUBSCRIBE_START), for [`Ref::may_arrive`].
    pub fn set_upstream_first(&self, seq: u64) {
        self.core.upstream_first.set(Some(seq));
    }

    /// Whether group `seq`, not held, may still arrive: the track is open,
    /// its upstream said it delivers from `seq` or earlier, and `seq` is older
    /// than every group held and newer than every group evicted. An upstream
    /// with several groups to send sends the newest first (docs/protocol.md
    /// §4.6), so the older ones of a burst come after a newer one is held.
    pub fn may_arrive(&self, seq: u64) -> bool {
        let c = self.core;
        c.status.get() == Status::Open
            && c.upstream_first.get().is_some_and(|first| first <= seq)
            && c.evicted_max.get().is_none_or(|e| e < seq)
            && self.oldest_slot(None).is_some_and(|i| seq < self.seq(i))
    }

    /// A reader of the latest group from its first byte: the first group of a
    /// [`Start::Latest`] subscription (docs/protocol.md §4.8).
    pub fn latest_group(&self) -> Option<group::Consumer<'t, 'p>> {
        self.group(self.core.latest.get()?)
    }

    /// The newest held group that `window` still wants and that is not expired
    /// for its max latency (docs/protocol.md §4.6: newest first; §4.7).
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
    pub(super) fn finish(&self) -> bool {
        if self.core.status.get() != Status::Open {
            return false;
        }
        self.core.status.set(Status::Finished);
        self.changed();
        true
    }

    /// Abandons the track with stream error `code`, aborting its open groups.
    /// Returns false if it was already aborted.
    pub(super) fn abort(&self, code: u64) -> bool {
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
    pub(super) fn detach(&self, code: u64) -> bool {
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
        c.upstream_first.set(None);
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
}

impl Timeline for Ref<'_, '_> {
    fn latest(&self) -> Option<u64> {
        self.core.latest.get()
    }

    fn newest(&self) -> Instant {
        self.core.info.get().instant(self.newest_ts())
    }

    fn superseded_at(&self, seq: u64) -> Option<Instant> {
        if self.find(seq).is_none() && !self.may_arrive(seq) {
            return None;
        }
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
