//! A minimal moq-lite client on monoio: dial a relay, publish a track,
//! subscribe to one and read its frames. Used by the tests and the demo; the
//! same [`crate::session_driver::drive`] loop runs the session.
//!
//! ```no_run
//! # async fn f(ctx: &skiff_monoio::client::ClientCtx) -> std::io::Result<()> {
//! use skiff_monoio::client::{self, Subscriber};
//! let local = ctx.track("video");
//! let mut app = Subscriber::new("demo", local);
//! client::run("tcp://127.0.0.1:4443/anon", None, &mut app, ctx).await?;
//! # Ok(()) }
//! ```
//!
//! Tracks, broadcasts and origins come from fixed tables made with the
//! [`ClientCtx`] ([`ClientLimits`]); a dropped context's tables (and pool) are
//! kept for the next context of the same sizes on the thread, so making
//! contexts, tracks, publications and dials again and again never grows the
//! process.

use std::cell::{Cell, RefCell};
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;

use monoio::net::TcpStream;
use skiff_core::conn;
use skiff_core::model::group::{self, Next, ReadError};
use skiff_core::model::path::Path;
use skiff_core::model::{broadcast, origin, track};
use skiff_core::pool::Pool;
use skiff_core::session::{Config, Event, Session, SubscriptionId};
use skiff_core::window::{End, Request, Start};
use skiff_core::wire::lite::Role;
use skiff_core::wire::qmux::Side;

use crate::clock::Clock;
use crate::notify::Notify;
use crate::session_driver::{
    App, DriveCtx, Ended, HalfReader, HalfWriter, MoqSession, StoragePool, drive, split_halves,
};
use crate::shutdown::{LocalEvent, Shutdown};
use crate::tables::{GROUPS, TRACKS, leak_pool, leak_slice};
use skiff_core::relay::{BroadcastSlot, BroadcastTable, TrackSlot, TrackTable};

/// How many tracks, publications and origins a [`ClientCtx`] holds at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClientLimits {
    /// Local tracks ([`ClientCtx::track`], and one per published track),
    /// about 6 KiB each.
    pub tracks: usize,
    /// Publications ([`ClientCtx::publication`]) at once.
    pub publications: usize,
}

impl Default for ClientLimits {
    fn default() -> Self {
        ClientLimits {
            tracks: 256,
            publications: 16,
        }
    }
}

/// The origin a publication hands to [`run`]: one broadcast, its changes.
type PublicationOrigin = origin::State<'static, 'static, 4, 16>;

/// The media tables of a context: made once, kept for the thread's next
/// context of the same sizes when this one is dropped.
#[derive(Debug, Clone, Copy)]
struct Tables {
    pool: &'static Pool<'static>,
    tracks: &'static TrackTable<'static, 'static, GROUPS>,
    broadcasts: &'static BroadcastTable<'static, 'static, TRACKS>,
    /// Origins and whether a live publication holds each.
    origins: &'static [(PublicationOrigin, Cell<bool>)],
}

thread_local! {
    /// Tables of dropped contexts, by pool size and limits.
    static SPARE_TABLES: RefCell<Vec<((u64, ClientLimits), Tables)>> = const { RefCell::new(Vec::new()) };
}

impl Tables {
    fn make(pool_bytes: u64, limits: ClientLimits) -> Tables {
        let reused = SPARE_TABLES.with(|spare| {
            let mut spare = spare.borrow_mut();
            let i = spare.iter().position(|(k, _)| *k == (pool_bytes, limits))?;
            Some(spare.swap_remove(i).1)
        });
        if let Some(t) = reused {
            return t;
        }
        let pool = leak_pool(pool_bytes);
        let track_slots = leak_slice(limits.tracks, || TrackSlot::new(pool, track::Limits::NONE));
        let broadcast_slots = leak_slice(limits.publications, BroadcastSlot::new);
        Tables {
            pool,
            tracks: Box::leak(Box::new(TrackTable::new(track_slots))),
            broadcasts: Box::leak(Box::new(BroadcastTable::new(broadcast_slots))),
            origins: leak_slice(limits.publications, || {
                (origin::State::new(), Cell::new(false))
            }),
        }
    }
}

