//! A global allocator that counts the allocations and the live heap bytes of
//! each thread, and a relay handler that publishes its worker's figures, for
//! the tests that hold the relay to a number of allocations or bytes.
#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::future::Future;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use skiff_relay::conn::Connection;
use skiff_relay::handler::ConnectionHandler;
use skiff_relay::relay::RelayHandler;

/// Counts allocations made by the current thread, and the heap bytes it
/// allocated less those it freed.
pub struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
    static LIVE: Cell<i64> = const { Cell::new(0) };
    static SAMPLING: Cell<bool> = const { Cell::new(false) };
}

fn add_live(bytes: usize, sign: i64) {
    let delta = i64::try_from(bytes).unwrap_or(i64::MAX) * sign;
    let _ = LIVE.try_with(|c| c.set(c.get() + delta));
}

// SAFETY: forwards to the system allocator unchanged; the counters are
// const-initialised thread-local Cells, which never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        add_live(layout.size(), 1);
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        add_live(layout.size(), 1);
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        add_live(layout.size(), -1);
        // SAFETY: same contract as our caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        add_live(new_size, 1);
        add_live(layout.size(), -1);
        // SAFETY: same contract as our caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// The relay handler, publishing the worker thread's allocation count
/// after every connection event it sees (the count is read, not changed).
pub struct Probed {
    /// The relay handler that serves the connections.
    pub inner: Rc<RelayHandler>,
    /// The worker thread's allocation count, as last sampled.
    pub count: Arc<AtomicU64>,
    /// The worker thread's live heap bytes, as last sampled, less what its
    /// buffer pools keep free for later connections (bounded by the pools'
    /// limits, not by the load).
    pub live: Arc<AtomicI64>,
}

impl ConnectionHandler for Probed {
    type Error = std::io::Error;

    fn serve(
        self: Rc<Self>,
        conn: Connection,
    ) -> impl Future<Output = Result<(), Self::Error>> + 'static {
        let (count, live) = (self.count.clone(), self.live.clone());
        // Every wake of the relay's tasks passes through the worker; sample
        // the counters from one task (started with the first connection)
        // that rides the thread's notify.
        let notify = self.inner.relay().notify().clone();
        if !SAMPLING.with(|s| s.replace(true)) {
            monoio::spawn(async move {
                let waiter = notify.waiter();
                loop {
                    let seen = notify.generation();
                    count.store(ALLOCS.with(Cell::get), Ordering::Relaxed);
                    let pooled = skiff_monoio::buffers::free_bytes() as i64;
                    live.store(LIVE.with(Cell::get) - pooled, Ordering::Relaxed);
                    waiter.changed(seen).await;
                }
            });
        }
        self.inner.clone().serve(conn)
    }
}

/// Allocations the current thread has made so far.
pub fn allocs() -> u64 {
    ALLOCS.with(Cell::get)
}
