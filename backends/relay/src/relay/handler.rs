//! The per-worker connection handler ([`RelayHandler`]): builds the worker's
//! [`Relay`], serves accepted connections (TLS, HTTP and WebSocket, or QMux
//! over TCP) and starts the worker's links and upstream dials.

use super::*;

/// Serves moq-lite sessions on one worker thread with a per-thread [`Relay`].
/// A clone shares the worker's state (a task of the worker holds one).
#[derive(Debug, Clone)]
pub struct RelayHandler {
    pub(super) relay: Rc<Relay>,
    /// A client session's control tables, taken at accept.
    pub(super) storage: Rc<StoragePool<ServerStorage>>,
    /// Its media tables, taken at its SETUP for the directions it uses.
    pub(super) sides: Rc<SidePools>,
    pub(super) clock: Clock,
    /// The access policy, shared by every worker.
    pub(super) auth: Arc<Auth>,
    /// The listen port's TLS configuration (`--tls-cert` or
    /// `--tls-generate`), shared by every worker; `None`: plain TCP.
    pub(super) tls: Option<Arc<TlsServer>>,
    /// The directory the web player is served from.
    pub(super) web_dir: std::path::PathBuf,
    /// The recording directory `GET /recordings` lists (`--record-dir`).
    pub(super) record_dir: Option<std::path::PathBuf>,
}

impl RelayHandler {
    /// The handler of the worker described by `info`, with the access policy
    /// `auth` (shared by the workers), without links to other workers,
    /// without its upstream and in plain TCP (see [`RelayHandler::with_tls`]).
    pub fn with_auth(info: &WorkerInfo, auth: Arc<Auth>) -> Self {
        let notify = Notify::shared();
        // One Hop ID for every worker of the relay (docs/protocol.md §4.3).
        let hop = info.config.hop_id();
        let clock = Clock::new();
        let mut relay = Relay::new(hop, &info.config, notify, clock);
        relay.metrics = Some((info.metrics.clone(), info.index));
        RelayHandler {
            relay: Rc::new(relay),
            storage: Rc::new(StoragePool::new()),
            sides: Rc::new(SidePools::new()),
            clock,
            auth,
            tls: None,
            web_dir: info.config.web_dir.clone(),
            record_dir: info.config.record.as_ref().map(|r| r.dir.clone()),
        }
    }

    /// Serves TLS only on the listen port with `tls` (docs/protocol.md §9.8).
    #[must_use]
    pub fn with_tls(mut self, tls: Option<Arc<TlsServer>>) -> Self {
        self.tls = tls;
        self
    }

    /// A handler factory for `threads` workers linked pairwise (see
    /// [`Mesh`]), each dialing the configured upstream relay if there is one:
    /// pass it to [`crate::server::start`]. With TLS in the configuration,
    /// the files are read (or the certificate made) when the first worker
    /// starts (see
    /// [`RelayHandler::factory_with_tls`] to keep a handle for reloads).
    ///
    /// # Errors
    /// If a socket pair cannot be made.
    pub fn factory(
        threads: usize,
    ) -> io::Result<impl Fn(&WorkerInfo) -> RelayHandler + Send + Sync + 'static> {
        Self::factory_with_tls(threads, None)
    }

    /// As [`RelayHandler::factory`], the workers serving TLS with `tls`
    /// (which the caller keeps to [`TlsServer::reload`]); `None` reads the
    /// configuration's files, or makes its `--tls-generate` certificate, if
    /// it has either.
    ///
    /// # Errors
    /// If a socket pair cannot be made.
    pub fn factory_with_tls(
        threads: usize,
        tls: Option<Arc<TlsServer>>,
    ) -> io::Result<impl Fn(&WorkerInfo) -> RelayHandler + Send + Sync + 'static> {
        let mesh = Arc::new(Mesh::new(threads)?);
        let auth = std::sync::OnceLock::new();
        let loaded = std::sync::OnceLock::new();
        let upstream_url = std::sync::OnceLock::new();
        let upstream_tls_config = std::sync::OnceLock::new();
        let cluster = std::sync::OnceLock::new();
        Ok(move |info: &WorkerInfo| {
            let auth = auth.get_or_init(|| Arc::new(auth_policy(info))).clone();
            let tls = tls
                .clone()
                .or_else(|| loaded.get_or_init(|| tls_server(info)).clone());
            let h = RelayHandler::with_auth(info, auth).with_tls(tls);
            for (peer, end) in mesh.take(info.index) {
                h.spawn_link(info, peer, end);
            }
            if let Some(up) = &info.config.upstream {
                let url = *upstream_url.get_or_init(|| dialed_upstream_url(info, up));
                let tls = up.scheme.is_secure().then(|| {
                    upstream_tls_config
                        .get_or_init(|| upstream_tls(info, up.scheme))
                        .clone()
                });
                h.spawn_upstream(info, up.clone(), url, tls);
            }
            let cluster = cluster
                .get_or_init(|| Cluster::start(&info.config, info.metrics.clone()))
                .clone();
            if let Some(cluster) = cluster {
                h.spawn_cluster(info, cluster);
            }
            if info.index == 0 {
                crate::record::start(info, h.relay.origin(), h.tls.as_ref());
            }
            h
        })
    }

    /// This worker's relay state.
    pub fn relay(&self) -> &Rc<Relay> {
        &self.relay
    }

    pub(super) fn drive_ctx(&self, info: &WorkerInfo) -> DriveCtx {
        DriveCtx {
            clock: self.clock,
            notify: self.relay.notify.clone(),
            shutdown: Some(info.shutdown.clone()),
        }
    }
}

