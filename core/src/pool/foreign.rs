//! Foreign blocks: bytes a pool does not own, adopted over another pool's
//! memory ([`Pool::adopt`]), cut into sealed pieces a chain can link
//! ([`Block::piece`]), and handed back by token once released
//! ([`Pool::take_released`]); and the spare metadata slots that hold them.

use core::ptr::NonNull;

use super::{Block, BlockMeta, BlockMut, NONE, Pool, PoolError};

impl<'s> Pool<'s> {
    /// Like [`Pool::from_parts`], but only the first `meta.len() - spare`
    /// slots get bytes; the last `spare` slots hold only metadata and serve
    /// foreign blocks and their pieces first ([`Pool::adopt`], [`Block::piece`]),
    /// so bytes held by reference do not take blocks of this pool's own bytes.
    ///
    /// # Errors
    /// As [`Pool::from_parts`], for the slots with bytes.
    pub fn from_parts_with_spare(
        bytes: &'s mut [u8],
        meta: &'s mut [BlockMeta],
        spare: usize,
    ) -> Result<Self, PoolError> {
        let total = meta.len();
        let blocks = total.saturating_sub(spare);
        if blocks == 0 || total >= NONE as usize {
            return Err(PoolError::InvalidLayout);
        }
        let block_size = bytes.len() / blocks;
        if block_size == 0 || block_size > u32::MAX as usize {
            return Err(PoolError::InvalidLayout);
        }
        let base = NonNull::from(bytes).cast::<u8>();
        Ok(Self::build(base, meta, block_size, blocks))
    }

    /// A foreign block over `len` bytes at `ptr`, which this pool does not own,
    /// tagged with `token`; it is full (sealed) from the start.
    ///
    /// Link [`Block::piece`]s of it into chains. Once the block and every
    /// piece are dropped, [`Pool::take_released`] returns `token`: only then
    /// may the owner of the bytes change or reuse them.
    ///
    /// # Errors
    /// [`PoolError::Exhausted`] when no metadata slot is free (counted), and
    /// [`PoolError::InvalidLayout`] if `len` exceeds `u32::MAX`.
    ///
    /// # Safety
    /// `ptr..ptr + len` must be initialised memory that stays valid and is not
    /// written by anyone until `token` comes back from [`Pool::take_released`]
    /// (or the pool is gone), and every write to it must happen before this
    /// call (for memory written by another thread: made visible to this one).
    pub unsafe fn adopt(
        &self,
        ptr: NonNull<u8>,
        len: usize,
        token: u64,
    ) -> Result<Block<'_>, PoolError> {
        let len = u32::try_from(len).map_err(|_| PoolError::InvalidLayout)?;
        let Some(idx) = self.pop_meta() else {
            self.exhausted.set(self.exhausted.get().saturating_add(1));
            return Err(PoolError::Exhausted);
        };
        self.take_meta(idx, len, Some(ptr), NONE, token);
        Ok(Block { pool: self, idx })
    }

    /// The token of one released foreign block (see [`Pool::adopt`]), whose
    /// metadata slot becomes free; `None` if none is waiting.
    pub fn take_released(&self) -> Option<u64> {
        let idx = self.released.get();
        if idx == NONE {
            return None;
        }
        let m = &self.meta[idx as usize];
        self.released.set(m.next.get());
        let token = m.token.get();
        self.push_free(idx);
        Some(token)
    }

    /// True if released foreign blocks wait for [`Pool::take_released`].
    pub fn has_released(&self) -> bool {
        self.released.get() != NONE
    }

    /// A free metadata slot for a foreign block or piece: a spare one if
    /// any is left, else one of the blocks with bytes.
    fn pop_meta(&self) -> Option<u32> {
        // Fits u32: `meta.len() < NONE` (checked when the pool was built).
        let end = self.meta.len() as u32;
        self.pop(&self.free_spare, &self.fresh_spare, end)
            .or_else(|| self.pop_free())
    }

    /// Spare metadata slots ([`Pool::from_parts_with_spare`]) in use.
    pub fn spare_in_use(&self) -> usize {
        self.spare_in_use.get() as usize
    }

    /// Drops a piece's reference to its foreign block (which has no successor).
    pub(super) fn release_owner(&self, idx: u32) {
        let m = &self.meta[idx as usize];
        let refs = m.refs.get();
        debug_assert!(refs > 0 && m.next.get() == NONE, "bad foreign owner");
        m.refs.set(refs - 1);
        if refs == 1 {
            self.push(&self.released, idx);
        }
    }
}

impl<'p> Block<'p> {
    /// True for a foreign block ([`Pool::adopt`]) or a piece of one ([`Block::piece`]).
    pub fn is_foreign(&self) -> bool {
        self.meta().ext.get().is_some()
    }

    /// A sealed block holding bytes `start..end` of this foreign block,
    /// without copying them; it keeps this block alive and can be linked
    /// into a chain (as its writer, which has no room to write).
    ///
    /// # Errors
    /// [`PoolError::NotForeign`] unless this is a foreign block or a piece of
    /// one and `start <= end <= len`; [`PoolError::Exhausted`] when no
    /// metadata slot is free (counted).
    pub fn piece(&self, start: usize, end: usize) -> Result<BlockMut<'p>, PoolError> {
        let m = self.meta();
        let Some(ext) = m.ext.get() else {
            return Err(PoolError::NotForeign);
        };
        if start > end || end > self.len() {
            return Err(PoolError::NotForeign);
        }
        // A piece of a piece is a piece of the same foreign block.
        let root = match m.owner.get() {
            NONE => self.idx,
            owner => owner,
        };
        let Some(idx) = self.pool.pop_meta() else {
            self.pool
                .exhausted
                .set(self.pool.exhausted.get().saturating_add(1));
            return Err(PoolError::Exhausted);
        };
        self.pool.acquire(root);
        // SAFETY: `start <= len`, so the offset stays inside (or one past the
        // end of) the foreign bytes `Pool::adopt` was given.
        let ptr = unsafe { ext.add(start) };
        // Fits u32: `end - start <= len <= u32::MAX`.
        self.pool
            .take_meta(idx, (end - start) as u32, Some(ptr), root, 0);
        Ok(BlockMut {
            block: Block {
                pool: self.pool,
                idx,
            },
        })
    }
}

impl<'p> BlockMut<'p> {
    /// Extends this piece of a foreign block by bytes `start..end` of `src`
    /// when they follow its own bytes in the same foreign block (and it has
    /// no successor yet); returns false, changing nothing, otherwise.
    ///
    /// Readers then see the longer piece, as they see a block's writer commit
    /// more bytes.
    pub fn grow_piece(&mut self, src: &Block<'p>, start: usize, end: usize) -> bool {
        let m = self.block.meta();
        let s = src.meta();
        let (Some(mine), Some(theirs)) = (m.ext.get(), s.ext.get()) else {
            return false;
        };
        let root = match s.owner.get() {
            NONE => src.idx,
            owner => owner,
        };
        if m.owner.get() != root
            || !core::ptr::eq(self.block.pool, src.pool)
            || self.block.has_next()
            || start > end
            || end > src.len()
        {
            return false;
        }
        // Same foreign block, so the addresses are comparable: the new bytes
        // must start where this piece ends.
        let my_end = mine.as_ptr() as usize + self.block.len();
        if my_end != theirs.as_ptr() as usize + start {
            return false;
        }
        let Ok(len) = u32::try_from(self.block.len() + (end - start)) else {
            return false;
        };
        m.len.set(len);
        true
    }
}
