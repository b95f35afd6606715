//! The per-worker resources of a relay: its cache pool and the core's
//! [`Router`] over the worker's origins and tables. [`Relay::new`] makes
//! them with [`WorkerTables::new`], and so does the join probe
//! (`benches/src/bin/join_relay_probe.rs`), so both route in the same
//! tables.
//!
//! [`Relay::new`]: crate::relay::Relay::new
//! [`Keep::keep_forever`]: skiff_monoio::tables::Keep::keep_forever

use std::cell::{Cell, RefCell};

use skiff_core::model::origin;
use skiff_core::pool::Pool;
use skiff_core::relay::{
    BroadcastSlot, BroadcastTable, Router, RouterLimits, RouterStorage, TrackSlot, TrackTable,
};
use skiff_monoio::tables::{GROUPS, Keep, TRACKS, pool_blocks};

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
    /// workers, quotas, failover grace), every table made here, once, in
    /// `keep`, which frees them when it drops.
    ///
    /// # Safety
    /// `keep` must drop after everything that holds what this returns (the
    /// router, the pool, and every track, group and session made from them):
    /// [`Keep`]'s own contract. A relay keeps it as its last field; a
    /// process-long caller calls [`Keep::keep_forever`].
    pub unsafe fn new(config: &RelayConfig, keep: &mut Keep) -> Self {
        let cache_bytes = config.cache_bytes;
        // A track may hold an eighth of the cache (at least 1 MiB); a
        // group over that is trimmed behind its readers.
        let track_limits = config.track_limits((cache_bytes / 8).max(1 << 20));
        let quotas = config.quotas;
        // SAFETY: the caller keeps `keep` alive past every holder (this
        // function's contract). Blocks still out when it drops are counted
        // by the pool, and relay tracks still read or written by the track
        // table: the guard below keeps the storage for those.
        let (origin, local, pool, tracks, broadcasts, storage) = unsafe {
            let origin: &'static origin::State<'static, 'static, BROADCASTS, CHANGES> =
                keep.hold(origin::State::new());
            let local: &'static origin::State<'static, 'static, BROADCASTS, CHANGES> =
                keep.hold(origin::State::new());
            // Spare metadata for the blocks other workers may lend at once.
            let pool = keep.pool_with_spare(
                cache_bytes,
                spare_slots(pool_blocks(cache_bytes), config.threads.get()),
            );
            let track_slots = keep.slice(quotas.relay_tracks as usize, || {
                TrackSlot::new(pool, track_limits)
            });
            let tracks: &'static TrackTable<'static, 'static, GROUPS> =
                keep.hold(TrackTable::new(track_slots));
            keep.guard(move || {
                // The relay is gone: its tracks go back; those still read or
                // written stay retired, and keep the storage.
                tracks.retire_all();
                tracks.reclaim();
                tracks.counts().free != tracks.capacity()
            });
            let broadcast_slots = keep.slice(BROADCAST_SLOTS, BroadcastSlot::new);
            let broadcasts: &'static BroadcastTable<'static, 'static, TRACKS> =
                keep.hold(BroadcastTable::new(broadcast_slots));
            let storage = RouterStorage {
                routes: keep.slice(BROADCAST_SLOTS, || RefCell::new(None)),
                spares: keep.slice(BROADCASTS, || RefCell::new(None)),
                pending: keep.slice(quotas.relay_tracks as usize, || Cell::new(None)),
            };
            (origin, local, pool, tracks, broadcasts, storage)
        };
        let limits = RouterLimits {
            announces: quotas.announces as usize,
            peer_announces: quotas.cluster_announces as usize,
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
