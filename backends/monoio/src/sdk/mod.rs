//! The client SDK: publish and subscribe through a relay with linear async code.
//!
//! [`connect`] gives a [`Client`] (the handle the application uses) and a
//! [`Runner`] (the task that owns the connection). Nothing is spawned for
//! you: spawn [`Runner::run`] on the same monoio runtime, and it dials,
//! runs the moq-lite session, and dials again with backoff when the
//! connection ends, re-subscribing what is still wanted.
//!
//! ```no_run
//! # async fn publish() -> Result<(), skiff_monoio::Error> {
//! use skiff_monoio::{Config, connect};
//! use skiff_core::model::track::Info;
//!
//! let (client, runner) = connect("tcp://127.0.0.1:4443/anon", Config::default())?;
//! monoio::spawn(runner.run());
//! let broadcast = client.publish("camera")?;
//! let mut track = broadcast.create_track(Info::new("video").unwrap())?;
//! for gop in 0..10u64 {
//!     let mut group = track.append_group()?;
//!     for i in 0..30u64 {
//!         let timestamp = (gop * 30 + i) * 33_333;
//!         group.write_frame(timestamp, b"frame bytes").await?;
//!     }
//!     group.finish()?;
//! }
//! track.finish();
//! client.flushed().await;
//! client.close().await;
//! # Ok(()) }
//! ```
//!
//! A write waits while the newest group is a credit window ahead of its
//! fastest reader (pacing) and while the block pool is full (backpressure);
//! it never fails for either. A read hands out the payload as pool blocks
//! ([`Payload`]), with no copy.

mod error;
mod fetch;
mod publish;
mod runner;
mod subscribe;

use std::cell::{Cell, RefCell};
use std::net::{SocketAddr, ToSocketAddrs};
use std::rc::Rc;
use std::sync::Arc;
use std::task::Waker;
use std::time::Duration;

use skiff_core::conn;
use skiff_core::model::path::Path;
use skiff_core::model::{origin, track};

pub use error::Error;
pub use publish::{BroadcastProducer, GroupProducer, TrackProducer};
pub use runner::Runner;
pub use skiff_core::window::{End, Request, Start};
pub use subscribe::{Frame, GroupConsumer, Payload, TrackConsumer};

pub use crate::context::ClientLimits;

use crate::context::ClientCtx;
use crate::tls::{ALPN_HTTP1, ALPN_QMUX, Fingerprint, Trust};
use publish::Published;
use rustls::{ClientConfig, RootCertStore};
use subscribe::Wanted;

/// What a [`Client`] is sized and tuned with.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Config {
    /// Bytes of the block pool every published and received frame lives in.
    pub pool_bytes: u64,
    /// Tracks (published and subscribed) and broadcasts held at once.
    pub limits: ClientLimits,
    /// QMux settings: credit windows, timeouts (moq-dev's defaults).
    pub transport: conn::Config,
    /// The first wait before dialing again after a failed connection.
    pub backoff_min: Duration,
    /// The longest wait between attempts (the wait doubles per failure).
    pub backoff_max: Duration,
    /// The CA certificates a `tls://` or `wss://` server's certificate must
    /// chain to ([`crate::tls::roots_from_pem_file`] reads a PEM file);
    /// `None`: the operating system's trust store.
    pub tls_roots: Option<Arc<RootCertStore>>,
    /// The SHA-256 of the one leaf certificate a `tls://` or `wss://`
    /// server must present (a self-signed certificate, such as a relay's
    /// `--tls-generate` one, whose fingerprint it answers at
    /// `GET /certificate.sha256`); set, it replaces [`Config::tls_roots`]:
    /// no chain, name or date is checked, only that the server holds the
    /// certificate's key.
    pub tls_fingerprint: Option<Fingerprint>,
}

