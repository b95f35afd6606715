//! Relay configuration: command-line flags, the optional TOML file, and the
//! validated [`RelayConfig`] built from both (flags override the file).
//!
//! The file uses the flags' long names as keys (`max-connections = 100`);
//! the snake_case spelling (`max_connections`) is accepted too. Unknown keys
//! are an error, so a typo never silently falls back to a default.

use std::fmt;
use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use serde::Deserialize;

use skiff_monoio::driver::DriverKind;
use skiff_monoio::tls::PemError;

use crate::tls::TlsFiles;

/// Default listen address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:4443";

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
// Value types shared by flags and file
// ---------------------------------------------------------------------------

/// A byte count written as a plain integer or with a unit suffix
/// (`64KiB`, `16MiB`, `1GiB`, `500kB`, `2MB`; case-insensitive, `K`/`M`/`G` are binary).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

/// Why a textual value could not be parsed (used by the flag and file parsers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseValueError(pub(crate) String);

impl fmt::Display for ParseValueError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ParseValueError {}

fn split_number(s: &str) -> Result<(u64, &str), ParseValueError> {
    let s = s.trim();
    let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(end);
    if digits.is_empty() {
        return Err(ParseValueError(format!(
            "`{s}` does not start with a number"
        )));
    }
    let n = digits
        .parse::<u64>()
        .map_err(|_| ParseValueError(format!("`{digits}` is too large")))?;
    Ok((n, unit.trim()))
}

impl FromStr for ByteSize {
    type Err = ParseValueError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (n, unit) = split_number(s)?;
        let mult: u64 = match unit.to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kib" => 1 << 10,
            "m" | "mib" => 1 << 20,
            "g" | "gib" => 1 << 30,
            "kb" => 1_000,
            "mb" => 1_000_000,
            "gb" => 1_000_000_000,
            other => {
                return Err(ParseValueError(format!(
                    "unknown size unit `{other}` (use B, KiB, MiB, GiB, kB, MB or GB)"
                )));
            }
        };
        n.checked_mul(mult)
            .map(ByteSize)
            .ok_or_else(|| ParseValueError(format!("`{s}` does not fit in 64 bits")))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} bytes", self.0)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Int(n) => Ok(ByteSize(n)),
            Raw::Text(s) => s.parse().map_err(serde::de::Error::custom),
        }
    }
}

/// A duration written as `500ms`, `5s`, `2m`, or a plain number of seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DurationArg(pub Duration);

impl FromStr for DurationArg {
    type Err = ParseValueError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (n, unit) = split_number(s)?;
        let d = match unit {
            "ms" => Duration::from_millis(n),
            "" | "s" => Duration::from_secs(n),
            "m" => Duration::from_secs(n.saturating_mul(60)),
            other => {
                return Err(ParseValueError(format!(
                    "unknown time unit `{other}` (use ms, s or m)"
                )));
            }
        };
        Ok(DurationArg(d))
    }
}

impl<'de> Deserialize<'de> for DurationArg {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Int(n) => Ok(DurationArg(Duration::from_secs(n))),
            Raw::Text(s) => s.parse().map_err(serde::de::Error::custom),
        }
    }
}

/// The upstream relay this one forwards announcements and subscriptions to,
/// written `tcp://HOST:PORT/PATH` or, over TLS, `tls://HOST:PORT/PATH`
/// (PATH may be empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    /// Host name or IP address (IPv6 without brackets).
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// Broadcast path prefix sent in SETUP, without the leading `/`.
    pub path: String,
    /// Dial it over TLS (`tls://`, docs/protocol.md §9.8), the host as the
    /// name its certificate must carry.
    pub tls: bool,
}

impl FromStr for Upstream {
    type Err = ParseValueError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (tls, rest) = if let Some(rest) = s.strip_prefix("tcp://") {
            (false, rest)
        } else if let Some(rest) = s.strip_prefix("tls://") {
            (true, rest)
        } else {
            return Err(ParseValueError(format!(
                "`{s}` must start with tcp:// or tls:// (QMux over TCP, or over TLS)"
            )));
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, ""),
        };
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (host, after) = v6
                .split_once(']')
                .ok_or_else(|| ParseValueError(format!("`{authority}` has an unclosed `[`")))?;
            let port = after
                .strip_prefix(':')
                .ok_or_else(|| ParseValueError(format!("`{authority}` has no :PORT")))?;
            (host, port)
        } else {
            authority
                .rsplit_once(':')
                .ok_or_else(|| ParseValueError(format!("`{authority}` has no :PORT")))?
        };
        if host.is_empty() {
            return Err(ParseValueError(format!("`{s}` has an empty host")));
        }
        let port: u16 = port
            .parse()
            .map_err(|_| ParseValueError(format!("`{port}` is not a TCP port")))?;
        if port == 0 {
            return Err(ParseValueError("upstream port 0 is not connectable".into()));
        }
        Ok(Upstream {
            host: host.to_owned(),
            port,
            path: path.to_owned(),
            tls,
        })
    }
}

impl fmt::Display for Upstream {
    /// The URL without its query, which may hold a token (kept out of logs).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (path, query) = self.path.split_once('?').unwrap_or((&self.path, ""));
        let hidden = if query.is_empty() { "" } else { "?…" };
        let scheme = if self.tls { "tls" } else { "tcp" };
        if self.host.contains(':') {
            write!(f, "{scheme}://[{}]:{}/{path}{hidden}", self.host, self.port)
        } else {
            write!(f, "{scheme}://{}:{}/{path}{hidden}", self.host, self.port)
        }
    }
}

/// A log verbosity: `off`, `error`, `warn`, `info`, `debug` or `trace`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogLevel(pub tracing::level_filters::LevelFilter);

impl FromStr for LogLevel {
    type Err = ParseValueError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.parse::<tracing::level_filters::LevelFilter>()
            .map(LogLevel)
            .map_err(|_| {
                ParseValueError(format!(
                    "unknown log level `{s}` (use off, error, warn, info, debug or trace)"
                ))
            })
    }
}

