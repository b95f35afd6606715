//! A leaf relay's upstream: the dial loop with backoff, the session over TCP,
//! TLS or QUIC, and the path and URL it dials.

use super::*;

/// The first and the longest wait before dialing the upstream again.
const UPSTREAM_BACKOFF: (StdDuration, StdDuration) =
    (StdDuration::from_millis(100), StdDuration::from_secs(5));

/// What a dial loop dials and how its sessions are named: the upstream
/// (`--upstream`) or a cluster peer.
pub(super) struct Dial {
    /// Where it dials.
    pub(super) up: UpstreamAddr,
    /// What SETUP's Path carries (path and query, the token included): owned
    /// by the loop (a cluster peer's is dropped with its link, so rotating
    /// tokens do not pile up).
    pub(super) path: Arc<str>,
    /// The URL log lines show (any query hidden by [`ConnName`]).
    pub(super) shown: &'static str,
    /// The TLS client configuration of a `tls://` or `moql://` URL.
    pub(super) tls: Option<Result<Arc<rustls::ClientConfig>, String>>,
    /// A cluster peer's link (`None`: the upstream): its slot names the
    /// sessions, its cancellation ends the loop, its counters count them.
    pub(super) peer: Option<Arc<PeerLink>>,
}

impl RelayHandler {
    /// Keeps a session to the upstream relay `up` (this worker becomes its
    /// leaf): dials it, runs the session, and dials again after a growing
    /// pause (100 ms to 5 s) whenever it ends, until the worker drains.
    ///
    /// Over that session the worker asks for every announcement (so its
    /// subscribers reach the upstream's broadcasts, one upstream subscription
    /// per track, docs/protocol.md §4.5) and announces its own clients'
    /// broadcasts (so the upstream's subscribers reach them). `url` is what
    /// it dials, its path and query what its SETUP carries
    /// ([`dialed_upstream_url`]), `tls` the client configuration of a
    /// `tls://` or `moql://` upstream ([`upstream_tls`]); both are made once
    /// for all workers.
    pub(super) fn spawn_upstream(
        &self,
        info: &WorkerInfo,
        up: UpstreamAddr,
        url: &'static str,
        tls: Option<Result<Arc<rustls::ClientConfig>, String>>,
    ) {
        let dial = Dial {
            up,
            path: Arc::from(setup_path(url)),
            shown: url,
            tls,
            peer: None,
        };
        self.spawn_dial(info, dial);
    }

