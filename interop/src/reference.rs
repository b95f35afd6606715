//! The reference peer: moq-net 0.3.18 over qmux 0.5.3 (qmux-01) over loopback TCP.
//!
//! Each entry point starts one moq-net endpoint on its own std thread, with its own
//! current-thread tokio runtime, and returns a [`Running`] handle at once. The test
//! thread stays free to run skiff (or another reference endpoint) and collects the
//! outcome with [`Running::join`] or [`Running::stop`]. Every run is bounded by
//! [`Options::timeout`], so nothing outlives a test by more than that.
//!
//! The transport is built exactly as docs/protocol.md §7.2 describes: `qmux::tcp::Config`
//! on wire version qmux-01, stream limits 10 000/10 000 (what moq-tokio uses), the
//! protocol list from [`Options::protocols`] (default just `moq-lite-05`), then
//! `moq_tokio::transport::Session` to adapt it to moq-net's poll interface. Origins get
//! the fixed Hop ID from [`Options::hop`], so captured bytes are reproducible.
//!
//! Servers accept exactly one TCP connection each (one session per call).

use std::fmt;
use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener as StdTcpListener};
use std::thread::JoinHandle;
use std::time::Duration;

use moq_net::web_transport_trait::Session as _;
use tokio::sync::oneshot;
use tokio::time::Instant as TokioInstant;

use crate::ALPN_LITE_05;

/// How long [`Running::join`] waits past [`Options::timeout`] for the background thread
/// to wind down (graceful close, runtime shutdown) before giving up on it.
const JOIN_GRACE: Duration = Duration::from_secs(5);

/// Upper bound on the graceful session close at the end of a run.
const CLOSE_GRACE: Duration = Duration::from_secs(2);

// ---------------------------------------------------------------------------
// Content model
// ---------------------------------------------------------------------------

/// One frame: a timestamp in the track's timescale units and its payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// Presentation timestamp, in units of [`TrackInfo::timescale`] per second.
    pub timestamp: u64,
    /// Frame payload bytes.
    pub payload: Vec<u8>,
}

impl Frame {
    /// A frame at `timestamp` (track timescale units) carrying `payload`.
    pub fn new(timestamp: u64, payload: impl Into<Vec<u8>>) -> Self {
        Self {
            timestamp,
            payload: payload.into(),
        }
    }
}

/// One group: an absolute sequence number and its frames in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    /// Absolute group sequence number.
    pub sequence: u64,
    /// Frames in write order.
    pub frames: Vec<Frame>,
}

/// Publisher-side track properties, as carried by TRACK_INFO (docs/protocol.md §3.7).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TrackInfo {
    /// Publisher priority (moq-dev default 127).
    pub priority: u8,
    /// Publisher max age in milliseconds (moq-dev default 5000).
    pub max_age_ms: u64,
    /// Timestamp units per second (moq-dev default 1000).
    pub timescale: u64,
}

impl Default for TrackInfo {
    /// moq-dev's defaults: priority 127, max age 5000 ms, timescale 1000.
    fn default() -> Self {
        Self {
            priority: 127,
            max_age_ms: 5000,
            timescale: 1000,
        }
    }
}

/// What a reference publisher publishes: one broadcast with one track and a fixed set
/// of groups, all written (and cached) before the broadcast is announced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Publication {
    /// Broadcast path, e.g. `clock`.
    pub broadcast: String,
    /// Track name, e.g. `seconds`.
    pub track: String,
    /// Track properties.
    pub info: TrackInfo,
    /// Groups to publish, in creation order.
    pub groups: Vec<Group>,
    /// Whether to finish the track after the last group (makes the publisher send
    /// SUBSCRIBE_END and lets a subscriber see the end of the track).
    pub finish: bool,
}

