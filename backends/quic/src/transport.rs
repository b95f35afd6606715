//! [`QuicTransport`]: a quinn-proto connection behind skiff-core's
//! [`Transport`] trait, and [`pump`], which hands what the connection
//! received to the session.
//!
//! The session writes into the library's send buffers (`out: 0`: the driver
//! sends the library's datagrams) and is fed by [`pump`], which reads a
//! stream only as far as the session has room for: the bytes the session
//! released on it plus one receive window, less what was handed over
//! (docs/protocol.md §2.4, §11.4). The library gives a stream's credit back
//! as bytes leave its buffer, so a parked reader holds its peer to the
//! library's window plus that one.

use std::cell::Cell;
use std::collections::{HashMap, HashSet, VecDeque};
use std::rc::Rc;
use std::string::String;
use std::time::Instant as StdInstant;

use bytes::Bytes;
use quinn_proto::{
    Connection, ConnectionError, Dir as QuicDir, ReadError, ReadableError, StreamEvent, VarInt,
    WriteError as QuicWriteError,
};
use skiff_core::session::Session;
use skiff_core::time::{Duration, Instant};
use skiff_core::transport::{
    CloseCause, Closed, Event, OpenError, StreamError, Transport, WriteError, Written,
};
use skiff_core::wire::qmux::{Dir, StreamId};

use crate::config::{ALPNS, STREAM_WINDOW};
use crate::webtransport::{self as wt, ConnectStream, ControlStream, StreamHeader, code as h3};

/// Streams a new connection's tables have room for before they grow: a
/// viewer's control streams (its SETUP, announcement and subscription
/// requests) fit.
const INITIAL_STREAMS: usize = 8;

/// One stream's receiving state, as the driver hands it to the session.
#[derive(Debug, Default)]
struct Recv {
    /// Bytes read from the library (handed over or pending).
    read: u64,
    /// Bytes the session took.
    taken: u64,
    /// Bytes the session released ([`Transport::release`]).
    released: u64,
    /// Bytes read from the library that the session did not take yet.
    pending: Option<Bytes>,
    /// The library reported the end of the stream.
    fin: bool,
    /// The end was handed to the session (or the stream was reset or
    /// stopped): nothing more comes.
    done: bool,
    /// Listed in [`QuicTransport::revisit`].
    listed: bool,
}

/// An event kept until [`pump`] hands it over.
#[derive(Debug)]
enum Owned {
    Established(&'static str),
    Stop { id: u64, code: u64 },
    Writable { id: u64 },
    Closed(OwnedClose),
}

/// How the connection ended, kept for [`Event::Closed`].
#[derive(Debug, Clone)]
struct OwnedClose {
    code: u64,
    reason: String,
    application: bool,
    cause: CloseCause,
}

/// A QUIC connection carrying one moq-lite session.
///
/// The driver owns the socket: it feeds the connection the datagrams the
/// endpoint routes to it ([`connection_mut`](Self::connection_mut)), runs
/// its timers ([`poll_timeout`](Self::quic_timeout),
/// [`handle_timeout`](Self::quic_handle_timeout)), sends what
/// `poll_transmit` of the library gives, and calls [`pump`] after each of
/// those.
pub struct QuicTransport {
    conn: Connection,
    /// The instant the core's [`Instant::ZERO`] stands for.
    epoch: StdInstant,
    /// The latest instant a call carried (for calls that carry none).
    now: Instant,
    protocol: Option<&'static str>,
    recv: HashMap<u64, Recv>,
    /// Streams with bytes to hand over, or waiting for the session to make
    /// room, in the order they became so.
    revisit: VecDeque<u64>,
    /// Streams whose last write found no credit.
    blocked: HashSet<u64>,
    events: VecDeque<Owned>,
    /// The WebTransport session's state (docs/protocol.md §12); `None` on
    /// raw QUIC.
    wt: Option<Box<Wt>>,
    /// Called with the connection when the transport drops.
    on_end: Option<OnEnd>,
    /// The budget this connection shares with the others of its worker
    /// ([`set_send_budget`](Self::set_send_budget)); `None`: the window
    /// stays as configured.
    send_budget: Option<u64>,
    /// Where the session's gather leaves a pool range for the next write
    /// ([`lend_handoff`](Self::lend_handoff)); `None`: every write copies.
    handoff: Option<Handoff>,
    /// Streams we finished whose bytes the peer has not all acknowledged:
    /// a close waits for them (at most [`CLOSE_LINGER`]), since closing the
    /// connection drops what the library has not delivered.
    finishing: HashSet<u64>,
    /// A close asked for while [`finishing`](Self::finishing) streams were
    /// in flight: when it happens at the latest, with the code and reason.
    closing: Option<(Instant, u64, Bytes)>,
    /// The connection's end, held back from the session while data the
    /// peer sent before it still waits in the library for the session's
    /// room; handed over once none waits, or at the instant it holds at the
    /// latest ([`CLOSE_LINGER`] after the end).
    ended: Option<(Instant, OwnedClose)>,
}

/// Passes one pool range, as [`Bytes`] that keep its block, from the
/// session's [`Gather`](skiff_core::session::Gather) to the write that asked
/// for it ([`QuicTransport::lend_handoff`]): the library's send buffer then
/// holds the pool's bytes until the peer acknowledges them, instead of a
/// copy of them.
#[derive(Clone, Default)]
pub struct Handoff(Rc<Cell<Option<Bytes>>>);

impl core::fmt::Debug for Handoff {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Handoff").finish_non_exhaustive()
    }
}

impl Handoff {
    /// Leaves `bytes` for the write under way.
    pub fn put(&self, bytes: Bytes) {
        self.0.set(Some(bytes));
    }

    /// Takes what the gather left, if anything.
    fn take(&self) -> Option<Bytes> {
        self.0.take()
    }
}

thread_local! {
    /// Connections of this thread that share a send budget
    /// ([`QuicTransport::set_send_budget`]).
    static SHARING: Cell<usize> = const { Cell::new(0) };
}

/// What [`QuicTransport::on_end`] calls.
type OnEnd = Box<dyn FnOnce(&Connection)>;

impl Drop for QuicTransport {
    fn drop(&mut self) {
        if self.send_budget.is_some() {
            let _ = SHARING.try_with(|n| n.set(n.get().saturating_sub(1)));
        }
        if let Some(f) = self.on_end.take() {
            f(&self.conn);
        }
    }
}

/// The ALPN `conn`'s handshake agreed on, once it did.
pub fn negotiated_alpn(conn: &Connection) -> Option<Vec<u8>> {
    conn.crypto_session()
        .handshake_data()?
        .downcast::<quinn_proto::crypto::rustls::HandshakeData>()
        .ok()?
        .protocol
}

/// Where a WebTransport connection's handshake stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WtStatus {
    /// The QUIC handshake, the SETTINGS or the CONNECT exchange is under way.
    Handshaking,
    /// (Server) the client's CONNECT arrived: [`QuicTransport::wt_request`]
    /// holds it until [`QuicTransport::wt_answer`].
    Requested,
    /// The session is set up: moq-lite runs over its streams.
    Open,
    /// The CONNECT was answered with this status (not 200), by us or by the
    /// server, or the response chose no protocol we speak (0).
    Refused(u16),
    /// The connection closed before the session was set up.
    Failed,
}