impl Config {
    /// Which server certificates this configuration accepts: the pinned
    /// [`Config::tls_fingerprint`], else [`Config::tls_roots`], else the
    /// system's trust store.
    pub fn trust(&self) -> Trust {
        match (&self.tls_fingerprint, &self.tls_roots) {
            (Some(pin), _) => Trust::Pinned(*pin),
            (None, Some(roots)) => Trust::Roots(roots.clone()),
            (None, None) => Trust::System,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            pool_bytes: 16 << 20,
            limits: ClientLimits::default(),
            transport: conn::Config::new(),
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
            tls_roots: None,
            tls_fingerprint: None,
        }
    }
}

/// How the client reaches the relay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scheme {
    /// QMux over TCP; the path travels in SETUP.
    Tcp,
    /// QMux over WebSocket; the path is the request URI (docs/protocol.md §9.3).
    Ws,
    /// QMux over TLS over TCP (docs/protocol.md §9.8); the path travels in SETUP.
    Tls,
    /// QMux over WebSocket over TLS; the path is the request URI.
    Wss,
    /// moq-lite over QUIC (docs/protocol.md §11); the path travels in SETUP.
    Quic,
    /// moq-lite over WebTransport over HTTP/3 (docs/protocol.md §12); the
    /// path and query are the CONNECT request's.
    WebTransport,
}

impl Scheme {
    /// Whether the transport runs over TLS.
    fn is_tls(self) -> bool {
        matches!(
            self,
            Scheme::Tls | Scheme::Wss | Scheme::Quic | Scheme::WebTransport
        )
    }
}

/// Where the client dials: the socket address, the transport and the path.
#[derive(Debug, Clone)]
struct Target {
    /// The URL without its query, for logs and errors: a `jwt` token in
    /// the query stays out of both.
    url: String,
    scheme: Scheme,
    host: String,
    path: String,
}

impl Target {
    fn parse(url: &str) -> Result<Target, Error> {
        let bad = |reason| Error::InvalidUrl {
            url: url.to_owned(),
            reason,
        };
        let (scheme, rest) = if let Some(rest) = url.strip_prefix("ws://") {
            (Scheme::Ws, rest)
        } else if let Some(rest) = url.strip_prefix("wss://") {
            (Scheme::Wss, rest)
        } else if let Some(rest) = url.strip_prefix("tcp://") {
            (Scheme::Tcp, rest)
        } else if let Some(rest) = url.strip_prefix("tls://") {
            (Scheme::Tls, rest)
        } else if let Some(rest) = url.strip_prefix("moql://") {
            (Scheme::Quic, rest)
        } else if let Some(rest) = url.strip_prefix("https://") {
            (Scheme::WebTransport, rest)
        } else {
            return Err(bad(
                "only tcp://, tls://, ws://, wss://, moql:// and https:// URLs are supported",
            ));
        };
        let (host, path) = match scheme {
            // The path (from its `/`) is the SETUP path.
            Scheme::Tcp | Scheme::Tls | Scheme::Quic => match rest.find('/') {
                Some(i) => rest.split_at(i),
                None => (rest, ""),
            },
            // The path and query are the request target.
            Scheme::Ws | Scheme::Wss | Scheme::WebTransport => match rest.find(['/', '?']) {
                Some(i) => rest.split_at(i),
                None => (rest, ""),
            },
        };
        if host.is_empty() || !host.contains(':') {
            return Err(bad("expected host:port"));
        }
        if path.bytes().any(|b| b <= b' ' || b == 0x7f) {
            return Err(bad("the path has spaces or control characters"));
        }
        Ok(Target {
            url: url.split('?').next().unwrap_or_default().to_owned(),
            scheme,
            host: host.to_owned(),
            path: path.to_owned(),
        })
    }

    /// Resolves the host (again at every dial: an address may change).
    fn resolve(&self) -> Result<SocketAddr, Error> {
        let bad = |reason| Error::InvalidUrl {
            url: self.url.clone(),
            reason,
        };
        self.host
            .to_socket_addrs()
            .map_err(|_| bad("the host does not resolve"))?
            .next()
            .ok_or_else(|| bad("the host has no address"))
    }
}

/// How often a write on a full pool looks again when no session passes.
const ROOM_RETRY: Duration = Duration::from_millis(10);