/// The access policy of `info`'s configuration, its start-up state logged.
/// Keys that became unusable since the configuration was checked refuse
/// every session rather than open the relay.
fn auth_policy(info: &WorkerInfo) -> Auth {
    let cfg = &info.config.auth;
    match cfg.build() {
        Ok(auth) if auth.is_open() => {
            tracing::warn!(
                "no --auth-key, --auth-key-dir or --auth-public: the relay is open to everyone"
            );
            auth
        }
        Ok(auth) => {
            let public: Vec<&str> = cfg.public.iter().map(|p| p.as_str()).collect();
            tracing::info!(
                key = ?cfg.key.as_ref().or(cfg.key_dir.as_ref()),
                public = %public.join(","),
                "access control on"
            );
            auth
        }
        Err(e) => {
            tracing::error!(error = %e, "auth keys unusable: every session is refused");
            Auth::refuse_all()
        }
    }
}

/// The TLS server of `info`'s configuration, if it names certificate files
/// or hosts to generate one for. A certificate that became unusable since
/// the configuration was checked makes every handshake fail rather than
/// open the port in plain text.
fn tls_server(info: &WorkerInfo) -> Option<Arc<TlsServer>> {
    let source = info.config.tls_source()?;
    match TlsServer::load(source.clone()) {
        Ok(tls) => {
            let sha256 = tls.cert().fingerprint_hex().unwrap_or_default();
            if tls.on_tcp() {
                tracing::info!(cert = %source, sha256 = %sha256, "TLS on the listen port (TCP and QUIC)");
            } else {
                tracing::info!(cert = %source, sha256 = %sha256, "certificate for QUIC; the TCP port stays plain");
            }
            Some(Arc::new(tls))
        }
        Err(e) => {
            tracing::error!(error = %e, "TLS certificate unusable: every connection is refused");
            Some(Arc::new(TlsServer::refusing(source)))
        }
    }
}

impl ConnectionHandler for RelayHandler {
    type Error = io::Error;

    fn quic_config(&self) -> Option<Arc<QuicServerConfig>> {
        let tls = self.tls.as_ref()?.config()?;
        let mut tls = (*tls).clone();
        // docs/protocol.md §12.1: moq-lite-05 first, then HTTP/3 for
        // WebTransport.
        tls.alpn_protocols = skiff_quic::config::alpn_protocols_with_h3();
        // QUIC takes no early data from rustls (0-RTT is off).
        tls.max_early_data_size = 0;
        match skiff_quic::config::server_config_webtransport(Arc::new(tls), STREAMS) {
            Ok(c) => Some(Arc::new(c)),
            Err(e) => {
                tracing::error!(error = %e, "QUIC not served");
                None
            }
        }
    }

