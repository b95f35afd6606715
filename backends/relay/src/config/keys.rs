//! Every setting of the relay, declared once: its flag (`--max-streams`),
//! its TOML key (`max-streams`, or `max_streams`), its type, its help text
//! and its default. The command line and the TOML file both fill the one
//! [`Settings`] struct; [`Settings::overlay`] lays the flags over the file,
//! and [`Settings::values`] fills in the defaults.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use skiff_core::relay::Quota;
use skiff_monoio::driver::DriverKind;
use skiff_monoio::tls::Fingerprint;

use super::cluster::{ClusterPeer, PeerListSource, one_or_many};
use super::values::{ByteSize, DurationArg, LogLevel, Spelling, Upstream, from_text};

/// Default listen address, as `--help` writes it.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:4443";

/// Default listen address: [`DEFAULT_LISTEN`].
pub const DEFAULT_LISTEN_ADDR: SocketAddr =
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 4443));

/// Default per-stream window: 256 KiB, as moq-dev (docs/protocol.md §1.4).
pub const DEFAULT_STREAM_CREDIT: u64 = 256 << 10;

/// The type a setting has once its default is applied: the declared type
/// for a setting with a default, else `Option` of it.
macro_rules! value_type {
    ($ty:ty) => { Option<$ty> };
    ($ty:ty, $default:expr) => { $ty };
}

/// A setting's value with its default applied, if it has one.
macro_rules! with_default {
    ($value:expr) => {
        $value
    };
    ($value:expr, $default:expr) => {
        $value.unwrap_or_else(|| $default)
    };
}

/// The `[default: …]` text `--help` shows for a setting with a default.
macro_rules! default_spelling {
    ($ty:ty) => {
        None
    };
    ($ty:ty, $default:expr) => {{
        let value: $ty = $default;
        Some(Spelling::spelling(&value))
    }};
}