impl Publication {
    /// The fixture docs/protocol.md §6 was captured with: broadcast `clock`, track `seconds`,
    /// default TRACK_INFO, groups 5 and 6, each with `hello` at `(g-4)*1000` ms and
    /// `world!` 33 ms later; the track finishes after group 6.
    pub fn clock() -> Self {
        let groups = (5..=6)
            .map(|sequence| {
                let base = (sequence - 4) * 1000;
                Group {
                    sequence,
                    frames: vec![Frame::new(base, "hello"), Frame::new(base + 33, "world!")],
                }
            })
            .collect();
        Self {
            broadcast: "clock".into(),
            track: "seconds".into(),
            info: TrackInfo::default(),
            groups,
            finish: true,
        }
    }
}

/// What a reference subscriber asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubscribeRequest {
    /// Broadcast path to wait for in the announcements and then subscribe to.
    pub broadcast: String,
    /// Track name.
    pub track: String,
    /// Subscriber priority.
    pub priority: u8,
    /// Subscriber max age in milliseconds (must cover the spread of old groups to
    /// receive them; clamped by the publisher's max age).
    pub max_age_ms: u64,
    /// First group wanted, or `None` for "from the latest group".
    pub start: Option<u64>,
    /// Last group wanted (inclusive), or `None` for unbounded.
    pub end: Option<u64>,
    /// Stop after this many distinct groups were received completely.
    pub stop_after: Option<usize>,
}

impl SubscribeRequest {
    /// The subscription of docs/protocol.md §6 V8: `clock`/`seconds`, priority 3,
    /// max age 250 ms, groups 5 through 9.
    pub fn clock() -> Self {
        Self {
            broadcast: "clock".into(),
            track: "seconds".into(),
            priority: 3,
            max_age_ms: 250,
            start: Some(5),
            end: Some(9),
            stop_after: None,
        }
    }
}

/// Why a reference endpoint's run ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum End {
    /// [`Running::stop`] was called (or the handle dropped).
    Stopped,
    /// The peer closed the session; carries moq-net's description of the close.
    PeerClosed(String),
    /// [`Options::timeout`] elapsed first.
    TimedOut,
    /// Subscriber: the publisher ended the track and every group was read.
    TrackFinished,
    /// Subscriber: [`SubscribeRequest::stop_after`] groups were received.
    GroupCount,
    /// Subscriber: the subscription or a group read failed with this moq-net error.
    Failed(String),
}

/// What a reference subscriber saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Received {
    /// Application protocol QMux negotiated (`application_protocols`).
    pub protocol: Option<String>,
    /// Server side only: the Path from the client's SETUP.
    pub peer_path: Option<String>,
    /// Active announcements seen before the wanted broadcast appeared, in order
    /// (paths relative to the subscriber's root).
    pub announced: Vec<String>,
    /// The publisher's TRACK_INFO, once the subscription resolved.
    pub info: Option<TrackInfo>,
    /// Complete groups received, sorted by sequence, duplicates dropped.
    pub groups: Vec<Group>,
    /// Group sequences in the order they were handed over (arrival order).
    pub arrival: Vec<u64>,
    /// Why the run ended.
    pub end: End,
}

/// What a reference publisher saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublisherReport {
    /// Application protocol QMux negotiated.
    pub protocol: Option<String>,
    /// Server side only: the Path from the client's SETUP.
    pub peer_path: Option<String>,
    /// Why the run ended.
    pub end: End,
}

// ---------------------------------------------------------------------------
// Options and errors
// ---------------------------------------------------------------------------

/// Per-endpoint settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// Hop ID of the endpoint's origin (non-zero; sent in SETUP, ANNOUNCE_OK and as
    /// Exclude Hop).
    pub hop: u64,
    /// Protocols offered in QMux `application_protocols`, most preferred first.
    pub protocols: Vec<String>,
    /// Client only: the SETUP Path (`None` sends no Path parameter).
    pub path: Option<String>,
    /// Bound on the whole run, from the call until the result is ready.
    pub timeout: Duration,
    /// Subscribers only: keep the session open this long after the end condition
    /// before closing it (e.g. so a capture includes the once-a-second QX_PINGs).
    /// Still bounded by `timeout`.
    pub linger: Duration,
    /// QMux over WebSocket instead of TCP. A client dials `ws://ADDR/PATH`
    /// (subprotocols `qmux-02.<protocol>`, `qmux-01.<protocol>` as a browser
    /// offers them; the path travels in the URI, not SETUP); a server accepts
    /// the upgrade as moq-relay does, choosing `qmux-01.<protocol>`.
    pub websocket: bool,
}