/// How long a refused CONNECT's answer, or our session close capsule, may
/// take to be acknowledged before the connection closes anyway.
const LINGER: Duration = Duration::from_millis(300);

/// How long a close waits for the peer to acknowledge the streams we
/// finished (a publisher's last group) before the connection closes anyway:
/// a few round trips of a distant peer, retransmissions included. Also how
/// long the session goes on taking what a peer sent before its close.
pub const CLOSE_LINGER: Duration = Duration::from_secs(1);

/// A WebTransport connection's HTTP/3 state.
struct Wt {
    server: bool,
    /// (Client) the CONNECT request to send once connected.
    request_out: Option<Vec<u8>>,
    status: WtStatus,
    /// The CONNECT stream: its ID is the session ID.
    session: Option<u64>,
    connect: ConnectStream,
    /// (Server) the CONNECT request, once read.
    request: Option<wt::Request>,
    control_out: Option<u64>,
    control_in: Option<(u64, ControlStream)>,
    /// The peer's QPACK streams and the bytes read on each.
    qpack: HashMap<u64, u64>,
    /// Peer streams whose header is being read.
    headers: HashMap<u64, (StreamHeader, bool)>,
    /// WebTransport streams of the peer that came before the session was
    /// set up, with the session they name.
    early: Vec<(u64, u64)>,
    /// Streams of ours HTTP/3 owns to visit (readable or new).
    work: VecDeque<u64>,
    /// Bytes of HTTP/3's own streams not taken by the library yet.
    out: Vec<(u64, Vec<u8>, bool)>,
    /// Our WebTransport streams whose header is not all written: the
    /// header, and how far it went.
    unsent: HashMap<u64, ([u8; 16], usize, usize)>,
    /// When the connection closes at the latest, once the close capsule or
    /// a refusal went out; with the code and reason.
    linger: Option<(Instant, u64, Bytes)>,
    /// The session was told the connection ended.
    reported: bool,
}

impl core::fmt::Debug for QuicTransport {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("QuicTransport")
            .field("protocol", &self.protocol)
            .field("closed", &self.conn.is_closed())
            .field("streams", &self.recv.len())
            .field("readable", &self.revisit.len())
            .field("blocked", &self.blocked.len())
            .finish()
    }
}

impl QuicTransport {
    /// Wraps `conn`; `epoch` is the std instant the core's instants count from.
    pub fn new(conn: Connection, epoch: StdInstant) -> Self {
        QuicTransport {
            conn,
            epoch,
            now: Instant::ZERO,
            protocol: None,
            // Room for a viewer's few streams that carry data in: a
            // connection with more grows them once, then keeps them.
            recv: HashMap::with_capacity(INITIAL_STREAMS),
            revisit: VecDeque::with_capacity(INITIAL_STREAMS),
            blocked: HashSet::new(),
            events: VecDeque::with_capacity(INITIAL_STREAMS),
            wt: None,
            on_end: None,
            send_budget: None,
            handoff: None,
            finishing: HashSet::new(),
            closing: None,
            ended: None,
        }
    }

    /// Takes stream data by reference from now on
    /// ([`Transport::lends`]): the session's gather (the driver's, given to
    /// `poll_transmit_gather`) puts each range it lends in the returned
    /// handoff, as [`Bytes`] that keep the range's pool block, and the write
    /// hands those to the library instead of copying the bytes.
    pub fn lend_handoff(&mut self) -> Handoff {
        self.handoff.get_or_insert_with(Handoff::default).clone()
    }

    /// Shares `budget` bytes of unacknowledged or unsent data with the
    /// thread's other connections that have one: from the next
    /// [`fit_send_window`](Self::fit_send_window) on, this connection's
    /// send window is its share ([`send_window_for`](crate::config::send_window_for)).
    /// Only connections with a session share it: a handshake that was never
    /// finished takes no one's window.
    pub fn set_send_budget(&mut self, budget: Option<u64>) {
        match (self.send_budget.is_some(), budget.is_some()) {
            (false, true) => SHARING.with(|n| n.set(n.get() + 1)),
            (true, false) => SHARING.with(|n| n.set(n.get().saturating_sub(1))),
            _ => {}
        }
        self.send_budget = budget;
    }

    /// Gives the library this connection's share of its budget, among the
    /// thread's connections that share one, as its send window (writes past
    /// it are refused until acknowledgements come); nothing without a
    /// budget. The library only stores the window, so giving it the same
    /// share again changes nothing.
    pub fn fit_send_window(&mut self) {
        let Some(budget) = self.send_budget else {
            return;
        };
        let connections = SHARING.with(Cell::get);
        self.conn
            .set_send_window(crate::config::send_window_for(budget, connections));
    }

    /// Calls `f` with the connection when the transport drops (to read its
    /// statistics, say).
    pub fn on_end(&mut self, f: impl FnOnce(&Connection) + 'static) {
        self.on_end = Some(Box::new(f));
    }

    /// Wraps a server's `conn` whose handshake agreed on HTTP/3 (ALPN `h3`):
    /// the session runs over WebTransport once the client's CONNECT was
    /// answered 200 ([`wt_answer`](Self::wt_answer), docs/protocol.md §12).
    pub fn webtransport_server(conn: Connection, epoch: StdInstant) -> Self {
        let mut t = Self::new(conn, epoch);
        t.wt = Some(Box::new(Wt::new(true, None)));
        t
    }

    /// Wraps a client's `conn` (dialed with ALPN `h3`) that asks for a
    /// WebTransport session at `https://{authority}{target}`, offering
    /// moq-lite-05; `None` if that is not a URL.
    pub fn webtransport_client(
        conn: Connection,
        epoch: StdInstant,
        authority: &str,
        target: &str,
    ) -> Option<Self> {
        let request = wt::request(authority, target, &[skiff_core::conn::MOQ_LITE_05])?;
        let mut t = Self::new(conn, epoch);
        t.wt = Some(Box::new(Wt::new(false, Some(request))));
        Some(t)
    }

    /// Where the WebTransport handshake stands (`None` on raw QUIC). Call
    /// [`poll_webtransport`](Self::poll_webtransport) first.
    pub fn wt_status(&self) -> Option<WtStatus> {
        let w = self.wt.as_ref()?;
        if self.conn.is_closed() && w.status != WtStatus::Open {
            return Some(match w.status {
                WtStatus::Refused(s) => WtStatus::Refused(s),
                _ => WtStatus::Failed,
            });
        }
        Some(w.status)
    }

    /// (Server) the client's CONNECT request, once it arrived.
    pub fn wt_request(&self) -> Option<&wt::Request> {
        self.wt.as_ref()?.request.as_ref()
    }

    /// (Server) answers the client's CONNECT: 200 sets the session up with
    /// moq-lite-05 (400 instead when the client did not offer it in
    /// `WT-Available-Protocols`); another status refuses it, and the
    /// connection closes once the answer is acknowledged.
    pub fn wt_answer(&mut self, now: Instant, status: u16) {
        self.now = now;
        let Some(w) = self.wt.as_mut() else { return };
        if w.status != WtStatus::Requested {
            return;
        }
        let Some(id) = w.session else { return };
        let offered = w.request.as_ref().is_some_and(|r| {
            r.protocols
                .iter()
                .any(|p| p == skiff_core::conn::MOQ_LITE_05)
        });
        let status = if status == 200 && !offered {
            400
        } else {
            status
        };
        if status == 200 {
            let bytes = wt::response(200, Some(skiff_core::conn::MOQ_LITE_05));
            self.wt_write(id, bytes, false);
            self.wt_open();
        } else {
            let bytes = wt::response(status, None);
            self.wt_write(id, bytes, true);
            if let Some(w) = self.wt.as_mut() {
                w.status = WtStatus::Refused(status);
                let at = now.saturating_add(LINGER);
                w.linger = Some((at, h3::H3_REQUEST_REJECTED, Bytes::new()));
            }
        }
    }

