//! The value types of the relay's settings, as the command line and the
//! TOML file write them: sizes with units, durations, the upstream URL, log
//! levels; and [`Spelling`], how `--help` writes a default.

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use serde::Deserialize;

use skiff_monoio::driver::DriverKind;

/// A byte count written as a plain integer or with a unit suffix
/// (`64KiB`, `16MiB`, `1GiB`, `500kB`, `2MB`; case-insensitive, `K`/`M`/`G` are binary).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

impl ByteSize {
    /// `n` MiB.
    pub const fn mib(n: u64) -> Self {
        ByteSize(n << 20)
    }
}

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

impl DurationArg {
    /// `n` seconds.
    pub const fn secs(n: u64) -> Self {
        DurationArg(Duration::from_secs(n))
    }
}

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
/// written `tcp://HOST:PORT/PATH`, over TLS `tls://HOST:PORT/PATH`, or over
/// QUIC `moql://HOST:PORT/PATH` (PATH may be empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    /// Host name or IP address (IPv6 without brackets).
    pub host: String,
    /// TCP port (UDP for `moql://`).
    pub port: u16,
    /// Broadcast path prefix sent in SETUP, without the leading `/`.
    pub path: String,
    /// How it is dialed.
    pub scheme: UpstreamScheme,
}

/// How a leaf dials its upstream: its URL's scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamScheme {
    /// `tcp://`: QMux over plain TCP.
    Tcp,
    /// `tls://`: QMux over TLS (docs/protocol.md §9.8), the host as the
    /// name its certificate must carry.
    Tls,
    /// `moql://`: moq-lite over QUIC (docs/protocol.md §11), the host as
    /// the name its certificate must carry.
    Quic,
}

impl UpstreamScheme {
    /// The URL scheme, without `://`.
    pub fn name(self) -> &'static str {
        match self {
            UpstreamScheme::Tcp => "tcp",
            UpstreamScheme::Tls => "tls",
            UpstreamScheme::Quic => "moql",
        }
    }

    /// Whether the upstream is dialed with a TLS handshake (its certificate
    /// checked against `--upstream-ca`, the system's roots or
    /// `--upstream-fingerprint`).
    pub fn is_secure(self) -> bool {
        self != UpstreamScheme::Tcp
    }
}

impl FromStr for Upstream {
    type Err = ParseValueError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (scheme, rest) = if let Some(rest) = s.strip_prefix("tcp://") {
            (UpstreamScheme::Tcp, rest)
        } else if let Some(rest) = s.strip_prefix("tls://") {
            (UpstreamScheme::Tls, rest)
        } else if let Some(rest) = s.strip_prefix("moql://") {
            (UpstreamScheme::Quic, rest)
        } else {
            return Err(ParseValueError(format!(
                "`{s}` must start with tcp://, tls:// or moql:// (QMux over TCP, over TLS, or moq-lite over QUIC)"
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
            .map_err(|_| ParseValueError(format!("`{port}` is not a port number")))?;
        if port == 0 {
            return Err(ParseValueError("upstream port 0 is not connectable".into()));
        }
        Ok(Upstream {
            host: host.to_owned(),
            port,
            path: path.to_owned(),
            scheme,
        })
    }
}

impl fmt::Display for Upstream {
    /// The URL without its query, which may hold a token (kept out of logs).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (path, query) = self.path.split_once('?').unwrap_or((&self.path, ""));
        let hidden = if query.is_empty() { "" } else { "?…" };
        let scheme = self.scheme.name();
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
pub(super) fn from_text<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: FromStr,
    T::Err: fmt::Display,
{
    let s = String::deserialize(d)?;
    s.parse().map(Some).map_err(serde::de::Error::custom)
}

/// A value written as the command line takes it (`256MiB`, `10s`, `info`):
/// the `[default: …]` of a setting's `--help` line. Parsing the spelling
/// gives the value back.
pub trait Spelling {
    /// The value as a flag would take it.
    fn spelling(&self) -> String;
}

impl Spelling for u32 {
    fn spelling(&self) -> String {
        self.to_string()
    }
}

impl Spelling for usize {
    fn spelling(&self) -> String {
        self.to_string()
    }
}

impl Spelling for bool {
    fn spelling(&self) -> String {
        self.to_string()
    }
}

impl Spelling for SocketAddr {
    fn spelling(&self) -> String {
        self.to_string()
    }
}

impl Spelling for ByteSize {
    /// The largest binary unit that divides it (`256MiB`, `1536KiB`, `100`).
    fn spelling(&self) -> String {
        let n = self.0;
        for (shift, unit) in [(30, "GiB"), (20, "MiB"), (10, "KiB")] {
            if n != 0 && n.trailing_zeros() >= shift {
                return format!("{}{unit}", n >> shift);
            }
        }
        n.to_string()
    }
}

impl Spelling for DurationArg {
    /// Whole seconds as `10s`, anything else as milliseconds (`250ms`).
    fn spelling(&self) -> String {
        let d = self.0;
        if d.subsec_nanos() == 0 {
            format!("{}s", d.as_secs())
        } else {
            format!("{}ms", d.as_millis())
        }
    }
}

impl Spelling for LogLevel {
    fn spelling(&self) -> String {
        self.0.to_string()
    }
}

impl Spelling for DriverKind {
    fn spelling(&self) -> String {
        match self {
            DriverKind::Auto => "auto",
            DriverKind::IoUring => "io-uring",
            DriverKind::Legacy => "legacy",
        }
        .to_owned()
    }
}
