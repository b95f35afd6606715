//! A fixed-capacity subscriber table: O(1) join and leave, O(live) fan-out.
//!
//! A relay walks every subscriber of a track each time data arrives, and
//! subscribers come and go at any rate, so the table is a slab with stable
//! handles plus a dense array of the live entries:
//!
//! * `slots[index]` keeps a generation counter and a link: the dense position
//!   of the live entry, or the next free slot. Freed slots form a LIFO free
//!   list; slots never used yet are handed out from a high-water mark, so
//!   construction writes no links.
//! * `dense[0..len]` holds the live entries (the value and its [`Id`])
//!   contiguously, so fan-out iterates a plain slice. Leaving swap-removes:
//!   the last entry moves into the hole and its slot's link is updated.
//!
//! Join, leave, `get` and `get_mut` are O(1) with no allocation at any size;
//! iteration is O(live). An [`Id`] carries its slot's generation, so an id
//! kept after its entry left never reaches a later entry in the same slot; a
//! slot whose generation would wrap is retired instead of reused (after 2^32
//! joins of that one slot), which keeps that promise absolute.
//!
//! # Where the table lives
//!
//! [`Subscribers<T, N>`] stores both arrays inline and has a `const fn new`,
//! so it can go in a `static` (built at compile time into `.bss` / `.data`,
//! never on the stack). On a host, moving a large inline table into a
//! `Box` with `Box::new(Subscribers::new())` builds it on the stack first in
//! debug builds and can overflow it (10,000 entries of a 64-byte `T` are about
//! 800 KB). Use [`BoxedSubscribers<T, N>`] instead: the same
//! table, whose two arrays are allocated element by element on the heap, with
//! no `unsafe` and no large temporary. Both are the generic [`Table`] over a
//! storage type; every method is shared.

use core::fmt;
use core::marker::PhantomData;

use self::sealed::{Entry, Slot, Storage};

// Link value meaning "no slot" (end of the free list, or a retired slot).
const NONE: u32 = u32::MAX;

/// A stable handle to a table entry: its slot index and the slot's generation
/// when the entry joined.
///
/// After the entry leaves, the id is stale: every lookup with it fails, even
/// once the slot holds a new entry.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Id {
    index: u32,
    generation: u32,
}

impl Id {
    /// The slot index, below the table's capacity; reused after a leave.
    #[inline]
    pub const fn index(self) -> u32 {
        self.index
    }

    /// The slot's generation when this entry joined.
    #[inline]
    pub const fn generation(self) -> u32 {
        self.generation
    }
}

impl fmt::Debug for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Id({}v{})", self.index, self.generation)
    }
}

/// [`Table::join`] refused an entry: every slot is taken (or retired).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TableFull;

impl fmt::Display for TableFull {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("subscriber table is full")
    }
}

impl core::error::Error for TableFull {}

mod sealed {
    use super::Id;

    /// Per-slot bookkeeping.
    #[derive(Clone, Copy)]
    pub struct Slot {
        /// Generation given to the next (or current) entry of this slot.
        pub generation: u32,
        /// Occupied: dense position. Vacant: next free slot or `NONE`.
        pub link: u32,
    }

    impl Slot {
        pub const FRESH: Slot = Slot {
            generation: 0,
            link: super::NONE,
        };
    }

    /// A live entry in the dense array.
    pub struct Entry<T> {
        pub id: Id,
        pub value: T,
    }

    /// Backing arrays of a table; implemented by `Inline` and `Boxed` only.
    ///
    /// Both slices have length `CAPACITY`.
    pub trait Storage<T> {
        const CAPACITY: usize;
        fn parts(&self) -> (&[Slot], &[Option<Entry<T>>]);
        fn parts_mut(&mut self) -> (&mut [Slot], &mut [Option<Entry<T>>]);
    }
}

/// Storage with both arrays inline: the table is one `N`-sized value.
pub struct Inline<T, const N: usize> {
    slots: [Slot; N],
    dense: [Option<Entry<T>>; N],
}

impl<T, const N: usize> Inline<T, N> {
    /// Empty storage for `N` entries.
    ///
    /// # Panics
    ///
    /// Never at run time: `N >= u32::MAX` is rejected at compile time.
    pub const fn new() -> Self {
        const {
            assert!(
                N < u32::MAX as usize,
                "a table holds fewer than u32::MAX entries"
            )
        };
        Inline {
            slots: [Slot::FRESH; N],
            dense: [const { None }; N],
        }
    }
}