impl Options {
    /// Client defaults matching the docs/protocol.md §6 capture: Hop 0x2222, only
    /// `moq-lite-05`, Path `/room`, 10 s.
    pub fn client() -> Self {
        Self {
            hop: 0x2222,
            protocols: vec![ALPN_LITE_05.into()],
            path: Some("/room".into()),
            timeout: Duration::from_secs(10),
            linger: Duration::ZERO,
            websocket: false,
        }
    }

    /// Server defaults matching the docs/protocol.md §6 capture: Hop 0x1111, only
    /// `moq-lite-05`, 10 s.
    pub fn server() -> Self {
        Self {
            hop: 0x1111,
            protocols: vec![ALPN_LITE_05.into()],
            path: None,
            timeout: Duration::from_secs(10),
            linger: Duration::ZERO,
            websocket: false,
        }
    }

    /// Replace the origin Hop ID.
    #[must_use]
    pub fn with_hop(mut self, hop: u64) -> Self {
        self.hop = hop;
        self
    }

    /// Replace the SETUP Path (clients only).
    #[must_use]
    pub fn with_path(mut self, path: Option<&str>) -> Self {
        self.path = path.map(str::to_owned);
        self
    }

    /// Replace the overall timeout.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Replace the linger time (subscribers only).
    #[must_use]
    pub fn with_linger(mut self, linger: Duration) -> Self {
        self.linger = linger;
        self
    }

    /// Use QMux over WebSocket (see [`Options::websocket`]).
    #[must_use]
    pub fn with_websocket(mut self) -> Self {
        self.websocket = true;
        self
    }

    /// Replace the offered protocol list.
    #[must_use]
    pub fn with_protocols(mut self, protocols: &[&str]) -> Self {
        self.protocols = protocols.iter().map(|p| (*p).to_owned()).collect();
        self
    }
}

/// A failure to start or run a reference endpoint.
#[derive(Debug)]
pub enum HarnessError {
    /// A socket operation failed.
    Io(std::io::Error),
    /// The QMux handshake failed (qmux's message).
    Qmux(String),
    /// moq-net refused something (its message).
    Moq(String),
    /// A setting is unusable (e.g. Hop 0, unknown protocol name, bad timescale).
    Config(String),
    /// The named step did not finish within [`Options::timeout`].
    Timeout(&'static str),
    /// The background thread panicked or could not be joined in time.
    Thread(String),
}

impl fmt::Display for HarnessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Io(err) => write!(f, "io: {err}"),
            Self::Qmux(msg) => write!(f, "qmux: {msg}"),
            Self::Moq(msg) => write!(f, "moq-net: {msg}"),
            Self::Config(msg) => write!(f, "config: {msg}"),
            Self::Timeout(step) => write!(f, "timed out: {step}"),
            Self::Thread(msg) => write!(f, "thread: {msg}"),
        }
    }
}

impl std::error::Error for HarnessError {}

impl From<std::io::Error> for HarnessError {
    fn from(err: std::io::Error) -> Self {
        Self::Io(err)
    }
}

impl From<moq_net::Error> for HarnessError {
    fn from(err: moq_net::Error) -> Self {
        Self::Moq(err.to_string())
    }
}

impl From<qmux::Error> for HarnessError {
    fn from(err: qmux::Error) -> Self {
        Self::Qmux(err.to_string())
    }
}

// ---------------------------------------------------------------------------
// Background runner
// ---------------------------------------------------------------------------

/// A reference endpoint running on its own thread.
///
/// Dropping the handle asks the endpoint to stop and waits (bounded) for the thread.
pub struct Running<T> {
    addr: Option<SocketAddr>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<Result<T, HarnessError>>>,
    deadline: std::time::Instant,
}