    /// Processes what the connection received for HTTP/3 itself (SETTINGS,
    /// the CONNECT exchange, QPACK streams, headers of new streams) before
    /// the session exists; [`pump`] does the same once it does.
    pub fn poll_webtransport(&mut self, now: Instant) {
        self.now = now;
        self.poll_library();
    }

    /// The library's connection (to hand it datagrams and endpoint events,
    /// and take its datagrams to send).
    pub fn connection_mut(&mut self) -> &mut Connection {
        &mut self.conn
    }

    /// The library's connection.
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    /// The std instant of a core instant.
    pub fn std_at(&self, at: Instant) -> StdInstant {
        self.epoch + std::time::Duration::from_micros(at.as_micros())
    }

    /// The core instant of a std instant.
    pub fn core_at(&self, at: StdInstant) -> Instant {
        let micros = at.saturating_duration_since(self.epoch).as_micros();
        Instant::from_micros(u64::try_from(micros).unwrap_or(u64::MAX))
    }

    /// When the library's timers (or a WebTransport close's linger, a close
    /// waiting for the streams we finished, or the latest hand-over of the
    /// peer's close) are next due.
    pub fn quic_timeout(&mut self) -> Option<Instant> {
        let library = self.conn.poll_timeout().map(|at| self.core_at(at));
        let closing = self.closing.as_ref().map(|c| c.0);
        let ended = self.ended.as_ref().map(|e| e.0);
        [library, self.wt_linger_until(), closing, ended]
            .into_iter()
            .flatten()
            .min()
    }

    /// Runs the library's timers due at `now`.
    pub fn quic_handle_timeout(&mut self, now: Instant) {
        self.now = now;
        if self.wt_linger_until().is_some_and(|at| at <= now) {
            self.wt_close_now();
        }
        if self.closing.as_ref().is_some_and(|c| c.0 <= now) {
            self.close_lingered();
        }
        let at = self.std_at(now);
        self.conn.handle_timeout(at);
    }

