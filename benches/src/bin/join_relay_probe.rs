//! A probe for instruction counting of one subscriber join + leave through
//! the relay's own path: skiff-core's [`Router`] with a relay worker's
//! tables, a relay-side [`Session`] driven by a [`Peer`] for every client
//! connection, and real moq-lite bytes from client-side sessions, all in
//! memory (no sockets, no runtime). `benches/callgrind-join-relay.sh` runs
//! it under callgrind at two join counts and divides the difference.
//!
//! Usage: `join_relay_probe AUDIENCE JOINS [PER_SESSION [FRAMES]]`
//!
//! Set-up, not measured:
//!
//! * a relay worker's tables as `skiff_relay::relay::Relay::new` makes them,
//!   with the same constructor ([`WorkerTables::new`]: a cache pool, the
//!   origin and local origin, broadcast and track tables, the router's
//!   storage and limits) from [`RelayConfig::default`] with a cache of
//!   [`CACHE_BYTES`], and every
//!   client session with [`RelayConfig::session_config`],
//!   [`SessionStorage`] tables and a [`Resolver`] hooked to the router;
//! * a publishing client announcing broadcast `cam` with track `video`; the
//!   relay subscribes to it upstream and fills its relay track with three
//!   finished groups and a live fourth one holding `FRAMES` frames
//!   (default 1) of 1,000 bytes, whose writer stays open;
//! * an audience of `AUDIENCE` subscribers of `cam`/`video`, on client
//!   connections of `PER_SESSION` subscriptions each (default 16: a client
//!   session of the relay serves 16 subscriptions with 16 group streams at
//!   once, the `SERVE` and `OUT` of [`SessionStorage`], and advertises 20
//!   bidirectional streams, `STREAMS / 4`, room for the 16 SUBSCRIBE
//!   streams each subscription keeps open and TRACK requests under way;
//!   a 17th subscription is refused); each relay-side session has sent its
//!   subscribers the live group and keeps those group streams open; the
//!   audience's clients are then dropped and their relay sessions stay;
//! * one more client connection, the joiner, with SETUP done.
//!
//! Measured, `JOINS` times: the joiner subscribes (TRACK, then SUBSCRIBE
//! once TRACK_INFO came back), the relay-side session answers and writes
//! the live group's stream, then the joiner unsubscribes (FIN on its
//! SUBSCRIBE stream) and the relay-side session ends the subscription. The
//! relay side runs as `skiff_monoio::session_driver::drive` runs a session:
//! a pass per wake-up (input, then the core's [`Session::pass`]: due
//! timers, events to the [`Peer`], its `is_idle` and `act`; then
//! [`Session::transmit_to`] gathering until it has nothing more), and after a pass that did something one more pass. The driver's
//! wake-ups of other sessions ([`skiff_monoio::notify`]) and its metrics
//! are not part of it.
//!
//! The relay side's work is in [`relay_pass`] and [`relay_release`] (the
//! script collects callgrind's counts inside those two only, so the
//! client's side of the wire is not counted). The heap allocations of the
//! whole join loop, both sides, are counted by the global allocator and
//! printed: `joins=<n> allocations=<count> bytes=<bytes>`.

use std::hint::black_box;
use std::process::ExitCode;

use skiff_benches::counting::{self, Counting};
use skiff_core::conn::Connection;
use skiff_core::model::path::Path;
use skiff_core::model::{broadcast, origin, track};
use skiff_core::pool::Slice;
use skiff_core::relay::{Peer, PeerKind, Resolver, SourceId, SubscribeQueue, Upstreams};
use skiff_core::session::{
    Config, Error as SessionError, Event, Gather, Handler, Out, Session, Storage, SubscriptionId,
};
use skiff_core::time::Instant;
use skiff_core::window::Request;
use skiff_core::wire::lite::Role;
use skiff_core::wire::qmux::Side;
use skiff_monoio::session_driver::{STREAMS, SessionStorage};
use skiff_monoio::tables::{GROUPS, Keep, TRACKS};
use skiff_relay::config::RelayConfig;
use skiff_relay::worker_tables::{WorkerRouter, WorkerTables};
use skiff_testkit::client::process_pool as leak_pool;

#[global_allocator]
static ALLOC: Counting = Counting;