    #[allow(clippy::manual_async_fn)]
    fn serve_quic(
        self: Rc<Self>,
        conn: QuicConn,
    ) -> impl Future<Output = io::Result<()>> + 'static {
        async move {
            let QuicConn {
                mut conn,
                mut link,
                name,
                shutdown,
                handshake,
                handshake_timeout,
                send_budget,
                ..
            } = conn;
            let ctx = DriveCtx {
                clock: self.clock,
                notify: self.relay.notify.clone(),
                shutdown: Some(shutdown),
            };
            // docs/protocol.md §11.8: the QUIC handshake and the client's
            // SETUP within the handshake timeout of the accept, or the
            // session closes with CONTROL_MESSAGE_TIMEOUT.
            let setup_by = self.clock.now() + skiff_monoio::clock::to_core(handshake_timeout);
            let by = std::time::Instant::now() + handshake_timeout;
            if !quic_handshake(&mut conn, &mut link, by).await {
                tracing::debug!(conn = ?name, "QUIC handshake not completed");
                return Ok(());
            }
            if skiff_quic::transport::negotiated_alpn(&conn).as_deref()
                == Some(skiff_quic::webtransport::ALPN_H3.as_bytes())
            {
                let served = self.serve_webtransport(
                    &name,
                    conn,
                    link,
                    setup_by,
                    handshake,
                    send_budget,
                    ctx,
                );
                return Box::pin(served).await;
            }
            let transport = Box::new(QuicTransport::new(*conn, ctx.clock.epoch()));
            let ended = Box::pin(self.serve_quic_session(
                &name,
                transport,
                None,
                link,
                setup_by,
                handshake,
                send_budget,
                ctx,
            ))
            .await?;
            tracing::debug!(conn = ?name, ?ended, "QUIC session ended");
            Ok(())
        }
    }

    #[allow(clippy::manual_async_fn)]
    fn serve(self: Rc<Self>, conn: Connection) -> impl Future<Output = io::Result<()>> + 'static {
        async move {
            let name = conn.name();
            let ctx = DriveCtx {
                clock: self.clock,
                notify: self.relay.notify.clone(),
                shutdown: Some(conn.shutdown()),
            };
            let (mut reader, mut writer) = conn.into_split();
            // Nothing is taken for a connection before it sends something.
            // Boxed: the wait (a timer and a read in flight) ends with the
            // first bytes, so the task, which lives as long as the
            // connection, does not carry its state.
            if !Box::pin(reader.wait_first()).await? {
                tracing::debug!(conn = ?name, "connection closed before it sent anything");
                return Ok(());
            }
            let Some(tls) = self.tls.clone().filter(|t| t.on_tcp()) else {
                return self.serve_stream(&name, reader, writer, None, ctx).await;
            };
            reader.set_transport(TransportLabel::Tls);
            writer.set_transport(TransportLabel::Tls);
            // The TLS state lives in an allocation of its own, so a
            // connection still waiting for its first byte holds only the
            // small future above.
            Box::pin(self.clone().serve_tls(name, tls, reader, writer, ctx)).await
        }
    }
}

