//! A fixed table of relay tracks: claimed for a new track, retired when the
//! relay lets go of it, and reused once nothing serves or fills it any more.
//!
//! The relay creates a track when a subscriber asks for a name its source has
//! not published yet (docs/protocol.md §4.4-4.5), and
//! gives it up when the upstream subscription ends or lingered without
//! subscribers, or when its broadcast goes away. Every track lives in one of
//! the table's [`TrackSlot`]s, allocated once. A retired slot is reused only
//! when its track has no subscriber and no producer; reuse bumps the slot's
//! generation ([`track::Ref::reopen`]), so any handle still held elsewhere is
//! stale and can never reach the new track ([`track::Ref::is_current`],
//! [`track::Ref::key`]).
//!
//! Claiming is O(1) while free slots remain; when none does, one pass over
//! the retired slots takes back those that became idle. No allocation.

use core::fmt;

use super::table::{Counts, Link, Slot, Table};
use crate::model::track::{self, Info, Limits, State};
use crate::pool::Pool;

/// One entry of a [`TrackTable`]: a track state with a ring of `G` groups.
pub struct TrackSlot<'p, const G: usize> {
    state: State<'p, G>,
    link: Link,
}

impl<'p, const G: usize> TrackSlot<'p, G> {
    /// A free slot whose tracks store groups in `pool` under `limits`.
    pub fn new(pool: &'p Pool<'p>, limits: Limits) -> Self {
        TrackSlot {
            state: State::with_limits(pool, placeholder(), limits),
            link: Link::new(),
        }
    }
}

/// The info of a slot that holds no track.
fn placeholder() -> Info {
    match Info::new("") {
        Ok(info) => info,
        Err(_) => unreachable!("the empty name fits"),
    }
}

impl<const G: usize> Slot for TrackSlot<'_, G> {
    fn link(&self) -> &Link {
        &self.link
    }

    fn idle(&self) -> bool {
        let t = self.state.handle();
        t.subscribers() == 0 && !t.has_producer()
    }

    fn clear(&self) {
        // A new generation with no group: the pool blocks come back (but
        // for those a reader still holds).
        let _ = self.state.handle().reopen(placeholder());
    }
}

impl<const G: usize> fmt::Debug for TrackSlot<'_, G> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TrackSlot")
            .field("link", &self.link)
            .field("track", &self.state.handle())
            .finish()
    }
}

/// Every slot is claimed and none of the retired ones is idle yet: the new
/// track is refused (a relay answers the request with an error code).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct TracksFull;

impl fmt::Display for TracksFull {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("relay track table full")
    }
}

impl core::error::Error for TracksFull {}

/// A fixed table of relay tracks over caller-provided slots (see the module docs).
pub struct TrackTable<'a, 'p, const G: usize> {
    table: Table<'a, TrackSlot<'p, G>>,
}

impl<'a, 'p, const G: usize> TrackTable<'a, 'p, G> {
    /// A table over `slots`, all free. At most `u32::MAX - 1` slots are used.
    pub fn new(slots: &'a [TrackSlot<'p, G>]) -> Self {
        TrackTable {
            table: Table::new(slots),
        }
    }

    /// The number of slots.
    pub fn capacity(&self) -> usize {
        self.table.capacity()
    }

    /// How many slots are claimed, retired and free.
    pub fn counts(&self) -> Counts {
        self.table.counts()
    }

    /// A fresh track `info` in a free slot (taking back idle retired slots
    /// first if none is free): open, empty, its own generation.
    ///
    /// # Errors
    /// [`TracksFull`] when every slot is claimed or still in use.
    pub fn claim(&self, info: Info) -> Result<track::Ref<'a, 'p>, TracksFull> {
        let slot = self.table.claim().ok_or(TracksFull)?;
        Ok(slot.state.handle().reopen(info))
    }

    /// Gives track `t` back: it is reused once it has no subscriber and no
    /// producer. False (and nothing changes) if `t` is not a current track
    /// claimed from this table.
    pub fn retire(&self, t: track::Ref<'_, '_>) -> bool {
        self.index_of(t).is_some_and(|i| self.table.retire(i))
    }

    /// Gives every claimed track back at once (their owner is gone), as
    /// [`TrackTable::retire`] does for one. O(slots).
    pub fn retire_all(&self) {
        self.table.retire_all();
    }

    /// Takes back every retired slot whose track is idle (no subscriber, no
    /// producer): its groups are dropped at once (their pool blocks come
    /// back, but for those a reader still holds) and the slot is free.
    /// Returns how many came back. O(retired).
    pub fn reclaim(&self) -> usize {
        self.table.reclaim()
    }

    /// The slot holding the current generation of `t`, if it is one of ours.
    fn index_of(&self, t: track::Ref<'_, '_>) -> Option<usize> {
        if !t.is_current() {
            return None;
        }
        let slots = self.table.slots;
        let base = slots.first()?.state.handle().key().addr();
        let stride = core::mem::size_of::<TrackSlot<'p, G>>();
        let offset = t.key().addr().checked_sub(base)?;
        if stride == 0 || offset % stride != 0 {
            return None;
        }
        let i = offset / stride;
        slots.get(i)?.state.handle().same_track(&t).then_some(i)
    }
}

