//! Building a pool over its storage and its O(1) allocator: the free list,
//! the watermark of never-used blocks, reference counts, and freeing chains
//! without recursion.

use core::cell::Cell;
use core::fmt;
use core::marker::PhantomData;
use core::ptr::NonNull;

use super::{Block, BlockMeta, BlockMut, NONE, Pool, PoolError, PoolStorage};

impl<'s> Pool<'s> {
    /// A pool over `storage`, all of its blocks free.
    ///
    /// The pool borrows the storage exclusively for its whole life; building a
    /// new pool over the same storage later starts from scratch.
    pub fn new<const BLOCKS: usize, const BLOCK_SIZE: usize>(
        storage: &'s mut PoolStorage<BLOCKS, BLOCK_SIZE>,
    ) -> Self {
        let () = PoolStorage::<BLOCKS, BLOCK_SIZE>::LAYOUT_OK;
        let PoolStorage { meta, bytes } = storage;
        let base = NonNull::from(bytes.get_mut()).cast::<u8>();
        Self::build(base, meta, BLOCK_SIZE, BLOCKS)
    }

    /// A pool over caller-provided slices whose size is only known at run time (a relay's
    /// configuration): `meta.len()` blocks of `bytes.len() / meta.len()` bytes each.
    ///
    /// Trailing bytes that do not fill a whole block are unused.
    ///
    /// # Errors
    /// [`PoolError::InvalidLayout`] if `meta` is empty or holds `u32::MAX` or more
    /// entries, or if the block size would be 0 or above `u32::MAX`.
    pub fn from_parts(bytes: &'s mut [u8], meta: &'s mut [BlockMeta]) -> Result<Self, PoolError> {
        Self::from_parts_with_spare(bytes, meta, 0)
    }

    pub(super) fn build(
        base: NonNull<u8>,
        meta: &'s [BlockMeta],
        block_size: usize,
        blocks: usize,
    ) -> Self {
        // Fits u32: `meta.len() < NONE` (checked by `from_parts_with_spare`,
        // and by `PoolStorage::LAYOUT_OK` for `new`).
        let capacity = blocks as u32;
        Pool {
            base,
            meta,
            block_size,
            free: Cell::new(NONE),
            released: Cell::new(NONE),
            capacity,
            free_spare: Cell::new(NONE),
            fresh_spare: Cell::new(capacity),
            spare_in_use: Cell::new(0),
            fresh: Cell::new(0),
            in_use: Cell::new(0),
            high_water: Cell::new(0),
            exhausted: Cell::new(0),
            _bytes: PhantomData,
        }
    }