/// Per-thread client state: clock, media-change signal, block pool, session
/// storage, and the tables its tracks and publications come from.
#[derive(Debug)]
pub struct ClientCtx {
    /// What every session and media task of the thread shares.
    pub drive: DriveCtx,
    tables: Tables,
    /// The sizes `tables` were made for; `None` for a sibling (it shares them).
    owns: Option<(u64, ClientLimits)>,
    /// The producers of the broadcasts published, with their origin slot.
    published: RefCell<Vec<(broadcast::Producer<'static, 'static>, usize)>>,
    storage: Rc<StoragePool>,
    closing: LocalEvent,
    transport: Cell<conn::Config>,
}

impl Drop for ClientCtx {
    fn drop(&mut self) {
        // The context is gone, and with it every session that borrowed it:
        // its publications end and its tables go to the thread's next context.
        for (producer, slot) in self.published.get_mut().drain(..) {
            let b = producer.broadcast();
            if let Some((o, used)) = self.tables.origins.get(slot) {
                o.handle().unannounce(b.path().as_path());
                used.set(false);
            }
            drop(producer);
            self.tables.broadcasts.retire(b);
        }
        if let Some(key) = self.owns {
            self.tables.tracks.retire_all();
            SPARE_TABLES.with(|spare| spare.borrow_mut().push((key, self.tables)));
        }
    }
}

impl ClientCtx {
    /// Client state with a pool of about `pool_bytes` and the default
    /// [`ClientLimits`]; call it on the monoio runtime that will run the sessions.
    pub fn new(pool_bytes: u64) -> Self {
        Self::with_limits(pool_bytes, ClientLimits::default())
    }

    /// Client state with a pool of about `pool_bytes` and tables of `limits`.
    pub fn with_limits(pool_bytes: u64, limits: ClientLimits) -> Self {
        let closing = LocalEvent::new();
        ClientCtx {
            drive: DriveCtx {
                clock: Clock::new(),
                notify: Notify::shared(),
                shutdown: Some(Shutdown::new(closing.clone())),
            },
            tables: Tables::make(pool_bytes, limits),
            owns: Some((pool_bytes, limits)),
            published: RefCell::new(Vec::new()),
            storage: Rc::new(StoragePool::new()),
            closing,
            transport: Cell::new(conn::Config::new()),
        }
    }

    /// The QMux settings of sessions [`run`] starts from now on (credit
    /// windows, timeouts); moq-dev's defaults until set.
    pub fn set_transport(&self, config: conn::Config) {
        self.transport.set(config);
    }

    /// A context sharing this one's clock, media-change signal, pool,
    /// session storage and transport settings, with its own close signal:
    /// for sessions that end on their own (a publisher that reconnects
    /// with the same tracks).
    pub fn sibling(&self) -> ClientCtx {
        let closing = LocalEvent::new();
        ClientCtx {
            drive: DriveCtx {
                shutdown: Some(Shutdown::new(closing.clone())),
                ..self.drive.clone()
            },
            tables: self.tables,
            owns: None,
            published: RefCell::new(Vec::new()),
            storage: self.storage.clone(),
            closing,
            transport: Cell::new(self.transport.get()),
        }
    }

    /// Closes every session of this context (moq-lite close, NO_ERROR).
    pub fn close_all(&self) {
        self.closing.fire();
    }

    /// The thread's media-change signal.
    pub fn notify(&self) -> &Rc<Notify> {
        &self.drive.notify
    }

    /// The block pool.
    pub fn pool(&self) -> &'static Pool<'static> {
        self.tables.pool
    }

    /// A new local track named `name` (for a subscription to fill or to
    /// publish), from the context's table; [`ClientCtx::release`] gives it back.
    ///
    /// # Panics
    /// If `name` is longer than [`track::MAX_NAME_LEN`], or every track of the
    /// table ([`ClientLimits::tracks`]) is in use.
    pub fn track(&self, name: &str) -> track::Ref<'static, 'static> {
        let info = track::Info::new(name).expect("track name too long");
        self.tables
            .tracks
            .claim(info)
            .expect("the context's track table is full (ClientLimits::tracks)")
    }

    /// Gives local track `t` back: its slot is reused once nothing reads or
    /// writes it any more.
    pub fn release(&self, t: track::Ref<'static, 'static>) {
        self.tables.tracks.retire(t);
    }

    /// An origin holding one broadcast `path` with one track `name`, and the
    /// track's producer: what a publishing client passes to [`run`].
    ///
    /// # Panics
    /// For an invalid path or name.
    pub fn publication(
        &self,
        path: &str,
        name: &str,
    ) -> (
        origin::Ref<'static, 'static>,
        track::Producer<'static, 'static>,
    ) {
        let (o, mut producers) = self.publication_tracks(path, &[name]);
        (o, producers.remove(0))
    }

