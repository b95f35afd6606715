//! The tests' and tools' lower-level moq-lite client: sessions driven by
//! hand with ready-made [`App`]s on skiff-monoio's session driver
//! ([`drive`]), for tests that assert what the SDK hides (allocation counts
//! per frame, the order frames are read in, a publisher's pacing window).
//! Programs use the SDK ([`skiff_monoio::connect`]).
//!
//! ```no_run
//! # async fn f(ctx: &skiff_testkit::client::ClientCtx) -> std::io::Result<()> {
//! use skiff_testkit::client::{self, Subscriber};
//! let local = ctx.track("video");
//! let mut app = Subscriber::new("demo", local);
//! client::run("tcp://127.0.0.1:4443/anon", None, &mut app, ctx).await?;
//! # Ok(()) }
//! ```
//!
//! Tracks, broadcasts and origins come from the fixed tables of a
//! [`ClientCtx`] ([`ClientLimits`]).

use std::cell::Cell;
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;

use monoio::net::TcpStream;
use skiff_core::model::group::{self, Next, ReadError};
use skiff_core::model::{origin, track};
use skiff_core::pool::Pool;
use skiff_core::session::{Config, Event, Session, SubscriptionId};
use skiff_core::transport::Transport;
use skiff_core::window::{End, Request, Start};
use skiff_core::wire::lite::Role;
use skiff_core::wire::qmux::Side;
pub use skiff_monoio::context::{ClientCtx, ClientLimits};
use skiff_monoio::notify::Notify;
use skiff_monoio::session_driver::{
    App, Ended, HalfReader, HalfWriter, MoqSession, QuicSession, STREAMS, drive, drive_quic,
    split_halves,
};
use skiff_monoio::tables::Keep;
pub use skiff_monoio::tls::Fingerprint;
use skiff_monoio::tls::{Trust, client_config_for};

/// Splits `SCHEME://host:port/path` (`scheme` given with its `://`) into
/// `host:port` and the path (`/path`, or empty); `None` for another scheme.
fn split_url<'u>(url: &'u str, scheme: &str) -> Option<(&'u str, &'u str)> {
    let rest = url.strip_prefix(scheme)?;
    Some(match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    })
}

/// A block pool of about `bytes` bytes that lives for the rest of the
/// process, for tests and benchmarks that make a few.
///
/// # Panics
/// As [`Keep::pool_with_spare`].
pub fn process_pool(bytes: u64) -> &'static Pool<'static> {
    let mut keep = Keep::new();
    // SAFETY: the keep never frees (`keep_forever`), so the pool lives for
    // the rest of the process.
    let pool = unsafe { keep.pool(bytes) };
    keep.keep_forever();
    pool
}

/// Splits `tcp://host:port/path` into the address and the SETUP path (`/path`).
///
/// # Errors
/// `InvalidInput` for another scheme or an unresolvable address.
pub fn parse_url(url: &str) -> io::Result<(SocketAddr, String)> {
    parse_url_of(url, "tcp://")
}

/// [`parse_url`] for `scheme` (with its `://`).
fn parse_url_of(url: &str, scheme: &str) -> io::Result<(SocketAddr, String)> {
    let bad = |m: &str| io::Error::new(io::ErrorKind::InvalidInput, format!("{m}: {url}"));
    let (host, path) = split_url(url, scheme).ok_or_else(|| bad(&format!("not a {scheme} URL")))?;
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

/// The session settings of a client that asks for `path`: one that
/// `publishes` nothing says so (docs/protocol.md §4.1), as moq-net's does,
/// and the relay keeps no tables for its media.
fn session_config<'c>(ctx: &ClientCtx, path: &'c str, publishes: bool) -> Config<'c> {
    Config {
        conn: ctx.transport(),
        path: Some(path),
        role: if publishes {
            Role::Both
        } else {
            Role::Subscriber
        },
        ..Config::new()
    }
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
    let mut storage = ctx.take_storage();
    let res = {
        let config = session_config(ctx, &path, origin.is_some());
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
    ctx.give_storage(storage);
    res
}

/// The QUIC client configuration of `moql://` dials (docs/protocol.md §11):
/// ALPN moq-lite-05, skiff's transport settings, and only the server
/// certificate whose SHA-256 is `pin` accepted (a relay's `--tls-generate`
/// certificate, whose fingerprint it answers at `GET /certificate.sha256`).
/// Made once and cloned for each dial.
///
/// # Errors
/// `Other` if rustls or quinn-proto refuse the configuration.
pub fn quic_config(pin: Fingerprint) -> io::Result<skiff_quic::quinn_proto::ClientConfig> {
    let alpn: &[&[u8]] = &[skiff_core::conn::MOQ_LITE_05.as_bytes()];
    let tls = client_config_for(&Trust::Pinned(pin), alpn).map_err(io::Error::other)?;
    skiff_quic::config::client_config(std::sync::Arc::new(tls), STREAMS).map_err(io::Error::other)
}

