//! Why a connection attempt or a session ended: [`Error`].

use core::fmt;

use embassy_net::tcp::ConnectError;
use skiff_core::session::ConfigError;
use skiff_core::wire::lite::SessionCode;

/// Why one connection of the [`Runner`](crate::Runner) ended; the runner logs it,
/// waits out its backoff and dials again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum Error {
    /// The TCP connect failed (refused, no route, timed out in the stack).
    Connect(ConnectError),
    /// The TCP connect took longer than [`Config::connect_timeout`](crate::Config::connect_timeout).
    ConnectTimeout,
    /// The session could not be built from the configuration and the storage's
    /// capacities (a SETUP path longer than the control buffers, stream counts over
    /// the stream table); retrying does not help until the firmware changes.
    Config(ConfigError),
    /// The TCP connection was reset or closed by the relay without a session close.
    ConnectionLost,
    /// The session was closed: by the relay (`local == false`), or by us because the
    /// relay broke a rule or a timer (handshake, SETUP, idle) ran out.
    Closed {
        /// The close code: a moq-lite session code for an application close, else a
        /// QMux transport code (docs/protocol.md §3.15).
        code: u64,
        /// True for a moq-lite (application) close, false for a transport close or timeout.
        application: bool,
        /// True if we closed, false if the relay did.
        local: bool,
    },
    /// The relay sent GOAWAY (docs/protocol.md §3.12): we closed and will dial again.
    GoingAway,
    /// The relay sent a QMux record longer than the input buffer (`RX` of
    /// [`PublisherResources`](crate::PublisherResources)); we closed with INTERNAL.
    RecordTooLarge,
}

impl Error {
    /// The close code this end of the session carried on the wire, if any: the
    /// session's close code, INTERNAL (0x1) for a record we could not take, NO_ERROR
    /// (0x0) after GOAWAY; `None` when no session close was exchanged.
    pub fn to_code(&self) -> Option<u64> {
        match self {
            Error::Closed { code, .. } => Some(*code),
            Error::RecordTooLarge => Some(SessionCode::Internal.to_code()),
            Error::GoingAway => Some(SessionCode::NoError.to_code()),
            Error::Connect(_)
            | Error::ConnectTimeout
            | Error::Config(_)
            | Error::ConnectionLost => None,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Connect(e) => write!(f, "tcp connect failed: {e:?}"),
            Error::ConnectTimeout => f.write_str("tcp connect timed out"),
            Error::Config(e) => write!(f, "session configuration: {e}"),
            Error::ConnectionLost => f.write_str("tcp connection lost"),
            Error::Closed {
                code,
                application,
                local,
            } => write!(
                f,
                "session closed by {} with {} code {code:#x}",
                if *local { "us" } else { "the relay" },
                if *application { "session" } else { "transport" },
            ),
            Error::GoingAway => f.write_str("relay sent GOAWAY"),
            Error::RecordTooLarge => f.write_str("record larger than the input buffer"),
        }
    }
}

impl core::error::Error for Error {}

impl From<ConfigError> for Error {
    fn from(e: ConfigError) -> Self {
        Error::Config(e)
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::string::ToString;

    // ---- codes and text ----

    #[test]
    fn codes_follow_the_close() {
        let closed = Error::Closed {
            code: 0x3,
            application: true,
            local: false,
        };
        assert_eq!(closed.to_code(), Some(0x3));
        assert_eq!(Error::RecordTooLarge.to_code(), Some(0x1));
        assert_eq!(Error::ConnectionLost.to_code(), None);
        assert_eq!(
            closed.to_string(),
            "session closed by the relay with session code 0x3"
        );
    }
}