impl RelayHandler {
    /// Serves an accepted connection whose first bytes arrived on a TLS
    /// listen port: the handshake (docs/protocol.md §9.8), then
    /// [`RelayHandler::serve_stream`] on the plaintext.
    async fn serve_tls(
        self: Rc<Self>,
        mut name: ConnName,
        tls: Arc<TlsServer>,
        reader: crate::conn::Reader,
        writer: crate::conn::Writer,
        ctx: DriveCtx,
    ) -> io::Result<()> {
        // docs/protocol.md §9.8: TLS first, within the handshake timeout;
        // then the same choice between QMux and HTTP on the plaintext.
        let limit = reader.handshake_timeout();
        let Some(config) = tls.config() else {
            tracing::info!(conn = ?name, "no usable TLS certificate; connection closed");
            return Ok(());
        };
        let handshake = match rustls::ServerConnection::new(config) {
            Ok(conn) => skiff_monoio::tls::handshake(conn, reader, writer),
            Err(e) => {
                tracing::warn!(conn = ?name, error = %e, "TLS: cannot start a handshake");
                return Ok(());
            }
        };
        // Bounded by the handshake timeout, and abandoned when the server drains.
        let bounded = race(handshake, monoio::time::sleep(limit));
        let drain = ctx.shutdown.clone();
        let drained = async move {
            match &drain {
                Some(d) => d.wait().await,
                None => std::future::pending().await,
            }
        };
        let (reader, writer) = match race(bounded, drained).await {
            Ok(Ok(Ok(halves))) => halves,
            Ok(Ok(Err(e))) => {
                // One line per refused connection (a plaintext client, an
                // untrusted certificate on the client's side...).
                tracing::info!(conn = ?name, error = %e, "TLS handshake failed; connection closed");
                return Ok(());
            }
            Ok(Err(())) => {
                tracing::info!(
                    conn = ?name,
                    "TLS handshake not finished in {limit:?}; connection closed"
                );
                return Ok(());
            }
            Err(()) => {
                tracing::debug!(conn = ?name, "draining: TLS handshake abandoned");
                return Ok(());
            }
        };
        // qmux's ALPN name fixes the application protocol (no
        // application_protocols parameter then); none or HTTP/1.1 leaves
        // it to the bytes that follow.
        let fixed = (reader.alpn().as_deref() == Some(skiff_monoio::tls::ALPN_QMUX))
            .then_some(skiff_ws::APPLICATION);
        name = name.over_tls();
        self.serve_stream(&name, reader, writer, fixed, ctx).await
    }
}

impl RelayHandler {
    /// Serves an accepted byte stream (plain TCP, or TLS once its handshake
    /// is done) whose first bytes arrived or are on their way: QMux, or HTTP
    /// and WebSocket (docs/protocol.md §9.1). `fixed_protocol` is the
    /// application protocol TLS ALPN agreed on for QMux.
    async fn serve_stream<R: HeadRead + SetTransport, W: ByteWrite + SetTransport>(
        self: &Rc<Self>,
        name: &ConnName,
        mut reader: R,
        writer: W,
        fixed_protocol: Option<&'static str>,
        ctx: DriveCtx,
    ) -> io::Result<()> {
        // docs/protocol.md §9.1: three capitals start an HTTP request;
        // anything else is QMux over TCP (decided on at most three bytes).
        let limit = reader
            .guard()
            .handshake
            .unwrap_or(StdDuration::from_secs(10));
        let http = loop {
            match skiff_ws::http::is_http_start(reader.pending()) {
                Some(http) => break http,
                None => {
                    // Boxed: a first read of fewer than three bytes is rare,
                    // and the task should not carry this wait's state.
                    if !Box::pin(reader.read_more(3, limit)).await? {
                        return Ok(());
                    }
                }
            }
        };
        if !http {
            // The session's state (its future, its tables) exists only from
            // here on, in an allocation of its own: a connection waiting for
            // its first byte holds just the small future above.
            let ended = Box::pin(self.clone().serve_session(
                name,
                reader,
                writer,
                None,
                fixed_protocol,
                ctx,
            ));
            let ended = ended.await?;
            tracing::debug!(conn = ?name, ?ended, "connection done");
            return Ok(());
        }
        // The HTTP path (its head parser, its WebSocket framing) lives in an
        // allocation of its own, so a QMux connection's task does not carry
        // its state.
        Box::pin(self.serve_web(name.over_http(), reader, writer, limit, ctx)).await
    }

    /// Serves an HTTP connection: a page or file, or a WebSocket upgrade
    /// whose messages carry the session (docs/protocol.md §9.2, §9.6).
    async fn serve_web<R: HeadRead + SetTransport, W: ByteWrite + SetTransport>(
        self: &Rc<Self>,
        mut name: ConnName,
        mut reader: R,
        mut writer: W,
        limit: StdDuration,
        ctx: DriveCtx,
    ) -> io::Result<()> {
        let relay = self.relay.clone();
        let sources = move || relay.announced_sources();
        let routed = crate::web::serve_http(
            self.relay.origin(),
            &sources,
            &self.web_dir,
            self.record_dir.as_deref(),
            self.tls.as_ref().and_then(|t| t.cert().fingerprint()),
            &mut reader,
            &mut writer,
            name,
            limit,
        )
        .await?;
        let crate::web::Routed::Upgrade {
            target,
            protocol,
            early,
        } = routed
        else {
            return Ok(());
        };
        reader.set_transport(TransportLabel::Ws);
        writer.set_transport(TransportLabel::Ws);
        let link = skiff_monoio::ws::Link::new();
        let max =
            usize::try_from(self.relay.session_config.conn.max_record_size).unwrap_or(usize::MAX);
        let reader = WsReader::new(reader, WsRole::Server, max, early, link.clone());
        let writer = WsWriter::new(writer, WsRole::Server, link);
        name = name.upgraded();
        let ended = Box::pin(self.clone().serve_session(
            &name,
            reader,
            writer,
            Some(target),
            protocol,
            ctx,
        ));
        let ended = ended.await?;
        tracing::debug!(conn = ?name, ?ended, "websocket connection done");
        Ok(())
    }
}

