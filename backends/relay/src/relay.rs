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
//! A worker link's withdrawal is handled the same way on the worker that
//! learned the broadcast over it ([`Router::source_left`]): the link cannot
//! tell an ended source from a lost one, and the next source may be
//! announcing while the withdrawal crosses the link. A request the link
//! refuses as unroutable meanwhile waits for the next source within the
//! grace instead of being refused ([`Router::upstream_unroutable`]).
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
    AnnounceRefused, LINGER, Peer, PeerKind, Quota, ResolveRefused, Resolver, SourceId,
    SubscribeQueue, Upstreams, Wake,
};
use skiff_core::session::{Config, ConfigError, Event, Resolve, Scope, Session};
use skiff_core::time::Instant;
use skiff_core::wire::lite::{SessionCode, StreamCode};
use skiff_core::wire::qmux::Side;
use skiff_monoio::clock::Clock;
use skiff_monoio::notify::Notify;
use skiff_monoio::session_driver::{
    App, ByteRead, ByteWrite, DriveCtx, Ended, MoqSession, StoragePool, drive, split_halves,
};
use skiff_monoio::ws::{WsReader, WsWriter};
use skiff_ws::frame::Role as WsRole;

use crate::auth::{Auth, Gate};
use crate::config::{RelayConfig, Upstream as UpstreamAddr, quota_key};
use crate::conn::Connection;
use crate::handler::{ConnectionHandler, WorkerInfo};
use crate::lend::{Borrower, Lender, LinkShare, Reclaim, lend_limit, return_released};
use crate::metrics::Metrics;
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
/// between its sessions and the core's [`Router`], which decides routing,
/// failover and relay tracks.
pub struct Relay {
    router: WorkerRouter,
    queues: Queues,
    pool: &'static Pool<'static>,
    hop: u64,
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
        let WorkerTables { pool, router } = WorkerTables::new(config);
        Relay {
            router,
            queues: Queues {
                by_source: RefCell::new(HashMap::new()),
                notify: notify.clone(),
            },
            pool,
            hop,
            session_config: config.session_config(hop),
            trunk_config: config.trunk_session_config(hop),
            notify,
            clock,
            metrics: None,
            lenders: RefCell::new(Vec::new()),
            borrowed: RefCell::new(Vec::new()),
            last_reclaim: Cell::new(StdInstant::now()),
            timer: Cell::new(None),
        }
    }

    /// Counts a refusal by a quota (metric, debug log).
    fn quota_refused(&self, what: &'static str, conn: u64, path: &str) {
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
        self.router.origin()
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
        let relay = self.clone();
        monoio::spawn(async move {
            relay.clock.sleep_until(at).await;
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
    fn track_refused(&self, conn: Option<SourceId>, e: ResolveRefused, path: &str) {
        match e {
            ResolveRefused::Quota(q) => self.quota_refused(quota_key(q), conn.unwrap_or(0), path),
            ResolveRefused::NotFound => tracing::debug!(path, "track request refused: not found"),
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

/// How long an upstream subscription is kept after its relay track lost its
/// last downstream subscriber, before it is cancelled ([`LINGER`]).
pub const UPSTREAM_LINGER: StdDuration = StdDuration::from_micros(LINGER.as_micros());

/// What is at the other end of a relay session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Remote {
    /// An accepted client: a publisher, a subscriber, or a leaf relay.
    Client,
    /// Another worker of this relay, over a socket pair.
    Link,
    /// The upstream relay this one is a leaf of (`--upstream`), dialed with
    /// this SETUP path.
    Upstream(&'static str),
}

impl Remote {
    /// Broadcasts learned from this peer belong to this worker's clients
    /// (and so are offered to the other workers and to the upstream).
    fn is_local(self) -> bool {
        self == Remote::Client
    }
}

/// The relay side of one connection: the core's [`Peer`] for it, and its
/// upstream SUBSCRIBE queue (`S` subscriptions at most).
struct RelayConn<const S: usize> {
    relay: Rc<Relay>,
    id: u64,
    peer: Peer<'static, 'static, S>,
    queue: Rc<SubscribeQueue<'static, 'static, S>>,
    /// The linger deadline a wake-up is armed for.
    armed: Option<Instant>,
    /// The session's refused TRACK requests already counted.
    refused_tracks: u64,
    /// A link: what it lends to the other worker.
    lender: Option<Rc<Lender>>,
    /// A link: when it looks for the blocks the other worker gave back.
    reclaim: Reclaim,
    /// A client's admission and scope, when access control is on.
    gate: Option<Rc<Gate>>,
    /// Whether a wake-up is armed for the token's expiry.
    expiry_armed: bool,
}

impl<const S: usize> RelayConn<S> {
    /// The relay side of session `id` (its queue registered with the relay).
    fn new(
        relay: Rc<Relay>,
        id: u64,
        kind: PeerKind,
        lender: Option<Rc<Lender>>,
        gate: Option<Rc<Gate>>,
    ) -> Self {
        let queue = Rc::new(SubscribeQueue::new());
        relay.add_source(id, queue.clone());
        RelayConn {
            relay,
            id,
            peer: Peer::new(id, kind),
            queue,
            armed: None,
            refused_tracks: 0,
            lender,
            reclaim: Reclaim::default(),
            gate,
            expiry_armed: false,
        }
    }

    /// Whether the session's token has expired (docs/protocol.md §4.10: no grace).
    fn expired(&self) -> bool {
        self.gate
            .as_ref()
            .and_then(|g| g.deadline())
            .is_some_and(|at| self.relay.clock.now() >= at)
    }

    /// Wakes whom a core call says to.
    fn wake(&self, wake: Wake) {
        match wake {
            Wake::Nobody => {}
            Wake::Track(key) => self.relay.notify.bump_tracks([key]),
            Wake::All => {
                self.relay.notify.bump();
                self.relay.arm_timer();
            }
        }
    }
}

impl<const S: usize, const N: usize> App<N> for RelayConn<S> {
    /// The relay's policy says whom each event concerns ([`Effect`]), and
    /// [`RelayConn::wake`] wakes them.
    ///
    /// [`Effect`]: skiff_core::relay::Effect
    const EVENTS_WAKE_ALL: bool = false;

    fn on_event(&mut self, event: &Event<'_>) {
        match *event {
            Event::Setup { role, .. } => {
                // The path is not logged: its query may hold a token.
                tracing::debug!(conn = self.id, ?role, "client setup")
            }
            Event::Announced { path, .. }
                if self.gate.as_ref().is_some_and(|g| !g.may_publish(path)) =>
            {
                // docs/protocol.md §4.10: outside the token's `publish`, not routed.
                tracing::info!(
                    conn = self.id,
                    path,
                    "announce refused: outside the publish grant"
                );
                return;
            }
            Event::Announced { path, .. } => {
                tracing::info!(conn = self.id, path, "broadcast announced")
            }
            Event::Unannounced { path, .. } => {
                tracing::info!(conn = self.id, path, "broadcast withdrawn")
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
        let relay = self.relay.clone();
        let effect = self
            .peer
            .on_event(event, &relay.router, relay.clock.now(), &relay.queues);
        if let (Some(e), Event::Announced { path, .. }) = (effect.refused, event) {
            let quota = match e {
                AnnounceRefused::Quota => quota_key(Quota::Announces),
                _ => "broadcast table",
            };
            relay.quota_refused(quota, self.id, path);
        }
        self.wake(effect.wake);
    }

    fn lend(&self, slice: Slice<'static>) -> Option<u64> {
        self.lender.as_deref()?.lend(slice)
    }

    fn wake_at(&mut self, now: Instant) -> Option<Instant> {
        let lender = self.lender.as_deref()?;
        self.reclaim.next(lender, now)
    }

    fn act(&mut self, session: &mut Session<'_, 'static, 'static, N>) {
        let relay = self.relay.clone();
        if let Some(at) = self.gate.as_ref().and_then(|g| g.deadline()) {
            if self.expired() {
                if !session.is_closed() {
                    tracing::info!(conn = self.id, "token expired: session closed");
                    session.close(
                        SessionCode::Unauthorized,
                        "unauthorized: the token has expired",
                    );
                }
                return;
            }
            if !self.expiry_armed {
                self.expiry_armed = true;
                let (clock, notify) = (relay.clock, relay.notify.clone());
                monoio::spawn(async move {
                    clock.sleep_until(at).await;
                    notify.bump();
                });
            }
        }
        relay.publish_gauges();
        relay.return_lent();
        relay.reclaim_tables();
        let refused = session.refused_track_requests();
        for _ in self.refused_tracks..refused {
            relay.quota_refused("max-waiting-track-requests", self.id, "");
        }
        self.refused_tracks = refused;
        let clock = relay.clock;
        let next = self
            .peer
            .act(session, &relay.router, &self.queue, || clock.now());
        if let Some(at) = next
            && self.armed != Some(at)
        {
            // The session may not wake on its own by then.
            self.armed = Some(at);
            let notify = relay.notify.clone();
            monoio::spawn(async move {
                clock.sleep_until(at).await;
                notify.bump();
            });
        }
    }

    fn on_close(&mut self) {
        let relay = self.relay.clone();
        relay.remove_source(self.id);
        self.peer
            .on_close(&relay.router, &self.queue, relay.clock.now(), &relay.queues);
        self.wake(Wake::All);
        relay.publish_gauges();
    }
}

/// Serves moq-lite sessions on one worker thread with a per-thread [`Relay`].
#[derive(Debug)]
pub struct RelayHandler {
    relay: Rc<Relay>,
    /// A client session's control tables, taken at accept.
    storage: Rc<StoragePool<ServerStorage>>,
    /// Its media tables, taken at its SETUP for the directions it uses.
    sides: Rc<SidePools>,
    clock: Clock,
    /// The access policy, shared by every worker.
    auth: Arc<Auth>,
    /// The listen port's TLS configuration (`--tls-cert`), shared by every
    /// worker; `None`: plain TCP.
    tls: Option<Arc<TlsServer>>,
    /// The directory the web player is served from.
    web_dir: std::path::PathBuf,
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
    /// other workers (right for one worker thread), without its upstream and
    /// in plain TCP (see [`RelayHandler::with_tls`]).
    pub fn new(info: &WorkerInfo) -> Self {
        Self::with_auth(info, Arc::new(auth_policy(info)))
    }

    /// As [`RelayHandler::new`], with the access policy `auth` (shared by the workers).
    pub fn with_auth(info: &WorkerInfo, auth: Arc<Auth>) -> Self {
        let notify = Notify::shared();
        // A stable non-zero Hop ID per worker (docs/protocol.md §4.3).
        let hop = 0x5c1f_0000_0000 | ((std::process::id() as u64) << 8) | (info.index as u64 + 1);
        let clock = Clock::new();
        let mut relay = Relay::new(hop, &info.config, notify, clock);
        relay.metrics = Some((info.metrics.clone(), info.index));
        RelayHandler {
            relay: Rc::new(relay),
            storage: Rc::new(StoragePool::new()),
            sides: Rc::new(SidePools::new()),
            clock,
            auth,
            tls: None,
            web_dir: info.config.web_dir.clone(),
        }
    }

    /// Serves TLS only on the listen port with `tls` (docs/protocol.md §9.8).
    #[must_use]
    pub fn with_tls(mut self, tls: Option<Arc<TlsServer>>) -> Self {
        self.tls = tls;
        self
    }

    /// A handler factory for `threads` workers linked pairwise (see
    /// [`Mesh`]), each dialing the configured upstream relay if there is one:
    /// pass it to [`crate::server::start`]. With `tls` in the configuration,
    /// the files are read when the first worker starts (see
    /// [`RelayHandler::factory_with_tls`] to keep a handle for reloads).
    ///
    /// # Errors
    /// If a socket pair cannot be made.
    pub fn factory(
        threads: usize,
    ) -> io::Result<impl Fn(&WorkerInfo) -> RelayHandler + Send + Sync + 'static> {
        Self::factory_with_tls(threads, None)
    }

    /// As [`RelayHandler::factory`], the workers serving TLS with `tls`
    /// (which the caller keeps to [`TlsServer::reload`]); `None` reads the
    /// configuration's files, if it names any.
    ///
    /// # Errors
    /// If a socket pair cannot be made.
    pub fn factory_with_tls(
        threads: usize,
        tls: Option<Arc<TlsServer>>,
    ) -> io::Result<impl Fn(&WorkerInfo) -> RelayHandler + Send + Sync + 'static> {
        let mesh = Arc::new(Mesh::new(threads)?);
        let auth = std::sync::OnceLock::new();
        let loaded = std::sync::OnceLock::new();
        let upstream_path = std::sync::OnceLock::new();
        let upstream_tls_config = std::sync::OnceLock::new();
        Ok(move |info: &WorkerInfo| {
            let auth = auth.get_or_init(|| Arc::new(auth_policy(info))).clone();
            let tls = tls
                .clone()
                .or_else(|| loaded.get_or_init(|| tls_server(info)).clone());
            let h = RelayHandler::with_auth(info, auth).with_tls(tls);
            for (peer, end) in mesh.take(info.index) {
                h.spawn_link(info, peer, end);
            }
            if let Some(up) = &info.config.upstream {
                let path = *upstream_path.get_or_init(|| dialed_upstream_path(info, up));
                let tls = up.tls.then(|| {
                    upstream_tls_config
                        .get_or_init(|| upstream_tls(info))
                        .clone()
                });
                h.spawn_upstream(info, up.clone(), path, tls);
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
            let (config, origin) = relay.session_setup(Remote::Link);
            let session: Result<Box<TrunkSession<'_>>, _> =
                Session::new(side, config, ctx.clock.now(), &mut storage, Some(origin)).map(
                    |mut s| {
                        s.set_foreign(Some(&borrower));
                        Box::new(s)
                    },
                );
            let res = run_session::<_, _, TRUNK_STREAMS, TRUNK_UPSTREAM>(
                relay,
                session,
                None,
                reader,
                writer,
                side,
                id,
                Remote::Link,
                Some(lender),
                None,
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
    /// per track, docs/protocol.md §4.5) and announces its own clients'
    /// broadcasts (so the upstream's subscribers reach them). `path` is
    /// what its SETUP carries ([`dialed_upstream_path`]), `tls` the client
    /// configuration of a `tls://` upstream ([`upstream_tls`]); both are made
    /// once for all workers.
    fn spawn_upstream(
        &self,
        info: &WorkerInfo,
        up: UpstreamAddr,
        path: &'static str,
        tls: Option<Result<Arc<rustls::ClientConfig>, String>>,
    ) {
        let ctx = self.drive_ctx(info);
        let relay = self.relay.clone();
        let shutdown = info.shutdown.clone();
        let worker = info.index;
        let tls = match tls {
            Some(Ok(config)) => Some(config),
            Some(Err(e)) => {
                tracing::error!(worker, upstream = %up, error = %e, "no TLS configuration for the upstream");
                return;
            }
            None => None,
        };
        let handshake_limit = info.config.timeouts.handshake;
        monoio::spawn(async move {
            let mut backoff = UPSTREAM_BACKOFF.0;
            let mut dial = 0u64;
            // One trunk's tables for every dial (a session clears them).
            let mut storage = Box::new(UpstreamStorage::new());
            while !shutdown.is_draining() {
                let started = StdInstant::now();
                let id = UPSTREAM_ID_BASE + dial;
                let session = UpstreamSession {
                    relay: &relay,
                    ctx: &ctx,
                    path,
                    id,
                };
                let ended = match (dial_upstream(&up).await, &tls) {
                    (Err(e), _) => Err(e),
                    (Ok(stream), None) => {
                        tracing::info!(worker, upstream = %up, "upstream connected");
                        let (reader, writer) = split_halves(stream, 64 * 1024);
                        session.run(&mut storage, reader, writer, None).await
                    }
                    (Ok(stream), Some(config)) => {
                        let (reader, writer) = split_halves(stream, 64 * 1024);
                        match upstream_handshake(config, &up, reader, writer, handshake_limit).await
                        {
                            Ok((reader, writer)) => {
                                tracing::info!(worker, upstream = %up, "upstream connected over TLS");
                                // docs/protocol.md §9.8: qmux's ALPN name fixes the protocol.
                                let fixed = (reader.alpn().as_deref()
                                    == Some(skiff_monoio::tls::ALPN_QMUX))
                                .then_some(skiff_ws::APPLICATION);
                                session.run(&mut storage, reader, writer, fixed).await
                            }
                            Err(e) => Err(e),
                        }
                    }
                };
                match ended {
                    Ok(ended) => {
                        tracing::info!(worker, upstream = %up, ?ended, "upstream session ended")
                    }
                    Err(e) => {
                        tracing::warn!(worker, upstream = %up, error = %e, "upstream session failed or unreachable")
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

/// One session of a leaf with its upstream relay, over any byte stream.
struct UpstreamSession<'a> {
    relay: &'a Rc<Relay>,
    ctx: &'a DriveCtx,
    /// The SETUP path (with the token, if any).
    path: &'static str,
    id: u64,
}

impl UpstreamSession<'_> {
    /// Runs the session over `reader`/`writer` until it ends;
    /// `fixed_protocol` is what TLS ALPN agreed on.
    async fn run<R: ByteRead, W: ByteWrite>(
        self,
        storage: &mut UpstreamStorage,
        reader: R,
        writer: W,
        fixed_protocol: Option<&'static str>,
    ) -> io::Result<Ended> {
        let peer = Remote::Upstream(self.path);
        let (mut config, origin) = self.relay.session_setup(peer);
        if fixed_protocol.is_some() {
            config.conn.fixed_protocol = fixed_protocol;
        }
        let session: Result<Box<TrunkSession<'_>>, _> = Session::new(
            Side::Client,
            config,
            self.ctx.clock.now(),
            storage,
            Some(origin),
        )
        .map(Box::new);
        run_session::<_, _, TRUNK_STREAMS, TRUNK_UPSTREAM>(
            self.relay.clone(),
            session,
            None,
            reader,
            writer,
            Side::Client,
            self.id,
            peer,
            None,
            None,
            None,
            self.ctx,
        )
        .await
    }
}

/// The path and query a leaf sends upstream: the `--upstream` URL's, with the
/// token of `--upstream-token-file` added as `jwt` (docs/protocol.md §4.10).
/// Made once for the process (the factory keeps it), so the file is read
/// once and the leaked string does not grow with the workers.
fn dialed_upstream_path(info: &WorkerInfo, up: &UpstreamAddr) -> &'static str {
    let mut dialed = format!("/{}", up.path);
    if let Some(file) = &info.config.upstream_token_file {
        match std::fs::read_to_string(file) {
            Ok(token) if !token.trim().is_empty() => {
                dialed.push(if dialed.contains('?') { '&' } else { '?' });
                dialed.push_str("jwt=");
                dialed.push_str(token.trim());
            }
            Ok(_) => tracing::warn!(file = %file.display(), "upstream token file is empty"),
            Err(e) => {
                tracing::warn!(file = %file.display(), error = %e, "cannot read upstream token file")
            }
        }
    }
    Box::leak(dialed.into_boxed_str())
}

/// The TLS client configuration a leaf dials its `tls://` upstream with:
/// the CAs of `--upstream-ca`, or the system's trust store.
fn upstream_tls(info: &WorkerInfo) -> Result<Arc<rustls::ClientConfig>, String> {
    let roots = match &info.config.upstream_ca {
        Some(file) => skiff_monoio::tls::roots_from_pem_file(file).map_err(|e| e.to_string())?,
        None => skiff_monoio::tls::system_roots(),
    };
    skiff_monoio::tls::client_config(Arc::new(roots), &[skiff_monoio::tls::ALPN_QMUX])
        .map(Arc::new)
        .map_err(|e| e.to_string())
}

/// Runs the TLS handshake with the upstream `up` (its host as SNI) within `limit`.
async fn upstream_handshake<R: ByteRead, W: ByteWrite>(
    config: &Arc<rustls::ClientConfig>,
    up: &UpstreamAddr,
    reader: R,
    writer: W,
    limit: StdDuration,
) -> io::Result<(TlsReader<R>, TlsWriter<W>)> {
    let conn = skiff_monoio::tls::client_connection(config.clone(), &up.host)?;
    match race(
        skiff_monoio::tls::handshake(conn, reader, writer),
        monoio::time::sleep(limit),
    )
    .await
    {
        Ok(res) => res,
        Err(()) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "no TLS handshake with the upstream in time",
        )),
    }
}

/// The access policy of `info`'s configuration, its start-up state logged.
/// Keys that became unusable since the configuration was checked refuse
/// every session rather than open the relay.
fn auth_policy(info: &WorkerInfo) -> Auth {
    let cfg = &info.config.auth;
    match cfg.build() {
        Ok(auth) if auth.is_open() => {
            tracing::warn!(
                "no --auth-key, --auth-key-dir or --auth-public: the relay is open to everyone"
            );
            auth
        }
        Ok(auth) => {
            let public: Vec<&str> = cfg.public.iter().map(|p| p.as_str()).collect();
            tracing::info!(
                key = ?cfg.key.as_ref().or(cfg.key_dir.as_ref()),
                public = %public.join(","),
                "access control on"
            );
            auth
        }
        Err(e) => {
            tracing::error!(error = %e, "auth keys unusable: every session is refused");
            Auth::refuse_all()
        }
    }
}

/// The TLS server of `info`'s configuration, if it names certificate files.
/// Files that became unusable since the configuration was checked make
/// every handshake fail rather than open the port in plain text.
fn tls_server(info: &WorkerInfo) -> Option<Arc<TlsServer>> {
    let files = info.config.tls.clone()?;
    match TlsServer::load(files.clone()) {
        Ok(tls) => {
            tracing::info!(cert = %tls.files().cert.display(), "TLS on the listen port");
            Some(Arc::new(tls))
        }
        Err(e) => {
            tracing::error!(error = %e, "TLS certificate unusable: every connection is refused");
            Some(Arc::new(TlsServer::refusing(files)))
        }
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
    fn session_setup(&self, peer: Remote) -> (Config<'static>, origin::Ref<'static, 'static>) {
        let mut config = Config {
            path: match peer {
                Remote::Upstream(path) => Some(path),
                _ => None,
            },
            ..if peer.is_local() {
                self.session_config
            } else {
                self.trunk_config
            }
        };
        // Both ends of a link are this process: payload crosses by reference.
        config.conn.stream_refs = peer == Remote::Link;
        let origin = if peer.is_local() {
            self.router.origin()
        } else {
            self.router.local_origin()
        };
        (config, origin)
    }
}

/// Runs one relay session (a client connection, a worker link or the
/// upstream), made from [`Relay::session_setup`], whose peer holds `S`
/// upstream subscriptions at once ([`CLIENT_UPSTREAM`] for a client,
/// [`TRUNK_UPSTREAM`] for a link or the upstream: a client's future then
/// holds no trunk-sized table).
#[allow(clippy::too_many_arguments)]
async fn run_session<'s, R: ByteRead, W: ByteWrite, const N: usize, const S: usize>(
    relay: Rc<Relay>,
    session: Result<Box<Session<'s, 'static, 'static, N>>, ConfigError>,
    sides: Option<&'s mut SideTables>,
    reader: R,
    writer: W,
    side: Side,
    id: u64,
    peer: Remote,
    lender: Option<Rc<Lender>>,
    resolver: Option<&'s dyn Resolve<'static, 'static>>,
    gate: Option<Rc<Gate>>,
    ctx: &DriveCtx,
) -> io::Result<Ended> {
    let mut session = session.map_err(io::Error::other)?;
    if peer.is_local() {
        session.set_resolver(resolver);
    } else {
        session.set_resolver(Some(&*relay));
    }
    let kind = match peer {
        Remote::Client => PeerKind::Client,
        // The dialing side of a link, and a leaf towards its upstream, ask
        // for announcements at once; accepted clients after their SETUP.
        // A link mirrors the other worker's groups: a subscriber here can
        // have any group one there could.
        Remote::Link => PeerKind::Trunk {
            ask_first: side == Side::Client,
            mirror: true,
        },
        Remote::Upstream(_) => PeerKind::Trunk {
            ask_first: true,
            mirror: false,
        },
    };
    let gate = if peer.is_local() { gate } else { None };
    let mut app = RelayConn::<S>::new(relay.clone(), id, kind, lender, gate);
    drive(session, sides, reader, writer, &mut app, ctx).await
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
            // Boxed: the wait (a timer and a read in flight) ends with the
            // first bytes, so the task, which lives as long as the
            // connection, does not carry its state.
            if !Box::pin(reader.wait_first()).await? {
                tracing::debug!(conn = id, "connection closed before it sent anything");
                return Ok(());
            }
            let Some(tls) = self.tls.clone() else {
                return self.serve_stream(id, reader, writer, None, ctx).await;
            };
            // The TLS state lives in an allocation of its own, so a
            // connection still waiting for its first byte holds only the
            // small future above.
            Box::pin(self.clone().serve_tls(id, tls, reader, writer, ctx)).await
        }
    }
}

impl RelayHandler {
    /// Serves an accepted connection whose first bytes arrived on a TLS
    /// listen port: the handshake (docs/protocol.md §9.8), then
    /// [`RelayHandler::serve_stream`] on the plaintext.
    async fn serve_tls(
        self: Rc<Self>,
        id: u64,
        tls: Arc<TlsServer>,
        reader: crate::conn::Reader,
        writer: crate::conn::Writer,
        ctx: DriveCtx,
    ) -> io::Result<()> {
        // docs/protocol.md §9.8: TLS first, within the handshake timeout;
        // then the same choice between QMux and HTTP on the plaintext.
        let limit = reader.handshake_timeout();
        let Some(config) = tls.config() else {
            tracing::info!(conn = id, "no usable TLS certificate; connection closed");
            return Ok(());
        };
        let handshake = match rustls::ServerConnection::new(config) {
            Ok(conn) => skiff_monoio::tls::handshake(conn, reader, writer),
            Err(e) => {
                tracing::warn!(conn = id, error = %e, "TLS: cannot start a handshake");
                return Ok(());
            }
        };
        // Bounded by the handshake timeout, and abandoned when the server drains.
        let bounded = race(handshake, monoio::time::sleep(limit));
        let drain = ctx.shutdown.clone();
        let drained = async move {
            match &drain {
                Some(d) => d.wait().await,
                None => std::future::pending().await,
            }
        };
        let (reader, writer) = match race(bounded, drained).await {
            Ok(Ok(Ok(halves))) => halves,
            Ok(Ok(Err(e))) => {
                // One line per refused connection (a plaintext client, an
                // untrusted certificate on the client's side...).
                tracing::info!(conn = id, error = %e, "TLS handshake failed; connection closed");
                return Ok(());
            }
            Ok(Err(())) => {
                tracing::info!(
                    conn = id,
                    "TLS handshake not finished in {limit:?}; connection closed"
                );
                return Ok(());
            }
            Err(()) => {
                tracing::debug!(conn = id, "draining: TLS handshake abandoned");
                return Ok(());
            }
        };
        // qmux's ALPN name fixes the application protocol (no
        // application_protocols parameter then); none or HTTP/1.1 leaves
        // it to the bytes that follow.
        let fixed = (reader.alpn().as_deref() == Some(skiff_monoio::tls::ALPN_QMUX))
            .then_some(skiff_ws::APPLICATION);
        self.serve_stream(id, reader, writer, fixed, ctx).await
    }
}

impl RelayHandler {
    /// Serves an accepted byte stream (plain TCP, or TLS once its handshake
    /// is done) whose first bytes arrived or are on their way: QMux, or HTTP
    /// and WebSocket (docs/protocol.md §9.1). `fixed_protocol` is the
    /// application protocol TLS ALPN agreed on for QMux.
    async fn serve_stream<R: HeadRead, W: ByteWrite>(
        self: &Rc<Self>,
        id: u64,
        mut reader: R,
        writer: W,
        fixed_protocol: Option<&'static str>,
        ctx: DriveCtx,
    ) -> io::Result<()> {
        // docs/protocol.md §9.1: three capitals start an HTTP request;
        // anything else is QMux over TCP (decided on at most three bytes).
        let limit = reader
            .guard()
            .handshake
            .unwrap_or(StdDuration::from_secs(10));
        let http = loop {
            match skiff_ws::http::is_http_start(reader.pending()) {
                Some(http) => break http,
                None => {
                    // Boxed: a first read of fewer than three bytes is rare,
                    // and the task should not carry this wait's state.
                    if !Box::pin(reader.read_more(3, limit)).await? {
                        return Ok(());
                    }
                }
            }
        };
        if !http {
            // The session's state (its future, its tables) exists only from
            // here on, in an allocation of its own: a connection waiting for
            // its first byte holds just the small future above.
            let ended =
                Box::pin(
                    self.clone()
                        .serve_session(id, reader, writer, None, fixed_protocol, ctx),
                );
            let ended = ended.await?;
            tracing::debug!(conn = id, ?ended, "connection done");
            return Ok(());
        }
        // The HTTP path (its head parser, its WebSocket framing) lives in an
        // allocation of its own, so a QMux connection's task does not carry
        // its state.
        Box::pin(self.serve_web(id, reader, writer, limit, ctx)).await
    }

    /// Serves an HTTP connection: a page or file, or a WebSocket upgrade
    /// whose messages carry the session (docs/protocol.md §9.2, §9.6).
    async fn serve_web<R: HeadRead, W: ByteWrite>(
        self: &Rc<Self>,
        id: u64,
        mut reader: R,
        mut writer: W,
        limit: StdDuration,
        ctx: DriveCtx,
    ) -> io::Result<()> {
        let routed = crate::web::serve_http(
            self.relay.origin(),
            &self.web_dir,
            &mut reader,
            &mut writer,
            id,
            limit,
        )
        .await?;
        let crate::web::Routed::Upgrade {
            target,
            protocol,
            early,
        } = routed
        else {
            return Ok(());
        };
        let link = skiff_monoio::ws::Link::new();
        let max =
            usize::try_from(self.relay.session_config.conn.max_record_size).unwrap_or(usize::MAX);
        let reader = WsReader::new(reader, WsRole::Server, max, early, link.clone());
        let writer = WsWriter::new(writer, WsRole::Server, link);
        let ended =
            Box::pin(
                self.clone()
                    .serve_session(id, reader, writer, Some(target), protocol, ctx),
            );
        let ended = ended.await?;
        tracing::debug!(conn = id, ?ended, "websocket connection done");
        Ok(())
    }
}

impl RelayHandler {
    /// Runs the session of client connection `id` once it has sent its
    /// first bytes; over WebSocket, `path` is the request target and
    /// `fixed_protocol` the application protocol the subprotocol chose
    /// (docs/protocol.md §9.2, §9.3).
    async fn serve_session<R: ByteRead, W: ByteWrite>(
        self: Rc<Self>,
        id: u64,
        reader: R,
        writer: W,
        path: Option<String>,
        fixed_protocol: Option<&'static str>,
        ctx: DriveCtx,
    ) -> io::Result<Ended> {
        let relay = self.relay.clone();
        let refused = |e: ResolveRefused, path: &str| relay.track_refused(Some(id), e, path);
        let resolver =
            Resolver::new(&self.relay.router, Some(id), &self.relay.queues).on_refused(&refused);
        let gate = (!self.auth.is_open()).then(|| {
            let clock = self.clock;
            Rc::new(Gate::new(self.auth.clone(), move || {
                (clock.now(), std::time::SystemTime::now())
            }))
        });
        // Media tables come at the client's SETUP, for the directions its
        // Role names; they outlive the session that borrows them.
        let mut sides = SideTables::new(self.sides.clone());
        let mut storage = self.storage.take();
        let (config, origin) = self.relay.session_setup(Remote::Client);
        let mut config: Config<'_> = config;
        config.path = path.as_deref();
        if path.is_some() || fixed_protocol.is_some() {
            config.conn.fixed_protocol = fixed_protocol;
        }
        // Boxed at once, so the session is not copied into the futures below.
        let session: Result<Box<MoqSession<'_>>, _> = Session::new(
            Side::Server,
            config,
            ctx.clock.now(),
            &mut storage,
            Some(origin),
        )
        .map(|mut s| {
            // docs/protocol.md §4.10: admitted at SETUP, scoped from then on.
            s.set_scope(gate.as_deref().map(|g| g as &dyn Scope));
            Box::new(s)
        });
        let relay = self.relay.clone();
        let ended = run_session::<_, _, STREAMS, CLIENT_UPSTREAM>(
            relay,
            session,
            Some(&mut sides),
            reader,
            writer,
            Side::Server,
            id,
            Remote::Client,
            None,
            Some(&resolver),
            gate.clone(),
            &ctx,
        )
        .await;
        if let Some(refusal) = gate.as_ref().and_then(|g| g.refusal()) {
            tracing::debug!(conn = id, reason = %refusal, "session refused");
        }
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
