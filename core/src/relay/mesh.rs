//! A relay worker in simulated time (tests only): client sessions, each wired
//! in memory to a relay-side session driven by a [`Peer`], around one
//! [`Router`]. Time jumps to the next delivery, session timer, linger or
//! grace deadline, so the relay's policy is tested on real sessions without
//! a wall clock.

extern crate std;

use core::cell::Cell;
use std::vec::Vec;

use super::peer::{Peer, PeerKind, Resolver, SubscribeQueue};
use super::routes::{Router, SourceId, Upstreams};
use crate::conn::Connection;
use crate::model::{broadcast, track};
use crate::session::harness::{Endpoint, Ev, Node, Pair, Stepped, run_until};
use crate::session::{Event, Fed, Handler, Inbox, Session};
use crate::time::{Duration, Instant};

/// Upstream subscriptions one relay session holds (and its queue).
pub const Q: usize = 8;

/// The relay side of one connection: its session, the core's peer for it,
/// and the router the worker shares.
pub struct RelayEnd<'s, 'r, 'a, 'p, const T: usize, const G: usize> {
    pub node: Node<'s, 'a, 'p>,
    pub peer: Peer<'a, 'p, Q>,
    pub router: &'r Router<'r, 'a, 'p, T, G>,
    pub queues: &'r Queues<'r, 'a, 'p>,
    /// The peer's next linger deadline.
    linger: Option<Instant>,
}

impl<'s, 'r, 'a, 'p, const T: usize, const G: usize> RelayEnd<'s, 'r, 'a, 'p, T, G> {
    /// Wraps `session` (its events are the peer's, not the node's).
    pub fn new(
        session: Session<'s, 'a, 'p, 32>,
        id: SourceId,
        router: &'r Router<'r, 'a, 'p, T, G>,
        queues: &'r Queues<'r, 'a, 'p>,
    ) -> Self {
        let mut node = Node::new(session);
        node.auto_drain = false;
        RelayEnd {
            node,
            peer: Peer::new(id, PeerKind::Client),
            router,
            queues,
            linger: None,
        }
    }

    /// The same, with a peer of `kind` (a worker link, the upstream).
    pub fn with_kind(mut self, kind: PeerKind) -> Self {
        self.peer = Peer::new(self.peer.id(), kind);
        self
    }

    /// The same, on a node whose Hop ID is `hop` (its loop check on receipt).
    pub fn with_hops(mut self, hop: u64) -> Self {
        let kind = PeerKind::Client;
        self.peer = Peer::new(self.peer.id(), kind).with_hops(hop, crate::wire::lite::MAX_HOPS);
        self
    }

    /// The same, with a cluster peer on a node whose Hop ID is `hop`, which
    /// takes routes of at most `max_hops`.
    pub fn with_cluster(mut self, ask_first: bool, hop: u64, max_hops: usize) -> Self {
        self.peer =
            Peer::new(self.peer.id(), PeerKind::Cluster { ask_first }).with_hops(hop, max_hops);
        self
    }

    /// What a relay driver does after every call into the session: the
    /// core's pass (due timers, events to the peer, its turn).
    fn pass(&mut self, now: Instant) {
        let queue = self.queues.of(self.peer.id());
        let mut handler = PeerHandler {
            events: &mut self.node.events,
            peer: &mut self.peer,
            router: self.router,
            queues: self.queues,
            queue,
            linger: None,
        };
        self.node.session.pass(now, &mut handler);
        self.linger = handler.linger;
    }

    /// The session ended: the router hears of it.
    pub fn close(&mut self, now: Instant) {
        let queue = self.queues.of(self.peer.id());
        self.peer.on_close(self.router, queue, now, self.queues);
    }
}

impl<const T: usize, const G: usize> Endpoint for RelayEnd<'_, '_, '_, '_, T, G> {
    fn transmit(&mut self, now: Instant, out: &mut [u8]) -> usize {
        self.pass(now);
        self.node.transmit(now, out)
    }
    fn input(&mut self, now: Instant, data: &[u8]) -> Option<usize> {
        let r = self.node.input(now, data);
        self.pass(now);
        r
    }
    fn feed(&mut self, now: Instant, inbox: &mut Inbox<Vec<u8>>) -> Option<Fed> {
        let r = self.node.feed(now, inbox);
        self.pass(now);
        r
    }
    fn timeout(&self) -> Option<Instant> {
        [self.node.timeout(), self.linger]
            .into_iter()
            .flatten()
            .min()
    }
    fn on_timeout(&mut self, now: Instant) {
        self.pass(now);
    }
    fn stalled(&self) -> bool {
        self.node.stalled()
    }
}

/// A relay session's handler in a pass: the node's event log and the
/// core's peer.
struct PeerHandler<'h, 'r, 'a, 'p, const T: usize, const G: usize> {
    events: &'h mut Vec<Ev>,
    peer: &'h mut Peer<'a, 'p, Q>,
    router: &'r Router<'r, 'a, 'p, T, G>,
    queues: &'r Queues<'r, 'a, 'p>,
    queue: &'r SubscribeQueue<'a, 'p, Q>,
    /// The peer's next linger deadline, from its turn.
    linger: Option<Instant>,
}

impl<'s, 'a, 'p, const T: usize, const G: usize> Handler<'s, 'a, 'p, 32, Connection<32>>
    for PeerHandler<'_, '_, 'a, 'p, T, G>
{
    fn on_event(&mut self, now: Instant, event: &Event<'_>) {
        self.events.push((*event).into());
        let _ = self.peer.on_event(event, self.router, now, self.queues);
    }

    fn act(&mut self, now: Instant, session: &mut Session<'s, 'a, 'p, 32>) {
        self.linger = self.peer.act(session, self.router, self.queue, || now);
    }
}

/// The upstream SUBSCRIBE queue of every relay session, by source id (the
/// index).
pub struct Queues<'r, 'a, 'p> {
    pub queues: &'r [SubscribeQueue<'a, 'p, Q>],
}

impl<'a, 'p> Queues<'_, 'a, 'p> {
    fn of(&self, id: SourceId) -> &SubscribeQueue<'a, 'p, Q> {
        &self.queues[id as usize]
    }
}

impl<'a, 'p> Upstreams<'a, 'p> for Queues<'_, 'a, 'p> {
    fn subscribe(&self, owner: SourceId, b: broadcast::Ref<'a, 'p>, t: track::Ref<'a, 'p>) {
        if let Some(q) = self.queues.get(owner as usize) {
            q.push(b, t);
        }
    }
}

/// The connections of one relay worker, stepped together on one clock.
pub struct Mesh<'c, 's, 'r, 'a, 'p, const T: usize, const G: usize> {
    pub now: Instant,
    pub pairs: Vec<Option<Pair<Node<'c, 'a, 'p>, RelayEnd<'s, 'r, 'a, 'p, T, G>>>>,
    pub router: &'r Router<'r, 'a, 'p, T, G>,
    /// Latency of every link.
    pub latency: Duration,
    /// Steps taken (a bound for the tests).
    pub steps: Cell<usize>,
}

impl<'c, 's, 'r, 'a, 'p, const T: usize, const G: usize> Mesh<'c, 's, 'r, 'a, 'p, T, G> {
    /// An empty worker around `router`.
    pub fn new(router: &'r Router<'r, 'a, 'p, T, G>, latency: Duration) -> Self {
        Mesh {
            now: Instant::ZERO,
            pairs: Vec::new(),
            router,
            latency,
            steps: Cell::new(0),
        }
    }

