//! Block handles: [`Block`], a shared read-only handle to the committed
//! prefix of a block, and [`BlockMut`], the one writer that appends to it and
//! links it to a successor.

use core::fmt;

use super::{Block, BlockMeta, BlockMut, LinkError, NONE, Pool, Slice};

impl<'p> Block<'p> {
    pub(super) fn meta(&self) -> &BlockMeta {
        &self.pool.meta[self.idx as usize]
    }

    /// The committed bytes: everything the writer has appended so far.
    ///
    /// The returned prefix never changes while this handle lives; a later call
    /// may return a longer one.
    pub fn data(&self) -> &[u8] {
        let len = self.len();
        if let Some(ext) = self.meta().ext.get() {
            // SAFETY: a foreign block or a piece of one. `Pool::adopt`'s caller
            // guarantees `len` readable bytes that nobody writes until the
            // foreign block is released, which cannot happen while this handle
            // (or, for a piece, its reference to the foreign block) lives; a
            // piece's range lies inside its foreign block's (`Block::piece`).
            return unsafe { core::slice::from_raw_parts(ext.as_ptr(), len) };
        }
        let ptr = self.pool.block_ptr(self.idx);
        // SAFETY:
        // * `ptr..ptr+len` is inside this block (`len <= block_size`) and the
        //   storage is initialised memory (zeros at first, bytes written since).
        // * The block stays allocated while `self` lives (it holds a reference),
        //   so it cannot be handed out and rewritten by a new writer.
        // * Bytes `0..len` are committed. The only code that writes block bytes
        //   is `BlockMut::spare_mut`, which covers `len..block_size` only, and
        //   `len` only grows (`BlockMut::commit`) while the block is allocated.
        //   So no `&mut` to these bytes exists or can be created while the
        //   returned slice (bounded by `&self`) lives.
        unsafe { core::slice::from_raw_parts(ptr, len) }
    }

    /// Number of committed bytes.
    pub fn len(&self) -> usize {
        self.meta().len.get() as usize
    }

    /// True while nothing is committed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True once the block's whole capacity is committed (foreign blocks and
    /// their pieces always are).
    pub fn is_full(&self) -> bool {
        self.is_foreign() || self.len() == self.pool.block_size
    }

    /// A new handle to this block's successor, if it has one.
    pub fn next(&self) -> Option<Block<'p>> {
        let next = self.meta().next.get();
        if next == NONE {
            return None;
        }
        self.pool.acquire(next);
        Some(Block {
            pool: self.pool,
            idx: next,
        })
    }

    /// The pool the block belongs to.
    pub fn pool(&self) -> &'p Pool<'p> {
        self.pool
    }

    /// True if the block has a successor.
    pub fn has_next(&self) -> bool {
        self.meta().next.get() != NONE
    }

    /// Turns this handle into a view of committed bytes `start..end`.
    ///
    /// Returns `None` (dropping the handle) unless `start <= end <= self.len()`.
    pub fn slice(self, start: usize, end: usize) -> Option<Slice<'p>> {
        if start > end || end > self.len() {
            return None;
        }
        // Both fit u32: end <= len <= block_size <= u32::MAX.
        Some(Slice {
            block: self,
            start: start as u32,
            end: end as u32,
        })
    }

    /// The block's index in its pool (diagnostics; stable while the block is allocated).
    pub fn index(&self) -> usize {
        self.idx as usize
    }

    /// How many times this block has been allocated; with [`Block::index`] it names one
    /// allocation.
    pub fn generation(&self) -> u32 {
        self.meta().generation.get()
    }

    /// The number of references to this block (handles plus an incoming link).
    pub fn ref_count(&self) -> usize {
        self.meta().refs.get() as usize
    }

    /// True if both handles name the same allocated block.
    pub fn same_block(&self, other: &Block<'_>) -> bool {
        core::ptr::eq(self.pool.meta.as_ptr(), other.pool.meta.as_ptr()) && self.idx == other.idx
    }
}

impl Clone for Block<'_> {
    fn clone(&self) -> Self {
        self.pool.acquire(self.idx);
        Block {
            pool: self.pool,
            idx: self.idx,
        }
    }
}

impl Drop for Block<'_> {
    fn drop(&mut self) {
        self.pool.release(self.idx);
    }
}