    /// Runs a dial loop: dials `dial`, runs the session as a trunk (asking
    /// for announcements at once), and dials again after a jittered pause
    /// growing from 100 ms to 5 s (±25%) whenever it ends, until the worker
    /// drains or, for a cluster peer, the peer is removed from the list
    /// ([`PeerLink::cancel`]): then the session open is closed cleanly, so
    /// its routes are withdrawn as for any session's end.
    pub(super) fn spawn_dial(&self, info: &WorkerInfo, dial: Dial) {
        let relay = self.relay.clone();
        let worker_shutdown = info.shutdown.clone();
        let worker = info.index;
        let Dial {
            up,
            path,
            shown,
            tls,
            peer,
        } = dial;
        let what = if peer.is_some() {
            "cluster peer"
        } else {
            "upstream"
        };
        let tls = match tls {
            Some(Ok(config)) => Some(config),
            Some(Err(e)) => {
                tracing::error!(worker, url = %up, error = %e, "no TLS configuration for the {what}");
                return;
            }
            None => None,
        };
        // The loop's own stop signal: the worker's drain, or the peer's
        // removal from the cluster (a client session closes when it fires).
        let stop = LocalEvent::new();
        let ctx = DriveCtx {
            shutdown: Some(Shutdown::new(stop.clone())),
            ..self.drive_ctx(info)
        };
        let cancelled = peer.clone();
        let watch_stop = stop.clone();
        monoio::spawn(async move {
            loop {
                if worker_shutdown.is_draining()
                    || cancelled.as_ref().is_some_and(|p| p.is_cancelled())
                {
                    watch_stop.fire();
                    return;
                }
                monoio::select! {
                    _ = monoio::time::sleep(CANCEL_POLL) => {}
                    _ = worker_shutdown.wait() => {}
                }
            }
        });
        let handshake_limit = info.config.timeouts.handshake;
        let mut jitter = Jitter::new(worker as u64 ^ up.port as u64);
        monoio::spawn(async move {
            let mut backoff = UPSTREAM_BACKOFF.0;
            let mut dial = 0u64;
            // One trunk's tables for every dial (a session clears them).
            let mut storage = Box::new(UpstreamStorage::new());
            while !stop.is_fired() {
                let started = StdInstant::now();
                let name = match &peer {
                    Some(p) => ConnName::cluster_peer(worker, p.slot, dial, shown),
                    None => ConnName::upstream(worker, dial, shown),
                };
                if let Some(p) = &peer {
                    relay.add_peer_stats(name.id(), p.stats.clone());
                }
                let session = UpstreamSession {
                    relay: &relay,
                    ctx: &ctx,
                    path: &path,
                    name,
                    cluster: peer.is_some(),
                };
                let ended = match (up.scheme, &tls) {
                    (UpstreamScheme::Quic, Some(config)) => {
                        session
                            .run_quic(&mut storage, &up, config, handshake_limit)
                            .await
                    }
                    (_, tls) => match (dial_upstream(&up, handshake_limit).await, tls) {
                        (Err(e), _) => Err(e),
                        (Ok(stream), None) => {
                            tracing::info!(conn = ?name, "{what} connected");
                            let (reader, writer) = split_halves(stream, 64 * 1024);
                            session.run(&mut storage, reader, writer, None).await
                        }
                        (Ok(stream), Some(config)) => {
                            let (reader, writer) = split_halves(stream, 64 * 1024);
                            match upstream_handshake(config, &up, reader, writer, handshake_limit)
                                .await
                            {
                                Ok((reader, writer)) => {
                                    tracing::info!(conn = ?name, "{what} connected over TLS");
                                    // docs/protocol.md §9.8: qmux's ALPN name fixes the protocol.
                                    let fixed = (reader.alpn().as_deref()
                                        == Some(skiff_monoio::tls::ALPN_QMUX))
                                    .then_some(skiff_ws::APPLICATION);
                                    session.run(&mut storage, reader, writer, fixed).await
                                }
                                Err(e) => Err(e),
                            }
                        }
                    },
                };
                relay.remove_peer_stats(name.id());
                match ended {
                    Ok(ended) => {
                        tracing::info!(conn = ?name, ?ended, "{what} session ended")
                    }
                    Err(e) => {
                        tracing::warn!(conn = ?name, error = %e, "{what} session failed or unreachable")
                    }
                }
                dial += 1;
                if started.elapsed() > UPSTREAM_BACKOFF.1 {
                    backoff = UPSTREAM_BACKOFF.0;
                }
                monoio::select! {
                    _ = monoio::time::sleep(jitter.spread(backoff)) => {}
                    _ = stop.wait() => {}
                }
                backoff = (backoff * 2).min(UPSTREAM_BACKOFF.1);
            }
            if let Some(p) = &peer {
                tracing::info!(worker, peer = %p.shown(), "cluster peer removed: its dial loop ended");
            }
        });
    }
}

/// How often a dial loop looks whether its peer was removed.
const CANCEL_POLL: StdDuration = StdDuration::from_millis(200);

/// The spread of the pauses between dials: ±25% of each pause, so the
/// workers and relays of a cluster that lost a node do not dial it again
/// in step (a xorshift generator: no randomness source needed).
pub(super) struct Jitter(u64);

impl Jitter {
    /// A generator seeded by `seed` and the time.
    pub(super) fn new(seed: u64) -> Self {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Jitter((seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ t) | 1)
    }

    /// `pause` scaled by a factor drawn from 0.75 to 1.25.
    pub(super) fn spread(&mut self, pause: StdDuration) -> StdDuration {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        // 0..=1000 thousandths of the half-width either way.
        let per_mille = 750 + (x % 501);
        pause * per_mille as u32 / 1000
    }
}

/// One session of a leaf with its upstream relay, over any byte stream.
struct UpstreamSession<'a> {
    relay: &'a Rc<Relay>,
    ctx: &'a DriveCtx,
    /// The SETUP path (with the token, if any).
    path: &'a str,
    /// The session's id for the core, and its name for log lines.
    name: ConnName,
    /// A cluster peer's link, not the upstream.
    cluster: bool,
}

