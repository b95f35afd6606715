//! The relay's side of one session: what its events mean for the
//! [`Router`], and the upstream subscriptions it makes and keeps in line
//! with their demand ([`Follow`]). A driver calls [`Peer::on_event`] for
//! every event of the session, [`Peer::act`] after each pass, and
//! [`Peer::on_close`] when it ends; the time is passed in.
//!
//! The requests the router makes of this session's source wait in its
//! [`SubscribeQueue`], which the driver registers with its [`Upstreams`]
//! (the router may queue into it while another session runs).

use core::cell::RefCell;
use core::fmt;

use super::demand::{Follow, LINGER, Step, mirror_request, upstream_request};
use super::routes::{
    AnnounceRefused, Announced, ResolveRefused, Router, SourceId, Upstreams, Via, end_track,
};
use crate::model::hops::{HopError, HopList};
use crate::model::path::Path;
use crate::model::{broadcast, track};
use crate::session::{AnnounceId, Error as SessionError, Event, Resolve, Session, SubscriptionId};
use crate::time::Instant;
use crate::transport::Transport;
use crate::wire::lite::{Hops, MAX_HOPS, Role, StreamCode};

/// Relay tracks waiting for this session to subscribe them upstream, oldest
/// first, at most `Q`; one past that is ended with INTERNAL (its requests get
/// the code instead of waiting for ever).
pub struct SubscribeQueue<'a, 'p, const Q: usize> {
    queue: RefCell<heapless::Deque<(broadcast::Ref<'a, 'p>, track::Ref<'a, 'p>), Q>>,
}

impl<const Q: usize> Default for SubscribeQueue<'_, '_, Q> {
    fn default() -> Self {
        Self::new()
    }
}

impl<'a, 'p, const Q: usize> SubscribeQueue<'a, 'p, Q> {
    /// An empty queue.
    pub const fn new() -> Self {
        SubscribeQueue {
            queue: RefCell::new(heapless::Deque::new()),
        }
    }

    /// Queues relay track `t` of `b`.
    pub fn push(&self, b: broadcast::Ref<'a, 'p>, t: track::Ref<'a, 'p>) {
        if self.queue.borrow_mut().push_back((b, t)).is_err() {
            debug!("relay: subscribe queue full, ending a relay track");
            end_track(t, StreamCode::Internal);
        }
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.queue.borrow().is_empty()
    }

    /// Forgets what waits (the session is over; a new source asks for every
    /// track of a broadcast anyway).
    pub fn clear(&self) {
        self.queue.borrow_mut().clear();
    }

    fn front(&self) -> Option<(broadcast::Ref<'a, 'p>, track::Ref<'a, 'p>)> {
        self.queue.borrow().front().copied()
    }

    fn pop(&self) {
        self.queue.borrow_mut().pop_front();
    }
}

impl<const Q: usize> fmt::Debug for SubscribeQueue<'_, '_, Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SubscribeQueue")
            .field("len", &self.queue.borrow().len())
            .finish()
    }
}

/// What is at the other end of a relay session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum PeerKind {
    /// An accepted client: a publisher, a subscriber or a leaf relay. Its
    /// broadcasts are this worker's own; its requests count against the
    /// client quotas.
    Client,
    /// A trunk (a link to another worker, the upstream relay); `ask_first`:
    /// this side asks for its announcements at once (the dialing side of a
    /// link, a leaf towards its upstream), else after the peer's SETUP.
    Trunk {
        /// Ask for the peer's announcements without waiting for its SETUP.
        ask_first: bool,
        /// Subscribe to a new track from the oldest group the peer holds
        /// (within the max age asked), not its latest: a link between two
        /// workers of one relay, so a subscriber on this worker can have
        /// what one on the peer's worker could ([`mirror_request`]).
        mirror: bool,
    },
    /// Another relay of the cluster (docs/protocol.md §4.3): dialed by this
    /// one (`ask_first`) or admitted as a peer. Like a client, its
    /// broadcasts are this worker's own (offered to the other workers) and
    /// it is offered every route; unlike a client, its routes are ranked
    /// with the cluster's shared tie-break, and its withdrawal of a route
    /// with no spare leaves the route waiting for the grace period (the
    /// next route may be on its way through another peer).
    Cluster {
        /// Ask for the peer's announcements without waiting for its SETUP.
        ask_first: bool,
    },
}

