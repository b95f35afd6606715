//! moq-lite error codes (docs/protocol.md §3.15): the session registry (QMux application
//! close) and the stream registry (RESET_STREAM / STOP_SENDING), which are distinct.

use core::fmt;

use crate::wire::DecodeError;

/// First code of the application range (`64 + n`) in both registries.
const APP_BASE: u64 = 64;

/// A session close code, carried in the QMux application close (`0x1d`) frame.
///
/// Unknown codes are kept as [`SessionCode::Unknown`] so nothing received is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum SessionCode {
    /// `0x0`: normal close, no error.
    NoError,
    /// `0x1`: an internal failure.
    Internal,
    /// `0x2`: the peer is not authorized.
    Unauthorized,
    /// `0x3`: the peer broke a protocol rule (bad SETUP, duplicate Setup stream, undecodable
    /// control message…).
    ProtocolViolation,
    /// `0x6`: a key-value field was malformed.
    KeyValueFormatting,
    /// `0x10`: the peer did not close within the drain window after GOAWAY.
    GoawayTimeout,
    /// `0x11`: a control message was not answered in time.
    ControlMessageTimeout,
    /// `0x15`: no common version.
    VersionNegotiationFailed,
    /// `64 + n`: application code `n`.
    App(u64),
    /// Any other code, kept verbatim (the reserved 32–47 range included).
    Unknown(u64),
}

impl SessionCode {
    /// The wire value.
    pub const fn to_code(self) -> u64 {
        match self {
            SessionCode::NoError => 0x0,
            SessionCode::Internal => 0x1,
            SessionCode::Unauthorized => 0x2,
            SessionCode::ProtocolViolation => 0x3,
            SessionCode::KeyValueFormatting => 0x6,
            SessionCode::GoawayTimeout => 0x10,
            SessionCode::ControlMessageTimeout => 0x11,
            SessionCode::VersionNegotiationFailed => 0x15,
            SessionCode::App(n) => n.saturating_add(APP_BASE),
            SessionCode::Unknown(c) => c,
        }
    }

    /// The code for a wire value; unregistered values are [`SessionCode::Unknown`].
    pub const fn from_code(code: u64) -> Self {
        match code {
            0x0 => SessionCode::NoError,
            0x1 => SessionCode::Internal,
            0x2 => SessionCode::Unauthorized,
            0x3 => SessionCode::ProtocolViolation,
            0x6 => SessionCode::KeyValueFormatting,
            0x10 => SessionCode::GoawayTimeout,
            0x11 => SessionCode::ControlMessageTimeout,
            0x15 => SessionCode::VersionNegotiationFailed,
            c if c >= APP_BASE => SessionCode::App(c - APP_BASE),
            c => SessionCode::Unknown(c),
        }
    }

    /// The close code for a control message that failed to decode.
    ///
    /// docs/protocol.md §3.13: every protocol problem on a control stream (malformed SETUP,
    /// a message that does not match its length, …) closes the session with
    /// PROTOCOL_VIOLATION, whatever the exact decode error.
    pub const fn for_decode_error(_e: DecodeError) -> Self {
        SessionCode::ProtocolViolation
    }
}

impl From<DecodeError> for SessionCode {
    fn from(e: DecodeError) -> Self {
        SessionCode::for_decode_error(e)
    }
}

impl fmt::Display for SessionCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SessionCode::NoError => f.write_str("no error"),
            SessionCode::Internal => f.write_str("internal error"),
            SessionCode::Unauthorized => f.write_str("unauthorized"),
            SessionCode::ProtocolViolation => f.write_str("protocol violation"),
            SessionCode::KeyValueFormatting => f.write_str("key-value formatting error"),
            SessionCode::GoawayTimeout => f.write_str("goaway timeout"),
            SessionCode::ControlMessageTimeout => f.write_str("control message timeout"),
            SessionCode::VersionNegotiationFailed => f.write_str("version negotiation failed"),
            SessionCode::App(n) => write!(f, "application error {n}"),
            SessionCode::Unknown(c) => write!(f, "unknown session code {c:#x}"),
        }
    }
}

