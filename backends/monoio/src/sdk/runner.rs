//! The task that owns the connection: dial, run the session, dial again.

use std::rc::Rc;

use monoio::net::TcpStream;
use skiff_core::session::{Config as SessionConfig, Error as SessionError, Event, Session};
use skiff_core::transport::Transport;
use skiff_core::wire::lite::{Role, SessionCode, StreamCode};
use skiff_core::wire::qmux::Side;

use super::fetch::FetchPhase;
use super::subscribe::Phase;
use super::{Error, Scheme, Shared};
use crate::cancel::race;
use crate::context::{TcpReader, TcpWriter};
use crate::session_driver::{
    App, ByteRead, ByteWrite, MoqSession, QuicSession, STREAMS, drive, drive_quic, split_halves,
};
use crate::tls::{TlsReader, TlsWriter};

fn timed_out(what: &'static str) -> Error {
    Error::Io(std::io::Error::new(std::io::ErrorKind::TimedOut, what))
}

/// How long a ws:// dial waits for the upgrade's answer (a tls:// or wss://
/// dial for its TLS handshake) when the QMux handshake timeout is off.
const WS_UPGRADE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Socket buffer of a client connection, each way.
const SOCKET_BUFFER: usize = 64 * 1024;

/// How long a session the client closed has to send its close and end
/// before the runner drops it (a peer that stopped reading).
const CLOSE_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Drives a [`super::Client`]'s connection; spawn [`Runner::run`] on the
/// client's runtime (nothing is spawned for you).
#[derive(Debug)]
pub struct Runner {
    shared: Rc<Shared>,
}

impl Runner {
    pub(super) fn new(shared: Rc<Shared>) -> Self {
        Runner { shared }
    }

    /// Connects and keeps the connection up until the client is closed:
    /// after a session that reached SETUP it dials again after
    /// [`super::Config::backoff_min`]; after a failed attempt, after the
    /// current backoff, which doubles up to [`super::Config::backoff_max`].
    ///
    /// Closing the client stops a dial at once; a running session sends
    /// its close and ends (within two seconds), and `run` returns once
    /// its connection, reader task included, is gone.
    pub async fn run(self) {
        let s = &*self.shared;
        s.running.set(true);
        let mut backoff = s.config.backoff_min;
        while !s.closed.get() {
            let before = s.sessions.get();
            s.close_reason.borrow_mut().clear();
            let outcome = self.connect_once().await;
            if s.closed.get() {
                break;
            }
            match outcome {
                Ok(()) if s.sessions.get() == before => {
                    // A server that closes before SETUP (a TLS port dialed in
                    // plain text, a refused token) is a failed attempt.
                    let reason = s.close_reason.borrow();
                    let text = if reason.is_empty() {
                        "the server closed the connection before the session was set up".to_owned()
                    } else {
                        format!("the connection closed before the session was set up: {reason}")
                    };
                    let e = Error::Io(std::io::Error::new(
                        std::io::ErrorKind::ConnectionAborted,
                        text,
                    ));
                    tracing::debug!(url = %s.target.url, error = %e, "connection failed");
                    *s.last_error.borrow_mut() = Some(Rc::new(e));
                }
                Ok(()) => tracing::debug!(url = %s.target.url, "session ended"),
                Err(e) => {
                    tracing::debug!(url = %s.target.url, error = %e, "connection failed");
                    *s.last_error.borrow_mut() = Some(Rc::new(e));
                }
            }
            let wait = if s.sessions.get() != before {
                backoff = s.config.backoff_min;
                backoff
            } else {
                let wait = backoff;
                backoff = backoff.saturating_mul(2).min(s.config.backoff_max);
                wait
            };
            let _ = race(monoio::time::sleep(wait), self.closed()).await;
        }
        s.running.set(false);
        s.connected.set(false);
        s.wake_all();
        s.passed();
    }

    /// Resolves once the client is closed.
    async fn closed(&self) {
        self.shared.wait_until(|s| s.closed.get()).await;
    }

    /// `dial`'s outcome, or `None` if the client was closed first.
    async fn dial<F: std::future::Future>(&self, dial: F) -> Option<F::Output> {
        race(dial, self.closed()).await.ok()
    }

