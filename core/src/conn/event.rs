//! What the connection tells the application: [`Event`]s and the results of its calls.

use crate::wire::qmux::{StreamId, TransportError};

/// Something the application must learn about, produced by
/// [`Connection::handle_input`](super::Connection::handle_input) (borrowing the input
/// bytes) or [`Connection::handle_timeout`](super::Connection::handle_timeout).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Event<'a> {
    /// The peer's transport parameters arrived and an application protocol was agreed
    /// (docs/protocol.md §1.1, §1.5); streams may now be opened, and written as soon as
    /// `poll_transmit` has sent our own parameters (normally long before).
    ///
    /// Frames the peer sent before its parameters (qmux-01 allows them within our
    /// windows) are reported before this event.
    Established {
        /// The negotiated protocol, one of our [`Config::protocols`](super::Config::protocols).
        protocol: &'static str,
    },
    /// The peer opened a stream (also reported for every lower index its first frame
    /// opened implicitly, in index order; docs/protocol.md §1.6).
    StreamOpened {
        /// The new stream.
        id: StreamId,
    },
    /// Stream bytes, borrowed from the input; hand them on, then [`release`](super::Connection::release) them.
    StreamData {
        /// The stream.
        id: StreamId,
        /// Stream position of `data[0]`: the bytes received on the stream before this frame.
        offset: u64,
        /// The payload (may be empty when `fin` is set).
        data: &'a [u8],
        /// Where `data` starts in the `input` of the
        /// [`handle_input`](super::Connection::handle_input) call that
        /// reported it: `input[at..at + data.len()]`, which ends at
        /// [`Input::consumed`].
        at: usize,
        /// No more data follows on this stream.
        fin: bool,
    },
    /// Stream bytes passed by reference (STREAM_REF, only with
    /// [`Config::stream_refs`](super::Config::stream_refs)): resolve `token`
    /// to the `len` bytes it names, hand them on, then release them.
    StreamRef {
        /// The stream.
        id: StreamId,
        /// Stream position of the first byte.
        offset: u64,
        /// Number of bytes.
        len: u64,
        /// Names the bytes.
        token: u64,
        /// No more data follows on this stream.
        fin: bool,
    },
    /// The peer abandoned its sending side; nothing more arrives on this stream and
    /// every byte of it counts as released.
    StreamReset {
        /// The stream.
        id: StreamId,
        /// Application (moq-lite stream) error code.
        code: u64,
        /// Bytes the peer sent on the stream.
        final_size: u64,
    },
    /// The peer will not read what we send on this stream; answer with
    /// [`reset_stream`](super::Connection::reset_stream), usually with the same code.
    StopSending {
        /// The stream.
        id: StreamId,
        /// Application (moq-lite stream) error code.
        code: u64,
    },
    /// The peer raised a stream's send credit, so data that waited for it
    /// may be written now. A transport with flow control of its own (a QUIC
    /// library) reports it; QMux's credit arrives with the input, whose
    /// handling lets the session write again, so QMux never reports it.
    StreamWritable {
        /// The stream.
        id: StreamId,
    },
    /// An unreliable datagram, borrowed from the input (docs/protocol.md §2.7).
    Datagram(&'a [u8]),
    /// The connection is over; nothing more will be received.
    Closed(Closed<'a>),
}

/// How and why a connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Closed<'a> {
    /// The Error Code of the close frame (sent or received); 0 for timeouts.
    pub code: u64,
    /// Human-readable reason (the valid UTF-8 prefix of a peer's reason).
    pub reason: &'a str,
    /// True for an application close (`0x1d`), false for a transport close (`0x1c`) or a timeout.
    pub application: bool,
    /// Who ended it and why.
    pub cause: CloseCause,
}

/// Who ended a connection and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum CloseCause {
    /// The peer sent CONNECTION_CLOSE (docs/protocol.md §2.6).
    Peer,
    /// The peer broke a QMux rule; we send a transport close with code 1002 (docs/protocol.md §2.4).
    Violation(TransportError),
    /// The peer's parameters did not arrive in time; we send a transport close, code 0,
    /// "handshake timeout" (docs/protocol.md §1.1).
    HandshakeTimeout,
    /// Nothing arrived for the idle timeout; nothing is sent (docs/protocol.md §2.5).
    IdleTimeout,
    /// The protocol lists do not overlap; we send an application close with
    /// VERSION_NEGOTIATION_FAILED (0x15, docs/protocol.md §1.5, §3.15).
    NoCommonProtocol,
}

/// The result of one [`Connection::handle_input`](super::Connection::handle_input) call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[must_use]
pub struct Input<'a> {
    /// Bytes at the front of the input that were used; drop them before the next call.
    pub consumed: usize,
    /// The next event, or `None` when no whole record is left to process.
    pub event: Option<Event<'a>>,
}

/// How much one [`Connection::write_stream`](super::Connection::write_stream) call took and wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Written {
    /// Bytes of the caller's data carried by the record (a prefix of it).
    pub data: usize,
    /// Bytes of the record written at the front of the output buffer.
    pub out: usize,
}