impl core::error::Error for SessionCode {}

/// A stream error code, carried in RESET_STREAM and STOP_SENDING.
///
/// A different registry from [`SessionCode`]: `0` here is [`StreamCode::Internal`], not
/// "no error". Unknown codes are kept as [`StreamCode::Unknown`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum StreamCode {
    /// `0x0`: internal failure; also what a QMux stream dropped without a reason sends.
    Internal,
    /// `0x1`: routine cancellation (unsubscribe, subscriber gone).
    Cancel,
    /// `0x2`: the content missed its delivery deadline.
    DeliveryTimeout,
    /// `0x3`: the stream died with its session.
    SessionClosed,
    /// `0x4`: the session is going away.
    GoingAway,
    /// `0x5`: the reader lagged too far behind.
    TooFarBehind,
    /// `0x12`: the track could not be parsed.
    MalformedTrack,
    /// `0x31`: a control request was not answered in time.
    ControlTimeout,
    /// `0x32`: the group is too large.
    GroupTooLarge,
    /// `0x33`: the broadcast or track does not exist.
    NotFound,
    /// `0x34`: the group was superseded or aged out.
    Old,
    /// `0x35`: dropped under memory pressure.
    Evicted,
    /// `0x36`: no route to the broadcast.
    Unroutable,
    /// `0x37`: a frame length did not match.
    WrongSize,
    /// `0x38`: a frame is too large.
    FrameTooLarge,
    /// `0x39`: a frame timestamp did not match.
    TimestampMismatch,
    /// `64 + n`: application code `n`.
    App(u64),
    /// Any other code, kept verbatim (the reserved 32–47 range included).
    Unknown(u64),
}

impl StreamCode {
    /// The wire value.
    pub const fn to_code(self) -> u64 {
        match self {
            StreamCode::Internal => 0x0,
            StreamCode::Cancel => 0x1,
            StreamCode::DeliveryTimeout => 0x2,
            StreamCode::SessionClosed => 0x3,
            StreamCode::GoingAway => 0x4,
            StreamCode::TooFarBehind => 0x5,
            StreamCode::MalformedTrack => 0x12,
            StreamCode::ControlTimeout => 0x31,
            StreamCode::GroupTooLarge => 0x32,
            StreamCode::NotFound => 0x33,
            StreamCode::Old => 0x34,
            StreamCode::Evicted => 0x35,
            StreamCode::Unroutable => 0x36,
            StreamCode::WrongSize => 0x37,
            StreamCode::FrameTooLarge => 0x38,
            StreamCode::TimestampMismatch => 0x39,
            StreamCode::App(n) => n.saturating_add(APP_BASE),
            StreamCode::Unknown(c) => c,
        }
    }

    /// The code for a wire value; unregistered values are [`StreamCode::Unknown`].
    pub const fn from_code(code: u64) -> Self {
        match code {
            0x0 => StreamCode::Internal,
            0x1 => StreamCode::Cancel,
            0x2 => StreamCode::DeliveryTimeout,
            0x3 => StreamCode::SessionClosed,
            0x4 => StreamCode::GoingAway,
            0x5 => StreamCode::TooFarBehind,
            0x12 => StreamCode::MalformedTrack,
            0x31 => StreamCode::ControlTimeout,
            0x32 => StreamCode::GroupTooLarge,
            0x33 => StreamCode::NotFound,
            0x34 => StreamCode::Old,
            0x35 => StreamCode::Evicted,
            0x36 => StreamCode::Unroutable,
            0x37 => StreamCode::WrongSize,
            0x38 => StreamCode::FrameTooLarge,
            0x39 => StreamCode::TimestampMismatch,
            c if c >= APP_BASE => StreamCode::App(c - APP_BASE),
            c => StreamCode::Unknown(c),
        }
    }
}