    /// One connection, from the dial to the end of its session; `Ok` at
    /// once if the client is closed while dialing.
    async fn connect_once(&self) -> Result<(), Error> {
        let s = &*self.shared;
        match s.target.scheme {
            Scheme::Tcp => {
                let addr = s.target.resolve()?;
                let Some(stream) = self.dial(TcpStream::connect(addr)).await else {
                    return Ok(());
                };
                let stream = stream?;
                let _ = stream.set_nodelay(true);
                let (reader, writer) = split_halves(stream, SOCKET_BUFFER);
                self.run_session(reader, writer, Some(&s.target.path), None)
                    .await
            }
            Scheme::Ws => {
                let (timeout, max, target) = self.ws_params();
                let Some(dialed) = self
                    .dial(crate::ws::dial(&s.target.host, &target, timeout, max))
                    .await
                else {
                    return Ok(());
                };
                let (reader, writer, chosen) = dialed?;
                // docs/protocol.md §9.2: the subprotocol names the application protocol;
                // none chosen leaves it to the transport parameters, as on TCP.
                let fixed = chosen.is_some().then_some(skiff_ws::APPLICATION);
                // §9.3: the path is the request URI, not repeated in SETUP.
                self.run_session(reader, writer, None, fixed).await
            }
            Scheme::Quic | Scheme::WebTransport => self.run_quic().await,
            Scheme::Tls => {
                let Some(dialed) = self.dial(self.dial_tls()).await else {
                    return Ok(());
                };
                let (reader, writer) = dialed?;
                // docs/protocol.md §9.8: the ALPN name fixes the application
                // protocol; none agreed leaves it to the transport parameters.
                let fixed = (reader.alpn().as_deref() == Some(crate::tls::ALPN_QMUX))
                    .then_some(skiff_ws::APPLICATION);
                self.run_session(reader, writer, Some(&s.target.path), fixed)
                    .await
            }
            Scheme::Wss => {
                let Some(dialed) = self.dial(self.dial_tls()).await else {
                    return Ok(());
                };
                let (reader, writer) = dialed?;
                let (timeout, max, target) = self.ws_params();
                let upgrade = crate::ws::upgrade(reader, writer, &s.target.host, &target, max);
                let Some(upgraded) = self.dial(race(upgrade, monoio::time::sleep(timeout))).await
                else {
                    return Ok(());
                };
                let (reader, writer, chosen) = match upgraded {
                    Ok(res) => res.map_err(Error::from_transport)?,
                    Err(()) => return Err(timed_out("no websocket upgrade answer in time")),
                };
                let fixed = chosen.is_some().then_some(skiff_ws::APPLICATION);
                self.run_session(reader, writer, None, fixed).await
            }
        }
    }

    /// The upgrade's time limit, the largest message and the request target of a WebSocket dial.
    fn ws_params(&self) -> (std::time::Duration, usize, String) {
        let s = &*self.shared;
        let transport = s.ctx.transport();
        let timeout = self.handshake_limit();
        let max = usize::try_from(transport.max_record_size).unwrap_or(usize::MAX);
        let target = if s.target.path.starts_with('/') {
            s.target.path.clone()
        } else {
            format!("/{}", s.target.path)
        };
        (timeout, max, target)
    }

    /// How long a TLS handshake or WebSocket upgrade may take: the QMux
    /// handshake timeout, or [`WS_UPGRADE_TIMEOUT`] when that is off.
    fn handshake_limit(&self) -> std::time::Duration {
        match crate::clock::to_std(self.shared.ctx.transport().handshake_timeout) {
            t if t.is_zero() => WS_UPGRADE_TIMEOUT,
            t => t,
        }
    }