impl UpstreamSession<'_> {
    /// What the session is to the relay: its upstream, or a cluster peer.
    fn remote(&self) -> Remote {
        if self.cluster {
            Remote::Cluster
        } else {
            Remote::Upstream
        }
    }
}

impl UpstreamSession<'_> {
    /// Runs the session over `reader`/`writer` until it ends;
    /// `fixed_protocol` is what TLS ALPN agreed on.
    async fn run<R: ByteRead, W: ByteWrite>(
        self,
        storage: &mut UpstreamStorage,
        reader: R,
        writer: W,
        fixed_protocol: Option<&'static str>,
    ) -> io::Result<Ended> {
        let peer = self.remote();
        let (config, origin) = self.relay.session_setup(peer);
        let mut config = Config {
            path: Some(self.path),
            ..config
        };
        if fixed_protocol.is_some() {
            config.conn.fixed_protocol = fixed_protocol;
        }
        let session: Result<Box<TrunkSession<'_>>, _> = Session::new(
            Side::Client,
            config,
            self.ctx.clock.now(),
            storage,
            Some(origin),
        )
        .map(Box::new);
        run_session::<_, _, TRUNK_STREAMS, TRUNK_UPSTREAM>(
            self.relay.clone(),
            session,
            None,
            reader,
            writer,
            Side::Client,
            &self.name,
            peer,
            None,
            None,
            None,
            self.ctx,
        )
        .await
    }
}

impl UpstreamSession<'_> {
    /// Dials the upstream `up` over QUIC from an endpoint of its own (with
    /// `tls`, which offers moq-lite's ALPN) and runs the session over the
    /// connection until it ends (docs/protocol.md §11). A session whose QUIC
    /// handshake and SETUP take longer than `handshake_limit` is closed, as
    /// over TCP: an upstream that does not answer is dialed again after the
    /// backoff, not after QUIC's idle timeout.
    async fn run_quic(
        self,
        storage: &mut UpstreamStorage,
        up: &UpstreamAddr,
        tls: &Arc<rustls::ClientConfig>,
        handshake_limit: StdDuration,
    ) -> io::Result<Ended> {
        let config = skiff_quic::config::client_config(tls.clone(), TRUNK_STREAMS)
            .map_err(|e| io::Error::other(e.to_string()))?;
        let addr = upstream_addr(up)?;
        let clock = self.ctx.clock;
        let endpoint = skiff_monoio::quic::Endpoint::client(addr, clock)?;
        let (conn, link) = endpoint.connect(config, addr, &up.host)?;
        tracing::info!(conn = ?self.name, "upstream dialed over QUIC");
        let receiving = monoio::spawn(endpoint.clone().run());
        let peer = self.remote();
        let (config, origin) = self.relay.session_setup(peer);
        let config = Config {
            path: Some(self.path),
            ..config
        };
        let transport = QuicTransport::new(conn, clock.epoch());
        let session: Result<Box<QuicSession<'_, TRUNK_STREAMS>>, _> = Session::with_transport(
            Side::Client,
            config,
            transport,
            clock.now(),
            storage,
            Some(origin),
        )
        .map(Box::new);
        let ended = run_quic_session::<TRUNK_STREAMS, TRUNK_UPSTREAM>(
            self.relay.clone(),
            session,
            None,
            link,
            Side::Client,
            &self.name,
            peer,
            None,
            None,
            Some(clock.now() + skiff_monoio::clock::to_core(handshake_limit)),
            None,
            self.ctx,
        )
        .await;
        endpoint.stop();
        drop(receiving);
        ended
    }
}

