//! Relay configuration: the settings (each declared once, in [`keys`]),
//! filled from the command line and the optional TOML file
//! ([`file`](mod@file)), and the validated [`RelayConfig`] built from both:
//! defaults, then the file, then the flags over it.
//!
//! The file uses the flags' long names as keys (`max-connections = 100`);
//! the snake_case spelling (`max_connections`) is accepted too. Unknown keys
//! are an error, so a typo never silently falls back to a default.

use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::time::Duration;

use skiff_monoio::driver::DriverKind;
use skiff_monoio::tls::{Fingerprint, PemError};

use crate::proxy_protocol::ProxySources;
use crate::tls::{TlsFiles, TlsSource};

pub mod cluster;
pub mod file;
pub mod keys;
pub mod values;

pub use cluster::{ClusterPeer, PeerListError, PeerListSource};
pub use keys::{
    Cli, Command, DEFAULT_LISTEN, DEFAULT_STREAM_CREDIT, DemoTransport, ExportArgs, RelayDemoArgs,
    Settings, Values, quota_key,
};
pub use values::{
    ByteSize, DurationArg, LogLevel, ParseValueError, Spelling, Upstream, UpstreamScheme,
};

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

/// Why a configuration could not be loaded or validated.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The configuration file could not be read from disk.
    #[error("cannot read config file {}: {source}", path.display())]
    ReadFile {
        /// The file named by `--config`.
        path: PathBuf,
        /// What the operating system said.
        source: std::io::Error,
    },
    /// The configuration file is not TOML, or holds an unknown key or a value
    /// of the wrong type.
    #[error("invalid config file {}: {message}", path.display())]
    ParseFile {
        /// The file named by `--config`.
        path: PathBuf,
        /// The parser's explanation, with line and column.
        message: String,
    },
    /// A value is well-formed but not allowed (out of range, inconsistent).
    #[error("invalid value for `{key}`: {reason}")]
    Invalid {
        /// The flag / file key the value belongs to.
        key: &'static str,
        /// Why it was rejected.
        reason: String,
    },
}

fn invalid(key: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key,
        reason: reason.into(),
    }
}

// ---------------------------------------------------------------------------
// Validated configuration
// ---------------------------------------------------------------------------

/// Per-connection and per-session limits handed to every connection handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Open connections per worker thread.
    pub max_connections: u32,
    /// Concurrent streams per connection.
    pub max_streams: u32,
    /// Subscriptions per session.
    pub max_subscriptions: u32,
    /// Largest frame, bytes.
    pub max_frame_bytes: u64,
    /// Largest group, bytes.
    pub max_group_bytes: u64,
}

/// How long the relay waits for a peer before closing its connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// QMux transport parameters and SETUP must arrive within this of the
    /// accept, and a QMux record or a control message once started must
    /// complete within it (slowloris); closed with CONTROL_MESSAGE_TIMEOUT
    /// (docs/protocol.md §3.15).
    pub handshake: Duration,
    /// The QMux idle timeout we advertise (docs/protocol.md §1.4, §2.5).
    pub idle: Duration,
    /// The socket accepted no byte for this long while we had bytes to send.
    pub write: Duration,
}