    /// The protocol agreed in the handshake (the ALPN), once established.
    pub fn protocol(&self) -> Option<&'static str> {
        self.protocol
    }

    /// Moves the library's events into this transport's queues: new and
    /// readable streams, credit, resets, the handshake's end and the close.
    fn poll_library(&mut self) {
        while let Some(event) = self.conn.poll() {
            match event {
                quinn_proto::Event::HandshakeDataReady => {}
                quinn_proto::Event::Connected if self.wt.is_some() => self.wt_connected(),
                quinn_proto::Event::Connected => {
                    let protocol = negotiated_alpn(&self.conn)
                        .and_then(|p| ALPNS.iter().copied().find(|a| a.as_bytes() == p));
                    match protocol {
                        Some(p) => {
                            self.protocol = Some(p);
                            self.events.push_back(Owned::Established(p));
                        }
                        None => {
                            // rustls refuses a handshake without a common
                            // ALPN; a peer that offered none is refused here.
                            let at = self.std_at(self.now);
                            self.conn.close(
                                at,
                                VarInt::from_u32(crate::config::VERSION_NEGOTIATION_FAILED),
                                Bytes::from_static(b"no common protocol"),
                            );
                        }
                    }
                }
                quinn_proto::Event::ConnectionLost { reason } => {
                    let mut close = close_of(&reason);
                    if let Some(w) = self.wt.as_mut() {
                        if w.reported {
                            continue;
                        }
                        w.reported = true;
                        // A WebTransport session's close code is mapped as
                        // its stream codes are.
                        if close.application {
                            close.code = code_from_wire(close.code).unwrap_or(close.code);
                        }
                    }
                    self.events.push_back(Owned::Closed(close));
                }
                quinn_proto::Event::Stream(s) => self.on_stream_event(s),
                quinn_proto::Event::DatagramReceived => {
                    // Datagrams are not used; they are dropped unread.
                    while self.conn.datagrams().recv().is_some() {}
                }
                quinn_proto::Event::DatagramsUnblocked => {}
            }
        }
        if self.wt.is_some() {
            self.wt_process();
        }
        // Every stream we finished is acknowledged: a close that waited for
        // them happens now.
        if self.closing.is_some() && self.finishing.is_empty() {
            self.close_lingered();
        }
    }

    fn on_stream_event(&mut self, event: StreamEvent) {
        match event {
            StreamEvent::Opened { dir } => {
                while let Some(id) = self.conn.streams().accept(dir) {
                    match self.wt.as_mut() {
                        Some(w) => {
                            let id = u64::from(id);
                            w.headers
                                .insert(id, (StreamHeader::default(), dir == QuicDir::Bi));
                            w.work.push_back(id);
                        }
                        None => self.list(id.into()),
                    }
                }
            }
            StreamEvent::Readable { id } => {
                let id = u64::from(id);
                match self.wt.as_mut() {
                    Some(w) if !self.recv.contains_key(&id) => w.work.push_back(id),
                    _ => self.list(id),
                }
            }
            StreamEvent::Finished { id } => {
                let id = u64::from(id);
                self.finishing.remove(&id);
                if let Some(w) = self.wt.as_ref()
                    && w.session == Some(id)
                    && w.linger.is_some()
                {
                    // The close capsule or the refusal arrived.
                    self.wt_close_now();
                }
            }
            StreamEvent::Writable { id } if self.wt_owns(u64::from(id)) => {}
            StreamEvent::Stopped { id, .. } if self.wt_owns(u64::from(id)) => {
                let id = u64::from(id);
                if self.wt.as_ref().is_some_and(|w| w.control_out == Some(id)) {
                    self.wt_fail(h3::H3_CLOSED_CRITICAL_STREAM, "control stream stopped");
                }
            }
            StreamEvent::Writable { id } => {
                let id = u64::from(id);
                self.blocked.remove(&id);
                self.events.push_back(Owned::Writable { id });
            }
            StreamEvent::Stopped { id, error_code } => {
                let id = u64::from(id);
                self.blocked.remove(&id);
                self.finishing.remove(&id);
                self.events.push_back(Owned::Stop {
                    id,
                    code: code_from_wire(error_code.into_inner()).unwrap_or(0),
                });
            }
            StreamEvent::Available { .. } => {
                // More streams may be opened: the session looks at what waits
                // to be opened on its next pass, which any event causes.
                self.events.push_back(Owned::Writable { id: u64::MAX });
            }
        }
    }

    /// When a lingering WebTransport connection closes at the latest.
    fn wt_linger_until(&self) -> Option<Instant> {
        self.wt.as_ref()?.linger.as_ref().map(|l| l.0)
    }

    /// True if HTTP/3 itself owns stream `id` (our control or CONNECT
    /// stream, a peer stream whose header is not read yet, a QPACK stream).
    fn wt_owns(&self, id: u64) -> bool {
        self.wt.as_ref().is_some_and(|w| {
            w.control_out == Some(id)
                || w.session == Some(id)
                || w.headers.contains_key(&id)
                || w.qpack.contains_key(&id)
                || w.control_in.as_ref().is_some_and(|(c, _)| *c == id)
        })
    }

    /// The handshake ended on a WebTransport connection: the ALPN must be
    /// HTTP/3; our control stream opens with SETTINGS, and a client sends
    /// its CONNECT.
    fn wt_connected(&mut self) {
        let h3 = negotiated_alpn(&self.conn).is_some_and(|p| p == wt::ALPN_H3.as_bytes());
        if !h3 {
            self.wt_fail(h3::H3_GENERAL_PROTOCOL_ERROR, "HTTP/3 not agreed");
            return;
        }
        let Some(control) = self.conn.streams().open(QuicDir::Uni) else {
            self.wt_fail(h3::H3_STREAM_CREATION_ERROR, "no stream for HTTP/3 control");
            return;
        };
        let control = u64::from(control);
        if let Some(w) = self.wt.as_mut() {
            w.control_out = Some(control);
        }
        self.wt_write(control, wt::settings(), false);
        let request = self.wt.as_mut().and_then(|w| w.request_out.take());
        if let Some(request) = request {
            let Some(id) = self.conn.streams().open(QuicDir::Bi) else {
                self.wt_fail(h3::H3_STREAM_CREATION_ERROR, "no stream for the CONNECT");
                return;
            };
            let id = u64::from(id);
            if let Some(w) = self.wt.as_mut() {
                w.session = Some(id);
            }
            self.wt_write(id, request, false);
        }
    }

    /// Writes `bytes` on HTTP/3 stream `id` (then FIN if `fin`), keeping
    /// what the library does not take for later.
    fn wt_write(&mut self, id: u64, bytes: Vec<u8>, fin: bool) {
        if let Some(w) = self.wt.as_mut() {
            w.out.push((id, bytes, fin));
        }
        self.wt_flush();
    }

    /// Hands the library what HTTP/3's own streams still have to send.
    fn wt_flush(&mut self) {
        // Once the handshake's bytes are out there is nothing here: every
        // poll of an open session returns at once.
        let Some(w) = self.wt.as_mut().filter(|w| !w.out.is_empty()) else {
            return;
        };
        let mut out = std::mem::take(&mut w.out);
        out.retain_mut(|(id, bytes, fin)| {
            let mut stream = self.conn.send_stream(quic_id(StreamId(*id)));
            match stream.write(bytes) {
                Ok(n) => {
                    bytes.drain(..n);
                }
                Err(QuicWriteError::Blocked) => {}
                // A stream the peer stopped or that is gone takes nothing more.
                Err(_) => return false,
            }
            if bytes.is_empty() {
                if *fin {
                    let _ = stream.finish();
                }
                return false;
            }
            true
        });
        if let Some(w) = self.wt.as_mut() {
            out.append(&mut w.out);
            w.out = out;
        }
    }

    /// Closes the connection for an HTTP/3 error and tells the session.
    fn wt_fail(&mut self, code: u64, reason: &'static str) {
        if let Some(w) = self.wt.as_mut() {
            if !w.reported {
                w.reported = true;
                self.events.push_back(Owned::Closed(OwnedClose {
                    code,
                    reason: String::from(reason),
                    application: false,
                    cause: CloseCause::Peer,
                }));
            }
            w.linger = None;
        }
        self.close_conn(code, Bytes::from_static(reason.as_bytes()));
    }

    /// Closes the connection with `code` (clamped to a varint) and
    /// `reason`, unless it is closed already.
    fn close_conn(&mut self, code: u64, reason: Bytes) {
        if !self.conn.is_closed() {
            let at = self.std_at(self.now);
            self.conn
                .close(at, VarInt::from_u64(code).unwrap_or(VarInt::MAX), reason);
        }
    }

    /// Closes the connection whose close waited for its finished streams.
    fn close_lingered(&mut self) {
        if let Some((_, code, reason)) = self.closing.take() {
            self.close_conn(code, reason);
        }
    }

    /// Closes the connection that lingered for its last words to arrive.
    fn wt_close_now(&mut self) {
        let Some((_, code, reason)) = self.wt.as_mut().and_then(|w| w.linger.take()) else {
            return;
        };
        self.close_conn(code, reason);
    }

    /// The session is set up: moq-lite may run, and the peer's streams
    /// that came early for it are handed over (others are refused).
    fn wt_open(&mut self) {
        let Some(w) = self.wt.as_mut() else { return };
        w.status = WtStatus::Open;
        let session = w.session;
        let early = std::mem::take(&mut w.early);
        self.protocol = Some(skiff_core::conn::MOQ_LITE_05);
        self.events
            .push_back(Owned::Established(skiff_core::conn::MOQ_LITE_05));
        for (id, sid) in early {
            if Some(sid) == session {
                self.recv.entry(id).or_default();
                self.list(id);
            } else {
                self.wt_refuse_stream(id, h3::WT_BUFFERED_STREAM_REJECTED);
            }
        }
    }

    /// Stops (and for a bidi stream resets) with `code` a peer stream
    /// HTTP/3 does not take.
    fn wt_refuse_stream(&mut self, id: u64, code: u64) {
        let code = VarInt::from_u64(code).unwrap_or(VarInt::MAX);
        let qid = quic_id(StreamId(id));
        let _ = self.conn.recv_stream(qid).stop(code);
        if StreamId(id).dir() == Dir::Bidi {
            let _ = self.conn.send_stream(qid).reset(code);
        }
    }

    /// Reads up to `max` bytes of stream `id` from the library.
    fn wt_read(&mut self, id: u64, max: usize) -> WtRead {
        let mut stream = self.conn.recv_stream(quic_id(StreamId(id)));
        let mut chunks = match stream.read(true) {
            Ok(c) => c,
            Err(_) => return WtRead::End,
        };
        let got = chunks.next(max);
        let _ = chunks.finalize();
        match got {
            Ok(Some(chunk)) => WtRead::Data(chunk.bytes),
            Ok(None) => WtRead::End,
            Err(ReadError::Blocked) => WtRead::Blocked,
            Err(ReadError::Reset(_)) => WtRead::End,
        }
    }

    /// Visits the streams HTTP/3 owns that have news, and sends what its
    /// streams still have to send.
    fn wt_process(&mut self) {
        self.wt_flush();
        // Each visit reads what is there; a stream reported again later is
        // visited again. The bound keeps one call's work finite.
        for _ in 0..256 {
            let Some(id) = self.wt.as_mut().and_then(|w| w.work.pop_front()) else {
                break;
            };
            self.wt_visit(id);
            if self.conn.is_closed() {
                break;
            }
        }
    }

    fn wt_visit(&mut self, id: u64) {
        let Some(w) = self.wt.as_mut() else { return };
        if let Some((header, bidi)) = w.headers.get(&id) {
            let bidi = *bidi;
            let mut need = header.need(bidi);
            while need > 0 {
                match self.wt_read(id, need) {
                    WtRead::Data(b) => {
                        if let Some(w) = self.wt.as_mut()
                            && let Some((h, _)) = w.headers.get_mut(&id)
                        {
                            h.push(&b);
                            need = h.need(bidi);
                        }
                    }
                    WtRead::Blocked => return,
                    WtRead::End => {
                        // Reset or ended before its header: nothing to do.
                        if let Some(w) = self.wt.as_mut() {
                            w.headers.remove(&id);
                        }
                        return;
                    }
                }
            }
            let Some((header, _)) = self.wt.as_mut().and_then(|w| w.headers.remove(&id)) else {
                return;
            };
            self.wt_classify(id, bidi, &header);
            return;
        }
        let role = self.wt.as_ref().and_then(|w| {
            if w.control_in.as_ref().is_some_and(|(c, _)| *c == id) {
                Some(H3Stream::Control)
            } else if w.qpack.contains_key(&id) {
                Some(H3Stream::Qpack)
            } else if w.session == Some(id) {
                Some(H3Stream::Connect)
            } else {
                None
            }
        });
        if let Some(role) = role {
            self.wt_read_h3(id, role);
        }
    }

    /// A peer stream's header is read: where the stream goes.
    fn wt_classify(&mut self, id: u64, bidi: bool, header: &StreamHeader) {
        let Some(kind) = header.kind(bidi) else {
            return;
        };
        let Some(w) = self.wt.as_mut() else { return };
        match (kind, bidi) {
            (wt::Kind::WebTransport(sid), _) => match w.status {
                WtStatus::Open if w.session == Some(sid) => {
                    self.recv.entry(id).or_default();
                    self.list(id);
                }
                WtStatus::Handshaking | WtStatus::Requested if w.early.len() < wt::EARLY_MAX => {
                    w.early.push((id, sid));
                }
                _ => self.wt_refuse_stream(id, h3::WT_BUFFERED_STREAM_REJECTED),
            },
            (wt::Kind::Other(wt::STREAM_CONTROL), false) => {
                if w.control_in.is_some() {
                    self.wt_fail(h3::H3_STREAM_CREATION_ERROR, "second control stream");
                    return;
                }
                w.control_in = Some((id, ControlStream::default()));
                self.wt_read_h3(id, H3Stream::Control);
            }
            (wt::Kind::Other(wt::STREAM_QPACK_ENCODER | wt::STREAM_QPACK_DECODER), false) => {
                if w.qpack.len() >= 2 {
                    self.wt_fail(h3::H3_STREAM_CREATION_ERROR, "third QPACK stream");
                    return;
                }
                w.qpack.insert(id, 0);
                self.wt_read_h3(id, H3Stream::Qpack);
            }
            (wt::Kind::Other(wt::STREAM_PUSH), false) => {
                self.wt_fail(h3::H3_STREAM_CREATION_ERROR, "push stream");
            }
            (wt::Kind::Other(_), false) => {
                // Unknown and reserved stream types are not read (a uni
                // stream is only stopped).
                self.wt_refuse_stream(id, h3::H3_STREAM_CREATION_ERROR);
            }
            (wt::Kind::Other(_), true) => {
                let first_request = w.server && w.session.is_none();
                if !first_request {
                    // One session per connection; the server opens no
                    // request streams.
                    self.wt_refuse_stream(id, h3::H3_REQUEST_REJECTED);
                    return;
                }
                w.session = Some(id);
                if let Err(e) = w.connect.feed(header.bytes()) {
                    self.wt_fail(e.code, e.reason);
                    return;
                }
                self.wt_read_h3(id, H3Stream::Connect);
            }
        }
    }

    /// Reads what HTTP/3's own stream `id` holds and hands each piece to
    /// its `role`'s handling, until the stream is blocked, ends, or the
    /// handling stops.
    fn wt_read_h3(&mut self, id: u64, role: H3Stream) {
        loop {
            let bytes = match self.wt_read(id, 4096) {
                WtRead::Data(b) => b,
                WtRead::Blocked => return,
                WtRead::End => {
                    match role {
                        H3Stream::Control => {
                            self.wt_fail(h3::H3_CLOSED_CRITICAL_STREAM, "control stream closed")
                        }
                        H3Stream::Qpack => {
                            self.wt_fail(h3::H3_CLOSED_CRITICAL_STREAM, "QPACK stream closed")
                        }
                        H3Stream::Connect => self.wt_connect_ended(),
                    }
                    return;
                }
            };
            let more = match role {
                H3Stream::Control => self.wt_take_control(&bytes),
                H3Stream::Qpack => self.wt_take_qpack(id, &bytes),
                H3Stream::Connect => self.wt_take_connect(&bytes),
            };
            if !more {
                return;
            }
        }
    }

    /// Feeds the peer's control stream; false once the connection failed.
    fn wt_take_control(&mut self, bytes: &[u8]) -> bool {
        let fed = match self.wt.as_mut().and_then(|w| w.control_in.as_mut()) {
            Some((_, c)) => c.feed(bytes),
            None => return false,
        };
        if let Err(e) = fed {
            self.wt_fail(e.code, e.reason);
            return false;
        }
        let refused = self
            .wt
            .as_ref()
            .and_then(|w| w.control_in.as_ref())
            .and_then(|(_, c)| c.settings())
            == Some(false);
        if refused {
            self.wt_fail(h3::H3_GENERAL_PROTOCOL_ERROR, "WebTransport not enabled");
            return false;
        }
        true
    }

    /// Counts what a QPACK stream carried (its instructions are not
    /// needed); false once it passed [`wt::QPACK_MAX`].
    fn wt_take_qpack(&mut self, id: u64, bytes: &[u8]) -> bool {
        let Some(w) = self.wt.as_mut() else {
            return false;
        };
        let n = w.qpack.entry(id).or_default();
        *n = n.saturating_add(bytes.len() as u64);
        if *n > wt::QPACK_MAX {
            self.wt_fail(h3::H3_EXCESSIVE_LOAD, "QPACK stream too long");
            return false;
        }
        true
    }

    /// Feeds the CONNECT stream and acts on what it said so far; false
    /// once the connection failed.
    fn wt_take_connect(&mut self, bytes: &[u8]) -> bool {
        let fed = match self.wt.as_mut() {
            Some(w) => w.connect.feed(bytes),
            None => return false,
        };
        if let Err(e) = fed {
            self.wt_fail(e.code, e.reason);
            return false;
        }
        self.wt_on_connect();
        true
    }

    /// What the CONNECT stream said so far: the request or response, or
    /// the session's close.
    fn wt_on_connect(&mut self) {
        let Some(w) = self.wt.as_mut() else { return };
        match (w.status, w.connect.headers()) {
            (WtStatus::Handshaking, Some(h)) if w.server => match wt::decode_request(h) {
                Ok(r) => {
                    w.request = Some(r);
                    w.status = WtStatus::Requested;
                }
                Err(e) => self.wt_fail(e.code, e.reason),
            },
            (WtStatus::Handshaking, Some(h)) => match wt::decode_response(h) {
                Ok((200, Some(p))) if p == skiff_core::conn::MOQ_LITE_05 => self.wt_open(),
                Ok((status, _)) => {
                    w.status = WtStatus::Refused(if status == 200 { 0 } else { status });
                    self.wt_fail(h3::H3_NO_ERROR, "CONNECT refused");
                }
                Err(e) => self.wt_fail(e.code, e.reason),
            },
            (WtStatus::Open, _) => {
                if let Some((code, reason)) = w.connect.close().cloned() {
                    self.wt_peer_closed(u64::from(code), reason);
                }
            }
            _ => {}
        }
    }

    /// The CONNECT stream ended or was reset: the session is over.
    fn wt_connect_ended(&mut self) {
        let Some(w) = self.wt.as_ref() else { return };
        match w.status {
            WtStatus::Open => self.wt_peer_closed(0, String::new()),
            WtStatus::Refused(_) => {}
            _ => self.wt_fail(h3::H3_REQUEST_INCOMPLETE, "CONNECT stream ended"),
        }
    }

    /// The peer closed the session (capsule or the CONNECT stream's end):
    /// the session hears its code and reason, and the connection closes
    /// with the code mapped as WebTransport maps it.
    fn wt_peer_closed(&mut self, code: u64, reason: String) {
        let Some(w) = self.wt.as_mut() else { return };
        if w.reported {
            return;
        }
        w.reported = true;
        let wire = code_to_wire(u32::try_from(code).unwrap_or(0));
        let bytes = Bytes::copy_from_slice(reason.as_bytes());
        self.events.push_back(Owned::Closed(OwnedClose {
            code,
            reason,
            application: true,
            cause: CloseCause::Peer,
        }));
        self.close_conn(wire, bytes);
    }

    /// Puts stream `id` on the list of streams to read.
    fn list(&mut self, id: u64) {
        let r = self.recv.entry(id).or_default();
        if !r.listed && !r.done {
            r.listed = true;
            self.revisit.push_back(id);
        }
    }

    /// Bytes of `id` that may be read from the library now.
    fn room(r: &Recv) -> u64 {
        r.released
            .saturating_add(STREAM_WINDOW)
            .saturating_sub(r.read)
    }

    /// The next bytes of `id` for the session: what it left last time, or
    /// what the library holds within the room; `None` when there is nothing
    /// (the stream stays listed only if it waits for room).
    fn next_data(&mut self, id: u64) -> Next {
        let Some(r) = self.recv.get_mut(&id) else {
            return Next::Nothing;
        };
        if r.done {
            return Next::Nothing;
        }
        if let Some(p) = r.pending.take() {
            return Next::Data {
                offset: r.taken,
                data: p,
                fin: r.fin,
            };
        }
        if r.fin {
            return Next::Data {
                offset: r.taken,
                data: Bytes::new(),
                fin: true,
            };
        }
        let room = Self::room(r);
        if room == 0 {
            return Next::Wait;
        }
        let qid = quinn_proto::StreamId::from(VarInt::from_u64(id).unwrap_or(VarInt::MAX));
        let mut stream = self.conn.recv_stream(qid);
        let mut chunks = match stream.read(true) {
            Ok(c) => c,
            Err(ReadableError::ClosedStream) | Err(ReadableError::IllegalOrderedRead) => {
                r.done = true;
                return Next::Nothing;
            }
        };
        let max = usize::try_from(room).unwrap_or(usize::MAX);
        let got = chunks.next(max);
        // Credit for what was read goes to the peer with the next datagram.
        let _ = chunks.finalize();
        match got {
            Ok(Some(chunk)) => {
                let len = chunk.bytes.len() as u64;
                let offset = r.read;
                r.read += len;
                Next::Data {
                    offset,
                    data: chunk.bytes,
                    fin: false,
                }
            }
            Ok(None) => {
                r.fin = true;
                Next::Data {
                    offset: r.taken,
                    data: Bytes::new(),
                    fin: true,
                }
            }
            Err(ReadError::Blocked) => Next::Nothing,
            Err(ReadError::Reset(code)) => {
                r.done = true;
                Next::Reset {
                    code: code_from_wire(code.into_inner()).unwrap_or(0),
                    final_size: r.read,
                }
            }
        }
    }
}

