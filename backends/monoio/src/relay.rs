//! The moq-lite relay on one worker thread: [`Relay`] (per-thread state) and
//! [`RelayHandler`] (the [`ConnectionHandler`] that drives a session per
//! connection with it).
//!
//! # Routing (PROTOCOL.md §4)
//!
//! * Every client that may publish (SETUP role not "subscriber") is sent an
//!   ANNOUNCE_REQUEST for everything (`""`). Each broadcast it announces
//!   ([`Event::Announced`]) becomes a relay broadcast in the thread's origin,
//!   so every session's announce streams (ANNOUNCE_REQUEST from subscribers)
//!   list it. It is withdrawn (ANNOUNCE Ended) when the publisher
//!   unannounces it, ends the announce stream, or goes away.
//! * A downstream TRACK or SUBSCRIBE for a track the relay broadcast does
//!   not have yet reaches the session's on-demand hook
//!   ([`skiff_core::session::Resolve`]): the relay creates a relay track in
//!   the thread's block pool (the cache, `--cache-bytes` per thread), adds it
//!   to the broadcast and queues **one** upstream SUBSCRIBE on the
//!   publisher's session (§4.5: requests are merged; later subscribers find
//!   the track in the broadcast and never reach the hook). TRACK requests
//!   for it are answered once the upstream's TRACK_INFO arrived, with its
//!   values (§3.7: relays re-serve what they received), or refused with the
//!   track's code if it ends first.
//! * Each session task wakes for the tracks it serves and fills
//!   ([`crate::notify`]): a frame stored in a relay track wakes the sessions
//!   serving that track, not every session of the worker.
//! * The upstream subscription follows the downstream ones (§4.5): every
//!   session registers the subscriptions it serves on the relay track
//!   ([`track::Ref::subscribers`], [`track::Ref::demand`]); the SUBSCRIBE
//!   asks for their aggregate (highest priority and max age, latest start
//!   if any asks for latest, open end if any is open), and a change of it
//!   goes out as SUBSCRIBE_UPDATE. Once the track has had no subscriber for
//!   [`UPSTREAM_LINGER`], the upstream subscription is cancelled (FIN) and
//!   the track leaves the broadcast; the next subscriber creates a new track
//!   and a new upstream SUBSCRIBE (new Subscribe ID).
//! * The publisher's session fills the relay track group by group; every
//!   downstream session serves its subscribers from that track with their
//!   own Subscribe IDs, newest group first. Group bytes are stored once, in
//!   pool blocks of the publisher's worker, and read by every downstream
//!   session from there, on that worker and (lent over the links, see
//!   [`crate::lend`]) on the others. A group bigger than the track's budget (an eighth of the cache,
//!   at least 1 MiB) is trimmed behind its readers, so with pacing a relay
//!   holds about one stream-credit window of it past its fastest reader.
//! * If the upstream subscription fails, the relay track ends with the
//!   upstream code, which every downstream subscription passes on (§4.4);
//!   the track is removed from the broadcast so a later request tries again.
//!
//! # Leaf mode (`--upstream`)
//!
//! Each worker keeps one session to the upstream relay (skiff or moq-relay),
//! dialed again with a growing pause when it ends. Over it the worker asks
//! for every announcement, so its subscribers reach the upstream's
//! broadcasts with one upstream subscription per track, and it announces
//! its own clients' broadcasts, so the upstream's subscribers reach them.
//!
//! # Publisher failover (§4.4)
//!
//! When a publisher's session ends (or its announce stream does), its
//! broadcasts are unannounced at once, but their relay tracks are
//! failover tracks ([`track::Ref::set_failover`]): the session's loss
//! aborts their open groups and detaches the source, and the tracks, with
//! every downstream subscription on them, wait for `--failover-grace`. A
//! source announcing the same path in time (another connection, the
//! upstream, another worker) is adopted: each track of the broadcast is
//! subscribed again from it, at its latest group, and the subscribers go on
//! with the new source's groups without being touched (O(tracks)). A source
//! that announces a path already served waits as a spare and takes over at
//! once when the current source goes away. With no new source in time, the
//! tracks end with SESSION_CLOSED.
//!
//! # Limits (known)
//!
//! * Across worker threads, broadcasts travel over pairwise worker links
//!   ([`Mesh`]): one moq-lite session per worker pair over a Unix socket
//!   pair. Payload crosses by reference (lent blocks, [`crate::lend`]); a
//!   link lends at most [`crate::lend::lend_limit`] block ranges at once (the
//!   links of a worker together at most half its pool); past that, it
//!   copies payload through the socket again until ranges come back. The
//!   link mesh costs T×(T−1) sessions of about 430 KiB for T workers. Links
//!   and a leaf's upstream session are trunks: their
//!   tables ([`crate::session_driver::TrunkStorage`]) carry 128 concurrent
//!   subscriptions each way (`tests/trunk.rs` runs about 96 across a
//!   link); one more is refused like a full table. The upstream session's
//!   control buffers are 2 KiB ([`crate::session_driver::UpstreamStorage`]):
//!   its SETUP carries the upstream URL's path and query. A client connection's
//!   session is smaller (128 stream slots, 64 subscriptions each way): a
//!   client may hold 32 subscriptions on the relay at once, and the relay
//!   up to 64 on a publishing client (32 on skiff's own client, which
//!   advertises a quarter of its 128 slots). Its control messages are at
//!   most 1 KiB: a client whose SETUP is longer (a URL with a long token)
//!   is closed with INTERNAL (0x0).
//! * The upstream aggregate is exact while the subscribers of a track use at
//!   most four distinct values of each preference (priority, max age, start,
//!   end); past that, the values that did not fit are kept as a bound until
//!   the track has no subscriber. Updates keep the start of the SUBSCRIBE:
//!   a later subscriber asking for an older start than the upstream one is
//!   served from what the cache holds.
//! * Broadcast and track states are allocated once each and never freed (the
//!   session's media model hands out plain references); a long-running relay
//!   with many short-lived broadcasts grows by a few hundred bytes per
//!   broadcast and track (group bytes live in the pool and are freed).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::{Duration as StdDuration, Instant as StdInstant};

use skiff_core::model::path::Path;
use skiff_core::model::{broadcast, origin, track};
use skiff_core::pool::{BlockMeta, Pool};
use skiff_core::relay::{BroadcastSlot, BroadcastTable, TrackSlot, TrackTable};

use crate::lend::{Borrower, Lender, LinkShare, lend_limit, return_released, spare_slots};
use skiff_core::session::{
    AnnounceId, Config, ConfigError, Error as SessionError, Event, Resolve, Session, SubscriptionId,
};
use skiff_core::window::{Request, Start};
use skiff_core::wire::lite::{Role, StreamCode};
use skiff_core::wire::qmux::Side;

use crate::clock::Clock;
use crate::config::{Quotas, RelayConfig, Upstream as UpstreamAddr};
use crate::conn::Connection;
use crate::handler::{ConnectionHandler, WorkerInfo};
use crate::metrics::Metrics;
use crate::notify::Notify;
use crate::session_driver::{
    App, ByteRead, ByteWrite, DriveCtx, Ended, MoqSession, StoragePool, TrunkSession, TrunkStorage,
    UpstreamStorage, drive, split_halves,
};