impl<T, const N: usize> Default for Inline<T, N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T, const N: usize> Storage<T> for Inline<T, N> {
    const CAPACITY: usize = N;

    #[inline]
    fn parts(&self) -> (&[Slot], &[Option<Entry<T>>]) {
        (&self.slots, &self.dense)
    }

    #[inline]
    fn parts_mut(&mut self) -> (&mut [Slot], &mut [Option<Entry<T>>]) {
        (&mut self.slots, &mut self.dense)
    }
}

/// Storage with both arrays on the heap, allocated once at construction.
pub struct Boxed<T, const N: usize> {
    slots: Box<[Slot]>,
    dense: Box<[Option<Entry<T>>]>,
}

impl<T, const N: usize> Boxed<T, N> {
    /// Empty storage for `N` entries, written element by element into two heap
    /// allocations (no `N`-sized value ever exists on the stack).
    ///
    /// # Panics
    ///
    /// Never at run time: `N >= u32::MAX` is rejected at compile time. Aborts
    /// like any allocation if memory runs out.
    pub fn new() -> Self {
        const {
            assert!(
                N < u32::MAX as usize,
                "a table holds fewer than u32::MAX entries"
            )
        };
        Boxed {
            slots: (0..N).map(|_| Slot::FRESH).collect(),
            dense: (0..N).map(|_| None).collect(),
        }
    }
}

impl<T, const N: usize> Default for Boxed<T, N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T, const N: usize> Storage<T> for Boxed<T, N> {
    const CAPACITY: usize = N;

    #[inline]
    fn parts(&self) -> (&[Slot], &[Option<Entry<T>>]) {
        (&self.slots, &self.dense)
    }

    #[inline]
    fn parts_mut(&mut self) -> (&mut [Slot], &mut [Option<Entry<T>>]) {
        (&mut self.slots, &mut self.dense)
    }
}

/// A subscriber table of up to `N` entries stored inline; see the module docs.
pub type Subscribers<T, const N: usize> = Table<T, Inline<T, N>>;

/// A subscriber table of up to `N` entries stored on the heap; build large
/// tables this way on hosts.
pub type BoxedSubscribers<T, const N: usize> = Table<T, Boxed<T, N>>;

/// A fixed-capacity slab of `T` with stable [`Id`]s and dense iteration.
///
/// Use it through [`Subscribers`] (inline) or `BoxedSubscribers` (heap);
/// the storage type `S` is sealed.
pub struct Table<T, S> {
    store: S,
    // Live entries: `dense[..len]`.
    len: u32,
    // Head of the free list of vacated slots, or NONE.
    free: u32,
    // Slots `fresh..` have never been used.
    fresh: u32,
    _values: PhantomData<T>,
}

impl<T, const N: usize> Table<T, Inline<T, N>> {
    /// An empty inline table; `const`, so it can initialize a `static`.
    ///
    /// # Panics
    ///
    /// Never at run time: `N >= u32::MAX` is rejected at compile time.
    pub const fn new() -> Self {
        Table {
            store: Inline::new(),
            len: 0,
            free: NONE,
            fresh: 0,
            _values: PhantomData,
        }
    }
}

impl<T, const N: usize> Default for Table<T, Inline<T, N>> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T, const N: usize> Table<T, Boxed<T, N>> {
    /// An empty table whose arrays are allocated on the heap in place.
    ///
    /// # Panics
    ///
    /// Never at run time: `N >= u32::MAX` is rejected at compile time.
    pub fn new() -> Self {
        Table {
            store: Boxed::new(),
            len: 0,
            free: NONE,
            fresh: 0,
            _values: PhantomData,
        }
    }
}

impl<T, const N: usize> Default for Table<T, Boxed<T, N>> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T, S: Storage<T>> Table<T, S> {
    /// Adds `value` and returns its id. O(1), no allocation.
    ///
    /// # Errors
    ///
    /// [`TableFull`] when no slot is free; the table is unchanged and `value`
    /// is dropped (check [`Table::is_full`] first to keep it).
    #[inline]
    pub fn join(&mut self, value: T) -> Result<Id, TableFull> {
        let from_free = self.free != NONE;
        let index = if from_free {
            self.free
        } else if (self.fresh as usize) < S::CAPACITY {
            self.fresh
        } else {
            return Err(TableFull);
        };
        let pos = self.len;
        let (slots, dense) = self.store.parts_mut();
        // Both lookups hold by construction; failing them refuses rather than panics.
        let (Some(slot), Some(cell)) = (slots.get_mut(index as usize), dense.get_mut(pos as usize))
        else {
            return Err(TableFull);
        };
        if from_free {
            self.free = slot.link;
        } else {
            self.fresh += 1;
        }
        slot.link = pos;
        let id = Id {
            index,
            generation: slot.generation,
        };
        *cell = Some(Entry { id, value });
        self.len += 1;
        Ok(id)
    }