    /// Like [`ClientCtx::publication`] with one track per name (up to
    /// [`TRACKS`]), their producers in the same order.
    ///
    /// # Panics
    /// For an invalid path or name, or more than [`TRACKS`] names.
    pub fn publication_tracks(
        &self,
        path: &str,
        names: &[&str],
    ) -> (
        origin::Ref<'static, 'static>,
        Vec<track::Producer<'static, 'static>>,
    ) {
        let path = Path::new(path).expect("path");
        let b = self
            .tables
            .broadcasts
            .claim(path)
            .expect("the context's broadcast table is full (ClientLimits::publications)");
        let slot = self
            .tables
            .origins
            .iter()
            .position(|(_, used)| !used.get())
            .expect("every origin of the context is in use (ClientLimits::publications)");
        let (o, used) = &self.tables.origins[slot];
        used.set(true);
        let bp = b.producer().expect("fresh broadcast");
        let producers = names
            .iter()
            .map(|name| {
                let t = self.track(name);
                bp.add(t).expect("track fits");
                t.producer().expect("fresh track")
            })
            .collect();
        o.handle().announce(b).expect("fresh origin");
        // The broadcast lives as long as the context.
        self.published.borrow_mut().push((bp, slot));
        (o.handle(), producers)
    }
}

impl ClientCtx {
    /// A free origin of the context's tables and its slot, for
    /// [`ClientCtx::release_origin`]; `None` if every one is in use.
    pub(crate) fn claim_origin(&self) -> Option<(origin::Ref<'static, 'static>, usize)> {
        let slot = self
            .tables
            .origins
            .iter()
            .position(|(_, used)| !used.get())?;
        let (o, used) = self.tables.origins.get(slot)?;
        used.set(true);
        Some((o.handle(), slot))
    }

    /// Gives origin `slot` back (its broadcasts must be unannounced).
    pub(crate) fn release_origin(&self, slot: usize) {
        if let Some((_, used)) = self.tables.origins.get(slot) {
            used.set(false);
        }
    }

    /// A broadcast at `path` from the context's table.
    pub(crate) fn claim_broadcast(
        &self,
        path: Path<'_>,
    ) -> Option<broadcast::Ref<'static, 'static>> {
        self.tables.broadcasts.claim(path).ok()
    }

    /// Gives broadcast `b` back to the table.
    pub(crate) fn retire_broadcast(&self, b: broadcast::Ref<'static, 'static>) {
        self.tables.broadcasts.retire(b);
    }

    /// A track described by `info` from the context's table.
    pub(crate) fn claim_track(&self, info: track::Info) -> Option<track::Ref<'static, 'static>> {
        self.tables.tracks.claim(info).ok()
    }

    /// Session storage, reused if one is free.
    pub(crate) fn take_storage(&self) -> Box<crate::session_driver::SessionStorage> {
        self.storage.take()
    }

    /// Gives session storage back for the next session.
    pub(crate) fn give_storage(&self, storage: Box<crate::session_driver::SessionStorage>) {
        self.storage.give(storage);
    }

    /// The QMux settings sessions start with.
    pub(crate) fn transport(&self) -> conn::Config {
        self.transport.get()
    }
}

/// Splits `tcp://host:port/path` into `host:port` and the path (`/path`, or
/// empty); `None` for another scheme.
pub(crate) fn split_url(url: &str) -> Option<(&str, &str)> {
    let rest = url.strip_prefix("tcp://")?;
    Some(match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    })
}

/// Splits `tcp://host:port/path` into the address and the SETUP path (`/path`).
///
/// # Errors
/// `InvalidInput` for another scheme or an unresolvable address.
pub fn parse_url(url: &str) -> io::Result<(SocketAddr, String)> {
    let bad = |m: &str| io::Error::new(io::ErrorKind::InvalidInput, format!("{m}: {url}"));
    let (host, path) = split_url(url).ok_or_else(|| bad("not a tcp:// URL"))?;
    use std::net::ToSocketAddrs;
    let addr = host
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| bad("no address"))?;
    Ok((addr, path.to_owned()))
}

/// The receiving half of a client's TCP stream.
pub type TcpReader = HalfReader<TcpStream>;