/// Broadcasts one worker's origin holds at once.
pub const BROADCASTS: usize = 1024;
/// Origin change-log ring length.
const CHANGES: usize = 1024;
/// Tracks per relay broadcast.
pub const TRACKS: usize = 64;
/// Groups a relay track holds at once.
pub const GROUPS: usize = 32;
/// Bytes per cache block.
pub const BLOCK_BYTES: usize = 16384;
/// Broadcast states per worker: its origin's [`BROADCASTS`] and as many
/// standbys (local sources of paths served over a link), about 2.2 KiB each.
pub const BROADCAST_SLOTS: usize = 2 * BROADCASTS;

/// A session's queue of upstream subscriptions to make.
#[derive(Debug, Default)]
pub struct PendingSubscribes {
    pending: RefCell<Vec<(String, track::Ref<'static, 'static>)>>,
}

/// A source announcing a path that another source serves: the next source
/// if that one goes away.
struct Spare {
    path: String,
    owner: u64,
    upstream: Rc<PendingSubscribes>,
    local: bool,
}

struct Entry {
    path: String,
    /// Announced by a client of this worker (not learned over a link).
    local: bool,
    /// In the worker's origin (what its subscribers see). False for a
    /// standby: a local source of a path this worker already reaches over a
    /// link, offered only to the other workers (see [`Relay::add_broadcast`]).
    routed: bool,
    handle: broadcast::Ref<'static, 'static>,
    producer: broadcast::Producer<'static, 'static>,
    owner: u64,
    upstream: Rc<PendingSubscribes>,
    /// While the source is gone and the failover grace period runs: the
    /// token of that period's timer.
    orphan: Option<u64>,
}

/// The relay state of one worker thread: origin, cache pool, routes.
pub struct Relay {
    origin: origin::Ref<'static, 'static>,
    /// The broadcasts of this worker's own clients: what links announce to
    /// the other workers (one hop, so nothing loops).
    local_origin: origin::Ref<'static, 'static>,
    pool: &'static Pool<'static>,
    hop: u64,
    /// The configuration of every client session of this worker.
    session_config: Config<'static>,
    /// The configuration of its trunks (links, upstream).
    trunk_config: Config<'static>,
    notify: Rc<Notify>,
    entries: RefCell<Vec<Entry>>,
    /// Sources waiting to take over a path (oldest first; at most
    /// [`BROADCASTS`], one per owner and path).
    spares: RefCell<Vec<Spare>>,
    /// Where to publish the cache gauges: all counters and this worker's index.
    metrics: Option<(Arc<Metrics>, usize)>,
    /// How long a broadcast whose source left waits for a new source.
    grace: StdDuration,
    /// The next orphan timer's token.
    next_token: Cell<u64>,
    /// What this worker lent to each other worker, by its index.
    lenders: RefCell<Vec<Option<Rc<Lender>>>>,
    /// What each other worker lends to this one, by its index (where the
    /// pool's released foreign blocks go back to).
    borrowed: RefCell<Vec<Option<Arc<LinkShare>>>>,
    /// Every relay track of this worker (sized by `--max-relay-tracks`).
    tracks: TrackTable<'static, 'static, GROUPS>,
    /// Every broadcast this worker routes or keeps as a standby
    /// ([`BROADCAST_SLOTS`]).
    broadcasts: BroadcastTable<'static, 'static, TRACKS>,
    /// Relay tracks created on a client's request that wait for their
    /// source's first answer (TRACK_INFO or refusal): at most
    /// [`Quotas::relay_tracks`] entries, room reserved at start.
    pending: RefCell<Vec<PendingTrack>>,
    /// What one peer may take.
    quotas: Quotas,
    /// When retired relay tracks were last taken back.
    last_reclaim: Cell<StdInstant>,
}

/// A relay track made for a client's request, until its source answers.
struct PendingTrack {
    track: track::Ref<'static, 'static>,
    /// The connection that asked.
    conn: u64,
    broadcast: broadcast::Ref<'static, 'static>,
}

impl PendingTrack {
    /// Still waiting: the same track, open, without its TRACK_INFO.
    fn waits(&self) -> bool {
        self.track.is_current()
            && !self.track.info_known()
            && self.track.status() == track::Status::Open
    }
}

/// How often retired relay tracks are looked at again (they are also taken
/// back whenever a new one is needed and none is free).
const RECLAIM_EVERY: StdDuration = StdDuration::from_millis(250);

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("hop", &self.hop)
            .field("broadcasts", &self.entries.borrow().len())
            .field("pool_in_use", &self.pool.in_use())
            .finish()
    }
}

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
/// blocks lent by other workers ([`crate::lend`]).
///
/// # Panics
/// As [`leak_pool`].
pub fn leak_pool_with_spare(bytes: u64, spare: usize) -> &'static Pool<'static> {
    let blocks = pool_blocks(bytes);
    let spare = spare.min((u32::MAX / 2) as usize - 1);
    let data: &'static mut [u8] = Box::leak(vec![0u8; blocks * BLOCK_BYTES].into_boxed_slice());
    let meta: &'static mut [BlockMeta] = Box::leak(
        (0..blocks + spare)
            .map(|_| BlockMeta::new())
            .collect::<Vec<_>>()
            .into_boxed_slice(),
    );
    match Pool::from_parts_with_spare(data, meta, spare) {
        Ok(p) => Box::leak(Box::new(p)),
        Err(e) => panic!("pool layout: {e}"),
    }
}