    /// Connects over TCP and runs the TLS handshake with the URL's host as
    /// the server name, within [`Runner::handshake_limit`].
    async fn dial_tls(&self) -> Result<(TlsReader<TcpReader>, TlsWriter<TcpWriter>), Error> {
        let s = &*self.shared;
        let config = s
            .tls
            .clone()
            .ok_or_else(|| Error::Io(std::io::Error::other("no TLS configuration")))?;
        let conn = crate::tls::client_connection(config, crate::tls::host_of(&s.target.host))?;
        let addr = s.target.resolve()?;
        let stream = TcpStream::connect(addr).await?;
        let _ = stream.set_nodelay(true);
        let (reader, writer) = split_halves(stream, SOCKET_BUFFER);
        let handshake = crate::tls::handshake(conn, reader, writer);
        match race(handshake, monoio::time::sleep(self.handshake_limit())).await {
            Ok(res) => res.map_err(Error::from_transport),
            Err(()) => Err(timed_out("no TLS handshake in time")),
        }
    }

    /// Dials the relay over QUIC from an endpoint of its own and runs one
    /// session over the connection (docs/protocol.md §11).
    async fn run_quic(&self) -> Result<(), Error> {
        let s = &*self.shared;
        let tls = s
            .tls
            .clone()
            .ok_or_else(|| Error::Io(std::io::Error::other("no TLS configuration")))?;
        let webtransport = s.target.scheme == Scheme::WebTransport;
        let config = if webtransport {
            skiff_quic::config::client_config_webtransport(tls, crate::session_driver::STREAMS)
        } else {
            skiff_quic::config::client_config(tls, crate::session_driver::STREAMS)
        }
        .map_err(|e| Error::Io(std::io::Error::other(e)))?;
        let addr = s.target.resolve()?;
        let clock = s.ctx.drive.clock;
        let endpoint = crate::quic::Endpoint::client(addr, clock)?;
        let (conn, mut link) =
            endpoint.connect(config, addr, crate::tls::host_of(&s.target.host))?;
        let receiving = monoio::spawn(endpoint.clone().run());
        let transport = if webtransport {
            self.webtransport(conn, &mut link).await
        } else {
            Ok(skiff_quic::QuicTransport::new(conn, clock.epoch()))
        };
        let transport = match transport {
            Ok(t) => t,
            Err(e) => {
                endpoint.stop();
                drop(receiving);
                return Err(e);
            }
        };
        let mut storage = s.ctx.take_storage();
        let res = {
            let config = SessionConfig {
                conn: s.ctx.transport(),
                // §12: over WebTransport the path rode in the CONNECT.
                path: (!webtransport).then_some(s.target.path.as_str()),
                role: Role::Both,
                ..SessionConfig::new()
            };
            let session: Result<QuicSession<'_, STREAMS>, _> = Session::with_transport(
                Side::Client,
                config,
                transport,
                clock.now(),
                &mut *storage,
                Some(s.origin),
            );
            match session {
                Ok(session) => {
                    let mut app = SessionApp::new(&self.shared);
                    let driven = drive_quic(Box::new(session), (), link, &mut app, &s.ctx.drive);
                    self.until_closed(driven).await
                }
                Err(e) => Err(std::io::Error::other(e)),
            }
        };
        endpoint.stop();
        drop(receiving);
        s.ctx.give_storage(storage);
        res.map_err(Error::from_transport)
    }

    /// Sets up a WebTransport session on `conn` (docs/protocol.md §12): the
    /// QUIC handshake, the SETTINGS and the CONNECT for the URL's path and
    /// query, answered 200 with moq-lite-05, within the handshake limit.
    async fn webtransport(
        &self,
        conn: skiff_quic::quinn_proto::Connection,
        link: &mut crate::quic::Link,
    ) -> Result<skiff_quic::QuicTransport, Error> {
        let s = &*self.shared;
        let clock = s.ctx.drive.clock;
        let (_, _, target) = self.ws_params();
        let mut transport = skiff_quic::QuicTransport::webtransport_client(
            conn,
            clock.epoch(),
            &s.target.host,
            &target,
        )
        .ok_or_else(|| Error::InvalidUrl {
            url: s.target.url.clone(),
            reason: "not an https URL",
        })?;
        let by = clock.now() + crate::clock::to_core(self.handshake_limit());
        let status =
            crate::session_driver::drive_webtransport(&mut transport, link, clock, by, |t| {
                t.wt_status() != Some(skiff_quic::WtStatus::Handshaking)
            })
            .await;
        match status {
            skiff_quic::WtStatus::Open => Ok(transport),
            skiff_quic::WtStatus::Refused(code) => Err(Error::Io(std::io::Error::other(format!(
                "WebTransport CONNECT refused with status {code}"
            )))),
            skiff_quic::WtStatus::Handshaking | skiff_quic::WtStatus::Requested => {
                Err(timed_out("no WebTransport session in time"))
            }
            skiff_quic::WtStatus::Failed => Err(Error::Io(std::io::Error::other(
                "WebTransport session not set up",
            ))),
        }
    }

    /// Runs a driven session to its end. Closing the client closes the
    /// session (its drain signal), which then ends on its own, its close
    /// sent; one that has not ended [`CLOSE_GRACE`] after is dropped.
    async fn until_closed(
        &self,
        driven: impl std::future::Future<Output = std::io::Result<crate::session_driver::Ended>>,
    ) -> std::io::Result<()> {
        let grace = async {
            self.closed().await;
            monoio::time::sleep(CLOSE_GRACE).await;
        };
        match race(driven, grace).await {
            Ok(ended) => ended.map(|_| ()),
            Err(()) => {
                tracing::debug!(url = %self.shared.target.url, "closed session dropped after the grace");
                Ok(())
            }
        }
    }

    /// Runs one session over a connected transport.
    async fn run_session<R: ByteRead, W: ByteWrite>(
        &self,
        reader: R,
        writer: W,
        path: Option<&str>,
        fixed_protocol: Option<&'static str>,
    ) -> Result<(), Error> {
        let s = &*self.shared;
        let mut storage = s.ctx.take_storage();
        let res = {
            let config = SessionConfig {
                conn: skiff_core::conn::Config {
                    fixed_protocol,
                    ..s.ctx.transport()
                },
                path,
                role: Role::Both,
                ..SessionConfig::new()
            };
            let session: Result<MoqSession<'_>, _> = Session::new(
                Side::Client,
                config,
                s.ctx.drive.clock.now(),
                &mut *storage,
                Some(s.origin),
            );
            match session {
                Ok(session) => {
                    let mut app = SessionApp::new(&self.shared);
                    let driven = drive(
                        Box::new(session),
                        (),
                        reader,
                        writer,
                        &mut app,
                        &s.ctx.drive,
                    );
                    self.until_closed(driven).await
                }
                Err(e) => Err(std::io::Error::other(e)),
            }
        };
        s.ctx.give_storage(storage);
        res.map_err(Error::from_transport)
    }
}