/// [`run`] over QUIC: dials `url` (`moql://host:port/path`) from a UDP
/// socket and endpoint of its own with `config` ([`quic_config`]), and runs
/// a moq-lite session over the connection, the path in SETUP, until it
/// ends.
///
/// # Errors
/// As [`parse_url`] (for `moql://`), the socket's bind error, a dial the
/// library refuses, or a session configuration error as `Other`.
pub async fn run_quic<A: App>(
    url: &str,
    config: &skiff_quic::quinn_proto::ClientConfig,
    origin: Option<origin::Ref<'static, 'static>>,
    app: &mut A,
    ctx: &ClientCtx,
) -> io::Result<Ended> {
    let (addr, path) = parse_url_of(url, "moql://")?;
    let clock = ctx.drive.clock;
    let endpoint = skiff_monoio::quic::Endpoint::client(addr, clock)?;
    let host = addr.ip().to_string();
    let (conn, link) = endpoint.connect(config.clone(), addr, &host)?;
    let receiving = monoio::spawn(endpoint.clone().run());
    let transport = skiff_quic::QuicTransport::new(conn, clock.epoch());
    let mut storage = ctx.take_storage();
    let res = {
        let config = session_config(ctx, &path, origin.is_some());
        let session: Result<QuicSession<'_, STREAMS>, _> = Session::with_transport(
            Side::Client,
            config,
            transport,
            clock.now(),
            &mut *storage,
            origin,
        );
        match session {
            Ok(session) => drive_quic(Box::new(session), (), link, app, &ctx.drive).await,
            Err(e) => Err(io::Error::other(e)),
        }
    };
    endpoint.stop();
    drop(receiving);
    ctx.give_storage(storage);
    res
}

/// An [`App`] that only serves (a publisher: its origin answers the relay).
///
/// A producer that paces itself asks its group
/// ([`group::Producer::allowance`](skiff_core::model::group::Producer::allowance)
/// or `poll_paced`): the session serving the group reports its window there.
#[derive(Debug, Default)]
pub struct Publisher {
    /// Set once the session is set up.
    pub ready: Rc<Cell<bool>>,
}

impl App for Publisher {
    fn on_event(&mut self, event: &Event<'_>) {
        if let Event::Setup { .. } = event {
            self.ready.set(true);
        }
    }
    fn act<X: Transport>(
        &mut self,
        _session: &mut Session<'_, 'static, 'static, { skiff_monoio::session_driver::STREAMS }, X>,
    ) {
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

    fn act<X: Transport>(
        &mut self,
        session: &mut Session<'_, 'static, 'static, { skiff_monoio::session_driver::STREAMS }, X>,
    ) {
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

/// What a [`Fetcher`] did so far.
#[derive(Debug, Default)]
pub struct FetchState {
    /// Fetches that brought their whole group.
    pub done: Cell<u64>,
    /// Fetches refused or cut short.
    pub failed: Cell<u64>,
}

/// Fetches groups of one track, one at a time (docs/protocol.md §3.10):
/// each queued `(group, local track)` is fetched into its local track.
pub struct Fetcher {
    broadcast: String,
    /// Fetches still to make, oldest first.
    pub queue:
        Rc<std::cell::RefCell<std::collections::VecDeque<(u64, track::Ref<'static, 'static>)>>>,
    current: Option<SubscriptionId>,
    /// Progress, shared with the test.
    pub state: Rc<FetchState>,
}

impl Fetcher {
    /// A fetcher of groups of `broadcast`.
    pub fn new(broadcast: &str) -> Self {
        Fetcher {
            broadcast: broadcast.to_owned(),
            queue: Rc::default(),
            current: None,
            state: Rc::default(),
        }
    }
}

impl App for Fetcher {
    fn on_event(&mut self, event: &Event<'_>) {
        if let Event::SubscriptionClosed { subscription, code } = *event
            && Some(subscription) == self.current
        {
            self.current = None;
            let n = if code.is_none() {
                &self.state.done
            } else {
                &self.state.failed
            };
            n.set(n.get() + 1);
        }
    }

    fn act<X: Transport>(
        &mut self,
        session: &mut Session<'_, 'static, 'static, { skiff_monoio::session_driver::STREAMS }, X>,
    ) {
        if !session.is_established() || !session.is_setup() || self.current.is_some() {
            return;
        }
        let Some((group, local)) = self.queue.borrow_mut().pop_front() else {
            return;
        };
        match session.fetch(&self.broadcast, local, group, 0) {
            Ok(id) => self.current = Some(id),
            Err(_) => self.state.failed.set(self.state.failed.get() + 1),
        }
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
        let changes = crate::wait::Changes::new(notify);
        loop {
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
            changes.next().await;
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