/// The URL a leaf dials upstream: the `--upstream` URL, with the token of
/// `--upstream-token-file` added to its query as `jwt` (docs/protocol.md
/// §4.10). Its path and query are what the SETUP carries ([`setup_path`]);
/// log lines show it without the query ([`ConnName::upstream`]). Made once
/// for the process (the factory keeps it), so the file is read once and the
/// leaked string does not grow with the workers.
pub(super) fn dialed_upstream_url(info: &WorkerInfo, up: &UpstreamAddr) -> &'static str {
    let scheme = up.scheme.name();
    let mut dialed = if up.host.contains(':') {
        format!("{scheme}://[{}]:{}/{}", up.host, up.port, up.path)
    } else {
        format!("{scheme}://{}:{}/{}", up.host, up.port, up.path)
    };
    if let Some(file) = &info.config.upstream_token_file {
        match std::fs::read_to_string(file) {
            Ok(token) if !token.trim().is_empty() => {
                dialed.push(if dialed.contains('?') { '&' } else { '?' });
                dialed.push_str("jwt=");
                dialed.push_str(token.trim());
            }
            Ok(_) => tracing::warn!(file = %file.display(), "upstream token file is empty"),
            Err(e) => {
                tracing::warn!(file = %file.display(), error = %e, "cannot read upstream token file")
            }
        }
    }
    Box::leak(dialed.into_boxed_str())
}

/// The path and query of a URL made by [`dialed_upstream_url`], from the `/`
/// after its authority (which holds none).
pub(super) fn setup_path(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    rest.find('/').map_or("/", |i| &rest[i..])
}

/// The TLS client configuration a leaf dials its `tls://` or `moql://`
/// upstream with: the certificate pinned by `--upstream-fingerprint`, or
/// the CAs of `--upstream-ca`, or the system's trust store; offering qmux's
/// ALPN name over TLS, moq-lite's over QUIC (docs/protocol.md §9.8, §11.1).
pub(super) fn upstream_tls(
    info: &WorkerInfo,
    scheme: UpstreamScheme,
) -> Result<Arc<rustls::ClientConfig>, String> {
    use skiff_monoio::tls::Trust;
    let trust = match (&info.config.upstream_fingerprint, &info.config.upstream_ca) {
        (Some(pin), _) => Trust::Pinned(*pin),
        (None, Some(file)) => Trust::Roots(Arc::new(
            skiff_monoio::tls::roots_from_pem_file(file).map_err(|e| e.to_string())?,
        )),
        (None, None) => Trust::System,
    };
    let alpn: Vec<&[u8]> = match scheme {
        UpstreamScheme::Quic => skiff_quic::config::ALPNS
            .iter()
            .map(|a| a.as_bytes())
            .collect(),
        UpstreamScheme::Tcp | UpstreamScheme::Tls => vec![skiff_monoio::tls::ALPN_QMUX],
    };
    skiff_monoio::tls::client_config_for(&trust, &alpn)
        .map(Arc::new)
        .map_err(|e| e.to_string())
}

/// Runs the TLS handshake with the upstream `up` (its host as SNI) within `limit`.
async fn upstream_handshake<R: ByteRead, W: ByteWrite>(
    config: &Arc<rustls::ClientConfig>,
    up: &UpstreamAddr,
    reader: R,
    writer: W,
    limit: StdDuration,
) -> io::Result<(TlsReader<R>, TlsWriter<W>)> {
    let conn = skiff_monoio::tls::client_connection(config.clone(), &up.host)?;
    match race(
        skiff_monoio::tls::handshake(conn, reader, writer),
        monoio::time::sleep(limit),
    )
    .await
    {
        Ok(res) => res,
        Err(()) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "no TLS handshake with the upstream in time",
        )),
    }
}

/// The upstream's address (`host` resolved each time: it may move).
pub(super) fn upstream_addr(up: &UpstreamAddr) -> io::Result<std::net::SocketAddr> {
    use std::net::ToSocketAddrs;
    (up.host.as_str(), up.port)
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "upstream host has no address"))
}

/// Dials the upstream relay over TCP, giving up after `limit` (the
/// handshake timeout): a peer whose packets are dropped is dialed again
/// after the backoff, not after the kernel's SYN retries (about two
/// minutes), so a link cut and restored comes back within seconds.
async fn dial_upstream(
    up: &UpstreamAddr,
    limit: StdDuration,
) -> io::Result<monoio::net::TcpStream> {
    let addr = upstream_addr(up)?;
    let stream = match race(
        monoio::net::TcpStream::connect(addr),
        monoio::time::sleep(limit),
    )
    .await
    {
        Ok(res) => res?,
        Err(()) => {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "no TCP connection with the peer in time",
            ));
        }
    };
    let _ = stream.set_nodelay(true);
    Ok(stream)
}