/// What the client handles and the runner share (one thread).
pub(crate) struct Shared {
    target: Target,
    config: Config,
    /// The TLS configuration of a `tls://` or `wss://` client (made once).
    tls: Option<Arc<ClientConfig>>,
    /// Why the last connection attempt failed, if it did (cleared by a
    /// session that reached SETUP).
    last_error: RefCell<Option<Rc<Error>>>,
    /// Why the current connection closed, as its transport said (a QUIC
    /// handshake's refusal of the certificate, say), for the error of an
    /// attempt that never reached SETUP.
    close_reason: RefCell<String>,
    /// The origin every broadcast of the client is announced in.
    origin: origin::Ref<'static, 'static>,
    origin_slot: usize,
    /// Published tracks, for pacing and [`Client::flushed`].
    published: RefCell<Vec<Rc<Published>>>,
    /// Subscriptions the application holds.
    wanted: RefCell<Vec<Rc<Wanted>>>,
    /// Fetches under way or read.
    fetches: RefCell<Vec<Rc<fetch::Fetched>>>,
    /// Sessions that reached SETUP.
    sessions: Cell<u64>,
    /// A session is set up now.
    connected: Cell<bool>,
    /// Runner passes since the start ([`Shared::wait_pass`]).
    passes: Cell<u64>,
    pass_wakers: RefCell<Vec<Waker>>,
    /// The client was closed; the runner stops.
    closed: Cell<bool>,
    /// The runner is inside [`Runner::run`].
    running: Cell<bool>,
    /// The tables and pool every track, publication and session above
    /// borrows: the last field, so it drops (and frees them) after them.
    ctx: ClientCtx,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("url", &self.target.url)
            .field("sessions", &self.sessions.get())
            .field("closed", &self.closed.get())
            .finish_non_exhaustive()
    }
}

impl Shared {
    /// Wakes everything waiting for a runner pass or a state change.
    fn wake_all(&self) {
        for w in self.pass_wakers.borrow_mut().drain(..) {
            w.wake();
        }
        for w in self.wanted.borrow().iter() {
            w.wake();
        }
        for f in self.fetches.borrow().iter() {
            f.wake();
        }
        for p in self.published.borrow().iter() {
            p.wake();
        }
    }

    /// Drops the entries of finished or dropped tracks whose last group was
    /// read: the list holds the live tracks and the few whose end is on its
    /// way.
    fn forget_flushed(&self) {
        self.published.borrow_mut().retain(|p| !p.is_forgettable());
    }

    /// Records a runner pass and wakes whoever waits for one.
    fn passed(&self) {
        self.passes.set(self.passes.get().wrapping_add(1));
        for w in self.pass_wakers.borrow_mut().drain(..) {
            w.wake();
        }
    }

    /// Waits until the runner passes at least once more (or the client closes).
    async fn wait_pass(&self) {
        let seen = self.passes.get();
        self.wait_until(|s| s.passes.get() != seen || s.closed.get())
            .await;
    }

    /// Waits until `done` holds, looking again at every runner pass and
    /// state change.
    async fn wait_until(&self, done: impl Fn(&Shared) -> bool) {
        std::future::poll_fn(|cx| {
            if done(self) {
                return std::task::Poll::Ready(());
            }
            let mut w = self.pass_wakers.borrow_mut();
            if !w.iter().any(|x| x.will_wake(cx.waker())) {
                w.push(cx.waker().clone());
            }
            std::task::Poll::Pending
        })
        .await;
    }

    /// Waits for a runner pass, or [`ROOM_RETRY`] when no session runs: what
    /// a write on a full pool waits for before trying again.
    async fn wait_room(&self) {
        let tick = monoio::time::sleep(ROOM_RETRY);
        let _ = crate::cancel::race(self.wait_pass(), tick).await;
    }

    /// Tells the runner's session that local state changed.
    fn kick(&self) {
        self.ctx.notify().bump();
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        for w in self.wanted.get_mut().drain(..) {
            self.ctx.release(w.local());
        }
        for f in self.fetches.get_mut().drain(..) {
            self.ctx.release(f.local());
        }
        self.ctx.release_origin(self.origin_slot);
    }
}

