//! The moq-lite relay on one worker thread: [`Relay`] (per-thread state) and
//! [`RelayHandler`] (the [`ConnectionHandler`] that drives a session per
//! connection with it).
//!
//! The policy below lives in the core, sans-IO: [`skiff_core::relay::Router`]
//! (routes, spares, failover, relay tracks and their quotas),
//! [`skiff_core::relay::Peer`] (one session's events and upstream
//! subscriptions) and [`skiff_core::relay::demand`]. This module is the glue:
//! it makes the worker's tables once, registers each session's SUBSCRIBE
//! queue, forwards events and passes, arms timers at the deadlines the core
//! gives, and publishes the metrics.
//!
//! # Routing (docs/protocol.md §4)
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
//!   ([`skiff_monoio::notify`]): a frame stored in a relay track wakes the sessions
//!   serving that track, not every session of the worker.
//! * The upstream subscription follows the downstream ones (§4.5): every
//!   session registers the subscriptions it serves on the relay track
//!   ([`track::Ref::subscribers`], [`track::Ref::demand`]); the SUBSCRIBE
//!   asks for their aggregate (highest priority and max age, latest start
//!   if any asks for latest, open end if any is open), and a change of it
//!   goes out as SUBSCRIBE_UPDATE. Once the track has had no subscriber for
//!   [`LINGER`](skiff_core::relay::LINGER), the upstream subscription is cancelled (FIN) and
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
//! # Cluster peers (`--cluster-connect`, `--cluster-connect-api`)
//!
//! Each worker runs one dial loop per cluster peer ([`Cluster`]), as it does
//! for the upstream: the session is a trunk that asks for the peer's
//! announcements at once, the peer asks for this relay's, and the loop
//! dials again with a jittered backoff whenever the session ends, until
//! the peer leaves the peer list (its session is then closed, so its routes
//! are withdrawn as for any session's end) or the worker drains. On the
//! accepting side a session is a cluster peer only with a hop id, no Role
//! and a grant of the whole tree both ways (docs/protocol.md §4.10).
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
//! A worker link's withdrawal is handled the same way on the worker that
//! learned the broadcast over it ([`Router::source_left`](skiff_core::relay::Router::source_left)): the link cannot
//! tell an ended source from a lost one, and the next source may be
//! announcing while the withdrawal crosses the link. A request the link
//! refuses as unroutable meanwhile waits for the next source within the
//! grace instead of being refused ([`Router::upstream_unroutable`](skiff_core::relay::Router::upstream_unroutable)).
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
//!   tables ([`TrunkStorage`]) carry 128 concurrent
//!   subscriptions each way (`tests/trunk.rs` runs about 96 across a
//!   link); one more is refused like a full table. The upstream session's
//!   control buffers are 2 KiB ([`UpstreamStorage`]):
//!   its SETUP carries the upstream URL's path and query. A client connection's
//!   session is smaller (128 stream slots, 64 subscriptions each way): a
//!   client may hold 31 subscriptions on the relay at once (32 bidirectional
//!   streams are advertised and each subscription keeps one open; the
//!   relay-path join probe sees a 32nd wait for its TRACK stream), and the relay
//!   up to 64 on a publishing client (32 on skiff's own client, which
//!   advertises a quarter of its 128 slots). Its control messages are at
//!   most 1 KiB: a client whose SETUP is longer (a URL with a long token)
//!   is closed with INTERNAL (0x0).
//! * The upstream aggregate is exact while the subscribers of a track use at
//!   most four distinct values of each preference (priority, max age, start,
//!   end); past that, the values that did not fit are kept as a bound until
//!   the track has no subscriber. Updates keep the start of the SUBSCRIBE:
//!   a later subscriber asking for an older start than the upstream one is
//!   served from what the cache holds. A leaf's upstream subscription starts
//!   at the upstream's latest group, so a subscriber of the leaf asking for
//!   older groups gets them from there on. A link between workers does not
//!   have that limit: it asks for every group the other worker holds
//!   (`skiff_core::relay::mirror_request`), which that worker sends newest
//!   first, and the older ones still on their way stay wanted
//!   (`track::Ref::may_arrive`), so a subscriber is served the same groups
//!   whichever worker its connection lands on.
//! * Broadcast and track states live in tables made at the worker's start
//!   ([`BROADCAST_SLOTS`] broadcasts, `--max-relay-tracks` tracks) and are
//!   reused once nothing uses them (generation-checked handles): a relay
//!   with ever new broadcasts and track names stays flat
//!   (`tests/churn.rs`). A full table refuses the new broadcast or track.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::{Duration as StdDuration, Instant as StdInstant};

