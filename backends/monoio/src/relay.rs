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
//!   the track in the broadcast and never reach the hook).
//! * The publisher's session fills the relay track group by group; every
//!   downstream session serves its subscribers from that track with their
//!   own Subscribe IDs, newest group first. Group bytes are stored once per
//!   worker, in pool blocks, and read by every downstream session from
//!   there. Per subscriber, the bytes are copied by `poll_transmit` into a
//!   per-thread scratch buffer, from there into the connection's write
//!   buffer, then by the kernel (the scratch hop is the easy thing to remove:
//!   transmit straight into the write buffer).
//! * If the upstream subscription fails, the session aborts the relay track
//!   with the upstream code, which every downstream subscription passes on
//!   (§4.4); the track is removed from the broadcast so a later request
//!   tries again.
//!
//! # Limits (known)
//!
//! * Across worker threads, broadcasts travel over pairwise worker links
//!   ([`Mesh`]): one moq-lite session per worker pair over a Unix socket
//!   pair. A link session's tables bound what crosses it (64 subscriptions
//!   each way, see [`crate::session_driver::SessionStorage`]).
//! * The upstream request is the live edge with the default max age; it is
//!   not re-aggregated from the downstream requests (§4.5 asks for the
//!   union), and it is kept while the track has no subscriber left.
//! * A TRACK request for a track created on demand is answered with default
//!   TRACK_INFO values, not the upstream ones.
//! * Broadcast and track states are allocated once each and never freed (the
//!   session's media model hands out plain references); a long-running relay
//!   with many short-lived broadcasts grows by a few hundred bytes per
//!   broadcast and track (group bytes live in the pool and are freed).

use std::cell::RefCell;
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::rc::Rc;
use std::sync::{Arc, Mutex};

use skiff_core::model::path::Path;
use skiff_core::model::{broadcast, origin, track};
use skiff_core::pool::{BlockMeta, Pool};
use skiff_core::session::{
    AnnounceId, Config, Error as SessionError, Event, Resolve, Session, SubscriptionId,
};
use skiff_core::window::{End, Request, Start};
use skiff_core::wire::lite::{Role, StreamCode};
use skiff_core::wire::qmux::Side;

use crate::clock::Clock;
use crate::conn::Connection;
use crate::handler::{ConnectionHandler, WorkerInfo};
use crate::notify::Notify;
use crate::session_driver::{
    App, ByteRead, ByteWrite, DriveCtx, Ended, MoqSession, StoragePool, drive, split_halves,
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
pub const BLOCK_BYTES: usize = 4096;

/// A session's queue of upstream subscriptions to make.
#[derive(Debug, Default)]
pub struct Upstream {
    pending: RefCell<Vec<(String, track::Ref<'static, 'static>)>>,
}

struct Entry {
    path: String,
    /// Announced by a client of this worker (not learned over a link).
    local: bool,
    handle: broadcast::Ref<'static, 'static>,
    producer: broadcast::Producer<'static, 'static>,
    owner: u64,
    upstream: Rc<Upstream>,
}

/// The relay state of one worker thread: origin, cache pool, routes.
pub struct Relay {
    origin: origin::Ref<'static, 'static>,
    /// The broadcasts of this worker's own clients: what links announce to
    /// the other workers (one hop, so nothing loops).
    local_origin: origin::Ref<'static, 'static>,
    pool: &'static Pool<'static>,
    hop: u64,
    track_budget: u64,
    notify: Rc<Notify>,
    entries: RefCell<Vec<Entry>>,
}

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
    let blocks = usize::try_from(bytes / BLOCK_BYTES as u64)
        .unwrap_or(usize::MAX)
        .clamp(64, (u32::MAX - 1) as usize);
    let data: &'static mut [u8] = Box::leak(vec![0u8; blocks * BLOCK_BYTES].into_boxed_slice());
    let meta: &'static mut [BlockMeta] = Box::leak(
        (0..blocks)
            .map(|_| BlockMeta::new())
            .collect::<Vec<_>>()
            .into_boxed_slice(),
    );
    match Pool::from_parts(data, meta) {
        Ok(p) => Box::leak(Box::new(p)),
        Err(e) => panic!("pool layout: {e}"),
    }
}