/// The validated relay configuration: defaults, then the file, then flags.
#[derive(Debug, Clone, PartialEq)]
pub struct RelayConfig {
    /// Address every worker's SO_REUSEPORT listener binds.
    pub listen: SocketAddr,
    /// Number of worker threads (each with its own runtime and listener).
    pub threads: NonZeroUsize,
    /// Upstream relay, if any.
    pub upstream: Option<Upstream>,
    /// Group cache budget per worker thread, bytes.
    pub cache_bytes: u64,
    /// Connection, stream, subscription and size limits.
    pub limits: Limits,
    /// Where to serve Prometheus metrics, if anywhere.
    pub metrics: Option<SocketAddr>,
    /// Log verbosity.
    pub log: LogLevel,
    /// Which I/O driver the workers use.
    pub driver: DriverKind,
    /// How long connections may take to finish after a stop signal.
    pub drain_timeout: Duration,
    /// How long a broadcast whose publisher left waits for a new source.
    pub failover_grace: Duration,
    /// Handshake, idle and write-stall timeouts.
    pub timeouts: Timeouts,
    /// QMux `initial_max_stream_data_*` granted to peers: bytes a peer may
    /// send on one stream before we read them (docs/protocol.md §1.4, §2.4).
    pub stream_credit: u64,
    /// QMux `initial_max_data` granted to peers; `None`: the larger of 1 MiB
    /// and four times `stream_credit` (see [`RelayConfig::connection_credit`]).
    pub connection_credit: Option<u64>,
    /// SO_SNDBUF of accepted connections (`None`: kernel autotuning).
    pub send_buffer: Option<u64>,
    /// TCP_QUICKACK after every read that drained the socket of a peer
    /// that may publish.
    pub quick_ack: bool,
    /// Serve moq-lite over QUIC on UDP at the listen port when the relay
    /// has a certificate.
    pub quic: bool,
    /// Batch QUIC datagrams into one send (UDP GSO).
    pub quic_gso: bool,
    /// Bytes the QUIC connections of a worker may hold unacknowledged or
    /// unsent, shared equally among them (each between 16 KiB and 512 KiB).
    pub quic_send_budget: u64,
    /// A new QUIC connection is asked to validate its address (a Retry)
    /// while at least this many of the worker's connections are still in
    /// their handshake (0: always).
    pub quic_retry_above: u32,
    /// What one peer may take of the relay.
    pub quotas: Quotas,
    /// Directory the web player and its files are served from.
    pub web_dir: PathBuf,
    /// Access control (docs/protocol.md §4.10).
    pub auth: AuthConfig,
    /// The file holding the token presented to the upstream relay.
    pub upstream_token_file: Option<PathBuf>,
    /// The listen port's certificate and key: `Some` makes it TLS only.
    pub tls: Option<TlsFiles>,
    /// The hosts of a generated self-signed certificate (`--tls-generate`;
    /// empty: none): not empty makes the listen port TLS only. Never with
    /// [`RelayConfig::tls`].
    pub tls_generate: Vec<String>,
    /// The CAs a `tls://` or `moql://` upstream must chain to (`None`: the
    /// system's).
    pub upstream_ca: Option<PathBuf>,
    /// The SHA-256 of the one certificate a `tls://` or `moql://` upstream
    /// may present (docs/protocol.md §11.3), instead of a chain to CAs.
    pub upstream_fingerprint: Option<Fingerprint>,
    /// The load balancers whose TCP connections start with a PROXY
    /// protocol header (`--proxy-protocol-from`; empty: none).
    pub proxy_protocol_from: ProxySources,
    /// Cluster peers to dial (`--cluster-connect`), one per identity, this
    /// relay's own URL (`--cluster-node`) left out.
    pub cluster_connect: Vec<ClusterPeer>,
    /// Where the run-time peer list is read (`--cluster-connect-api`).
    pub cluster_connect_api: Option<PeerListSource>,
    /// This relay's Hop ID in a cluster (`--cluster-id`, docs/protocol.md
    /// §4.3), shared by all its workers: non-zero, below 2^62. `None`:
    /// [`crate::server::start`] draws a random one below 2^53 for the run.
    pub cluster_id: Option<u64>,
    /// Longest hop list accepted or forwarded (`--cluster-max-hops`, 1..=32).
    pub cluster_max_hops: usize,
    /// The file holding the token presented to cluster peers
    /// (`--cluster-token`; read and checked at start).
    pub cluster_token: Option<PathBuf>,
    /// This relay's own URL (`--cluster-node`).
    pub cluster_node: Option<String>,
    /// Recording (`--record`, `--record-dir`, …): `None` without a directory.
    pub record: Option<crate::record::RecordConfig>,
}

/// Where tokens are verified and what anonymous sessions may do; all empty:
/// the relay is open to everyone.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AuthConfig {
    /// One JWK file.
    pub key: Option<PathBuf>,
    /// A directory of `{kid}.jwk` files.
    pub key_dir: Option<PathBuf>,
    /// Anonymous publish and subscribe patterns, rooted at `/`.
    pub public: moq_pattern::Patterns,
}