impl fmt::Debug for Block<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Block")
            .field("index", &self.idx)
            .field("len", &self.len())
            .field("refs", &self.ref_count())
            .finish()
    }
}

impl<'p> BlockMut<'p> {
    /// The committed bytes (see [`Block::data`]).
    pub fn data(&self) -> &[u8] {
        self.block.data()
    }

    /// Number of committed bytes.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.block.len()
    }

    /// True while nothing is committed.
    pub fn is_empty(&self) -> bool {
        self.block.is_empty()
    }

    /// Room left after the committed bytes (none in a piece of a foreign block).
    pub fn spare_len(&self) -> usize {
        if self.block.is_foreign() {
            return 0;
        }
        self.block.pool.block_size - self.block.len()
    }

    /// The uncommitted tail of the block, to fill in place (e.g. a socket read);
    /// then call [`BlockMut::commit`]. Its contents are unspecified (old bytes).
    pub fn spare_mut(&mut self) -> &mut [u8] {
        if self.block.is_foreign() {
            return &mut [];
        }
        let len = self.block.len();
        let room = self.block.pool.block_size - len;
        let ptr = self.block.pool.block_ptr(self.block.idx);
        // SAFETY:
        // * `ptr+len .. ptr+block_size` is inside this block of the storage,
        //   which is initialised memory.
        // * This `BlockMut` is the only writer of the allocation (`alloc` makes
        //   exactly one; it is not `Clone`), and the block stays allocated while
        //   it lives (it holds a reference), so nobody else writes these bytes.
        // * Readers only ever get `0..len` (`Block::data`), and `len` can only
        //   change through `&mut self` (`commit`), which the returned borrow
        //   blocks. So the returned `&mut` overlaps no other reference.
        unsafe { core::slice::from_raw_parts_mut(ptr.add(len), room) }
    }

    /// Commits the first `n` bytes of [`BlockMut::spare_mut`], making them visible to readers.
    ///
    /// # Panics
    /// If `n > self.spare_len()` (a caller bug: it cannot have filled them).
    pub fn commit(&mut self, n: usize) {
        assert!(n <= self.spare_len(), "commit past the end of the block");
        let m = self.block.meta();
        // Fits u32: the new length is at most block_size <= u32::MAX.
        m.len.set(m.len.get() + n as u32);
    }

    /// Copies as much of `src` as fits and commits it; returns how many bytes that was.
    pub fn append(&mut self, src: &[u8]) -> usize {
        let spare = self.spare_mut();
        let n = spare.len().min(src.len());
        spare[..n].copy_from_slice(&src[..n]);
        self.commit(n);
        n
    }

    /// Makes `next` this block's successor; the link holds one reference to it.
    ///
    /// Chains grow at their tail: link a block that has no successor yet, then
    /// link the next one to it.
    ///
    /// # Errors
    /// [`LinkError`] if this block already has a successor, `next` already has
    /// one, `next` is this block, or it comes from another pool. Together these
    /// rules make cycles (which would leak) impossible.
    pub fn link(&mut self, next: &Block<'p>) -> Result<(), LinkError> {
        if !core::ptr::eq(self.block.pool, next.pool) {
            return Err(LinkError::ForeignPool);
        }
        if next.idx == self.block.idx {
            return Err(LinkError::SameBlock);
        }
        if self.block.has_next() {
            return Err(LinkError::AlreadyLinked);
        }
        if next.has_next() {
            return Err(LinkError::SuccessorLinked);
        }
        self.block.pool.acquire(next.idx);
        self.block.meta().next.set(next.idx);
        Ok(())
    }

    /// A new handle to this block's successor, if it has one.
    pub fn next(&self) -> Option<Block<'p>> {
        self.block.next()
    }

    /// A new shared handle to this block (the writer keeps writing).
    pub fn share(&self) -> Block<'p> {
        self.block.clone()
    }

    /// Gives up writing: the block keeps its committed bytes and this reference.
    pub fn into_shared(self) -> Block<'p> {
        self.block
    }

    /// The shared handle inside (e.g. to compare with [`Block::same_block`]).
    pub fn as_block(&self) -> &Block<'p> {
        &self.block
    }
}

impl fmt::Debug for BlockMut<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("BlockMut").field(&self.block).finish()
    }
}