/// Deserializes any `FromStr` value from a TOML string.
fn from_text<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: FromStr,
    T::Err: fmt::Display,
{
    let s = String::deserialize(d)?;
    s.parse().map(Some).map_err(serde::de::Error::custom)
}

// ---------------------------------------------------------------------------
// Command line
// ---------------------------------------------------------------------------

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
    /// Settings shared by every subcommand.
    #[command(flatten)]
    pub flags: Flags,
}

/// A `skiff-relay` subcommand.
#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// Run the moq-lite relay (one worker per core, workers linked pairwise).
    Serve,
    /// Run the relay with a synthetic camera publisher and viewers in this
    /// process, print live progress and a summary, exit after --seconds.
    Demo(RelayDemoArgs),
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
    /// Publisher and viewers dial `ws://` (QMux over WebSocket) instead of `tcp://`.
    #[arg(long)]
    pub websocket: bool,
}

/// Relay settings given as flags; each may also come from the file.
#[derive(Debug, Clone, Default, Args)]
pub struct Flags {
    /// TOML file with the same keys as these flags; flags override it.
    #[arg(long, value_name = "FILE", global = true)]
    pub config: Option<PathBuf>,
    /// Address to accept QMux/TCP connections on [default: 127.0.0.1:4443].
    #[arg(long, value_name = "ADDR", global = true)]
    pub listen: Option<SocketAddr>,
    /// Worker threads, one io runtime and listener each [default: all cores].
    #[arg(long, value_name = "N", global = true)]
    pub threads: Option<usize>,
    /// Upstream relay, `tcp://HOST:PORT/PATH` or `tls://HOST:PORT/PATH`.
    #[arg(long, value_name = "URL", global = true)]
    pub upstream: Option<Upstream>,
    /// Bytes of group cache per worker thread [default: 256MiB].
    #[arg(long, value_name = "BYTES", global = true)]
    pub cache_bytes: Option<ByteSize>,
    /// Open connections allowed per worker thread; more are accepted and
    /// closed at once [default: 10000].
    #[arg(long, value_name = "N", global = true)]
    pub max_connections: Option<u32>,
    /// Concurrent streams per connection [default: 1000].
    #[arg(long, value_name = "N", global = true)]
    pub max_streams: Option<u32>,
    /// Subscriptions per session [default: 1024].
    #[arg(long, value_name = "N", global = true)]
    pub max_subscriptions: Option<u32>,
    /// Largest frame accepted [default: 4MiB].
    #[arg(long, value_name = "BYTES", global = true)]
    pub max_frame_bytes: Option<ByteSize>,
    /// Largest group accepted [default: 16MiB].
    #[arg(long, value_name = "BYTES", global = true)]
    pub max_group_bytes: Option<ByteSize>,
    /// Serve Prometheus metrics over HTTP on this address.
    #[arg(long, value_name = "ADDR", global = true)]
    pub metrics: Option<SocketAddr>,
    /// Log level: off, error, warn, info, debug, trace [default: info].
    #[arg(long, value_name = "LEVEL", global = true)]
    pub log: Option<LogLevel>,
    /// I/O driver: auto, io-uring or legacy (epoll) [default: auto].
    #[arg(long, value_name = "DRIVER", global = true)]
    pub driver: Option<DriverKind>,
    /// How long open connections may take to finish after SIGINT/SIGTERM [default: 5s].
    #[arg(long, value_name = "DURATION", global = true)]
    pub drain_timeout: Option<DurationArg>,
    /// How long a broadcast whose publisher left keeps its subscribers
    /// waiting for it to be announced again (publisher failover) [default: 10s].
    #[arg(long, value_name = "DURATION", global = true)]
    pub failover_grace: Option<DurationArg>,
    /// Verify access tokens with this JWK file (docs/protocol.md §4.10).
    #[arg(long, value_name = "FILE", global = true)]
    pub auth_key: Option<PathBuf>,
    /// Verify access tokens with `{kid}.jwk` files of this directory, looked
    /// at again for every token (key rotation needs no restart).
    #[arg(long, value_name = "DIR", global = true)]
    pub auth_key_dir: Option<PathBuf>,
    /// Patterns anonymous sessions may publish and subscribe to, rooted at
    /// `/` (`anon/**`); repeatable or comma-separated.
    #[arg(long, value_name = "PATTERNS", global = true, value_delimiter = ',')]
    pub auth_public: Vec<String>,
    /// A file holding the token presented to `--upstream` (as `?jwt=`).
    #[arg(long, value_name = "FILE", global = true)]
    pub upstream_token_file: Option<PathBuf>,
    /// PEM certificate chain (server certificate first): with `--tls-key`
    /// the listen port speaks TLS only, QMux as `tls://` and WebSocket as
    /// `wss://`; re-read on SIGHUP (docs/protocol.md §9.8).
    #[arg(long, value_name = "FILE", global = true)]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of `--tls-cert` (PKCS#8, PKCS#1 or SEC1); re-read on SIGHUP.
    #[arg(long, value_name = "FILE", global = true)]
    pub tls_key: Option<PathBuf>,
    /// PEM CA certificates a `tls://` upstream's certificate must chain to
    /// [default: the system's trust store].
    #[arg(long, value_name = "FILE", global = true)]
    pub upstream_ca: Option<PathBuf>,
    /// Time a new connection has to complete the QMux handshake and SETUP,
    /// and a started record or control message to complete, before it is
    /// closed [default: 10s].
    #[arg(long, value_name = "DURATION", global = true)]
    pub handshake_timeout: Option<DurationArg>,
    /// QMux idle timeout advertised: a connection that sends nothing for this
    /// long is dropped [default: 30s].
    #[arg(long, value_name = "DURATION", global = true)]
    pub idle_timeout: Option<DurationArg>,
    /// A connection whose socket accepts no byte for this long while the relay
    /// has bytes for it is dropped (the peer stopped reading) [default: 10s].
    #[arg(long, value_name = "DURATION", global = true)]
    pub write_timeout: Option<DurationArg>,
    /// Flow-control window of each stream the peer opens (QMux
    /// initial_max_stream_data_*) [default: 256KiB].
    #[arg(long, value_name = "BYTES", global = true)]
    pub stream_credit: Option<ByteSize>,
    /// Flow-control window of a whole connection (QMux initial_max_data)
    /// [default: the larger of 1MiB and 4 x --stream-credit].
    #[arg(long, value_name = "BYTES", global = true)]
    pub connection_credit: Option<ByteSize>,
    /// Kernel send buffer (SO_SNDBUF) of each accepted connection: what a
    /// peer that stopped reading can hold in the kernel [default: autotuned].
    #[arg(long, value_name = "BYTES", global = true)]
    pub send_buffer: Option<ByteSize>,
    /// Acknowledge at once after a read that drained the socket
    /// (TCP_QUICKACK) on connections whose peer may publish, so a publisher
    /// without TCP_NODELAY (moq-net's TCP transport) is not held back by the
    /// relay's delayed ACK: about 40 ms less p99 latency for such
    /// publishers. A peer whose SETUP says it only subscribes is left to the
    /// kernel's delayed ACKs. `--quick-ack=false` turns it off [default: true]
    #[arg(long, global = true, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub quick_ack: Option<bool>,
    /// Directory of the web player served on the listen port (`GET /`,
    /// `GET /<file>`) [default: the repository's web/dist].
    #[arg(long, value_name = "DIR", global = true)]
    pub web_dir: Option<PathBuf>,
    /// Open connections allowed from one IP address per worker thread; more
    /// are closed at once [default: 256].
    #[arg(long, value_name = "N", global = true)]
    pub max_connections_per_ip: Option<u32>,
    /// Connections per worker thread that have not finished their QMux
    /// handshake and SETUP; more are closed at once [default: 1024].
    #[arg(long, value_name = "N", global = true)]
    pub max_handshakes: Option<u32>,
    /// Relay tracks per worker thread (the table is made at start, about
    /// 6 KiB each); a request for a new track past it is refused with
    /// EVICTED (0x35) [default: 1024].
    #[arg(long, value_name = "N", global = true)]
    pub max_relay_tracks: Option<u32>,
    /// Broadcasts one connection may announce at once; more are ignored
    /// [default: 64].
    #[arg(long, value_name = "N", global = true)]
    pub max_announces: Option<u32>,
    /// Track requests of one connection waiting for their source's first
    /// answer; more are refused with EVICTED (0x35) [default: 32].
    #[arg(long, value_name = "N", global = true)]
    pub max_pending_tracks: Option<u32>,
    /// Track requests waiting for their source's first answer in one
    /// broadcast, from all connections; more are refused with EVICTED (0x35)
    /// [default: 32].
    #[arg(long, value_name = "N", global = true)]
    pub max_pending_tracks_per_broadcast: Option<u32>,
    /// TRACK requests of one connection waiting at once for a relay track's
    /// TRACK_INFO; more are refused with EVICTED (0x35) [default: 16].
    #[arg(long, value_name = "N", global = true)]
    pub max_waiting_track_requests: Option<u32>,
}