impl Relay {
    /// The relay state of one thread, configured by `config` (cache size,
    /// session limits and credit, failover grace).
    pub fn new(hop: u64, config: &RelayConfig, notify: Rc<Notify>) -> Self {
        let origin: &'static origin::State<'static, 'static, BROADCASTS, CHANGES> =
            Box::leak(Box::new(origin::State::new()));
        let local: &'static origin::State<'static, 'static, BROADCASTS, CHANGES> =
            Box::leak(Box::new(origin::State::new()));
        let cache_bytes = config.cache_bytes;
        let pool = leak_pool_with_spare(
            cache_bytes,
            spare_slots(pool_blocks(cache_bytes), config.threads.get()),
        );
        // A track may hold an eighth of the cache (at least 1 MiB); a
        // group over that is trimmed behind its readers.
        let track_limits = config.track_limits((cache_bytes / 8).max(1 << 20));
        let quotas = config.quotas;
        // The track table: made once here, reused for the worker's life.
        let slots: &'static [TrackSlot<'static, GROUPS>] = Box::leak(
            (0..quotas.relay_tracks)
                .map(|_| TrackSlot::new(pool, track_limits))
                .collect::<Vec<_>>()
                .into_boxed_slice(),
        );
        let broadcast_slots: &'static [BroadcastSlot<'static, 'static, TRACKS>] = Box::leak(
            (0..BROADCAST_SLOTS)
                .map(|_| BroadcastSlot::new())
                .collect::<Vec<_>>()
                .into_boxed_slice(),
        );
        Relay {
            origin: origin.handle(),
            local_origin: local.handle(),
            // Spare metadata for the blocks other workers may lend at once.
            pool,
            hop,
            session_config: config.session_config(hop),
            trunk_config: config.trunk_session_config(hop),
            notify,
            entries: RefCell::new(Vec::new()),
            spares: RefCell::new(Vec::new()),
            metrics: None,
            grace: config.failover_grace,
            next_token: Cell::new(0),
            lenders: RefCell::new(Vec::new()),
            borrowed: RefCell::new(Vec::new()),
            tracks: TrackTable::new(slots),
            broadcasts: BroadcastTable::new(broadcast_slots),
            pending: RefCell::new(Vec::with_capacity(quotas.relay_tracks as usize)),
            quotas,
            last_reclaim: Cell::new(StdInstant::now()),
        }
    }

    /// Counts a refusal by a quota (metric, debug log).
    fn quota_refused(&self, what: &'static str, conn: u64, path: &str) {
        tracing::debug!(conn, path, quota = what, "over quota: request refused");
        if let Some((m, i)) = &self.metrics {
            m.thread(*i).add_quota_refused();
        }
    }

    /// Takes back retired relay tracks nobody uses any more, at most every
    /// [`RECLAIM_EVERY`] (O(retired tracks)).
    fn reclaim_tracks(&self) {
        if self.tracks.counts().retired == 0 && self.broadcasts.counts().retired == 0 {
            return;
        }
        let now = StdInstant::now();
        if now.duration_since(self.last_reclaim.get()) < RECLAIM_EVERY {
            return;
        }
        self.last_reclaim.set(now);
        self.broadcasts.reclaim();
        if self.tracks.reclaim() > 0 {
            self.publish_gauges();
        }
    }

    /// Relay tracks held now (claimed, or retired and not idle yet).
    pub fn relay_tracks(&self) -> usize {
        let c = self.tracks.counts();
        c.claimed + c.retired
    }

    /// Sends the blocks other workers lent back to them once this worker's
    /// pool let go of them, and takes back what they returned (see
    /// [`crate::lend`]; a link's own task does that too, this covers a link
    /// whose session is over).
    pub fn return_lent(&self) {
        if self.pool.has_released() {
            return_released(self.pool, &self.borrowed.borrow());
        }
        let mut back = 0;
        for lender in self.lenders.borrow().iter().flatten() {
            back += lender.reclaim();
        }
        if back > 0 {
            // Pool room: producers waiting for it may go on.
            self.notify.bump_consumed();
        }
    }

    /// Bytes this worker lent to other workers so far (instead of copying
    /// them over the links), and the ranges not returned yet.
    pub fn lent(&self) -> (u64, usize) {
        self.lenders
            .borrow()
            .iter()
            .flatten()
            .fold((0, 0), |(b, n), l| {
                (b + l.lent_bytes(), n + l.outstanding())
            })
    }

    /// Registers the two directions of the link to worker `peer`.
    fn add_link(&self, peer: usize, lender: Rc<Lender>, borrowed: Arc<LinkShare>) {
        let mut lenders = self.lenders.borrow_mut();
        let mut shares = self.borrowed.borrow_mut();
        if lenders.len() <= peer {
            lenders.resize(peer + 1, None);
            shares.resize(peer + 1, None);
        }
        lenders[peer] = Some(lender);
        shares[peer] = Some(borrowed);
    }

    /// The thread's origin (what subscribers see).
    pub fn origin(&self) -> origin::Ref<'static, 'static> {
        self.origin
    }

    /// The cache pool.
    pub fn pool(&self) -> &'static Pool<'static> {
        self.pool
    }

    /// The relay's Hop ID.
    pub fn hop(&self) -> u64 {
        self.hop
    }

    /// The thread's media-change signal.
    pub fn notify(&self) -> &Rc<Notify> {
        &self.notify
    }

    /// Copies the cache pool's bytes in use and high-water mark to the
    /// worker's metrics (two relaxed stores).
    fn publish_gauges(&self) {
        if let Some((m, i)) = &self.metrics {
            let block = self.pool.block_size() as u64;
            m.thread(*i).set_cache(
                self.pool.in_use() as u64 * block,
                self.pool.high_water() as u64 * block,
            );
            let (bytes, ranges) = self.lent();
            m.thread(*i).set_lent(bytes, ranges as u64);
            m.thread(*i).set_tables(
                self.relay_tracks() as u64,
                self.entries.borrow().len() as u64,
            );
        }
    }

    /// Broadcasts routed now.
    pub fn broadcasts(&self) -> usize {
        self.entries.borrow().len()
    }

    /// Registers broadcast `path` announced by connection `owner` (`local`:
    /// a client of this worker, not a link or the upstream).
    ///
    /// If the path is routed already:
    /// * its source is gone (failover grace period): the new announcement
    ///   becomes its source, and every track of it is asked for again from
    ///   the new source; subscribers stay where they are and go on with the
    ///   new source's groups (O(tracks), nothing per subscriber);
    /// * it is learned from another worker and this announcement is local: it
    ///   becomes a standby, offered only to the other workers, so the worker
    ///   serving the route can fail over to it;
    /// * otherwise the first source is kept.
    fn add_broadcast(&self, path: &str, owner: u64, upstream: &Rc<PendingSubscribes>, local: bool) {
        let Ok(p) = Path::new(path) else {
            tracing::debug!(path, "announced path refused");
            return;
        };
        let mut routed = true;
        if local {
            let held = self
                .entries
                .borrow()
                .iter()
                .filter(|e| e.owner == owner)
                .count()
                + self
                    .spares
                    .borrow()
                    .iter()
                    .filter(|s| s.owner == owner)
                    .count();
            if held >= self.quotas.announces as usize {
                self.quota_refused("max-announces", owner, path);
                return;
            }
        }
        {
            let mut entries = self.entries.borrow_mut();
            if let Some(e) = entries.iter_mut().find(|e| e.routed && e.path == path) {
                if e.orphan.is_some() {
                    self.adopt(e, owner, upstream, local);
                    return;
                }
                if !local || e.local || self.local_origin.get(p).is_some() {
                    // Kept as the next source, should the current one go away
                    // (a publisher that reconnects before its old connection
                    // is known to be dead).
                    tracing::debug!(
                        path,
                        owner,
                        "broadcast already routed; this source waits as a spare"
                    );
                    let mut spares = self.spares.borrow_mut();
                    if spares.iter().any(|s| s.owner == owner && s.path == path) {
                        return;
                    }
                    if spares.len() >= BROADCASTS {
                        tracing::debug!(path, owner, "spare table full: announcement ignored");
                        return;
                    }
                    spares.push(Spare {
                        path: path.to_owned(),
                        owner,
                        upstream: upstream.clone(),
                        local,
                    });
                    return;
                }
                routed = false;
            }
        }
        let handle = match self.broadcasts.claim(p) {
            Ok(b) => b,
            Err(e) => {
                self.quota_refused("broadcast table", owner, path);
                tracing::debug!(path, error = %e, "announcement ignored");
                return;
            }
        };
        let Ok(producer) = handle.producer() else {
            self.broadcasts.retire(handle);
            return;
        };
        if routed && let Err(e) = self.origin.announce(handle) {
            tracing::warn!(path, error = %e, "cannot route broadcast");
            drop(producer);
            self.broadcasts.retire(handle);
            return;
        }
        if local && let Err(e) = self.local_origin.announce(handle) {
            tracing::warn!(path, error = %e, "cannot offer broadcast to other workers");
        }
        tracing::info!(path, owner, local, routed, "broadcast announced");
        self.entries.borrow_mut().push(Entry {
            path: path.to_owned(),
            local,
            routed,
            handle,
            producer,
            owner,
            upstream: upstream.clone(),
            orphan: None,
        });
        self.notify.bump();
    }

    /// Makes `owner` the source of orphaned broadcast `e`: every track of it
    /// is subscribed again through `upstream`'s session.
    fn adopt(&self, e: &mut Entry, owner: u64, upstream: &Rc<PendingSubscribes>, local: bool) {
        e.owner = owner;
        e.orphan = None;
        e.upstream = upstream.clone();
        let held = e.handle.path();
        let path = held.as_path();
        if self.origin.get(path).is_none()
            && let Err(err) = self.origin.announce(e.handle)
        {
            tracing::warn!(path = %e.path, error = %err, "cannot route broadcast again");
        }
        if e.local && !local {
            self.local_origin.unannounce(path);
        }
        if local
            && self.local_origin.get(path).is_none()
            && let Err(err) = self.local_origin.announce(e.handle)
        {
            tracing::warn!(path = %e.path, error = %err, "cannot offer broadcast to other workers");
        }
        e.local = local;
        let mut queue = upstream.pending.borrow_mut();
        let mut spliced = 0usize;
        for t in e.handle.tracks() {
            if t.status() == track::Status::Open {
                queue.push((e.path.clone(), t));
                spliced += 1;
            }
        }
        tracing::info!(path = %e.path, owner, tracks = spliced, "broadcast announced again: subscribers spliced to the new source");
        self.notify.bump();
    }

    /// Withdraws `path` if `owner` announced it (the publisher ended it).
    fn remove_broadcast(&self, path: &str, owner: u64) {
        self.spares
            .borrow_mut()
            .retain(|s| !(s.owner == owner && s.path == path));
        let mut entries = self.entries.borrow_mut();
        if let Some(i) = entries
            .iter()
            .position(|e| e.owner == owner && e.orphan.is_none() && e.path == path)
        {
            let mut e = entries.swap_remove(i);
            self.withdraw(&mut e, StreamCode::Cancel);
        }
    }

    /// The source `owner` of some broadcasts is gone. Each is unannounced
    /// at once (ANNOUNCE Ended downstream, PROTOCOL.md §4.4), but its tracks
    /// stay open and their subscriptions in flight wait, for the failover
    /// grace period: announced again in time, it continues from the new
    /// source ([`Relay::adopt`]); otherwise its tracks end.
    fn orphan_owned(self: &Rc<Self>, owner: u64) {
        self.spares.borrow_mut().retain(|s| s.owner != owner);
        let mut entries = self.entries.borrow_mut();
        // A standby source: nothing waits on it.
        while let Some(i) = entries.iter().position(|e| e.owner == owner && !e.routed) {
            let mut e = entries.swap_remove(i);
            self.withdraw(&mut e, StreamCode::SessionClosed);
        }
        for e in entries
            .iter_mut()
            .filter(|e| e.owner == owner && e.orphan.is_none())
        {
            let spare = {
                let mut spares = self.spares.borrow_mut();
                let i = spares.iter().position(|s| s.path == e.path);
                i.map(|i| spares.remove(i))
            };
            if let Some(s) = spare {
                // The announcement stays: the spare takes over at once.
                self.adopt(e, s.owner, &s.upstream, s.local);
                continue;
            }
            let held = e.handle.path();
            let path = held.as_path();
            self.origin.unannounce(path);
            if e.local {
                self.local_origin.unannounce(path);
            }
            let token = self.next_token.get();
            self.next_token.set(token + 1);
            e.orphan = Some(token);
            // Requests made while orphaned wait for the next source (which
            // subscribes every track of the broadcast anyway).
            e.upstream = Rc::new(PendingSubscribes::default());
            tracing::info!(path = %e.path, owner, grace = ?self.grace, "broadcast source gone; waiting for it to be announced again");
            let relay = self.clone();
            monoio::spawn(async move {
                monoio::time::sleep(relay.grace).await;
                relay.expire(token);
            });
        }
    }

    /// The grace period of orphan timer `token` is over: withdraw its
    /// broadcast if it found no new source.
    fn expire(&self, token: u64) {
        let mut entries = self.entries.borrow_mut();
        if let Some(i) = entries.iter().position(|e| e.orphan == Some(token)) {
            let mut e = entries.swap_remove(i);
            tracing::info!(path = %e.path, "broadcast found no new source in time");
            self.withdraw(&mut e, StreamCode::SessionClosed);
        }
    }

    /// Ends a broadcast: unannounced everywhere, tracks still waiting for a
    /// source aborted with `code`.
    fn withdraw(&self, e: &mut Entry, code: StreamCode) {
        tracing::info!(path = %e.path, "broadcast withdrawn");
        if e.orphan.is_none()
            && let Ok(p) = Path::new(&e.path)
        {
            if e.routed {
                self.origin.unannounce(p);
            }
            if e.local {
                self.local_origin.unannounce(p);
            }
        }
        for t in e.handle.tracks() {
            end_track(t, code);
            // Served on to its last readers, then reused.
            self.tracks.retire(t);
        }
        e.producer.finish();
        // Out of both origins now; reused once its producer (with the entry) is gone.
        self.broadcasts.retire(e.handle);
        self.notify.bump();
    }

    /// Forgets relay track `t` of `path` (its upstream subscription ended or
    /// was cancelled), so the next request for its name resolves a new one.
    /// A newer track of the same name is left alone.
    fn drop_track(&self, path: &str, t: track::Ref<'static, 'static>) {
        let name = t.info().name;
        for e in self.entries.borrow().iter().filter(|e| e.path == path) {
            if e.handle
                .track(name.as_str())
                .is_some_and(|x| x.same_track(&t))
            {
                e.producer.remove(name.as_str());
                self.tracks.retire(t);
                return;
            }
        }
    }
}

