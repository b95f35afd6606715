//! A pool of fixed-size blocks over caller-provided storage, shared through refcounted handles.
//!
//! This is where "no allocation" comes from: every byte of media a node holds
//! lives in one [`PoolStorage`] (or in slices given to [`Pool::from_parts`])
//! that the caller placed in a `static`, on the stack or in a `Box`. The pool
//! hands out blocks of that storage and takes them back; it never grows.
//!
//! * [`Pool::alloc`] returns a [`BlockMut`]: the one writer of a fresh block. It
//!   appends bytes to the block's uncommitted tail; each append commits them.
//! * [`Block`] is a shared, read-only handle (clone = reference count + 1,
//!   drop = − 1). Readers see the *committed prefix* of the block, which never
//!   changes while the block is allocated, so a writer can keep appending while
//!   readers hold slices of what it wrote before.
//! * Blocks form chains: [`BlockMut::link`] makes a block point to a successor,
//!   and that link holds one reference to it (a linked list of `Rc`s). Holding
//!   the head keeps the whole chain alive; a reader holding block *k* keeps
//!   *k..end* alive. Freeing a block releases its successor in a loop, so chains
//!   of any length are freed without recursion.
//!
//! When every block is taken, [`Pool::alloc`] returns [`PoolError::Exhausted`]
//! and counts the event ([`Pool::exhausted_count`]); it never allocates and never
//! panics. Alloc and free are O(1): a free list threaded through the block
//! metadata, plus a watermark of never-used blocks so that [`PoolStorage::new`]
//! is a `const fn` with nothing to initialise but zeros.
//!
//! The pool is single-threaded (`!Send`, `!Sync`: it is built from `Cell`s):
//! use one pool per core or executor.
//!
//! # Foreign blocks
//!
//! A pool can also hold bytes it does not own: [`Pool::adopt`] makes a
//! *foreign* block over memory another pool (say, another core's) keeps
//! unchanged for it, tagged with a caller's token. [`Block::piece`] makes
//! sealed sub-blocks of it that a chain can link like any other block, so a
//! group can be assembled from another core's bytes without copying them.
//! When the last piece and handle are gone the foreign block is *released*:
//! [`Pool::take_released`] hands its token back (so the caller can tell the
//! owner it may reuse the memory) and frees the block's metadata slot.
//!
//! ```
//! use skiff_core::pool::{Pool, PoolStorage};
//!
//! let mut storage = PoolStorage::<4, 8>::new();
//! let pool = Pool::new(&mut storage);
//! let mut w = pool.alloc().unwrap();
//! assert_eq!(w.append(b"hello"), 5);
//! let r = w.share();
//! assert_eq!(w.append(b" world"), 3); // the block holds 8 bytes
//! assert_eq!(r.data(), b"hello wo");
//! drop((w, r));
//! assert_eq!(pool.in_use(), 0);
//! ```
#![allow(unsafe_code)]

use core::cell::{Cell, UnsafeCell};
use core::fmt;
use core::marker::PhantomData;
use core::ops::Deref;
use core::ptr::NonNull;

/// The "no block" index (end of a chain, end of the free list).
const NONE: u32 = u32::MAX;

/// Why the pool could not serve a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum PoolError {
    /// Every block is in use (or fewer than the reserved number are free); nothing was taken.
    Exhausted,
    /// [`Pool::from_parts`] got storage that cannot form a pool (no blocks, empty blocks, or too many).
    InvalidLayout,
    /// [`Block::piece`] was asked for bytes outside the block, or of a block that is not foreign.
    NotForeign,
}

impl fmt::Display for PoolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PoolError::Exhausted => f.write_str("block pool exhausted"),
            PoolError::InvalidLayout => f.write_str("invalid block pool layout"),
            PoolError::NotForeign => f.write_str("not a range of a foreign block"),
        }
    }
}

impl core::error::Error for PoolError {}

/// Why [`BlockMut::link`] refused to link two blocks.
///
/// The rules make cycles impossible: a chain only grows by attaching a block
/// that has no successor yet to a block that has none either.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum LinkError {
    /// The block already has a successor; links are permanent while it is allocated.
    AlreadyLinked,
    /// The would-be successor already has a successor of its own.
    SuccessorLinked,
    /// A block cannot be its own successor.
    SameBlock,
    /// The two blocks come from different pools.
    ForeignPool,
}