/// Whom a driver should wake after a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Wake {
    /// Nobody.
    Nobody,
    /// The sessions serving this track (its source ended it).
    Track(track::Key),
    /// Every session of the worker (routes changed).
    All,
}

/// What a driver should do after [`Peer::on_event`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Effect {
    /// Whom to wake.
    pub wake: Wake,
    /// An announcement of the peer's that was not taken (count it, log it).
    pub refused: Option<AnnounceRefused>,
    /// What the router made of an announcement of the peer's that it took
    /// (a new route, a spare, a route taken over: log route changes).
    pub announced: Option<Announced>,
}

impl From<Wake> for Effect {
    fn from(wake: Wake) -> Self {
        Effect {
            wake,
            refused: None,
            announced: None,
        }
    }
}

/// One upstream subscription of the session: it fills a relay track.
#[derive(Debug, Clone, Copy)]
struct Upstream<'a, 'p> {
    id: SubscriptionId,
    track: track::Ref<'a, 'p>,
    /// The broadcast `track` belongs to.
    broadcast: broadcast::Ref<'a, 'p>,
    /// The track's producer number when the session took its producer
    /// ([`track::Ref::producer_serial`]).
    serial: u64,
    follow: Follow,
}

impl Upstream<'_, '_> {
    /// Whether the router let this subscription's producer go because a
    /// newer client source of the route took it over (see
    /// [`Router::announce`]; only a client's routes are taken over): the
    /// subscription no longer fills the track, and must neither follow its
    /// demand nor end it. One read while the producer is the session's; the
    /// route is looked up only once the track's producer changed (the
    /// session's own end of the subscription detaches it too, and is told
    /// apart by the route still being `peer`'s).
    fn let_go<const T: usize, const G: usize>(
        &self,
        peer: SourceId,
        router: &Router<'_, '_, '_, T, G>,
    ) -> bool {
        self.track.producer_serial() != self.serial
            && (self.track.has_producer() || router.source_of(self.broadcast) != Some(peer))
    }
}

/// The relay's side of one session, with at most `S` upstream subscriptions
/// (see the module docs).
pub struct Peer<'a, 'p, const S: usize> {
    id: SourceId,
    kind: PeerKind,
    want_announce: bool,
    announce: Option<AnnounceId>,
    subs: heapless::Vec<Upstream<'a, 'p>, S>,
    /// Whether the router took an announcement of this peer's (else its end
    /// concerns no route and costs the router nothing).
    announced: bool,
    /// This node's Hop ID (0: none), for the loop check on receipt.
    hop: u64,
    /// The longest route taken, in hops (1 to [`MAX_HOPS`]).
    max_hops: usize,
}

impl<const S: usize> fmt::Debug for Peer<'_, '_, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Peer")
            .field("id", &self.id)
            .field("kind", &self.kind)
            .field("upstream", &self.subs.len())
            .finish()
    }
}

impl<'a, 'p, const S: usize> Peer<'a, 'p, S> {
    /// The relay side of session `id` with a peer of `kind`.
    pub fn new(id: SourceId, kind: PeerKind) -> Self {
        Peer {
            id,
            kind,
            want_announce: matches!(
                kind,
                PeerKind::Trunk {
                    ask_first: true,
                    ..
                } | PeerKind::Cluster { ask_first: true }
            ),
            announce: None,
            subs: heapless::Vec::new(),
            announced: false,
            hop: 0,
            max_hops: MAX_HOPS,
        }
    }