/// Which of HTTP/3's own peer streams [`QuicTransport::wt_read_h3`] reads.
#[derive(Clone, Copy)]
enum H3Stream {
    Control,
    Qpack,
    /// The CONNECT stream.
    Connect,
}

/// What [`QuicTransport::wt_read`] found on a stream HTTP/3 owns.
enum WtRead {
    Data(Bytes),
    Blocked,
    /// The stream ended or was reset.
    End,
}

impl Wt {
    fn new(server: bool, request_out: Option<Vec<u8>>) -> Self {
        Wt {
            server,
            request_out,
            status: WtStatus::Handshaking,
            session: None,
            connect: ConnectStream::default(),
            request: None,
            control_out: None,
            control_in: None,
            qpack: HashMap::new(),
            headers: HashMap::new(),
            early: Vec::new(),
            work: VecDeque::new(),
            out: Vec::new(),
            unsent: HashMap::new(),
            linger: None,
            reported: false,
        }
    }
}

/// What [`QuicTransport::next_data`] found on a stream.
enum Next {
    /// Bytes from `offset` (and the end if `fin`).
    Data { offset: u64, data: Bytes, fin: bool },
    /// The peer reset the stream.
    Reset { code: u64, final_size: u64 },
    /// The session has no room on it yet.
    Wait,
    /// Nothing to read now.
    Nothing,
}