/// Broadcasts whose announcements a session asks for by name before it asks
/// for every announcement under its root instead.
const NAMED_ANNOUNCE_REQUESTS: usize = 4;

/// The client's requests on one session: announcements asked for and seen.
struct SessionApp<'c> {
    shared: &'c Shared,
    /// Broadcasts whose announcement this session asked for.
    asked: Vec<String>,
    /// The session asked for every announcement under its root
    /// ([`NAMED_ANNOUNCE_REQUESTS`]).
    asked_all: bool,
    /// Broadcasts announced in this session.
    announced: Vec<String>,
    /// The relay sent GOAWAY: the session closes at the next turn and the
    /// runner dials again (docs/protocol.md §3.12).
    going_away: bool,
}

impl<'c> SessionApp<'c> {
    /// The app of a new session of the client sharing `shared`.
    fn new(shared: &'c Shared) -> Self {
        SessionApp {
            shared,
            asked: Vec::new(),
            asked_all: false,
            announced: Vec::new(),
            going_away: false,
        }
    }

    /// The subscription a fetch can be told about by `event`, if any.
    fn subscription_of(event: &Event<'_>) -> Option<skiff_core::session::SubscriptionId> {
        match *event {
            Event::TrackInfo { subscription, .. }
            | Event::Group { subscription, .. }
            | Event::SubscriptionClosed { subscription, .. } => Some(subscription),
            _ => None,
        }
    }