    /// The same with this node's Hop ID `hop` (0: none) and the longest
    /// route it takes, `max_hops` (clamped to 1 to [`MAX_HOPS`]): see
    /// [`Peer::route`].
    pub fn with_hops(mut self, hop: u64, max_hops: usize) -> Self {
        self.hop = hop;
        self.max_hops = max_hops.clamp(1, MAX_HOPS);
        self
    }

    /// The route of an announcement that came with `hops` from a publisher
    /// whose ANNOUNCE_OK named it `publisher` (docs/protocol.md §3.6, §4.3).
    /// From another worker of this relay (the same node) the list is taken
    /// as it is. From anyone else it is completed with `publisher`; a
    /// publisher that did not name itself gets this connection's stamp in
    /// front; and the route is refused as a loop if it names the publisher
    /// twice or crosses this node, and as too long past the hop limit. The
    /// route counts as forwarded ([`Via::peer`]: ranked with the shared
    /// tie-break, not as published here) if the peer is a cluster peer or
    /// the list it sent is not empty (the announcing session is a relay
    /// passing on another's broadcast, such as a moq-relay dialing this one
    /// as a client).
    ///
    /// # Errors
    /// [`AnnounceRefused::Loop`], [`AnnounceRefused::Hops`].
    pub fn route(&self, hops: Hops<'_>, publisher: u64) -> Result<Via, AnnounceRefused> {
        let too_long = |_: HopError| AnnounceRefused::Hops;
        let forwarded = !hops.is_empty();
        let mut list = HopList::from_hops(hops).map_err(too_long)?;
        if self.is_link() {
            return Ok(Via {
                hops: list,
                peer: false,
                cluster: false,
            });
        }
        list.push(publisher).map_err(|e| match e {
            HopError::Duplicate => AnnounceRefused::Loop,
            HopError::Full => AnnounceRefused::Hops,
        })?;
        if list.contains(self.hop) {
            return Err(AnnounceRefused::Loop);
        }
        list.stamp(self.stamp()).map_err(|e| match e {
            HopError::Duplicate => AnnounceRefused::Loop,
            HopError::Full => AnnounceRefused::Hops,
        })?;
        if list.len() > self.max_hops {
            return Err(AnnounceRefused::Hops);
        }
        Ok(Via {
            hops: list,
            peer: forwarded || self.is_cluster(),
            cluster: self.is_cluster(),
        })
    }

