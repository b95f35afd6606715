//! The memory a pool is built over: [`PoolStorage`] (blocks and their
//! metadata in one value) and the per-block [`BlockMeta`].

use core::cell::{Cell, UnsafeCell};
use core::fmt;
use core::ptr::NonNull;

use super::NONE;

/// Bookkeeping for one block: reference count, committed length, link, generation.
///
/// Opaque; public only so that [`Pool::from_parts`](super::Pool::from_parts)
/// can take a caller-provided slice of them. Any value (including all zeros and [`BlockMeta::new`]) is a
/// valid starting state: a pool initialises a block's metadata when it first
/// hands the block out.
pub struct BlockMeta {
    /// Handles plus incoming link; 0 while the block is free.
    pub(super) refs: Cell<u32>,
    /// Committed bytes, `0..=block_size`.
    pub(super) len: Cell<u32>,
    /// Allocated: the successor in its chain. Free: the next free block.
    pub(super) next: Cell<u32>,
    /// Bumped on every allocation of this block.
    pub(super) generation: Cell<u32>,
    /// Foreign blocks and their pieces: where the bytes are (`None`: in the
    /// pool's storage). Such a block is sealed: `len` is all it ever holds.
    pub(super) ext: Cell<Option<NonNull<u8>>>,
    /// A piece: the foreign block it is a range of (holds one reference to it).
    pub(super) owner: Cell<u32>,
    /// A foreign block: the caller's token, handed back once it is released.
    pub(super) token: Cell<u64>,
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
/// (metadata is 32 bytes per block on 32-bit targets, 40 on 64-bit). Build a
/// [`Pool`](super::Pool) over it with [`Pool::new`](super::Pool::new).
///
/// Compile-time limits (checked when `new` is instantiated): `BLOCK_SIZE` is
/// 1..=`u32::MAX` and `BLOCKS` is below `u32::MAX`.
pub struct PoolStorage<const BLOCKS: usize, const BLOCK_SIZE: usize> {
    pub(super) meta: [BlockMeta; BLOCKS],
    pub(super) bytes: UnsafeCell<[[u8; BLOCK_SIZE]; BLOCKS]>,
}

impl<const BLOCKS: usize, const BLOCK_SIZE: usize> PoolStorage<BLOCKS, BLOCK_SIZE> {
    pub(super) const LAYOUT_OK: () = assert!(
        BLOCK_SIZE > 0 && BLOCK_SIZE <= u32::MAX as usize && BLOCKS < NONE as usize,
        "PoolStorage: BLOCK_SIZE must be 1..=u32::MAX and BLOCKS below u32::MAX"
    );

    /// Zeroed storage, ready for [`Pool::new`](super::Pool::new).
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