/// Ends relay track `t` with `code` unless it finished or has a source:
/// readers get the error, downstream subscriptions pass it on (§4.4).
fn end_track(t: track::Ref<'static, 'static>, code: StreamCode) {
    t.set_failover(false);
    if t.status() == track::Status::Open
        && let Ok(mut p) = t.producer()
    {
        p.abort(code.to_code());
    }
}

impl Relay {
    /// The relay track `name` of `broadcast`, made now for connection `conn`
    /// (`None`: a trunk, whose requests are not held to the client quotas),
    /// and one upstream SUBSCRIBE queued for it.
    ///
    /// # Errors
    /// NOT_FOUND for a broadcast this worker does not route or a name that
    /// cannot be a track; EVICTED (0x35, "dropped under memory pressure",
    /// the closest code for a refusal to hold more state) when the track
    /// table is full or the connection or broadcast has
    /// [`Quotas::pending_tracks`] / [`Quotas::pending_tracks_per_broadcast`]
    /// requests waiting for their source already. Nothing is kept for a
    /// refused request.
    fn resolve_for(
        &self,
        conn: Option<u64>,
        broadcast: broadcast::Ref<'static, 'static>,
        name: &str,
    ) -> Result<track::Ref<'static, 'static>, StreamCode> {
        let entries = self.entries.borrow();
        let e = entries
            .iter()
            .find(|e| e.handle.same_broadcast(&broadcast))
            .ok_or(StreamCode::NotFound)?;
        let info = track::Info::new(name).map_err(|_| StreamCode::NotFound)?;
        let mut pending = self.pending.borrow_mut();
        pending.retain(PendingTrack::waits);
        if let Some(conn) = conn {
            if pending.iter().filter(|p| p.conn == conn).count()
                >= self.quotas.pending_tracks as usize
            {
                self.quota_refused("max-pending-tracks", conn, &e.path);
                return Err(StreamCode::Evicted);
            }
            if pending
                .iter()
                .filter(|p| p.broadcast.same_broadcast(&broadcast))
                .count()
                >= self.quotas.pending_tracks_per_broadcast as usize
            {
                self.quota_refused("max-pending-tracks-per-broadcast", conn, &e.path);
                return Err(StreamCode::Evicted);
            }
        }
        let Ok(t) = self.tracks.claim(info) else {
            self.quota_refused("max-relay-tracks", conn.unwrap_or(0), &e.path);
            return Err(StreamCode::Evicted);
        };
        // Its TRACK_INFO is the source's: TRACK requests wait for it.
        t.await_info();
        // The track outlives a source that goes away (publisher failover).
        t.set_failover(true);
        if e.producer.add(t).is_err() {
            // The broadcast's track places are all taken.
            self.tracks.retire(t);
            return Err(StreamCode::NotFound);
        }
        tracing::debug!(path = %e.path, track = name, "relay track created");
        if let Some(conn) = conn
            && pending.len() < pending.capacity()
        {
            pending.push(PendingTrack {
                track: t,
                conn,
                broadcast,
            });
        }
        if e.orphan.is_none() {
            e.upstream.pending.borrow_mut().push((e.path.clone(), t));
        }
        self.notify.bump();
        Ok(t)
    }
}