use skiff_core::model::{broadcast, origin, track};
use skiff_core::pool::{Pool, Slice};
use skiff_core::relay::{
    AnnounceRefused, Peer, PeerKind, Quota, ResolveRefused, Resolver, SourceId, SubscribeQueue,
    Upstreams, Wake,
};
use skiff_core::session::{Config, ConfigError, Event, Resolve, Scope, Session};
use skiff_core::time::Instant;
use skiff_core::transport::Transport;
use skiff_core::wire::lite::{SessionCode, StreamCode};
use skiff_core::wire::qmux::Side;
use skiff_monoio::clock::Clock;
use skiff_monoio::notify::Notify;
use skiff_monoio::quic::Link;
use skiff_monoio::session_driver::{
    App, ByteRead, ByteWrite, DriveCtx, Ended, HandshakeToken, MoqSession, QuicSession,
    StoragePool, drive, drive_quic, drive_webtransport, split_halves,
};
use skiff_monoio::shutdown::{LocalEvent, Shutdown};
use skiff_monoio::tables::Keep;
use skiff_monoio::ws::{WsReader, WsWriter};
use skiff_quic::{QuicTransport, WtStatus};
use skiff_ws::frame::Role as WsRole;

use crate::auth::{Auth, Gate};
use crate::config::{RelayConfig, Upstream as UpstreamAddr, UpstreamScheme, quota_key};
use crate::conn::{Connection, SetTransport};
use crate::conn_name::ConnName;
use crate::handler::{ConnectionHandler, QuicConn, QuicServerConfig, WorkerInfo};
use crate::lend::{Borrower, Lender, LinkShare, Reclaim, lend_limit, return_released};
use crate::metrics::{Metrics, TransportLabel};
use crate::storage::{
    STREAMS, ServerStorage, SidePools, SideTables, TRUNK_STREAMS, TrunkSession, TrunkStorage,
    UpstreamStorage,
};
use crate::tls::TlsServer;
use crate::web::HeadRead;
use crate::worker_tables::{WorkerRouter, WorkerTables};
use skiff_monoio::cancel::race;
use skiff_monoio::tls::{TlsReader, TlsWriter};

/// Broadcasts one worker's origin holds at once.
pub const BROADCASTS: usize = 1024;
/// Broadcast states per worker: its origin's [`BROADCASTS`] and as many
/// standbys (local sources of paths served over a link), about 2.2 KiB each.
pub const BROADCAST_SLOTS: usize = 2 * BROADCASTS;

/// Upstream subscriptions a client session's peer holds at once: as many as
/// its session's tables; a trunk's hold [`TRUNK_UPSTREAM`].
const CLIENT_UPSTREAM: usize = skiff_monoio::session_driver::CLIENT_SUBSCRIPTIONS;
/// Upstream subscriptions a trunk session's peer holds at once.
const TRUNK_UPSTREAM: usize = 128;

/// A session's queue of upstream subscriptions to make.
trait Queue {
    /// Queues relay track `t` of `b`.
    fn push(&self, b: broadcast::Ref<'static, 'static>, t: track::Ref<'static, 'static>);
}

impl<const Q: usize> Queue for SubscribeQueue<'static, 'static, Q> {
    fn push(&self, b: broadcast::Ref<'static, 'static>, t: track::Ref<'static, 'static>) {
        SubscribeQueue::push(self, b, t);
    }
}

/// The upstream SUBSCRIBE queues of this worker's sessions, by source: where
/// the router's decisions go ([`Upstreams`]).
struct Queues {
    by_source: RefCell<HashMap<SourceId, Rc<dyn Queue>>>,
    /// Wakes the session that is to make a queued SUBSCRIBE.
    notify: Rc<Notify>,
}

impl std::fmt::Debug for Queues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queues")
            .field("sources", &self.by_source.borrow().len())
            .finish()
    }
}

impl Upstreams<'static, 'static> for Queues {
    fn subscribe(
        &self,
        owner: SourceId,
        broadcast: broadcast::Ref<'static, 'static>,
        track: track::Ref<'static, 'static>,
    ) {
        if let Some(q) = self.by_source.borrow().get(&owner) {
            q.push(broadcast, track);
            self.notify.bump();
        }
    }
}

