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
//!
//! # Modules
//!
//! This module holds the errors and the [`Pool`], [`Block`] and [`BlockMut`]
//! structs every part shares; `storage` is the memory a pool is built over,
//! `allocator` the pool's allocator and reference counts, `block` the block
//! handles, `slice` views of committed bytes, and `foreign` the foreign blocks.
#![allow(unsafe_code)]

mod allocator;
mod block;
mod foreign;
mod slice;
mod storage;

#[cfg(test)]
mod tests;

use core::cell::Cell;
use core::fmt;
use core::marker::PhantomData;
use core::ptr::NonNull;

pub use slice::Slice;
pub use storage::{BlockMeta, PoolStorage};

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

/// A shared, read-only handle to one allocated block.
///
/// Cloning adds a reference; dropping the last reference (handles plus the
/// link from a predecessor) returns the block to its pool and releases its
/// successor.
pub struct Block<'p> {
    pool: &'p Pool<'p>,
    idx: u32,
}

/// The one writer of a block: appends bytes after the committed prefix.
///
/// Only [`Pool::alloc`] creates it and it is not `Clone`, so each allocation
/// has at most one writer. It holds one reference, like a [`Block`]; once
/// dropped (or turned into a [`Block`]) nobody can write the block again.
pub struct BlockMut<'p> {
    block: Block<'p>,
}