    /// This connection's stand-in for a publisher without a Hop ID: an FNV
    /// mix of this node's Hop ID and the connection's id, non-zero and
    /// below 2^53 like a Hop ID.
    fn stamp(&self) -> u64 {
        const PRIME: u64 = 0x0000_0100_0000_01b3;
        let bytes = self
            .hop
            .to_le_bytes()
            .into_iter()
            .chain(self.id.to_le_bytes());
        let h = bytes.fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(PRIME)
        });
        (h & ((1 << 53) - 1)).max(1)
    }

    /// Marks the peer as another relay of the cluster (a session accepted as
    /// a client and admitted as a peer, docs/protocol.md §4.3): its routes
    /// from now on rank as a peer's, and it is asked for announcements
    /// whatever role its SETUP declared. Call before its announcements
    /// arrive (on its SETUP).
    pub fn set_cluster(&mut self) {
        if self.kind == PeerKind::Client {
            self.kind = PeerKind::Cluster { ask_first: false };
            if self.announce.is_none() {
                self.want_announce = true;
            }
        }
    }

    /// The source id the router knows this session by.
    pub fn id(&self) -> SourceId {
        self.id
    }

    /// Whether the peer's broadcasts are this worker's own.
    fn local(&self) -> bool {
        matches!(self.kind, PeerKind::Client | PeerKind::Cluster { .. })
    }

    /// Whether the peer is another relay of the cluster (dialed as one, or
    /// accepted and marked by [`Peer::set_cluster`]).
    pub fn is_cluster(&self) -> bool {
        matches!(self.kind, PeerKind::Cluster { .. })
    }

    /// Whether the peer is another worker of this relay (a mirroring trunk).
    fn is_link(&self) -> bool {
        matches!(self.kind, PeerKind::Trunk { mirror: true, .. })
    }

    /// Upstream subscriptions made and not over.
    #[cfg(test)]
    pub fn upstream(&self) -> usize {
        self.subs.len()
    }

    /// Takes an event of the session.
    pub fn on_event<const T: usize, const G: usize>(
        &mut self,
        event: &Event<'_>,
        router: &Router<'_, 'a, 'p, T, G>,
        now: Instant,
        upstreams: &dyn Upstreams<'a, 'p>,
    ) -> Effect {
        let wake = match *event {
            Event::Setup { role, .. } => {
                // A client that only subscribes has nothing to announce.
                self.want_announce = self.announce.is_none()
                    && (self.kind != PeerKind::Client || role != Role::Subscriber);
                Wake::Nobody
            }
            Event::Announced {
                path,
                hops,
                publisher,
                ..
            } => {
                let Ok(p) = Path::new(path) else {
                    return Effect {
                        refused: Some(AnnounceRefused::Path),
                        ..Wake::Nobody.into()
                    };
                };
                let via = match self.route(hops, publisher) {
                    Ok(via) => via,
                    Err(e) => {
                        // A restart onto a route that loops or is too long
                        // withdraws the route it replaces.
                        debug!("relay: announcement of {} dropped: {}", path, e);
                        return Effect {
                            refused: Some(e),
                            ..self.withdraw(p, router, now, upstreams).into()
                        };
                    }
                };
                match router.announce_via(p, self.id, self.local(), &via, upstreams) {
                    Ok(announced) => {
                        self.announced = true;
                        return Effect {
                            announced: Some(announced),
                            ..Wake::All.into()
                        };
                    }
                    Err(e) => {
                        debug!("relay: announcement of {} ignored: {}", path, e);
                        return Effect {
                            refused: Some(e),
                            ..Wake::Nobody.into()
                        };
                    }
                }
            }
            Event::Unannounced { path, .. } => match Path::new(path) {
                Ok(p) => self.withdraw(p, router, now, upstreams),
                Err(_) => Wake::Nobody,
            },
            Event::AnnounceEnded { request, .. } if Some(request) == self.announce => {
                self.announce = None;
                if !core::mem::take(&mut self.announced) {
                    return Wake::Nobody.into();
                }
                router.source_gone(self.id, now, upstreams);
                Wake::All
            }
            Event::TrackInfo { subscription, info } => {
                // Relays re-serve what their source said; TRACK requests
                // waiting for it are answered now.
                if let Some(s) = self.subs.iter().find(|s| s.id == subscription) {
                    s.track.set_info(info);
                }
                Wake::Nobody
            }
            Event::SubscriptionClosed { subscription, code } => {
                let Some(i) = self.subs.iter().position(|s| s.id == subscription) else {
                    return Wake::Nobody.into();
                };
                let s = self.subs.swap_remove(i);
                if self.local() && s.let_go(self.id, router) {
                    // Another source fills the track now.
                    return Wake::Nobody.into();
                }
                let code = code.map(StreamCode::from_code);
                if (self.is_link() || self.is_cluster()) && code == Some(StreamCode::Unroutable) {
                    // The other worker does not serve the path (any more):
                    // the requests wait for the next source within the
                    // grace period rather than be refused (see
                    // `Router::upstream_unroutable`).
                    return if router.upstream_unroutable(s.track, self.id, now, upstreams) {
                        Wake::Track(s.track.key()).into()
                    } else {
                        Wake::All.into()
                    };
                }
                if router.upstream_closed(s.track, code) {
                    // The sessions serving it pass the code on now.
                    Wake::Track(s.track.key())
                } else {
                    Wake::Nobody
                }
            }
            _ => Wake::Nobody,
        };
        wake.into()
    }

    /// The peer withdrew `path` (or restarted it onto a route this node
    /// does not take).
    fn withdraw<const T: usize, const G: usize>(
        &self,
        path: Path<'_>,
        router: &Router<'_, 'a, 'p, T, G>,
        now: Instant,
        upstreams: &dyn Upstreams<'a, 'p>,
    ) -> Wake {
        let gone = if self.is_link() {
            // A worker link's withdrawal may be a lost source, or overtake
            // the next source's announcement: see `Router::source_left`.
            router.source_left(path, self.id, now, upstreams)
        } else {
            router.withdrawn(path, self.id, self.is_cluster(), now, upstreams)
        };
        if gone { Wake::All } else { Wake::Nobody }
    }

    /// After a pass of the session: asks for announcements when due, makes
    /// the upstream SUBSCRIBEs `queue` holds, and keeps each upstream
    /// subscription in line with its track's demand. Returns the next time
    /// this must run even if nothing else happens (a linger to end). `now`
    /// is read only if a linger needs it (at most once).
    pub fn act<const T: usize, const G: usize, const N: usize, const Q: usize, X: Transport>(
        &mut self,
        session: &mut Session<'_, 'a, 'p, N, X>,
        router: &Router<'_, 'a, 'p, T, G>,
        queue: &SubscribeQueue<'a, 'p, Q>,
        now: impl Fn() -> Instant,
    ) -> Option<Instant> {
        if !self.want_announce && self.subs.is_empty() && queue.is_empty() {
            // A session that only subscribes: nothing to do, every pass.
            return None;
        }
        if self.want_announce && session.is_established() {
            match session.announce_request("") {
                Ok(a) => {
                    self.announce = Some(a);
                    self.want_announce = false;
                }
                Err(SessionError::NotReady) => {}
                Err(_) => self.want_announce = false,
            }
        }
        while let Some((b, t)) = queue.front() {
            if !t.is_current() || !b.is_current() {
                // Given up and reused before it was asked for.
                queue.pop();
                continue;
            }
            if self.subs.is_full() {
                break;
            }
            if router.source_of(b) != Some(self.id) {
                // Asked of this source before another one took the route
                // over; the route's source now is asked for it.
                queue.pop();
                continue;
            }
            let request = match self.kind {
                PeerKind::Trunk { mirror: true, .. } => mirror_request(t),
                _ => upstream_request(t),
            };
            let held = b.path();
            match session.subscribe(held.as_str(), t, request) {
                Ok(id) => {
                    // Room checked above.
                    let _ = self.subs.push(Upstream {
                        id,
                        track: t,
                        broadcast: b,
                        serial: t.producer_serial(),
                        follow: Follow::new(request, LINGER),
                    });
                }
                // Control slots come back as requests are answered: the rest
                // waits for the next pass, in order.
                Err(SessionError::ControlFull | SessionError::NotReady) => break,
                Err(_) => {
                    end_track(t, StreamCode::Internal);
                    router.drop_track(t);
                }
            }
            queue.pop();
        }
        self.follow_demand(session, router, now)
    }

    /// [`Follow::step`] for every upstream subscription; the earliest
    /// linger deadline.
    fn follow_demand<const T: usize, const G: usize, const N: usize, X: Transport>(
        &mut self,
        session: &mut Session<'_, 'a, 'p, N, X>,
        router: &Router<'_, 'a, 'p, T, G>,
        now: impl Fn() -> Instant,
    ) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        let read = core::cell::Cell::new(None);
        let now = || match read.get() {
            Some(t) => t,
            None => {
                let t = now();
                read.set(Some(t));
                t
            }
        };
        let mut i = 0;
        let (id, client) = (self.id, self.local());
        while let Some(s) = self.subs.get_mut(i) {
            if client && s.let_go(id, router) {
                // A newer source of the route fills the track: this
                // subscription is forgotten and cancelled (its late groups
                // were refused already, the producer being stale).
                let s = self.subs.swap_remove(i);
                let _ = session.unsubscribe(s.id);
                continue;
            }
            match s.follow.step(s.track, now) {
                Step::Wait(at) => {
                    next = match (next, at) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                }
                Step::Update(want) => {
                    // Refused while the send buffer is full (tried again next
                    // pass) or once the subscription is over (its close
                    // event follows).
                    if session.update(s.id, want).is_ok() {
                        s.follow.updated(want);
                    }
                }
                Step::Cancel => {
                    let s = self.subs.swap_remove(i);
                    // Out of the broadcast first, so nobody new is served
                    // from it; then the FIN finishes it.
                    router.drop_track(s.track);
                    s.track.set_failover(false);
                    if session.unsubscribe(s.id).is_err() {
                        end_track(s.track, StreamCode::Cancel);
                    }
                    continue;
                }
            }
            i += 1;
        }
        next
    }

    /// Whether [`Peer::act`] has nothing to do before `now` unless the
    /// session's input or the media changes (`now` is read only if a linger
    /// runs).
    pub fn is_idle<const Q: usize>(
        &self,
        queue: &SubscribeQueue<'a, 'p, Q>,
        now: impl Fn() -> Instant,
    ) -> bool {
        !self.want_announce
            && queue.is_empty()
            && self
                .subs
                .iter()
                .all(|s| s.track.producer_serial() == s.serial && s.follow.is_quiet(s.track, &now))
    }

    /// The session is over: its tracks were detached from it, not ended
    /// (they are failover tracks), and wait with their broadcasts for a new
    /// source ([`Router::source_gone`]).
    pub fn on_close<const T: usize, const G: usize, const Q: usize>(
        &mut self,
        router: &Router<'_, 'a, 'p, T, G>,
        queue: &SubscribeQueue<'a, 'p, Q>,
        now: Instant,
        upstreams: &dyn Upstreams<'a, 'p>,
    ) {
        self.subs.clear();
        queue.clear();
        if core::mem::take(&mut self.announced) {
            router.source_gone(self.id, now, upstreams);
        }
    }
}