/// The application's handle on a connection: publish, subscribe, close.
///
/// Clones share the connection. Everything runs on the thread that called
/// [`connect`].
#[derive(Debug, Clone)]
pub struct Client {
    shared: Rc<Shared>,
}

/// A client of the relay at `url` and the [`Runner`] that connects it:
/// `tcp://host:port/path` (QMux over TCP; the path is sent in SETUP and
/// scopes the session), `ws://host:port/path?query` (QMux over WebSocket,
/// subprotocol `qmux-01.moq-lite-05`; the path and query are the request URI
/// and SETUP carries none, docs/protocol.md §9), or either over TLS:
/// `tls://host:port/path` and `wss://host:port/path?query` (§9.8). A TLS
/// server's certificate must chain to [`Config::tls_roots`] (default: the
/// system's trust store) and name the URL's host, which is also sent as SNI,
/// or, with [`Config::tls_fingerprint`], be the certificate pinned.
///
/// Call it on the monoio runtime that will run the runner; nothing is dialed
/// until [`Runner::run`] runs.
///
/// # Errors
/// [`Error::InvalidUrl`] for another scheme or a URL without a port;
/// [`Error::Tls`] if no TLS configuration can be made;
/// [`Error::Full`] if every origin of the thread's client tables is taken.
pub fn connect(url: &str, config: Config) -> Result<(Client, Runner), Error> {
    let target = Target::parse(url)?;
    let tls = if target.scheme.is_tls() {
        // docs/protocol.md §9.8: qmux's ALPN name for tls://, HTTP/1.1 for
        // wss://; §11.1: the moq-lite version for moql://.
        let alpn: &[&[u8]] = match target.scheme {
            Scheme::Tls => &[ALPN_QMUX],
            Scheme::Quic => &[skiff_core::conn::MOQ_LITE_05.as_bytes()],
            // §12.1: HTTP/3, whose CONNECT names moq-lite-05.
            Scheme::WebTransport => &[skiff_quic::webtransport::ALPN_H3.as_bytes()],
            _ => &[ALPN_HTTP1],
        };
        Some(Arc::new(crate::tls::client_config_for(
            &config.trust(),
            alpn,
        )?))
    } else {
        None
    };
    // SAFETY: the context is the last field of `Shared`, and every handle
    // the SDK gives out (client, runner, producers, consumers) holds an
    // `Rc<Shared>` as its last field, so it drops after the core handles it
    // holds; the core handles never leave the SDK's types. Frame payloads
    // hold pool blocks, which the pool counts (the context then keeps it).
    let ctx = unsafe { ClientCtx::owning(config.pool_bytes, config.limits) };
    ctx.set_transport(config.transport);
    let (origin, origin_slot) = ctx.claim_origin().ok_or(Error::Full("origin"))?;
    let shared = Rc::new(Shared {
        ctx,
        target,
        config,
        tls,
        last_error: RefCell::new(None),
        close_reason: RefCell::new(String::new()),
        origin,
        origin_slot,
        published: RefCell::new(Vec::new()),
        wanted: RefCell::new(Vec::new()),
        fetches: RefCell::new(Vec::new()),
        sessions: Cell::new(0),
        connected: Cell::new(false),
        passes: Cell::new(0),
        pass_wakers: RefCell::new(Vec::new()),
        closed: Cell::new(false),
        running: Cell::new(false),
    });
    Ok((
        Client {
            shared: shared.clone(),
        },
        Runner::new(shared),
    ))
}

impl Client {
    /// Publishes the broadcast `path`: it is announced to the relay at once
    /// (and again after every reconnection) and lives until the producer is
    /// finished or dropped.
    ///
    /// # Errors
    /// [`Error::InvalidName`] for a bad path, [`Error::Duplicate`] if this
    /// client publishes it already, [`Error::Full`] past the broadcast limit.
    pub fn publish(&self, path: &str) -> Result<BroadcastProducer, Error> {
        BroadcastProducer::new(self.shared.clone(), path)
    }

