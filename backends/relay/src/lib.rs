//! skiff-relay: the thread-per-core io_uring moq-lite relay of skiff, built
//! on the runtime glue of `skiff-monoio`.
//!
//! - [`config`]: flags, the TOML file and the validated
//!   [`config::RelayConfig`];
//! - [`error`]: the errors that stop the relay process ([`error::RelayError`]);
//! - [`server`]: SO_REUSEPORT listeners, one worker thread each
//!   ([`server::start`] → [`server::ServerHandle`]);
//! - [`handler`]: **the seam** — [`handler::ConnectionHandler`], built once
//!   per worker thread and called once per accepted connection;
//! - [`conn`]: the [`conn::Connection`] a handler gets, with owned,
//!   reusable read and write buffers;
//! - [`conn_name`]: what log lines call a connection ([`conn_name::ConnName`]:
//!   a client by transport and address, a worker link as a link, the
//!   upstream by its URL without the query);
//! - [`signals`]: SIGINT/SIGTERM → stop accepting, drain, exit; SIGHUP →
//!   reload the TLS certificate;
//! - [`cert`]: the relay's server certificate ([`cert::ServerCert`]), from
//!   files or generated and renewed, shared by TLS over TCP, the QUIC
//!   endpoint and `GET /certificate.sha256`;
//! - [`tls`]: the listen port's TLS, shared by the workers, its certificate
//!   reloaded in place (docs/protocol.md §9.8);
//! - [`metrics`]: per-thread atomic counters and the Prometheus endpoint;
//! - [`proxy_protocol`]: PROXY protocol headers from the load balancers of
//!   `--proxy-protocol-from`, naming the client a connection carries;
//! - [`relay`]: the per-worker relay state (origin, cache pool, routes, the
//!   on-demand track hook) and [`relay::RelayHandler`], which `serve` runs;
//!   workers are linked pairwise by moq-lite sessions ([`relay::Mesh`]), and
//!   a leaf keeps a session to its upstream relay;
//! - [`lend`]: zero-copy fan-out between workers: a link lends pool blocks
//!   instead of sending their bytes;
//! - [`storage`]: the session tables of its connections, by kind (client,
//!   trunk between workers, upstream);
//! - [`web`]: HTTP on the listen port: QMux over WebSocket for browsers
//!   and the player's endpoints (docs/protocol.md §9);
//! - [`record`]: recording while relaying (`--record`), `GET /recordings`
//!   and `skiff-relay export`;
//! - [`relay_demo`]: `skiff-relay demo`, the relay plus a camera publisher
//!   and viewers in one process.
//!
//! The worker thread itself (its runtime, accept loop and drain) is private;
//! [`WorkerExit`] is what each reports when it stops.

pub mod auth;
pub mod cert;
pub mod config;
pub mod conn;
pub mod conn_name;
pub mod error;
pub mod handler;
pub mod lend;
pub mod metrics;
pub mod offload;
pub mod proxy_protocol;
pub mod record;
pub mod relay;
pub mod relay_demo;
pub mod server;
pub mod signals;
pub mod storage;
pub mod tls;
pub mod web;
mod worker;
pub mod worker_tables;

pub use worker::WorkerExit;