/// Upstream subscriptions a client session's peer holds (the relay's
/// `CLIENT_UPSTREAM`), and the length of its SUBSCRIBE queue.
const CLIENT_UPSTREAM: usize = 64;
/// Cache bytes of the relay worker's pool (as `benches/callgrind-relay.sh`
/// runs the relay).
const CACHE_BYTES: u64 = 64 << 20;
/// Room offered to one `poll_transmit_gather` call (the driver's
/// `TRANSMIT_CHUNK`: two full QMux records).
const TRANSMIT_CHUNK: usize = 2 * 16390;
/// Payload ranges one send holds (the driver's `GATHER_RANGES`).
const GATHER_RANGES: usize = 32;
/// Subscriptions one client connection holds at once with the relay's
/// default session tables: a relay session serves 16 subscriptions with 16
/// group streams at once (the `SERVE` and `OUT` of [`SessionStorage`]).
const DEFAULT_PER_SESSION: usize = 16;
/// Bytes of one frame of the publisher's track.
const FRAME_BYTES: usize = 1000;
/// Sequence number of the live group (three finished groups come first).
const LIVE_GROUP: u64 = 3;
/// Frames of each finished group.
const FINISHED_FRAMES: usize = 30;

/// A relay session's media lives as long as the worker.
type RelaySession = Session<'static, 'static, 'static, STREAMS>;
/// A client session of the probe (the relay's client tables serve it).
type ClientSession<'s> = Session<'s, 'static, 'static, STREAMS>;
/// A session's upstream SUBSCRIBE queue.
type Queue = SubscribeQueue<'static, 'static, CLIENT_UPSTREAM>;

/// `x`, for the rest of the process.
fn leak<X>(x: X) -> &'static X {
    Box::leak(Box::new(x))
}

/// `n` values of `make()`, for the rest of the process.
fn leak_slice<X>(n: usize, make: impl FnMut() -> X) -> &'static [X] {
    Box::leak(
        std::iter::repeat_with(make)
            .take(n)
            .collect::<Vec<_>>()
            .into_boxed_slice(),
    )
}

/// The upstream SUBSCRIBE queue of every relay session, by source id (the
/// index): where the router's requests for a source go.
struct Queues {
    queues: &'static [Queue],
}

impl Upstreams<'static, 'static> for Queues {
    fn subscribe(
        &self,
        owner: SourceId,
        b: broadcast::Ref<'static, 'static>,
        t: track::Ref<'static, 'static>,
    ) {
        if let Some(q) = self.queues.get(owner as usize) {
            q.push(b, t);
        }
    }
}

/// The relay worker: its router and queues, and the configuration of its
/// client sessions.
struct Worker {
    router: &'static WorkerRouter,
    queues: &'static Queues,
    config: Config<'static>,
}

impl Worker {
    /// A worker with the default relay configuration's tables and room for
    /// `sessions` client sessions.
    fn new(sessions: usize) -> Worker {
        let relay = RelayConfig {
            cache_bytes: CACHE_BYTES,
            ..RelayConfig::default()
        };
        let mut keep = Keep::new();
        keep.keep_forever();
        // SAFETY: the keep never frees (`keep_forever`): the tables live for
        // the rest of the process, as the probe's sessions need.
        let router: &'static WorkerRouter =
            leak(unsafe { WorkerTables::new(&relay, &mut keep) }.router);
        let queues = leak(Queues {
            queues: leak_slice(sessions, SubscribeQueue::new),
        });
        let config = relay.session_config(0x5c1f_0000_0001);
        Worker {
            router,
            queues,
            config,
        }
    }
}

/// The relay side of one client connection: its session and the core's
/// [`Peer`] for it, as `RelayConn` holds them in the monoio relay.
struct RelaySide {
    session: RelaySession,
    handler: RelayHandler,
}

impl RelaySide {
    /// Accepts client connection `id` at `now`.
    fn accept(worker: &Worker, id: SourceId, now: Instant) -> RelaySide {
        let storage: &'static mut SessionStorage = Box::leak(Box::new(SessionStorage::new()));
        let mut session = Session::new(
            Side::Server,
            worker.config,
            now,
            storage,
            Some(worker.router.origin()),
        )
        .expect("relay session config");
        let resolver = leak(Resolver::new(worker.router, Some(id), worker.queues));
        session.set_resolver(Some(resolver));
        RelaySide {
            session,
            handler: RelayHandler {
                peer: Peer::new(id, PeerKind::Client),
                queue: &worker.queues.queues[id as usize],
                router: worker.router,
                queues: worker.queues,
            },
        }
    }
}

