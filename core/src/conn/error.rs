//! Errors of the application-facing calls of a [`Connection`](super::Connection).

use core::fmt;

/// Why [`Connection::open_stream`](super::Connection::open_stream) failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum OpenError {
    /// The connection is closed.
    Closed,
    /// The peer's MAX_STREAMS grant for this direction is used up (or its parameters
    /// have not arrived yet); wait for more credit.
    Limit,
    /// The stream table has no slot left once room for the streams the peer may open
    /// is reserved; finish or reset some streams first.
    TableFull,
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OpenError::Closed => "connection closed",
            OpenError::Limit => "peer stream limit reached",
            OpenError::TableFull => "stream table full",
        })
    }
}

impl core::error::Error for OpenError {}

/// Why [`Connection::write_stream`](super::Connection::write_stream) wrote nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum WriteError {
    /// The connection is closed.
    Closed,
    /// Our parameters have not been sent yet or the peer's have not arrived; call
    /// `poll_transmit` and wait for [`Event::Established`](super::Event::Established).
    NotReady,
    /// No live stream has this ID (never opened, or already retired).
    UnknownStream,
    /// We may not send on this stream (a uni stream the peer opened).
    NotSendable,
    /// FIN was already written.
    Finished,
    /// We reset the stream.
    Reset,
    /// No stream or connection credit is left; wait for the peer's MAX_STREAM_DATA / MAX_DATA.
    Blocked,
    /// The output buffer cannot hold a record with even one byte of data.
    BufferTooSmall,
    /// The transport has no such write (a gathered write on a transport
    /// without [`Transport::GATHER`](crate::transport::Transport::GATHER)).
    Unsupported,
}

impl fmt::Display for WriteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WriteError::Closed => "connection closed",
            WriteError::NotReady => "connection not established",
            WriteError::UnknownStream => "unknown stream",
            WriteError::NotSendable => "stream is receive-only",
            WriteError::Finished => "stream already finished",
            WriteError::Reset => "stream was reset",
            WriteError::Blocked => "no flow-control credit",
            WriteError::BufferTooSmall => "output buffer too small",
            WriteError::Unsupported => "write not supported by the transport",
        })
    }
}

impl core::error::Error for WriteError {}

/// Why [`reset_stream`](super::Connection::reset_stream) or
/// [`stop_sending`](super::Connection::stop_sending) failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum StreamError {
    /// The connection is closed.
    Closed,
    /// No live stream has this ID.
    UnknownStream,
    /// The stream has no half in that direction (resetting a receive-only stream,
    /// stopping a send-only one).
    WrongDirection,
}

impl fmt::Display for StreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StreamError::Closed => "connection closed",
            StreamError::UnknownStream => "unknown stream",
            StreamError::WrongDirection => "stream has no half in that direction",
        })
    }
}

impl core::error::Error for StreamError {}

/// Why [`Connection::send_datagram`](super::Connection::send_datagram) failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum DatagramError {
    /// The connection is closed.
    Closed,
    /// The connection is not established yet.
    NotReady,
    /// The peer advertised no `max_datagram_frame_size` (docs/protocol.md §2.7).
    Unsupported,
    /// The datagram is larger than the peer accepts
    /// ([`max_datagram_payload`](super::Connection::max_datagram_payload)).
    TooLarge,
    /// The output buffer cannot hold the record.
    BufferTooSmall,
}

impl fmt::Display for DatagramError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DatagramError::Closed => "connection closed",
            DatagramError::NotReady => "connection not established",
            DatagramError::Unsupported => "peer does not accept datagrams",
            DatagramError::TooLarge => "datagram too large",
            DatagramError::BufferTooSmall => "output buffer too small",
        })
    }
}

impl core::error::Error for DatagramError {}