/// The sending half of a client's TCP stream.
pub type TcpWriter = HalfWriter<TcpStream>;

/// Dials `url` (`tcp://host:port/path`).
///
/// # Errors
/// As [`parse_url`], or the connect error.
pub async fn connect(url: &str) -> io::Result<(TcpReader, TcpWriter, String)> {
    let (addr, path) = parse_url(url)?;
    let stream = TcpStream::connect(addr).await?;
    let _ = stream.set_nodelay(true);
    let (reader, writer) = split_halves(stream, 64 * 1024);
    Ok((reader, writer, path))
}

/// Dials `url` and runs a client session with `app` until it ends; `origin`
/// holds what the client publishes (`None`: subscribe only).
///
/// # Errors
/// Connect and socket errors; a session configuration error as `Other`.
pub async fn run<A: App>(
    url: &str,
    origin: Option<origin::Ref<'static, 'static>>,
    app: &mut A,
    ctx: &ClientCtx,
) -> io::Result<Ended> {
    let (reader, writer, path) = connect(url).await?;
    let mut storage = ctx.storage.take();
    let res = {
        let config = Config {
            conn: ctx.transport.get(),
            path: Some(&path),
            // docs/protocol.md §4.1: a client that publishes nothing says so,
            // as moq-net's does, and the relay keeps no tables for its media.
            role: if origin.is_some() {
                Role::Both
            } else {
                Role::Subscriber
            },
            ..Config::new()
        };
        let session: MoqSession<'_> = Session::new(
            Side::Client,
            config,
            ctx.drive.clock.now(),
            &mut *storage,
            origin,
        )
        .map_err(io::Error::other)?;
        drive(Box::new(session), (), reader, writer, app, &ctx.drive).await
    };
    ctx.storage.give(storage);
    res
}

/// An [`App`] that only serves (a publisher: its origin answers the relay).
#[derive(Debug, Default)]
pub struct Publisher {
    /// Set once the session is set up.
    pub ready: Rc<Cell<bool>>,
    /// The track whose newest group [`Publisher::window`] is measured for.
    paced: Option<track::Ref<'static, 'static>>,
    /// How far the producer of the paced track's newest group may run ahead
    /// of its furthest reader now ([`Session::pacing_window_of`]): the send
    /// credit of the stream carrying it, capped at 16 MiB; `None` while no
    /// stream carries it. Updated whenever the session runs.
    pub window: Rc<Cell<Option<u64>>>,
}

impl Publisher {
    /// A publisher that also reports the pacing window of `track`'s newest
    /// group in [`Publisher::window`], for a producer that paces itself
    /// (`group.allowance(window)`, docs/protocol.md §4.8 pacing).
    pub fn paced(track: track::Ref<'static, 'static>) -> Self {
        Publisher {
            paced: Some(track),
            ..Publisher::default()
        }
    }
}

impl App for Publisher {
    fn on_event(&mut self, event: &Event<'_>) {
        if let Event::Setup { .. } = event {
            self.ready.set(true);
        }
    }
    fn act(&mut self, session: &mut MoqSession<'_>) {
        if let Some(t) = &self.paced {
            let w = t.latest().and_then(|seq| session.pacing_window_of(t, seq));
            self.window.set(w);
        }
    }
}

/// What a [`Subscriber`] saw, shared with whoever reads its track.
#[derive(Debug, Default)]
pub struct SubState {
    /// The subscription was made.
    pub subscribed: Cell<bool>,
    /// SUBSCRIBE_START arrived (with this first group).
    pub started: Cell<Option<u64>>,
    /// The subscription is over (`Some(code)` for an error).
    pub closed: Cell<Option<Option<u64>>>,
    /// The session ended.
    pub session_over: Cell<bool>,
}

/// An [`App`] that asks for the announcement of `broadcast` (its path as the prefix) and subscribes to `track` of
/// `broadcast` once it is announced, filling a local track.
#[derive(Debug)]
pub struct Subscriber {
    broadcast: String,
    local: track::Ref<'static, 'static>,
    announce_asked: bool,
    announced: bool,
    sub: Option<SubscriptionId>,
    /// Progress, shared with the reader.
    pub state: Rc<SubState>,
}

impl Subscriber {
    /// Subscribes to `local`'s name in `broadcast`, filling `local`.
    pub fn new(broadcast: &str, local: track::Ref<'static, 'static>) -> Self {
        Subscriber {
            broadcast: broadcast.to_owned(),
            local,
            announce_asked: false,
            announced: false,
            sub: None,
            state: Rc::new(SubState::default()),
        }
    }
}