impl<T> Running<T> {
    /// The loopback address a server endpoint listens on (`None` for clients).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.addr
    }

    /// Whether the endpoint's run has ended (its result is ready).
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Wait for the run to end on its own (end condition, peer close or timeout).
    ///
    /// # Errors
    ///
    /// The endpoint's own error, or [`HarnessError::Thread`] if the thread panicked
    /// or did not finish within the timeout plus a grace period.
    pub fn join(mut self) -> Result<T, HarnessError> {
        self.join_inner()
    }

    /// Ask the endpoint to stop now, then collect its result.
    ///
    /// # Errors
    ///
    /// As [`Running::join`].
    pub fn stop(mut self) -> Result<T, HarnessError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.join_inner()
    }

    fn join_inner(&mut self) -> Result<T, HarnessError> {
        let Some(thread) = self.thread.take() else {
            return Err(HarnessError::Thread("already joined".into()));
        };
        let limit = self.deadline + JOIN_GRACE;
        while !thread.is_finished() {
            if std::time::Instant::now() >= limit {
                // Leave the thread detached; it is bounded by its own runtime timeout.
                return Err(HarnessError::Thread("did not finish in time".into()));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        thread
            .join()
            .map_err(|_| HarnessError::Thread("panicked".into()))?
    }
}

impl<T> Drop for Running<T> {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if self.thread.is_some() {
            let _ = self.join_inner();
        }
    }
}

impl<T> fmt::Debug for Running<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Running")
            .field("addr", &self.addr)
            .field("finished", &self.is_finished())
            .finish()
    }
}

/// Shared state handed to the future running on the background runtime.
struct Ctx {
    stop: oneshot::Receiver<()>,
    deadline: TokioInstant,
}

fn spawn<T, F, Fut>(
    name: &str,
    addr: Option<SocketAddr>,
    timeout: Duration,
    body: F,
) -> Result<Running<T>, HarnessError>
where
    T: Send + 'static,
    F: FnOnce(Ctx) -> Fut + Send + 'static,
    Fut: Future<Output = Result<T, HarnessError>>,
{
    let (stop_tx, stop_rx) = oneshot::channel();
    let deadline = std::time::Instant::now() + timeout;
    let thread = std::thread::Builder::new()
        .name(format!("ref-{name}"))
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let result = runtime.block_on(async move {
                let ctx = Ctx {
                    stop: stop_rx,
                    deadline: TokioInstant::from_std(deadline),
                };
                body(ctx).await
            });
            // Do not let background tasks (drivers) hold the thread beyond the grace.
            runtime.shutdown_timeout(Duration::from_millis(500));
            result
        })?;
    Ok(Running {
        addr,
        stop: Some(stop_tx),
        thread: Some(thread),
        deadline,
    })
}

fn bind_loopback() -> Result<(StdTcpListener, SocketAddr), HarnessError> {
    let listener = StdTcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    Ok((listener, addr))
}

fn check_loopback(addr: SocketAddr) -> Result<(), HarnessError> {
    if addr.ip().is_loopback() {
        Ok(())
    } else {
        Err(HarnessError::Config(format!(
            "{addr} is not a loopback address"
        )))
    }
}

// ---------------------------------------------------------------------------
// Transport and session setup (docs/protocol.md §7.2)
// ---------------------------------------------------------------------------

/// The poll-interface transport moq-net runs on.
type Transport = moq_tokio::transport::Session<qmux::Session>;

/// moq-tokio's own qmux session settings: the library's defaults with
/// 10 000 streams each way.
pub fn qmux_session() -> qmux::Config {
    let mut session = qmux::Config::new(qmux::Version::QMux01);
    session.max_streams_bidi = 10_000;
    session.max_streams_uni = 10_000;
    session
}

/// qmux's TCP transport on wire version qmux-01 as moq-tokio sets it up,
/// offering `protocols`: the same config dials ([`qmux::tcp::Config::connect`])
/// and accepts ([`qmux::tcp::Config::accept`]).
pub fn qmux_tcp<'a>(protocols: impl IntoIterator<Item = &'a str>) -> qmux::tcp::Config {
    qmux::tcp::Config::new(qmux::Version::QMux01)
        .protocols(protocols)
        .session_config(qmux_session())
}