/// Logs why the client's session was refused, if its gate refused it.
/// The session of a client's QUIC connection, on the heap: built here,
/// outside the serving future, so that future keeps a pointer to it and
/// never room for a connection or a session of its own.
fn boxed_quic_session<'s>(
    config: Config<'s>,
    mut transport: Box<QuicTransport>,
    send_budget: u64,
    now: Instant,
    storage: &'s mut ServerStorage,
    origin: skiff_core::model::origin::Ref<'static, 'static>,
) -> Result<Box<QuicSession<'s, STREAMS>>, skiff_core::session::ConfigError> {
    transport.set_send_budget(Some(send_budget));
    Session::with_transport(Side::Server, config, *transport, now, storage, Some(origin))
        .map(Box::new)
}

fn log_refusal(gate: Option<&Gate>, name: &ConnName) {
    if let Some(refusal) = gate.and_then(|g| g.refusal()) {
        tracing::debug!(conn = ?name, reason = %refusal, "session refused");
    }
}

impl RelayHandler {
    /// The token gate of a client's session (docs/protocol.md §4.10), or
    /// `None` when the relay is open to everyone.
    fn client_gate(&self) -> Option<Rc<Gate>> {
        (!self.auth.is_open()).then(|| {
            let clock = self.clock;
            Rc::new(Gate::new(self.auth.clone(), move || {
                (clock.now(), std::time::SystemTime::now())
            }))
        })
    }

    /// The status a WebTransport CONNECT for `target` gets
    /// (docs/protocol.md §12.3): 200 if the relay is open or the path and
    /// its token admit some role (the SETUP's role is checked at SETUP, as
    /// on every transport), 401 for a token missing or not valid, 403 for a
    /// path the token does not reach.
    fn connect_status(&self, target: &str) -> u16 {
        if self.auth.is_open() {
            return 200;
        }
        match self.auth.admit(
            Some(target),
            None,
            skiff_core::wire::lite::Role::Both,
            std::time::SystemTime::now(),
        ) {
            Ok(_) => 200,
            Err(crate::auth::Refusal::RootMismatch | crate::auth::Refusal::NoAccess) => 403,
            Err(_) => 401,
        }
    }