impl fmt::Display for LinkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LinkError::AlreadyLinked => f.write_str("block already has a successor"),
            LinkError::SuccessorLinked => f.write_str("successor already has a successor"),
            LinkError::SameBlock => f.write_str("block linked to itself"),
            LinkError::ForeignPool => f.write_str("blocks from different pools"),
        }
    }
}

impl core::error::Error for LinkError {}

// ---------------------------------------------------------------------------
// Storage
// ---------------------------------------------------------------------------

/// Bookkeeping for one block: reference count, committed length, link, generation.
///
/// Opaque; public only so that [`Pool::from_parts`] can take a caller-provided
/// slice of them. Any value (including all zeros and [`BlockMeta::new`]) is a
/// valid starting state: a pool initialises a block's metadata when it first
/// hands the block out.
pub struct BlockMeta {
    /// Handles plus incoming link; 0 while the block is free.
    refs: Cell<u32>,
    /// Committed bytes, `0..=block_size`.
    len: Cell<u32>,
    /// Allocated: the successor in its chain. Free: the next free block.
    next: Cell<u32>,
    /// Bumped on every allocation of this block.
    generation: Cell<u32>,
    /// Foreign blocks and their pieces: where the bytes are (`None`: in the
    /// pool's storage). Such a block is sealed: `len` is all it ever holds.
    ext: Cell<Option<NonNull<u8>>>,
    /// A piece: the foreign block it is a range of (holds one reference to it).
    owner: Cell<u32>,
    /// A foreign block: the caller's token, handed back once it is released.
    token: Cell<u64>,
}

// SAFETY: the only non-`Send` field is `ext`, a pointer that is dereferenced
// solely through the `Pool` that owns this metadata (itself `!Send`, because it
// borrows the metadata through `Cell`s). Moving metadata to another thread
// moves no access to the bytes behind it; `Pool::adopt`'s contract makes the
// adopter answer for them.
unsafe impl Send for BlockMeta {}

impl BlockMeta {
    /// Fresh metadata (usable in `const` and array-repeat contexts).
    pub const fn new() -> Self {
        BlockMeta {
            refs: Cell::new(0),
            len: Cell::new(0),
            next: Cell::new(NONE),
            generation: Cell::new(0),
            ext: Cell::new(None),
            owner: Cell::new(NONE),
            token: Cell::new(0),
        }
    }
}

impl Default for BlockMeta {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for BlockMeta {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlockMeta")
            .field("refs", &self.refs.get())
            .field("len", &self.len.get())
            .finish_non_exhaustive()
    }
}

/// The memory of a pool: `BLOCKS` blocks of `BLOCK_SIZE` bytes plus their metadata.
///
/// A plain struct with a `const fn new()`, so it can sit in a `static` cell
/// (e.g. `static_cell::ConstStaticCell`, since it is `!Sync`), on the stack, or
/// in a `Box`. It takes `BLOCKS * (BLOCK_SIZE + size_of::<BlockMeta>())` bytes
/// (metadata is 32 bytes per block on 32-bit targets, 40 on 64-bit). Build a [`Pool`]
/// over it with [`Pool::new`].
///
/// Compile-time limits (checked when `new` is instantiated): `BLOCK_SIZE` is
/// 1..=`u32::MAX` and `BLOCKS` is below `u32::MAX`.
pub struct PoolStorage<const BLOCKS: usize, const BLOCK_SIZE: usize> {
    meta: [BlockMeta; BLOCKS],
    bytes: UnsafeCell<[[u8; BLOCK_SIZE]; BLOCKS]>,
}

impl<const BLOCKS: usize, const BLOCK_SIZE: usize> PoolStorage<BLOCKS, BLOCK_SIZE> {
    const LAYOUT_OK: () = assert!(
        BLOCK_SIZE > 0 && BLOCK_SIZE <= u32::MAX as usize && BLOCKS < NONE as usize,
        "PoolStorage: BLOCK_SIZE must be 1..=u32::MAX and BLOCKS below u32::MAX"
    );

