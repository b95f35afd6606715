//! The fixed table sizes a moq-lite endpoint on this runtime is built with
//! (tracks per broadcast, groups per track, block size), and [`Keep`], the
//! owner of those tables' storage: block pools and slices that borrow each
//! other for as long as their owner (a relay worker, a client context) lives.

use skiff_core::pool::{BlockMeta, Pool};

/// Tracks per broadcast (a relay's, a client's).
pub const TRACKS: usize = 64;
/// Groups a track holds at once.
pub const GROUPS: usize = 32;
/// Bytes per pool block.
pub(crate) const BLOCK_BYTES: usize = 16384;

/// The blocks of a pool of about `bytes` bytes (at least 64).
pub fn pool_blocks(bytes: u64) -> usize {
    usize::try_from(bytes / BLOCK_BYTES as u64)
        .unwrap_or(usize::MAX)
        .clamp(64, (u32::MAX / 2) as usize)
}

/// One allocation a [`Keep`] owns.
struct Held {
    /// Frees the allocation (runs once, when the keep drops).
    free: Box<dyn FnOnce()>,
    /// Tells, before anything is freed, whether something still uses it.
    busy: Option<Box<dyn Fn() -> bool>>,
}

/// The owner of a std endpoint's tables and pools.
///
/// The core's tables, pools and origins borrow caller storage (right for
/// firmware, whose storage is `static`), and a monoio task that uses them
/// must be `'static`. A `Keep` allocates that storage, hands out `'static`
/// references to it, and frees it when it drops, in the reverse order of
/// making (a table before the slots it borrows, a pool before its blocks).
///
/// The core has no owned variant: its `'a` (tables) and `'p` (pool)
/// lifetimes thread through every track, broadcast and session, and the
/// tasks that hold them must be `'static`, so an owned table inside the core
/// would still need an owner outside it that outlives every task. That owner
/// is this type, held by the value whose handles every such task keeps.
///
/// A check given with [`Keep::guard`] runs in its place in that order, and
/// tells whether what was made before it is still used (a pool's blocks out,
/// a table's tracks still read); if so, the keep frees nothing more: memory
/// something may still reach stays allocated. References the core does not
/// count (a `track::Ref`, an `origin::Ref`) are the owner's to keep from
/// outliving it.
#[derive(Default)]
pub struct Keep {
    /// What the keep owns, in the order it was made.
    held: Vec<Held>,
    /// Set by [`Keep::keep_forever`]: nothing is freed.
    forever: bool,
}

impl std::fmt::Debug for Keep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keep")
            .field("allocations", &self.held.len())
            .field("forever", &self.forever)
            .finish()
    }
}

impl Keep {
    /// An empty keep.
    pub fn new() -> Self {
        Keep::default()
    }

    /// Moves `value` to the heap for as long as the keep lives.
    ///
    /// # Safety
    /// The reference (and everything made from it) must not be used once the
    /// keep has dropped: the caller makes sure that what holds it is dropped
    /// first, or that a [`Keep::guard`] check reports it.
    pub unsafe fn hold<T: 'static>(&mut self, value: T) -> &'static T {
        let ptr = Box::into_raw(Box::new(value));
        self.held.push(Held {
            // SAFETY: `ptr` came from `Box::into_raw` above and is freed
            // only here, once.
            free: Box::new(move || drop(unsafe { Box::from_raw(ptr) })),
            busy: None,
        });
        // SAFETY: `ptr` points to a live, initialized `T` that stays where it
        // is until the keep drops; the caller keeps the reference from
        // outliving it (this function's contract).
        unsafe { &*ptr }
    }

    /// `n` values of `make()` in a slice, for as long as the keep lives.
    ///
    /// # Safety
    /// As [`Keep::hold`].
    pub unsafe fn slice<T: 'static>(&mut self, n: usize, make: impl FnMut() -> T) -> &'static [T] {
        // SAFETY: the same contract, passed on to the caller.
        unsafe { self.slice_mut(n, make) }
    }