    /// Takes a free block and returns its one writer handle; the block starts empty.
    ///
    /// # Errors
    /// [`PoolError::Exhausted`] when every block is in use (counted in
    /// [`Pool::exhausted_count`]); nothing changes otherwise.
    pub fn alloc(&self) -> Result<BlockMut<'_>, PoolError> {
        let idx = match self.pop_free() {
            Some(idx) => idx,
            None => {
                self.exhausted.set(self.exhausted.get().saturating_add(1));
                return Err(PoolError::Exhausted);
            }
        };
        self.take_meta(idx, 0, None, NONE, 0);
        Ok(BlockMut {
            block: Block { pool: self, idx },
        })
    }

    /// Marks slot `idx` allocated with one reference and the given contents.
    pub(super) fn take_meta(
        &self,
        idx: u32,
        len: u32,
        ext: Option<NonNull<u8>>,
        owner: u32,
        token: u64,
    ) {
        let m = &self.meta[idx as usize];
        m.refs.set(1);
        m.len.set(len);
        m.next.set(NONE);
        m.ext.set(ext);
        m.owner.set(owner);
        m.token.set(token);
        m.generation.set(m.generation.get().wrapping_add(1));
        if idx >= self.capacity {
            self.spare_in_use.set(self.spare_in_use.get() + 1);
            return;
        }
        let n = self.in_use.get() + 1;
        self.in_use.set(n);
        if n > self.high_water.get() {
            self.high_water.set(n);
        }
    }

    /// Returns slot `idx` to the free list.
    pub(super) fn push_free(&self, idx: u32) {
        let m = &self.meta[idx as usize];
        m.len.set(0);
        m.ext.set(None);
        if idx >= self.capacity {
            self.push(&self.free_spare, idx);
            self.spare_in_use.set(self.spare_in_use.get() - 1);
        } else {
            self.push(&self.free, idx);
            self.in_use.set(self.in_use.get() - 1);
        }
    }

    /// Puts slot `idx` at the head of `list` (threaded through `next`).
    pub(super) fn push(&self, list: &Cell<u32>, idx: u32) {
        self.meta[idx as usize].next.set(list.get());
        list.set(idx);
    }

    /// Takes the head of `list`, else the next never-used slot below `end`
    /// from the watermark `fresh`.
    pub(super) fn pop(&self, list: &Cell<u32>, fresh: &Cell<u32>, end: u32) -> Option<u32> {
        let head = list.get();
        if head != NONE {
            list.set(self.meta[head as usize].next.get());
            return Some(head);
        }
        let next = fresh.get();
        if next < end {
            fresh.set(next + 1);
            return Some(next);
        }
        None
    }

    /// Checks that `blocks` allocations in a row will succeed, so a caller can
    /// make an all-or-nothing write.
    ///
    /// The pool is single-threaded: nothing can allocate between this check and
    /// the caller's allocations as long as the caller does not yield in between.
    ///
    /// # Errors
    /// [`PoolError::Exhausted`] if fewer than `blocks` are free (counted in
    /// [`Pool::exhausted_count`]).
    pub fn try_reserve(&self, blocks: usize) -> Result<(), PoolError> {
        if blocks <= self.available() {
            Ok(())
        } else {
            self.exhausted.set(self.exhausted.get().saturating_add(1));
            Err(PoolError::Exhausted)
        }
    }

    /// Total number of blocks with bytes.
    pub fn capacity(&self) -> usize {
        self.capacity as usize
    }

    /// Bytes per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks currently allocated.
    pub fn in_use(&self) -> usize {
        self.in_use.get() as usize
    }

    /// Blocks currently free.
    pub fn available(&self) -> usize {
        self.capacity() - self.in_use()
    }

    /// The largest [`Pool::in_use`] seen since the pool was built.
    pub fn high_water(&self) -> usize {
        self.high_water.get() as usize
    }

    /// How many allocations (or reservations) found too few free blocks.
    pub fn exhausted_count(&self) -> u64 {
        self.exhausted.get()
    }

    pub(super) fn pop_free(&self) -> Option<u32> {
        self.pop(&self.free, &self.fresh, self.capacity)
    }

    /// Drops one reference to `idx`; frees it, and then each successor whose last
    /// reference was the link, in a loop.
    ///
    /// A freed piece also drops its reference to its foreign block; a freed
    /// foreign block goes to the released list. Foreign blocks have no
    /// successor (they are never writers) and pieces are never owners, so that
    /// inner release ends at once: no recursion.
    pub(super) fn release(&self, mut idx: u32) {
        loop {
            let m = &self.meta[idx as usize];
            let refs = m.refs.get();
            debug_assert!(refs > 0, "release of a free block");
            m.refs.set(refs - 1);
            if refs > 1 {
                return;
            }
            let next = m.next.get();
            let owner = m.owner.get();
            if m.ext.get().is_some() && owner == NONE {
                // A foreign block: its token goes back through `take_released`.
                self.push(&self.released, idx);
            } else {
                self.push_free(idx);
            }
            if owner != NONE {
                m.owner.set(NONE);
                self.release_owner(owner);
            }
            if next == NONE {
                return;
            }
            idx = next;
        }
    }

    pub(super) fn acquire(&self, idx: u32) {
        let m = &self.meta[idx as usize];
        // Like `Rc`, a count that would wrap is a bug (4 billion leaked handles);
        // wrapping would free a block still in use, so stop instead.
        let refs = m
            .refs
            .get()
            .checked_add(1)
            .expect("block reference count overflow");
        m.refs.set(refs);
    }

    /// Start of block `idx`'s bytes.
    pub(super) fn block_ptr(&self, idx: u32) -> *mut u8 {
        debug_assert!(idx < self.capacity, "bytes of a spare slot");
        // SAFETY: every index handed to this function comes from `pop_free`, so
        // `idx < capacity`, and `capacity * block_size` bytes starting at `base`
        // belong to the storage this pool borrows (`[[u8; BS]; B]` or the first
        // `capacity * block_size` bytes of the `from_parts` slice). The offset
        // therefore stays inside that one allocation.
        unsafe { self.base.as_ptr().add(idx as usize * self.block_size) }
    }
}

impl fmt::Debug for Pool<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("capacity", &self.capacity())
            .field("block_size", &self.block_size)
            .field("in_use", &self.in_use())
            .field("high_water", &self.high_water())
            .field("exhausted", &self.exhausted_count())
            .finish()
    }
}