/// Payload ranges of one send, kept in order with their position in the
/// send's head bytes; sized once, so pushing never allocates.
struct Ranges {
    ranges: Vec<(usize, Slice<'static>)>,
    /// Head bytes written before the current `poll_transmit_gather` call.
    base: usize,
}

impl Gather<'static> for Ranges {
    fn room(&self) -> usize {
        GATHER_RANGES - self.ranges.len()
    }

    fn push(&mut self, at: usize, slice: Slice<'static>) {
        self.ranges.push((self.base + at, slice));
    }
}

/// What the relay side wrote in one pass, the way the driver's staging
/// buffer holds it: head bytes (records, control bytes) and the payload
/// ranges that go between them.
struct Send {
    head: Vec<u8>,
    len: usize,
    ranges: Ranges,
}

impl Send {
    fn new() -> Send {
        Send {
            head: vec![0; 8 * TRANSMIT_CHUNK],
            len: 0,
            ranges: Ranges {
                ranges: Vec::with_capacity(GATHER_RANGES),
                base: 0,
            },
        }
    }
}

/// What one relay pass did.
#[derive(Debug, Clone, Copy)]
struct Pass {
    /// Input bytes the session took.
    consumed: usize,
    /// Whether it took input, reported events or wrote anything.
    progress: bool,
}

/// The relay side's handler of a pass: the core's [`Peer`] for the session,
/// as the relay's connection handler is.
struct RelayHandler {
    peer: Peer<'static, 'static, CLIENT_UPSTREAM>,
    queue: &'static Queue,
    router: &'static WorkerRouter,
    queues: &'static Queues,
}

impl Handler<'static, 'static, 'static, STREAMS, Connection<STREAMS>> for RelayHandler {
    fn on_event(&mut self, now: Instant, event: &Event<'_>) {
        let _ = self.peer.on_event(event, self.router, now, self.queues);
    }

    fn act(&mut self, now: Instant, session: &mut RelaySession) {
        black_box(self.peer.is_idle(self.queue, || now));
        black_box(self.peer.act(session, self.router, self.queue, || now));
    }
}

impl Out<'static> for Send {
    fn must_flush(&self) -> bool {
        self.head.len() - self.len < TRANSMIT_CHUNK || self.ranges.room() == 0
    }

    fn write<F>(&mut self, write: F) -> (usize, usize)
    where
        F: FnOnce(&mut [u8], Option<&mut dyn Gather<'static>>) -> usize,
    {
        self.ranges.base = self.len;
        let room = &mut self.head[self.len..];
        (room.len(), write(room, Some(&mut self.ranges)))
    }

    fn commit(&mut self, room: usize, n: usize) -> bool {
        self.len += n;
        room - n < TRANSMIT_CHUNK || self.ranges.room() == 0
    }
}

/// One pass of the relay's session driver over `relay` at `now`: the input
/// waiting, then the core's pass (due timers, the session's events to the
/// peer, the peer's turn), then everything the session has to send,
/// gathered into `send`.
#[inline(never)]
fn relay_pass(relay: &mut RelaySide, now: Instant, input: &[u8], send: &mut Send) -> Pass {
    let mut progress = false;
    let mut consumed = 0;
    let s = &mut relay.session;
    if (!input.is_empty() || s.is_stalled())
        && let Ok(n) = s.handle_input(now, input)
    {
        consumed = n;
        progress |= n > 0;
    }
    let passed = relay.session.pass(now, &mut relay.handler);
    progress |= passed.events > 0;
    let sent = relay.session.transmit_to(now, send);
    // A full send: the driver flushes here and goes on; the caller does,
    // and the pass that follows this one goes on.
    progress |= sent.wrote || sent.flush;
    Pass { consumed, progress }
}

/// The relay side lets go of what a send gathered once it is on the wire.
#[inline(never)]
fn relay_release(send: &mut Send) {
    send.ranges.ranges.clear();
    send.len = 0;
}