// ---------------------------------------------------------------------------
// File
// ---------------------------------------------------------------------------

/// The TOML configuration file; every key is optional.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct FileConfig {
    /// See [`Flags::listen`].
    #[serde(default, deserialize_with = "from_text")]
    pub listen: Option<SocketAddr>,
    /// See [`Flags::threads`].
    pub threads: Option<usize>,
    /// See [`Flags::upstream`].
    #[serde(default, deserialize_with = "from_text")]
    pub upstream: Option<Upstream>,
    /// See [`Flags::cache_bytes`].
    #[serde(alias = "cache_bytes")]
    pub cache_bytes: Option<ByteSize>,
    /// See [`Flags::max_connections`].
    #[serde(alias = "max_connections")]
    pub max_connections: Option<u32>,
    /// See [`Flags::max_streams`].
    #[serde(alias = "max_streams")]
    pub max_streams: Option<u32>,
    /// See [`Flags::max_subscriptions`].
    #[serde(alias = "max_subscriptions")]
    pub max_subscriptions: Option<u32>,
    /// See [`Flags::max_frame_bytes`].
    #[serde(alias = "max_frame_bytes")]
    pub max_frame_bytes: Option<ByteSize>,
    /// See [`Flags::max_group_bytes`].
    #[serde(alias = "max_group_bytes")]
    pub max_group_bytes: Option<ByteSize>,
    /// See [`Flags::metrics`].
    #[serde(default, deserialize_with = "from_text")]
    pub metrics: Option<SocketAddr>,
    /// See [`Flags::log`].
    #[serde(default, deserialize_with = "from_text")]
    pub log: Option<LogLevel>,
    /// See [`Flags::driver`].
    #[serde(default, deserialize_with = "from_text")]
    pub driver: Option<DriverKind>,
    /// See [`Flags::drain_timeout`].
    #[serde(alias = "drain_timeout")]
    pub drain_timeout: Option<DurationArg>,
    /// See [`Flags::failover_grace`].
    #[serde(alias = "failover_grace")]
    pub failover_grace: Option<DurationArg>,
    /// See [`Flags::auth_key`].
    #[serde(alias = "auth_key")]
    pub auth_key: Option<PathBuf>,
    /// See [`Flags::auth_key_dir`].
    #[serde(alias = "auth_key_dir")]
    pub auth_key_dir: Option<PathBuf>,
    /// See [`Flags::auth_public`].
    #[serde(default, alias = "auth_public")]
    pub auth_public: Vec<String>,
    /// See [`Flags::upstream_token_file`].
    #[serde(alias = "upstream_token_file")]
    pub upstream_token_file: Option<PathBuf>,
    /// See [`Flags::tls_cert`].
    #[serde(alias = "tls_cert")]
    pub tls_cert: Option<PathBuf>,
    /// See [`Flags::tls_key`].
    #[serde(alias = "tls_key")]
    pub tls_key: Option<PathBuf>,
    /// See [`Flags::upstream_ca`].
    #[serde(alias = "upstream_ca")]
    pub upstream_ca: Option<PathBuf>,
    /// See [`Flags::handshake_timeout`].
    #[serde(alias = "handshake_timeout")]
    pub handshake_timeout: Option<DurationArg>,
    /// See [`Flags::idle_timeout`].
    #[serde(alias = "idle_timeout")]
    pub idle_timeout: Option<DurationArg>,
    /// See [`Flags::write_timeout`].
    #[serde(alias = "write_timeout")]
    pub write_timeout: Option<DurationArg>,
    /// See [`Flags::stream_credit`].
    #[serde(alias = "stream_credit")]
    pub stream_credit: Option<ByteSize>,
    /// See [`Flags::connection_credit`].
    #[serde(alias = "connection_credit")]
    pub connection_credit: Option<ByteSize>,
    /// See [`Flags::send_buffer`].
    #[serde(alias = "send_buffer")]
    pub send_buffer: Option<ByteSize>,
    /// See [`Flags::quick_ack`].
    #[serde(alias = "quick_ack")]
    pub quick_ack: Option<bool>,
    /// See [`Flags::web_dir`].
    #[serde(alias = "web_dir")]
    pub web_dir: Option<PathBuf>,
    /// See [`Flags::max_connections_per_ip`].
    #[serde(alias = "max_connections_per_ip")]
    pub max_connections_per_ip: Option<u32>,
    /// See [`Flags::max_handshakes`].
    #[serde(alias = "max_handshakes")]
    pub max_handshakes: Option<u32>,
    /// See [`Flags::max_relay_tracks`].
    #[serde(alias = "max_relay_tracks")]
    pub max_relay_tracks: Option<u32>,
    /// See [`Flags::max_announces`].
    #[serde(alias = "max_announces")]
    pub max_announces: Option<u32>,
    /// See [`Flags::max_pending_tracks`].
    #[serde(alias = "max_pending_tracks")]
    pub max_pending_tracks: Option<u32>,
    /// See [`Flags::max_pending_tracks_per_broadcast`].
    #[serde(alias = "max_pending_tracks_per_broadcast")]
    pub max_pending_tracks_per_broadcast: Option<u32>,
    /// See [`Flags::max_waiting_track_requests`].
    #[serde(alias = "max_waiting_track_requests")]
    pub max_waiting_track_requests: Option<u32>,
}