    /// As [`Keep::slice`], mutable (a pool's bytes and metadata).
    ///
    /// # Safety
    /// As [`Keep::hold`].
    unsafe fn slice_mut<T: 'static>(
        &mut self,
        n: usize,
        make: impl FnMut() -> T,
    ) -> &'static mut [T] {
        let boxed: Box<[T]> = std::iter::repeat_with(make).take(n).collect();
        // SAFETY: the same contract, passed on to the caller.
        unsafe { self.own_mut(boxed) }
    }

    /// Takes `boxed` for as long as the keep lives.
    ///
    /// # Safety
    /// As [`Keep::hold`].
    unsafe fn own_mut<T: 'static>(&mut self, boxed: Box<[T]>) -> &'static mut [T] {
        let ptr = Box::into_raw(boxed);
        self.held.push(Held {
            // SAFETY: `ptr` came from `Box::into_raw` above and is freed
            // only here, once.
            free: Box::new(move || drop(unsafe { Box::from_raw(ptr) })),
            busy: None,
        });
        // SAFETY: `ptr` is the only pointer to the live slice, which stays
        // where it is until the keep drops; the caller keeps the reference
        // from outliving it (this function's contract).
        unsafe { &mut *ptr }
    }

    /// A block pool of about `bytes` bytes, with `spare` more metadata slots
    /// (no bytes) for blocks lent by other workers (a relay's links lend each
    /// other blocks). The keep frees nothing while a block of the pool is out.
    ///
    /// # Safety
    /// As [`Keep::hold`].
    ///
    /// # Panics
    /// Never for `bytes` up to `u32::MAX` blocks; smaller sizes are raised to 64 blocks.
    pub unsafe fn pool_with_spare(&mut self, bytes: u64, spare: usize) -> &'static Pool<'static> {
        let spare = spare.min((u32::MAX / 2) as usize - 1);
        // SAFETY: the caller's contract.
        unsafe { self.pool_of_blocks(pool_blocks(bytes), BLOCK_BYTES, spare) }
    }

    /// A block pool of `blocks` blocks of `block_bytes` bytes and `spare`
    /// more metadata slots; the keep frees nothing while a block of it is out.
    ///
    /// # Safety
    /// As [`Keep::hold`].
    ///
    /// # Panics
    /// If the layout is not one the core's pool takes (no block, or more
    /// than `u32::MAX / 2` slots).
    pub unsafe fn pool_of_blocks(
        &mut self,
        blocks: usize,
        block_bytes: usize,
        spare: usize,
    ) -> &'static Pool<'static> {
        // The bytes come zeroed from the allocator (one `calloc`, whose pages
        // the kernel maps at first use), not written one by one: a cache of
        // hundreds of MiB is ready at once in every build profile.
        let bytes = vec![0u8; blocks * block_bytes].into_boxed_slice();
        // SAFETY: the three allocations are freed in reverse (the pool before
        // the bytes and metadata it borrows); the rest is the caller's contract.
        let (data, meta) = unsafe {
            (
                self.own_mut(bytes),
                self.slice_mut(blocks + spare, BlockMeta::new),
            )
        };
        let pool = match Pool::from_parts_with_spare(data, meta, spare) {
            Ok(p) => p,
            Err(e) => panic!("pool layout: {e}"),
        };
        // SAFETY: as above.
        let pool = unsafe { self.hold(pool) };
        self.guard(move || pool.in_use() != 0);
        pool
    }

    /// A block pool of about `bytes` bytes: [`Keep::pool_with_spare`] without spare slots.
    ///
    /// # Safety
    /// As [`Keep::hold`].
    pub unsafe fn pool(&mut self, bytes: u64) -> &'static Pool<'static> {
        // SAFETY: the caller's contract.
        unsafe { self.pool_with_spare(bytes, 0) }
    }

    /// Adds a check the keep makes when it drops, after freeing what was made
    /// after this call and before freeing what was made before: `busy` tells
    /// whether that storage is still used (it may also let go of what only
    /// the keep's own tables still hold, such as retired tracks).
    pub fn guard(&mut self, busy: impl Fn() -> bool + 'static) {
        self.held.push(Held {
            free: Box::new(|| {}),
            busy: Some(Box::new(busy)),
        });
    }

    /// Frees nothing when the keep drops: for storage that something the keep
    /// cannot see may still reach (blocks lent to another thread).
    pub fn keep_forever(&mut self) {
        self.forever = true;
    }

    /// Whether no check reports its storage busy now and
    /// [`Keep::keep_forever`] was not called. Runs the checks.
    #[cfg(test)]
    fn can_free(&self) -> bool {
        !self.forever
            && !self
                .held
                .iter()
                .rev()
                .any(|h| h.busy.as_ref().is_some_and(|b| b()))
    }
}