/// Declares the settings. Each entry is one setting:
///
/// ```text
/// /// Help text (the doc comment is the `--help` line).
/// #[arg(value_name = "N")]          // more clap attributes, if any
/// #[serde(...)]                     // more serde attributes, if any
/// field_name: Type = default;       // `= default` optional
/// ```
///
/// The flag is `--field-name`, the TOML key `field-name` (or
/// `field_name`). With `= default`, `--help` appends `[default: …]` (the
/// value's [`Spelling`]) and [`Values`] holds `Type`; without it, `Values`
/// holds `Option<Type>` and the help text says what happens by default.
macro_rules! settings {
    ($(
        $(#[$attr:meta])*
        $key:ident : $ty:ty $(= $default:expr)?;
    )*) => {
        /// The relay's settings as the command line or the TOML file gives
        /// them: each one `None` where that source does not set it.
        #[derive(Debug, Clone, Default, Args, serde::Deserialize)]
        #[serde(deny_unknown_fields, rename_all = "kebab-case")]
        #[command(mut_args = show_default)]
        pub struct Settings {
            $(
                $(#[$attr])*
                #[arg(long, global = true)]
                pub $key: Option<$ty>,
            )*
        }

        /// Every setting's value: what the flags or the file gave, else its
        /// default (`None` for a setting whose default is worked out from
        /// others, or is to go without).
        #[derive(Debug, Clone)]
        pub struct Values {
            $(
                #[doc = concat!("The value of [`Settings::", stringify!($key), "`].")]
                pub $key: value_type!($ty $(, $default)?),
            )*
        }

        impl Settings {
            /// The settings' field names (`max_streams`), in declaration
            /// order; with `-` for `_` each is a TOML key and, after `--`, a
            /// flag ([`Settings::keys`]).
            #[cfg(test)]
            pub const FIELDS: &'static [&'static str] = &[$(stringify!($key)),*];

            /// These settings with `over` laid on top: each setting `over`
            /// gives replaces this one's.
            pub fn overlay(self, over: Settings) -> Settings {
                Settings {
                    $( $key: over.$key.or(self.$key), )*
                }
            }

            /// The values of these settings, each one not given at its
            /// default.
            pub fn values(self) -> Values {
                Values {
                    $( $key: with_default!(self.$key $(, $default)?), )*
                }
            }

            /// The `[default: …]` of the setting whose field is `field`.
            pub fn default_spelling(field: &str) -> Option<String> {
                match field {
                    $( stringify!($key) => default_spelling!($ty $(, $default)?), )*
                    _ => None,
                }
            }
        }
    };
}

/// Appends a setting's declared default to its help text.
fn show_default(arg: clap::Arg) -> clap::Arg {
    let Some(default) = Settings::default_spelling(arg.get_id().as_str()) else {
        return arg;
    };
    let with = |help: &clap::builder::StyledStr| format!("{help} [default: {default}]");
    let long = arg.get_long_help().map(with);
    let short = arg.get_help().map(with);
    let arg = match short {
        Some(help) => arg.help(help),
        None => arg,
    };
    match long {
        Some(help) => arg.long_help(help),
        None => arg,
    }
}

settings! {
    /// Address to accept QMux/TCP connections on.
    #[arg(value_name = "ADDR")]
    #[serde(default, deserialize_with = "from_text")]
    listen: SocketAddr = DEFAULT_LISTEN_ADDR;

    /// Also serve moq-lite over QUIC (`moql://`) on UDP at the listen
    /// address's port, with the listen port's certificate (a relay without
    /// one serves TCP only). `--quic=false` turns it off.
    #[arg(value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    quic: bool = true;

    /// Hand the kernel up to 16 QUIC datagrams per send, cut below the
    /// socket (UDP GSO); `--quic-gso=false` sends one datagram per system
    /// call.
    #[arg(value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    quic_gso: bool = true;

    /// Bytes all the QUIC connections of a worker thread may hold
    /// unacknowledged or unsent: the send window of each connection with a
    /// session is an equal share, between 16KiB and 512KiB (a viewer that
    /// falls behind holds its window of the relay's memory).
    #[arg(value_name = "BYTES")]
    quic_send_budget: ByteSize = ByteSize::mib(16);

    /// New QUIC connections must first prove their address with a Retry
    /// while this many connections of the worker thread are still in their
    /// handshake; 0 asks every new connection [default: a quarter of
    /// --max-handshakes].
    #[arg(value_name = "N")]
    quic_retry_above: u32;

    /// Worker threads, one io runtime and listener each [default: all cores].
    #[arg(value_name = "N")]
    threads: usize;

    /// Upstream relay, `tcp://HOST:PORT/PATH`, `tls://HOST:PORT/PATH` or
    /// `moql://HOST:PORT/PATH` (moq-lite over QUIC).
    #[arg(value_name = "URL")]
    #[serde(default, deserialize_with = "from_text")]
    upstream: Upstream;

    /// Bytes of group cache per worker thread.
    #[arg(value_name = "BYTES")]
    cache_bytes: ByteSize = ByteSize::mib(256);

    /// Open connections allowed per worker thread; more are accepted and
    /// closed at once.
    #[arg(value_name = "N")]
    max_connections: u32 = 10_000;

    /// Concurrent streams per connection.
    #[arg(value_name = "N")]
    max_streams: u32 = 1_000;

    /// Subscriptions per session.
    #[arg(value_name = "N")]
    max_subscriptions: u32 = 1_024;

    /// Largest frame accepted.
    #[arg(value_name = "BYTES")]
    max_frame_bytes: ByteSize = ByteSize::mib(4);

    /// Largest group accepted.
    #[arg(value_name = "BYTES")]
    max_group_bytes: ByteSize = ByteSize::mib(16);

    /// Serve Prometheus metrics over HTTP on this address.
    #[arg(value_name = "ADDR")]
    #[serde(default, deserialize_with = "from_text")]
    metrics: SocketAddr;

    /// Log level: off, error, warn, info, debug, trace.
    #[arg(value_name = "LEVEL")]
    #[serde(default, deserialize_with = "from_text")]
    log: LogLevel = LogLevel(tracing::level_filters::LevelFilter::INFO);

    /// I/O driver: auto, io-uring or legacy (epoll).
    #[arg(value_name = "DRIVER")]
    #[serde(default, deserialize_with = "from_text")]
    driver: DriverKind = DriverKind::Auto;

    /// How long open connections may take to finish after SIGINT/SIGTERM.
    #[arg(value_name = "DURATION")]
    drain_timeout: DurationArg = DurationArg::secs(5);

    /// How long a broadcast whose publisher left keeps its subscribers
    /// waiting for it to be announced again (publisher failover).
    #[arg(value_name = "DURATION")]
    failover_grace: DurationArg = DurationArg::secs(10);

    /// Verify access tokens with this JWK file (docs/protocol.md §4.10).
    #[arg(value_name = "FILE")]
    auth_key: PathBuf;

    /// Verify access tokens with `{kid}.jwk` files of this directory, looked
    /// at again for every token (key rotation needs no restart).
    #[arg(value_name = "DIR")]
    auth_key_dir: PathBuf;

    /// Patterns anonymous sessions may publish and subscribe to, rooted at
    /// `/` (`anon/**`); repeatable or comma-separated.
    #[arg(value_name = "PATTERNS", value_delimiter = ',')]
    auth_public: Vec<String>;

    /// A file holding the token presented to `--upstream` (as `?jwt=`).
    #[arg(value_name = "FILE")]
    upstream_token_file: PathBuf;

    /// PEM certificate chain (server certificate first): with `--tls-key`
    /// the listen port speaks TLS only, QMux as `tls://` and WebSocket as
    /// `wss://`; re-read on SIGHUP (docs/protocol.md §9.8).
    #[arg(value_name = "FILE")]
    tls_cert: PathBuf;

    /// PEM private key of `--tls-cert` (PKCS#8, PKCS#1 or SEC1); re-read on SIGHUP.
    #[arg(value_name = "FILE")]
    tls_key: PathBuf;

    /// Serve TLS with a self-signed ECDSA P-256 certificate made at start
    /// for these hosts (DNS names or IP addresses; comma-separated), valid
    /// 14 days and renewed after 7 without a restart; its SHA-256 is at
    /// `GET /certificate.sha256`. Not with `--tls-cert`/`--tls-key`.
    #[arg(value_name = "HOST", value_delimiter = ',')]
    tls_generate: Vec<String>;

    /// PEM CA certificates a `tls://` or `moql://` upstream's certificate
    /// must chain to [default: the system's trust store].
    #[arg(value_name = "FILE")]
    upstream_ca: PathBuf;

    /// Accept exactly the `tls://` or `moql://` upstream certificate with
    /// this SHA-256 (64 hex digits, what its `GET /certificate.sha256`
    /// answers), whatever its issuer, names or dates; not with
    /// `--upstream-ca`.
    #[arg(value_name = "HEX")]
    #[serde(default, deserialize_with = "from_text")]
    upstream_fingerprint: Fingerprint;

    /// A cluster peer to dial and keep a session with, carrying
    /// announcements and subscriptions both ways: `tcp://`, `tls://` or
    /// `moql://HOST:PORT/PATH`, with `?jwt=TOKEN` for a token of its own
    /// and `?cost=N` (kept, not sent: moq-lite-05 has no link cost);
    /// repeatable or comma-separated. In TOML also an object `{url, cost,
    /// egress, token}`.
    #[arg(value_name = "URL", value_delimiter = ',')]
    #[serde(default, deserialize_with = "one_or_many")]
    cluster_connect: Vec<ClusterPeer>;

    /// A peer list re-read at run time: a file (read again when it
    /// changes) or an http(s):// URL (polled), holding a JSON array of
    /// peers as `--cluster-connect` takes them; peers added are dialed,
    /// peers removed closed, and a list that cannot be read or parsed
    /// leaves the last good one in use.
    #[arg(value_name = "FILE|URL")]
    #[serde(default, deserialize_with = "from_text")]
    cluster_connect_api: PeerListSource;

    /// This relay's hop id in the cluster: non-zero, below 2^62 (below
    /// 2^53 for older JavaScript clients) [default: random at each start].
    #[arg(value_name = "N")]
    cluster_id: u64;

    /// Longest hop list accepted or forwarded, from 1 to 32.
    #[arg(value_name = "N")]
    cluster_max_hops: usize = 32;

    /// Broadcasts one cluster peer may announce at once, per worker thread
    /// (its routes and standbys); more are refused and counted, the peer's
    /// other routes kept.
    #[arg(value_name = "N")]
    cluster_max_announces: u32 = 1024;

    /// A file holding the token (JWT) presented to cluster peers as
    /// `?jwt=`, unless a peer's URL or entry carries its own; never logged.
    #[arg(value_name = "FILE")]
    cluster_token: PathBuf;

    /// This relay's own URL: a peer entry naming it is skipped.
    #[arg(value_name = "URL")]
    cluster_node: String;

    /// Time a new connection has to complete the QMux handshake and SETUP,
    /// and a started record or control message to complete, before it is
    /// closed.
    #[arg(value_name = "DURATION")]
    handshake_timeout: DurationArg = DurationArg::secs(10);

    /// QMux idle timeout advertised: a connection that sends nothing for this
    /// long is dropped.
    #[arg(value_name = "DURATION")]
    idle_timeout: DurationArg = DurationArg::secs(30);

    /// A connection whose socket accepts no byte for this long while the relay
    /// has bytes for it is dropped (the peer stopped reading).
    #[arg(value_name = "DURATION")]
    write_timeout: DurationArg = DurationArg::secs(10);

    /// Flow-control window of each stream the peer opens (QMux
    /// initial_max_stream_data_*).
    #[arg(value_name = "BYTES")]
    stream_credit: ByteSize = ByteSize(DEFAULT_STREAM_CREDIT);

    /// Flow-control window of a whole connection (QMux initial_max_data)
    /// [default: the larger of 1MiB and 4 x --stream-credit].
    #[arg(value_name = "BYTES")]
    connection_credit: ByteSize;

    /// Kernel send buffer (SO_SNDBUF) of each accepted connection: what a
    /// peer that stopped reading can hold in the kernel [default: autotuned].
    #[arg(value_name = "BYTES")]
    send_buffer: ByteSize;

    /// Acknowledge at once after a read that drained the socket
    /// (TCP_QUICKACK) on connections whose peer may publish, so a publisher
    /// without TCP_NODELAY (moq-net's TCP transport) is not held back by the
    /// relay's delayed ACK: about 40 ms less p99 latency for such
    /// publishers. A peer whose SETUP says it only subscribes is left to the
    /// kernel's delayed ACKs. `--quick-ack=false` turns it off.
    #[arg(value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    quick_ack: bool = true;

    /// Directory of the web player served on the listen port (`GET /`,
    /// `GET /<file>`) [default: the repository's web/dist].
    #[arg(value_name = "DIR")]
    web_dir: PathBuf;

    /// Open connections allowed from one IP address per worker thread, in
    /// their handshake or established; more are closed at once. Viewers
    /// behind one NAT or load balancer share an address [default: no
    /// limit].
    #[arg(value_name = "N")]
    max_connections_per_ip: u32;

    /// Connections from one IP address per worker thread that have not
    /// finished their handshake (TLS, WebSocket upgrade, QMux or QUIC
    /// handshake and SETUP, and its token check); more are closed at once
    /// (QUIC: CONNECTION_REFUSED) [default: a quarter of --max-handshakes].
    #[arg(value_name = "N")]
    max_handshakes_per_ip: u32;

    /// Connections per worker thread that have not finished their QMux or
    /// QUIC handshake and SETUP; more are closed at once.
    #[arg(value_name = "N")]
    max_handshakes: u32 = 1024;

    /// Load balancers (an IP address or a CIDR block; repeatable or
    /// comma-separated) whose TCP connections must start with a PROXY
    /// protocol header (v1 or v2) naming the client; per-address limits
    /// and logs then see the client's address. Other addresses may not
    /// send one [default: none].
    #[arg(value_name = "CIDR", value_delimiter = ',')]
    proxy_protocol_from: Vec<String>;

    /// Relay tracks per worker thread (the table is made at start, about
    /// 6 KiB each); a request for a new track past it is refused with
    /// EVICTED (0x35).
    #[arg(value_name = "N")]
    max_relay_tracks: u32 = 1024;

    /// Broadcasts one connection may announce at once; more are ignored.
    #[arg(value_name = "N")]
    max_announces: u32 = 64;

    /// Track requests of one connection waiting for their source's first
    /// answer; more are refused with EVICTED (0x35).
    #[arg(value_name = "N")]
    max_pending_tracks: u32 = 32;

    /// Track requests waiting for their source's first answer in one
    /// broadcast, from all connections; more are refused with EVICTED (0x35).
    #[arg(value_name = "N")]
    max_pending_tracks_per_broadcast: u32 = 32;

    /// TRACK requests of one connection waiting at once for a relay track's
    /// TRACK_INFO; more are refused with EVICTED (0x35).
    #[arg(value_name = "N")]
    max_waiting_track_requests: u32 = 16;

    /// FETCHes of one connection answered or waiting for an answer at once
    /// (docs/protocol.md §3.10); more are refused with EVICTED (0x35).
    #[arg(value_name = "N")]
    max_fetches: u32 = 4;

    // --- Recording (`crate::record`) ---

    /// Record the broadcasts whose path matches this pattern (moq-dev's
    /// patterns, as `--auth-public`: `anon/**`, `cams/*.hang`) to
    /// `--record-dir` while they are relayed; repeatable or comma-separated.
    #[arg(value_name = "PATTERN", value_delimiter = ',')]
    record: Vec<String>;

    /// Directory the recordings are stored in (one directory per
    /// broadcast); needed by `--record`.
    #[arg(value_name = "DIR")]
    record_dir: PathBuf;

    /// Delete recorded segments older than this, oldest first
    /// [default: keep them].
    #[arg(value_name = "DURATION")]
    record_retain: DurationArg;

    /// Keep all recordings together below this many bytes, deleting the
    /// oldest segments first [default: no bound].
    #[arg(value_name = "BYTES")]
    record_max_bytes: ByteSize;

    /// Bytes of recorded groups waiting for the disk writer; a group that
    /// does not fit is not recorded (counted and logged), live delivery is
    /// untouched.
    #[arg(value_name = "BYTES")]
    record_queue_bytes: ByteSize = ByteSize::mib(64);

    /// Recordings served back as replay broadcasts (`PATH/replay`: the
    /// catalog with its `archive` entry and the `timeline.z` track), the
    /// newest first; older ones are counted in
    /// `skiff_relay_record_replays_over_limit`. 0: none.
    #[arg(value_name = "N")]
    record_replays: u32 = 64;
}

impl Settings {
    /// The flags and TOML keys (`max-streams`), in declaration order.
    #[cfg(test)]
    pub fn keys() -> impl Iterator<Item = String> {
        Self::FIELDS.iter().map(|f| f.replace('_', "-"))
    }
}

/// The setting that sets `quota`: how the relay names a refusal by the core's
/// router in logs.
pub fn quota_key(quota: Quota) -> &'static str {
    match quota {
        Quota::Announces => "max-announces",
        Quota::PendingTracks => "max-pending-tracks",
        Quota::PendingTracksPerBroadcast => "max-pending-tracks-per-broadcast",
        Quota::RelayTracks => "max-relay-tracks",
    }
}