    /// Adds a connection: `client` wired to `relay`; returns its index.
    pub fn connect(
        &mut self,
        client: Node<'c, 'a, 'p>,
        relay: RelayEnd<'s, 'r, 'a, 'p, T, G>,
    ) -> usize {
        let mut pair = Pair::new(client, relay);
        pair.now = self.now;
        pair.ab.latency = self.latency;
        pair.ba.latency = self.latency;
        self.pairs.push(Some(pair));
        self.pairs.len() - 1
    }

    /// Connection `i`.
    pub fn pair(
        &mut self,
        i: usize,
    ) -> &mut Pair<Node<'c, 'a, 'p>, RelayEnd<'s, 'r, 'a, 'p, T, G>> {
        self.pairs[i].as_mut().expect("connection closed")
    }

    /// Cuts connection `i` (as a dead TCP connection does): both sessions
    /// are dropped, and the relay learns its source is gone.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut p) = self.pairs[i].take() {
            p.b.close(self.now);
        }
    }

    fn step(&mut self) -> bool {
        self.steps.set(self.steps.get() + 1);
        let now = self.now;
        let mut progress = false;
        for p in self.pairs.iter_mut().flatten() {
            p.now = now;
            progress |= p.step();
        }
        if self.router.poll_timeout().is_some_and(|t| t <= now) {
            self.router.handle_timeout(now);
            progress = true;
        }
        progress
    }

    fn next_time(&self) -> Option<Instant> {
        self.pairs
            .iter()
            .flatten()
            .filter_map(|p| p.next_time())
            .chain(self.router.poll_timeout())
            .min()
    }

    /// Steps (jumping the clock when nothing moves) until `until` holds;
    /// false if it did not within `max` steps or everything went quiet.
    pub fn run(&mut self, max: usize, until: impl FnMut(&mut Self) -> bool) -> bool {
        run_until(self, max, until)
    }
}

impl<const T: usize, const G: usize> Stepped for Mesh<'_, '_, '_, '_, '_, T, G> {
    fn step(&mut self) -> bool {
        Mesh::step(self)
    }
    fn next_time(&self) -> Option<Instant> {
        Mesh::next_time(self)
    }
    fn clock(&mut self) -> &mut Instant {
        &mut self.now
    }
}

/// The resolver of relay connection `id` (its requests count against its quotas).
pub fn resolver<'r, 'a, 'p, const T: usize, const G: usize>(
    router: &'r Router<'r, 'a, 'p, T, G>,
    id: SourceId,
    queues: &'r Queues<'r, 'a, 'p>,
) -> Resolver<'r, 'a, 'p, T, G> {
    Resolver::new(router, Some(id), queues)
}

#[cfg(test)]
mod tests {
    use core::cell::RefCell;
    use std::boxed::Box;
    use std::vec::Vec;

    use super::*;
    use crate::model::group;
    use crate::model::path::Path;
    use crate::model::{broadcast, origin, track};
    use crate::pool::{Pool, PoolStorage};
    use crate::relay::routes::{Pending, Route, RouterLimits, RouterStorage, Spare};
    use crate::relay::{BroadcastSlot, BroadcastTable, LINGER, TrackSlot, TrackTable};
    use crate::session::harness::Ev;
    use crate::session::{Config, Storage};
    use crate::window::{End, Request, Start};
    use crate::wire::lite::StreamCode;
    use crate::wire::qmux::Side;

    type St = Storage<'static, 'static, 16, 512, 8, 8, 8, 8, 32>;
    const T: usize = 4;
    const G: usize = 8;
    const GRACE: Duration = Duration::from_secs(10);
    const CONNS: usize = 4;

    type R = Router<'static, 'static, 'static, T, G>;
    type M = Mesh<'static, 'static, 'static, 'static, 'static, T, G>;

