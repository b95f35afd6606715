//! A fixed table of relay broadcasts: claimed when a source announces a
//! path, retired when the relay withdraws it, and reused once its producer
//! is gone.
//!
//! The relay takes a broadcast out of every origin before it retires it;
//! reuse bumps the broadcast's generation ([`broadcast::Ref::reopen`]), so a
//! handle still held elsewhere is stale ([`broadcast::Ref::is_current`]), and
//! the origins' change logs keep their own copies of the paths. Claiming is
//! O(1) while free slots remain; no allocation.

use core::fmt;

#[cfg(test)]
use super::table::Counts;
use super::table::{Link, Slot, Table};
use crate::model::broadcast::{self, State};
use crate::model::path::Path;

/// One entry of a [`BroadcastTable`]: a broadcast state with `T` track places.
pub struct BroadcastSlot<'a, 'p, const T: usize> {
    state: State<'a, 'p, T>,
    link: Link,
}

impl<const T: usize> BroadcastSlot<'_, '_, T> {
    /// A free slot.
    pub fn new() -> Self {
        BroadcastSlot {
            state: match State::new(Path::EMPTY) {
                Ok(s) => s,
                Err(_) => unreachable!("the empty path fits"),
            },
            link: Link::new(),
        }
    }
}

impl<const T: usize> Default for BroadcastSlot<'_, '_, T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const T: usize> Slot for BroadcastSlot<'_, '_, T> {
    fn link(&self) -> &Link {
        &self.link
    }

    fn idle(&self) -> bool {
        !self.state.has_producer()
    }

    fn clear(&self) {
        // A new generation with no track and the empty path.
        let _ = self.state.reuse(Path::EMPTY);
    }
}

impl<const T: usize> fmt::Debug for BroadcastSlot<'_, '_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BroadcastSlot")
            .field("link", &self.link)
            .field("broadcast", &self.state)
            .finish()
    }
}

/// Why [`BroadcastTable::claim`] refused a broadcast.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum ClaimError {
    /// Every slot is in use.
    Full,
    /// The path does not fit a broadcast.
    Path,
}

impl fmt::Display for ClaimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ClaimError::Full => "relay broadcast table full",
            ClaimError::Path => "broadcast path too long",
        })
    }
}

impl core::error::Error for ClaimError {}

/// A fixed table of relay broadcasts over caller-provided slots (see the module docs).
pub struct BroadcastTable<'a, 'p, const T: usize> {
    table: Table<'a, BroadcastSlot<'a, 'p, T>>,
}

impl<'a, 'p, const T: usize> BroadcastTable<'a, 'p, T> {
    /// A table over `slots`, all free. At most `u32::MAX - 1` slots are used.
    pub fn new(slots: &'a [BroadcastSlot<'a, 'p, T>]) -> Self {
        BroadcastTable {
            table: Table::new(slots),
        }
    }

    /// The number of slots.
    #[cfg(test)]
    pub fn capacity(&self) -> usize {
        self.table.capacity()
    }

    /// How many slots are claimed, retired and free.
    #[cfg(test)]
    pub fn counts(&self) -> Counts {
        self.table.counts()
    }

    /// A fresh, open broadcast at `path` with no track, in a free slot
    /// (taking back idle retired slots first if none is free).
    ///
    /// # Errors
    /// [`ClaimError::Full`] when every slot is in use; [`ClaimError::Path`]
    /// for a path over [`broadcast::MAX_PATH_LEN`] (nothing is claimed).
    pub fn claim(&self, path: Path<'_>) -> Result<broadcast::Ref<'a, 'p>, ClaimError> {
        if path.as_str().len() > broadcast::MAX_PATH_LEN {
            return Err(ClaimError::Path);
        }
        let slot = self.table.claim().ok_or(ClaimError::Full)?;
        // A claimed slot has no producer: its last one was gone when it was
        // taken back, and nobody makes one between.
        slot.state.reuse(path).map_err(|_| ClaimError::Path)?;
        Ok(slot.state.handle())
    }

    /// Gives broadcast `b` back (the caller took it out of every origin): it
    /// is reused once its producer is gone. False (and nothing changes) if
    /// `b` is not a current broadcast claimed from this table.
    pub fn retire(&self, b: broadcast::Ref<'_, '_>) -> bool {
        self.index_of(b).is_some_and(|i| self.table.retire(i))
    }

    /// Takes back every retired slot whose producer is gone; returns how
    /// many came back. O(retired).
    pub fn reclaim(&self) -> usize {
        self.table.reclaim()
    }

    fn index_of(&self, b: broadcast::Ref<'_, '_>) -> Option<usize> {
        if !b.is_current() {
            return None;
        }
        // O(slots), once per broadcast's life.
        self.table
            .slots
            .iter()
            .position(|s| s.state.handle().same_broadcast(&b))
    }
}

impl<const T: usize> fmt::Debug for BroadcastTable<'_, '_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BroadcastTable")
            .field("table", &self.table)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::origin;
    use alloc::vec::Vec;

    fn path(s: &str) -> Path<'_> {
        Path::new(s).unwrap()
    }

    #[test]
    fn broadcasts_come_back_once_their_producer_is_gone() {
        let slots: Vec<BroadcastSlot<'_, '_, 2>> = (0..2).map(|_| BroadcastSlot::new()).collect();
        let table = BroadcastTable::new(&slots);
        let o = origin::State::<4, 8>::new();
        let a = table.claim(path("a")).unwrap();
        let b = table.claim(path("b")).unwrap();
        assert_eq!(table.claim(path("c")).unwrap_err(), ClaimError::Full);
        let p = a.producer().unwrap();
        o.handle().announce(a).unwrap();
        let mut cursor = o.handle().cursor();
        o.handle().unannounce(path("a"));
        assert!(table.retire(a));
        assert!(!table.retire(a), "retired once");
        assert_eq!(table.claim(path("c")).unwrap_err(), ClaimError::Full);
        drop(p);
        let c = table.claim(path("c")).unwrap();
        assert!(c.has_path(path("c")) && !a.is_current() && !c.same_broadcast(&a));
        // The origin's log still names the old path.
        let change = o.handle().next_change(&mut cursor).unwrap().unwrap();
        assert_eq!(change.path().as_str(), "a");
        assert!(!change.broadcast().is_current());
        assert!(!table.retire(a));
        let _ = b;
        assert_eq!(
            table.counts(),
            Counts {
                claimed: 2,
                retired: 0,
                free: 0
            }
        );
    }

    #[test]
    fn churn_never_needs_more_slots() {
        let slots: Vec<BroadcastSlot<'_, '_, 2>> = (0..1).map(|_| BroadcastSlot::new()).collect();
        let table = BroadcastTable::new(&slots);
        for n in 0..1000 {
            let mut name = heapless::String::<8>::new();
            core::fmt::write(&mut name, format_args!("p{n}")).unwrap();
            let b = table.claim(path(&name)).unwrap();
            assert!(b.has_path(path(&name)));
            assert!(table.retire(b));
        }
        let long = [b'x'; broadcast::MAX_PATH_LEN + 1];
        let long = core::str::from_utf8(&long).unwrap();
        assert_eq!(table.claim(path(long)).unwrap_err(), ClaimError::Path);
        assert_eq!(table.counts().retired, 1);
    }
}
