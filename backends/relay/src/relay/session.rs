//! One relay session: what is at its other end ([`Remote`]), its configuration
//! and origin, and the application ([`RelayConn`]) that hands its events to the
//! core's relay policy and wakes whom they concern.

use super::*;
use crate::record::fetch::Outcome;
use skiff_core::session::FetchId;

/// What is at the other end of a relay session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Remote {
    /// An accepted client: a publisher, a subscriber, or a leaf relay.
    Client,
    /// Another worker of this relay, over a socket pair.
    Link,
    /// The upstream relay this one is a leaf of (`--upstream`).
    Upstream,
    /// A cluster peer this relay dials (`--cluster-connect`): announcements
    /// and subscriptions both ways, every route offered with its hop list
    /// (docs/protocol.md §4.3).
    Cluster,
}

impl Remote {
    /// The session is offered every route of the worker (a client's view,
    /// or a cluster peer's, hop lists and split horizon keeping loops
    /// out), not only this worker's own sources' broadcasts.
    fn sees_all_routes(self) -> bool {
        matches!(self, Remote::Client | Remote::Cluster)
    }
}

/// The relay side of one connection: the core's [`Peer`] for it, and its
/// upstream SUBSCRIBE queue (`S` subscriptions at most).
pub(super) struct RelayConn<'n, const S: usize> {
    relay: Rc<Relay>,
    /// The session's id for the core, and its name for log lines (borrowed
    /// from the task that serves the connection: each copy would grow
    /// every session's future).
    name: &'n ConnName,
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
    /// When a session without SETUP yet is closed: a QUIC session, whose
    /// transport has no handshake timer of its own (a QMux connection's
    /// covers SETUP).
    setup_by: Option<Instant>,
    /// Counts a QUIC client among the worker's handshakes until its SETUP.
    handshake: Option<HandshakeToken>,
    /// Whether the session is an accepted client's.
    client: bool,
    /// Whether the session was accepted as a cluster peer
    /// ([`RelayConn::is_cluster_peer`]).
    cluster_peer: bool,
    /// A session with a cluster peer this relay dials: what it counts.
    peer_stats: Option<PeerSession>,
    /// Fetches the session's cache could not answer, with their outcome
    /// (read from the recording, or the code to refuse them with).
    fetched: Rc<RefCell<Vec<(Missed, Outcome)>>>,
}

/// A fetch handed to the relay ([`Event::Fetch`]): its id, track and group.
type Missed = (FetchId, String, u64);

/// What a session with a cluster peer this relay dials counts for the
/// peer's metrics.
struct PeerSession {
    /// The peer's counters (shared by its sessions on every worker).
    stats: Arc<crate::metrics::PeerCounters>,
    /// The paths the peer routes over this session now (a repeated
    /// announcement of one, a route change, counts once).
    paths: std::collections::HashSet<Box<str>>,
    /// The subscriptions the session serves the peer, as counted last.
    served: u64,
    /// The announcements the session sent the peer, as counted last.
    sent: u64,
}

impl<'n, const S: usize> RelayConn<'n, S> {
    /// The relay side of session `name` (its queue registered with the relay).
    fn new(
        relay: Rc<Relay>,
        name: &'n ConnName,
        kind: PeerKind,
        lender: Option<Rc<Lender>>,
        gate: Option<Rc<Gate>>,
    ) -> Self {
        let id = name.id();
        let queue = Rc::new(SubscribeQueue::new());
        relay.add_source(id, queue.clone());
        // The relay's Hop ID and hop limit check what the peer announces
        // (docs/protocol.md §4.3).
        let peer = Peer::new(id, kind).with_hops(relay.hop, relay.max_hops);
        relay.name_source(*name);
        let peer_stats = relay.peer_stats(id).map(|stats| {
            stats.session(true);
            PeerSession {
                stats,
                paths: std::collections::HashSet::new(),
                served: 0,
                sent: 0,
            }
        });
        RelayConn {
            client: kind == PeerKind::Client,
            cluster_peer: false,
            peer_stats,
            relay,
            name,
            peer,
            queue,
            armed: None,
            refused_tracks: 0,
            lender,
            reclaim: Reclaim::default(),
            gate,
            expiry_armed: false,
            setup_by: None,
            handshake: None,
            fetched: Rc::default(),
        }
    }

