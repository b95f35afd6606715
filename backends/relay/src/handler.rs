//! The seam where a protocol plugs into the server: [`ConnectionHandler`].
//!
//! Each worker thread builds its own handler (so it may hold `Rc`/`RefCell`
//! per-thread state such as the relay's group cache and subscriber tables)
//! and calls [`ConnectionHandler::serve`] once per accepted connection, in a
//! task of its own on that thread.

use std::future::Future;
use std::rc::Rc;
use std::sync::Arc;

use skiff_monoio::driver::ActiveDriver;
use skiff_monoio::shutdown::Shutdown;

use crate::config::RelayConfig;
use crate::conn::Connection;
use crate::conn_name::ConnName;
use crate::metrics::Metrics;

/// What a worker thread knows when it builds its handler.
#[derive(Debug, Clone)]
pub struct WorkerInfo {
    /// Worker index, `0..threads`.
    pub index: usize,
    /// The driver this worker's runtime runs on.
    pub driver: ActiveDriver,
    /// The relay configuration.
    pub config: Arc<RelayConfig>,
    /// The drain signal of this thread (fires for every handler at once).
    pub shutdown: Shutdown,
    /// Every worker's counters (this one's is `metrics.thread(index)`).
    pub metrics: Arc<Metrics>,
}

/// Serves connections accepted on one worker thread.
///
/// Contract:
/// - `serve` runs in its own task on the accepting thread; the returned
///   future completing means the connection is finished (its socket closes
///   when the [`Connection`] halves drop).
/// - Once [`Connection::shutdown`] fires the handler should wind down (a
///   moq-lite session sends GOAWAY and waits for the peer); after the drain
///   timeout the server drops the future, closing the socket.
/// - Enforce the configuration's [`Limits`](crate::config::Limits) (in
///   [`WorkerInfo::config`]: streams, subscriptions, frame and group sizes);
///   the server only enforces the connection count.
pub trait ConnectionHandler: 'static {
    /// Why a connection ended abnormally (logged at debug level by the server).
    type Error: std::fmt::Display;

    /// Serves one connection until it ends.
    fn serve(
        self: Rc<Self>,
        conn: Connection,
    ) -> impl Future<Output = Result<(), Self::Error>> + 'static;

    /// The QUIC server configuration of this worker's UDP endpoint (the
    /// listen port's certificate with moq-lite's ALPN); `None` (the default):
    /// the worker serves no QUIC.
    fn quic_config(&self) -> Option<Arc<QuicServerConfig>> {
        None
    }

    /// Serves one connection accepted on the worker's QUIC endpoint until
    /// it ends; the default closes it at once.
    fn serve_quic(
        self: Rc<Self>,
        conn: QuicConn,
    ) -> impl Future<Output = Result<(), Self::Error>> + 'static {
        async move {
            drop(conn);
            Ok(())
        }
    }
}

/// The QUIC server configuration a worker's endpoint accepts with.
pub type QuicServerConfig = skiff_quic::quinn_proto::ServerConfig;

/// A connection accepted on a worker's QUIC endpoint: the library's
/// connection and its side of the endpoint, counted among the worker's open
/// connections until it drops.
pub struct QuicConn {
    /// The library's connection, handshake under way; boxed, so the
    /// futures that hand it on keep a pointer rather than room for the
    /// whole connection each.
    pub conn: Box<skiff_quic::quinn_proto::Connection>,
    /// Its side of the worker's endpoint.
    pub link: skiff_monoio::quic::Link,
    /// The client's address.
    pub peer: std::net::SocketAddr,
    /// The worker's name for it.
    pub name: ConnName,
    /// The server's drain signal, as seen from this thread.
    pub shutdown: skiff_monoio::shutdown::Shutdown,
    /// Counts the connection among the worker's handshakes until its
    /// session is set up.
    pub handshake: skiff_monoio::session_driver::HandshakeToken,
    /// Time the QUIC handshake and the client's SETUP have from the accept
    /// (`--handshake-timeout`).
    pub handshake_timeout: std::time::Duration,
    /// Bytes the worker's QUIC connections may hold unacknowledged, shared
    /// among them (`--quic-send-budget`).
    pub send_budget: u64,
}

impl std::fmt::Debug for QuicConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuicConn")
            .field("name", &self.name)
            .finish()
    }
}