/// The in-memory wire between a client and its relay session: bytes each
/// way not taken yet, and the scratch buffers of both sides.
struct Wire {
    to_relay: Vec<u8>,
    to_client: Vec<u8>,
    client_out: Vec<u8>,
    send: Send,
}

impl Wire {
    fn new() -> Wire {
        Wire {
            to_relay: Vec::with_capacity(1 << 20),
            to_client: Vec::with_capacity(1 << 20),
            client_out: vec![0; 2 * 16390],
            send: Send::new(),
        }
    }

    /// Puts the relay's send on the wire to the client, in order.
    fn deliver(&mut self) {
        let send = &self.send;
        let mut at = 0;
        for (pos, slice) in &send.ranges.ranges {
            self.to_client.extend_from_slice(&send.head[at..*pos]);
            self.to_client.extend_from_slice(slice);
            at = *pos;
        }
        self.to_client.extend_from_slice(&send.head[at..send.len]);
        relay_release(&mut self.send);
    }
}

/// What a client saw of its subscriptions.
#[derive(Debug, Default, Clone, Copy)]
struct Seen {
    closed: usize,
}

/// Drains a client session's events.
fn drain_client<const N: usize>(client: &mut Session<'_, 'static, 'static, N>, seen: &mut Seen) {
    while let Some(ev) = client.poll_event() {
        if let Event::SubscriptionClosed { .. } = ev {
            seen.closed += 1;
        }
    }
}

/// Moves bytes between `client` and `relay` until neither side has anything
/// more: the client sends what it has, the relay runs passes while it has
/// input (and, with `idle`, once without: a new connection's first pass),
/// its sends reach the client. Returns whether anything moved.
fn pump<const N: usize>(
    client: &mut Session<'_, 'static, 'static, N>,
    relay: &mut RelaySide,
    wire: &mut Wire,
    now: Instant,
    idle: bool,
    seen: &mut Seen,
) -> bool {
    let mut any = false;
    for _ in 0..100_000 {
        let mut moved = false;
        loop {
            let n = client.poll_transmit(now, &mut wire.client_out);
            if n == 0 {
                break;
            }
            wire.to_relay.extend_from_slice(&wire.client_out[..n]);
            moved = true;
        }
        if !wire.to_relay.is_empty() || idle || relay.session.is_stalled() {
            // A wake-up: a pass, and another after every pass that did
            // something (the driver's loop).
            loop {
                let p = relay_pass(relay, now, &wire.to_relay, &mut wire.send);
                wire.to_relay.drain(..p.consumed);
                wire.deliver();
                if !p.progress {
                    break;
                }
                moved = true;
            }
        }
        if !wire.to_client.is_empty() || client.is_stalled() {
            let n = client
                .handle_input(now, &wire.to_client)
                .unwrap_or(wire.to_client.len());
            wire.to_client.drain(..n);
            moved |= n > 0;
        }
        drain_client(client, seen);
        if !moved {
            assert!(
                wire.to_relay.is_empty() && wire.to_client.is_empty(),
                "bytes left on the wire"
            );
            return any;
        }
        any = true;
    }
    panic!("a connection did not settle");
}

/// The publisher's side: its pool, its broadcast's one track and the
/// writer of its live group.
struct Publisher {
    session: ClientSession<'static>,
    relay: RelaySide,
    _broadcast: broadcast::Producer<'static, 'static>,
    _producer: track::Producer<'static, 'static>,
    _live: track::GroupProducer<'static, 'static>,
}

/// The tables of a probe client: a relay client session's, with more
/// control slots (a subscription holds two until its TRACK_INFO).
type ClientStorage = Storage<'static, 'static, 72, 1024, 64, 64, 64, 64, 144>;

/// A client storage.
fn client_storage() -> Box<ClientStorage> {
    Box::new(ClientStorage::new())
}

/// The configuration of a subscribing client (it takes 20 group streams
/// at once, `STREAMS / 4`: one per subscription).
fn subscriber_config() -> Config<'static> {
    Config {
        role: Role::Subscriber,
        ..Config::new()
    }
}