impl<const G: usize> fmt::Debug for TrackTable<'_, '_, G> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TrackTable")
            .field("table", &self.table)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::PoolStorage;
    use crate::window::Start;
    use alloc::vec::Vec;

    fn info(name: &str) -> Info {
        Info::new(name).unwrap()
    }

    #[test]
    fn claimed_tracks_come_back_once_idle_and_stale_handles_stay_out() {
        let mut storage = PoolStorage::<8, 64>::new();
        let pool = Pool::new(&mut storage);
        let slots: Vec<TrackSlot<'_, 4>> = (0..2)
            .map(|_| TrackSlot::new(&pool, Limits::NONE))
            .collect();
        let table = TrackTable::new(&slots);
        let a = table.claim(info("a")).unwrap();
        let b = table.claim(info("b")).unwrap();
        assert_eq!(table.claim(info("c")).unwrap_err(), TracksFull);
        // A producer writes a group; the retired track still has its producer.
        let mut p = a.producer().unwrap();
        let mut g = p.append_group().unwrap();
        g.write_frame(0, b"x").unwrap();
        g.finish().unwrap();
        drop(g);
        assert!(pool.in_use() > 0);
        assert!(table.retire(a));
        assert!(!table.retire(a), "retired once");
        assert_eq!(
            table.claim(info("c")).unwrap_err(),
            TracksFull,
            "a has a producer"
        );
        assert!(p.finish());
        drop(p);
        let c = table.claim(info("c")).unwrap();
        assert_eq!(pool.in_use(), 0, "the reused slot let its groups go");
        assert!(c.has_name("c") && !a.is_current() && !c.same_track(&a));
        assert_ne!(a.key(), c.key());
        // The stale handle reaches nothing of the new track.
        assert!(a.producer().is_err());
        assert!(!table.retire(a));
        assert_eq!(
            table.counts(),
            Counts {
                claimed: 2,
                retired: 0,
                free: 0
            }
        );
        let _ = (b, Start::Latest);
    }

    #[test]
    fn a_retired_track_with_a_subscriber_waits_for_it_to_leave() {
        let mut storage = PoolStorage::<8, 64>::new();
        let pool = Pool::new(&mut storage);
        let slots: Vec<TrackSlot<'_, 4>> = (0..1)
            .map(|_| TrackSlot::new(&pool, Limits::NONE))
            .collect();
        let table = TrackTable::new(&slots);
        let a = table.claim(info("a")).unwrap();
        let r = crate::window::Request::LIVE;
        a.add_subscriber(&r);
        assert!(table.retire(a));
        assert_eq!(table.reclaim(), 0);
        a.remove_subscriber(&r);
        assert_eq!(table.reclaim(), 1);
        assert_eq!(table.counts().free, 1);
        // Churn through many names: the table never needs more slots.
        for n in 0..1000 {
            let mut name = heapless::String::<8>::new();
            core::fmt::write(&mut name, format_args!("t{n}")).unwrap();
            let t = table.claim(info(&name)).unwrap();
            assert!(table.retire(t));
        }
        assert_eq!(table.counts().retired, 1);
    }

    #[test]
    fn foreign_handles_are_not_retired() {
        let mut storage = PoolStorage::<8, 64>::new();
        let pool = Pool::new(&mut storage);
        let slots: Vec<TrackSlot<'_, 4>> = (0..1)
            .map(|_| TrackSlot::new(&pool, Limits::NONE))
            .collect();
        let table = TrackTable::new(&slots);
        let other = State::<4>::new(&pool, info("x"));
        assert!(!table.retire(other.handle()));
        let empty: [TrackSlot<'_, 4>; 0] = [];
        let none = TrackTable::new(&empty);
        assert_eq!(none.claim(info("a")).unwrap_err(), TracksFull);
    }
}
