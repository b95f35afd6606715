//! A counting global allocator: per-thread counters over the system
//! allocator.
//!
//! Install it in a test or bench binary with
//! `#[global_allocator] static A: Counting = Counting;` and wrap the code
//! under test in [`measure`] (or read [`allocs`] / [`live_bytes`] around
//! it). Counters are thread-local, so tests running in parallel threads of
//! one binary don't see each other's allocations; a figure read in a binary
//! whose global allocator is not [`Counting`] stays 0.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

thread_local! {
    // Const-initialised and without destructor: using them never allocates.
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
    static BYTES: Cell<u64> = const { Cell::new(0) };
    static LIVE: Cell<i64> = const { Cell::new(0) };
}

/// The counting allocator; forwards to [`System`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Counting;

/// Counts one allocation of `bytes` bytes.
fn record(bytes: usize) {
    // `try_with` so allocations during thread teardown are simply not counted.
    let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
    let _ = BYTES.try_with(|c| c.set(c.get() + bytes as u64));
}

/// Adds `bytes` to the live heap bytes, or takes them off (`sign` -1).
fn add_live(bytes: usize, sign: i64) {
    let delta = i64::try_from(bytes).unwrap_or(i64::MAX) * sign;
    let _ = LIVE.try_with(|c| c.set(c.get() + delta));
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged;
// the counters are const-initialised thread-local cells that never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        record(layout.size());
        add_live(layout.size(), 1);
        // SAFETY: forwarded contract of `GlobalAlloc::alloc`.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        record(layout.size());
        add_live(layout.size(), 1);
        // SAFETY: forwarded contract of `GlobalAlloc::alloc_zeroed`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        record(new_size);
        add_live(new_size, 1);
        add_live(layout.size(), -1);
        // SAFETY: forwarded contract of `GlobalAlloc::realloc`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        add_live(layout.size(), -1);
        // SAFETY: forwarded contract of `GlobalAlloc::dealloc`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// Allocations and bytes requested by this thread while a closure ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Allocs {
    /// Number of `alloc`, `alloc_zeroed` and `realloc` calls.
    pub count: u64,
    /// Bytes requested by those calls.
    pub bytes: u64,
}

/// Snapshot of this thread's counters.
pub fn snapshot() -> Allocs {
    Allocs {
        count: ALLOCS.with(Cell::get),
        bytes: BYTES.with(Cell::get),
    }
}

/// Allocations this thread has made so far.
pub fn allocs() -> u64 {
    ALLOCS.with(Cell::get)
}

/// Heap bytes this thread has allocated less those it freed (a thread may
/// free what another allocated, so only differences are meaningful).
pub fn live_bytes() -> i64 {
    LIVE.with(Cell::get)
}

/// Runs `f` and returns its result with the allocations it made on this thread.
///
/// Only meaningful in a binary whose `#[global_allocator]` is [`Counting`].
pub fn measure<R>(f: impl FnOnce() -> R) -> (R, Allocs) {
    let before = snapshot();
    let r = f();
    let after = snapshot();
    (
        r,
        Allocs {
            count: after.count - before.count,
            bytes: after.bytes - before.bytes,
        },
    )
}
