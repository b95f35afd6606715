//! The fixed table sizes a moq-lite endpoint on this runtime is built with
//! (tracks per broadcast, groups per track, block size), and the start-up
//! allocations of those tables: block pools and slices that live for the
//! rest of the process.

use skiff_core::pool::{BlockMeta, Pool};

/// Tracks per broadcast (a relay's, a client's).
pub const TRACKS: usize = 64;
/// Groups a track holds at once.
pub const GROUPS: usize = 32;
/// Bytes per pool block.
pub(crate) const BLOCK_BYTES: usize = 16384;

/// A block pool of about `bytes` bytes that lives for the rest of the process.
///
/// # Panics
/// Never for `bytes` up to `u32::MAX` blocks; smaller sizes are raised to 64 blocks.
pub fn leak_pool(bytes: u64) -> &'static Pool<'static> {
    leak_pool_with_spare(bytes, 0)
}

/// The blocks of a pool of about `bytes` bytes (at least 64).
pub fn pool_blocks(bytes: u64) -> usize {
    usize::try_from(bytes / BLOCK_BYTES as u64)
        .unwrap_or(usize::MAX)
        .clamp(64, (u32::MAX / 2) as usize)
}

/// Like [`leak_pool`], with `spare` more metadata slots (no bytes) for
/// blocks lent by other workers (a relay's links lend each other blocks).
///
/// # Panics
/// As [`leak_pool`].
pub fn leak_pool_with_spare(bytes: u64, spare: usize) -> &'static Pool<'static> {
    let blocks = pool_blocks(bytes);
    let spare = spare.min((u32::MAX / 2) as usize - 1);
    let data: &'static mut [u8] = Box::leak(vec![0u8; blocks * BLOCK_BYTES].into_boxed_slice());
    let meta = leak_slice_mut(blocks + spare, BlockMeta::new);
    match Pool::from_parts_with_spare(data, meta, spare) {
        Ok(p) => Box::leak(Box::new(p)),
        Err(e) => panic!("pool layout: {e}"),
    }
}

/// `n` values of `make()` in a slice that lives for the rest of the process.
fn leak_slice_mut<T>(n: usize, make: impl FnMut() -> T) -> &'static mut [T] {
    Box::leak(
        std::iter::repeat_with(make)
            .take(n)
            .collect::<Vec<_>>()
            .into_boxed_slice(),
    )
}

/// `n` values of `make()` in a shared slice that lives for the rest of the
/// process (tables sized once at start-up: a relay worker's, a client
/// context's).
pub fn leak_slice<T>(n: usize, make: impl FnMut() -> T) -> &'static [T] {
    leak_slice_mut(n, make)
}