/// Connects the publishing client as relay source 0: it announces `cam`
/// with track `video`, three finished groups of [`FINISHED_FRAMES`] frames
/// and the live group [`LIVE_GROUP`] with `frames` frames so far.
fn publish(worker: &Worker, now: Instant, wire: &mut Wire, frames: usize) -> Publisher {
    let pool = leak_pool(16 << 20);
    let info = track::Info::new("video").expect("short name");
    let t: &'static track::State<'static, GROUPS> = leak(track::State::new(pool, info));
    let b: &'static broadcast::State<'static, 'static, TRACKS> =
        leak(broadcast::State::new(Path::new("cam").expect("path")).expect("broadcast"));
    let o: &'static origin::State<'static, 'static, 4, 8> = leak(origin::State::new());
    let broadcast = b.producer().expect("broadcast producer");
    broadcast.add(t.handle()).expect("add track");
    o.handle().announce(b.handle()).expect("announce");
    let producer = t.producer().expect("track producer");
    let payload = [0x5a; FRAME_BYTES];
    for seq in 0..LIVE_GROUP {
        let mut g = producer.create_group(seq).expect("group");
        for f in 0..FINISHED_FRAMES {
            g.write_frame(f as u64, &payload).expect("frame");
        }
        g.finish().expect("finish");
    }
    let mut live = producer.create_group(LIVE_GROUP).expect("live group");
    for f in 0..frames {
        live.write_frame(f as u64, &payload).expect("frame");
    }
    let storage: &'static mut ClientStorage = Box::leak(client_storage());
    let config = Config {
        role: Role::Publisher,
        ..Config::new()
    };
    let session =
        Session::new(Side::Client, config, now, storage, Some(o.handle())).expect("config");
    let mut publisher = Publisher {
        session,
        relay: RelaySide::accept(worker, 0, now),
        _broadcast: broadcast,
        _producer: producer,
        _live: live,
    };
    let mut seen = Seen::default();
    pump(
        &mut publisher.session,
        &mut publisher.relay,
        wire,
        now,
        true,
        &mut seen,
    );
    assert!(
        worker
            .router
            .origin()
            .get(Path::new("cam").expect("path"))
            .is_some(),
        "the relay routes cam"
    );
    publisher
}

/// Moves bytes on connection (`client`, `relay`) and on the publisher's
/// until neither moves any more (the relay's first request for a track
/// waits for the publisher's answer).
fn settle<const N: usize>(
    client: &mut Session<'_, 'static, 'static, N>,
    relay: &mut RelaySide,
    publisher: &mut Publisher,
    wire: &mut Wire,
    now: Instant,
    seen: &mut Seen,
) {
    for _ in 0..10_000 {
        let a = pump(client, relay, wire, now, true, seen);
        let b = pump(
            &mut publisher.session,
            &mut publisher.relay,
            wire,
            now,
            true,
            seen,
        );
        if !a && !b {
            return;
        }
    }
    panic!("the relay did not settle");
}