    /// Removes the entry `id` names and returns its value; `None` if the id is
    /// stale or was never issued. O(1): the last live entry takes its place.
    #[inline]
    pub fn leave(&mut self, id: Id) -> Option<T> {
        let pos = self.position(id)?;
        let entry = self.remove_at(pos)?;
        Some(entry.value)
    }

    /// The value `id` names, or `None` if the id is stale.
    #[inline]
    pub fn get(&self, id: Id) -> Option<&T> {
        let (slots, dense) = self.store.parts();
        let pos = slots.get(id.index as usize)?.link;
        match dense.get(pos as usize)? {
            Some(entry) if entry.id == id => Some(&entry.value),
            _ => None,
        }
    }

    /// The value `id` names, mutably, or `None` if the id is stale.
    #[inline]
    pub fn get_mut(&mut self, id: Id) -> Option<&mut T> {
        let (slots, dense) = self.store.parts_mut();
        let pos = slots.get(id.index as usize)?.link;
        match dense.get_mut(pos as usize)? {
            Some(entry) if entry.id == id => Some(&mut entry.value),
            _ => None,
        }
    }

    /// Whether `id` names a live entry.
    #[inline]
    pub fn contains(&self, id: Id) -> bool {
        self.get(id).is_some()
    }

    /// Number of live entries.
    #[inline]
    pub const fn len(&self) -> usize {
        self.len as usize
    }

    /// Whether there are no live entries.
    #[inline]
    pub const fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether [`Table::join`] would refuse.
    #[inline]
    pub fn is_full(&self) -> bool {
        self.free == NONE && self.fresh as usize >= S::CAPACITY
    }

    /// The most entries the table can hold (`N`).
    #[inline]
    pub const fn capacity(&self) -> usize {
        S::CAPACITY
    }

    /// Iterates over live entries with their ids.
    ///
    /// The order is unspecified: it is join order until the first leave, which
    /// moves the last entry into the hole.
    #[inline]
    pub fn iter(&self) -> Iter<'_, T> {
        let (_, dense) = self.store.parts();
        Iter {
            inner: dense.get(..self.len as usize).unwrap_or_default().iter(),
        }
    }

    /// Iterates mutably over live entries with their ids, in the same
    /// unspecified order as [`Table::iter`].
    #[inline]
    pub fn iter_mut(&mut self) -> IterMut<'_, T> {
        let len = self.len as usize;
        let (_, dense) = self.store.parts_mut();
        IterMut {
            inner: dense.get_mut(..len).unwrap_or_default().iter_mut(),
        }
    }

    /// Keeps only the entries for which `keep` returns `true`, in one O(live)
    /// pass; removed entries are dropped and their ids go stale.
    ///
    /// Each entry is visited exactly once, in unspecified order.
    pub fn retain(&mut self, mut keep: impl FnMut(Id, &mut T) -> bool) {
        let mut pos = 0u32;
        while pos < self.len {
            let (_, dense) = self.store.parts_mut();
            let Some(Some(entry)) = dense.get_mut(pos as usize) else {
                return;
            };
            if keep(entry.id, &mut entry.value) {
                pos += 1;
            } else {
                // The last entry moves into `pos`; visit it next.
                drop(self.remove_at(pos));
            }
        }
    }

    /// Removes every entry; all their ids go stale. O(live).
    pub fn clear(&mut self) {
        while self.len > 0 {
            drop(self.remove_at(self.len - 1));
        }
    }

    // Dense position of a live `id`.
    #[inline]
    fn position(&self, id: Id) -> Option<u32> {
        let (slots, dense) = self.store.parts();
        let pos = slots.get(id.index as usize)?.link;
        // A vacant slot's link is a free-list pointer; the id check rejects it
        // because live ids are unique and none of them names a vacant slot.
        match dense.get(pos as usize)? {
            Some(entry) if entry.id == id => Some(pos),
            _ => None,
        }
    }

    // Swap-removes the live entry at `pos` and frees its slot.
    #[inline]
    fn remove_at(&mut self, pos: u32) -> Option<Entry<T>> {
        if pos >= self.len {
            return None;
        }
        let last = self.len - 1;
        let (slots, dense) = self.store.parts_mut();
        dense.swap(pos as usize, last as usize);
        let entry = dense.get_mut(last as usize)?.take()?;
        if pos != last {
            let moved = dense.get(pos as usize)?.as_ref()?.id;
            slots.get_mut(moved.index as usize)?.link = pos;
        }
        self.len = last;
        let slot = slots.get_mut(entry.id.index as usize)?;
        match slot.generation.checked_add(1) {
            Some(next) => {
                slot.generation = next;
                slot.link = self.free;
                self.free = entry.id.index;
            }
            None => {
                // Reissuing generation 0 could alias an id from 2^32 joins ago.
                slot.link = NONE;
                log::warn!(
                    "subscriber slot {} retired after 2^32 joins",
                    entry.id.index
                );
            }
        }
        Some(entry)
    }
}