fn qmux_config(opts: &Options) -> qmux::tcp::Config {
    qmux_tcp(opts.protocols.iter().map(String::as_str))
}

/// Dials `ws://addr/PATH` with qmux's WebSocket client as moq-dev's browser
/// client does: each protocol offered as `qmux-02.` and `qmux-01.`, keep-alive on.
pub async fn ws_connect(addr: SocketAddr, opts: &Options) -> Result<qmux::Session, qmux::Error> {
    let session = qmux_session();
    let versions = [qmux::Version::QMux02, qmux::Version::QMux01];
    let url = format!("ws://{addr}{}", opts.path.as_deref().unwrap_or("/"));
    qmux::ws::Client::new()
        .with_protocols(opts.protocols.iter().map(|p| (p.as_str(), &versions[..])))
        .with_session_config(session)
        .with_keep_alive(qmux::ws::KeepAlive::default())
        .connect(&url)
        .await
}

/// Accepts a WebSocket upgrade on `stream` with qmux's own server: each
/// protocol as `qmux-01.<protocol>`, keep-alive on.
async fn ws_accept(
    stream: tokio::net::TcpStream,
    opts: &Options,
) -> Result<qmux::Session, qmux::Error> {
    let session = qmux_session();
    let versions = [qmux::Version::QMux01];
    qmux::ws::Server::new()
        .with_protocols(opts.protocols.iter().map(|p| (p.as_str(), &versions[..])))
        .with_session_config(session)
        .with_keep_alive(qmux::ws::KeepAlive::default())
        .accept(stream)
        .await
}

