//! The slot lists shared by the relay's tables: a free list and a list of
//! retired slots, threaded through the slots themselves (no allocation), and
//! the counts of each.

use core::cell::Cell;

/// Marks the end of a slot list.
const NIL: u32 = u32::MAX;

/// Where a slot is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Use {
    /// On the free list: holds nothing.
    Free,
    /// Handed out.
    Claimed,
    /// Given back; reused once idle.
    Retired,
}

/// A slot's place in the lists.
#[derive(Debug)]
pub(crate) struct Link {
    use_: Cell<Use>,
    next: Cell<u32>,
}

impl Link {
    /// A free slot's link.
    pub(crate) const fn new() -> Self {
        Link {
            use_: Cell::new(Use::Free),
            next: Cell::new(NIL),
        }
    }
}

/// An entry of a table: its link, and whether what it holds is still in use.
pub(crate) trait Slot {
    /// The slot's place in the lists.
    fn link(&self) -> &Link;
    /// True once nothing uses what the retired slot holds.
    fn idle(&self) -> bool;
    /// Lets go of what the slot holds (it goes back on the free list).
    fn clear(&self);
}

/// Counts of a table's slots, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Counts {
    /// Slots handed out and not retired.
    pub claimed: usize,
    /// Slots retired and not reused yet (some still serve their last users).
    pub retired: usize,
    /// Slots holding nothing.
    pub free: usize,
}

/// The free and retired lists over a slice of slots.
#[derive(Debug)]
pub(crate) struct Lists {
    free: Cell<u32>,
    retired: Cell<u32>,
    counts: Cell<Counts>,
}

impl Lists {
    /// Every one of `slots` free (at most `u32::MAX - 1` are used).
    pub(crate) fn new<S: Slot>(slots: &[S]) -> (Self, usize) {
        let n = slots.len().min(NIL as usize - 1);
        for (i, s) in slots.iter().take(n).enumerate() {
            s.link().use_.set(Use::Free);
            s.link()
                .next
                .set(if i + 1 < n { (i + 1) as u32 } else { NIL });
        }
        let lists = Lists {
            free: Cell::new(if n > 0 { 0 } else { NIL }),
            retired: Cell::new(NIL),
            counts: Cell::new(Counts {
                claimed: 0,
                retired: 0,
                free: n,
            }),
        };
        (lists, n)
    }

    /// The counts of each list.
    pub(crate) fn counts(&self) -> Counts {
        self.counts.get()
    }

    /// Takes a free slot (taking back idle retired ones first if none is free).
    pub(crate) fn claim<S: Slot>(&self, slots: &[S]) -> Option<usize> {
        if self.free.get() == NIL {
            self.reclaim(slots);
        }
        let i = self.free.get();
        let slot = slots.get(i as usize)?;
        self.free.set(slot.link().next.get());
        slot.link().next.set(NIL);
        slot.link().use_.set(Use::Claimed);
        self.count(|c| {
            c.free -= 1;
            c.claimed += 1;
        });
        Some(i as usize)
    }

    /// Moves claimed slot `i` to the retired list; false if it was not claimed.
    pub(crate) fn retire<S: Slot>(&self, slots: &[S], i: usize) -> bool {
        let Some(slot) = slots.get(i) else {
            return false;
        };
        if slot.link().use_.get() != Use::Claimed {
            return false;
        }
        slot.link().use_.set(Use::Retired);
        slot.link().next.set(self.retired.get());
        self.retired.set(i as u32);
        self.count(|c| {
            c.claimed -= 1;
            c.retired += 1;
        });
        true
    }

    /// Moves every claimed slot to the retired list. O(slots).
    pub(crate) fn retire_all<S: Slot>(&self, slots: &[S]) {
        for i in 0..slots.len() {
            self.retire(slots, i);
        }
    }

    /// Frees every idle retired slot; returns how many. O(retired).
    pub(crate) fn reclaim<S: Slot>(&self, slots: &[S]) -> usize {
        let mut back = 0;
        let mut prev: Option<&S> = None;
        let mut i = self.retired.get();
        while let Some(slot) = slots.get(i as usize) {
            let next = slot.link().next.get();
            if slot.idle() {
                match prev {
                    Some(p) => p.link().next.set(next),
                    None => self.retired.set(next),
                }
                slot.clear();
                slot.link().use_.set(Use::Free);
                slot.link().next.set(self.free.get());
                self.free.set(i);
                self.count(|c| {
                    c.retired -= 1;
                    c.free += 1;
                });
                back += 1;
            } else {
                prev = Some(slot);
            }
            i = next;
        }
        back
    }

    fn count(&self, f: impl FnOnce(&mut Counts)) {
        let mut c = self.counts.get();
        f(&mut c);
        self.counts.set(c);
    }
}

/// A table over caller-provided slots: the slots and their lists.
pub(crate) struct Table<'a, S> {
    pub(crate) slots: &'a [S],
    lists: Lists,
}

impl<'a, S: Slot> Table<'a, S> {
    /// Every one of `slots` free (at most `u32::MAX - 1` are used).
    pub(crate) fn new(slots: &'a [S]) -> Self {
        let (lists, n) = Lists::new(slots);
        Table {
            slots: slots.get(..n).unwrap_or(&[]),
            lists,
        }
    }

    /// The number of slots.
    pub(crate) fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// The counts of each list.
    pub(crate) fn counts(&self) -> Counts {
        self.lists.counts()
    }

    /// A free slot, taken (idle retired ones are taken back first if none is free).
    pub(crate) fn claim(&self) -> Option<&'a S> {
        let i = self.lists.claim(self.slots)?;
        self.slots.get(i)
    }

    /// Moves claimed slot `i` to the retired list; false if it was not claimed.
    pub(crate) fn retire(&self, i: usize) -> bool {
        self.lists.retire(self.slots, i)
    }

    /// Retires every claimed slot.
    pub(crate) fn retire_all(&self) {
        self.lists.retire_all(self.slots);
    }

    /// Frees every idle retired slot; returns how many.
    pub(crate) fn reclaim(&self) -> usize {
        self.lists.reclaim(self.slots)
    }
}

impl<S> core::fmt::Debug for Table<'_, S> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Table")
            .field("capacity", &self.slots.len())
            .field("counts", &self.lists.counts())
            .finish()
    }
}