    /// Subscribes to `track` of broadcast `path` with `request`: waits until
    /// the broadcast is announced and the relay accepted the subscription.
    /// The consumer follows the track across reconnections and a new source
    /// of the broadcast.
    ///
    /// # Errors
    /// [`Error::InvalidName`], [`Error::Full`] past the track limit,
    /// [`Error::Refused`] if the relay refused the subscription (no such
    /// track), [`Error::Closed`] if the client closed meanwhile.
    pub async fn subscribe(
        &self,
        path: &str,
        track: &str,
        request: Request,
    ) -> Result<TrackConsumer, Error> {
        TrackConsumer::subscribe(self.shared.clone(), path, track, request).await
    }

    /// Fetches group `group` of `track` of broadcast `path` from the relay
    /// (docs/protocol.md §3.10): from its cache, or, when it records the
    /// broadcast, from the recording. Asks for the track's TRACK_INFO first,
    /// so the group's [`GroupConsumer::info`] has the publisher's timescale;
    /// returns once the group's first bytes (or its end) came, and the
    /// consumer reads the rest as it arrives. Dropping the consumer cancels
    /// what is left of the fetch.
    ///
    /// # Errors
    /// [`Error::InvalidName`], [`Error::Full`] past the track limit,
    /// [`Error::NotFound`] if the relay has no such broadcast, track or
    /// group, [`Error::Refused`] for another refusal (EVICTED 0x35: too many
    /// fetches at once), [`Error::Closed`] if the client closed meanwhile.
    pub async fn fetch(&self, path: &str, track: &str, group: u64) -> Result<GroupConsumer, Error> {
        fetch::fetch(self.shared.clone(), path, track, group).await
    }

    /// True while a session with the relay is set up.
    pub fn is_connected(&self) -> bool {
        self.shared.connected.get() && !self.shared.closed.get()
    }

    /// Why the last connection attempt failed ([`Error::Tls`] for a failed
    /// TLS handshake, [`Error::Io`] for a refused connect...); `None` once a
    /// session reached SETUP. The runner keeps retrying either way.
    pub fn last_error(&self) -> Option<Rc<Error>> {
        self.shared.last_error.borrow().clone()
    }

    /// Sessions set up with the relay so far: 0 before the first SETUP, then
    /// one more for every reconnection that reached SETUP.
    pub fn sessions(&self) -> u64 {
        self.shared.sessions.get()
    }

    /// Waits until every group written so far was read by each session that
    /// serves its track (handed to the socket), tracks finished or dropped
    /// since included, so finishing and closing loses nothing; returns at
    /// once for a track nobody subscribes to.
    pub async fn flushed(&self) {
        loop {
            let done = self
                .shared
                .published
                .borrow()
                .iter()
                .all(|p| p.is_flushed());
            if done || self.shared.closed.get() {
                self.shared.forget_flushed();
                // One more pass, asked for: the pass that read the last
                // bytes has then written them out.
                self.shared.kick();
                self.shared.wait_pass().await;
                return;
            }
            // The sessions pass as they read (the track's changes wake them).
            self.shared.wait_pass().await;
        }
    }

    /// Closes the session (moq-lite close, NO_ERROR) and stops the runner;
    /// returns once it stopped.
    pub async fn close(&self) {
        self.shared.closed.set(true);
        self.shared.ctx.close_all();
        self.shared.wake_all();
        self.shared.wait_until(|s| !s.running.get()).await;
    }

    /// The block pool's blocks in use and its capacity, for monitoring.
    pub fn pool_usage(&self) -> (usize, usize) {
        let pool = self.shared.ctx.pool();
        (pool.in_use(), pool.capacity())
    }
}

/// Checks a broadcast path the way the session will.
fn check_path(path: &str) -> Result<(), Error> {
    match Path::new(path) {
        Ok(p) if !p.as_str().is_empty() => Ok(()),
        _ => Err(Error::InvalidName(path.to_owned())),
    }
}

/// Checks a track name.
fn track_info(name: &str) -> Result<track::Info, Error> {
    track::Info::new(name).map_err(|_| Error::InvalidName(name.to_owned()))
}