impl FileConfig {
    /// Parses the text of a configuration file; `path` only labels errors.
    ///
    /// # Errors
    /// [`ConfigError::ParseFile`] for bad TOML, unknown keys or wrong types.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::ParseFile {
            path: path.to_owned(),
            message: e.to_string().trim_end().to_owned(),
        })
    }

    /// Reads and parses a configuration file.
    ///
    /// # Errors
    /// [`ConfigError::ReadFile`] if it cannot be read, else as [`FileConfig::parse`].
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::ReadFile {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text, path)
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
    /// The CAs a `tls://` upstream must chain to (`None`: the system's).
    pub upstream_ca: Option<PathBuf>,
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
    /// Open connections from one IP address, per worker thread.
    pub connections_per_ip: u32,
    /// Connections that have not finished their handshake, per worker thread.
    pub handshakes: u32,
    /// Relay tracks per worker thread (the size of its track table).
    pub relay_tracks: u32,
    /// Broadcasts one connection announces at once.
    pub announces: u32,
    /// Track requests of one connection waiting for their source's answer.
    pub pending_tracks: u32,
    /// Track requests waiting for their source's answer in one broadcast.
    pub pending_tracks_per_broadcast: u32,
    /// TRACK requests of one connection waiting for TRACK_INFO at once.
    pub waiting_track_requests: u32,
}

impl Default for Quotas {
    fn default() -> Self {
        Quotas {
            connections_per_ip: 256,
            handshakes: 1024,
            relay_tracks: 1024,
            announces: 64,
            pending_tracks: 32,
            pending_tracks_per_broadcast: 32,
            waiting_track_requests: 16,
        }
    }
}

/// The access-control settings of `flags` over `file`.
fn auth_config(file: &FileConfig, flags: &Flags) -> Result<AuthConfig, ConfigError> {
    let key = flags.auth_key.clone().or_else(|| file.auth_key.clone());
    let key_dir = flags
        .auth_key_dir
        .clone()
        .or_else(|| file.auth_key_dir.clone());
    if key.is_some() && key_dir.is_some() {
        return Err(invalid(
            "auth-key",
            "give --auth-key or --auth-key-dir, not both",
        ));
    }
    let texts = if flags.auth_public.is_empty() {
        &file.auth_public
    } else {
        &flags.auth_public
    };
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

/// The TLS files of `flags` over `file`, read once to check them: a relay
/// must not start with a certificate or key it cannot use.
fn tls_files(file: &FileConfig, flags: &Flags) -> Result<Option<TlsFiles>, ConfigError> {
    let cert = flags.tls_cert.clone().or_else(|| file.tls_cert.clone());
    let key = flags.tls_key.clone().or_else(|| file.tls_key.clone());
    let files = match (cert, key) {
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

/// Most worker threads accepted (a sanity bound, far above any core count here).
pub const MAX_THREADS: usize = 1024;

impl Default for RelayConfig {
    fn default() -> Self {
        let threads = std::thread::available_parallelism().unwrap_or(NonZeroUsize::MIN);
        RelayConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 4443)),
            threads,
            upstream: None,
            cache_bytes: 256 << 20,
            limits: Limits {
                max_connections: 10_000,
                max_streams: 1_000,
                max_subscriptions: 1_024,
                max_frame_bytes: 4 << 20,
                max_group_bytes: 16 << 20,
            },
            metrics: None,
            log: LogLevel(tracing::level_filters::LevelFilter::INFO),
            driver: DriverKind::Auto,
            drain_timeout: Duration::from_secs(5),
            failover_grace: Duration::from_secs(10),
            timeouts: Timeouts {
                handshake: Duration::from_secs(10),
                idle: Duration::from_secs(30),
                write: Duration::from_secs(10),
            },
            stream_credit: DEFAULT_STREAM_CREDIT,
            connection_credit: None,
            send_buffer: None,
            quick_ack: true,
            quotas: Quotas::default(),
            web_dir: default_web_dir(),
            auth: AuthConfig::default(),
            upstream_token_file: None,
            tls: None,
            upstream_ca: None,
        }
    }
}

