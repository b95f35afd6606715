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
//! - [`demo`]: the echo server under a loopback load (`echo-demo`).
//!
//! # The moq-lite relay
//!
//! - [`session_driver`]: runs one skiff-core `Session` over a socket (a
//!   reader task into an inbox, a session task for input, timers, events,
//!   transmit; GOAWAY on drain), with an [`session_driver::App`] on top;
//! - [`relay`]: the per-worker relay state (origin, cache pool, routes, the
//!   on-demand track hook) and [`relay::RelayHandler`], which `serve` runs;
//!   workers are linked pairwise by moq-lite sessions ([`relay::Mesh`]);
//! - [`lend`]: zero-copy fan-out between workers: a link lends pool blocks
//!   instead of sending their bytes;
//! - [`notify`]: the per-thread "media changed" signal the sessions share;
//! - [`client`]: a minimal client (dial, publish, subscribe, read frames);
//! - [`relay_demo`]: `skiff-relay demo`, relay plus camera and viewers.

pub mod client;
pub mod clock;
pub mod config;
pub mod conn;
pub mod demo;
pub mod driver;
pub mod error;
pub mod handler;
pub mod lend;
pub mod metrics;
pub mod notify;
pub mod relay;
pub mod relay_demo;
pub mod sdk;
pub mod server;
pub mod session_driver;
pub mod shutdown;
pub mod signals;
pub mod staging;
mod worker;

pub use sdk::{Client, Config, Error, Runner, connect};
pub use worker::WorkerExit;
