//! What a connection advertises and how long it waits: [`Config`].

use core::fmt;

use crate::time::Duration;
use crate::wire::qmux::{DEFAULT_MAX_RECORD_SIZE, Frame, Protocols, TransportParams};

/// The application protocol moq-dev negotiates with us (docs/protocol.md §1.5).
pub const MOQ_LITE_05: &str = "moq-lite-05";

/// Settings of one [`Connection`](super::Connection): our transport parameters, our
/// protocol list and the timers.
///
/// The defaults are moq-dev's `tcp://` values (docs/protocol.md §1.4, §6 V1) except for
/// the stream counts, which must fit the connection's stream table, and datagrams,
/// which are off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Config {
    /// `max_idle_timeout` we advertise; [`Duration::ZERO`] disables it (whole milliseconds on the wire).
    pub max_idle_timeout: Duration,
    /// `initial_max_data`: bytes the peer may send summed over all streams (default 1 MiB).
    pub max_data: u64,
    /// `initial_max_stream_data_bidi_local`: window of a bidi stream we opened (default 256 KiB).
    pub max_stream_data_bidi_local: u64,
    /// `initial_max_stream_data_bidi_remote`: window of a bidi stream the peer opened (default 256 KiB).
    pub max_stream_data_bidi_remote: u64,
    /// `initial_max_stream_data_uni`: window of a uni stream the peer opened (default 256 KiB).
    pub max_stream_data_uni: u64,
    /// `initial_max_streams_bidi`: concurrent bidi streams the peer may open; `None` = a quarter of the table.
    pub max_streams_bidi: Option<u64>,
    /// `initial_max_streams_uni`: concurrent uni streams the peer may open; `None` = a quarter of the table.
    pub max_streams_uni: Option<u64>,
    /// `max_datagram_frame_size`: 0 (default) refuses DATAGRAM frames from the peer.
    pub max_datagram_frame_size: u64,
    /// `max_record_size`: largest record we accept (at least 16382, the default).
    pub max_record_size: u64,
    /// `application_protocols` we offer, most preferred first (default `["moq-lite-05"]`).
    pub protocols: &'static [&'static str],
    /// The application protocol the transport already chose (a WebSocket
    /// subprotocol `qmux-01.<name>`, docs/protocol.md §9.2), or `None` (default)
    /// to negotiate in-band from [`Config::protocols`]. When set,
    /// `application_protocols` is not sent, a peer that sends it breaks the
    /// handshake (TRANSPORT_PARAMETER_ERROR), and the connection is established
    /// with this protocol.
    pub fixed_protocol: Option<&'static str>,
    /// How long to wait for the peer's parameters before closing (default 10 s, as moq-dev);
    /// [`Duration::ZERO`] waits forever.
    pub handshake_timeout: Duration,
    /// Send a QX_PING after a third of the idle timeout without sending anything (default on).
    pub keep_alive: bool,
    /// Give connection credit back as stream bytes arrive (default on), not as
    /// the application releases them; stream credit still waits for the
    /// application. Memory stays bounded by the stream windows times the
    /// stream counts, and a reader that takes groups in order can never be
    /// starved by newer group streams holding all the connection credit
    /// (with it off, `max_data` must cover every stream window at once).
    pub connection_credit_on_receipt: bool,
    /// Accept STREAM_REF frames (data passed by reference) and let
    /// [`Connection::write_stream_ref`](super::Connection::write_stream_ref)
    /// send them (default off). Only for links between two ends in one
    /// process that both set it: any other peer would not understand them,
    /// and with it off a STREAM_REF from the peer is a violation. Needs the
    /// `stream-refs` feature (without it, this is ignored).
    pub stream_refs: bool,
}

impl Config {
    /// The default configuration, usable in `const` context.
    pub const fn new() -> Self {
        Config {
            max_idle_timeout: Duration::from_secs(30),
            max_data: 1024 * 1024,
            max_stream_data_bidi_local: 256 * 1024,
            max_stream_data_bidi_remote: 256 * 1024,
            max_stream_data_uni: 256 * 1024,
            max_streams_bidi: None,
            max_streams_uni: None,
            max_datagram_frame_size: 0,
            max_record_size: DEFAULT_MAX_RECORD_SIZE,
            protocols: &[MOQ_LITE_05],
            fixed_protocol: None,
            handshake_timeout: Duration::from_secs(10),
            keep_alive: true,
            connection_credit_on_receipt: true,
            stream_refs: false,
        }
    }

    /// The stream counts to advertise for a table of `capacity` slots.
    ///
    /// # Errors
    /// [`ConfigError::StreamsOverCapacity`] if the explicit counts add up to more than `capacity`.
    pub(crate) fn stream_counts(&self, capacity: usize) -> Result<(u64, u64), ConfigError> {
        let quarter = (capacity / 4) as u64;
        let bidi = self.max_streams_bidi.unwrap_or(quarter);
        let uni = self.max_streams_uni.unwrap_or(quarter);
        match bidi.checked_add(uni) {
            Some(total) if total <= capacity as u64 => Ok((bidi, uni)),
            _ => Err(ConfigError::StreamsOverCapacity),
        }
    }