fn close_of(reason: &ConnectionError) -> OwnedClose {
    let (code, text, application, cause) = match reason {
        ConnectionError::ApplicationClosed(c) => (
            c.error_code.into_inner(),
            String::from_utf8_lossy(&c.reason).into_owned(),
            true,
            CloseCause::Peer,
        ),
        ConnectionError::ConnectionClosed(c) => (
            u64::from(c.error_code),
            String::from_utf8_lossy(&c.reason).into_owned(),
            false,
            CloseCause::Peer,
        ),
        ConnectionError::TimedOut => (
            0,
            String::from("idle timeout"),
            false,
            CloseCause::IdleTimeout,
        ),
        other => (0, other.to_string(), false, CloseCause::Peer),
    };
    OwnedClose {
        code,
        reason: text,
        application,
        cause,
    }
}

/// The first stream error code of the range WebTransport maps application
/// codes into; moq-dev's QUIC stacks send stream codes in this form on raw
/// QUIC too (docs/protocol.md §11.6).
const H3_FIRST: u64 = 0x52e4_a40f_a8db;
/// The last code of that range.
const H3_LAST: u64 = 0x52e5_ac98_3162;

/// A moq-lite stream code as it goes on the wire (the mapped form, which
/// every moq-dev peer reads).
pub fn code_to_wire(code: u32) -> u64 {
    let c = u64::from(code);
    H3_FIRST + c + c / 0x1e
}

/// A moq-lite stream code from the wire: a code in the mapped range is
/// mapped back (its reserved points, and codes past `u32`, give `None`);
/// any other is taken as it is.
pub fn code_from_wire(wire: u64) -> Option<u64> {
    if !(H3_FIRST..=H3_LAST).contains(&wire) {
        return Some(wire);
    }
    let shifted = wire - H3_FIRST;
    if shifted % 0x1f == 0x1e {
        return None;
    }
    Some(shifted - shifted / 0x1f)
}

/// A stream code for the library, in the mapped form.
fn wire_code(code: u64) -> VarInt {
    let code = u32::try_from(code).unwrap_or(0);
    VarInt::from_u64(code_to_wire(code)).unwrap_or(VarInt::MAX)
}

