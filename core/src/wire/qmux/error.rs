//! QMux-level violations and the transport CONNECTION_CLOSE they end in (docs/protocol.md §2.4, §2.6).
//!
//! moq-dev closes with a transport close (`0x1c`), Error Code 1002 and Frame
//! Type 0 for every violation it detects, with a short English reason.
//! [`TransportError`] names those conditions; [`TransportError::close_frame`]
//! builds the frame to send before shutting TCP down.

use core::fmt;

use crate::wire::DecodeError;

use super::frame::{ConnectionClose, Frame};

/// The Error Code of every QMux violation close (`43 ea` on the wire).
// docs/protocol.md §2.6: "always with Error Code 1002 and Frame Type 0 (the value
// 1002 matches the JavaScript QMux polyfill; it is not a QUIC transport error code)".
pub const VIOLATION_CODE: u64 = 1002;

/// The close moq-dev sends when the peer's parameters do not arrive within 10 s: transport close, code 0.
// docs/protocol.md §1.1: "on timeout it sends CONNECTION_CLOSE (code 0, reason "handshake timeout")".
pub const HANDSHAKE_TIMEOUT_CLOSE: Frame<'static> = Frame::ConnectionClose(ConnectionClose {
    code: 0,
    frame_type: 0,
    reason: b"handshake timeout",
});

/// A QMux rule the peer broke; each closes the connection with [`VIOLATION_CODE`].
///
/// The reason texts match the qmux 0.5.3 crate's error messages, so a peer's
/// logs read the same whichever implementation closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum TransportError {
    /// Data beyond a stream or connection limit, or a MAX_* value smaller than the current one.
    FlowControl,
    /// A peer stream index at or beyond the stream count we granted.
    StreamLimit,
    /// A frame on a stream it may not name (e.g. STREAM on our own uni stream).
    InvalidStreamId,
    /// A frame type QMux (qmux-01) does not define.
    InvalidFrameType(u64),
    /// A frame that is cut short or has bytes left inside a length-delimited field.
    ShortFrame,
    /// A record larger than our `max_record_size`, or a DATAGRAM larger than our `max_datagram_frame_size`.
    FrameTooLarge,
    /// A DATAGRAM although we advertised no `max_datagram_frame_size`.
    DatagramsUnsupported,
    /// A transport parameter with a forbidden ID or an invalid value.
    TransportParameter,
    /// A transport parameter ID seen twice in one QX_TRANSPORT_PARAMETERS.
    DuplicateParameter,
    /// Any other broken rule (e.g. a second QX_TRANSPORT_PARAMETERS frame).
    ProtocolViolation,
}

impl TransportError {
    /// The Error Code to send: always [`VIOLATION_CODE`].
    #[must_use]
    pub const fn code(&self) -> u64 {
        VIOLATION_CODE
    }

    /// The fixed reason text (the [`Display`](fmt::Display) form without numbers).
    #[must_use]
    pub const fn reason(&self) -> &'static str {
        match self {
            TransportError::FlowControl => "flow control error",
            TransportError::StreamLimit => "stream limit exceeded",
            TransportError::InvalidStreamId => "invalid stream id",
            TransportError::InvalidFrameType(_) => "invalid frame type",
            TransportError::ShortFrame => "short frame",
            TransportError::FrameTooLarge => "frame too large",
            TransportError::DatagramsUnsupported => "datagrams not supported",
            TransportError::TransportParameter => "transport parameter error",
            TransportError::DuplicateParameter => "duplicate transport parameter",
            TransportError::ProtocolViolation => "protocol violation",
        }
    }

    /// The transport CONNECTION_CLOSE (`0x1c`) to send: code 1002, frame type 0, [`reason`](Self::reason).
    #[must_use]
    pub const fn close_frame(&self) -> Frame<'static> {
        Frame::ConnectionClose(ConnectionClose {
            code: VIOLATION_CODE,
            frame_type: 0,
            reason: self.reason().as_bytes(),
        })
    }
}

impl From<DecodeError> for TransportError {
    /// Maps a record or frame decode failure to the violation it is.
    ///
    /// `Incomplete` only arises when more TCP bytes are needed and should not
    /// be mapped; if it is, it counts as a short frame. `InvalidValue` and
    /// `InvalidUtf8` only come from transport parameters.
    fn from(e: DecodeError) -> Self {
        match e {
            DecodeError::Incomplete | DecodeError::ShortBody | DecodeError::TrailingBytes => {
                TransportError::ShortFrame
            }
            DecodeError::TooLarge => TransportError::FrameTooLarge,
            DecodeError::UnknownType(t) => TransportError::InvalidFrameType(t),
            DecodeError::InvalidValue | DecodeError::InvalidUtf8 => {
                TransportError::TransportParameter
            }
            DecodeError::Duplicate => TransportError::DuplicateParameter,
        }
    }
}

impl fmt::Display for TransportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TransportError::InvalidFrameType(t) => write!(f, "invalid frame type: {t}"),
            e => f.write_str(e.reason()),
        }
    }
}

impl core::error::Error for TransportError {}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::string::ToString;

    use super::*;
    use crate::wire::qmux::record::encode_record;

    #[test]
    fn close_frame_matches_v14() {
        // docs/protocol.md §6 V14: transport close, code 1002, reason "flow control error".
        let want = [
            0x17, 0x1c, 0x43, 0xea, 0x00, 0x12, 0x66, 0x6c, 0x6f, 0x77, 0x20, 0x63, 0x6f, 0x6e,
            0x74, 0x72, 0x6f, 0x6c, 0x20, 0x65, 0x72, 0x72, 0x6f, 0x72,
        ];
        let mut buf = [0u8; 64];
        let n = encode_record(&TransportError::FlowControl.close_frame(), 16382, &mut buf).unwrap();
        assert_eq!(&buf[..n], &want);
    }

    #[test]
    fn decode_errors_map() {
        assert_eq!(
            TransportError::from(DecodeError::UnknownType(0x24)),
            TransportError::InvalidFrameType(0x24)
        );
        assert_eq!(
            TransportError::from(DecodeError::TooLarge),
            TransportError::FrameTooLarge
        );
        assert_eq!(
            TransportError::from(DecodeError::ShortBody),
            TransportError::ShortFrame
        );
        assert_eq!(
            TransportError::from(DecodeError::Duplicate),
            TransportError::DuplicateParameter
        );
        assert_eq!(
            TransportError::from(DecodeError::InvalidValue),
            TransportError::TransportParameter
        );
        assert_eq!(
            TransportError::InvalidFrameType(36).to_string(),
            "invalid frame type: 36"
        );
        assert_eq!(
            TransportError::StreamLimit.to_string(),
            "stream limit exceeded"
        );
        assert_eq!(TransportError::ProtocolViolation.code(), 1002);
        let mut buf = [0u8; 32];
        let n = encode_record(&HANDSHAKE_TIMEOUT_CLOSE, 16382, &mut buf).unwrap();
        assert_eq!(&buf[..5], &[0x15, 0x1c, 0x00, 0x00, 0x11]);
        assert_eq!(&buf[5..n], b"handshake timeout");
    }
}