impl Resolve<'static, 'static> for Relay {
    fn resolve(
        &self,
        broadcast: broadcast::Ref<'static, 'static>,
        name: &str,
    ) -> Result<track::Ref<'static, 'static>, StreamCode> {
        self.resolve_for(None, broadcast, name)
    }
}

/// The on-demand hook of one client connection: [`Relay::resolve_for`] with
/// the connection's id, so its requests count against its quotas.
struct ClientResolver {
    relay: Rc<Relay>,
    conn: u64,
}

impl Resolve<'static, 'static> for ClientResolver {
    fn resolve(
        &self,
        broadcast: broadcast::Ref<'static, 'static>,
        name: &str,
    ) -> Result<track::Ref<'static, 'static>, StreamCode> {
        self.relay.resolve_for(Some(self.conn), broadcast, name)
    }
}

/// The upstream request of a relay track nobody subscribes to yet (a TRACK
/// request created it, the SUBSCRIBE follows; or a new source re-splices
/// it): the live edge, priority 0, with the publisher's default max age
/// (PROTOCOL.md §4.5, §4.7), so groups published before the first
/// SUBSCRIBE_UPDATE arrives are not given up; the first subscriber's
/// preferences follow as SUBSCRIBE_UPDATE.
const UPSTREAM: Request = Request {
    max_latency: track::DEFAULT_MAX_AGE,
    ..Request::LIVE
};

/// How long an upstream subscription is kept after its relay track lost its
/// last downstream subscriber, before it is cancelled (PROTOCOL.md §4.5): a
/// subscriber that switches away and back, or reconnects, finds the track
/// still warm.
pub const UPSTREAM_LINGER: StdDuration = StdDuration::from_secs(2);

/// The SUBSCRIBE for relay track `t` (PROTOCOL.md §4.5): the aggregate of
/// its downstream subscriptions ([`track::Ref::demand`]), or [`UPSTREAM`]
/// while it has none. A track that holds groups already (a new source takes
/// over, §4.4) continues from the new source's latest group.
fn upstream_request(t: track::Ref<'static, 'static>) -> Request {
    match t.demand() {
        None => UPSTREAM,
        Some(d) if t.latest().is_some() => Request {
            start: Start::Latest,
            ..d
        },
        Some(d) => d,
    }
}

/// One upstream subscription of a session: it fills relay track `track` of
/// broadcast `path`.
struct UpstreamSub {
    id: SubscriptionId,
    path: String,
    track: track::Ref<'static, 'static>,
    /// The preferences last sent (SUBSCRIBE or SUBSCRIBE_UPDATE).
    sent: Request,
    /// Since when the track has had no downstream subscriber.
    idle_since: Option<StdInstant>,
}

/// What is at the other end of a relay session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Peer {
    /// An accepted client: a publisher, a subscriber, or a leaf relay.
    Client,
    /// Another worker of this relay, over a socket pair.
    Link,
    /// The upstream relay this one is a leaf of (`--upstream`), dialed with
    /// this SETUP path.
    Upstream(&'static str),
}

impl Peer {
    /// Broadcasts learned from this peer belong to this worker's clients
    /// (and so are offered to the other workers and to the upstream).
    fn is_local(self) -> bool {
        self == Peer::Client
    }
}

/// The relay side of one connection.
struct RelayConn {
    relay: Rc<Relay>,
    id: u64,
    peer: Peer,
    upstream: Rc<PendingSubscribes>,
    want_announce: bool,
    announce: Option<AnnounceId>,
    subs: Vec<UpstreamSub>,
    /// A link: what it lends to the other worker.
    lender: Option<Rc<Lender>>,
}