/// The `skiff-relay` command line.
#[derive(Debug, Parser)]
#[command(
    name = "skiff-relay",
    version,
    about = "Thread-per-core io_uring moq-lite relay (QMux over TCP)."
)]
pub struct Cli {
    /// What to run; `serve` when omitted.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// TOML file with the same keys as these flags; flags override it.
    #[arg(long, value_name = "FILE", global = true)]
    pub config: Option<PathBuf>,
    /// The relay's settings given as flags.
    #[command(flatten)]
    pub settings: Settings,
}

/// A `skiff-relay` subcommand.
#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// Run the moq-lite relay (one worker per core, workers linked pairwise).
    Serve,
    /// Run the relay with a synthetic camera publisher and viewers in this
    /// process, print live progress and a summary, exit after --seconds.
    Demo(RelayDemoArgs),
    /// Write an MP4 file from a broadcast's recorded segments (no
    /// re-encoding), from `--record-dir`.
    Export(ExportArgs),
}

/// Settings of the `export` subcommand (the directory is `--record-dir`).
#[derive(Debug, Clone, Args)]
pub struct ExportArgs {
    /// The broadcast's full path, as `GET /recordings` lists it (`anon/cam.hang`).
    #[arg(long, value_name = "PATH")]
    pub broadcast: String,
    /// The track to export [default: the first recorded video track, else the first track].
    #[arg(long, value_name = "NAME")]
    pub track: Option<String>,
    /// First content time (the broadcast's timestamps) to include: the
    /// segment holding it is the first one written [default: the oldest stored].
    #[arg(long, value_name = "DURATION")]
    pub from: Option<DurationArg>,
    /// Content time to stop at: segments starting at or after it are left out
    /// [default: the newest stored].
    #[arg(long, value_name = "DURATION")]
    pub to: Option<DurationArg>,
    /// The MP4 file to write.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: PathBuf,
}