/// How much later than the driver's handshake deadline the QMux
/// connection's own (silent) one fires.
const HANDSHAKE_BACKSTOP: Duration = Duration::from_secs(1);

/// Default per-stream window: 256 KiB, as moq-dev (docs/protocol.md §1.4).
pub const DEFAULT_STREAM_CREDIT: u64 = 256 << 10;

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
        config
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

    /// Builds the configuration from flags, reading `--config` if given.
    ///
    /// # Errors
    /// Any [`ConfigError`]: unreadable or invalid file, or a value out of range.
    pub fn load(flags: &Flags) -> Result<Self, ConfigError> {
        let file = match &flags.config {
            Some(path) => FileConfig::load(path)?,
            None => FileConfig::default(),
        };
        Self::merge(&file, flags)
    }

    /// Applies `file` over the defaults, then `flags` over that, and validates.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] for a value out of range or inconsistent limits.
    pub fn merge(file: &FileConfig, flags: &Flags) -> Result<Self, ConfigError> {
        let d = RelayConfig::default();
        let threads = flags.threads.or(file.threads).unwrap_or(d.threads.get());
        let threads =
            NonZeroUsize::new(threads).ok_or_else(|| invalid("threads", "must be at least 1"))?;
        if threads.get() > MAX_THREADS {
            return Err(invalid(
                "threads",
                format!("{threads} is more than {MAX_THREADS}"),
            ));
        }
        let limits = Limits {
            max_connections: flags
                .max_connections
                .or(file.max_connections)
                .unwrap_or(d.limits.max_connections),
            max_streams: flags
                .max_streams
                .or(file.max_streams)
                .unwrap_or(d.limits.max_streams),
            max_subscriptions: flags
                .max_subscriptions
                .or(file.max_subscriptions)
                .unwrap_or(d.limits.max_subscriptions),
            max_frame_bytes: flags
                .max_frame_bytes
                .or(file.max_frame_bytes)
                .map_or(d.limits.max_frame_bytes, |b| b.0),
            max_group_bytes: flags
                .max_group_bytes
                .or(file.max_group_bytes)
                .map_or(d.limits.max_group_bytes, |b| b.0),
        };
        if limits.max_connections == 0 {
            return Err(invalid("max-connections", "must be at least 1"));
        }
        if limits.max_streams == 0 {
            return Err(invalid("max-streams", "must be at least 1"));
        }
        if limits.max_subscriptions == 0 {
            return Err(invalid("max-subscriptions", "must be at least 1"));
        }
        if limits.max_frame_bytes == 0 {
            return Err(invalid("max-frame-bytes", "must be at least 1"));
        }
        if limits.max_frame_bytes > limits.max_group_bytes {
            return Err(invalid(
                "max-frame-bytes",
                format!(
                    "{} is larger than max-group-bytes ({})",
                    limits.max_frame_bytes, limits.max_group_bytes
                ),
            ));
        }
        let cfg = RelayConfig {
            listen: flags.listen.or(file.listen).unwrap_or(d.listen),
            threads,
            upstream: flags.upstream.clone().or_else(|| file.upstream.clone()),
            cache_bytes: flags
                .cache_bytes
                .or(file.cache_bytes)
                .map_or(d.cache_bytes, |b| b.0),
            limits,
            metrics: flags.metrics.or(file.metrics),
            log: flags.log.or(file.log).unwrap_or(d.log),
            driver: flags.driver.or(file.driver).unwrap_or(d.driver),
            drain_timeout: flags
                .drain_timeout
                .or(file.drain_timeout)
                .map_or(d.drain_timeout, |t| t.0),
            failover_grace: flags
                .failover_grace
                .or(file.failover_grace)
                .map_or(d.failover_grace, |t| t.0),
            timeouts: Timeouts {
                handshake: flags
                    .handshake_timeout
                    .or(file.handshake_timeout)
                    .map_or(d.timeouts.handshake, |t| t.0),
                idle: flags
                    .idle_timeout
                    .or(file.idle_timeout)
                    .map_or(d.timeouts.idle, |t| t.0),
                write: flags
                    .write_timeout
                    .or(file.write_timeout)
                    .map_or(d.timeouts.write, |t| t.0),
            },
            stream_credit: flags
                .stream_credit
                .or(file.stream_credit)
                .map_or(d.stream_credit, |b| b.0),
            connection_credit: flags
                .connection_credit
                .or(file.connection_credit)
                .map(|b| b.0),
            send_buffer: flags.send_buffer.or(file.send_buffer).map(|b| b.0),
            quick_ack: flags.quick_ack.or(file.quick_ack).unwrap_or(true),
            web_dir: flags
                .web_dir
                .clone()
                .or_else(|| file.web_dir.clone())
                .unwrap_or(d.web_dir.clone()),
            quotas: Quotas {
                connections_per_ip: flags
                    .max_connections_per_ip
                    .or(file.max_connections_per_ip)
                    .unwrap_or(d.quotas.connections_per_ip),
                handshakes: flags
                    .max_handshakes
                    .or(file.max_handshakes)
                    .unwrap_or(d.quotas.handshakes),
                relay_tracks: flags
                    .max_relay_tracks
                    .or(file.max_relay_tracks)
                    .unwrap_or(d.quotas.relay_tracks),
                announces: flags
                    .max_announces
                    .or(file.max_announces)
                    .unwrap_or(d.quotas.announces),
                pending_tracks: flags
                    .max_pending_tracks
                    .or(file.max_pending_tracks)
                    .unwrap_or(d.quotas.pending_tracks),
                pending_tracks_per_broadcast: flags
                    .max_pending_tracks_per_broadcast
                    .or(file.max_pending_tracks_per_broadcast)
                    .unwrap_or(d.quotas.pending_tracks_per_broadcast),
                waiting_track_requests: flags
                    .max_waiting_track_requests
                    .or(file.max_waiting_track_requests)
                    .unwrap_or(d.quotas.waiting_track_requests),
            },
            auth: auth_config(file, flags)?,
            upstream_token_file: flags
                .upstream_token_file
                .clone()
                .or_else(|| file.upstream_token_file.clone()),
            tls: tls_files(file, flags)?,
            upstream_ca: flags
                .upstream_ca
                .clone()
                .or_else(|| file.upstream_ca.clone()),
        };
        if let Some(ca) = &cfg.upstream_ca {
            // A leaf must not start with CAs it cannot use.
            skiff_monoio::tls::roots_from_pem_file(ca)
                .map_err(|e| invalid("upstream-ca", e.to_string()))?;
        }
        let q = cfg.quotas;
        for (key, v) in [
            ("max-connections-per-ip", q.connections_per_ip),
            ("max-handshakes", q.handshakes),
            ("max-relay-tracks", q.relay_tracks),
            ("max-announces", q.announces),
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
        if cfg.metrics.is_some() && cfg.metrics == Some(cfg.listen) && cfg.listen.port() != 0 {
            return Err(invalid("metrics", "must differ from the listen address"));
        }
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(args: &[&str]) -> Flags {
        let mut v = vec!["skiff-relay"];
        v.extend_from_slice(args);
        Cli::try_parse_from(v).expect("flags parse").flags
    }

    // --- value parsers ---

    #[test]
    fn byte_sizes() {
        assert_eq!("65536".parse::<ByteSize>(), Ok(ByteSize(65536)));
        assert_eq!("64KiB".parse::<ByteSize>(), Ok(ByteSize(64 << 10)));
        assert_eq!("16 MiB".parse::<ByteSize>(), Ok(ByteSize(16 << 20)));
        assert_eq!("1g".parse::<ByteSize>(), Ok(ByteSize(1 << 30)));
        assert_eq!("2MB".parse::<ByteSize>(), Ok(ByteSize(2_000_000)));
        assert!("MiB".parse::<ByteSize>().is_err());
        assert!("12 parsecs".parse::<ByteSize>().is_err());
        assert!("99999999999999999999".parse::<ByteSize>().is_err());
        assert!("17179869184GiB".parse::<ByteSize>().is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(
            "250ms".parse::<DurationArg>(),
            Ok(DurationArg(Duration::from_millis(250)))
        );
        assert_eq!(
            "7".parse::<DurationArg>(),
            Ok(DurationArg(Duration::from_secs(7)))
        );
        assert_eq!(
            "2m".parse::<DurationArg>(),
            Ok(DurationArg(Duration::from_secs(120)))
        );
        assert!("2h".parse::<DurationArg>().is_err());
        assert!("-1s".parse::<DurationArg>().is_err());
    }

    #[test]
    fn upstream_urls() {
        let u: Upstream = "tcp://relay.example:4443/room/a".parse().unwrap();
        assert_eq!(
            u,
            Upstream {
                host: "relay.example".into(),
                port: 4443,
                path: "room/a".into(),
                tls: false,
            }
        );
        let u: Upstream = "tls://relay.example:4443/room".parse().unwrap();
        assert!(u.tls);
        assert_eq!(u.to_string(), "tls://relay.example:4443/room");
        let u: Upstream = "tcp://[::1]:9000".parse().unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.path.as_str()),
            ("::1", 9000, "")
        );
        assert_eq!(u.to_string(), "tcp://[::1]:9000/");
        // A token in the query stays out of what is printed.
        let u: Upstream = "tcp://h:1/room?jwt=secret".parse().unwrap();
        assert_eq!(u.path, "room?jwt=secret");
        assert_eq!(u.to_string(), "tcp://h:1/room?…");
        assert!("https://x:1/".parse::<Upstream>().is_err());
        assert!("tcp://x/".parse::<Upstream>().is_err());
        assert!("tcp://:1/".parse::<Upstream>().is_err());
        assert!("tcp://x:0/".parse::<Upstream>().is_err());
        assert!("tcp://x:70000/".parse::<Upstream>().is_err());
        assert!("tcp://[::1/".parse::<Upstream>().is_err());
    }

    // --- merging ---

    #[test]
    fn defaults_without_file_or_flags() {
        let cfg = RelayConfig::merge(&FileConfig::default(), &Flags::default()).unwrap();
        assert_eq!(cfg.listen.to_string(), DEFAULT_LISTEN);
        assert_eq!(cfg, RelayConfig::default());
    }

    #[test]
    fn flags_override_file() {
        let file = FileConfig::parse(
            "listen = \"0.0.0.0:9000\"\nthreads = 3\nmax-connections = 7\ncache_bytes = \"1MiB\"\n\
             max-frame-bytes = 1000\nlog = \"debug\"\ndriver = \"legacy\"\ndrain-timeout = \"250ms\"\n",
            Path::new("t.toml"),
        )
        .unwrap();
        let cfg = RelayConfig::merge(&file, &flags(&["--threads", "1", "--log", "warn"])).unwrap();
        assert_eq!(cfg.listen.to_string(), "0.0.0.0:9000");
        assert_eq!(cfg.threads.get(), 1);
        assert_eq!(cfg.limits.max_connections, 7);
        assert_eq!(cfg.limits.max_frame_bytes, 1000);
        assert_eq!(cfg.cache_bytes, 1 << 20);
        assert_eq!(cfg.log.0, tracing::level_filters::LevelFilter::WARN);
        assert_eq!(cfg.driver, DriverKind::Legacy);
        assert_eq!(cfg.drain_timeout, Duration::from_millis(250));
    }

    #[test]
    fn auth_settings_from_file_and_flags() {
        let dir = std::env::temp_dir().join(format!("skiff-cfg-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let key = dir.join("k.jwk");
        std::fs::write(
            &key,
            r#"{"kty":"oct","alg":"HS256","k":"MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY"}"#,
        )
        .unwrap();
        let text = format!(
            "auth-key = {:?}\nauth-public = [\"anon/**\"]\nupstream-token-file = \"t\"\n",
            key.display().to_string()
        );
        let file = FileConfig::parse(&text, Path::new("a.toml")).unwrap();
        let cfg = RelayConfig::merge(&file, &flags(&[])).unwrap();
        assert_eq!(cfg.auth.key.as_deref(), Some(key.as_path()));
        assert!(cfg.auth.public.matches("anon/x"));
        assert_eq!(cfg.upstream_token_file.as_deref(), Some(Path::new("t")));
        let cfg = RelayConfig::merge(&file, &flags(&["--auth-public", "a/**,b/*"])).unwrap();
        assert!(cfg.auth.public.matches("b/x") && !cfg.auth.public.matches("anon/x"));
        // Refused: a literal public pattern, a bad pattern, both key forms, a bad key.
        for args in [
            &["--auth-public", "anon"][..],
            &["--auth-public", "a/**/b/**"],
            &["--auth-key-dir", "/"],
            &["--auth-key", "/nonexistent/k.jwk", "--auth-key-dir", "/"],
        ] {
            let f = if args[0] == "--auth-key" {
                FileConfig::default()
            } else {
                file.clone()
            };
            assert!(RelayConfig::merge(&f, &flags(args)).is_err(), "{args:?}");
        }
        std::fs::write(&key, "{}").unwrap();
        assert!(RelayConfig::merge(&file, &flags(&[])).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn file_rejects_unknown_keys_and_bad_values() {
        let p = Path::new("bad.toml");
        for text in [
            "lisen = \"127.0.0.1:1\"",
            "listen = \"not an address\"",
            "threads = \"two\"",
            "max-connections = -1",
            "cache-bytes = \"3 lightyears\"",
            "upstream = \"http://a:1/\"",
            "log = \"loud\"",
            "[section]\nx = 1",
            "threads = ",
        ] {
            let err = FileConfig::parse(text, p).unwrap_err();
            assert!(
                matches!(err, ConfigError::ParseFile { .. }),
                "{text}: {err}"
            );
        }
    }

    #[test]
    fn inconsistent_limits_are_rejected() {
        let err = RelayConfig::merge(
            &FileConfig::default(),
            &flags(&["--max-frame-bytes", "2MiB", "--max-group-bytes", "1MiB"]),
        )
        .unwrap_err();
        assert!(err.to_string().contains("max-frame-bytes"), "{err}");
        for args in [
            ["--threads", "0"],
            ["--max-connections", "0"],
            ["--threads", "5000"],
        ] {
            assert!(RelayConfig::merge(&FileConfig::default(), &flags(&args)).is_err());
        }
    }

    #[test]
    fn web_dir_from_default_file_and_flag() {
        let d = RelayConfig::default();
        assert!(d.web_dir.ends_with("web/dist"), "{}", d.web_dir.display());
        let file = FileConfig::parse("web-dir = \"/srv/player\"\n", Path::new("t.toml")).unwrap();
        let cfg = RelayConfig::merge(&file, &flags(&[])).unwrap();
        assert_eq!(cfg.web_dir, Path::new("/srv/player"));
        let cfg = RelayConfig::merge(&file, &flags(&["--web-dir", "/tmp/p"])).unwrap();
        assert_eq!(cfg.web_dir, Path::new("/tmp/p"));
    }

    #[test]
    fn quick_ack_is_on_unless_turned_off() {
        assert!(RelayConfig::default().quick_ack);
        let none = FileConfig::parse("", Path::new("t.toml")).unwrap();
        assert!(RelayConfig::merge(&none, &flags(&[])).unwrap().quick_ack);
        assert!(
            RelayConfig::merge(&none, &flags(&["--quick-ack"]))
                .unwrap()
                .quick_ack
        );
        assert!(
            !RelayConfig::merge(&none, &flags(&["--quick-ack=false"]))
                .unwrap()
                .quick_ack
        );
        let file = FileConfig::parse("quick-ack = false\n", Path::new("t.toml")).unwrap();
        assert!(!RelayConfig::merge(&file, &flags(&[])).unwrap().quick_ack);
        assert!(
            RelayConfig::merge(&file, &flags(&["--quick-ack=true"]))
                .unwrap()
                .quick_ack
        );
    }

    #[test]
    fn timeouts_credit_and_send_buffer() {
        let d = RelayConfig::default();
        assert_eq!(d.timeouts.handshake, Duration::from_secs(10));
        assert_eq!(d.timeouts.write, Duration::from_secs(10));
        assert_eq!(d.timeouts.idle, Duration::from_secs(30));
        assert_eq!(d.stream_credit, 256 << 10);
        assert_eq!(d.connection_credit(), 1 << 20);
        assert_eq!(d.send_buffer, None);
        let file = FileConfig::parse(
            "handshake-timeout = \"2s\"\nwrite_timeout = \"500ms\"\nidle-timeout = 5\n\
             send-buffer = \"64KiB\"\n",
            Path::new("t.toml"),
        )
        .unwrap();
        let cfg = RelayConfig::merge(&file, &flags(&["--stream-credit", "1MiB"])).unwrap();
        assert_eq!(cfg.timeouts.handshake, Duration::from_secs(2));
        assert_eq!(cfg.timeouts.write, Duration::from_millis(500));
        assert_eq!(cfg.timeouts.idle, Duration::from_secs(5));
        assert_eq!(cfg.send_buffer, Some(64 << 10));
        // The connection window follows the stream window unless given.
        assert_eq!(cfg.stream_credit, 1 << 20);
        assert_eq!(cfg.connection_credit(), 4 << 20);
        let cfg = RelayConfig::merge(
            &file,
            &flags(&["--stream-credit", "1MiB", "--connection-credit", "2MiB"]),
        )
        .unwrap();
        assert_eq!(cfg.connection_credit(), 2 << 20);
        for args in [
            vec!["--handshake-timeout", "0"],
            vec!["--write-timeout", "0ms"],
            vec!["--stream-credit", "100"],
            vec!["--stream-credit", "1MiB", "--connection-credit", "512KiB"],
            vec!["--send-buffer", "1"],
        ] {
            assert!(
                RelayConfig::merge(&FileConfig::default(), &flags(&args)).is_err(),
                "{args:?}"
            );
        }
    }

    #[test]
    fn session_config_applies_the_limits() {
        let mut cfg = RelayConfig::default();
        cfg.limits.max_streams = 10;
        cfg.limits.max_subscriptions = 3;
        cfg.limits.max_frame_bytes = 1000;
        cfg.stream_credit = 1 << 20;
        cfg.connection_credit = Some(8 << 20);
        cfg.timeouts.idle = Duration::from_secs(7);
        cfg.timeouts.handshake = Duration::from_secs(2);
        let s = cfg.session_config(42);
        assert_eq!(s.hop, 42);
        assert_eq!(s.max_served, 3);
        assert_eq!(s.max_frame_bytes, 1000);
        assert_eq!(s.setup_timeout.as_micros(), 2_000_000);
        assert_eq!(s.control_timeout.as_micros(), 2_000_000);
        assert_eq!(s.conn.max_idle_timeout.as_micros(), 7_000_000);
        assert_eq!(s.conn.handshake_timeout.as_micros(), 3_000_000);
        assert_eq!(s.conn.max_data, 8 << 20);
        assert_eq!(s.conn.max_stream_data_uni, 1 << 20);
        assert_eq!(s.conn.max_stream_data_bidi_remote, 1 << 20);
        assert_eq!(s.conn.max_streams_bidi, Some(10));
        assert_eq!(s.conn.max_streams_uni, Some(10));
        // More streams than the table holds are capped at a quarter of it.
        cfg.limits.max_streams = 1000;
        let s = cfg.session_config(1);
        let quarter = (crate::storage::STREAMS / 4) as u64;
        assert_eq!(s.conn.max_streams_uni, Some(quarter));
        // A trunk (worker link, upstream) takes a quarter of its larger table
        // and any number of subscriptions its table holds.
        let trunk = cfg.trunk_session_config(1);
        let quarter = (crate::storage::TRUNK_STREAMS / 4) as u64;
        assert_eq!(trunk.conn.max_streams_bidi, Some(quarter));
        assert_eq!(trunk.conn.max_streams_uni, Some(quarter));
        assert_eq!(trunk.max_served, usize::MAX);
        assert_eq!(s.max_waiting_tracks, 16);
        assert_eq!(trunk.max_waiting_tracks, usize::MAX);
        assert_eq!(trunk.conn.max_stream_data_uni, s.conn.max_stream_data_uni);
        let t = cfg.track_limits(5 << 20);
        assert_eq!((t.group_bytes, t.cache_bytes), (16 << 20, 5 << 20));
    }

    #[test]
    fn bad_flags_are_parse_errors() {
        for args in [
            vec!["skiff-relay", "--listen", "nowhere"],
            vec!["skiff-relay", "--threads", "-2"],
            vec!["skiff-relay", "--cache-bytes", "lots"],
            vec!["skiff-relay", "--bogus"],
            vec!["skiff-relay", "frobnicate"],
        ] {
            assert!(Cli::try_parse_from(&args).is_err(), "{args:?}");
        }
    }

    #[test]
    fn subcommands_and_global_flags() {
        let cli = Cli::try_parse_from(["skiff-relay", "serve", "--threads", "2"]).unwrap();
        assert!(matches!(cli.command, Some(Command::Serve)));
        assert_eq!(cli.flags.threads, Some(2));
        let cli = Cli::try_parse_from(["skiff-relay", "--listen", "127.0.0.1:0"]).unwrap();
        assert!(cli.command.is_none());
        let cli = Cli::try_parse_from(["skiff-relay", "demo", "--seconds", "4", "--viewers", "2"])
            .unwrap();
        match cli.command {
            Some(Command::Demo(d)) => {
                assert_eq!((d.seconds, d.viewers, d.fps), (4, 2, 30));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn tls_files_come_in_pairs_and_must_load() {
        let file = FileConfig::parse(
            "tls-cert = \"/nonexistent/c.pem\"\ntls_key = \"/nonexistent/k.pem\"\nupstream-ca = \"/nonexistent/ca.pem\"\n",
            Path::new("t.toml"),
        )
        .unwrap();
        assert_eq!(
            file.tls_cert.as_deref(),
            Some(Path::new("/nonexistent/c.pem"))
        );
        assert_eq!(
            file.tls_key.as_deref(),
            Some(Path::new("/nonexistent/k.pem"))
        );
        let err = RelayConfig::merge(&file, &Flags::default()).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("tls-cert") && text.contains("/nonexistent/c.pem"),
            "{text}"
        );
        let half = Flags {
            tls_cert: Some("c.pem".into()),
            ..Flags::default()
        };
        let err = RelayConfig::merge(&FileConfig::default(), &half).unwrap_err();
        assert!(err.to_string().contains("--tls-key"), "{err}");
        let ca = Flags {
            upstream_ca: Some("/nonexistent/ca.pem".into()),
            ..Flags::default()
        };
        let err = RelayConfig::merge(&FileConfig::default(), &ca).unwrap_err();
        assert!(err.to_string().contains("upstream-ca"), "{err}");
    }
}