/// The on-demand hook of a relay session ([`Resolve`]): [`Router::resolve`]
/// for connection `conn` (`None`: a trunk, not held to the client quotas).
pub struct Resolver<'r, 'a, 'p, const T: usize, const G: usize> {
    router: &'r Router<'r, 'a, 'p, T, G>,
    conn: Option<SourceId>,
    upstreams: &'r dyn Upstreams<'a, 'p>,
    on_refused: Option<&'r RefusedHook<'r>>,
}

/// What a [`Resolver`] tells of each refusal: why, and the broadcast's path.
pub type RefusedHook<'r> = dyn Fn(ResolveRefused, &str) + 'r;

impl<'r, 'a, 'p, const T: usize, const G: usize> Resolver<'r, 'a, 'p, T, G> {
    /// The hook of connection `conn`, queueing through `upstreams`.
    pub fn new(
        router: &'r Router<'r, 'a, 'p, T, G>,
        conn: Option<SourceId>,
        upstreams: &'r dyn Upstreams<'a, 'p>,
    ) -> Self {
        Resolver {
            router,
            conn,
            upstreams,
            on_refused: None,
        }
    }

    /// Calls `f` with each refusal and the broadcast path (metrics, logs).
    pub fn on_refused(mut self, f: &'r RefusedHook<'r>) -> Self {
        self.on_refused = Some(f);
        self
    }
}

impl<'a, 'p, const T: usize, const G: usize> Resolve<'a, 'p> for Resolver<'_, 'a, 'p, T, G> {
    fn resolve(
        &self,
        broadcast: broadcast::Ref<'a, 'p>,
        name: &str,
    ) -> Result<track::Ref<'a, 'p>, StreamCode> {
        self.router
            .resolve(self.conn, broadcast, name, self.upstreams)
            .map_err(|e| {
                if let Some(f) = self.on_refused {
                    f(e, broadcast.path().as_str());
                }
                e.code()
            })
    }

    fn waiting(&self, path: Path<'_>, name: &str) -> Option<track::Ref<'a, 'p>> {
        self.router.waiting(path, name)
    }
}
