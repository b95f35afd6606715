//! The per-worker resources of a relay: its cache pool and the core's
//! [`Router`] over the worker's origins and tables. [`Relay::new`] makes
//! them with [`WorkerTables::new`], and so does the join probe
//! (`benches/src/bin/join_relay_probe.rs`), so both route in the same
//! tables.
//!
//! [`Relay::new`]: crate::relay::Relay::new

use std::cell::{Cell, RefCell};

use skiff_core::model::origin;
use skiff_core::pool::Pool;
use skiff_core::relay::{
    BroadcastSlot, BroadcastTable, Router, RouterLimits, RouterStorage, TrackSlot, TrackTable,
};
use skiff_monoio::tables::{GROUPS, TRACKS, leak_pool_with_spare, leak_slice, pool_blocks};

use crate::config::RelayConfig;
use crate::lend::spare_slots;
use crate::relay::{BROADCAST_SLOTS, BROADCASTS};

/// Origin change-log ring length of a worker's origins.
const CHANGES: usize = 1024;

/// The router of one worker over its tables.
pub type WorkerRouter = Router<'static, 'static, 'static, TRACKS, GROUPS>;

/// What one relay worker routes in: its cache pool and its router (origins,
/// relay track and broadcast tables, the router's storage and limits).
#[derive(Debug)]
pub struct WorkerTables {
    /// The worker's cache pool, with spare metadata for the blocks the other
    /// workers may lend it at once.
    pub pool: &'static Pool<'static>,
    /// The worker's router.
    pub router: WorkerRouter,
}

impl WorkerTables {
    /// The tables of one worker as `config` sizes them (cache bytes,
    /// workers, quotas, failover grace); every table is made here, once,
    /// for the rest of the process.
    pub fn new(config: &RelayConfig) -> Self {
        let origin: &'static origin::State<'static, 'static, BROADCASTS, CHANGES> =
            Box::leak(Box::new(origin::State::new()));
        let local: &'static origin::State<'static, 'static, BROADCASTS, CHANGES> =
            Box::leak(Box::new(origin::State::new()));
        let cache_bytes = config.cache_bytes;
        // Spare metadata for the blocks other workers may lend at once.
        let pool = leak_pool_with_spare(
            cache_bytes,
            spare_slots(pool_blocks(cache_bytes), config.threads.get()),
        );
        // A track may hold an eighth of the cache (at least 1 MiB); a
        // group over that is trimmed behind its readers.
        let track_limits = config.track_limits((cache_bytes / 8).max(1 << 20));
        let quotas = config.quotas;
        let tracks: &'static TrackTable<'static, 'static, GROUPS> = Box::leak(Box::new(
            TrackTable::new(leak_slice(quotas.relay_tracks as usize, || {
                TrackSlot::new(pool, track_limits)
            })),
        ));
        let broadcasts: &'static BroadcastTable<'static, 'static, TRACKS> = Box::leak(Box::new(
            BroadcastTable::new(leak_slice(BROADCAST_SLOTS, BroadcastSlot::new)),
        ));
        let storage = RouterStorage {
            routes: leak_slice(BROADCAST_SLOTS, || RefCell::new(None)),
            spares: leak_slice(BROADCASTS, || RefCell::new(None)),
            pending: leak_slice(quotas.relay_tracks as usize, || Cell::new(None)),
        };
        let limits = RouterLimits {
            announces: quotas.announces as usize,
            pending_per_conn: quotas.pending_tracks as usize,
            pending_per_broadcast: quotas.pending_tracks_per_broadcast as usize,
            grace: skiff_monoio::clock::to_core(config.failover_grace),
        };
        WorkerTables {
            pool,
            router: Router::new(
                origin.handle(),
                local.handle(),
                broadcasts,
                tracks,
                storage,
                limits,
            ),
        }
    }
}