impl Drop for Keep {
    fn drop(&mut self) {
        while let Some(h) = self.held.pop() {
            if self.forever || h.busy.as_ref().is_some_and(|b| b()) {
                // Something may still reach this storage, or what was made
                // before it (which it may borrow): that stays allocated.
                // Dropping a record without calling it frees only the record.
                self.held.clear();
                return;
            }
            (h.free)();
        }
    }
}

/// A block pool of about `bytes` bytes that lives for the rest of the
/// process (the crate's tests; other crates' tests use
/// `skiff_testkit::client::process_pool`).
///
/// # Panics
/// As [`Keep::pool_with_spare`].
#[cfg(test)]
pub(crate) fn process_pool(bytes: u64) -> &'static Pool<'static> {
    let mut keep = Keep::new();
    // SAFETY: the keep never frees (`keep_forever`), so the pool lives for
    // the rest of the process.
    let pool = unsafe { keep.pool(bytes) };
    keep.keep_forever();
    pool
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::rc::Rc;

    /// Counts the drops of its values.
    struct Counted(Rc<Cell<u32>>, &'static [u32]);

    impl Drop for Counted {
        fn drop(&mut self) {
            // Reads the slice it borrows: it must still be there.
            self.0.set(self.0.get() + self.1.iter().sum::<u32>());
        }
    }

    #[test]
    fn a_check_runs_in_its_place() {
        let dropped = Rc::new(Cell::new(0));
        let seen = Rc::new(Cell::new(u32::MAX));
        {
            let mut keep = Keep::new();
            // SAFETY: nothing outside the keep uses its storage.
            let s = unsafe { keep.slice(1, || 4u32) };
            let (d, seen) = (dropped.clone(), seen.clone());
            keep.guard(move || {
                seen.set(d.get());
                false
            });
            // SAFETY: as above.
            unsafe { keep.hold(Counted(dropped.clone(), s)) };
        }
        assert_eq!(
            seen.get(),
            4,
            "the value made after the check was freed first"
        );
        assert_eq!(dropped.get(), 4);
    }

    #[test]
    fn frees_in_reverse_once_nothing_is_out() {
        let dropped = Rc::new(Cell::new(0));
        {
            let mut keep = Keep::new();
            // SAFETY: every reference is dropped before the keep.
            let s = unsafe { keep.slice(3, || 1u32) };
            // SAFETY: as above.
            let c = unsafe { keep.hold(Counted(dropped.clone(), s)) };
            // SAFETY: as above.
            let pool = unsafe { keep.pool(0) };
            let mut block = pool.alloc().unwrap();
            block.append(b"abc");
            assert!(!keep.can_free(), "a block is out");
            drop(block);
            assert!(keep.can_free());
            assert_eq!(c.1.len(), 3);
        }
        assert_eq!(dropped.get(), 3, "dropped once, its slice still there");
    }

    #[test]
    #[cfg_attr(miri, ignore = "leaks by design: a busy keep never frees")]
    fn a_busy_check_keeps_what_was_made_before_it() {
        let dropped = Rc::new(Cell::new(0));
        let block;
        {
            let mut keep = Keep::new();
            // SAFETY: the block outlives the keep, which then frees nothing
            // made before the pool's check.
            let s = unsafe { keep.slice(2, || 5u32) };
            // SAFETY: as above.
            unsafe { keep.hold(Counted(dropped.clone(), s)) };
            // SAFETY: as above.
            let pool = unsafe { keep.pool(0) };
            let mut b = pool.alloc().unwrap();
            b.append(b"still here");
            block = b.into_shared();
        }
        assert_eq!(
            dropped.get(),
            0,
            "nothing before the pool freed while a block is out"
        );
        assert_eq!(block.data(), b"still here");
    }
}
