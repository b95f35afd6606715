//! skiff-monoio: the Linux server and client backend of skiff.
//!
//! It drives `skiff-core`'s sans-IO sessions from monoio runtimes, one per
//! core. The relay server (`skiff-relay`) is built from:
//!
//! - [`config`]: flags, the TOML file and the validated [`config::RelayConfig`];
//! - [`driver`]: io_uring runtime with a fallback to epoll;
//! - [`server`]: SO_REUSEPORT listeners, one worker thread each
//!   ([`server::start`] → [`server::ServerHandle`]);
//! - [`handler`]: **the seam** — [`handler::ConnectionHandler`], built once
//!   per worker thread and called once per accepted connection;
//! - [`conn`]: the [`conn::Connection`] a handler gets, with owned,
//!   reusable read and write buffers;
//! - [`shutdown`] and [`signals`]: SIGINT/SIGTERM → stop accepting, drain,
//!   exit;
//! - [`metrics`]: per-thread atomic counters and the Prometheus endpoint;
//! - [`demo`]: the echo server under a loopback load.
//!
//! # Plugging in the moq-lite session
//!
//! The session driver implements [`handler::ConnectionHandler`]: it splits
//! the [`conn::Connection`] ([`conn::Connection::into_split`]), feeds what
//! [`conn::Reader::read`] returns to the session's `handle_input`, writes what
//! `poll_transmit` puts into [`conn::Writer::buffer`] with
//! [`conn::Writer::flush`], sleeps until `poll_timeout`, and on
//! [`shutdown::Shutdown::wait`] sends GOAWAY. Per-thread relay state (cache,
//! subscriber tables) lives in the handler, which each worker builds from
//! [`handler::WorkerInfo`]. `skiff-relay serve` then calls
//! `server::start(config, |w| SessionHandler::new(w))` where it now returns
//! [`error::RelayError::SessionUnavailable`].

pub mod clock;
pub mod config;
pub mod conn;
pub mod demo;
pub mod driver;
pub mod error;
pub mod handler;
pub mod metrics;
pub mod server;
pub mod shutdown;
pub mod signals;
mod worker;

pub use worker::WorkerExit;
