//! The QUIC settings skiff runs moq-lite with (docs/protocol.md §11.2): the
//! ALPN, the receive windows that hold a parked reader's peer to about one
//! window, the stream counts the session's tables can take, and the
//! endpoint, server and client configurations for quinn-proto.

use std::sync::Arc;
use std::time::Duration;

use quinn_proto::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use quinn_proto::{EndpointConfig, IdleTimeout, TransportConfig, VarInt};

/// The protocols offered and accepted as ALPN, most preferred first: the
/// moq-lite version the core speaks (docs/protocol.md §11.1).
pub const ALPNS: &[&str] = &[skiff_core::conn::MOQ_LITE_05];

/// The receive window of one stream: what the library holds of a stream
/// the session has not asked for yet (the same as QMux's stream window).
pub const STREAM_WINDOW: u64 = 256 * 1024;

/// The receive window of a whole connection.
pub const CONNECTION_WINDOW: u64 = 2 * 1024 * 1024;

/// Bytes the library may hold unacknowledged or unsent across a
/// connection's streams: small, so the session's order (priority, then
/// newest group first) decides what goes next rather than a deep buffer.
pub const SEND_WINDOW: u64 = 512 * 1024;

/// The least send window a connection is given when a worker shares its
/// send budget among many ([`send_window_for`]): one 16 KiB frame.
pub const MIN_SEND_WINDOW: u64 = 16 * 1024;

/// A server's budget of bytes held unacknowledged or unsent across the
/// QUIC connections of one worker thread, unless the operator sets one:
/// each of 32 connections or fewer gets the whole [`SEND_WINDOW`], each of
/// 1,024 gets [`MIN_SEND_WINDOW`].
pub const SEND_BUDGET: u64 = 16 * 1024 * 1024;

/// The send window of each of `connections` connections sharing `budget`:
/// an equal share, no more than [`SEND_WINDOW`] and no less than
/// [`MIN_SEND_WINDOW`]. The library copies what a connection writes and
/// keeps it until the peer acknowledges it, so the window is what a viewer
/// that falls behind holds of the relay's memory.
pub fn send_window_for(budget: u64, connections: usize) -> u64 {
    let n = u64::try_from(connections.max(1)).unwrap_or(u64::MAX);
    (budget / n).clamp(MIN_SEND_WINDOW, SEND_WINDOW)
}

/// A connection's idle timeout, as on QMux.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// How often a client pings an otherwise quiet connection, so NATs and the
/// idle timeout keep it.
pub const KEEP_ALIVE: Duration = Duration::from_secs(10);

/// The moq-lite session code a connection closes with when no protocol was
/// agreed (docs/protocol.md §3.15).
pub const VERSION_NEGOTIATION_FAILED: u32 = 0x15;

/// The QUIC transport settings for a session whose tables hold `streams`
/// stream slots: a quarter each for the streams the peer may open in each
/// direction, as on QMux.
pub fn transport_config(streams: usize, client: bool) -> TransportConfig {
    let quarter = u32::try_from(streams / 4).unwrap_or(u32::MAX).max(1);
    let mut t = TransportConfig::default();
    t.max_concurrent_bidi_streams(VarInt::from_u32(quarter))
        .max_concurrent_uni_streams(VarInt::from_u32(quarter))
        .stream_receive_window(VarInt::from_u64(STREAM_WINDOW).unwrap_or(VarInt::MAX))
        .receive_window(VarInt::from_u64(CONNECTION_WINDOW).unwrap_or(VarInt::MAX))
        .send_window(SEND_WINDOW)
        .max_idle_timeout(IdleTimeout::try_from(IDLE_TIMEOUT).ok())
        .keep_alive_interval(client.then_some(KEEP_ALIVE))
        .datagram_receive_buffer_size(None)
        .enable_segmentation_offload(true)
        // BBR paces at the measured bottleneck rate and does not take
        // random loss for congestion: a live stream keeps its rate on a
        // lossy link, where CUBIC halves it at every loss (moq-dev's QUIC
        // stacks run BBR as well).
        .congestion_controller_factory(Arc::new(quinn_proto::congestion::BbrConfig::default()));
    t
}

/// The endpoint configuration (connection IDs, stateless reset keys).
pub fn endpoint_config() -> EndpointConfig {
    EndpointConfig::default()
}

/// The endpoint configuration of worker `worker` of `workers` serving one
/// UDP port: its connection IDs name the worker ([`crate::steer`]), so a
/// socket filter can steer each datagram to it. Past
/// [`steer::MAX_WORKERS`](crate::steer::MAX_WORKERS) workers no byte can
/// name them all, and the IDs are quinn-proto's own.
pub fn worker_endpoint_config(worker: usize, workers: usize) -> EndpointConfig {
    let mut config = EndpointConfig::default();
    if workers <= crate::steer::MAX_WORKERS {
        config.cid_generator(move || Box::new(crate::steer::WorkerCids::new(worker, workers)));
    }
    config
}