    /// Checks the values a peer would reject or we could not honour.
    ///
    /// # Errors
    /// See [`ConfigError`].
    pub(crate) fn validate(&self, capacity: usize) -> Result<(u64, u64), ConfigError> {
        if self.max_record_size < DEFAULT_MAX_RECORD_SIZE {
            return Err(ConfigError::RecordSizeTooSmall);
        }
        // docs/protocol.md §1.5: we must send application_protocols, and not an empty list.
        if self.protocols.is_empty() || self.protocols.iter().any(|p| p.is_empty()) {
            return Err(ConfigError::NoProtocols);
        }
        // moq-dev validates names as HTTP tokens; a peer may reject anything else.
        if !self
            .protocols
            .iter()
            .chain(self.fixed_protocol.iter())
            .all(|p| !p.is_empty() && p.bytes().all(is_token_char))
        {
            return Err(ConfigError::InvalidProtocol);
        }
        let (bidi, uni) = self.stream_counts(capacity)?;
        // Our parameters must fit one record of the smallest size a peer may advertise.
        let frame = Frame::TransportParameters(self.transport_params(bidi, uni));
        if frame.encoded_len() as u64 > DEFAULT_MAX_RECORD_SIZE {
            return Err(ConfigError::ProtocolsTooLong);
        }
        Ok((bidi, uni))
    }

    /// Our transport parameters with the given stream counts.
    pub(crate) fn transport_params(&self, bidi: u64, uni: u64) -> TransportParams<'static> {
        TransportParams {
            max_idle_timeout: self.max_idle_timeout.as_millis(),
            initial_max_data: self.max_data,
            initial_max_stream_data_bidi_local: self.max_stream_data_bidi_local,
            initial_max_stream_data_bidi_remote: self.max_stream_data_bidi_remote,
            initial_max_stream_data_uni: self.max_stream_data_uni,
            initial_max_streams_bidi: bidi,
            initial_max_streams_uni: uni,
            max_datagram_frame_size: self.max_datagram_frame_size,
            // qmux-01: RESET_STREAM_AT does not exist (docs/protocol.md §2).
            reset_stream_at: false,
            // moq-dev always sends it, even at the default (docs/protocol.md §6 V1).
            max_record_size: Some(self.max_record_size),
            // docs/protocol.md §9.2: a protocol the transport chose is not repeated.
            application_protocols: match self.fixed_protocol {
                Some(_) => None,
                None => Some(Protocols::from_list(self.protocols)),
            },
        }
    }
}

/// An HTTP token character: letters, digits and ``!#$%&'*+-.^_`|~`` (docs/protocol.md §1.4).
fn is_token_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

impl Default for Config {
    fn default() -> Self {
        Config::new()
    }
}

/// Why a [`Config`] cannot be used for a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum ConfigError {
    /// `max_streams_bidi + max_streams_uni` exceeds the stream table's capacity.
    StreamsOverCapacity,
    /// `max_record_size` is below 16382, which peers reject (docs/protocol.md §1.3).
    RecordSizeTooSmall,
    /// The protocol list is empty or holds an empty name (docs/protocol.md §1.4).
    NoProtocols,
    /// A protocol name holds a character outside the HTTP token set (docs/protocol.md §1.4).
    InvalidProtocol,
    /// The protocol list makes our parameters larger than one 16382-byte record.
    ProtocolsTooLong,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ConfigError::StreamsOverCapacity => "advertised stream counts exceed the stream table",
            ConfigError::RecordSizeTooSmall => "max_record_size below 16382",
            ConfigError::NoProtocols => "no application protocol to offer",
            ConfigError::InvalidProtocol => "protocol name is not an HTTP token",
            ConfigError::ProtocolsTooLong => "transport parameters exceed one record",
        })
    }
}

impl core::error::Error for ConfigError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_moq_dev() {
        let c = Config::default();
        let p = c.transport_params(10_000, 10_000);
        assert_eq!(p.max_idle_timeout, 30_000);
        assert_eq!(p.initial_max_data, 1_048_576);
        assert_eq!(p.initial_max_stream_data_uni, 262_144);
        assert_eq!(p.max_record_size, Some(16_382));
        assert_eq!(p.max_datagram_frame_size, 0);
        assert!(p.application_protocols.unwrap().contains("moq-lite-05"));
    }

    #[test]
    fn stream_counts_fit_the_table() {
        let c = Config::default();
        assert_eq!(c.validate(32), Ok((8, 8)));
        let c = Config {
            max_streams_bidi: Some(20),
            max_streams_uni: Some(13),
            ..Config::new()
        };
        assert_eq!(c.validate(32), Err(ConfigError::StreamsOverCapacity));
        let c = Config {
            max_streams_bidi: Some(u64::MAX),
            max_streams_uni: Some(1),
            ..Config::new()
        };
        assert_eq!(c.validate(32), Err(ConfigError::StreamsOverCapacity));
    }

    #[test]
    fn rejects_unusable_values() {
        let c = Config {
            max_record_size: 1000,
            ..Config::new()
        };
        assert_eq!(c.validate(8), Err(ConfigError::RecordSizeTooSmall));
        let c = Config {
            protocols: &[],
            ..Config::new()
        };
        assert_eq!(c.validate(8), Err(ConfigError::NoProtocols));
        let c = Config {
            protocols: &["moq lite"],
            ..Config::new()
        };
        assert_eq!(c.validate(8), Err(ConfigError::InvalidProtocol));
    }
}
