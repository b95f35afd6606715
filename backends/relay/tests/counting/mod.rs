//! A relay handler that publishes its worker's allocation count and live
//! heap bytes (from the counting allocator of skiff-testkit, which the test
//! binary installs), for the tests that hold the relay to a number of
//! allocations or bytes.
#![allow(dead_code)]

use std::cell::Cell;
use std::future::Future;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use skiff_relay::conn::Connection;
use skiff_relay::handler::ConnectionHandler;
use skiff_relay::relay::RelayHandler;

#[allow(unused_imports)]
pub use skiff_testkit::counting::{Counting, allocs};
use skiff_testkit::counting::{live_bytes, snapshot};

thread_local! {
    static SAMPLING: Cell<bool> = const { Cell::new(false) };
}

/// The relay handler, publishing the worker thread's allocation count
/// after every connection event it sees (the count is read, not changed).
pub struct Probed {
    /// The relay handler that serves the connections.
    pub inner: Rc<RelayHandler>,
    /// The worker thread's allocation count, as last sampled.
    pub count: Arc<AtomicU64>,
    /// The bytes the worker thread's allocations asked for, as last sampled.
    pub bytes: Arc<AtomicU64>,
    /// The worker thread's live heap bytes, as last sampled, less what its
    /// buffer pools keep free for later connections (bounded by the pools'
    /// limits, not by the load).
    pub live: Arc<AtomicI64>,
}

impl ConnectionHandler for Probed {
    type Error = std::io::Error;

    fn quic_config(&self) -> Option<Arc<skiff_relay::handler::QuicServerConfig>> {
        self.inner.quic_config()
    }

    fn serve_quic(
        self: Rc<Self>,
        conn: skiff_relay::handler::QuicConn,
    ) -> impl Future<Output = Result<(), Self::Error>> + 'static {
        self.sample();
        self.inner.clone().serve_quic(conn)
    }

    fn serve(
        self: Rc<Self>,
        conn: Connection,
    ) -> impl Future<Output = Result<(), Self::Error>> + 'static {
        self.sample();
        self.inner.clone().serve(conn)
    }
}

impl Probed {
    /// Starts the sampling task with the thread's first connection.
    fn sample(&self) {
        let (count, bytes, live) = (self.count.clone(), self.bytes.clone(), self.live.clone());
        // Every wake of the relay's tasks passes through the worker; sample
        // the counters from one task (started with the first connection)
        // that rides the thread's notify.
        let notify = self.inner.relay().notify().clone();
        if !SAMPLING.with(|s| s.replace(true)) {
            monoio::spawn(async move {
                let changes = skiff_testkit::wait::Changes::new(&notify);
                loop {
                    let now = snapshot();
                    count.store(now.count, Ordering::Relaxed);
                    bytes.store(now.bytes, Ordering::Relaxed);
                    let pooled = skiff_monoio::buffers::free_bytes() as i64;
                    live.store(live_bytes() - pooled, Ordering::Relaxed);
                    changes.next().await;
                }
            });
        }
    }
}