    /// Serves a QUIC connection that agreed on HTTP/3 (docs/protocol.md
    /// §12): the SETTINGS and the client's CONNECT within the handshake
    /// timeout, its answer, and then the session over the WebTransport
    /// session's streams with the request's path and query as its path (as
    /// over WebSocket).
    #[allow(clippy::too_many_arguments)]
    async fn serve_webtransport(
        self: Rc<Self>,
        name: &ConnName,
        conn: Box<skiff_quic::quinn_proto::Connection>,
        mut link: Link,
        setup_by: Instant,
        handshake: HandshakeToken,
        send_budget: u64,
        ctx: DriveCtx,
    ) -> io::Result<()> {
        let _label = self.relay.metrics.clone().map(WebTransportLabel::new);
        // Boxed, like the connection: the future keeps a pointer to it for
        // the connection's life rather than room for it.
        let mut transport = Box::new(QuicTransport::webtransport_server(*conn, ctx.clock.epoch()));
        if let Some((m, i)) = self.relay.metrics.clone() {
            // The connection's UDP payloads, counted as it ends.
            transport.on_end(move |conn| {
                let stats = conn.stats();
                let c = m.thread(i);
                c.add_bytes_in_on(TransportLabel::WebTransport, stats.udp_rx.bytes as usize);
                c.add_bytes_out_on(TransportLabel::WebTransport, stats.udp_tx.bytes as usize);
            });
        }
        let status = drive_webtransport(&mut transport, &mut link, ctx.clock, setup_by, |t| {
            t.wt_status() != Some(WtStatus::Handshaking)
        })
        .await;
        if status != WtStatus::Requested {
            tracing::debug!(conn = ?name, ?status, "WebTransport: no CONNECT");
            if !transport.connection().is_closed() {
                skiff_core::transport::Transport::close(
                    &mut *transport,
                    skiff_quic::webtransport::code::H3_REQUEST_INCOMPLETE,
                    "no CONNECT in time",
                );
                link.exchange(transport.connection_mut());
                link.flush(transport.connection_mut()).await;
            }
            return Ok(());
        }
        let target = transport
            .wt_request()
            .map(|r| r.target.clone())
            .unwrap_or_default();
        let answer = self.connect_status(&target);
        transport.wt_answer(ctx.clock.now(), answer);
        if transport.wt_status() != Some(WtStatus::Open) {
            // The query may hold a token: only the path is logged.
            let path = target.split('?').next().unwrap_or("");
            tracing::debug!(conn = ?name, path, ?answer, "WebTransport: CONNECT refused");
            // The answer goes out; the connection closes once it arrived.
            let by =
                ctx.clock.now() + skiff_monoio::clock::to_core(std::time::Duration::from_secs(1));
            drive_webtransport(&mut transport, &mut link, ctx.clock, by, |t| {
                t.connection().is_closed()
            })
            .await;
            return Ok(());
        }
        let ended = Box::pin(self.clone().serve_quic_session(
            name,
            transport,
            Some(target),
            link,
            setup_by,
            handshake,
            send_budget,
            ctx,
        ))
        .await?;
        tracing::debug!(conn = ?name, ?ended, "WebTransport session ended");
        Ok(())
    }

    /// Runs the session of a client connected over QUIC (docs/protocol.md
    /// §11) or WebTransport (§12): as [`RelayHandler::serve_session`], over
    /// the connection's streams; the path comes with the client's SETUP, or
    /// is `path` (WebTransport's request target).
    #[allow(clippy::too_many_arguments)]
    async fn serve_quic_session(
        self: Rc<Self>,
        name: &ConnName,
        transport: Box<QuicTransport>,
        path: Option<String>,
        link: Link,
        setup_by: Instant,
        handshake: HandshakeToken,
        send_budget: u64,
        ctx: DriveCtx,
    ) -> io::Result<Ended> {
        let relay = self.relay.clone();
        let refused = |e: ResolveRefused, path: &str| relay.track_refused(Some(*name), e, path);
        let resolver = Resolver::new(&self.relay.router, Some(name.id()), &self.relay.queues)
            .on_refused(&refused);
        let gate = self.client_gate();
        let mut sides = SideTables::new(self.sides.clone());
        let mut storage = self.storage.take();
        let (config, origin) = self.relay.session_setup(Remote::Client);
        let mut config: Config<'_> = config;
        config.path = path.as_deref();
        let session = boxed_quic_session(
            config,
            transport,
            send_budget,
            ctx.clock.now(),
            &mut storage,
            origin,
        )
        .map(|mut s| {
            s.set_scope(gate.as_deref().map(|g| g as &dyn Scope));
            s
        });
        let ended = run_quic_session::<STREAMS, CLIENT_UPSTREAM>(
            self.relay.clone(),
            session,
            Some(&mut sides),
            link,
            Side::Server,
            name,
            Remote::Client,
            Some(&resolver),
            gate.clone(),
            Some(setup_by),
            Some(handshake),
            &ctx,
        )
        .await;
        log_refusal(gate.as_deref(), name);
        self.storage.give(storage);
        ended
    }