    /// Whether the session's token has expired (docs/protocol.md §4.10: no grace).
    fn expired(&self) -> bool {
        self.gate
            .as_ref()
            .and_then(|g| g.deadline())
            .is_some_and(|at| self.relay.clock.now() >= at)
    }

    /// Whether the session was accepted as a cluster peer (docs/protocol.md
    /// §4.10): an accepted client whose SETUP carries a hop id and no Role,
    /// and whose token grants publish and subscribe over the whole tree (or
    /// the relay is open). A viewer's or a publisher's token never makes
    /// one, whatever its SETUP says.
    pub(super) fn is_cluster_peer(&self) -> bool {
        self.cluster_peer
    }

    /// Decides at SETUP whether the client is a cluster peer
    /// ([`RelayConn::is_cluster_peer`]), and logs and counts it when its
    /// SETUP asks for that role.
    fn admit_peer(&mut self, hop: u64, role: skiff_core::wire::lite::Role) {
        if !self.client || hop == 0 || role != skiff_core::wire::lite::Role::Both {
            return;
        }
        let granted = match &self.gate {
            None => true,
            Some(g) => g.grants_everything(),
        };
        self.cluster_peer = granted;
        if granted {
            self.peer.set_cluster();
        }
        if let Some((m, _)) = &self.relay.metrics {
            m.inbound_peer(granted);
        }
        if granted {
            tracing::info!(conn = ?self.name, hop, "cluster peer joined");
        } else {
            tracing::info!(
                conn = ?self.name,
                hop,
                "not a cluster peer: the token does not grant publish and subscribe over the whole tree"
            );
        }
    }

    /// Counts an announcement of `path` from a cluster peer this relay
    /// dials: a route learned (`active`, once per path) or withdrawn.
    fn count_announcement(&mut self, path: &str, active: bool) {
        if let Some(p) = &mut self.peer_stats {
            let changed = if active {
                // A restart of a path held already allocates nothing.
                !p.paths.contains(path) && p.paths.insert(path.into())
            } else {
                p.paths.remove(path)
            };
            p.stats.announcement(changed.then_some(active));
        }
    }

    /// Answers or refuses the fetches whose outcome came.
    fn answer_fetches<X: Transport, const N: usize>(
        &mut self,
        session: &mut Session<'_, 'static, 'static, N, X>,
    ) {
        let done: Vec<_> = self.fetched.borrow_mut().drain(..).collect();
        for ((fetch, track, group), outcome) in done {
            let answer = outcome.and_then(|frames| match &self.relay.fetch_store {
                Some(store) => store.answer(&track, group, &frames),
                None => Err(StreamCode::NotFound),
            });
            // A fetch the requester cancelled meanwhile is unknown: nothing to do.
            let _ = match answer {
                Ok(consumer) => session.answer_fetch(fetch, consumer),
                Err(code) => {
                    tracing::debug!(conn = ?self.name, track, group, code = code.to_code(), "fetch refused");
                    session.refuse_fetch(fetch, code)
                }
            };
        }
    }

    /// Wakes whom a core call says to.
    fn wake(&self, wake: Wake) {
        match wake {
            // The policy ended the track ([`Wake::Track`]): its end woke the
            // sessions serving it through the track's wakers already.
            Wake::Nobody | Wake::Track(_) => {}
            Wake::All => {
                self.relay.notify.bump();
                self.relay.arm_timer();
            }
        }
    }
}