/// A server configuration over `tls`, which must offer [`ALPNS`] and allow
/// TLS 1.3.
///
/// # Errors
/// The TLS configuration cannot serve QUIC (no TLS 1.3, or no initial cipher
/// suite).
pub fn server_config(
    tls: Arc<rustls::ServerConfig>,
    streams: usize,
) -> Result<quinn_proto::ServerConfig, ConfigError> {
    server_config_over(tls, transport_config(streams, false))
}

/// A server configuration over `tls` with `transport`.
fn server_config_over(
    tls: Arc<rustls::ServerConfig>,
    transport: TransportConfig,
) -> Result<quinn_proto::ServerConfig, ConfigError> {
    let crypto = QuicServerConfig::try_from(tls).map_err(|_| ConfigError::Tls)?;
    let mut config = quinn_proto::ServerConfig::with_crypto(Arc::new(crypto));
    config.transport_config(Arc::new(transport));
    Ok(config)
}

/// A client configuration over `tls`, which must offer [`ALPNS`] and allow
/// TLS 1.3.
///
/// # Errors
/// As [`server_config`].
pub fn client_config(
    tls: Arc<rustls::ClientConfig>,
    streams: usize,
) -> Result<quinn_proto::ClientConfig, ConfigError> {
    client_config_over(tls, transport_config(streams, true))
}

/// A client configuration over `tls` with `transport`.
fn client_config_over(
    tls: Arc<rustls::ClientConfig>,
    transport: TransportConfig,
) -> Result<quinn_proto::ClientConfig, ConfigError> {
    let crypto = QuicClientConfig::try_from(tls).map_err(|_| ConfigError::Tls)?;
    let mut config = quinn_proto::ClientConfig::new(Arc::new(crypto));
    config.transport_config(Arc::new(transport));
    Ok(config)
}

/// The ALPN list as rustls takes it.
pub fn alpn_protocols() -> Vec<Vec<u8>> {
    ALPNS.iter().map(|a| a.as_bytes().to_vec()).collect()
}

/// The ALPN list of a server that also serves WebTransport: [`ALPNS`],
/// then HTTP/3 last, so a client offering both gets moq-lite
/// (docs/protocol.md §12.1).
pub fn alpn_protocols_with_h3() -> Vec<Vec<u8>> {
    let mut alpns = alpn_protocols();
    alpns.push(crate::webtransport::ALPN_H3.as_bytes().to_vec());
    alpns
}

/// Bytes of datagrams the library keeps unread on a connection that may
/// carry WebTransport: HTTP/3's datagram setting requires the peer to know
/// we accept datagrams, which nothing here reads (they are dropped).
pub const DATAGRAM_BUFFER: usize = 4 * 1024;

/// As [`server_config`], for a server that also serves WebTransport
/// ([`alpn_protocols_with_h3`] in `tls`): the connection accepts datagrams,
/// since the HTTP/3 SETTINGS say so.
///
/// # Errors
/// As [`server_config`].
pub fn server_config_webtransport(
    tls: Arc<rustls::ServerConfig>,
    streams: usize,
) -> Result<quinn_proto::ServerConfig, ConfigError> {
    let mut transport = transport_config(streams, false);
    transport.datagram_receive_buffer_size(Some(DATAGRAM_BUFFER));
    server_config_over(tls, transport)
}

/// As [`client_config`], for a WebTransport client (`tls` offering
/// [`ALPN_H3`](crate::webtransport::ALPN_H3)).
///
/// # Errors
/// As [`client_config`].
pub fn client_config_webtransport(
    tls: Arc<rustls::ClientConfig>,
    streams: usize,
) -> Result<quinn_proto::ClientConfig, ConfigError> {
    let mut transport = transport_config(streams, true);
    transport.datagram_receive_buffer_size(Some(DATAGRAM_BUFFER));
    client_config_over(tls, transport)
}

/// Why a QUIC configuration could not be made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigError {
    /// The TLS configuration does not allow TLS 1.3 with a QUIC initial
    /// cipher suite.
    Tls,
}

impl core::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ConfigError::Tls => {
                f.write_str("the TLS configuration cannot carry QUIC (TLS 1.3 needed)")
            }
        }
    }
}

impl std::error::Error for ConfigError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_is_shared_within_the_window_bounds() {
        assert_eq!(send_window_for(SEND_BUDGET, 0), SEND_WINDOW);
        assert_eq!(send_window_for(SEND_BUDGET, 32), SEND_WINDOW);
        assert_eq!(send_window_for(SEND_BUDGET, 64), 256 * 1024);
        assert_eq!(send_window_for(SEND_BUDGET, 500), 33_554);
        assert_eq!(send_window_for(SEND_BUDGET, 5_000), MIN_SEND_WINDOW);
        assert_eq!(send_window_for(u64::MAX, 1), SEND_WINDOW);
        assert_eq!(send_window_for(0, 1), MIN_SEND_WINDOW);
        assert_eq!(send_window_for(u64::MAX, usize::MAX), MIN_SEND_WINDOW);
    }
}