impl RelayConn {
    /// Keeps each upstream subscription in line with its relay track's
    /// downstream subscriptions (PROTOCOL.md §4.5): a changed aggregate goes
    /// out as SUBSCRIBE_UPDATE; a track without subscriber for
    /// [`UPSTREAM_LINGER`] has its upstream subscription cancelled (FIN) and
    /// leaves the broadcast, so the next subscriber resolves a new track and
    /// a new upstream SUBSCRIBE. O(subscriptions) per call, no allocation
    /// (but one timer task when a track becomes idle).
    fn follow_demand<const N: usize>(&mut self, session: &mut Session<'_, 'static, 'static, N>) {
        let mut now = None;
        let mut i = 0;
        while let Some(s) = self.subs.get_mut(i) {
            let Some(demand) = s.track.demand() else {
                let now = *now.get_or_insert_with(StdInstant::now);
                match s.idle_since {
                    None => {
                        s.idle_since = Some(now);
                        // The session may not wake on its own by then.
                        let notify = self.relay.notify.clone();
                        monoio::spawn(async move {
                            monoio::time::sleep(UPSTREAM_LINGER).await;
                            notify.bump();
                        });
                    }
                    Some(since) if now.duration_since(since) >= UPSTREAM_LINGER => {
                        let UpstreamSub {
                            id, path, track, ..
                        } = self.subs.swap_remove(i);
                        tracing::debug!(path, track = %track.info().name, "no subscriber left: upstream subscription cancelled");
                        // Out of the broadcast first, so nobody new is
                        // served from it; then the FIN finishes it.
                        self.relay.drop_track(&path, track);
                        track.set_failover(false);
                        if session.unsubscribe(id).is_err() {
                            end_track(track, StreamCode::Cancel);
                        }
                        continue;
                    }
                    Some(_) => {}
                }
                i += 1;
                continue;
            };
            s.idle_since = None;
            // The start stays what the SUBSCRIBE asked (an update with
            // another start would reposition the upstream window).
            let want = Request {
                start: s.sent.start,
                ..demand
            };
            // Refused while the send buffer is full (tried again next round)
            // or once the subscription is over (its close event follows).
            if want != s.sent && session.update(s.id, want).is_ok() {
                tracing::trace!(
                    path = s.path,
                    priority = want.priority,
                    "upstream subscription updated"
                );
                s.sent = want;
            }
            i += 1;
        }
    }
}

impl<const N: usize> App<N> for RelayConn {
    /// Idle unless an announce request, an upstream subscription to make, or
    /// a change of demand (an update, a linger to start or to end) waits.
    fn is_idle(&self) -> bool {
        !self.want_announce
            && self.upstream.pending.borrow().is_empty()
            && self
                .subs
                .iter()
                .all(|s| match (s.track.demand(), s.idle_since) {
                    (None, Some(since)) => since.elapsed() < UPSTREAM_LINGER,
                    (Some(d), None) => {
                        Request {
                            start: s.sent.start,
                            ..d
                        } == s.sent
                    }
                    _ => false,
                })
    }

    fn on_event(&mut self, event: &Event<'_>) {
        match *event {
            Event::Setup { role, path, .. } => {
                tracing::debug!(conn = self.id, ?role, path, "client setup");
                // PROTOCOL.md §4.1: a client that only subscribes has nothing to announce.
                self.want_announce =
                    self.announce.is_none() && (!self.peer.is_local() || role != Role::Subscriber);
            }
            Event::Announced { path, .. } => {
                self.relay
                    .add_broadcast(path, self.id, &self.upstream, self.peer.is_local())
            }
            Event::Unannounced { path, .. } => self.relay.remove_broadcast(path, self.id),
            Event::AnnounceEnded { request, .. } if Some(request) == self.announce => {
                self.announce = None;
                self.relay.orphan_owned(self.id);
            }
            Event::TrackInfo { subscription, info } => {
                // PROTOCOL.md §3.7: the relay track re-serves what its source
                // said; TRACK requests waiting for it are answered now.
                if let Some(s) = self.subs.iter().find(|s| s.id == subscription) {
                    s.track.set_info(info);
                }
            }
            Event::SubscriptionClosed { subscription, code } => {
                if let Some(i) = self.subs.iter().position(|s| s.id == subscription) {
                    let UpstreamSub { path, track: t, .. } = self.subs.swap_remove(i);
                    tracing::debug!(path, track = %t.info().name, ?code, "upstream subscription over");
                    // A track that ended normally stays in the cache, so a subscriber
                    // whose request arrives after the end still gets the cached groups
                    // and SUBSCRIBE_END; one the source refused or abandoned ends
                    // (its subscribers get the code) and is asked for again next time.
                    let finished = code.is_none() && t.status() == track::Status::Finished;
                    if !finished {
                        end_track(t, code.map_or(StreamCode::Internal, StreamCode::from_code));
                        self.relay.drop_track(&path, t);
                        // The sessions serving it pass the code on now (the
                        // track left this session's filled set with its end).
                        self.relay.notify.bump_tracks([t.key()]);
                    }
                }
            }
            Event::Closed {
                code,
                reason,
                local,
                ..
            } => {
                tracing::debug!(conn = self.id, code, reason, local, "session closed");
            }
            _ => {}
        }
    }

    fn lender(&self) -> Option<&Lender> {
        self.lender.as_deref()
    }

    fn act(&mut self, session: &mut Session<'_, 'static, 'static, N>) {
        self.relay.publish_gauges();
        self.relay.return_lent();
        self.relay.reclaim_tracks();
        if self.want_announce && session.is_established() {
            match session.announce_request("") {
                Ok(a) => {
                    self.announce = Some(a);
                    self.want_announce = false;
                }
                Err(SessionError::NotReady) => {}
                Err(e) => {
                    tracing::debug!(error = %e, "announce request failed");
                    self.want_announce = false;
                }
            }
        }
        let mut pending = self.upstream.pending.borrow_mut();
        while let Some((path, t)) = pending.first().cloned() {
            if !t.is_current() {
                // Given up and reused before it was asked for.
                pending.remove(0);
                continue;
            }
            let request = upstream_request(t);
            match session.subscribe(&path, t, request) {
                Ok(id) => self.subs.push(UpstreamSub {
                    id,
                    path,
                    track: t,
                    sent: request,
                    idle_since: None,
                }),
                // Control slots come back as TRACK requests are answered:
                // the rest waits for the next round, in order.
                Err(SessionError::ControlFull | SessionError::NotReady) => break,
                Err(e) => {
                    tracing::debug!(path, error = %e, "upstream subscribe failed");
                    end_track(t, StreamCode::Internal);
                    self.relay.drop_track(&path, t);
                }
            }
            pending.remove(0);
        }
        drop(pending);
        self.follow_demand(session);
    }

    fn on_close(&mut self) {
        // The session's tracks were detached from it, not ended (they are
        // failover tracks): they wait with their broadcasts for a new source.
        self.subs.clear();
        self.relay.orphan_owned(self.id);
        // Requests queued for this session will never be made; a new source
        // asks for every track of the broadcast.
        self.upstream.pending.borrow_mut().clear();
        self.relay.publish_gauges();
    }
}

/// Serves moq-lite sessions on one worker thread with a per-thread [`Relay`].
#[derive(Debug)]
pub struct RelayHandler {
    relay: Rc<Relay>,
    storage: Rc<StoragePool>,
    clock: Clock,
}

/// Ids of link sessions (never an accepted connection's id).
const LINK_ID_BASE: u64 = u64::MAX / 2;
/// Ids of upstream sessions, one per dial (after the link ids).
const UPSTREAM_ID_BASE: u64 = LINK_ID_BASE + (1 << 32);
/// The first and the longest wait before dialing the upstream again.
const UPSTREAM_BACKOFF: (StdDuration, StdDuration) =
    (StdDuration::from_millis(100), StdDuration::from_secs(5));

