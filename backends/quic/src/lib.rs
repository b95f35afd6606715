//! moq-lite over QUIC (docs/protocol.md §11): skiff-core's transport seam
//! on quinn-proto, sans-IO.
//!
//! quinn-proto is a QUIC state machine that, like skiff-core, reads no
//! clock and owns no socket: an `Endpoint` turns received datagrams into
//! connection events, a `Connection` turns those and time into stream data
//! and datagrams to send. This crate adds what moq-lite needs on top:
//!
//! - [`config`]: the ALPN, windows, stream counts and the quinn-proto
//!   configurations built from rustls ones;
//! - [`steer`]: connection IDs that name the worker owning a connection,
//!   for a relay's endpoints sharing one UDP port;
//! - [`transport`]: [`QuicTransport`], a connection behind the core's
//!   [`Transport`](skiff_core::transport::Transport) trait, and [`pump`],
//!   which hands what it received to the session, no faster than the session
//!   takes it.
//!
//! A backend (skiff-monoio's `quic` module) owns the UDP socket, the
//! endpoint and the timers, and runs one session per connection.

pub mod config;
pub mod steer;
pub mod transport;
pub mod webtransport;

pub use transport::{Handoff, QuicTransport, WtStatus, pump};

/// The QUIC library, for the endpoint and connection types a backend drives.
pub use quinn_proto;