    /// What `event` about fetch `f`'s subscription does to it.
    fn on_fetch_event(f: &super::fetch::Fetched, event: &Event<'_>) {
        match *event {
            // The fetched group's timestamps are in the publisher's timescale.
            Event::TrackInfo { info, .. } => f.local().set_info(info),
            Event::Group { subscription, .. } => {
                f.phase.set(FetchPhase::Arrived(subscription));
                f.wake();
            }
            Event::SubscriptionClosed { code, .. } => {
                let next = match (f.phase.get(), code) {
                    (FetchPhase::Requested(_), Some(c)) => FetchPhase::Refused(c),
                    // The group's end (or its abort) is in the local track.
                    _ => FetchPhase::Done,
                };
                f.phase.set(next);
                f.wake();
            }
            _ => {}
        }
    }

    /// The fetch `id` of this session belongs to.
    fn find_fetch(
        &self,
        id: skiff_core::session::SubscriptionId,
    ) -> Option<Rc<super::fetch::Fetched>> {
        self.shared
            .fetches
            .borrow()
            .iter()
            .find(|f| f.id() == Some(id))
            .cloned()
    }

    /// The subscription `id` of this session belongs to, and its phase.
    fn find(
        &self,
        id: skiff_core::session::SubscriptionId,
    ) -> Option<Rc<super::subscribe::Wanted>> {
        self.shared
            .wanted
            .borrow()
            .iter()
            .find(|w| matches!(w.phase.get(), Phase::Requested(x) | Phase::Active(x) if x == id))
            .cloned()
    }
}

impl SessionApp<'_> {
    /// Sends the fetches waiting for a session, and cancels and lets go of
    /// the ones whose reader is gone.
    fn act_fetches<X: Transport>(
        &mut self,
        session: &mut Session<'_, 'static, 'static, STREAMS, X>,
    ) {
        let shared = self.shared;
        if shared.fetches.borrow().iter().any(|f| f.dropped.get()) {
            let gone: Vec<_> = {
                let mut fetches = shared.fetches.borrow_mut();
                let (gone, kept) = fetches.drain(..).partition(|f| f.dropped.get());
                *fetches = kept;
                gone
            };
            for f in gone {
                if let Some(id) = f.id() {
                    let _ = session.unsubscribe(id);
                }
                shared.ctx.release(f.local());
            }
        }
        let mut i = 0;
        while let Some(f) = shared.fetches.borrow().get(i).cloned() {
            i += 1;
            if f.phase.get() != FetchPhase::Waiting {
                continue;
            }
            match session.fetch(&f.broadcast, f.local(), f.group, f.priority) {
                Ok(id) => f.phase.set(FetchPhase::Requested(id)),
                // Control streams or subscription slots taken: the next turn.
                Err(SessionError::ControlFull | SessionError::SubscriptionsFull) => {}
                Err(_) => {
                    f.phase
                        .set(FetchPhase::Refused(StreamCode::Internal.to_code()));
                    f.wake();
                }
            }
        }
    }
}