/// The relay state of one worker thread: origin, cache pool, and the glue
/// between its sessions and the core's [`Router`](skiff_core::relay::Router), which decides routing,
/// failover and relay tracks.
pub struct Relay {
    router: WorkerRouter,
    queues: Queues,
    pool: &'static Pool<'static>,
    hop: u64,
    /// The longest route taken from a peer, in hops.
    max_hops: usize,
    /// The configuration of every client session of this worker.
    session_config: Config<'static>,
    /// The configuration of its trunks (links, upstream).
    trunk_config: Config<'static>,
    notify: Rc<Notify>,
    clock: Clock,
    /// Where to publish the cache gauges: all counters and this worker's index.
    metrics: Option<(Arc<Metrics>, usize)>,
    /// What this worker lent to each other worker, by its index.
    lenders: RefCell<Vec<Option<Rc<Lender>>>>,
    /// What each other worker lends to this one, by its index (where the
    /// pool's released foreign blocks go back to).
    borrowed: RefCell<Vec<Option<Arc<LinkShare>>>>,
    /// When given-up relay tracks and broadcasts were last taken back.
    last_reclaim: Cell<StdInstant>,
    /// The grace deadline a timer is armed for, if any.
    timer: Cell<Option<Instant>>,
    /// The counters of the cluster peer each dialed peer session (by id)
    /// is with.
    peer_stats: RefCell<HashMap<u64, Arc<crate::metrics::PeerCounters>>>,
    /// The name of each session of this worker, by source id.
    names: RefCell<HashMap<u64, ConnName>>,
    /// Fetches answered from the recording (`--record-dir`).
    fetch_store: Option<crate::record::fetch::FetchStore>,
    /// The storage of the origins, pool and tables above: the last field, so
    /// it is freed after everything that borrows it.
    keep: Keep,
}

impl Drop for Relay {
    fn drop(&mut self) {
        // Blocks lent to another worker are read there without this worker
        // seeing it: while any is out, the pool's bytes stay allocated.
        self.return_lent();
        if self.lent().1 > 0 {
            self.keep.keep_forever();
        }
    }
}

/// How often given-up relay tracks and broadcasts are looked at again (they
/// are also taken back whenever a new one is needed and none is free).
const RECLAIM_EVERY: StdDuration = StdDuration::from_millis(250);

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("hop", &self.hop)
            .field("router", &self.router)
            .field("pool_in_use", &self.pool.in_use())
            .finish()
    }
}

impl Relay {
    /// The relay state of one thread, configured by `config` (cache size,
    /// session limits and credit, failover grace, quotas). Every table is
    /// made here, once.
    pub fn new(hop: u64, config: &RelayConfig, notify: Rc<Notify>, clock: Clock) -> Self {
        let mut keep = Keep::new();
        // SAFETY: the keep is the relay's last field, so it drops after the
        // router and everything else of the relay, once nothing holds the
        // `Rc<Relay>` (every session and task of the worker holds one);
        // blocks lent to another worker keep it too (`Relay::drop`).
        let WorkerTables { pool, router } = unsafe { WorkerTables::new(config, &mut keep) };
        // SAFETY: as above, the keep outlives the store (both the relay's).
        let fetch_store = config.record.as_ref().and_then(|r| unsafe {
            crate::record::fetch::FetchStore::new(r.dir.clone(), pool, &mut keep, notify.clone())
        });
        Relay {
            router,
            queues: Queues {
                by_source: RefCell::new(HashMap::new()),
                notify: notify.clone(),
            },
            pool,
            hop,
            max_hops: config.cluster_max_hops,
            session_config: config.session_config(hop),
            trunk_config: config.trunk_session_config(hop),
            notify,
            clock,
            metrics: None,
            lenders: RefCell::new(Vec::new()),
            borrowed: RefCell::new(Vec::new()),
            last_reclaim: Cell::new(StdInstant::now()),
            timer: Cell::new(None),
            peer_stats: RefCell::new(HashMap::new()),
            names: RefCell::new(HashMap::new()),
            fetch_store,
            keep,
        }
    }

    /// Counts a refusal by a quota (metric, debug log).
    fn quota_refused(&self, what: &'static str, conn: Option<ConnName>, path: &str) {
        let conn = conn.map(tracing::field::debug);
        tracing::debug!(conn, path, quota = what, "over quota: request refused");
        if let Some((m, i)) = &self.metrics {
            m.thread(*i).add_quota_refused();
        }
    }

    /// Takes back given-up relay tracks and broadcasts nobody uses any more,
    /// at most every [`RECLAIM_EVERY`] (O(given up)).
    fn reclaim_tables(&self) {
        if self.router.track_counts().retired == 0 {
            return;
        }
        let now = StdInstant::now();
        if now.duration_since(self.last_reclaim.get()) < RECLAIM_EVERY {
            return;
        }
        self.last_reclaim.set(now);
        if self.router.reclaim() > 0 {
            self.publish_gauges();
        }
    }