/// Ends `stream` after what was written (a FIN once the data is sent).
fn finish(stream: &mut quinn_proto::SendStream<'_>) -> Result<(), WriteError> {
    match stream.finish() {
        Ok(()) => Ok(()),
        Err(quinn_proto::FinishError::Stopped(_)) => Err(WriteError::Reset),
        Err(quinn_proto::FinishError::ClosedStream) => Err(WriteError::Finished),
    }
}

fn quic_id(id: StreamId) -> quinn_proto::StreamId {
    quinn_proto::StreamId::from(VarInt::from_u64(id.0).unwrap_or(VarInt::MAX))
}

/// Hands what the connection received to `session`: the handshake's end,
/// stream data (no more per stream than the session has room for), resets,
/// credit and the close. Returns true if anything was handed over. Call it
/// after every datagram, timer and write the connection saw.
pub fn pump<const N: usize>(
    session: &mut Session<'_, '_, '_, N, QuicTransport>,
    now: Instant,
) -> bool {
    session.transport_mut().now = now;
    session.transport_mut().poll_library();
    // The close waits until the stream data received before it is handed
    // over: a peer that wrote its last group and closed may have the close
    // arrive while the library still holds more of the group than the
    // session has room for, and the group is whole only if the session
    // goes on taking it as room comes back.
    let mut closed = None;
    let moved = hand_over(session, now, &mut closed);
    let t = session.transport_mut();
    if let Some(c) = closed {
        t.ended = Some((now.saturating_add(CLOSE_LINGER), c));
    }
    let due = t
        .ended
        .as_ref()
        .is_some_and(|(by, _)| *by <= now || t.revisit.is_empty());
    if due && let Some((_, c)) = t.ended.take() {
        let _ = session.handle_event(
            now,
            Event::Closed(Closed {
                code: c.code,
                reason: &c.reason,
                application: c.application,
                cause: c.cause,
            }),
        );
    }
    moved
}

/// [`pump`]'s events and stream data, all but the close, which it leaves
/// in `closed`; stops at the first the session refuses. True if anything
/// was handed over.
fn hand_over<const N: usize>(
    session: &mut Session<'_, '_, '_, N, QuicTransport>,
    now: Instant,
    closed: &mut Option<OwnedClose>,
) -> bool {
    let mut moved = false;
    while let Some(e) = session.transport_mut().events.pop_front() {
        moved = true;
        let event = match e {
            Owned::Established(p) => Event::Established { protocol: p },
            Owned::Stop { id, code } => Event::StopSending {
                id: StreamId(id),
                code,
            },
            Owned::Writable { id } => Event::StreamWritable { id: StreamId(id) },
            Owned::Closed(c) => {
                *closed = Some(c);
                continue;
            }
        };
        if session.handle_event(now, event).is_err() {
            return moved;
        }
    }
    // Streams in the order they became readable; one that cannot take its
    // bytes whole keeps them and stays listed, the others go on.
    let count = session.transport().revisit.len();
    for _ in 0..count {
        let Some(id) = session.transport_mut().revisit.pop_front() else {
            break;
        };
        let keep = loop {
            match session.transport_mut().next_data(id) {
                Next::Nothing => break false,
                Next::Wait => break true,
                Next::Reset { code, final_size } => {
                    moved = true;
                    let event = Event::StreamReset {
                        id: StreamId(id),
                        code,
                        final_size,
                    };
                    if session.handle_event(now, event).is_err() {
                        return moved;
                    }
                    break false;
                }
                Next::Data { offset, data, fin } => {
                    let event = Event::StreamData {
                        id: StreamId(id),
                        offset,
                        data: &data,
                        at: 0,
                        fin,
                    };
                    let Ok(taken) = session.handle_event(now, event) else {
                        return true;
                    };
                    let t = session.transport_mut();
                    let Some(r) = t.recv.get_mut(&id) else {
                        break false;
                    };
                    r.taken += taken as u64;
                    moved |= taken > 0 || (fin && data.is_empty());
                    if taken < data.len() {
                        r.pending = Some(data.slice(taken..));
                        break true;
                    }
                    if fin {
                        r.done = true;
                        break false;
                    }
                }
            }
        };
        let t = session.transport_mut();
        match t.recv.get_mut(&id) {
            Some(_) if keep => t.revisit.push_back(id),
            Some(r) => {
                r.listed = false;
                if r.done {
                    t.recv.remove(&id);
                }
            }
            None => {}
        }
    }
    moved
}

impl Transport for QuicTransport {
    // QUIC delivers each stream in order, not the streams in the order the
    // peer wrote them.
    const ORDERED: bool = false;

    // While the peer's close is held back ([`QuicTransport::ended`]) the
    // session still reads: the connection counts as open to it, and every
    // write or new stream is refused as closed.
    fn is_established(&self) -> bool {
        self.protocol.is_some() && (!self.conn.is_closed() || self.ended.is_some())
    }

    fn is_closed(&self) -> bool {
        self.conn.is_closed() && self.ended.is_none()
    }

    fn is_drained(&self) -> bool {
        self.conn.is_drained() && self.ended.is_none()
    }

    fn open_stream(&mut self, dir: Dir) -> Result<StreamId, OpenError> {
        if self.conn.is_closed() || self.closing.is_some() {
            return Err(OpenError::Closed);
        }
        let d = match dir {
            Dir::Bidi => QuicDir::Bi,
            Dir::Uni => QuicDir::Uni,
        };
        match self.conn.streams().open(d) {
            Some(id) => {
                let id = u64::from(id);
                if d == QuicDir::Bi {
                    self.recv.entry(id).or_default();
                }
                if let Some(session) = self.wt.as_ref().and_then(|w| w.session) {
                    // docs/protocol.md §12: the stream names its session first.
                    let mut header = [0u8; 16];
                    let len = wt::stream_header(d == QuicDir::Bi, session, &mut header);
                    let n = self
                        .conn
                        .send_stream(quic_id(StreamId(id)))
                        .write(&header[..len])
                        .unwrap_or(0);
                    if n < len
                        && let Some(w) = self.wt.as_mut()
                    {
                        w.unsent.insert(id, (header, n, len));
                    }
                }
                Ok(StreamId(id))
            }
            None => Err(OpenError::Limit),
        }
    }

    fn write_stream(
        &mut self,
        now: Instant,
        id: StreamId,
        data: &[u8],
        fin: bool,
        _out: &mut [u8],
    ) -> Result<Written, WriteError> {
        self.now = now;
        self.before_write(id)?;
        let mut stream = self.conn.send_stream(quic_id(id));
        let taken = if data.is_empty() {
            0
        } else {
            match stream.write(data) {
                Ok(n) => n,
                Err(QuicWriteError::Blocked) => {
                    self.blocked.insert(id.0);
                    return Err(WriteError::Blocked);
                }
                Err(QuicWriteError::Stopped(_)) => return Err(WriteError::Reset),
                Err(QuicWriteError::ClosedStream) => return Err(WriteError::UnknownStream),
            }
        };
        if fin && taken == data.len() {
            finish(&mut stream)?;
            self.finishing.insert(id.0);
        }
        Ok(Written {
            data: taken,
            out: 0,
        })
    }

    fn lends(&self) -> bool {
        self.handoff.is_some()
    }