impl App for SessionApp<'_> {
    fn on_event(&mut self, event: &Event<'_>) {
        if let Some(f) = Self::subscription_of(event).and_then(|id| self.find_fetch(id)) {
            Self::on_fetch_event(&f, event);
            return;
        }
        match *event {
            Event::Closed { reason, .. } if !reason.is_empty() => {
                let mut kept = self.shared.close_reason.borrow_mut();
                kept.clear();
                kept.push_str(reason);
            }
            Event::Setup { .. } => {
                self.shared.sessions.set(self.shared.sessions.get() + 1);
                self.shared.connected.set(true);
                self.shared.last_error.borrow_mut().take();
            }
            Event::Announced { path, .. } if !self.announced.iter().any(|p| p == path) => {
                self.announced.push(path.to_owned());
            }
            Event::Unannounced { path, .. } => self.announced.retain(|p| p != path),
            Event::Goaway { .. } => self.going_away = true,
            Event::TrackInfo { subscription, .. } | Event::Started { subscription, .. } => {
                if let Some(w) = self.find(subscription) {
                    // The local track takes the publisher's timescale and max
                    // age: its cache judges a group stale in the timestamps'
                    // own units (docs/protocol.md §4.7), not in the defaults.
                    if let Event::TrackInfo { info, .. } = *event {
                        w.local().set_info(info);
                    }
                    w.phase.set(Phase::Active(subscription));
                    w.accepted.set(true);
                    w.wake();
                }
            }
            Event::SubscriptionClosed { subscription, code } => {
                let Some(w) = self.find(subscription) else {
                    return;
                };
                let was = w.phase.get();
                let next = match code {
                    None => Phase::Finished,
                    Some(c) if !w.accepted.get() => Phase::Refused(c),
                    Some(_) => {
                        // Refused on a retry: wait for the broadcast's next
                        // announcement (a new source) before asking again.
                        if matches!(was, Phase::Requested(_)) {
                            self.announced.retain(|p| *p != w.broadcast);
                        }
                        Phase::Waiting
                    }
                };
                w.phase.set(next);
                w.wake();
            }
            _ => {}
        }
    }

    fn act<X: Transport>(&mut self, session: &mut Session<'_, 'static, 'static, STREAMS, X>) {
        let shared = self.shared;
        if std::mem::take(&mut self.going_away) {
            // A draining relay waits for its clients to leave: leave now,
            // and the runner dials again (to the same URL: the relay's
            // restart or a sibling behind its address takes the session).
            session.close(SessionCode::NoError, "goaway");
        }
        if session.is_setup() && session.is_established() && !session.is_closed() {
            // Subscriptions the application dropped.
            if shared.wanted.borrow().iter().any(|w| w.dropped.get()) {
                let gone: Vec<_> = {
                    let mut wanted = shared.wanted.borrow_mut();
                    let (gone, kept) = wanted.drain(..).partition(|w| w.dropped.get());
                    *wanted = kept;
                    gone
                };
                for w in gone {
                    if let Phase::Requested(id) | Phase::Active(id) = w.phase.get() {
                        let _ = session.unsubscribe(id);
                    }
                    shared.ctx.release(w.local());
                }
            }
            self.act_fetches(session);
            // By index: a request may not hold the list borrowed.
            let mut i = 0;
            while let Some(w) = shared.wanted.borrow().get(i).cloned() {
                i += 1;
                if w.phase.get() != Phase::Waiting {
                    continue;
                }
                // A few broadcasts' announcements are asked for by name (the
                // relay sends only theirs); past [`NAMED_ANNOUNCE_REQUESTS`]
                // the session asks once for everything under its root, which
                // answers for every broadcast: each request holds one of the
                // session's few control-stream buffers for its life.
                if !self.asked_all && !self.asked.contains(&w.broadcast) {
                    let by_name = self.asked.len() < NAMED_ANNOUNCE_REQUESTS;
                    let prefix = if by_name { w.broadcast.as_str() } else { "" };
                    match session.announce_request(prefix) {
                        Ok(_) if by_name => self.asked.push(w.broadcast.clone()),
                        Ok(_) => self.asked_all = true,
                        // Control streams taken (their buffers may free as
                        // messages go out): asked again at the next turn.
                        Err(_) => {}
                    }
                }
                if self.announced.contains(&w.broadcast) {
                    let local = w.fresh_local();
                    match session.subscribe(&w.broadcast, local, w.request) {
                        Ok(id) => w.phase.set(Phase::Requested(id)),
                        // Every subscription slot holds a live subscription of
                        // this client: a first request fails, typed; one
                        // accepted before (asked again in a new session)
                        // waits for a slot.
                        Err(SessionError::SubscriptionsFull) if !w.accepted.get() => {
                            w.phase.set(Phase::Full);
                        }
                        // Control streams taken (transient): the next turn.
                        Err(_) => {}
                    }
                    // The consumer follows the new local track.
                    w.wake();
                }
            }
        }
        shared.passed();
    }

    fn on_close(&mut self) {
        let shared = self.shared;
        shared.connected.set(false);
        // A fetch under way ends with its session: its track was aborted.
        for f in shared.fetches.borrow().iter() {
            match f.phase.get() {
                FetchPhase::Requested(_) => {
                    f.phase
                        .set(FetchPhase::Refused(StreamCode::SessionClosed.to_code()));
                }
                FetchPhase::Arrived(_) => f.phase.set(FetchPhase::Done),
                _ => {}
            }
        }
        for w in shared.wanted.borrow().iter() {
            if let Phase::Requested(_) | Phase::Active(_) = w.phase.get() {
                w.phase.set(Phase::Waiting);
            }
        }
        shared.wake_all();
    }
}