impl RelayHandler {
    /// The handler of the worker described by `info`, without links to
    /// other workers (right for one worker thread) and without its upstream.
    pub fn new(info: &WorkerInfo) -> Self {
        let notify = Notify::shared();
        // A stable non-zero Hop ID per worker (PROTOCOL.md §4.3).
        let hop = 0x5c1f_0000_0000 | ((std::process::id() as u64) << 8) | (info.index as u64 + 1);
        let mut relay = Relay::new(hop, &info.config, notify);
        relay.metrics = Some((info.metrics.clone(), info.index));
        RelayHandler {
            relay: Rc::new(relay),
            storage: Rc::new(StoragePool::new()),
            clock: Clock::new(),
        }
    }

    /// A handler factory for `threads` workers linked pairwise (see
    /// [`Mesh`]), each dialing the configured upstream relay if there is one:
    /// pass it to [`crate::server::start`].
    ///
    /// # Errors
    /// If a socket pair cannot be made.
    pub fn factory(
        threads: usize,
    ) -> io::Result<impl Fn(&WorkerInfo) -> RelayHandler + Send + Sync + 'static> {
        let mesh = Arc::new(Mesh::new(threads)?);
        Ok(move |info: &WorkerInfo| {
            let h = RelayHandler::new(info);
            for (peer, end) in mesh.take(info.index) {
                h.spawn_link(info, peer, end);
            }
            if let Some(up) = &info.config.upstream {
                h.spawn_upstream(info, up.clone());
            }
            h
        })
    }

    /// This worker's relay state.
    pub fn relay(&self) -> &Rc<Relay> {
        &self.relay
    }

    fn drive_ctx(&self, info: &WorkerInfo) -> DriveCtx {
        DriveCtx {
            clock: self.clock,
            notify: self.relay.notify.clone(),
            shutdown: Some(info.shutdown.clone()),
        }
    }

    /// Runs the link session to worker `peer` over `end` (client side on the
    /// lower-numbered worker). The link lends and borrows blocks
    /// ([`crate::lend`]).
    fn spawn_link(&self, info: &WorkerInfo, peer: usize, end: LinkEnd) {
        let LinkEnd {
            socket,
            lends,
            borrows,
        } = end;
        let stream = match socket
            .set_nonblocking(true)
            .and_then(|()| monoio::net::UnixStream::from_std(socket))
        {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(peer, error = %e, "cannot open worker link");
                return;
            }
        };
        let side = if info.index < peer {
            Side::Client
        } else {
            Side::Server
        };
        let ctx = self.drive_ctx(info);
        let relay = self.relay.clone();
        let id = LINK_ID_BASE + peer as u64;
        // All links together lend at most half the pool (see `crate::lend`).
        let limit = lend_limit(self.relay.pool.capacity(), info.config.threads.get());
        let lender = Rc::new(Lender::new(lends, limit));
        relay.add_link(peer, lender.clone(), borrows.clone());
        let borrower = Borrower::new(borrows, relay.pool, peer);
        monoio::spawn(async move {
            let (reader, writer) = split_halves(stream, 64 * 1024);
            let mut storage = Box::new(TrunkStorage::new());
            let (config, origin) = relay.session_setup(Peer::Link);
            let session: Result<TrunkSession<'_>, _> =
                Session::new(side, config, ctx.clock.now(), &mut storage, Some(origin)).map(
                    |mut s| {
                        s.set_foreign(Some(&borrower));
                        s
                    },
                );
            let res = run_session(
                relay,
                session,
                reader,
                writer,
                side,
                id,
                Peer::Link,
                Some(lender),
                None,
                &ctx,
            );
            match res.await {
                Ok(ended) => tracing::debug!(peer, ?ended, "worker link ended"),
                Err(e) => tracing::warn!(peer, error = %e, "worker link failed"),
            }
        });
    }

    /// Keeps a session to the upstream relay `up` (this worker becomes its
    /// leaf): dials it, runs the session, and dials again after a growing
    /// pause (100 ms to 5 s) whenever it ends, until the worker drains.
    ///
    /// Over that session the worker asks for every announcement (so its
    /// subscribers reach the upstream's broadcasts, one upstream subscription
    /// per track, PROTOCOL.md §4.5) and announces its own clients'
    /// broadcasts (so the upstream's subscribers reach them).
    fn spawn_upstream(&self, info: &WorkerInfo, up: UpstreamAddr) {
        let ctx = self.drive_ctx(info);
        let relay = self.relay.clone();
        let shutdown = info.shutdown.clone();
        let worker = info.index;
        // Made once per worker: the session config borrows it for 'static.
        let path: &'static str = Box::leak(format!("/{}", up.path).into_boxed_str());
        monoio::spawn(async move {
            let mut backoff = UPSTREAM_BACKOFF.0;
            let mut dial = 0u64;
            // One trunk's tables for every dial (a session clears them).
            let mut storage = Box::new(UpstreamStorage::new());
            while !shutdown.is_draining() {
                let started = StdInstant::now();
                match dial_upstream(&up).await {
                    Ok(stream) => {
                        tracing::info!(worker, upstream = %up, "upstream connected");
                        let (reader, writer) = split_halves(stream, 64 * 1024);
                        let id = UPSTREAM_ID_BASE + dial;
                        let peer = Peer::Upstream(path);
                        let (config, origin) = relay.session_setup(peer);
                        let session: Result<TrunkSession<'_>, _> = Session::new(
                            Side::Client,
                            config,
                            ctx.clock.now(),
                            &mut storage,
                            Some(origin),
                        );
                        let res = run_session(
                            relay.clone(),
                            session,
                            reader,
                            writer,
                            Side::Client,
                            id,
                            peer,
                            None,
                            None,
                            &ctx,
                        );
                        match res.await {
                            Ok(ended) => {
                                tracing::info!(worker, upstream = %up, ?ended, "upstream session ended")
                            }
                            Err(e) => {
                                tracing::warn!(worker, upstream = %up, error = %e, "upstream session failed")
                            }
                        }
                    }
                    Err(e) => {
                        tracing::warn!(worker, upstream = %up, error = %e, "cannot reach upstream")
                    }
                }
                dial += 1;
                if started.elapsed() > UPSTREAM_BACKOFF.1 {
                    backoff = UPSTREAM_BACKOFF.0;
                }
                monoio::select! {
                    _ = monoio::time::sleep(backoff) => {}
                    _ = shutdown.wait() => {}
                }
                backoff = (backoff * 2).min(UPSTREAM_BACKOFF.1);
            }
        });
    }
}

/// Dials the upstream relay (`host` resolved each time: it may move).
async fn dial_upstream(up: &UpstreamAddr) -> io::Result<monoio::net::TcpStream> {
    use std::net::ToSocketAddrs;
    let addr = (up.host.as_str(), up.port)
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "upstream host has no address"))?;
    let stream = monoio::net::TcpStream::connect(addr).await?;
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