    /// Zeroed storage, ready for [`Pool::new`].
    pub const fn new() -> Self {
        let () = Self::LAYOUT_OK;
        PoolStorage {
            meta: [const { BlockMeta::new() }; BLOCKS],
            bytes: UnsafeCell::new([[0; BLOCK_SIZE]; BLOCKS]),
        }
    }
}

impl<const BLOCKS: usize, const BLOCK_SIZE: usize> Default for PoolStorage<BLOCKS, BLOCK_SIZE> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const BLOCKS: usize, const BLOCK_SIZE: usize> fmt::Debug for PoolStorage<BLOCKS, BLOCK_SIZE> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolStorage")
            .field("blocks", &BLOCKS)
            .field("block_size", &BLOCK_SIZE)
            .finish()
    }
}

// ---------------------------------------------------------------------------
// Pool
// ---------------------------------------------------------------------------

/// A block pool: hands out the blocks of its storage and takes them back, in O(1).
///
/// Sizes are runtime values read from the storage, so `&Pool` has no const
/// generics and can be passed anywhere. Every handle borrows the pool, so the
/// pool (and its storage) outlives every block.
pub struct Pool<'s> {
    /// Start of the block bytes. Derived once from the exclusive borrow of the
    /// storage, it carries provenance over all `capacity * block_size` bytes.
    base: NonNull<u8>,
    meta: &'s [BlockMeta],
    block_size: usize,
    /// Head of the free list (blocks freed since the pool was built).
    free: Cell<u32>,
    /// Head of the list of released foreign blocks, awaiting [`Pool::take_released`].
    released: Cell<u32>,
    /// Blocks `fresh..capacity` were never handed out.
    fresh: Cell<u32>,
    /// Metadata slots `capacity..meta.len()` have no bytes: spare slots for
    /// foreign blocks and pieces ([`Pool::from_parts_with_spare`]).
    capacity: u32,
    /// Head of the free list of spare slots.
    free_spare: Cell<u32>,
    /// Spare slots `fresh_spare..meta.len()` were never handed out.
    fresh_spare: Cell<u32>,
    /// Spare slots in use.
    spare_in_use: Cell<u32>,
    in_use: Cell<u32>,
    high_water: Cell<u32>,
    exhausted: Cell<u64>,
    _bytes: PhantomData<&'s mut [u8]>,
}

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

    fn build(base: NonNull<u8>, meta: &'s [BlockMeta], block_size: usize, blocks: usize) -> Self {
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

    /// Marks slot `idx` allocated with one reference and the given contents.
    fn take_meta(&self, idx: u32, len: u32, ext: Option<NonNull<u8>>, owner: u32, token: u64) {
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
    fn push_free(&self, idx: u32) {
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
    fn push(&self, list: &Cell<u32>, idx: u32) {
        self.meta[idx as usize].next.set(list.get());
        list.set(idx);
    }

    /// Takes the head of `list`, else the next never-used slot below `end`
    /// from the watermark `fresh`.
    fn pop(&self, list: &Cell<u32>, fresh: &Cell<u32>, end: u32) -> Option<u32> {
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

    fn pop_free(&self) -> Option<u32> {
        self.pop(&self.free, &self.fresh, self.capacity)
    }

    /// Drops one reference to `idx`; frees it, and then each successor whose last
    /// reference was the link, in a loop.
    ///
    /// A freed piece also drops its reference to its foreign block; a freed
    /// foreign block goes to the released list. Foreign blocks have no
    /// successor (they are never writers) and pieces are never owners, so that
    /// inner release ends at once: no recursion.
    fn release(&self, mut idx: u32) {
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

    /// Drops a piece's reference to its foreign block (which has no successor).
    fn release_owner(&self, idx: u32) {
        let m = &self.meta[idx as usize];
        let refs = m.refs.get();
        debug_assert!(refs > 0 && m.next.get() == NONE, "bad foreign owner");
        m.refs.set(refs - 1);
        if refs == 1 {
            self.push(&self.released, idx);
        }
    }

    fn acquire(&self, idx: u32) {
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
    fn block_ptr(&self, idx: u32) -> *mut u8 {
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

// ---------------------------------------------------------------------------
// Handles
// ---------------------------------------------------------------------------

/// A shared, read-only handle to one allocated block.
///
/// Cloning adds a reference; dropping the last reference (handles plus the
/// link from a predecessor) returns the block to its pool and releases its
/// successor.
pub struct Block<'p> {
    pool: &'p Pool<'p>,
    idx: u32,
}

impl<'p> Block<'p> {
    fn meta(&self) -> &BlockMeta {
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

/// The one writer of a block: appends bytes after the committed prefix.
///
/// Only [`Pool::alloc`] creates it and it is not `Clone`, so each allocation
/// has at most one writer. It holds one reference, like a [`Block`]; once
/// dropped (or turned into a [`Block`]) nobody can write the block again.
pub struct BlockMut<'p> {
    block: Block<'p>,
}

impl<'p> BlockMut<'p> {
    /// The committed bytes (see [`Block::data`]).
    pub fn data(&self) -> &[u8] {
        self.block.data()
    }

    /// Number of committed bytes.
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

/// A range of committed bytes in one block, owning a reference to it.
///
/// Its address is fixed while it lives, so a backend can hand it to the kernel
/// (io_uring send) and let the reader move on.
#[derive(Clone)]
pub struct Slice<'p> {
    block: Block<'p>,
    start: u32,
    end: u32,
}

impl<'p> Slice<'p> {
    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        // In range by construction (`Block::slice`), and committed bytes never shrink.
        self.block
            .data()
            .get(self.start as usize..self.end as usize)
            .unwrap_or(&[])
    }

    /// The block the bytes live in.
    pub fn block(&self) -> &Block<'p> {
        &self.block
    }

    /// Keeps only the first `len` bytes (all of them if `len` is not shorter).
    pub fn truncate(&mut self, len: usize) {
        let len = u32::try_from(len).unwrap_or(u32::MAX);
        self.end = self.end.min(self.start.saturating_add(len));
    }
}

impl Deref for Slice<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl fmt::Debug for Slice<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Slice")
            .field("block", &self.block.idx)
            .field("start", &self.start)
            .field("end", &self.end)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    extern crate std;

    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;
    use std::vec;
    use std::vec::Vec;

    // --- foreign blocks -------------------------------------------------

    #[test]
    fn foreign_pieces_chain_and_release_their_token_once() {
        let other = *b"0123456789abcdef";
        let mut storage = PoolStorage::<6, 4>::new();
        let pool = Pool::new(&mut storage);
        // SAFETY: `other` outlives the pool and is never written.
        let foreign = unsafe { pool.adopt(NonNull::from(&other).cast(), 16, 77) }.unwrap();
        assert!(foreign.is_foreign() && foreign.is_full());
        assert_eq!(foreign.data(), b"0123456789abcdef");
        // A chain: own block, piece 2..7, own block, piece of a piece 10..12.
        let mut a = pool.alloc().unwrap();
        a.append(b"hd");
        let mut p1 = foreign.piece(2, 7).unwrap();
        assert_eq!((p1.data(), p1.spare_len()), (&b"23456"[..], 0));
        assert_eq!(p1.append(b"x"), 0);
        assert!(p1.spare_mut().is_empty());
        a.link(p1.as_block()).unwrap();
        let mut b = pool.alloc().unwrap();
        b.append(b"mid");
        p1.link(b.as_block()).unwrap();
        let big = foreign.piece(8, 16).unwrap();
        let p2 = big.as_block().piece(2, 4).unwrap();
        drop(big);
        assert_eq!(p2.data(), b"ab");
        b.link(p2.as_block()).unwrap();
        assert_eq!(b.as_block().piece(0, 1).unwrap_err(), PoolError::NotForeign);
        drop(foreign);
        let head = a.into_shared();
        drop((p1, b, p2));
        let mut seen = Vec::new();
        let mut cur = Some(head.clone());
        while let Some(blk) = cur {
            seen.extend_from_slice(blk.data());
            cur = blk.next();
        }
        assert_eq!(seen, b"hd23456midab");
        assert_eq!(pool.take_released(), None, "pieces still hold it");
        drop(head);
        assert!(pool.has_released());
        assert_eq!(pool.in_use(), 1, "only the released foreign block");
        assert_eq!(pool.take_released(), Some(77));
        assert_eq!((pool.take_released(), pool.in_use()), (None, 0));
    }

    #[test]
    fn foreign_blocks_use_metadata_slots() {
        let other = [7u8; 3];
        let mut storage = PoolStorage::<2, 4>::new();
        let pool = Pool::new(&mut storage);
        // SAFETY: `other` outlives the pool and is never written.
        let f = unsafe { pool.adopt(NonNull::from(&other).cast(), 3, 1) }.unwrap();
        let p = f.piece(0, 3).unwrap();
        assert_eq!(f.piece(0, 1).unwrap_err(), PoolError::Exhausted);
        assert_eq!(f.piece(2, 4).unwrap_err(), PoolError::NotForeign);
        assert_eq!(pool.alloc().unwrap_err(), PoolError::Exhausted);
        drop((f, p));
        assert_eq!(pool.take_released(), Some(1));
        assert_eq!(pool.in_use(), 0);
        // A foreign block dropped with no piece comes back at once.
        // SAFETY: as above.
        drop(unsafe { pool.adopt(NonNull::from(&other).cast(), 2, 9) }.unwrap());
        assert_eq!(pool.take_released(), Some(9));
    }

    #[test]
    fn spare_slots_hold_foreign_blocks_and_never_bytes() {
        let other = [1u8; 8];
        let mut bytes = [0u8; 8];
        let mut meta: [BlockMeta; 4] = core::array::from_fn(|_| BlockMeta::new());
        let pool = Pool::from_parts_with_spare(&mut bytes, &mut meta, 2).unwrap();
        assert_eq!((pool.capacity(), pool.block_size()), (2, 4));
        let a = pool.alloc().unwrap();
        let b = pool.alloc().unwrap();
        assert_eq!(
            pool.alloc().unwrap_err(),
            PoolError::Exhausted,
            "spare slots have no bytes"
        );
        drop(b);
        // SAFETY: `other` outlives the pool and is never written.
        let f = unsafe { pool.adopt(NonNull::from(&other).cast(), 8, 3) }.unwrap();
        let mut p = f.piece(0, 2).unwrap();
        assert!(p.grow_piece(&f, 2, 5), "contiguous bytes grow the piece");
        assert!(!p.grow_piece(&f, 6, 7), "a gap does not");
        assert_eq!(p.data(), &other[..5]);
        assert_eq!((pool.spare_in_use(), pool.in_use()), (2, 1));
        // Spare slots gone: foreign blocks fall back to slots with bytes.
        let q = f.piece(5, 8).unwrap();
        assert_eq!((pool.spare_in_use(), pool.in_use()), (2, 2));
        drop((f, p, q, a));
        assert_eq!(pool.take_released(), Some(3));
        assert_eq!((pool.spare_in_use(), pool.in_use()), (0, 0));
        assert_eq!(
            Pool::from_parts_with_spare(&mut [0u8; 4], &mut [BlockMeta::new()], 1).unwrap_err(),
            PoolError::InvalidLayout
        );
    }

    // --- alloc / free ---------------------------------------------------

    #[test]
    fn alloc_until_exhausted_then_reuse() {
        let mut storage = PoolStorage::<3, 4>::new();
        let pool = Pool::new(&mut storage);
        assert_eq!((pool.capacity(), pool.block_size()), (3, 4));
        let a = pool.alloc().unwrap();
        let b = pool.alloc().unwrap();
        let c = pool.alloc().unwrap();
        assert_eq!(pool.alloc().unwrap_err(), PoolError::Exhausted);
        assert_eq!(pool.exhausted_count(), 1);
        assert_eq!(
            (pool.in_use(), pool.available(), pool.high_water()),
            (3, 0, 3)
        );
        let bi = b.as_block().index();
        let bg = b.as_block().generation();
        drop(b);
        assert_eq!(pool.in_use(), 2);
        let d = pool.alloc().unwrap();
        assert_eq!(d.as_block().index(), bi);
        assert_eq!(d.as_block().generation(), bg.wrapping_add(1));
        assert!(d.is_empty());
        drop((a, c, d));
        assert_eq!((pool.in_use(), pool.high_water()), (0, 3));
    }

    #[test]
    fn empty_pool_never_allocates() {
        let mut storage = PoolStorage::<0, 8>::new();
        let pool = Pool::new(&mut storage);
        assert_eq!(pool.alloc().unwrap_err(), PoolError::Exhausted);
        assert_eq!(pool.try_reserve(0), Ok(()));
        assert_eq!(pool.try_reserve(1), Err(PoolError::Exhausted));
        assert_eq!(pool.exhausted_count(), 2);
    }

    #[test]
    fn reserve_counts_free_blocks() {
        let mut storage = PoolStorage::<4, 2>::new();
        let pool = Pool::new(&mut storage);
        let _a = pool.alloc().unwrap();
        assert_eq!(pool.try_reserve(3), Ok(()));
        assert_eq!(pool.try_reserve(4), Err(PoolError::Exhausted));
        assert_eq!(pool.in_use(), 1);
    }

    #[test]
    fn rebuilding_a_pool_starts_fresh() {
        let mut storage = PoolStorage::<2, 4>::new();
        {
            let pool = Pool::new(&mut storage);
            let w = pool.alloc().unwrap();
            core::mem::forget(w); // leaked inside this pool's life
            assert_eq!(pool.in_use(), 1);
        }
        let pool = Pool::new(&mut storage);
        assert_eq!(pool.in_use(), 0);
        let _a = pool.alloc().unwrap();
        let _b = pool.alloc().unwrap();
    }

    #[test]
    fn from_parts_checks_layout() {
        let mut bytes = [0u8; 10];
        let mut meta: [BlockMeta; 3] = Default::default();
        let pool = Pool::from_parts(&mut bytes, &mut meta).unwrap();
        assert_eq!((pool.capacity(), pool.block_size()), (3, 3));
        let mut w = pool.alloc().unwrap();
        assert_eq!(w.append(b"abcdef"), 3);
        assert_eq!(w.data(), b"abc");
        drop(w);

        let mut none: [BlockMeta; 0] = [];
        assert_eq!(
            Pool::from_parts(&mut bytes, &mut none).unwrap_err(),
            PoolError::InvalidLayout
        );
        let mut tiny = [0u8; 2];
        assert_eq!(
            Pool::from_parts(&mut tiny, &mut meta).unwrap_err(),
            PoolError::InvalidLayout
        );
    }

    // --- writing while reading --------------------------------------------

    #[test]
    fn readers_see_committed_prefix_while_writer_appends() {
        let mut storage = PoolStorage::<1, 8>::new();
        let pool = Pool::new(&mut storage);
        let mut w = pool.alloc().unwrap();
        assert_eq!(w.append(b"ab"), 2);
        let r = w.share();
        let early = r.data(); // a live borrow of the committed prefix
        let spare = w.spare_mut();
        spare[..3].copy_from_slice(b"cde");
        assert_eq!(r.data(), b"ab"); // not committed yet
        w.commit(3);
        assert_eq!(early, b"ab");
        assert_eq!(r.data(), b"abcde");
        assert_eq!(w.append(b"fghij"), 3);
        assert!(r.is_full());
        assert_eq!(w.append(b"x"), 0);
        assert_eq!(w.spare_mut().len(), 0);
        let s = r.clone().slice(2, 6).unwrap();
        assert_eq!(&*s, b"cdef");
        assert!(r.clone().slice(3, 9).is_none());
        assert_eq!(r.ref_count(), 3);
        drop((w, r));
        assert_eq!(pool.in_use(), 1);
        drop(s);
        assert_eq!(pool.in_use(), 0);
    }

    #[test]
    #[should_panic(expected = "commit past the end")]
    fn commit_past_the_end_panics() {
        let mut storage = PoolStorage::<1, 4>::new();
        let pool = Pool::new(&mut storage);
        let mut w = pool.alloc().unwrap();
        w.commit(5);
    }

    #[test]
    fn freed_block_is_rewritten_only_after_last_reader() {
        let mut storage = PoolStorage::<1, 4>::new();
        let pool = Pool::new(&mut storage);
        let mut w = pool.alloc().unwrap();
        w.append(b"old!");
        let r = w.into_shared();
        assert!(pool.alloc().is_err());
        assert_eq!(r.data(), b"old!");
        drop(r);
        let mut w = pool.alloc().unwrap();
        assert!(w.is_empty());
        w.append(b"new");
        assert_eq!(w.data(), b"new");
    }

    // --- chains -----------------------------------------------------------

    #[test]
    fn link_rules() {
        let mut storage = PoolStorage::<3, 2>::new();
        let pool = Pool::new(&mut storage);
        let mut other_storage = PoolStorage::<1, 2>::new();
        let other = Pool::new(&mut other_storage);
        let mut a = pool.alloc().unwrap();
        let mut b = pool.alloc().unwrap();
        let c = pool.alloc().unwrap();
        let x = other.alloc().unwrap();
        assert_eq!(a.link(&a.share()), Err(LinkError::SameBlock));
        assert_eq!(a.link(&x.share()), Err(LinkError::ForeignPool));
        assert_eq!(a.link(&b.share()), Ok(()));
        assert_eq!(a.link(&c.share()), Err(LinkError::AlreadyLinked));
        assert_eq!(b.link(&c.share()), Ok(()));
        // c -> a would close a cycle: a already has a successor.
        let mut c = c;
        assert_eq!(c.link(&a.share()), Err(LinkError::SuccessorLinked));
        assert!(a.next().unwrap().same_block(b.as_block()));
        drop((b, c));
        assert_eq!(pool.in_use(), 3); // kept alive by links from a
        drop(a);
        assert_eq!(pool.in_use(), 0);
    }

    #[test]
    fn reader_keeps_the_rest_of_the_chain() {
        let mut storage = PoolStorage::<3, 1>::new();
        let pool = Pool::new(&mut storage);
        let mut a = pool.alloc().unwrap();
        let mut b = pool.alloc().unwrap();
        let c = pool.alloc().unwrap();
        a.link(b.as_block()).unwrap();
        b.link(c.as_block()).unwrap();
        let mid = a.next().unwrap();
        drop((b, c));
        drop(a);
        assert_eq!(pool.in_use(), 2); // b (held) and c (linked from b)
        drop(mid);
        assert_eq!(pool.in_use(), 0);
    }

    #[test]
    fn long_chain_frees_without_recursion() {
        const N: usize = if cfg!(miri) { 300 } else { 20_000 };
        let mut storage = vec![];
        storage.resize_with(N, BlockMeta::new);
        let mut bytes = vec![0u8; N];
        let pool = Pool::from_parts(&mut bytes, &mut storage).unwrap();
        let mut tail = pool.alloc().unwrap();
        let head = tail.share();
        for _ in 1..N {
            let next = pool.alloc().unwrap();
            tail.link(next.as_block()).unwrap();
            tail = next;
        }
        drop(tail);
        assert_eq!(pool.in_use(), N);
        drop(head);
        assert_eq!(pool.in_use(), 0);
        // Every block is reusable.
        let all: Vec<_> = (0..N).map(|_| pool.alloc().unwrap()).collect();
        assert!(pool.alloc().is_err());
        drop(all);
    }

    // --- property: random interleavings -----------------------------------

    #[derive(Debug, Clone)]
    enum Op {
        Alloc,
        Append(usize, Vec<u8>),
        Share(usize),
        Next(usize),
        Link(usize, usize),
        Seal(usize),
        Drop(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => Just(Op::Alloc),
            3 => (any::<usize>(), proptest::collection::vec(any::<u8>(), 0..7))
                .prop_map(|(i, b)| Op::Append(i, b)),
            2 => any::<usize>().prop_map(Op::Share),
            1 => any::<usize>().prop_map(Op::Next),
            2 => (any::<usize>(), any::<usize>()).prop_map(|(i, j)| Op::Link(i, j)),
            1 => any::<usize>().prop_map(Op::Seal),
            3 => any::<usize>().prop_map(Op::Drop),
        ]
    }

    enum H<'p> {
        W(BlockMut<'p>),
        R(Block<'p>),
    }

    impl<'p> H<'p> {
        fn block(&self) -> &Block<'p> {
            match self {
                H::W(w) => w.as_block(),
                H::R(r) => r,
            }
        }
    }

    /// Model of one allocation: expected bytes and successor.
    #[derive(Default)]
    struct M {
        data: Vec<u8>,
        next: Option<(usize, u32)>,
    }

    fn key(b: &Block<'_>) -> (usize, u32) {
        (b.index(), b.generation())
    }

    /// Allocations reachable from live handles through links: exactly the ones that must be
    /// allocated.
    fn reachable(
        handles: &[H<'_>],
        model: &BTreeMap<(usize, u32), M>,
    ) -> std::collections::BTreeSet<(usize, u32)> {
        let mut seen = std::collections::BTreeSet::new();
        for h in handles {
            let mut k = Some(key(h.block()));
            while let Some(kk) = k {
                if !seen.insert(kk) {
                    break;
                }
                k = model[&kk].next;
            }
        }
        seen
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: if cfg!(miri) { 6 } else { 256 },
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        #[test]
        fn random_interleavings(ops in proptest::collection::vec(op(), 0..if cfg!(miri) { 40 } else { 200 })) {
            const CAP: usize = 6;
            let mut storage = PoolStorage::<CAP, 5>::new();
            let pool = Pool::new(&mut storage);
            let mut handles: Vec<H<'_>> = Vec::new();
            let mut model: BTreeMap<(usize, u32), M> = BTreeMap::new();
            for op in ops {
                let n = handles.len();
                match op {
                    Op::Alloc => match pool.alloc() {
                        Ok(w) => {
                            let k = key(w.as_block());
                            // A block still reachable must never be handed out again.
                            let live = reachable(&handles, &model);
                            prop_assert!(live.iter().all(|&(i, _)| i != k.0));
                            model.insert(k, M::default());
                            handles.push(H::W(w));
                        }
                        Err(e) => {
                            prop_assert_eq!(e, PoolError::Exhausted);
                            prop_assert_eq!(pool.in_use(), CAP);
                        }
                    },
                    Op::Append(i, bytes) if n > 0 => {
                        if let H::W(w) = &mut handles[i % n] {
                            let room = w.spare_len();
                            let wrote = w.append(&bytes);
                            prop_assert_eq!(wrote, room.min(bytes.len()));
                            let m = model.get_mut(&key(w.as_block())).unwrap();
                            m.data.extend_from_slice(&bytes[..wrote]);
                        }
                    }
                    Op::Share(i) if n > 0 => {
                        let b = handles[i % n].block().clone();
                        handles.push(H::R(b));
                    }
                    Op::Next(i) if n > 0 => {
                        if let Some(b) = handles[i % n].block().next() {
                            let k = model[&key(handles[i % n].block())].next;
                            prop_assert_eq!(Some(key(&b)), k);
                            handles.push(H::R(b));
                        }
                    }
                    Op::Link(i, j) if n > 0 => {
                        let succ = handles[j % n].block().clone();
                        if let H::W(w) = &mut handles[i % n] {
                            let ka = key(w.as_block());
                            let kb = key(&succ);
                            let expect_ok = ka != kb
                                && model[&ka].next.is_none()
                                && model[&kb].next.is_none();
                            let r = w.link(&succ);
                            prop_assert_eq!(r.is_ok(), expect_ok);
                            if expect_ok {
                                model.get_mut(&ka).unwrap().next = Some(kb);
                            }
                        }
                    }
                    Op::Seal(i) if n > 0 => {
                        let h = handles.swap_remove(i % n);
                        if let H::W(w) = h {
                            handles.push(H::R(w.into_shared()));
                        } else {
                            handles.push(h);
                        }
                    }
                    Op::Drop(i) if n > 0 => {
                        drop(handles.swap_remove(i % n));
                    }
                    _ => {}
                }
                // Invariants after every step.
                prop_assert_eq!(pool.in_use(), reachable(&handles, &model).len());
                prop_assert!(pool.high_water() <= pool.capacity());
                prop_assert!(pool.in_use() <= pool.high_water());
                for h in &handles {
                    let b = h.block();
                    prop_assert_eq!(b.data(), &model[&key(b)].data[..]);
                }
            }
            drop(handles);
            prop_assert_eq!(pool.in_use(), 0);
            // Every block comes back exactly once: the pool can be filled again, no more.
            let all: Vec<_> = (0..CAP).map(|_| pool.alloc()).collect();
            prop_assert!(all.iter().all(|r| r.is_ok()));
            prop_assert!(pool.alloc().is_err());
        }
    }
}