impl App for Subscriber {
    fn on_event(&mut self, event: &Event<'_>) {
        match *event {
            Event::Announced { path, .. } if path == self.broadcast => self.announced = true,
            Event::Started {
                subscription,
                group,
            } if Some(subscription) == self.sub => {
                self.state.started.set(Some(group));
            }
            Event::SubscriptionClosed { subscription, code } if Some(subscription) == self.sub => {
                self.state.closed.set(Some(code));
            }
            _ => {}
        }
    }

    fn act(&mut self, session: &mut MoqSession<'_>) {
        if !session.is_established() || !session.is_setup() {
            return;
        }
        if !self.announce_asked {
            // Only the broadcast it wants: a viewer need not hear of every other one.
            self.announce_asked = session.announce_request(&self.broadcast).is_ok();
        }
        if self.announced && self.sub.is_none() {
            let req = Request {
                start: Start::Latest,
                end: End::Open,
                ordered: false,
                priority: 0,
                max_latency: track::DEFAULT_MAX_AGE,
            };
            if let Ok(id) = session.subscribe(&self.broadcast, self.local, req) {
                self.sub = Some(id);
                self.state.subscribed.set(true);
            }
        }
    }

    fn on_close(&mut self) {
        self.state.session_over.set(true);
    }
}

/// One frame as a [`FrameReader`] hands it out.
#[derive(Debug, Clone, Copy)]
pub struct Frame<'b> {
    /// Its group's sequence.
    pub group: u64,
    /// Index within the group (0 first).
    pub index: u64,
    /// Its timestamp.
    pub timestamp: u64,
    /// Its payload.
    pub payload: &'b [u8],
}

/// What [`FrameReader::poll`] found at the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadState {
    /// Nothing more yet (wait for the thread's [`Notify`]).
    Pending,
    /// The track finished and everything was read.
    Finished,
    /// The track was aborted with this code.
    Aborted(u64),
}

/// Reads a track's frames in order, group by group, across partial arrivals.
///
/// Groups may arrive out of order (publishers send the newest first,
/// docs/protocol.md §4.6). [`FrameReader::new`] follows the live edge: an older
/// group that arrives after a newer one was started is skipped.
/// [`FrameReader::sequential`] waits for every group in turn instead.
#[derive(Debug)]
pub struct FrameReader {
    track: track::Ref<'static, 'static>,
    /// `Some(next)`: read groups `next, next + 1, ...` by sequence.
    sequential: Option<u64>,
    consumer: track::Consumer<'static, 'static>,
    group: Option<group::Consumer<'static, 'static>>,
    index: u64,
    header: Option<(u64, usize)>,
    payload: Vec<u8>,
    /// Groups skipped because they were evicted before being read.
    pub lagged: u64,
    /// Groups cut short because their source abandoned them (a publisher
    /// that went away mid-group); reading goes on with the next group.
    pub aborted_groups: u64,
}

impl FrameReader {
    /// A reader of `track` from its latest group.
    pub fn new(track: track::Ref<'static, 'static>) -> Self {
        FrameReader {
            track,
            sequential: None,
            consumer: track.consumer(Start::Latest),
            group: None,
            index: 0,
            header: None,
            payload: Vec::new(),
            lagged: 0,
            aborted_groups: 0,
        }
    }

    /// A reader of every group of `track` from `first` on, in sequence
    /// order, waiting for each (for a subscription that must see them all).
    pub fn sequential(track: track::Ref<'static, 'static>, first: u64) -> Self {
        FrameReader {
            sequential: Some(first),
            ..FrameReader::new(track)
        }
    }

    /// The next group by sequence (sequential mode).
    fn next_in_sequence(
        &mut self,
        next: u64,
    ) -> Result<Option<group::Consumer<'static, 'static>>, ReadState> {
        if let Some(g) = self.track.group(next) {
            self.sequential = Some(next + 1);
            return Ok(Some(g));
        }
        match self.track.status() {
            track::Status::Aborted(c) => Err(ReadState::Aborted(c)),
            track::Status::Finished if self.track.latest().is_none_or(|l| l < next) => {
                Err(ReadState::Finished)
            }
            _ => Ok(None),
        }
    }