    /// Runs the session of client connection `name` once it has sent its
    /// first bytes; over WebSocket, `path` is the request target and
    /// `fixed_protocol` the application protocol the subprotocol chose
    /// (docs/protocol.md §9.2, §9.3).
    async fn serve_session<R: ByteRead, W: ByteWrite>(
        self: Rc<Self>,
        name: &ConnName,
        reader: R,
        writer: W,
        path: Option<String>,
        fixed_protocol: Option<&'static str>,
        ctx: DriveCtx,
    ) -> io::Result<Ended> {
        let relay = self.relay.clone();
        let refused = |e: ResolveRefused, path: &str| relay.track_refused(Some(*name), e, path);
        let resolver = Resolver::new(&self.relay.router, Some(name.id()), &self.relay.queues)
            .on_refused(&refused);
        let gate = self.client_gate();
        // Media tables come at the client's SETUP, for the directions its
        // Role names; they outlive the session that borrows them.
        let mut sides = SideTables::new(self.sides.clone());
        let mut storage = self.storage.take();
        let (config, origin) = self.relay.session_setup(Remote::Client);
        let mut config: Config<'_> = config;
        config.path = path.as_deref();
        if path.is_some() || fixed_protocol.is_some() {
            config.conn.fixed_protocol = fixed_protocol;
        }
        // Boxed at once, so the session is not copied into the futures below.
        let session: Result<Box<MoqSession<'_>>, _> = Session::new(
            Side::Server,
            config,
            ctx.clock.now(),
            &mut storage,
            Some(origin),
        )
        .map(|mut s| {
            // docs/protocol.md §4.10: admitted at SETUP, scoped from then on.
            s.set_scope(gate.as_deref().map(|g| g as &dyn Scope));
            Box::new(s)
        });
        let relay = self.relay.clone();
        let ended = run_session::<_, _, STREAMS, CLIENT_UPSTREAM>(
            relay,
            session,
            Some(&mut sides),
            reader,
            writer,
            Side::Server,
            name,
            Remote::Client,
            None,
            Some(&resolver),
            gate.clone(),
            &ctx,
        )
        .await;
        log_refusal(gate.as_deref(), name);
        self.storage.give(storage);
        ended
    }
}

/// Drives a new QUIC connection through its handshake alone, before the
/// session and its tables are made: a client that never completes it holds
/// only the library's connection, and only until `deadline` (then it is
/// closed). True once the handshake is done; false if the connection closed
/// or the deadline passed first.
async fn quic_handshake(
    conn: &mut skiff_quic::quinn_proto::Connection,
    link: &mut Link,
    deadline: std::time::Instant,
) -> bool {
    let mut sleep = std::pin::pin!(monoio::time::sleep(std::time::Duration::ZERO));
    loop {
        link.deliver(conn);
        let now = std::time::Instant::now();
        if conn.poll_timeout().is_some_and(|t| t <= now) {
            conn.handle_timeout(now);
        }
        let late = now >= deadline && conn.is_handshaking();
        if late {
            // docs/protocol.md §11.8: not done within the handshake timeout.
            conn.close(
                now,
                skiff_quic::quinn_proto::VarInt::from_u32(0x11),
                Default::default(),
            );
        }
        link.exchange(conn);
        link.flush(conn).await;
        if late || conn.is_closed() {
            return false;
        }
        if !conn.is_handshaking() {
            return true;
        }
        // Until a datagram, the library's next timer, or the deadline.
        let wake = conn.poll_timeout().map_or(deadline, |t| t.min(deadline));
        sleep.as_mut().reset(monoio::time::Instant::from_std(wake));
        let link = &*link;
        std::future::poll_fn(|cx| {
            if link.poll_ready(cx.waker()) || sleep.as_mut().poll(cx).is_ready() {
                return std::task::Poll::Ready(());
            }
            std::task::Poll::Pending
        })
        .await;
    }
}

/// Counts a QUIC connection under the `webtransport` transport label
/// instead of `quic` while it lives.
struct WebTransportLabel(Arc<crate::metrics::Metrics>, usize);

impl WebTransportLabel {
    fn new((metrics, index): (Arc<crate::metrics::Metrics>, usize)) -> Self {
        let c = metrics.thread(index);
        c.transport_closed(TransportLabel::Quic);
        c.transport_opened(TransportLabel::WebTransport);
        WebTransportLabel(metrics, index)
    }
}

impl Drop for WebTransportLabel {
    fn drop(&mut self) {
        let c = self.0.thread(self.1);
        c.transport_closed(TransportLabel::WebTransport);
        c.transport_opened(TransportLabel::Quic);
    }
}