impl AuthConfig {
    /// The policy this configuration describes, its keys read and checked now.
    ///
    /// # Errors
    /// The key file or directory cannot be used.
    pub fn build(&self) -> Result<crate::auth::Auth, crate::auth::KeyError> {
        use crate::auth::{Auth, Keys};
        let keys = match (&self.key, &self.key_dir) {
            (Some(file), _) => Some(Keys::file(file.clone())?),
            (None, Some(dir)) => Some(Keys::dir(dir.clone())?),
            (None, None) => None,
        };
        Ok(Auth::new(keys, self.public.clone()))
    }
}

/// The default web directory: the repository's `web/dist`.
pub fn default_web_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../web/dist")
}

/// What one peer may take of the relay; each limit refuses only the new
/// request (or connection) that goes past it, counted in the metrics
/// (`skiff_relay_quota_refused_total`) and logged at debug level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quotas {
    /// Open connections from one IP address, per worker thread (`None`:
    /// no limit).
    pub connections_per_ip: Option<u32>,
    /// Connections from one IP address that have not finished their
    /// handshake, per worker thread.
    pub handshakes_per_ip: u32,
    /// Connections that have not finished their handshake, per worker thread.
    pub handshakes: u32,
    /// Relay tracks per worker thread (the size of its track table).
    pub relay_tracks: u32,
    /// Broadcasts one connection announces at once.
    pub announces: u32,
    /// Broadcasts one cluster peer announces at once.
    pub cluster_announces: u32,
    /// Track requests of one connection waiting for their source's answer.
    pub pending_tracks: u32,
    /// Track requests waiting for their source's answer in one broadcast.
    pub pending_tracks_per_broadcast: u32,
    /// TRACK requests of one connection waiting for TRACK_INFO at once.
    pub waiting_track_requests: u32,
    /// FETCHes of one connection under way at once.
    pub fetches: u32,
}

impl Quotas {
    /// The quotas among `values`.
    pub fn of(v: &Values) -> Self {
        Quotas {
            connections_per_ip: v.max_connections_per_ip,
            handshakes_per_ip: v
                .max_handshakes_per_ip
                .unwrap_or((v.max_handshakes / 4).max(1)),
            handshakes: v.max_handshakes,
            relay_tracks: v.max_relay_tracks,
            announces: v.max_announces,
            cluster_announces: v.cluster_max_announces,
            pending_tracks: v.max_pending_tracks,
            pending_tracks_per_broadcast: v.max_pending_tracks_per_broadcast,
            waiting_track_requests: v.max_waiting_track_requests,
            fetches: v.max_fetches,
        }
    }
}

impl Default for Quotas {
    /// Each quota at its declared default.
    fn default() -> Self {
        Quotas::of(&Settings::default().values())
    }
}

/// The access-control settings among `v`, their key files read to check them.
fn auth_config(v: &Values) -> Result<AuthConfig, ConfigError> {
    let (key, key_dir) = (v.auth_key.clone(), v.auth_key_dir.clone());
    if key.is_some() && key_dir.is_some() {
        return Err(invalid(
            "auth-key",
            "give --auth-key or --auth-key-dir, not both",
        ));
    }
    let texts = v.auth_public.as_deref().unwrap_or_default();
    let mut public = moq_pattern::Patterns::new();
    for text in texts.iter().map(|t| t.trim()).filter(|t| !t.is_empty()) {
        let pattern: moq_pattern::Pattern = text
            .parse()
            .map_err(|e| invalid("auth-public", format!("`{text}`: {e}")))?;
        // A literal names exactly one broadcast; `anon` for `anon/**` would
        // mislead, as moq-relay warns too.
        if pattern.is_literal() {
            return Err(invalid(
                "auth-public",
                format!(
                    "`{text}` has no wildcard, so it names one broadcast; write `{text}/**` for the subtree"
                ),
            ));
        }
        public.insert(pattern);
    }
    let auth = AuthConfig {
        key,
        key_dir,
        public,
    };
    // A relay must not start with keys it cannot use.
    auth.build().map_err(|e| {
        let key = if auth.key.is_some() {
            "auth-key"
        } else {
            "auth-key-dir"
        };
        invalid(key, e.to_string())
    })?;
    Ok(auth)
}