fn versions(opts: &Options) -> Result<moq_net::Versions, HarnessError> {
    let list = opts
        .protocols
        .iter()
        .map(|alpn| {
            moq_net::Version::from_alpn(alpn)
                .ok_or_else(|| HarnessError::Config(format!("unknown protocol {alpn}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(moq_net::Versions::from(list))
}

fn origin(opts: &Options) -> Result<moq_net::origin::Producer, HarnessError> {
    let hop =
        moq_net::Hop::new(opts.hop).map_err(|err| HarnessError::Config(format!("hop: {err}")))?;
    Ok(moq_tokio::origin::spawn_config(
        moq_net::origin::Config::new(hop),
    ))
}

/// Which origins a session attaches.
enum Role {
    Publish(moq_net::origin::Producer),
    Subscribe(moq_net::origin::Producer),
}

/// A running moq-net session plus what the handshake revealed.
struct Connected {
    session: moq_net::Session,
    protocol: Option<String>,
    peer_path: Option<String>,
}

async fn bounded<T>(
    deadline: TokioInstant,
    step: &'static str,
    fut: impl Future<Output = Result<T, HarnessError>>,
) -> Result<T, HarnessError> {
    tokio::time::timeout_at(deadline, fut)
        .await
        .map_err(|_| HarnessError::Timeout(step))?
}

async fn dial(
    addr: SocketAddr,
    opts: &Options,
    role: Role,
    deadline: TokioInstant,
) -> Result<Connected, HarnessError> {
    let qmux = bounded(deadline, "qmux connect", async {
        if opts.websocket {
            Ok(ws_connect(addr, opts).await?)
        } else {
            Ok(qmux_config(opts).connect(addr).await?)
        }
    })
    .await?;
    let protocol = qmux.protocol().map(str::to_owned);
    let mut client = moq_net::Client::new().with_versions(versions(opts)?);
    if let Some(path) = opts.path.as_ref().filter(|_| !opts.websocket) {
        client = client.with_path(path.clone());
    }
    client = match role {
        Role::Publish(origin) => client.with_publisher(&origin),
        Role::Subscribe(origin) => client.with_subscriber(origin),
    };
    let transport: Transport = moq_tokio::transport::Session::new(qmux);
    let (session, driver) = bounded(deadline, "moq connect", async {
        Ok(client.connect(std::time::Instant::now(), transport).await?)
    })
    .await?;
    tokio::spawn(moq_net::time::run(driver));
    Ok(Connected {
        session,
        protocol,
        peer_path: None,
    })
}

async fn accept(
    listener: StdTcpListener,
    opts: &Options,
    role: Role,
    deadline: TokioInstant,
) -> Result<Connected, HarnessError> {
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let (stream, _) = bounded(deadline, "tcp accept", async {
        Ok(listener.accept().await?)
    })
    .await?;
    drop(listener);
    let qmux = bounded(deadline, "qmux accept", async {
        if opts.websocket {
            Ok(ws_accept(stream, opts).await?)
        } else {
            Ok(qmux_config(opts).accept(stream).await?)
        }
    })
    .await?;
    let protocol = qmux.protocol().map(str::to_owned);
    let server = moq_net::Server::new().with_versions(versions(opts)?);
    let transport: Transport = moq_tokio::transport::Session::new(qmux);
    let handshake = bounded(deadline, "moq accept", async {
        Ok(server
            .accept_request(std::time::Instant::now(), transport)
            .await?)
    })
    .await?;
    let peer_path = Some(handshake.path().to_owned());
    let handshake = match role {
        Role::Publish(origin) => handshake.with_publisher(&origin),
        Role::Subscribe(origin) => handshake.with_subscriber(origin),
    };
    let (session, driver) = bounded(deadline, "moq accept ok", async {
        Ok(handshake.ok().await?)
    })
    .await?;
    tokio::spawn(moq_net::time::run(driver));
    Ok(Connected {
        session,
        protocol,
        peer_path,
    })
}

async fn close(session: moq_net::Session) {
    let _ = tokio::time::timeout(CLOSE_GRACE, session.close()).await;
}

// ---------------------------------------------------------------------------
// Publisher
// ---------------------------------------------------------------------------

/// Producers that must stay alive while the publication is served.
struct Published {
    _broadcast: moq_net::broadcast::Producer,
    _track: moq_net::track::Producer,
}

fn publish(
    origin: &moq_net::origin::Producer,
    publication: &Publication,
) -> Result<Published, HarnessError> {
    let timescale = moq_net::Timescale::new(publication.info.timescale)
        .map_err(|_| HarnessError::Config("timescale".into()))?;
    let info = moq_net::track::Info::default()
        .with_timescale(timescale)
        .with_max_age(Duration::from_millis(publication.info.max_age_ms))
        .with_priority(publication.info.priority);
    let broadcast = origin.create_broadcast(publication.broadcast.as_str())?;
    let track = broadcast.create_track(publication.track.as_str(), info)?;
    for group in &publication.groups {
        let mut producer = track.create_group(moq_net::group::Info::from(group.sequence))?;
        for frame in &group.frames {
            let timestamp = moq_net::Timestamp::new(frame.timestamp, timescale)
                .map_err(|_| HarnessError::Config("timestamp overflow".into()))?;
            producer.write_frame(timestamp, frame.payload.clone())?;
        }
        producer.finish()?;
    }
    if publication.finish {
        track.finish()?;
    }
    // Announce only once the track and its groups exist, so the first subscriber finds them.
    broadcast.announce(moq_net::origin::Route::default())?;
    Ok(Published {
        _broadcast: broadcast,
        _track: track,
    })
}

async fn serve_until_done(connected: Connected, ctx: Ctx) -> PublisherReport {
    let Connected {
        session,
        protocol,
        peer_path,
    } = connected;
    let Ctx { stop, deadline } = ctx;
    let end = tokio::select! {
        _ = stop => End::Stopped,
        err = session.closed() => End::PeerClosed(err.to_string()),
        () = tokio::time::sleep_until(deadline) => End::TimedOut,
    };
    // moq-net answers a peer's close by itself; only close what is still open.
    if !matches!(end, End::PeerClosed(_)) {
        close(session).await;
    }
    PublisherReport {
        protocol,
        peer_path,
        end,
    }
}

/// Start a moq-net **server** on `127.0.0.1:0` that publishes `publication` to the one
/// client that connects.
///
/// The run ends when the client closes the session, on [`Running::stop`], or at
/// [`Options::timeout`]; the report says which.
///
/// # Errors
///
/// Binding the listener or spawning the thread failed.
pub fn serve_publisher(
    opts: Options,
    publication: Publication,
) -> Result<Running<PublisherReport>, HarnessError> {
    let (listener, addr) = bind_loopback()?;
    spawn(
        "pub-server",
        Some(addr),
        opts.timeout,
        move |ctx| async move {
            let origin = origin(&opts)?;
            let _published = publish(&origin, &publication)?;
            let connected = accept(listener, &opts, Role::Publish(origin), ctx.deadline).await?;
            Ok(serve_until_done(connected, ctx).await)
        },
    )
}

/// Start a moq-net **client** that dials `addr` (loopback only) and publishes
/// `publication`, with [`Options::path`] as its SETUP Path.
///
/// The run ends when the server closes the session, on [`Running::stop`], or at
/// [`Options::timeout`].
///
/// # Errors
///
/// `addr` is not loopback, or spawning the thread failed. Connection failures are
/// reported by [`Running::join`].
pub fn dial_publisher(
    addr: SocketAddr,
    opts: Options,
    publication: Publication,
) -> Result<Running<PublisherReport>, HarnessError> {
    check_loopback(addr)?;
    spawn("pub-client", None, opts.timeout, move |ctx| async move {
        let origin = origin(&opts)?;
        let _published = publish(&origin, &publication)?;
        let connected = dial(addr, &opts, Role::Publish(origin), ctx.deadline).await?;
        Ok(serve_until_done(connected, ctx).await)
    })
}

// ---------------------------------------------------------------------------
// Subscriber
// ---------------------------------------------------------------------------

fn subscription(request: &SubscribeRequest) -> moq_net::track::Subscription {
    use moq_net::track::Position;
    moq_net::track::Subscription::default()
        .with_priority(request.priority)
        .with_max_age(Duration::from_millis(request.max_age_ms))
        .with_start(request.start.map(Position::group))
        // The model's end is exclusive; an inclusive last group `n` is "after group n".
        .with_end(request.end.and_then(Position::after_group))
}

fn insert_group(received: &mut Received, group: Group) {
    received.arrival.push(group.sequence);
    if let Err(at) = received
        .groups
        .binary_search_by_key(&group.sequence, |g| g.sequence)
    {
        received.groups.insert(at, group);
    }
}

/// Wait for the announcement, subscribe, and read groups until an end condition.
/// Writes progress into `received` so a timeout still leaves what arrived.
async fn receive(
    origin: &moq_net::origin::Producer,
    request: &SubscribeRequest,
    received: &mut Received,
) -> End {
    let consumer = origin.consume();
    let mut announced = consumer.announced();
    loop {
        let Some(update) = announced.next().await else {
            return End::Failed("origin closed before the announcement".into());
        };
        if !update.kind.is_active() {
            continue;
        }
        let path = update.prefix.as_str().to_owned();
        let found = path == request.broadcast;
        received.announced.push(path);
        if found {
            break;
        }
    }

    let broadcast = match consumer.routed_broadcast(request.broadcast.as_str()).await {
        Ok(broadcast) => broadcast,
        Err(err) => return End::Failed(format!("broadcast: {err}")),
    };
    let track = match broadcast.track(&request.track) {
        Ok(track) => track,
        Err(err) => return End::Failed(format!("track: {err}")),
    };
    let mut subscriber = match track.subscribe(subscription(request)).await {
        Ok(subscriber) => subscriber,
        Err(err) => return End::Failed(format!("subscribe: {err}")),
    };
    let info = subscriber.info();
    received.info = Some(TrackInfo {
        priority: info.priority,
        max_age_ms: u64::try_from(info.max_age.as_millis()).unwrap_or(u64::MAX),
        timescale: u64::from(info.timescale),
    });
    let timescale = info.timescale;

    loop {
        let mut group = match subscriber.recv_group().await {
            Ok(Some(group)) => group,
            Ok(None) => return End::TrackFinished,
            Err(err) => return End::Failed(format!("group: {err}")),
        };
        let mut frames = Vec::new();
        loop {
            match group.read_frame().await {
                Ok(Some(frame)) => {
                    let timestamp = match frame.timestamp.convert(timescale) {
                        Ok(ts) => ts.value(),
                        Err(_) => return End::Failed("timestamp overflow".into()),
                    };
                    frames.push(Frame {
                        timestamp,
                        payload: frame.payload.to_vec(),
                    });
                }
                Ok(None) => break,
                Err(err) => return End::Failed(format!("frame: {err}")),
            }
        }
        insert_group(
            received,
            Group {
                sequence: group.sequence,
                frames,
            },
        );
        if request
            .stop_after
            .is_some_and(|count| received.groups.len() >= count)
        {
            return End::GroupCount;
        }
    }
}

async fn subscribe_until_done(
    connected: Connected,
    origin: moq_net::origin::Producer,
    request: SubscribeRequest,
    linger: Duration,
    ctx: Ctx,
) -> Received {
    let Connected {
        session,
        protocol,
        peer_path,
    } = connected;
    let Ctx { stop, deadline } = ctx;
    let mut received = Received {
        protocol,
        peer_path,
        announced: Vec::new(),
        info: None,
        groups: Vec::new(),
        arrival: Vec::new(),
        end: End::TimedOut,
    };
    let mut stop = stop;
    let end = tokio::select! {
        end = receive(&origin, &request, &mut received) => end,
        _ = &mut stop => End::Stopped,
        err = session.closed() => End::PeerClosed(err.to_string()),
        () = tokio::time::sleep_until(deadline) => End::TimedOut,
    };
    if matches!(end, End::TrackFinished | End::GroupCount) && !linger.is_zero() {
        let until = deadline.min(TokioInstant::now() + linger);
        tokio::select! {
            _ = stop => {}
            _ = session.closed() => {}
            () = tokio::time::sleep_until(until) => {}
        }
    }
    received.end = end;
    if !matches!(received.end, End::PeerClosed(_)) {
        close(session).await;
    }
    received
}

/// Start a moq-net **server** on `127.0.0.1:0` that subscribes, through the one client
/// that connects, to `request`: it waits for the broadcast's announcement, subscribes
/// and returns what it received.
///
/// # Errors
///
/// Binding the listener or spawning the thread failed. Handshake failures are
/// reported by [`Running::join`]; a timeout after the handshake is [`End::TimedOut`]
/// with whatever had arrived.
pub fn serve_subscriber(
    opts: Options,
    request: SubscribeRequest,
) -> Result<Running<Received>, HarnessError> {
    let (listener, addr) = bind_loopback()?;
    spawn(
        "sub-server",
        Some(addr),
        opts.timeout,
        move |ctx| async move {
            let origin = origin(&opts)?;
            let connected = accept(
                listener,
                &opts,
                Role::Subscribe(origin.clone()),
                ctx.deadline,
            )
            .await?;
            Ok(subscribe_until_done(connected, origin, request, opts.linger, ctx).await)
        },
    )
}

/// Start a moq-net **client** that dials `addr` (loopback only), waits for the
/// broadcast's announcement, subscribes to `request` and returns what it received.
///
/// # Errors
///
/// `addr` is not loopback, or spawning the thread failed. Connection failures are
/// reported by [`Running::join`].
pub fn dial_subscriber(
    addr: SocketAddr,
    opts: Options,
    request: SubscribeRequest,
) -> Result<Running<Received>, HarnessError> {
    check_loopback(addr)?;
    spawn("sub-client", None, opts.timeout, move |ctx| async move {
        let origin = origin(&opts)?;
        let connected = dial(addr, &opts, Role::Subscribe(origin.clone()), ctx.deadline).await?;
        Ok(subscribe_until_done(connected, origin, request, opts.linger, ctx).await)
    })
}