impl fmt::Display for StreamCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StreamCode::Internal => f.write_str("internal error"),
            StreamCode::Cancel => f.write_str("cancelled"),
            StreamCode::DeliveryTimeout => f.write_str("delivery timeout"),
            StreamCode::SessionClosed => f.write_str("session closed"),
            StreamCode::GoingAway => f.write_str("going away"),
            StreamCode::TooFarBehind => f.write_str("too far behind"),
            StreamCode::MalformedTrack => f.write_str("malformed track"),
            StreamCode::ControlTimeout => f.write_str("control timeout"),
            StreamCode::GroupTooLarge => f.write_str("group too large"),
            StreamCode::NotFound => f.write_str("not found"),
            StreamCode::Old => f.write_str("old"),
            StreamCode::Evicted => f.write_str("evicted"),
            StreamCode::Unroutable => f.write_str("unroutable"),
            StreamCode::WrongSize => f.write_str("wrong size"),
            StreamCode::FrameTooLarge => f.write_str("frame too large"),
            StreamCode::TimestampMismatch => f.write_str("timestamp mismatch"),
            StreamCode::App(n) => write!(f, "application error {n}"),
            StreamCode::Unknown(c) => write!(f, "unknown stream code {c:#x}"),
        }
    }
}

impl core::error::Error for StreamCode {}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // ---- registered values (docs/protocol.md §3.15) ----

    #[test]
    fn session_codes() {
        let table = [
            (SessionCode::NoError, 0x0),
            (SessionCode::Internal, 0x1),
            (SessionCode::Unauthorized, 0x2),
            (SessionCode::ProtocolViolation, 0x3),
            (SessionCode::KeyValueFormatting, 0x6),
            (SessionCode::GoawayTimeout, 0x10),
            (SessionCode::ControlMessageTimeout, 0x11),
            (SessionCode::VersionNegotiationFailed, 0x15),
            (SessionCode::App(0), 64),
            (SessionCode::App(7), 71),
            (SessionCode::Unknown(0x4), 0x4),
            (SessionCode::Unknown(32), 32),
            (SessionCode::Unknown(63), 63),
        ];
        for (code, v) in table {
            assert_eq!(code.to_code(), v);
            assert_eq!(SessionCode::from_code(v), code);
        }
    }

    #[test]
    fn stream_codes() {
        let table = [
            (StreamCode::Internal, 0x0),
            (StreamCode::Cancel, 0x1),
            (StreamCode::DeliveryTimeout, 0x2),
            (StreamCode::SessionClosed, 0x3),
            (StreamCode::GoingAway, 0x4),
            (StreamCode::TooFarBehind, 0x5),
            (StreamCode::MalformedTrack, 0x12),
            (StreamCode::ControlTimeout, 0x31),
            (StreamCode::GroupTooLarge, 0x32),
            (StreamCode::NotFound, 0x33),
            (StreamCode::Old, 0x34),
            (StreamCode::Evicted, 0x35),
            (StreamCode::Unroutable, 0x36),
            (StreamCode::WrongSize, 0x37),
            (StreamCode::FrameTooLarge, 0x38),
            (StreamCode::TimestampMismatch, 0x39),
            (StreamCode::App(1), 65),
            (StreamCode::Unknown(0x30), 0x30),
            (StreamCode::Unknown(32), 32),
        ];
        for (code, v) in table {
            assert_eq!(code.to_code(), v);
            assert_eq!(StreamCode::from_code(v), code);
        }
    }

    #[test]
    fn decode_failures_close_with_protocol_violation() {
        for e in [
            DecodeError::TooLarge,
            DecodeError::TrailingBytes,
            DecodeError::ShortBody,
            DecodeError::UnknownType(9),
            DecodeError::InvalidValue,
            DecodeError::InvalidUtf8,
            DecodeError::Duplicate,
        ] {
            assert_eq!(SessionCode::from(e), SessionCode::ProtocolViolation);
            assert_eq!(SessionCode::from(e).to_code(), 0x3);
        }
    }

    proptest! {
        #[test]
        fn any_code_survives(c in any::<u64>()) {
            prop_assert_eq!(SessionCode::from_code(c).to_code(), c);
            prop_assert_eq!(StreamCode::from_code(c).to_code(), c);
        }
    }
}