    /// The current group was aborted with `code`: the end of reading if the
    /// whole track was, otherwise the group is skipped (`None`).
    fn group_aborted(&mut self, code: u64) -> Option<ReadState> {
        if let track::Status::Aborted(c) = self.track.status() {
            return Some(ReadState::Aborted(c));
        }
        tracing::debug!(code, "group abandoned by its source; reading on");
        self.aborted_groups += 1;
        self.group = None;
        self.header = None;
        None
    }

    /// Reads frames as they arrive until the track ends, handing each to
    /// `f`; returns how it ended ([`ReadState::Finished`] or
    /// [`ReadState::Aborted`]). Waits on `notify` between arrivals and bumps
    /// it after reading (naming the track: the session filling it gives the
    /// credit back), and when it ends: a task waiting on `notify` for
    /// readers to finish sees the end
    /// once this caller recorded it (the bump wakes waiters only after the
    /// running task yields).
    pub async fn read_to_end(
        &mut self,
        notify: &Notify,
        mut f: impl FnMut(Frame<'_>),
    ) -> ReadState {
        let waiter = notify.waiter();
        loop {
            let seen = notify.generation();
            let mut got = false;
            let st = self.poll(|frame| {
                got = true;
                f(frame);
            });
            // Reading frees credit and pacing room for the track's filler
            // (only the tasks following it wake), and an end is news to all.
            if st != ReadState::Pending {
                notify.bump();
            } else if got {
                notify.bump_consumed_tracks([self.track.key()]);
            }
            if st != ReadState::Pending {
                return st;
            }
            waiter.changed(seen).await;
        }
    }

    /// Hands every complete frame available now to `f`; returns why it stopped.
    pub fn poll(&mut self, mut f: impl FnMut(Frame<'_>)) -> ReadState {
        loop {
            if self.group.is_none()
                && let Some(next) = self.sequential
            {
                match self.next_in_sequence(next) {
                    Ok(Some(g)) => {
                        self.group = Some(g);
                        self.index = 0;
                    }
                    Ok(None) => return ReadState::Pending,
                    Err(st) => return st,
                }
            }
            let Some(g) = self.group.as_mut() else {
                match self.consumer.next_group() {
                    Ok(skiff_core::model::track::Next::Ready(g)) => {
                        self.group = Some(g);
                        self.index = 0;
                        continue;
                    }
                    Ok(skiff_core::model::track::Next::Lagged(n)) => {
                        self.lagged += n;
                        continue;
                    }
                    Ok(skiff_core::model::track::Next::Finished) => return ReadState::Finished,
                    Ok(_) => return ReadState::Pending,
                    Err(skiff_core::model::track::ReadError::Aborted(c)) => {
                        return ReadState::Aborted(c);
                    }
                    Err(_) => return ReadState::Aborted(0),
                }
            };
            if self.header.is_none() {
                match g.read_frame_header() {
                    Ok(Next::Ready(h)) => {
                        self.header = Some((h.timestamp, h.len));
                        self.payload.clear();
                    }
                    Ok(Next::Pending) => return ReadState::Pending,
                    Ok(Next::Finished) => {
                        self.group = None;
                        continue;
                    }
                    Err(ReadError::Aborted(c)) => {
                        if let Some(st) = self.group_aborted(c) {
                            return st;
                        }
                        continue;
                    }
                    Err(_) => {
                        // Evicted under us: move on to the next group.
                        self.lagged += 1;
                        self.group = None;
                        continue;
                    }
                }
            }
            let Some((timestamp, len)) = self.header else {
                continue;
            };
            while self.payload.len() < len {
                let have = self.payload.len();
                self.payload.resize(len, 0);
                match g.read_payload(&mut self.payload[have..]) {
                    Ok(Next::Ready(n)) => self.payload.truncate(have + n),
                    Ok(_) => {
                        self.payload.truncate(have);
                        return ReadState::Pending;
                    }
                    Err(ReadError::Aborted(c)) => {
                        if let Some(st) = self.group_aborted(c) {
                            return st;
                        }
                        break;
                    }
                    Err(_) => {
                        self.lagged += 1;
                        self.group = None;
                        self.header = None;
                        break;
                    }
                }
            }
            let Some(g) = self.group.as_ref() else {
                continue;
            };
            f(Frame {
                group: g.sequence(),
                index: self.index,
                timestamp,
                payload: &self.payload,
            });
            self.index += 1;
            self.header = None;
        }
    }
}