    fn write_stream_ref<F: FnOnce(usize) -> Option<u64>>(
        &mut self,
        now: Instant,
        id: StreamId,
        len: usize,
        fin: bool,
        _out: &mut [u8],
        lend: F,
    ) -> Result<Option<Written>, WriteError> {
        if self.handoff.is_none() || len == 0 {
            return Ok(None);
        }
        self.now = now;
        self.before_write(id)?;
        // The library takes as much as its windows allow and lets go of the
        // rest of the range at once.
        if lend(len).is_none() {
            return Ok(None);
        }
        let Some(bytes) = self.handoff.as_ref().and_then(Handoff::take) else {
            return Ok(None);
        };
        let mut chunks = [bytes];
        let mut stream = self.conn.send_stream(quic_id(id));
        let taken = match stream.write_chunks(&mut chunks) {
            Ok(w) => w.bytes,
            Err(QuicWriteError::Blocked) => {
                self.blocked.insert(id.0);
                return Err(WriteError::Blocked);
            }
            Err(QuicWriteError::Stopped(_)) => return Err(WriteError::Reset),
            Err(QuicWriteError::ClosedStream) => return Err(WriteError::UnknownStream),
        };
        if fin && taken == len {
            finish(&mut stream)?;
            self.finishing.insert(id.0);
        }
        Ok(Some(Written {
            data: taken,
            out: 0,
        }))
    }

    fn set_priority(&mut self, id: StreamId, priority: i32) {
        // A stream the library no longer knows has nothing left to order.
        let _ = self.conn.send_stream(quic_id(id)).set_priority(priority);
    }

    fn send_credit(&self, id: StreamId) -> u64 {
        if self.conn.is_closed() || self.blocked.contains(&id.0) {
            0
        } else {
            STREAM_WINDOW
        }
    }

    fn recv_credit(&self, id: StreamId) -> u64 {
        match self.recv.get(&id.0) {
            Some(r) if !r.done => Self::room(r),
            Some(_) => 0,
            None => STREAM_WINDOW,
        }
    }

    fn release(&mut self, id: StreamId, n: u64) {
        let listed = match self.recv.get_mut(&id.0) {
            Some(r) => {
                r.released = r.released.saturating_add(n);
                r.listed || r.done
            }
            None => true,
        };
        // Room came back: the stream may have bytes the session can take now.
        if !listed {
            self.list(id.0);
        }
    }

    fn reset_stream(&mut self, id: StreamId, code: u64) -> Result<(), StreamError> {
        if self.conn.is_closed() {
            return Err(StreamError::Closed);
        }
        if id.dir() == Dir::Uni && !id.is_local(self.side()) {
            return Err(StreamError::WrongDirection);
        }
        self.blocked.remove(&id.0);
        self.finishing.remove(&id.0);
        let code = wire_code(code);
        self.conn
            .send_stream(quic_id(id))
            .reset(code)
            .map_err(|_| StreamError::UnknownStream)
    }

    fn stop_sending(&mut self, id: StreamId, code: u64) -> Result<(), StreamError> {
        if self.conn.is_closed() {
            return Err(StreamError::Closed);
        }
        if id.dir() == Dir::Uni && id.is_local(self.side()) {
            return Err(StreamError::WrongDirection);
        }
        // Nothing more is read: the entry goes now, unless the stream is
        // listed, whose next visit drops it.
        if self.recv.get(&id.0).is_some_and(|r| r.listed) {
            if let Some(r) = self.recv.get_mut(&id.0) {
                r.done = true;
                r.pending = None;
            }
        } else {
            self.recv.remove(&id.0);
        }
        let code = wire_code(code);
        self.conn
            .recv_stream(quic_id(id))
            .stop(code)
            .map_err(|_| StreamError::UnknownStream)
    }

    fn close(&mut self, code: u64, reason: &str) {
        if self.conn.is_closed() {
            return;
        }
        if let Some(w) = self.wt.as_mut()
            && w.status == WtStatus::Open
            && w.linger.is_none()
            && let Some(id) = w.session
        {
            // docs/protocol.md §12: the close capsule on the CONNECT stream,
            // then the connection closes once it is acknowledged (or after
            // a short linger), with the code mapped.
            let code32 = u32::try_from(code).unwrap_or(0);
            let at = self.now.saturating_add(LINGER);
            let wire = code_to_wire(code32);
            w.linger = Some((at, wire, Bytes::copy_from_slice(reason.as_bytes())));
            w.reported = true;
            self.wt_write(id, wt::close_capsule(code32, reason), true);
            return;
        }
        let reason = Bytes::copy_from_slice(reason.as_bytes());
        if !self.finishing.is_empty() {
            // The streams we finished go out first: the connection closes
            // once the peer acknowledged them, or at the linger's end.
            if self.closing.is_none() {
                self.closing = Some((self.now.saturating_add(CLOSE_LINGER), code, reason));
            }
            return;
        }
        self.close_conn(code, reason);
    }

    fn poll_transmit(&mut self, now: Instant, _out: &mut [u8]) -> usize {
        self.now = now;
        0
    }

    fn poll_timeout(&self) -> Option<Instant> {
        // The library's timers are the driver's ([`QuicTransport::quic_timeout`]).
        None
    }

    fn handle_timeout(&mut self, now: Instant) -> Option<Closed<'static>> {
        self.now = now;
        None
    }
}

impl QuicTransport {
    /// What every write checks first: the connection is open, and on
    /// WebTransport the stream's header went out before anything the
    /// session writes.
    fn before_write(&mut self, id: StreamId) -> Result<(), WriteError> {
        if self.conn.is_closed() || self.closing.is_some() {
            return Err(WriteError::Closed);
        }
        if let Some(w) = self.wt.as_mut()
            && let Some((header, at, len)) = w.unsent.get_mut(&id.0)
        {
            let n = self
                .conn
                .send_stream(quic_id(id))
                .write(&header[*at..*len])
                .unwrap_or(0);
            *at += n;
            if *at < *len {
                self.blocked.insert(id.0);
                return Err(WriteError::Blocked);
            }
            w.unsent.remove(&id.0);
        }
        Ok(())
    }

    /// Which end of the connection this is, in the core's terms.
    pub fn side(&self) -> skiff_core::wire::qmux::Side {
        match self.conn.side() {
            quinn_proto::Side::Client => skiff_core::wire::qmux::Side::Client,
            quinn_proto::Side::Server => skiff_core::wire::qmux::Side::Server,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_codes_map_both_ways() {
        // CANCEL, OLD, EVICTED as moq-dev's QUIC stacks send them.
        assert_eq!(code_to_wire(1), 0x52e4_a40f_a8dc);
        assert_eq!(code_to_wire(0x34), 0x52e4_a40f_a910);
        assert_eq!(code_to_wire(0x35), 0x52e4_a40f_a911);
        for c in [0u32, 1, 0x1d, 0x1e, 0x1f, 0x34, 0x35, 0xffff, u32::MAX] {
            assert_eq!(code_from_wire(code_to_wire(c)), Some(u64::from(c)));
        }
        // Plain codes (moq-relay's io_uring runtime, a dropped reader's 0).
        assert_eq!(code_from_wire(0), Some(0));
        assert_eq!(code_from_wire(0x34), Some(0x34));
        // A reserved point of the mapped range.
        assert_eq!(code_from_wire(H3_FIRST + 0x1e), None);
    }
}