/// The TLS files among `v`, read once to check them: a relay must not start
/// with a certificate or key it cannot use.
fn tls_files(v: &Values) -> Result<Option<TlsFiles>, ConfigError> {
    let files = match (v.tls_cert.clone(), v.tls_key.clone()) {
        (None, None) => return Ok(None),
        (Some(cert), Some(key)) => TlsFiles { cert, key },
        (Some(_), None) => return Err(invalid("tls-key", "--tls-cert needs --tls-key")),
        (None, Some(_)) => return Err(invalid("tls-cert", "--tls-key needs --tls-cert")),
    };
    files.server_config().map_err(|e| {
        let key = match &e {
            PemError::Read { path, .. } | PemError::Empty { path, .. } if *path == files.cert => {
                "tls-cert"
            }
            _ => "tls-key",
        };
        invalid(key, e.to_string())
    })?;
    Ok(Some(files))
}

/// The hosts of `--tls-generate` among `v`, each checked to be a DNS name
/// or an IP address, and not given with `--tls-cert`/`--tls-key`.
fn tls_generate(v: &Values) -> Result<Vec<String>, ConfigError> {
    let Some(given) = &v.tls_generate else {
        return Ok(Vec::new());
    };
    if v.tls_cert.is_some() || v.tls_key.is_some() {
        return Err(invalid(
            "tls-generate",
            "give --tls-generate or --tls-cert/--tls-key, not both",
        ));
    }
    let hosts: Vec<String> = given
        .iter()
        .map(|h| h.trim())
        .filter(|h| !h.is_empty())
        .map(str::to_owned)
        .collect();
    if hosts.is_empty() {
        return Err(invalid(
            "tls-generate",
            "name at least one host (a DNS name or an IP address)",
        ));
    }
    for host in &hosts {
        crate::cert::check_host(host).map_err(|e| invalid("tls-generate", e.to_string()))?;
    }
    Ok(hosts)
}

/// A random Hop ID: non-zero, below 2^53 (docs/protocol.md §4.3).
pub fn random_hop() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    (h.finish() & ((1 << 53) - 1)).max(1)
}

/// The cluster settings of `cfg` checked (docs/protocol.md §4.3): the hop
/// id's range, the hop limit's, the token file readable and not empty, the
/// peer list without conflicting repeats and without this relay's own URL.
fn check_cluster(mut cfg: RelayConfig) -> Result<RelayConfig, ConfigError> {
    match cfg.cluster_id {
        Some(0) => return Err(invalid("cluster-id", "must be non-zero")),
        Some(id) if id > cluster::MAX_CLUSTER_ID => {
            return Err(invalid(
                "cluster-id",
                format!("{id} is not below 2^62 (the wire's varint limit)"),
            ));
        }
        _ => {}
    }
    if !(1..=cluster::MAX_CLUSTER_HOPS).contains(&cfg.cluster_max_hops) {
        return Err(invalid(
            "cluster-max-hops",
            format!("must be from 1 to {}", cluster::MAX_CLUSTER_HOPS),
        ));
    }
    if let Some(file) = &cfg.cluster_token {
        cluster::read_token(file).map_err(|e| invalid("cluster-token", e))?;
    }
    if let Some(node) = &cfg.cluster_node
        && let Err(e) = node.parse::<ClusterPeer>()
    {
        return Err(invalid("cluster-node", e.to_string()));
    }
    let peers = std::mem::take(&mut cfg.cluster_connect);
    cfg.cluster_connect = cluster::parse_peer_list(peers, cfg.cluster_node.as_deref())
        .map_err(|e| invalid("cluster-connect", e.to_string()))?;
    Ok(cfg)
}

/// Most worker threads accepted (a sanity bound, far above any core count here).
pub const MAX_THREADS: usize = 1024;

impl Default for RelayConfig {
    /// Every setting at its default; an open relay without TLS.
    fn default() -> Self {
        RelayConfig::of(
            Settings::default().values(),
            AuthConfig::default(),
            None,
            Vec::new(),
        )
    }
}

/// How much later than the driver's handshake deadline the QMux
/// connection's own (silent) one fires.
const HANDSHAKE_BACKSTOP: Duration = Duration::from_secs(1);

/// The default connection window for a stream window: the larger of 1 MiB
/// and four streams' worth.
pub fn connection_credit_for(stream: u64) -> u64 {
    stream.saturating_mul(4).max(1 << 20)
}

/// Largest flow-control window accepted (QMux varints hold 2^62 - 1; far
/// below that, a window is memory the peer may make us buffer).
pub const MAX_CREDIT: u64 = 1 << 32;