impl<T: fmt::Debug, S: Storage<T>> fmt::Debug for Table<T, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

/// Iterator over a table's live entries (from [`Table::iter`]).
pub struct Iter<'a, T> {
    inner: core::slice::Iter<'a, Option<Entry<T>>>,
}

impl<'a, T> Iterator for Iter<'a, T> {
    type Item = (Id, &'a T);

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        // Every cell below `len` is occupied; `flatten` is just the safe unwrap.
        self.inner
            .by_ref()
            .flatten()
            .next()
            .map(|e| (e.id, &e.value))
    }

    #[inline]
    fn size_hint(&self) -> (usize, Option<usize>) {
        self.inner.size_hint()
    }
}

impl<T> ExactSizeIterator for Iter<'_, T> {}
impl<T> core::iter::FusedIterator for Iter<'_, T> {}

/// Mutable iterator over a table's live entries (from [`Table::iter_mut`]).
pub struct IterMut<'a, T> {
    inner: core::slice::IterMut<'a, Option<Entry<T>>>,
}

impl<'a, T> Iterator for IterMut<'a, T> {
    type Item = (Id, &'a mut T);

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        self.inner
            .by_ref()
            .flatten()
            .next()
            .map(|e| (e.id, &mut e.value))
    }

    #[inline]
    fn size_hint(&self) -> (usize, Option<usize>) {
        self.inner.size_hint()
    }
}

impl<T> ExactSizeIterator for IterMut<'_, T> {}
impl<T> core::iter::FusedIterator for IterMut<'_, T> {}

impl<'a, T, S: Storage<T>> IntoIterator for &'a Table<T, S> {
    type Item = (Id, &'a T);
    type IntoIter = Iter<'a, T>;

    fn into_iter(self) -> Iter<'a, T> {
        self.iter()
    }
}

impl<'a, T, S: Storage<T>> IntoIterator for &'a mut Table<T, S> {
    type Item = (Id, &'a mut T);
    type IntoIter = IterMut<'a, T>;

    fn into_iter(self) -> IterMut<'a, T> {
        self.iter_mut()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;
    use std::string::ToString;
    use std::vec::Vec;

    fn sorted<T: Copy + Ord, S: Storage<T>>(t: &Table<T, S>) -> Vec<T> {
        let mut v: Vec<T> = t.iter().map(|(_, v)| *v).collect();
        v.sort();
        v
    }

    // ---- join / leave / get ----

    #[test]
    fn join_get_leave() {
        let mut t = Subscribers::<u32, 4>::new();
        assert!(t.is_empty());
        assert_eq!(t.capacity(), 4);
        let a = t.join(10).unwrap();
        let b = t.join(20).unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t.get(a), Some(&10));
        *t.get_mut(b).unwrap() += 1;
        assert_eq!(t.get(b), Some(&21));
        assert_eq!(t.leave(a), Some(10));
        assert_eq!(t.leave(a), None);
        assert_eq!(t.get(b), Some(&21));
        assert_eq!(t.len(), 1);
        assert!(t.contains(b));
        assert!(!t.contains(a));
    }