    /// Relay tracks held now (claimed, or retired and not idle yet).
    pub fn relay_tracks(&self) -> usize {
        let c = self.router.track_counts();
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

    /// Names source `name`'s session for `GET /announced?peers`.
    fn name_source(&self, name: ConnName) {
        self.names.borrow_mut().insert(name.id(), name);
    }

    /// Where each broadcast of the thread's origin comes from: the session
    /// serving it and, for a session with a cluster peer this relay dials,
    /// the peer (`GET /announced?peers`; O(broadcasts x routes)).
    pub fn announced_sources(&self) -> Vec<crate::web::AnnouncedSource> {
        let names = self.names.borrow();
        let stats = self.peer_stats.borrow();
        self.router
            .origin()
            .iter()
            .map(|b| {
                let source = self.router.source_of(b);
                crate::web::AnnouncedSource {
                    path: b.path().as_str().to_owned(),
                    peer: source.and_then(|id| stats.get(&id)).map(|s| s.label),
                    via: source.and_then(|id| names.get(&id)).map(|n| n.to_string()),
                }
            })
            .collect()
    }

    /// Files `stats` as the counters of the cluster peer session `id` is with.
    fn add_peer_stats(&self, id: u64, stats: Arc<crate::metrics::PeerCounters>) {
        self.peer_stats.borrow_mut().insert(id, stats);
    }

    /// Forgets the counters of session `id` (it ended).
    fn remove_peer_stats(&self, id: u64) {
        self.peer_stats.borrow_mut().remove(&id);
    }

    /// The counters of the cluster peer session `id` is with, if it is one.
    fn peer_stats(&self, id: u64) -> Option<Arc<crate::metrics::PeerCounters>> {
        self.peer_stats.borrow().get(&id).cloned()
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

    /// The thread's origin (what subscribers see); its users hold the
    /// relay's `Rc`, as its storage goes with the relay.
    pub(crate) fn origin(&self) -> origin::Ref<'static, 'static> {
        self.router.origin()
    }

    /// The cache pool, for as long as the relay is borrowed.
    pub fn pool(&self) -> &Pool<'static> {
        self.pool
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
            m.thread(*i)
                .set_tables(self.relay_tracks() as u64, self.broadcasts() as u64);
        }
    }

    /// Broadcasts routed now (standbys and those within their grace included).
    pub fn broadcasts(&self) -> usize {
        self.router.routes()
    }

    /// Registers the upstream SUBSCRIBE queue of source `owner` (a session
    /// of this worker), where the router's requests for it go.
    fn add_source(&self, owner: SourceId, queue: Rc<dyn Queue>) {
        self.queues.by_source.borrow_mut().insert(owner, queue);
    }

    /// Forgets the queue of source `owner` (its session is over).
    fn remove_source(&self, owner: SourceId) {
        self.queues.by_source.borrow_mut().remove(&owner);
        self.names.borrow_mut().remove(&owner);
    }

    /// Makes sure a task wakes at the router's next deadline (the end of a
    /// failover grace period).
    fn arm_timer(self: &Rc<Self>) {
        let Some(at) = self.router.poll_timeout() else {
            return;
        };
        if self.timer.get().is_some_and(|t| t <= at) {
            return;
        }
        self.timer.set(Some(at));
        // The timer does not keep the relay: a worker that stops with a
        // timer armed drops its relay (and frees its storage) all the same.
        let clock = self.clock;
        let relay = Rc::downgrade(self);
        monoio::spawn(async move {
            clock.sleep_until(at).await;
            let Some(relay) = relay.upgrade() else {
                return;
            };
            if relay.timer.get() == Some(at) {
                relay.timer.set(None);
            }
            let ended = relay.router.handle_timeout(relay.clock.now());
            if ended > 0 {
                tracing::info!(broadcasts = ended, "broadcast found no new source in time");
                relay.notify.bump();
            }
            relay.arm_timer();
        });
    }

    /// Counts a refused track request and logs it.
    /// `conn` is the client's session; `None` for a link's or the upstream's.
    fn track_refused(&self, conn: Option<ConnName>, e: ResolveRefused, path: &str) {
        match e {
            ResolveRefused::Quota(q) => self.quota_refused(quota_key(q), conn, path),
            ResolveRefused::NotFound => {
                let conn = conn.map(tracing::field::debug);
                tracing::debug!(conn, path, "track request refused: not found")
            }
        }
    }
}

impl Resolve<'static, 'static> for Relay {
    fn resolve(
        &self,
        broadcast: broadcast::Ref<'static, 'static>,
        name: &str,
    ) -> Result<track::Ref<'static, 'static>, StreamCode> {
        self.router
            .resolve(None, broadcast, name, &self.queues)
            .map_err(|e| {
                self.track_refused(None, e, broadcast.path().as_str());
                e.code()
            })
    }

    fn waiting(
        &self,
        path: skiff_core::model::path::Path<'_>,
        name: &str,
    ) -> Option<track::Ref<'static, 'static>> {
        self.router.waiting(path, name)
    }
}

mod cluster;
mod handler;
mod link;
mod session;
mod upstream;

pub use cluster::{Cluster, PeerLink};
pub use handler::RelayHandler;
pub use link::{LinkEnd, Mesh};
use session::{Remote, run_quic_session, run_session};
use upstream::{Dial, dialed_upstream_url, upstream_tls};