impl Relay {
    /// The relay state of one thread with a cache of `cache_bytes`.
    pub fn new(hop: u64, cache_bytes: u64, notify: Rc<Notify>) -> Self {
        let origin: &'static origin::State<'static, 'static, BROADCASTS, CHANGES> =
            Box::leak(Box::new(origin::State::new()));
        let local: &'static origin::State<'static, 'static, BROADCASTS, CHANGES> =
            Box::leak(Box::new(origin::State::new()));
        Relay {
            origin: origin.handle(),
            local_origin: local.handle(),
            pool: leak_pool(cache_bytes),
            hop,
            track_budget: (cache_bytes / 8).max(1 << 20),
            notify,
            entries: RefCell::new(Vec::new()),
        }
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

    /// Broadcasts routed now.
    pub fn broadcasts(&self) -> usize {
        self.entries.borrow().len()
    }

    /// Registers broadcast `path` announced by connection `owner` (`local`:
    /// a client of this worker, not a link).
    fn add_broadcast(&self, path: &str, owner: u64, upstream: &Rc<Upstream>, local: bool) {
        let Ok(p) = Path::new(path) else {
            tracing::debug!(path, "announced path refused");
            return;
        };
        if self.origin.get(p).is_some() {
            tracing::debug!(
                path,
                "broadcast already routed; keeping the first publisher"
            );
            return;
        }
        let state: &'static broadcast::State<'static, 'static, TRACKS> =
            match broadcast::State::new(p) {
                Ok(s) => Box::leak(Box::new(s)),
                Err(_) => return,
            };
        let Ok(producer) = state.producer() else {
            return;
        };
        if let Err(e) = self.origin.announce(state.handle()) {
            tracing::warn!(path, error = %e, "cannot route broadcast");
            return;
        }
        if local && let Err(e) = self.local_origin.announce(state.handle()) {
            tracing::warn!(path, error = %e, "cannot offer broadcast to other workers");
        }
        tracing::info!(path, owner, local, "broadcast announced");
        self.entries.borrow_mut().push(Entry {
            path: path.to_owned(),
            local,
            handle: state.handle(),
            producer,
            owner,
            upstream: upstream.clone(),
        });
        self.notify.bump();
    }

    /// Withdraws `path` if `owner` announced it.
    fn remove_broadcast(&self, path: &str, owner: u64) {
        let mut entries = self.entries.borrow_mut();
        if let Some(i) = entries
            .iter()
            .position(|e| e.owner == owner && e.path == path)
        {
            let mut e = entries.swap_remove(i);
            self.withdraw(&mut e);
        }
    }

    /// Withdraws every broadcast of `owner`.
    fn remove_owned(&self, owner: u64) {
        let mut entries = self.entries.borrow_mut();
        let mut i = 0;
        while i < entries.len() {
            if entries[i].owner == owner {
                let mut e = entries.swap_remove(i);
                self.withdraw(&mut e);
            } else {
                i += 1;
            }
        }
    }

    fn withdraw(&self, e: &mut Entry) {
        tracing::info!(path = %e.path, "broadcast withdrawn");
        if let Ok(p) = Path::new(&e.path) {
            self.origin.unannounce(p);
            if e.local {
                self.local_origin.unannounce(p);
            }
        }
        e.producer.finish();
        self.notify.bump();
    }

    /// Forgets relay track `name` of `path` (its upstream subscription ended).
    fn drop_track(&self, path: &str, name: &str) {
        if let Some(e) = self.entries.borrow().iter().find(|e| e.path == path) {
            e.producer.remove(name);
        }
    }
}

impl Resolve<'static, 'static> for Relay {
    fn resolve(
        &self,
        broadcast: broadcast::Ref<'static, 'static>,
        name: &str,
    ) -> Option<track::Ref<'static, 'static>> {
        let entries = self.entries.borrow();
        let e = entries
            .iter()
            .find(|e| e.handle.same_broadcast(&broadcast))?;
        let info = track::Info::new(name).ok()?;
        let state: &'static track::State<'static, GROUPS> =
            Box::leak(Box::new(track::State::new(self.pool, info)));
        let t = state.handle();
        t.set_budget(self.track_budget);
        e.producer.add(t).ok()?;
        tracing::debug!(path = %e.path, track = name, "relay track created");
        e.upstream.pending.borrow_mut().push((e.path.clone(), t));
        self.notify.bump();
        Some(t)
    }
}

/// The upstream request of a relay track: the live edge onwards, with the
/// track's default max age (PROTOCOL.md §4.5, §4.7).
const UPSTREAM: Request = Request {
    start: Start::Latest,
    end: End::Open,
    ordered: false,
    priority: 0,
    max_latency: track::DEFAULT_MAX_AGE,
};

/// The relay side of one connection.
struct RelayConn {
    relay: Rc<Relay>,
    id: u64,
    /// A link to another worker (its announcements are not offered on links).
    link: bool,
    upstream: Rc<Upstream>,
    want_announce: bool,
    announce: Option<AnnounceId>,
    subs: Vec<(SubscriptionId, String, track::Ref<'static, 'static>)>,
}

impl App for RelayConn {
    fn on_event(&mut self, event: &Event<'_>) {
        match *event {
            Event::Setup { role, path, .. } => {
                tracing::debug!(conn = self.id, ?role, path, "client setup");
                // PROTOCOL.md §4.1: a client that only subscribes has nothing to announce.
                self.want_announce = self.link || role != Role::Subscriber;
            }
            Event::Announced { path, .. } => {
                self.relay
                    .add_broadcast(path, self.id, &self.upstream, !self.link)
            }
            Event::Unannounced { path, .. } => self.relay.remove_broadcast(path, self.id),
            Event::AnnounceEnded { request, .. } if Some(request) == self.announce => {
                self.announce = None;
                self.relay.remove_owned(self.id);
            }
            Event::SubscriptionClosed { subscription, code } => {
                if let Some(i) = self.subs.iter().position(|s| s.0 == subscription) {
                    let (_, path, t) = self.subs.swap_remove(i);
                    tracing::debug!(path, track = %t.info().name, ?code, "upstream subscription over");
                    // A track that ended normally stays in the cache, so a subscriber
                    // whose request arrives after the end still gets the cached groups
                    // and SUBSCRIBE_END; anything else is forgotten and asked for again.
                    let finished = code.is_none() && t.status() == track::Status::Finished;
                    if !finished {
                        self.relay.drop_track(&path, t.info().name.as_str());
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

    fn act(&mut self, session: &mut MoqSession<'_>) {
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
        let pending = std::mem::take(&mut *self.upstream.pending.borrow_mut());
        for (path, t) in pending {
            match session.subscribe(&path, t, UPSTREAM) {
                Ok(id) => self.subs.push((id, path, t)),
                Err(e) => {
                    tracing::debug!(path, error = %e, "upstream subscribe failed");
                    if let Ok(mut p) = t.producer() {
                        p.abort(StreamCode::Internal.to_code());
                    }
                    self.relay.drop_track(&path, t.info().name.as_str());
                }
            }
        }
    }

    fn on_close(&mut self) {
        self.relay.remove_owned(self.id);
        for (_, path, t) in self.subs.drain(..) {
            self.relay.drop_track(&path, t.info().name.as_str());
        }
        // Requests queued for this session will never be made.
        for (path, t) in self.upstream.pending.borrow_mut().drain(..) {
            if let Ok(mut p) = t.producer() {
                p.abort(StreamCode::SessionClosed.to_code());
            }
            self.relay.drop_track(&path, t.info().name.as_str());
        }
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

impl RelayHandler {
    /// The handler of the worker described by `info`, without links to
    /// other workers (right for one worker thread).
    pub fn new(info: &WorkerInfo) -> Self {
        let notify = Notify::shared();
        // A stable non-zero Hop ID per worker (PROTOCOL.md §4.3).
        let hop = 0x5c1f_0000_0000 | ((std::process::id() as u64) << 8) | (info.index as u64 + 1);
        RelayHandler {
            relay: Rc::new(Relay::new(hop, info.config.cache_bytes, notify)),
            storage: Rc::new(StoragePool::new()),
            clock: Clock::new(),
        }
    }

    /// A handler factory for `threads` workers linked pairwise (see
    /// [`Mesh`]): pass it to [`crate::server::start`].
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
            h
        })
    }

    /// This worker's relay state.
    pub fn relay(&self) -> &Rc<Relay> {
        &self.relay
    }

    /// Runs the link session to worker `peer` over `end` (client side on the
    /// lower-numbered worker).
    fn spawn_link(&self, info: &WorkerInfo, peer: usize, end: StdUnixStream) {
        let stream = match end
            .set_nonblocking(true)
            .and_then(|()| monoio::net::UnixStream::from_std(end))
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
        let ctx = DriveCtx {
            clock: self.clock,
            notify: self.relay.notify.clone(),
            shutdown: Some(info.shutdown.clone()),
        };
        let (relay, storage) = (self.relay.clone(), self.storage.clone());
        let id = LINK_ID_BASE + peer as u64;
        monoio::spawn(async move {
            let (reader, writer) = split_halves(stream, 64 * 1024);
            match run_session(relay, &storage, reader, writer, side, id, true, &ctx).await {
                Ok(ended) => tracing::debug!(peer, ?ended, "worker link ended"),
                Err(e) => tracing::warn!(peer, error = %e, "worker link failed"),
            }
        });
    }
}

/// Runs one relay session (a client connection or a worker link).
#[allow(clippy::too_many_arguments)]
async fn run_session<R: ByteRead, W: ByteWrite>(
    relay: Rc<Relay>,
    storage: &StoragePool,
    reader: R,
    writer: W,
    side: Side,
    id: u64,
    link: bool,
    ctx: &DriveCtx,
) -> io::Result<Ended> {
    let mut st = storage.take();
    let res = {
        let config = Config {
            hop: relay.hop,
            ..Config::new()
        };
        // Links offer only this worker's own broadcasts (one hop: no loops).
        let origin = if link {
            relay.local_origin
        } else {
            relay.origin
        };
        let session: Result<MoqSession<'_>, _> =
            Session::new(side, config, ctx.clock.now(), &mut *st, Some(origin));
        match session {
            Ok(mut session) => {
                session.set_resolver(Some(&*relay));
                let mut app = RelayConn {
                    relay: relay.clone(),
                    id,
                    link,
                    upstream: Rc::new(Upstream::default()),
                    want_announce: link && side == Side::Client,
                    announce: None,
                    subs: Vec::new(),
                };
                drive(session, reader, writer, &mut app, ctx).await
            }
            Err(e) => Err(io::Error::other(e)),
        }
    };
    storage.give(st);
    res
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
            let (reader, writer) = conn.into_split();
            let ended = run_session(
                self.relay.clone(),
                &self.storage,
                reader,
                writer,
                Side::Server,
                id,
                false,
                &ctx,
            )
            .await?;
            tracing::debug!(conn = id, ?ended, "connection done");
            Ok(())
        }
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
/// its own relay track. Cost: one payload copy (through the kernel socket
/// pair) per worker pair and track, whatever the number of subscribers;
/// fan-out to the subscribers of a worker is then from that worker's cache.
#[derive(Debug)]
pub struct Mesh {
    ends: Mutex<HashMap<(usize, usize), StdUnixStream>>,
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
                ends.insert((i, j), a);
                ends.insert((j, i), b);
            }
        }
        Ok(Mesh {
            ends: Mutex::new(ends),
        })
    }

    /// Worker `index`'s ends, with the peer each leads to.
    pub fn take(&self, index: usize) -> Vec<(usize, StdUnixStream)> {
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