impl RelayConfig {
    /// The moq-lite session configuration of a relay session with Hop ID
    /// `hop`: the limits, timeouts and flow-control windows of this
    /// configuration applied to the QMux connection and the session.
    ///
    /// * QMux: `max_idle_timeout` = `--idle-timeout`; `initial_max_data` =
    ///   `--connection-credit`; every `initial_max_stream_data_*` =
    ///   `--stream-credit`; `initial_max_streams_bidi` and `_uni` each =
    ///   `--max-streams`, capped at a quarter of the session's stream table
    ///   ([`crate::storage::STREAMS`]); the handshake deadline is
    ///   `--handshake-timeout` plus a second (the driver's own deadline,
    ///   which closes with a code, comes first).
    /// * Session: SETUP within `--handshake-timeout` of the handshake, and
    ///   a control message, once started, within it too (slowloris: closed
    ///   with CONTROL_MESSAGE_TIMEOUT 0x11);
    ///   `--max-subscriptions` served at once (capped by the storage's
    ///   served table; one more is refused with INTERNAL 0x0); frames over
    ///   `--max-frame-bytes` drop their group with FRAME_TOO_LARGE 0x38.
    ///
    /// Groups over `--max-group-bytes` are refused by the relay track (see
    /// [`RelayConfig::track_limits`]).
    pub fn session_config(&self, hop: u64) -> skiff_core::session::Config<'static> {
        use skiff_core::conn;
        use skiff_monoio::clock::to_core as core;
        let streams = u64::from(self.limits.max_streams)
            .min((crate::storage::STREAMS / 4) as u64)
            .max(1);
        let stream = self.stream_credit;
        skiff_core::session::Config {
            conn: conn::Config {
                max_idle_timeout: core(self.timeouts.idle),
                max_data: self.connection_credit(),
                max_stream_data_bidi_local: stream,
                max_stream_data_bidi_remote: stream,
                max_stream_data_uni: stream,
                max_streams_bidi: Some(streams),
                max_streams_uni: Some(streams),
                handshake_timeout: core(self.timeouts.handshake + HANDSHAKE_BACKSTOP),
                ..conn::Config::new()
            },
            hop,
            setup_timeout: core(self.timeouts.handshake),
            control_timeout: core(self.timeouts.handshake),
            max_served: usize::try_from(self.limits.max_subscriptions).unwrap_or(usize::MAX),
            max_frame_bytes: self.limits.max_frame_bytes,
            max_waiting_tracks: self.quotas.waiting_track_requests as usize,
            max_fetches: self.quotas.fetches as usize,
            // A recording relay answers from the recording what its cache lacks.
            fetch_misses: self.record.is_some(),
            ..skiff_core::session::Config::new()
        }
    }

    /// The configuration of a trunk session (a link between workers, a
    /// leaf's upstream): as [`RelayConfig::session_config`], but with the
    /// stream counts of a trunk's table
    /// ([`crate::storage::TRUNK_STREAMS`], a quarter each way) and
    /// no subscription or waiting-TRACK limit but the table's: it carries
    /// every track that crosses it, not one client's.
    pub fn trunk_session_config(&self, hop: u64) -> skiff_core::session::Config<'static> {
        let mut config = self.session_config(hop);
        let streams = Some((crate::storage::TRUNK_STREAMS / 4) as u64);
        config.conn.max_streams_bidi = streams;
        config.conn.max_streams_uni = streams;
        config.max_served = usize::MAX;
        // A trunk asks for every track that crosses it: no per-peer quota.
        config.max_waiting_tracks = usize::MAX;
        // Only a client's FETCH is read from the recording: a trunk's miss
        // is refused by the core at once.
        config.fetch_misses = false;
        config
    }

    /// This relay's Hop ID: [`RelayConfig::cluster_id`] if set and valid,
    /// else a random one (non-zero, below 2^53) drawn now.
    pub fn hop_id(&self) -> u64 {
        self.cluster_id
            .filter(|&h| h != 0 && h < 1 << 62)
            .unwrap_or_else(random_hop)
    }

    /// Where the listen port's certificate comes from (`None`: plain TCP).
    pub fn tls_source(&self) -> Option<TlsSource> {
        match (&self.tls, self.tls_generate.is_empty()) {
            (Some(files), _) => Some(TlsSource::Files(files.clone())),
            (None, false) => Some(TlsSource::Generate(self.tls_generate.clone())),
            (None, true) => None,
        }
    }

    /// The QMux `initial_max_data` granted to peers: `--connection-credit`,
    /// else the larger of 1 MiB and four times `--stream-credit`.
    pub fn connection_credit(&self) -> u64 {
        self.connection_credit
            .unwrap_or_else(|| connection_credit_for(self.stream_credit))
    }

    /// The limits of a relay track: groups up to `--max-group-bytes` (a
    /// larger one is dropped with GROUP_TOO_LARGE 0x32 and its stream
    /// stopped) and a cache budget of `cache_bytes`. Pass them to
    /// `track::State::with_limits` when the relay creates a track.
    pub fn track_limits(&self, cache_bytes: u64) -> skiff_core::model::track::Limits {
        skiff_core::model::track::Limits {
            group_bytes: self.limits.max_group_bytes,
            cache_bytes,
        }
    }

    /// Builds the configuration from the command line, reading its
    /// `--config` file if it names one.
    ///
    /// # Errors
    /// Any [`ConfigError`]: unreadable or invalid file, or a value out of range.
    pub fn load(cli: &Cli) -> Result<Self, ConfigError> {
        let file = match &cli.config {
            Some(path) => Settings::load(path)?,
            None => Settings::default(),
        };
        Self::merge(&file, &cli.settings)
    }

    /// The configuration `values` describe, with access control `auth`,
    /// TLS files `tls` and generated-certificate hosts `tls_generate`
    /// (checked by the caller); nothing is validated.
    fn of(v: Values, auth: AuthConfig, tls: Option<TlsFiles>, tls_generate: Vec<String>) -> Self {
        let threads = v
            .threads
            .and_then(NonZeroUsize::new)
            .unwrap_or_else(|| std::thread::available_parallelism().unwrap_or(NonZeroUsize::MIN));
        RelayConfig {
            listen: v.listen,
            threads,
            cache_bytes: v.cache_bytes.0,
            limits: Limits {
                max_connections: v.max_connections,
                max_streams: v.max_streams,
                max_subscriptions: v.max_subscriptions,
                max_frame_bytes: v.max_frame_bytes.0,
                max_group_bytes: v.max_group_bytes.0,
            },
            metrics: v.metrics,
            log: v.log,
            driver: v.driver,
            drain_timeout: v.drain_timeout.0,
            failover_grace: v.failover_grace.0,
            timeouts: Timeouts {
                handshake: v.handshake_timeout.0,
                idle: v.idle_timeout.0,
                write: v.write_timeout.0,
            },
            stream_credit: v.stream_credit.0,
            connection_credit: v.connection_credit.map(|b| b.0),
            send_buffer: v.send_buffer.map(|b| b.0),
            quick_ack: v.quick_ack,
            quic: v.quic,
            quic_gso: v.quic_gso,
            quic_send_budget: v.quic_send_budget.0,
            quic_retry_above: v.quic_retry_above.unwrap_or(v.max_handshakes / 4),
            quotas: Quotas::of(&v),
            web_dir: v.web_dir.unwrap_or_else(default_web_dir),
            auth,
            upstream: v.upstream,
            upstream_token_file: v.upstream_token_file,
            tls,
            tls_generate,
            upstream_ca: v.upstream_ca,
            upstream_fingerprint: v.upstream_fingerprint,
            proxy_protocol_from: ProxySources::default(),
            cluster_connect: v.cluster_connect.unwrap_or_default(),
            cluster_connect_api: v.cluster_connect_api,
            cluster_id: v.cluster_id,
            cluster_max_hops: v.cluster_max_hops,
            cluster_token: v.cluster_token,
            cluster_node: v.cluster_node,
            // Checked by `merge` (`RecordConfig::of`), which sets it.
            record: None,
        }
    }

    /// Lays `file` over the defaults and `flags` over that, and validates.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] for a value out of range or inconsistent
    /// limits, or key, certificate or CA files that do not load.
    pub fn merge(file: &Settings, flags: &Settings) -> Result<Self, ConfigError> {
        let v = file.clone().overlay(flags.clone()).values();
        if v.threads == Some(0) {
            return Err(invalid("threads", "must be at least 1"));
        }
        if let Some(threads) = v.threads.filter(|&t| t > MAX_THREADS) {
            return Err(invalid(
                "threads",
                format!("{threads} is more than {MAX_THREADS}"),
            ));
        }
        for (key, n) in [
            ("max-connections", u64::from(v.max_connections)),
            ("max-streams", u64::from(v.max_streams)),
            ("max-subscriptions", u64::from(v.max_subscriptions)),
            ("max-frame-bytes", v.max_frame_bytes.0),
        ] {
            if n == 0 {
                return Err(invalid(key, "must be at least 1"));
            }
        }
        if v.max_frame_bytes > v.max_group_bytes {
            return Err(invalid(
                "max-frame-bytes",
                format!(
                    "{} is larger than max-group-bytes ({})",
                    v.max_frame_bytes.0, v.max_group_bytes.0
                ),
            ));
        }
        let auth = auth_config(&v)?;
        let tls_generate = tls_generate(&v)?;
        let tls = tls_files(&v)?;
        let proxy_protocol_from =
            ProxySources::parse(v.proxy_protocol_from.as_deref().unwrap_or_default())
                .map_err(|reason| invalid("proxy-protocol-from", reason))?;
        let record = crate::record::RecordConfig::of(&v)?;
        let mut cfg = RelayConfig::of(v, auth, tls, tls_generate);
        cfg.proxy_protocol_from = proxy_protocol_from;
        cfg.record = record;
        if cfg.upstream_ca.is_some() && cfg.upstream_fingerprint.is_some() {
            // A pin accepts one certificate whatever its issuer: CAs would go unused.
            return Err(invalid(
                "upstream-fingerprint",
                "give --upstream-fingerprint or --upstream-ca, not both",
            ));
        }
        if let Some(ca) = &cfg.upstream_ca {
            // A leaf must not start with CAs it cannot use.
            skiff_monoio::tls::roots_from_pem_file(ca)
                .map_err(|e| invalid("upstream-ca", e.to_string()))?;
        }
        let q = cfg.quotas;
        for (key, v) in [
            ("max-connections-per-ip", q.connections_per_ip.unwrap_or(1)),
            ("max-handshakes-per-ip", q.handshakes_per_ip),
            ("max-handshakes", q.handshakes),
            ("max-relay-tracks", q.relay_tracks),
            ("max-announces", q.announces),
            ("cluster-max-announces", q.cluster_announces),
            ("max-pending-tracks", q.pending_tracks),
            (
                "max-pending-tracks-per-broadcast",
                q.pending_tracks_per_broadcast,
            ),
        ] {
            if v == 0 {
                return Err(invalid(key, "must be at least 1"));
            }
        }
        if q.relay_tracks > 1 << 20 {
            return Err(invalid("max-relay-tracks", "must be at most 1048576"));
        }
        for (key, d) in [
            ("handshake-timeout", cfg.timeouts.handshake),
            ("idle-timeout", cfg.timeouts.idle),
            ("write-timeout", cfg.timeouts.write),
        ] {
            if d < Duration::from_millis(1) {
                return Err(invalid(key, "must be at least 1ms"));
            }
        }
        if cfg.stream_credit < 1024 || cfg.stream_credit > MAX_CREDIT {
            return Err(invalid(
                "stream-credit",
                format!("must be between 1KiB and {MAX_CREDIT} bytes"),
            ));
        }
        let connection = cfg.connection_credit();
        if connection < cfg.stream_credit || connection > MAX_CREDIT {
            return Err(invalid(
                "connection-credit",
                format!(
                    "must be between stream-credit ({}) and {MAX_CREDIT} bytes",
                    cfg.stream_credit
                ),
            ));
        }
        if cfg
            .send_buffer
            .is_some_and(|b| !(4096..=i32::MAX as u64 / 2).contains(&b))
        {
            return Err(invalid("send-buffer", "must be between 4KiB and 1GiB"));
        }
        let cfg = check_cluster(cfg)?;
        if cfg.metrics.is_some() && cfg.metrics == Some(cfg.listen) && cfg.listen.port() != 0 {
            return Err(invalid("metrics", "must differ from the listen address"));
        }
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests;