    #[test]
    fn stale_id_never_aliases_a_new_entry() {
        let mut t = Subscribers::<u32, 2>::new();
        let a = t.join(1).unwrap();
        t.leave(a).unwrap();
        let b = t.join(2).unwrap();
        assert_eq!(a.index(), b.index(), "slot reused");
        assert_ne!(a.generation(), b.generation());
        assert_eq!(t.get(a), None);
        assert_eq!(t.get_mut(a), None);
        assert_eq!(t.leave(a), None);
        assert_eq!(t.get(b), Some(&2));
    }

    #[test]
    fn forged_ids_are_rejected() {
        let mut t = Subscribers::<u32, 4>::new();
        let a = t.join(1).unwrap();
        t.join(2).unwrap();
        t.leave(a).unwrap();
        // Vacant slot with its current generation: its link is a free-list pointer.
        let forged = Id {
            index: a.index,
            generation: a.generation + 1,
        };
        assert_eq!(t.get(forged), None);
        assert_eq!(t.leave(forged), None);
        for index in [2, 3, 4, u32::MAX] {
            assert_eq!(
                t.get(Id {
                    index,
                    generation: 0
                }),
                None
            );
        }
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn full_table_refuses_and_is_unchanged() {
        let mut t = Subscribers::<u32, 3>::new();
        let ids: Vec<Id> = (0..3).map(|v| t.join(v).unwrap()).collect();
        assert!(t.is_full());
        assert_eq!(t.join(99), Err(TableFull));
        assert_eq!(t.len(), 3);
        assert_eq!(sorted(&t), [0, 1, 2]);
        t.leave(ids[1]).unwrap();
        assert!(!t.is_full());
        let d = t.join(7).unwrap();
        assert_eq!(t.get(d), Some(&7));
        assert_eq!(t.join(8), Err(TableFull));
        assert_eq!(TableFull.to_string(), "subscriber table is full");
    }

    #[test]
    fn zero_capacity_is_always_full() {
        let mut t = Subscribers::<u32, 0>::new();
        assert!(t.is_full());
        assert_eq!(t.join(1), Err(TableFull));
        assert_eq!(t.iter().count(), 0);
    }

    #[test]
    fn generation_wrap_retires_the_slot() {
        let mut t = Subscribers::<u32, 2>::new();
        let a = t.join(1).unwrap();
        t.leave(a).unwrap();
        // Pretend slot 0 has been through 2^32 - 1 joins.
        t.store.slots[0].generation = u32::MAX;
        let b = t.join(2).unwrap();
        assert_eq!((b.index(), b.generation()), (0, u32::MAX));
        t.leave(b).unwrap();
        // Slot 0 is never reissued; slot 1 is, then the table is full.
        let c = t.join(3).unwrap();
        assert_eq!(c.index(), 1);
        assert_eq!(t.join(4), Err(TableFull));
        assert_eq!(t.get(b), None);
        assert_eq!(
            t.get(Id {
                index: 0,
                generation: 0
            }),
            None
        );
    }

    // ---- iteration ----

    #[test]
    fn iteration_after_churn_sees_exactly_the_live_entries() {
        let mut t = Subscribers::<u32, 8>::new();
        let ids: Vec<Id> = (0..8).map(|v| t.join(v).unwrap()).collect();
        for &i in &[0usize, 3, 7, 4] {
            t.leave(ids[i]).unwrap();
        }
        let x = t.join(100).unwrap();
        assert_eq!(sorted(&t), [1, 2, 5, 6, 100]);
        assert_eq!(t.iter().len(), 5);
        for (id, v) in &t {
            assert_eq!(t.get(id), Some(v));
        }
        for (_, v) in t.iter_mut() {
            *v += 1;
        }
        assert_eq!(sorted(&t), [2, 3, 6, 7, 101]);
        assert_eq!(t.get(x), Some(&101));
    }

    #[test]
    fn retain_visits_each_entry_once() {
        let mut t = Subscribers::<u32, 8>::new();
        let ids: Vec<Id> = (0..8).map(|v| t.join(v).unwrap()).collect();
        let mut seen = Vec::new();
        t.retain(|_, v| {
            seen.push(*v);
            *v % 3 != 0
        });
        seen.sort();
        assert_eq!(seen, (0..8).collect::<Vec<_>>());
        assert_eq!(sorted(&t), [1, 2, 4, 5, 7]);
        assert_eq!(t.get(ids[3]), None);
        assert_eq!(t.get(ids[4]), Some(&4));
        t.clear();
        assert!(t.is_empty());
        assert_eq!(t.get(ids[4]), None);
        // Every slot is reusable after clear.
        for v in 0..8 {
            t.join(v).unwrap();
        }
        assert!(t.is_full());
    }

    #[test]
    fn debug_lists_entries() {
        let mut t = Subscribers::<u32, 2>::new();
        t.join(5).unwrap();
        assert_eq!(std::format!("{t:?}"), "{Id(0v0): 5}");
    }

    // ---- large tables ----

    // `new` is const: a 10,000-entry table can be built at compile time.
    static BIG: Subscribers<u64, 10_000> = Subscribers::new();

    #[test]
    fn const_table_needs_no_stack() {
        assert_eq!(BIG.capacity(), 10_000);
        assert!(BIG.is_empty());
    }

    #[test]
    fn inline_10k_churn_on_a_big_stack() {
        // An inline table is one large value; give the thread room for it.
        let worker = std::thread::Builder::new().stack_size(32 << 20).spawn(|| {
            let mut t = Subscribers::<[u64; 4], 10_000>::new();
            let ids: Vec<Id> = (0..10_000u64).map(|v| t.join([v; 4]).unwrap()).collect();
            assert!(t.is_full());
            for id in ids.iter().step_by(2) {
                t.leave(*id).unwrap();
            }
            assert_eq!(t.len(), 5_000);
            assert_eq!(t.iter().map(|(_, v)| v[0] % 2).sum::<u64>(), 5_000);
        });
        worker.unwrap().join().unwrap();
    }

    #[test]
    fn boxed_10k_on_a_small_stack() {
        // 10,000 entries of 64 bytes is ~800 KB; the thread has 128 KiB of stack.
        let worker = std::thread::Builder::new().stack_size(128 << 10).spawn(|| {
            let mut t = BoxedSubscribers::<[u64; 8], 10_000>::new();
            for v in 0..10_000u64 {
                t.join([v; 8]).unwrap();
            }
            assert_eq!(t.join([0; 8]), Err(TableFull));
            t.retain(|_, v| v[0] < 10);
            assert_eq!(t.len(), 10);
        });
        worker.unwrap().join().unwrap();
    }

    // ---- model check ----

    #[derive(Clone, Debug)]
    enum Op {
        Join(u32),
        // Index into every id ever issued (may be stale).
        Leave(usize),
        Bump(usize),
        RetainOdd,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => any::<u32>().prop_map(Op::Join),
            3 => any::<usize>().prop_map(Op::Leave),
            2 => any::<usize>().prop_map(Op::Bump),
            1 => Just(Op::RetainOdd),
        ]
    }