fn main() -> ExitCode {
    let args: Vec<usize> = match std::env::args()
        .skip(1)
        .map(|a| a.parse::<usize>())
        .collect::<Result<Vec<usize>, _>>()
    {
        Ok(a) if (2..=4).contains(&a.len()) => a,
        _ => {
            eprintln!(
                "usage: join_relay_probe AUDIENCE JOINS [PER_SESSION [FRAMES]] (non-negative integers)"
            );
            return ExitCode::from(2);
        }
    };
    let (audience, joins) = (args[0], args[1]);
    let per_session = args.get(2).copied().unwrap_or(DEFAULT_PER_SESSION);
    let frames = args.get(3).copied().unwrap_or(1);
    if !(1..=DEFAULT_PER_SESSION).contains(&per_session) || audience == 0 || frames == 0 {
        eprintln!(
            "join_relay_probe: AUDIENCE and FRAMES at least 1, PER_SESSION 1 to {DEFAULT_PER_SESSION}"
        );
        return ExitCode::from(2);
    }
    let audience_sessions = audience.div_ceil(per_session);
    // Source ids: 0 the publisher, 1.. the audience, then the joiner.
    let joiner_id = audience_sessions + 1;
    let worker = Worker::new(joiner_id + 1);
    let now = Instant::ZERO;
    let mut wire = Wire::new();
    let mut seen = Seen::default();

    let mut publisher = publish(&worker, now, &mut wire, frames);
    let client_pool = leak_pool(64 << 20);
    let info = track::Info::new("video").expect("short name");
    let client_tracks = leak_slice(per_session, || {
        track::State::<'static, GROUPS>::new(client_pool, info)
    });

    // The audience, `per_session` subscribers per connection; one client
    // storage serves every audience client in turn.
    let mut storage = client_storage();
    let mut audience_relays = Vec::with_capacity(audience_sessions);
    let mut left = audience;
    for i in 0..audience_sessions {
        let n = left.min(per_session);
        left -= n;
        let mut relay = RelaySide::accept(&worker, (i + 1) as SourceId, now);
        let mut client: ClientSession<'_> =
            Session::new(Side::Client, subscriber_config(), now, &mut *storage, None)
                .expect("client config");
        settle(
            &mut client,
            &mut relay,
            &mut publisher,
            &mut wire,
            now,
            &mut seen,
        );
        for (k, t) in client_tracks[..n].iter().enumerate() {
            let t = t.handle().reopen(info);
            loop {
                match client.subscribe("cam", t, Request::LIVE) {
                    Ok(_) => break,
                    // Each subscription holds two control streams until its
                    // TRACK_INFO: let the relay answer, then go on.
                    Err(SessionError::ControlFull) => settle(
                        &mut client,
                        &mut relay,
                        &mut publisher,
                        &mut wire,
                        now,
                        &mut seen,
                    ),
                    Err(e) => panic!("audience subscribe: {e:?}"),
                }
            }
            if k == 0 {
                // The first TRACK request waits for the relay track's info;
                // the others then find it known (a client's waiting TRACK
                // requests are limited, `max_waiting_tracks`).
                settle(
                    &mut client,
                    &mut relay,
                    &mut publisher,
                    &mut wire,
                    now,
                    &mut seen,
                );
            }
        }
        settle(
            &mut client,
            &mut relay,
            &mut publisher,
            &mut wire,
            now,
            &mut seen,
        );
        for t in &client_tracks[..n] {
            let t = t.handle().current();
            assert_eq!(
                t.latest(),
                Some(LIVE_GROUP),
                "an audience subscriber has the live group"
            );
        }
        drop(client);
        audience_relays.push(relay);
    }
    let relay_track = worker
        .router
        .origin()
        .get(Path::new("cam").expect("path"))
        .and_then(|b| b.track("video"))
        .expect("the relay track");
    assert_eq!(
        relay_track.subscribers() as usize,
        audience,
        "the audience is served"
    );

    // The joiner's connection, with SETUP done.
    let mut joiner_relay = RelaySide::accept(&worker, joiner_id as SourceId, now);
    let joiner_storage: &'static mut ClientStorage = Box::leak(client_storage());
    let mut joiner: ClientSession<'static> =
        Session::new(Side::Client, subscriber_config(), now, joiner_storage, None)
            .expect("client config");
    settle(
        &mut joiner,
        &mut joiner_relay,
        &mut publisher,
        &mut wire,
        now,
        &mut seen,
    );
    assert!(joiner.is_setup(), "the joiner's SETUP is done");
    let joiner_track: &'static track::State<'static, GROUPS> =
        leak(track::State::new(client_pool, info));

    let before = counting::snapshot();
    for _ in 0..joins {
        let t = joiner_track.handle().reopen(info);
        let id: SubscriptionId = joiner
            .subscribe("cam", t, black_box(Request::LIVE))
            .expect("join");
        pump(
            &mut joiner,
            &mut joiner_relay,
            &mut wire,
            now,
            false,
            &mut seen,
        );
        assert_eq!(
            t.latest(),
            Some(LIVE_GROUP),
            "the joiner got the live group"
        );
        let closed = seen.closed;
        joiner.unsubscribe(id).expect("leave");
        pump(
            &mut joiner,
            &mut joiner_relay,
            &mut wire,
            now,
            false,
            &mut seen,
        );
        assert_eq!(seen.closed, closed + 1, "the leave was answered");
    }
    let after = counting::snapshot();
    assert_eq!(
        relay_track.subscribers() as usize,
        audience,
        "the audience stayed"
    );
    println!(
        "joins={joins} allocations={} bytes={}",
        after.count - before.count,
        after.bytes - before.bytes
    );
    black_box(&audience_relays);
    ExitCode::SUCCESS
}
