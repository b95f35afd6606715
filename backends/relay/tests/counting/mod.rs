//! A global allocator that counts the allocations of each thread, and a
//! relay handler that publishes its worker's count, for the tests that hold
//! the relay to a number of allocations.
#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::future::Future;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use skiff_relay::conn::Connection;
use skiff_relay::handler::ConnectionHandler;
use skiff_relay::relay::RelayHandler;

/// Counts allocations made by the current thread.
pub struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: forwards to the system allocator unchanged; the counter is a
// const-initialised thread-local Cell, which never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as our caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
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
}

impl ConnectionHandler for Probed {
    type Error = std::io::Error;

    fn serve(
        self: Rc<Self>,
        conn: Connection,
    ) -> impl Future<Output = Result<(), Self::Error>> + 'static {
        let count = self.count.clone();
        // Every wake of the relay's tasks passes through the worker; sample
        // the counter from a task that rides the thread's notify.
        let notify = self.inner.relay().notify().clone();
        monoio::spawn(async move {
            let waiter = notify.waiter();
            loop {
                let seen = notify.generation();
                count.store(ALLOCS.with(Cell::get), Ordering::Relaxed);
                waiter.changed(seen).await;
            }
        });
        self.inner.clone().serve(conn)
    }
}

/// Allocations the current thread has made so far.
pub fn allocs() -> u64 {
    ALLOCS.with(Cell::get)
}