    proptest! {
        #[test]
        fn agrees_with_hashmap(ops in proptest::collection::vec(op(), 0..200)) {
            const N: usize = 8;
            let mut t = Subscribers::<u32, N>::new();
            let mut model: HashMap<Id, u32> = HashMap::new();
            let mut issued: Vec<Id> = Vec::new();
            for op in ops {
                match op {
                    Op::Join(v) => match t.join(v) {
                        Ok(id) => {
                            prop_assert!(model.len() < N);
                            prop_assert!(!issued.contains(&id), "ids are never reissued");
                            model.insert(id, v);
                            issued.push(id);
                        }
                        Err(TableFull) => prop_assert_eq!(model.len(), N),
                    },
                    Op::Leave(i) if !issued.is_empty() => {
                        let id = issued[i % issued.len()];
                        prop_assert_eq!(t.leave(id), model.remove(&id));
                    }
                    Op::Bump(i) if !issued.is_empty() => {
                        let id = issued[i % issued.len()];
                        if let Some(v) = t.get_mut(id) {
                            *v = v.wrapping_add(1);
                        }
                        if let Some(v) = model.get_mut(&id) {
                            *v = v.wrapping_add(1);
                        }
                    }
                    Op::RetainOdd => {
                        t.retain(|_, v| *v % 2 == 1);
                        model.retain(|_, v| *v % 2 == 1);
                    }
                    _ => {}
                }
                prop_assert_eq!(t.len(), model.len());
                prop_assert_eq!(t.is_full(), model.len() == N);
                let live: HashMap<Id, u32> = t.iter().map(|(id, v)| (id, *v)).collect();
                prop_assert_eq!(&live, &model);
                for id in &issued {
                    prop_assert_eq!(t.get(*id), model.get(id));
                }
            }
        }
    }
}