impl Relay {
    /// The configuration and the origin of a session with `peer`: a client's
    /// or a trunk's configuration; links and the upstream are offered only
    /// this worker's own clients' broadcasts (one hop between workers,
    /// nothing loops back up).
    fn session_setup(&self, peer: Peer) -> (Config<'static>, origin::Ref<'static, 'static>) {
        let mut config = Config {
            path: match peer {
                Peer::Upstream(path) => Some(path),
                _ => None,
            },
            ..if peer.is_local() {
                self.session_config
            } else {
                self.trunk_config
            }
        };
        // Both ends of a link are this process: payload crosses by reference.
        config.conn.stream_refs = peer == Peer::Link;
        let origin = if peer.is_local() {
            self.origin
        } else {
            self.local_origin
        };
        (config, origin)
    }
}

/// Runs one relay session (a client connection, a worker link or the
/// upstream), made from [`Relay::session_setup`].
#[allow(clippy::too_many_arguments)]
async fn run_session<'s, R: ByteRead, W: ByteWrite, const N: usize>(
    relay: Rc<Relay>,
    session: Result<Session<'s, 'static, 'static, N>, ConfigError>,
    reader: R,
    writer: W,
    side: Side,
    id: u64,
    peer: Peer,
    lender: Option<Rc<Lender>>,
    resolver: Option<&'s dyn Resolve<'static, 'static>>,
    ctx: &DriveCtx,
) -> io::Result<Ended> {
    let mut session = session.map_err(io::Error::other)?;
    if peer.is_local() {
        session.set_resolver(resolver);
    } else {
        session.set_resolver(Some(&*relay));
    }
    let mut app = RelayConn {
        relay: relay.clone(),
        id,
        peer,
        upstream: Rc::new(PendingSubscribes::default()),
        // The dialing side of a link, and a leaf towards its upstream, ask
        // at once; accepted clients after SETUP.
        want_announce: match peer {
            Peer::Link => side == Side::Client,
            Peer::Upstream(_) => true,
            Peer::Client => false,
        },
        announce: None,
        subs: Vec::new(),
        lender,
    };
    drive(session, reader, writer, &mut app, ctx).await
}

impl ConnectionHandler for RelayHandler {
    type Error = io::Error;

    #[allow(clippy::manual_async_fn)]
    fn serve(self: Rc<Self>, conn: Connection) -> impl Future<Output = io::Result<()>> + 'static {
        async move {
            let id = conn.id();
            let ctx = DriveCtx {
                clock: self.clock,
                notify: self.relay.notify.clone(),
                shutdown: Some(conn.shutdown()),
            };
            let (mut reader, writer) = conn.into_split();
            // Nothing is taken for a connection before it sends something.
            if !reader.wait_first().await? {
                tracing::debug!(conn = id, "connection closed before it sent anything");
                return Ok(());
            }
            // The session's state (its future, its tables) exists only from
            // here on, in an allocation of its own: a connection waiting for
            // its first byte holds just the small future above.
            let ended = Box::pin(self.clone().serve_session(id, reader, writer, ctx)).await;
            let ended = ended?;
            tracing::debug!(conn = id, ?ended, "connection done");
            Ok(())
        }
    }
}

impl RelayHandler {
    /// Runs the session of client connection `id` once it has sent its first bytes.
    async fn serve_session(
        self: Rc<Self>,
        id: u64,
        reader: crate::conn::Reader,
        writer: crate::conn::Writer,
        ctx: DriveCtx,
    ) -> io::Result<Ended> {
        let resolver = ClientResolver {
            relay: self.relay.clone(),
            conn: id,
        };
        let mut storage = self.storage.take();
        let (config, origin) = self.relay.session_setup(Peer::Client);
        let session: Result<MoqSession<'_>, _> = Session::new(
            Side::Server,
            config,
            ctx.clock.now(),
            &mut storage,
            Some(origin),
        );
        let relay = self.relay.clone();
        let ended = run_session(
            relay,
            session,
            reader,
            writer,
            Side::Server,
            id,
            Peer::Client,
            None,
            Some(&resolver),
            &ctx,
        )
        .await;
        self.storage.give(storage);
        ended
    }
}

// ---------------------------------------------------------------------------
// Worker links
// ---------------------------------------------------------------------------

/// The socket pairs linking every two workers (made before they start).
///
/// Cross-thread routing: worker *i* and worker *j* run one moq-lite session
/// over a Unix socket pair, worker *min(i, j)* as the client. Each side asks
/// the other for its announcements; a worker offers on its links only the
/// broadcasts of its own clients (its local origin), so a broadcast is one
/// link away from every worker and nothing loops. A subscriber's request for
/// a broadcast learned over a link creates a relay track on its worker and
/// one subscription over the link, which the publisher's worker serves from
/// its own relay track. Payload crosses by reference ([`crate::lend`]): the
/// link carries small STREAM_REF records naming blocks of the publisher's
/// worker, which the subscriber's worker links into its groups without a
/// copy; its subscribers are served from the publisher worker's blocks.
#[derive(Debug)]
pub struct Mesh {
    ends: Mutex<HashMap<(usize, usize), LinkEnd>>,
}

/// One worker's end of the link to another: the socket, and the shares of
/// blocks lent each way ([`crate::lend`]).
#[derive(Debug)]
pub struct LinkEnd {
    /// The socket to the other worker.
    pub socket: StdUnixStream,
    /// What this worker lends to the other.
    pub lends: Arc<LinkShare>,
    /// What the other worker lends to this one.
    pub borrows: Arc<LinkShare>,
}

impl Mesh {
    /// Socket pairs for every two of `threads` workers.
    ///
    /// # Errors
    /// If a socket pair cannot be made.
    pub fn new(threads: usize) -> io::Result<Self> {
        let mut ends = HashMap::new();
        for i in 0..threads {
            for j in i + 1..threads {
                let (a, b) = StdUnixStream::pair()?;
                let (i_to_j, j_to_i) = (LinkShare::new(), LinkShare::new());
                ends.insert(
                    (i, j),
                    LinkEnd {
                        socket: a,
                        lends: i_to_j.clone(),
                        borrows: j_to_i.clone(),
                    },
                );
                ends.insert(
                    (j, i),
                    LinkEnd {
                        socket: b,
                        lends: j_to_i,
                        borrows: i_to_j,
                    },
                );
            }
        }
        Ok(Mesh {
            ends: Mutex::new(ends),
        })
    }

    /// Worker `index`'s ends, with the peer each leads to.
    pub fn take(&self, index: usize) -> Vec<(usize, LinkEnd)> {
        let mut ends = match self.ends.lock() {
            Ok(e) => e,
            Err(p) => p.into_inner(),
        };
        let keys: Vec<_> = ends.keys().filter(|(i, _)| *i == index).copied().collect();
        keys.into_iter()
            .filter_map(|k| ends.remove(&k).map(|s| (k.1, s)))
            .collect()
    }
}