impl<const S: usize, const N: usize> App<N> for RelayConn<'_, S> {
    /// The relay's policy says whom each event concerns ([`Effect`]), and
    /// [`RelayConn::wake`] wakes them.
    ///
    /// [`Effect`]: skiff_core::relay::Effect
    const EVENTS_WAKE_ALL: bool = false;

    fn on_event(&mut self, event: &Event<'_>) {
        match *event {
            Event::Setup { role, hop, .. } => {
                // The path is not logged: its query may hold a token.
                tracing::debug!(conn = ?self.name, ?role, "client setup");
                self.admit_peer(hop, role);
            }
            Event::Announced { path, .. }
                if self.gate.as_ref().is_some_and(|g| !g.may_publish(path)) =>
            {
                // docs/protocol.md §4.10: outside the token's `publish`, not routed.
                tracing::info!(
                    conn = ?self.name,
                    path,
                    "announce refused: outside the publish grant"
                );
                return;
            }
            Event::Announced {
                path,
                hops,
                publisher,
                ..
            } => {
                tracing::info!(conn = ?self.name, path, ?hops, publisher, "broadcast announced");
                self.count_announcement(path, true);
            }
            Event::Unannounced { path, .. } => {
                tracing::info!(conn = ?self.name, path, "broadcast withdrawn");
                self.count_announcement(path, false);
            }
            Event::Closed {
                code,
                reason,
                local,
                ..
            } => {
                tracing::debug!(conn = ?self.name, code, reason, local, "session closed");
            }
            Event::Fetch {
                fetch,
                broadcast,
                track,
                group,
                code,
                ..
            } => {
                let missed = (fetch, track.to_owned(), group);
                match &self.relay.fetch_store {
                    // Only a client's fetch reads the recording (a link or a
                    // peer relay asks its own).
                    Some(store) if self.client => {
                        tracing::debug!(conn = ?self.name, broadcast, track, group, "fetch from the recording");
                        store.start_read(broadcast, track, group, missed, self.fetched.clone());
                    }
                    _ => self
                        .fetched
                        .borrow_mut()
                        .push((missed, Err(StreamCode::from_code(code)))),
                }
                return;
            }
            _ => {}
        }
        let relay = self.relay.clone();
        let effect = self
            .peer
            .on_event(event, &relay.router, relay.clock.now(), &relay.queues);
        if let (Some(e), Event::Announced { path, .. }) = (effect.refused, event) {
            let quota = match e {
                AnnounceRefused::Quota if self.peer.is_cluster() => Some("cluster-max-announces"),
                AnnounceRefused::Quota => Some(quota_key(Quota::Announces)),
                // A route that loops or is too long is not a quota: it is
                // dropped (docs/protocol.md §4.3).
                AnnounceRefused::Loop | AnnounceRefused::Hops => None,
                _ => Some("broadcast table"),
            };
            match quota {
                Some(quota) => relay.quota_refused(quota, Some(*self.name), path),
                None => tracing::debug!(conn = ?self.name, path, "announce dropped: {e}"),
            }
        }
        self.wake(effect.wake);
    }

    fn lend(&self, slice: Slice<'static>) -> Option<u64> {
        self.lender.as_deref()?.lend(slice)
    }

    fn wake_at(&mut self, now: Instant) -> Option<Instant> {
        let reclaim = match self.lender.as_deref() {
            Some(lender) => self.reclaim.next(lender, now),
            None => None,
        };
        match (reclaim, self.setup_by) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn act<X: Transport>(&mut self, session: &mut Session<'_, 'static, 'static, N, X>) {
        let relay = self.relay.clone();
        if let Some(at) = self.setup_by {
            if session.is_setup() {
                self.setup_by = None;
                self.handshake = None;
            } else if relay.clock.now() >= at {
                self.setup_by = None;
                self.handshake = None;
                if !session.is_closed() {
                    tracing::info!(conn = ?self.name, "no SETUP in time: session closed");
                    session.close(SessionCode::ControlMessageTimeout, "no SETUP in time");
                }
                return;
            }
        }
        if let Some(at) = self.gate.as_ref().and_then(|g| g.deadline()) {
            if self.expired() {
                if !session.is_closed() {
                    tracing::info!(conn = ?self.name, "token expired: session closed");
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
        if !self.fetched.borrow().is_empty() {
            self.answer_fetches(session);
        }
        relay.publish_gauges();
        relay.return_lent();
        relay.reclaim_tables();
        let refused = session.refused_track_requests();
        for _ in self.refused_tracks..refused {
            relay.quota_refused("max-waiting-track-requests", Some(*self.name), "");
        }
        self.refused_tracks = refused;
        if let Some(p) = &mut self.peer_stats {
            let now = session.served_count() as u64;
            if now != p.served {
                p.stats.served(p.served, now);
                p.served = now;
            }
            let sent = session.announcements_sent();
            if sent != p.sent {
                p.stats.announced(sent.saturating_sub(p.sent));
                p.sent = sent;
            }
        }
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

    fn on_guard_close(&mut self, reason: &'static str) {
        tracing::info!(conn = ?self.name, "{reason}: closing the connection");
    }

    fn on_close(&mut self) {
        if self.is_cluster_peer() {
            tracing::info!(conn = ?self.name, "cluster peer left");
        }
        if let Some(p) = self.peer_stats.take() {
            p.stats.forget_routes(p.paths.len() as u64);
            p.stats.served(p.served, 0);
            p.stats.session(false);
        }
        let relay = self.relay.clone();
        relay.remove_source(self.name.id());
        self.peer
            .on_close(&relay.router, &self.queue, relay.clock.now(), &relay.queues);
        self.wake(Wake::All);
        relay.publish_gauges();
    }
}

impl Relay {
    /// The configuration and the origin of a session with `peer`: a client's
    /// or a trunk's configuration; clients and cluster peers are offered
    /// every route of the worker, links and the upstream only this worker's
    /// own sources' broadcasts (one hop between workers, nothing loops back
    /// up). It carries no SETUP path: a dialed session sets its own, borrowed
    /// from its dial loop for the session's life.
    pub(super) fn session_setup(
        &self,
        peer: Remote,
    ) -> (Config<'static>, origin::Ref<'static, 'static>) {
        let mut config = Config {
            path: None,
            ..if peer == Remote::Client {
                self.session_config
            } else {
                self.trunk_config
            }
        };
        // Both ends of a link are one node: no Hop ID between them, so hop
        // lists cross unchanged and no loop check applies (§4.3).
        if peer == Remote::Link {
            config.hop = 0;
        }
        // Both ends of a link are this process: payload crosses by reference.
        config.conn.stream_refs = peer == Remote::Link;
        let origin = if peer.sees_all_routes() {
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
pub(super) async fn run_session<'s, R: ByteRead, W: ByteWrite, const N: usize, const S: usize>(
    relay: Rc<Relay>,
    session: Result<Box<Session<'s, 'static, 'static, N>>, ConfigError>,
    sides: Option<&'s mut SideTables>,
    reader: R,
    writer: W,
    side: Side,
    name: &ConnName,
    peer: Remote,
    lender: Option<Rc<Lender>>,
    resolver: Option<&'s dyn Resolve<'static, 'static>>,
    gate: Option<Rc<Gate>>,
    ctx: &DriveCtx,
) -> io::Result<Ended> {
    let mut session = session.map_err(io::Error::other)?;
    if peer == Remote::Client {
        session.set_resolver(resolver);
    } else {
        session.set_resolver(Some(&*relay));
    }
    let mut app = relay_app::<S>(relay.clone(), side, name, peer, lender, gate);
    drive(session, sides, reader, writer, &mut app, ctx).await
}

/// [`run_session`] for a session over QUIC: a client's, or a leaf's with
/// its upstream; `setup_by` closes the session if its SETUP exchange is not
/// done by then (`None`: no such limit), and `handshake` counts it among the
/// worker's handshakes until then.
#[allow(clippy::too_many_arguments)]
pub(super) async fn run_quic_session<'s, const N: usize, const S: usize>(
    relay: Rc<Relay>,
    session: Result<Box<QuicSession<'s, N>>, ConfigError>,
    sides: Option<&'s mut SideTables>,
    link: Link,
    side: Side,
    name: &ConnName,
    peer: Remote,
    resolver: Option<&'s dyn Resolve<'static, 'static>>,
    gate: Option<Rc<Gate>>,
    setup_by: Option<Instant>,
    handshake: Option<HandshakeToken>,
    ctx: &DriveCtx,
) -> io::Result<Ended> {
    let mut session = session.map_err(io::Error::other)?;
    if peer == Remote::Client {
        session.set_resolver(resolver);
    } else {
        session.set_resolver(Some(&*relay));
    }
    let mut app = relay_app::<S>(relay.clone(), side, name, peer, None, gate);
    app.setup_by = setup_by;
    app.handshake = handshake;
    drive_quic(session, sides, link, &mut app, ctx).await
}

/// The relay's app for a session with `peer` (its requests resolve through
/// the session's resolver: a local peer's through the caller's, a trunk's
/// through the relay itself).
fn relay_app<'n, const S: usize>(
    relay: Rc<Relay>,
    side: Side,
    name: &'n ConnName,
    peer: Remote,
    lender: Option<Rc<Lender>>,
    gate: Option<Rc<Gate>>,
) -> RelayConn<'n, S> {
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
        Remote::Upstream => PeerKind::Trunk {
            ask_first: true,
            mirror: false,
        },
        Remote::Cluster => PeerKind::Cluster { ask_first: true },
    };
    let gate = if peer == Remote::Client { gate } else { None };
    RelayConn::<S>::new(relay, name, kind, lender, gate)
}
