//! Errors of the application-facing calls of a [`Session`](super::Session).

use core::fmt;

/// Why a request ([`subscribe`](super::Session::subscribe),
/// [`announce_request`](super::Session::announce_request),
/// [`goaway`](super::Session::goaway), ...) was refused; nothing was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum Error {
    /// The session is closed.
    Closed,
    /// The QMux connection is not established yet (wait for
    /// [`Event::Connected`](super::Event::Connected)), or, on a server, the
    /// client's SETUP has not arrived: the path in it roots every path the
    /// session names (wait for [`Event::Setup`](super::Event::Setup)).
    NotReady,
    /// The peer sent GOAWAY: no new requests may be opened (docs/protocol.md §3.12).
    GoingAway,
    /// Every control-stream slot is taken (see [`Storage`](super::Storage)).
    ControlFull,
    /// Every subscription slot is taken (see [`Storage`](super::Storage)).
    SubscriptionsFull,
    /// The message does not fit a control-stream buffer (a path or name too long
    /// for the `BUF` of [`Storage`](super::Storage)), or a value does not fit its field.
    TooLarge,
    /// No subscription or request has this id (never made, or already over).
    Unknown,
    /// The local track already has a producer (another subscription, or the
    /// application, writes it).
    TrackBusy,
    /// The request is invalid: a GOAWAY URI from a client, a second GOAWAY, or a
    /// malformed broadcast path.
    Invalid,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Error::Closed => "session closed",
            Error::NotReady => "connection or peer SETUP not established",
            Error::GoingAway => "peer is going away",
            Error::ControlFull => "control stream table full",
            Error::SubscriptionsFull => "subscription table full",
            Error::TooLarge => "message too large for the control buffer",
            Error::Unknown => "unknown subscription or request",
            Error::TrackBusy => "track already has a producer",
            Error::Invalid => "invalid request",
        })
    }
}

impl core::error::Error for Error {}

/// Why [`Session::new`](super::Session::new) failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum ConfigError {
    /// The QMux configuration is unusable for the connection's stream table.
    Conn(crate::conn::ConfigError),
    /// The control buffers are too small to hold a SETUP or a minimal request
    /// (`BUF` of [`Storage`](super::Storage) must be at least
    /// [`MIN_BUF`](super::MIN_BUF) bytes).
    BufferTooSmall,
    /// The SETUP we would send does not fit a control buffer (a long client path).
    SetupTooLarge,
    /// Storage has no control-stream slot at all.
    NoControl,
    /// Storage has fewer than two control buffers (one to receive, one to send).
    TooFewChunks,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Conn(e) => write!(f, "connection config: {e}"),
            ConfigError::BufferTooSmall => f.write_str("control buffers too small"),
            ConfigError::SetupTooLarge => f.write_str("our SETUP does not fit a control buffer"),
            ConfigError::NoControl => f.write_str("no control stream slots"),
            ConfigError::TooFewChunks => f.write_str("fewer than two control buffers"),
        }
    }
}

impl core::error::Error for ConfigError {}

impl From<crate::conn::ConfigError> for ConfigError {
    fn from(e: crate::conn::ConfigError) -> Self {
        ConfigError::Conn(e)
    }
}
