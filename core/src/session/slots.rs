//! Fixed tables of slots with a watermark, so that a scan costs what is in use.
//!
//! A session's tables (control streams, served subscriptions, our
//! subscriptions, group streams out and in) are sized for the worst case, and
//! the session walks them on every pass. [`Slots`] remembers a watermark: every
//! slot at or past [`Slots::span`] is free, so the walks stop there. Slots are
//! taken lowest first, which keeps the used ones packed at the front.
//!
//! The watermark only grows through a mutable access (any `&mut` to a slot past
//! it moves it up), so no write can hide a used slot past it; [`Slots::trim`]
//! moves it back down over trailing free slots.

use core::ops::{Index, IndexMut};

use super::control::Control;

/// A table entry that can be free.
pub(super) trait Slot {
    /// True if the slot holds nothing.
    fn is_free(&self) -> bool;
}

impl<T> Slot for Option<T> {
    fn is_free(&self) -> bool {
        self.is_none()
    }
}

impl Slot for Control {
    fn is_free(&self) -> bool {
        self.kind == super::control::Kind::Free
    }
}

/// A borrowed table of slots whose used entries all lie below a watermark.
pub(super) struct Slots<'s, T> {
    items: &'s mut [T],
    /// Every slot at this index or past it is free.
    span: usize,
}

impl<'s, T: Slot> Slots<'s, T> {
    /// A table over `items`, which must all be free.
    pub(super) fn new(items: &'s mut [T]) -> Self {
        debug_assert!(items.iter().all(Slot::is_free));
        Slots { items, span: 0 }
    }

    /// How many slots the table has.
    pub(super) fn capacity(&self) -> usize {
        self.items.len()
    }

    /// One past the highest slot that may be in use: scans stop here.
    pub(super) fn span(&self) -> usize {
        self.span
    }

    /// The slots that may be in use, in index order.
    pub(super) fn iter(&self) -> core::slice::Iter<'_, T> {
        self.items[..self.span].iter()
    }

    /// The slots that may be in use, writable (a free one may be filled: it is
    /// below the watermark already).
    pub(super) fn iter_mut(&mut self) -> core::slice::IterMut<'_, T> {
        self.items[..self.span].iter_mut()
    }

    /// The slots that may be in use, as one writable slice (to reorder them;
    /// the watermark stays where it is).
    pub(super) fn as_mut_slice(&mut self) -> &mut [T] {
        &mut self.items[..self.span]
    }

    /// Slot `i`, if the table has it.
    pub(super) fn get(&self, i: usize) -> Option<&T> {
        self.items.get(i)
    }

    /// Slot `i`, writable, if the table has it; the watermark moves past it.
    pub(super) fn get_mut(&mut self, i: usize) -> Option<&mut T> {
        let item = self.items.get_mut(i)?;
        self.span = self.span.max(i + 1);
        Some(item)
    }

    /// The lowest free slot, if any.
    pub(super) fn first_free(&self) -> Option<usize> {
        match self.iter().position(Slot::is_free) {
            Some(i) => Some(i),
            None => (self.span < self.items.len()).then_some(self.span),
        }
    }

    /// How many slots are free.
    pub(super) fn free_count(&self) -> usize {
        self.items.len() - self.span + self.iter().filter(|s| s.is_free()).count()
    }

    /// Moves the entries below the watermark into `items` (all free, and at
    /// least [`Slots::span`] of them) and goes on over `items`; the old
    /// slots are left free.
    pub(super) fn move_to(&mut self, items: &'s mut [T]) {
        debug_assert!(items.len() >= self.span);
        debug_assert!(items.iter().all(Slot::is_free));
        for (old, new) in self.items[..self.span].iter_mut().zip(items.iter_mut()) {
            core::mem::swap(old, new);
        }
        self.items = items;
    }

    /// Moves the watermark down over trailing free slots.
    pub(super) fn trim(&mut self) {
        while self.span > 0 && self.items[self.span - 1].is_free() {
            self.span -= 1;
        }
    }
}

impl<T> Index<usize> for Slots<'_, T> {
    type Output = T;

    fn index(&self, i: usize) -> &T {
        &self.items[i]
    }
}

impl<T> IndexMut<usize> for Slots<'_, T> {
    fn index_mut(&mut self, i: usize) -> &mut T {
        let item = &mut self.items[i];
        self.span = self.span.max(i + 1);
        item
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scans_stop_at_the_highest_used_slot() {
        let mut items = [None::<u32>; 8];
        let mut t = Slots::new(&mut items);
        assert_eq!((t.span(), t.first_free(), t.free_count()), (0, Some(0), 8));
        let a = t.first_free().unwrap();
        t[a] = Some(1);
        let b = t.first_free().unwrap();
        t[b] = Some(2);
        let c = t.first_free().unwrap();
        t[c] = Some(3);
        assert_eq!((a, b, c, t.span()), (0, 1, 2, 3));
        // A hole below the watermark is reused first.
        t[1] = None;
        t.trim();
        assert_eq!((t.span(), t.first_free(), t.free_count()), (3, Some(1), 6));
        assert!(t.iter().flatten().copied().eq([1, 3]));
        // Freeing the top lets the watermark fall past every trailing hole.
        t[2] = None;
        t.trim();
        assert_eq!(t.span(), 1);
        t[0] = None;
        t.trim();
        assert_eq!(t.span(), 0);
    }

    #[test]
    fn any_write_access_covers_its_slot() {
        let mut items = [None::<u32>; 4];
        let mut t = Slots::new(&mut items);
        *t.get_mut(3).unwrap() = Some(7);
        assert_eq!(t.span(), 4);
        assert_eq!(t.iter().flatten().count(), 1);
        assert!(t.get_mut(4).is_none());
        assert_eq!(t.span(), 4);
        for s in t.iter_mut() {
            *s = None;
        }
        t.trim();
        assert_eq!(t.span(), 0);
    }

    #[test]
    fn a_full_table_has_no_free_slot() {
        let mut items = [None::<u8>; 2];
        let mut t = Slots::new(&mut items);
        t[0] = Some(0);
        t[1] = Some(1);
        assert_eq!((t.first_free(), t.free_count()), (None, 0));
    }
}