/// Settings of the `demo` subcommand (relay, publisher, viewers).
#[derive(Debug, Clone, Copy, Args)]
pub struct RelayDemoArgs {
    /// How long to run, seconds.
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// Viewers (subscribers) of the camera track.
    #[arg(long, default_value_t = 10)]
    pub viewers: usize,
    /// Frames per second of the synthetic camera (a group per second).
    #[arg(long, default_value_t = 30)]
    pub fps: u32,
    /// Bytes of a delta frame (a group's first frame is 4x larger).
    #[arg(long, default_value = "8KiB")]
    pub frame_bytes: ByteSize,
    /// Publisher and viewers dial `ws://` (QMux over WebSocket) instead of
    /// `tcp://`: the same as `--transport ws`.
    #[arg(long, conflicts_with = "transport")]
    pub websocket: bool,
    /// How the demo's camera and viewers reach the relay: `tcp://`, `ws://`,
    /// or `moql://` (QUIC on UDP at the relay's port, its `--tls-generate`
    /// certificate pinned by fingerprint; the TCP port stays plain for
    /// browsers).
    #[arg(long, value_enum, default_value_t = DemoTransport::Tcp)]
    pub transport: DemoTransport,
}

impl RelayDemoArgs {
    /// The transport the camera and viewers use (`--websocket` is `ws`).
    pub fn transport(&self) -> DemoTransport {
        if self.websocket {
            DemoTransport::Ws
        } else {
            self.transport
        }
    }
}

/// The transport of the demo's own clients (`skiff-relay demo --transport`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DemoTransport {
    /// QMux over plain TCP (`tcp://`).
    Tcp,
    /// QMux over WebSocket on the TCP port (`ws://`).
    Ws,
    /// moq-lite over QUIC on UDP at the TCP port's number (`moql://`).
    Quic,
}

impl DemoTransport {
    /// The URL scheme the demo's clients dial.
    pub fn scheme(self) -> &'static str {
        match self {
            DemoTransport::Tcp => "tcp",
            DemoTransport::Ws => "ws",
            DemoTransport::Quic => "moql",
        }
    }
}