    fn leak<X>(x: X) -> &'static X {
        Box::leak(Box::new(x))
    }

    fn leak_vec<X>(n: usize, f: impl FnMut() -> X) -> &'static [X] {
        Box::leak(
            std::iter::repeat_with(f)
                .take(n)
                .collect::<Vec<_>>()
                .into_boxed_slice(),
        )
    }

    fn pool() -> &'static Pool<'static> {
        let storage = Box::leak(Box::new(PoolStorage::<64, 256>::new()));
        leak(Pool::new(storage))
    }

    /// A relay worker: its router over small tables, and its queues.
    fn worker() -> (&'static R, &'static Queues<'static, 'static, 'static>) {
        let relay_pool = pool();
        let o = leak(origin::State::<8, 32>::new());
        let lo = leak(origin::State::<8, 32>::new());
        let broadcasts = leak(BroadcastTable::new(leak_vec(4, BroadcastSlot::<T>::new)));
        let tracks = leak(TrackTable::new(leak_vec(8, || {
            TrackSlot::<G>::new(relay_pool, track::Limits::NONE)
        })));
        let router = leak(Router::new(
            o.handle(),
            lo.handle(),
            broadcasts,
            tracks,
            RouterStorage {
                routes: leak_vec(4, || RefCell::new(None::<Route<'static, 'static>>)),
                spares: leak_vec(4, || RefCell::new(None::<Spare>)),
                pending: leak_vec(8, || Cell::new(None::<Pending<'static, 'static>>)),
            },
            RouterLimits {
                announces: 4,
                peer_announces: 4,
                pending_per_conn: 4,
                pending_per_broadcast: 4,
                grace: GRACE,
            },
        ));
        let queues = leak(Queues {
            queues: leak_vec(CONNS, SubscribeQueue::new),
        });
        (router, queues)
    }

    /// A publisher's media: broadcast `path` with one track "video".
    fn publication(
        pool: &'static Pool<'static>,
        path: &str,
    ) -> (
        origin::Ref<'static, 'static>,
        track::Producer<'static, 'static>,
    ) {
        let t = leak(track::State::<G>::new(
            pool,
            track::Info::new("video").unwrap(),
        ));
        let b = leak(broadcast::State::<T>::new(Path::new(path).unwrap()).unwrap());
        let o = leak(origin::State::<4, 8>::new());
        let bp = b.producer().unwrap();
        bp.add(t.handle()).unwrap();
        core::mem::forget(bp);
        o.handle().announce(b.handle()).unwrap();
        (o.handle(), t.producer().unwrap())
    }

    fn local(pool: &'static Pool<'static>, name: &str) -> track::Ref<'static, 'static> {
        leak(track::State::<G>::new(
            pool,
            track::Info::new(name).unwrap(),
        ))
        .handle()
    }

    /// A client session publishing `origin` (if any) and the relay's end of
    /// its connection serving `served`, each on storage of its own that lives
    /// for the rest of the test.
    fn sessions(
        now: Instant,
        origin: Option<origin::Ref<'static, 'static>>,
        served: origin::Ref<'static, 'static>,
    ) -> (
        Session<'static, 'static, 'static, 32>,
        Session<'static, 'static, 'static, 32>,
    ) {
        let cst: &'static mut St = Box::leak(Box::new(St::new()));
        let rst: &'static mut St = Box::leak(Box::new(St::new()));
        let client = Session::new(Side::Client, Config::new(), now, cst, origin).unwrap();
        let relay = Session::new(Side::Server, Config::new(), now, rst, Some(served)).unwrap();
        (client, relay)
    }

    /// Connects a client (publishing `origin`, if any) as relay source `id`.
    fn connect(
        mesh: &mut M,
        router: &'static R,
        queues: &'static Queues<'static, 'static, 'static>,
        id: SourceId,
        origin: Option<origin::Ref<'static, 'static>>,
    ) -> usize {
        let (client, mut relay) = sessions(mesh.now, origin, router.origin());
        relay.set_resolver(Some(leak(resolver(router, id, queues))));
        mesh.connect(Node::new(client), RelayEnd::new(relay, id, router, queues))
    }

    fn live() -> Request {
        Request {
            start: Start::Latest,
            end: End::Open,
            ordered: false,
            priority: 1,
            max_latency: Duration::from_secs(5),
        }
    }

    /// Frames of group `seq` of `t` received whole so far.
    fn frames(t: track::Ref<'_, '_>, seq: u64) -> usize {
        let Some(mut g) = t.group(seq) else {
            return 0;
        };
        let mut n = 0;
        let mut buf = [0u8; 64];
        loop {
            match g.read_frame_header() {
                Ok(group::Next::Ready(_)) => {}
                _ => return n,
            }
            while g.payload_remaining() > 0 {
                match g.read_payload(&mut buf) {
                    Ok(group::Next::Ready(_)) => {}
                    _ => return n,
                }
            }
            n += 1;
        }
    }

    fn closed_with(mesh: &mut M, i: usize, code: StreamCode) -> bool {
        mesh.pair(i).a.saw(
            |e| matches!(e, Ev::SubscriptionClosed { code: Some(c), .. } if *c == code.to_code()),
        )
    }

    fn cam() -> Path<'static> {
        Path::new("cam").unwrap()
    }

    #[test]
    fn a_source_killed_mid_group_is_adopted_and_the_subscriber_goes_on() {
        let (router, queues) = worker();
        let cpool = pool();
        let (first_origin, first) = publication(cpool, "cam");
        let (second_origin, second) = publication(cpool, "cam");
        let sub_track = local(cpool, "video");
        let mut mesh = M::new(router, Duration::from_millis(5));
        let p1 = connect(&mut mesh, router, queues, 0, Some(first_origin));
        let sub = connect(&mut mesh, router, queues, 1, None);
        assert!(mesh.run(10_000, |m| m.router.origin().get(cam()).is_some()));
        mesh.pair(sub)
            .a
            .session
            .subscribe("cam", sub_track, live())
            .unwrap();
        // The source writes group 0 whole and starts group 1.
        let mut g0 = first.create_group(0).unwrap();
        g0.write_frame(0, b"g0f0").unwrap();
        g0.write_frame(1, b"g0f1").unwrap();
        g0.finish().unwrap();
        drop(g0);
        assert!(mesh.run(10_000, |_| frames(sub_track, 0) == 2));
        let mut g1 = first.create_group(1).unwrap();
        g1.write_frame(10, b"g1f0").unwrap();
        assert!(mesh.run(10_000, |_| frames(sub_track, 1) == 1));
        // The source dies in the middle of group 1.
        mesh.kill(p1);
        drop(g1);
        drop(first);
        let killed = mesh.now;
        assert_eq!(router.poll_timeout(), Some(killed.saturating_add(GRACE)));
        // A new source announces the path within the grace period: it adopts
        // the route, and is asked for the track.
        let p2 = connect(&mut mesh, router, queues, 2, Some(second_origin));
        assert!(mesh.run(10_000, |m| m.router.poll_timeout().is_none()));
        assert!(
            mesh.run(10_000, |m| m.pair(p2).a.session.served_tracks().count()
                == 1)
        );
        assert!(mesh.now < killed.saturating_add(GRACE));
        let mut g2 = second.create_group(2).unwrap();
        g2.write_frame(20, b"g2f0").unwrap();
        g2.finish().unwrap();
        assert!(mesh.run(10_000, |_| frames(sub_track, 2) == 1));
        // The subscriber was never told anything went wrong.
        assert!(
            !mesh
                .pair(sub)
                .a
                .saw(|e| matches!(e, Ev::SubscriptionClosed { .. })),
            "the subscriber was cut off"
        );
    }

    #[test]
    fn without_a_new_source_the_subscriber_gets_session_closed_at_the_end_of_the_grace() {
        let (router, queues) = worker();
        let cpool = pool();
        let (origin, source) = publication(cpool, "cam");
        let sub_track = local(cpool, "video");
        let mut mesh = M::new(router, Duration::from_millis(5));
        let p = connect(&mut mesh, router, queues, 0, Some(origin));
        let sub = connect(&mut mesh, router, queues, 1, None);
        assert!(mesh.run(10_000, |m| m.router.routes() == 1));
        mesh.pair(sub)
            .a
            .session
            .subscribe("cam", sub_track, live())
            .unwrap();
        let mut g0 = source.create_group(0).unwrap();
        g0.write_frame(0, b"x").unwrap();
        assert!(mesh.run(10_000, |_| frames(sub_track, 0) == 1));
        mesh.kill(p);
        drop(g0);
        drop(source);
        let killed = mesh.now;
        // Simulated time runs on to the end of the grace period.
        assert!(mesh.run(100_000, |m| {
            m.pair(sub)
                .a
                .saw(|e| matches!(e, Ev::SubscriptionClosed { .. }))
        }));
        assert!(mesh.now >= killed.saturating_add(GRACE));
        assert!(closed_with(&mut mesh, sub, StreamCode::SessionClosed));
        assert_eq!(router.routes(), 0, "the route is gone");
    }

    #[test]
    fn demand_follows_the_subscribers_and_lingers_out_after_the_last() {
        let (router, queues) = worker();
        let cpool = pool();
        let (origin, source) = publication(cpool, "cam");
        let (a, b) = (local(cpool, "video"), local(cpool, "video"));
        let mut mesh = M::new(router, Duration::from_millis(5));
        connect(&mut mesh, router, queues, 0, Some(origin));
        let sa = connect(&mut mesh, router, queues, 1, None);
        let sb = connect(&mut mesh, router, queues, 2, None);
        assert!(mesh.run(10_000, |m| m.router.routes() == 1));
        let src = source.track();
        let high = Request {
            priority: 9,
            ..live()
        };
        let ida = mesh.pair(sa).a.session.subscribe("cam", a, live()).unwrap();
        assert!(mesh.run(10_000, |_| src.demand().is_some_and(|d| d.priority == 1)));
        // A second subscriber asks for more: one upstream subscription, updated.
        let idb = mesh.pair(sb).a.session.subscribe("cam", b, high).unwrap();
        assert!(mesh.run(10_000, |_| src.demand().is_some_and(|d| d.priority == 9)));
        assert_eq!(src.subscribers(), 1, "one upstream subscription for both");
        // It leaves: the demand comes back down.
        mesh.pair(sb).a.session.unsubscribe(idb).unwrap();
        assert!(mesh.run(10_000, |_| src.demand().is_some_and(|d| d.priority == 1)));
        // The last one leaves: the upstream subscription stays for the
        // linger, then is cancelled.
        mesh.pair(sa).a.session.unsubscribe(ida).unwrap();
        let left = mesh.now;
        assert!(mesh.run(100_000, |_| src.subscribers() == 0));
        assert!(mesh.now >= left.saturating_add(LINGER));
    }

    #[test]
    fn a_track_the_source_lacks_is_refused_promptly_and_leaves_nothing() {
        let (router, queues) = worker();
        let cpool = pool();
        let (origin, _source) = publication(cpool, "cam");
        let nope = local(cpool, "nope");
        let mut mesh = M::new(router, Duration::from_millis(5));
        connect(&mut mesh, router, queues, 0, Some(origin));
        let sub = connect(&mut mesh, router, queues, 1, None);
        assert!(mesh.run(10_000, |m| m.router.routes() == 1));
        let asked = mesh.now;
        mesh.pair(sub)
            .a
            .session
            .subscribe("cam", nope, live())
            .unwrap();
        assert!(mesh.run(10_000, |m| {
            m.pair(sub)
                .a
                .saw(|e| matches!(e, Ev::SubscriptionClosed { .. }))
        }));
        assert!(closed_with(&mut mesh, sub, StreamCode::NotFound));
        // A few round trips of 2 x 5 ms, not a timeout.
        assert!(mesh.now <= asked.saturating_add(Duration::from_millis(100)));
        // The relay track left its broadcast and went back to its table.
        let b = router.origin().get(cam()).unwrap();
        assert!(b.track("nope").is_none());
        assert_eq!(router.track_counts().claimed, 0);
    }

    /// A camera's link goes silent without closing (its close is lost), and
    /// the camera reconnects and announces "cam" again: the new session
    /// takes the route over at once, the viewer goes on at its next group
    /// without resubscribing, the old session's late groups are refused,
    /// and when the new session goes, the old one (still alive) serves
    /// again.
    #[test]
    fn a_reconnecting_source_takes_over_from_its_silent_session_at_once() {
        let (router, queues) = worker();
        let cpool = pool();
        let (old_origin, old) = publication(cpool, "cam");
        let (new_origin, new) = publication(cpool, "cam");
        let sub_track = local(cpool, "video");
        let mut mesh = M::new(router, Duration::from_millis(5));
        let pa = connect(&mut mesh, router, queues, 0, Some(old_origin));
        let sub = connect(&mut mesh, router, queues, 1, None);
        assert!(mesh.run(10_000, |m| m.router.origin().get(cam()).is_some()));
        let b = router.origin().get(cam()).unwrap();
        mesh.pair(sub)
            .a
            .session
            .subscribe("cam", sub_track, live())
            .unwrap();
        let mut g0 = old.create_group(0).unwrap();
        g0.write_frame(0, b"g0f0").unwrap();
        g0.finish().unwrap();
        drop(g0);
        assert!(mesh.run(10_000, |_| frames(sub_track, 0) == 1));
        let mut g1 = old.create_group(1).unwrap();
        g1.write_frame(10, b"g1f0").unwrap();
        assert!(mesh.run(10_000, |_| frames(sub_track, 1) == 1));
        let relayed = b.track("video").unwrap();
        // The old link goes silent both ways; the camera writes on into it.
        mesh.pair(pa).ab.held = true;
        mesh.pair(pa).ba.held = true;
        g1.write_frame(11, b"g1f1").unwrap();
        let silent = mesh.now;
        // The camera's new session announces "cam": it takes over at once.
        let pb = connect(&mut mesh, router, queues, 2, Some(new_origin));
        assert!(mesh.run(10_000, |m| m.router.source_of(b) == Some(2)));
        assert_eq!((router.routes(), router.spares()), (1, 1));
        assert!(
            mesh.run(10_000, |m| m.pair(pb).a.session.served_tracks().count()
                == 1)
        );
        // The old session's subscription was let go and forgotten.
        assert_eq!(mesh.pair(pa).b.peer.upstream(), 0);
        let mut g10 = new.create_group(10).unwrap();
        g10.write_frame(100, b"g10f0").unwrap();
        g10.finish().unwrap();
        drop(g10);
        assert!(mesh.run(10_000, |_| frames(sub_track, 10) == 1));
        // Long before any idle timeout: a few round trips.
        assert!(mesh.now <= silent.saturating_add(Duration::from_millis(200)));
        assert!(relayed.same_track(&b.track("video").unwrap()));
        // The old session wakes up: its stuck frame and its late group are
        // refused, the viewer never sees them.
        mesh.pair(pa).ab.held = false;
        mesh.pair(pa).ba.held = false;
        drop(g1);
        let mut g2 = old.create_group(2).unwrap();
        g2.write_frame(20, b"late").unwrap();
        g2.finish().unwrap();
        drop(g2);
        let woke = mesh.now;
        let later = woke.saturating_add(Duration::from_millis(100));
        mesh.run(10_000, |m| m.now >= later);
        assert!(relayed.group(2).is_none(), "a late group was taken");
        assert_eq!(frames(sub_track, 2), 0);
        // Group 1 was cut at the take-over (its readers got the abort); its
        // stuck second frame never arrives.
        assert!(frames(sub_track, 1) < 2, "the stuck frame was taken");
        assert_eq!(router.source_of(b), Some(2));
        // The new session goes: the old one, alive, takes over again.
        mesh.kill(pb);
        drop(new);
        assert_eq!(router.source_of(b), Some(0));
        assert!(router.origin().get(cam()).is_some(), "never unannounced");
        assert_eq!(router.poll_timeout(), None, "nothing waits");
        assert!(mesh.run(10_000, |m| m.pair(pa).b.peer.upstream() == 1));
        let retaken = mesh.now;
        let settled = retaken.saturating_add(Duration::from_millis(50));
        mesh.run(10_000, |m| m.now >= settled);
        let mut g20 = old.create_group(20).unwrap();
        g20.write_frame(200, b"g20f0").unwrap();
        g20.finish().unwrap();
        drop(g20);
        assert!(mesh.run(10_000, |_| frames(sub_track, 20) == 1));
        assert!(
            !mesh
                .pair(sub)
                .a
                .saw(|e| matches!(e, Ev::SubscriptionClosed { .. })),
            "the viewer was cut off"
        );
    }

    #[test]
    fn track_info_is_served_from_the_source() {
        let (router, queues) = worker();
        let cpool = pool();
        let (origin, source) = publication(cpool, "cam");
        source.track().set_info(crate::wire::lite::TrackInfo {
            priority: 60,
            max_age: Duration::from_secs(30),
            timescale: core::num::NonZeroU64::new(1_000_000).unwrap(),
        });
        let sub_track = local(cpool, "video");
        let mut mesh = M::new(router, Duration::from_millis(5));
        connect(&mut mesh, router, queues, 0, Some(origin));
        let sub = connect(&mut mesh, router, queues, 1, None);
        assert!(mesh.run(10_000, |m| m.router.routes() == 1));
        mesh.pair(sub)
            .a
            .session
            .subscribe("cam", sub_track, live())
            .unwrap();
        // The relay's TRACK answer waits for the source's values, then
        // carries them.
        assert!(mesh.run(10_000, |m| {
            m.pair(sub).a.saw(|e| {
                matches!(e, Ev::TrackInfo { info, .. }
                    if info.priority == 60 && info.timescale.get() == 1_000_000)
            })
        }));
    }

    /// Connects the client end of a worker link as relay source `id`: the
    /// client stands in for the other worker, offering `origin` (its local
    /// origin); this worker's side asks for its announcements and mirrors.
    fn connect_link(
        mesh: &mut M,
        router: &'static R,
        queues: &'static Queues<'static, 'static, 'static>,
        id: SourceId,
        origin: origin::Ref<'static, 'static>,
    ) -> usize {
        let (client, mut relay) = sessions(mesh.now, Some(origin), router.local_origin());
        relay.set_resolver(Some(leak(Resolver::new(router, None, queues))));
        let end = RelayEnd::new(relay, id, router, queues).with_kind(PeerKind::Trunk {
            ask_first: false,
            mirror: true,
        });
        mesh.connect(Node::new(client), end)
    }

    /// The two-worker republish race through real sessions: the other
    /// worker's source of "cam" ends just as a viewer's request for it
    /// leaves this worker over the link; the link refuses it as unroutable
    /// and withdraws "cam", then a restarted source announces "cam" there
    /// again. The viewer is not refused: its request waits within the grace
    /// and is served from the new source.
    #[test]
    fn a_request_crossing_a_link_withdrawal_waits_for_the_restarted_source() {
        let (router, queues) = worker();
        let cpool = pool();
        // The other worker's local origin, with the first source's "cam".
        let other = leak(origin::State::<4, 8>::new());
        let first = leak(broadcast::State::<T>::new(cam()).unwrap());
        let first_video = leak(track::State::<G>::new(
            cpool,
            track::Info::new("video").unwrap(),
        ));
        let bp = first.producer().unwrap();
        bp.add(first_video.handle()).unwrap();
        core::mem::forget(bp);
        other.handle().announce(first.handle()).unwrap();
        let sub_track = local(cpool, "video");
        let mut mesh = M::new(router, Duration::from_millis(5));
        connect_link(&mut mesh, router, queues, 0, other.handle());
        let sub = connect(&mut mesh, router, queues, 1, None);
        assert!(mesh.run(10_000, |m| m.router.origin().get(cam()).is_some()));
        mesh.pair(sub)
            .a
            .session
            .subscribe("cam", sub_track, live())
            .unwrap();
        // This worker makes the relay track (its request to the link is on
        // its way) and the first source ends over there at that moment.
        assert!(mesh.run(10_000, |m| m.router.track_counts().claimed == 1));
        let relayed = router.origin().get(cam()).unwrap().track("video").unwrap();
        assert!(other.handle().unannounce(cam()).is_some());
        // The withdrawal and the refusal cross: the route waits for a new
        // source, and so does the viewer's request.
        assert!(mesh.run(10_000, |m| m.router.poll_timeout().is_some()
            && m.router.origin().get(cam()).is_none()));
        let withdrawn = mesh.now;
        // The link's refusal arrives: its subscription lets the track go.
        assert!(mesh.run(10_000, |_| !relayed.has_producer()));
        assert_eq!(relayed.status(), track::Status::Open);
        assert!(
            !mesh
                .pair(sub)
                .a
                .saw(|e| matches!(e, Ev::SubscriptionClosed { .. })),
            "the viewer was refused while the withdrawal crossed the link"
        );
        // The restarted source announces "cam" over there; its first group
        // reaches the viewer, well within the grace.
        let second = leak(broadcast::State::<T>::new(cam()).unwrap());
        let second_video = leak(track::State::<G>::new(
            cpool,
            track::Info::new("video").unwrap(),
        ));
        let bp = second.producer().unwrap();
        bp.add(second_video.handle()).unwrap();
        core::mem::forget(bp);
        other.handle().announce(second.handle()).unwrap();
        assert!(mesh.run(10_000, |m| m.router.poll_timeout().is_none()));
        let p = second_video.producer().unwrap();
        let mut g = p.create_group(0).unwrap();
        g.write_frame(0, b"again").unwrap();
        g.finish().unwrap();
        assert!(mesh.run(10_000, |_| frames(sub_track, 0) == 1));
        assert!(mesh.now < withdrawn.saturating_add(GRACE));
        assert!(
            !mesh
                .pair(sub)
                .a
                .saw(|e| matches!(e, Ev::SubscriptionClosed { .. })),
            "the viewer's subscription ended"
        );
    }

    /// Relays of a cluster in simulated time: each node is a worker (its
    /// router and queues) with a Hop ID; peer links are sessions whose two
    /// ends are relay ends of two nodes, and clients are wired to one node.
    mod cluster {
        use super::*;
        use crate::model::hops::HopList;

        type End = RelayEnd<'static, 'static, 'static, 'static, T, G>;
        type PeerLink = Pair<End, End>;
        type ClientLink = Pair<Node<'static, 'static, 'static>, End>;

        /// Hop ID of node `n`.
        fn hop(n: usize) -> u64 {
            0xA0 + n as u64
        }

        /// Node `n`'s Hop ID in `net` (a second worker of a node shares it).
        fn hop_of(net: &Net, n: usize) -> u64 {
            net.hops[n]
        }

        struct Net {
            now: Instant,
            nodes: Vec<(&'static R, &'static Queues<'static, 'static, 'static>)>,
            /// Source ids given out per node (the queue index).
            next_id: Vec<SourceId>,
            /// Peer links, with the nodes at their ends.
            links: Vec<(usize, usize, Option<PeerLink>)>,
            clients: Vec<(usize, Option<ClientLink>)>,
            max_hops: Vec<usize>,
            /// Each node's Hop ID (workers of one node share one).
            hops: Vec<u64>,
        }

        impl Net {
            fn new(n: usize) -> Self {
                Net {
                    now: Instant::ZERO,
                    nodes: (0..n).map(|_| worker()).collect(),
                    next_id: std::vec![0; n],
                    links: Vec::new(),
                    clients: Vec::new(),
                    max_hops: std::vec![crate::wire::lite::MAX_HOPS; n],
                    hops: (0..n).map(hop).collect(),
                }
            }

            /// Adds a second worker to node `n` (same Hop ID); returns its
            /// index among the nodes.
            fn add_worker(&mut self, n: usize) -> usize {
                self.nodes.push(worker());
                self.next_id.push(0);
                self.max_hops.push(self.max_hops[n]);
                self.hops.push(self.hops[n]);
                self.nodes.len() - 1
            }

            /// Links workers `a` (dialing) and `b` of one node as the relay
            /// does: Hop ID 0, each offering its own sources (its local
            /// origin), mirroring.
            fn worker_link(&mut self, a: usize, b: usize) -> usize {
                let mut ends = Vec::new();
                for (n, side) in [(a, Side::Client), (b, Side::Server)] {
                    let (router, queues) = self.nodes[n];
                    let id = self.id(n);
                    let st: &'static mut St = Box::leak(Box::new(St::new()));
                    let mut session = Session::new(
                        side,
                        Config::new(),
                        self.now,
                        st,
                        Some(router.local_origin()),
                    )
                    .unwrap();
                    session.set_resolver(Some(leak(Resolver::new(router, None, queues))));
                    let kind = PeerKind::Trunk {
                        ask_first: side == Side::Client,
                        mirror: true,
                    };
                    ends.push(RelayEnd::new(session, id, router, queues).with_kind(kind));
                }
                let eb = ends.pop().unwrap();
                let ea = ends.pop().unwrap();
                let mut pair = Pair::new(ea, eb);
                pair.now = self.now;
                pair.ab.latency = Duration::from_millis(1);
                pair.ba.latency = Duration::from_millis(1);
                self.links.push((a, b, Some(pair)));
                self.links.len() - 1
            }

            fn router(&self, n: usize) -> &'static R {
                self.nodes[n].0
            }

            fn id(&mut self, n: usize) -> SourceId {
                let id = self.next_id[n];
                self.next_id[n] += 1;
                id
            }

            /// The relay end of a session on node `n` (Hop ID set).
            fn end(&mut self, n: usize, side: Side) -> (End, SourceId) {
                let (router, queues) = self.nodes[n];
                let id = self.id(n);
                let st: &'static mut St = Box::leak(Box::new(St::new()));
                let config = Config {
                    hop: hop_of(self, n),
                    ..Config::new()
                };
                let mut session =
                    Session::new(side, config, self.now, st, Some(router.origin())).unwrap();
                session.set_resolver(Some(leak(Resolver::new(router, None, queues))));
                let end = RelayEnd::new(session, id, router, queues).with_cluster(
                    side == Side::Client,
                    hop_of(self, n),
                    self.max_hops[n],
                );
                (end, id)
            }

            /// Node `a` dials node `b`; returns the link's index.
            fn peer(&mut self, a: usize, b: usize) -> usize {
                let (ea, _) = self.end(a, Side::Client);
                let (eb, _) = self.end(b, Side::Server);
                let mut pair = Pair::new(ea, eb);
                pair.now = self.now;
                pair.ab.latency = Duration::from_millis(5);
                pair.ba.latency = Duration::from_millis(5);
                self.links.push((a, b, Some(pair)));
                self.links.len() - 1
            }

            /// A client of node `n` with Hop ID `client_hop`, publishing
            /// `origin` if any; returns its index.
            fn client(
                &mut self,
                n: usize,
                client_hop: u64,
                origin: Option<origin::Ref<'static, 'static>>,
            ) -> usize {
                let (router, queues) = self.nodes[n];
                let id = self.id(n);
                let cst: &'static mut St = Box::leak(Box::new(St::new()));
                let rst: &'static mut St = Box::leak(Box::new(St::new()));
                let config = Config {
                    hop: client_hop,
                    ..Config::new()
                };
                let client = Session::new(Side::Client, config, self.now, cst, origin).unwrap();
                let rconfig = Config {
                    hop: hop_of(self, n),
                    ..Config::new()
                };
                let mut relay =
                    Session::new(Side::Server, rconfig, self.now, rst, Some(router.origin()))
                        .unwrap();
                relay.set_resolver(Some(leak(resolver(router, id, queues))));
                let end = RelayEnd::new(relay, id, router, queues).with_hops(hop_of(self, n));
                let mut pair = Pair::new(Node::new(client), end);
                pair.now = self.now;
                pair.ab.latency = Duration::from_millis(5);
                pair.ba.latency = Duration::from_millis(5);
                self.clients.push((n, Some(pair)));
                self.clients.len() - 1
            }

            /// Cuts peer link `i`: both nodes lose the other as a source.
            fn cut(&mut self, i: usize) {
                if let Some(mut p) = self.links[i].2.take() {
                    p.a.close(self.now);
                    p.b.close(self.now);
                }
            }

            fn link(&mut self, i: usize) -> &mut PeerLink {
                self.links[i].2.as_mut().expect("link cut")
            }

            fn viewer(&mut self, i: usize) -> &mut Node<'static, 'static, 'static> {
                &mut self.clients[i].1.as_mut().expect("client gone").a
            }

            /// ANNOUNCEs (Active or Ended) every relay end has taken in.
            fn announcements(&self) -> usize {
                let count = |e: &End| {
                    e.node
                        .events
                        .iter()
                        .filter(|e| matches!(e, Ev::Announced { .. } | Ev::Unannounced { .. }))
                        .count()
                };
                let links = self
                    .links
                    .iter()
                    .filter_map(|l| l.2.as_ref())
                    .map(|p| count(&p.a) + count(&p.b));
                let clients = self
                    .clients
                    .iter()
                    .filter_map(|c| c.1.as_ref())
                    .map(|p| count(&p.b));
                links.chain(clients).sum()
            }

            /// The hop list node `n` routes `cam` by, if it routes it.
            fn route(&self, n: usize) -> Option<std::vec::Vec<u64>> {
                let b = self.router(n).origin().get(cam())?;
                Some(b.hops().as_slice().to_vec())
            }

            fn run(&mut self, max: usize, until: impl FnMut(&mut Self) -> bool) -> bool {
                run_until(self, max, until)
            }

            /// Runs `d` of simulated time.
            fn settle(&mut self, d: Duration) {
                let end = self.now.saturating_add(d);
                self.run(1_000_000, |net| net.now >= end);
            }
        }

        impl Stepped for Net {
            fn step(&mut self) -> bool {
                let now = self.now;
                let mut progress = false;
                for p in self.links.iter_mut().filter_map(|l| l.2.as_mut()) {
                    p.now = now;
                    progress |= p.step();
                }
                for p in self.clients.iter_mut().filter_map(|c| c.1.as_mut()) {
                    p.now = now;
                    progress |= p.step();
                }
                for (r, _) in &self.nodes {
                    if r.poll_timeout().is_some_and(|t| t <= now) {
                        r.handle_timeout(now);
                        progress = true;
                    }
                }
                progress
            }
            fn next_time(&self) -> Option<Instant> {
                let links = self.links.iter().filter_map(|l| l.2.as_ref());
                let clients = self.clients.iter().filter_map(|c| c.1.as_ref());
                links
                    .filter_map(|p| p.next_time())
                    .chain(clients.filter_map(|p| p.next_time()))
                    .chain(self.nodes.iter().filter_map(|(r, _)| r.poll_timeout()))
                    .min()
            }
            fn clock(&mut self) -> &mut Instant {
                &mut self.now
            }
        }

        const PUB: u64 = 0x77;

        /// A publisher of "cam" (Hop ID `PUB`) on node 0 of `net`.
        fn publish(net: &mut Net, p: u64) -> track::Producer<'static, 'static> {
            let (o, t) = publication(pool(), "cam");
            net.client(0, p, Some(o));
            t
        }

        fn group(t: &track::Producer<'static, 'static>, seq: u64) {
            let mut g = t.create_group(seq).unwrap();
            g.write_frame(seq, b"frame").unwrap();
            g.finish().unwrap();
        }

        /// Client `v` subscribes to "cam"'s video into `sub` once it is set up.
        fn watch(net: &mut Net, v: usize, sub: track::Ref<'static, 'static>) {
            assert!(net.run(100_000, |net| net.viewer(v).session.is_established()));
            net.viewer(v).session.subscribe("cam", sub, live()).unwrap();
        }

        fn cut_off(net: &mut Net, v: usize) -> bool {
            net.viewer(v)
                .saw(|e| matches!(e, Ev::SubscriptionClosed { .. }))
        }

        /// A triangle and a ring of five: every node learns the shortest
        /// route, announcements stop once settled (no loop goes round), and
        /// the count stays flat however long the cluster runs.
        #[test]
        fn loops_in_a_triangle_and_a_ring_settle_and_stay_flat() {
            for (n, edges) in [
                (3, &[(0, 1), (1, 2), (2, 0)][..]),
                (5, &[(0, 1), (1, 2), (2, 3), (3, 4), (4, 0)][..]),
            ] {
                let mut net = Net::new(n);
                let _t = publish(&mut net, PUB);
                for &(a, b) in edges {
                    net.peer(a, b);
                }
                assert!(net.run(100_000, |net| (0..n).all(|i| net.route(i).is_some())));
                net.settle(Duration::from_secs(1));
                let settled = net.announcements();
                net.settle(Duration::from_secs(60));
                assert_eq!(net.announcements(), settled, "announcements went on");
                // Each ANNOUNCE crossed each link a bounded number of times.
                assert!(settled <= 4 * edges.len() + 2, "{settled} announcements");
                // The node next to the publisher routes it directly; the
                // others by a shortest path.
                assert_eq!(net.route(0), Some(std::vec![PUB]));
                for i in 1..n {
                    let dist = i.min(n - i);
                    let r = net.route(i).unwrap();
                    assert_eq!(r.len(), dist + 1, "node {i}: {r:?}");
                    assert!(!r.contains(&hop(i)), "node {i} routes through itself");
                    assert_eq!(r[0], PUB);
                }
            }
        }

        /// A square 0-1-2-3: node 2 hears "cam" by 1 and by 3, two routes of
        /// equal length; it takes the one with the lower tie-break key,
        /// whichever arrives first.
        #[test]
        fn equal_routes_are_chosen_by_the_shared_hash_whatever_the_order() {
            let via1 = HopList::from_slice(&[PUB, hop(0), hop(1)]).unwrap();
            let via3 = HopList::from_slice(&[PUB, hop(0), hop(3)]).unwrap();
            let want = if via1.tie_key("cam") < via3.tie_key("cam") {
                via1
            } else {
                via3
            };
            for order in [
                [(0, 1), (1, 2), (0, 3), (3, 2)],
                [(0, 3), (3, 2), (0, 1), (1, 2)],
            ] {
                let mut net = Net::new(4);
                let _t = publish(&mut net, PUB);
                let first = order[..2].to_vec();
                for (a, b) in first {
                    net.peer(a, b);
                }
                assert!(net.run(100_000, |net| net.route(2).is_some()));
                for &(a, b) in &order[2..] {
                    net.peer(a, b);
                }
                net.settle(Duration::from_secs(2));
                assert_eq!(net.route(2).as_deref(), Some(want.as_slice()));
                assert_eq!(net.router(2).spares(), 1, "the other route waits");
            }
        }

        /// A square 0-1-2-3 with a viewer on node 2. The first link of the
        /// route node 2 took (0-1 or 0-3) is cut: the node in the middle
        /// withdraws "cam", node 2 moves the live subscription to the
        /// route by 3 at once, and the viewer goes on at the next group
        /// without subscribing again.
        #[test]
        fn a_withdrawal_moves_a_live_subscription_to_the_next_route() {
            let mut net = Net::new(4);
            let t = publish(&mut net, PUB);
            let l01 = net.peer(0, 1);
            net.peer(1, 2);
            assert!(net.run(100_000, |net| net.route(2).is_some()));
            net.peer(0, 3);
            net.peer(3, 2);
            net.settle(Duration::from_secs(1));
            let via1 = std::vec![PUB, hop(0), hop(1)];
            assert!(net.route(2).is_some());
            let v = net.client(2, 0, None);
            let sub = local(pool(), "video");
            watch(&mut net, v, sub);
            group(&t, 0);
            assert!(net.run(100_000, |_| frames(sub, 0) == 1));
            let by1 = net.route(2) == Some(via1);
            let cut = if by1 {
                l01
            } else {
                // The route is by 3: cut 0-3 instead.
                net.links.iter().position(|l| (l.0, l.1) == (0, 3)).unwrap()
            };
            let before = net.route(2).unwrap();
            net.cut(cut);
            assert!(net.run(100_000, |net| {
                net.route(2).is_some_and(|r| r != before && r.len() == 3)
            }));
            let moved = net.now;
            group(&t, 1);
            assert!(net.run(100_000, |_| frames(sub, 1) == 1));
            assert!(net.now < moved.saturating_add(Duration::from_secs(1)));
            assert!(!cut_off(&mut net, v), "the viewer was cut off");
            assert_eq!(net.router(2).poll_timeout(), None, "no grace ran");
        }

        /// A triangle, then the link 0-2 is cut: node 2 takes the route by 1,
        /// and node 1 forgets the route by 2 it held as a spare (node 2's
        /// new route crosses 1, so it is withdrawn there rather than
        /// restarted), so no two nodes route through each other.
        #[test]
        fn a_route_that_turns_into_a_loop_is_withdrawn_from_the_node_it_crosses() {
            let mut net = Net::new(3);
            let _t = publish(&mut net, PUB);
            net.peer(0, 1);
            net.peer(1, 2);
            let l02 = net.peer(0, 2);
            assert!(net.run(100_000, |net| net.route(2) == Some(std::vec![PUB, hop(0)])));
            net.settle(Duration::from_secs(1));
            assert_eq!(net.router(1).spares(), 1, "node 1 holds the route by 2");
            net.cut(l02);
            assert!(net.run(100_000, |net| net.route(2)
                == Some(std::vec![PUB, hop(0), hop(1)])));
            net.settle(Duration::from_secs(1));
            assert_eq!(net.route(1), Some(std::vec![PUB, hop(0)]));
            assert_eq!(net.router(1).spares(), 0, "the looping route was kept");
            let settled = net.announcements();
            net.settle(Duration::from_secs(30));
            assert_eq!(net.announcements(), settled);
        }

        /// Node 1 has two workers, linked as the relay links them; node 0
        /// (the publisher's) peers with the first, node 2 with the second.
        /// The route crosses the workers' link with its list unchanged (one
        /// node: no Hop ID added, no loop check between them), node 2 sees
        /// node 1 once in it, node 0 never takes its own route back, and a
        /// viewer on node 2 gets the frames.
        #[test]
        fn workers_of_one_node_pass_routes_on_unchanged() {
            let mut net = Net::new(3);
            let w = net.add_worker(1);
            let t = publish(&mut net, PUB);
            net.peer(0, 1);
            net.worker_link(1, w);
            net.peer(w, 2);
            assert!(net.run(100_000, |net| net.route(2).is_some()));
            net.settle(Duration::from_secs(1));
            assert_eq!(net.route(1), Some(std::vec![PUB, hop(0)]));
            assert_eq!(net.route(w), Some(std::vec![PUB, hop(0)]));
            assert_eq!(net.route(2), Some(std::vec![PUB, hop(0), hop(1)]));
            assert_eq!(net.router(0).routes() + net.router(0).spares(), 1);
            let v = net.client(2, 0, None);
            let sub = local(pool(), "video");
            watch(&mut net, v, sub);
            group(&t, 0);
            assert!(net.run(100_000, |_| frames(sub, 0) == 1));
            let settled = net.announcements();
            net.settle(Duration::from_secs(30));
            assert_eq!(net.announcements(), settled);
        }

        /// Node 1's two workers hold routes of different length: its first
        /// worker has one by node 3 ([PUB, 0, 3]) which its second worker
        /// takes over the link; then the second worker peers with node 0
        /// itself. Its own shorter route serves there, and the first worker
        /// moves to it over the link, its own source standing by: the whole
        /// node ends on the shortest route, with one upstream subscription.
        #[test]
        fn the_workers_of_a_node_agree_on_the_shorter_route() {
            let mut net = Net::new(4);
            let w = net.add_worker(1);
            let t = publish(&mut net, PUB);
            net.peer(0, 3);
            net.peer(3, 1);
            net.worker_link(1, w);
            assert!(net.run(100_000, |net| net.route(w).is_some()));
            net.settle(Duration::from_secs(1));
            assert_eq!(net.route(1), Some(std::vec![PUB, hop(0), hop(3)]));
            assert_eq!(net.route(w), Some(std::vec![PUB, hop(0), hop(3)]));
            let v = net.client(1, 0, None);
            let sub = local(pool(), "video");
            watch(&mut net, v, sub);
            group(&t, 0);
            assert!(net.run(100_000, |_| frames(sub, 0) == 1));
            net.peer(0, w);
            assert!(net.run(100_000, |net| net.route(1) == Some(std::vec![PUB, hop(0)])));
            net.settle(Duration::from_secs(1));
            assert_eq!(net.route(w), Some(std::vec![PUB, hop(0)]));
            group(&t, 1);
            assert!(net.run(100_000, |_| frames(sub, 1) == 1));
            assert!(!cut_off(&mut net, v), "the viewer was cut off");
            let settled = net.announcements();
            net.settle(Duration::from_secs(30));
            assert_eq!(net.announcements(), settled);
            // Node 1 holds one upstream subscription, from its second worker
            // to node 0; the one through node 3 lingered out (node 0 serves
            // "video" to one subscription, node 3 serves none).
            let served = |n: usize| {
                let b = net.router(n).origin().get(cam()).unwrap();
                b.track("video").map_or(0, |t| t.subscribers())
            };
            assert_eq!(served(0), 1, "node 0 serves one subscription");
            assert_eq!(served(3), 0, "node 3 serves none");
            assert_eq!(
                served(w),
                1,
                "the second worker serves the link to the first"
            );
        }

        /// A line 0-1-2, then a link 0-2: node 2's route by 1 is replaced by
        /// the shorter one, and its viewer goes on.
        #[test]
        fn a_shorter_route_appearing_replaces_the_route() {
            let mut net = Net::new(3);
            let t = publish(&mut net, PUB);
            net.peer(0, 1);
            net.peer(1, 2);
            assert!(net.run(100_000, |net| net.route(2).is_some()));
            assert_eq!(net.route(2), Some(std::vec![PUB, hop(0), hop(1)]));
            let v = net.client(2, 0, None);
            let sub = local(pool(), "video");
            watch(&mut net, v, sub);
            group(&t, 0);
            assert!(net.run(100_000, |_| frames(sub, 0) == 1));
            net.peer(2, 0);
            assert!(net.run(100_000, |net| net.route(2) == Some(std::vec![PUB, hop(0)])));
            net.settle(Duration::from_millis(100));
            group(&t, 1);
            assert!(net.run(100_000, |_| frames(sub, 1) == 1));
            assert!(!cut_off(&mut net, v));
            // One upstream subscription per track on node 2, on the new route.
            assert_eq!(net.router(2).track_counts().claimed, 1);
        }

        /// A line 0-1-2-3 where node 3 takes routes of at most 3 hops: the
        /// route [PUB, 0, 1, 2] is dropped there.
        #[test]
        fn a_route_past_the_hop_limit_is_dropped() {
            let mut net = Net::new(4);
            net.max_hops[3] = 3;
            let _t = publish(&mut net, PUB);
            net.peer(0, 1);
            net.peer(1, 2);
            net.peer(2, 3);
            assert!(net.run(100_000, |net| net.route(2).is_some()));
            net.settle(Duration::from_secs(1));
            assert_eq!(net.route(3), None);
            assert_eq!(net.router(3).routes() + net.router(3).spares(), 0);
        }

        /// A line 0-1-2: node 1 asking node 2 for "cam", whose route at 2
        /// crosses 1, is refused UNROUTABLE (split horizon).
        #[test]
        fn a_peer_asking_for_a_route_through_itself_is_refused_unroutable() {
            let mut net = Net::new(3);
            let _t = publish(&mut net, PUB);
            net.peer(0, 1);
            let l12 = net.peer(1, 2);
            assert!(net.run(100_000, |net| net.route(2).is_some()));
            let sub = local(pool(), "video");
            // Node 1's end of the link asks node 2 directly.
            net.link(l12)
                .a
                .node
                .session
                .subscribe("cam", sub, live())
                .unwrap();
            assert!(
                net.run(100_000, |net| net.link(l12).a.node.saw(|e| matches!(
                    e,
                    Ev::SubscriptionClosed { code: Some(c), .. }
                        if *c == StreamCode::Unroutable.to_code()
                )))
            );
        }

        /// A publisher without a Hop ID: node 0 stamps it, the route is
        /// anonymous on every node, and a viewer two hops away gets its
        /// frames. A named publisher of the same path then wins.
        #[test]
        fn an_anonymous_publisher_is_stamped_and_served() {
            let mut net = Net::new(3);
            let t = publish(&mut net, 0);
            net.peer(0, 1);
            net.peer(1, 2);
            assert!(net.run(100_000, |net| net.route(2).is_some()));
            let r = net.route(2).unwrap();
            assert_eq!(r.len(), 4, "{r:?}");
            assert_eq!(r[1], 0, "the unknown publisher stays marked");
            assert_ne!(r[0], 0, "stamped");
            let v = net.client(2, 0, None);
            let sub = local(pool(), "video");
            watch(&mut net, v, sub);
            group(&t, 0);
            assert!(net.run(100_000, |_| frames(sub, 0) == 1));
            // A named publisher of "cam" on node 2 itself ranks first there.
            let (o, _named) = publication(pool(), "cam");
            net.client(2, PUB, Some(o));
            assert!(net.run(100_000, |net| net.route(2) == Some(std::vec![PUB])));
        }

        /// The receipt checks: a route naming this node, one naming its
        /// publisher twice, and one past the limit are refused with their
        /// reason; a worker link's list is taken as it is.
        #[test]
        fn receipt_refuses_own_id_reflection_and_long_routes() {
            use crate::relay::routes::AnnounceRefused;
            use crate::wire::lite::Hops;
            let p = Peer::<'static, 'static, Q>::new(1, PeerKind::Cluster { ask_first: true })
                .with_hops(0xA0, 4);
            assert_eq!(
                p.route(Hops::new(&[5, 0xA0]), 6).unwrap_err(),
                AnnounceRefused::Loop
            );
            assert_eq!(
                p.route(Hops::new(&[5, 6]), 6).unwrap_err(),
                AnnounceRefused::Loop
            );
            assert_eq!(
                p.route(Hops::new(&[5, 6, 7, 8]), 9).unwrap_err(),
                AnnounceRefused::Hops
            );
            let ok = p.route(Hops::new(&[5, 6, 7]), 9).unwrap();
            assert_eq!(ok.hops.as_slice(), [5, 6, 7, 9]);
            assert!(ok.peer);
            let link = Peer::<'static, 'static, Q>::new(
                2,
                PeerKind::Trunk {
                    ask_first: false,
                    mirror: true,
                },
            )
            .with_hops(0xA0, 4);
            let same = link.route(Hops::new(&[5, 0xA0]), 0).unwrap();
            assert_eq!(same.hops.as_slice(), [5, 0xA0], "a link passes it on");
            // A client's own broadcast is published here; one it passes on
            // (a relay dialing as a client) is forwarded.
            let client = Peer::<'static, 'static, Q>::new(3, PeerKind::Client).with_hops(0xA0, 32);
            assert!(!client.route(Hops::EMPTY, 9).unwrap().peer);
            assert!(client.route(Hops::new(&[5]), 9).unwrap().peer);
        }
    }
}
