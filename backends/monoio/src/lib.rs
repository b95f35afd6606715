//! skiff-monoio: the monoio runtime glue of skiff on Linux, and the
//! moq-lite client SDK.
//!
//! **The client API** is the SDK ([`sdk`]): [`connect`] dials a relay and
//! returns a [`Client`] (publish: broadcast, track and group producers;
//! subscribe: track and group consumers) and the [`Runner`] that drives its
//! session; [`Config`] sets it up, [`Error`] says what failed.
//!
//! **For a runtime integrator** (the relay server `skiff-relay` is one),
//! the pieces the SDK is built on:
//!
//! - [`driver`]: builds a thread's runtime on io_uring, with a fallback to
//!   epoll ([`driver::DriverKind`], [`driver::block_on`]);
//! - [`clock`]: the monotonic clock sessions take their instants from, and
//!   conversions from std durations;
//! - [`shutdown`]: the drain signal a stop trigger fires on every thread
//!   ([`shutdown::StopTrigger`] → [`shutdown::Shutdown`]);
//! - [`cancel`]: monoio operations cancelled on a drain signal or a time
//!   limit, writes that give up on a peer that stopped reading, and a race
//!   of two futures;
//! - [`session_driver`]: runs one skiff-core `Session` over a byte stream
//!   ([`session_driver::drive`], with an [`session_driver::App`] on top and
//!   [`session_driver::ByteRead`]/[`session_driver::ByteWrite`] below; the
//!   hooks a server sizes and lends through: [`session_driver::SetupTables`],
//!   [`session_driver::App::lend`]);
//! - [`notify`]: the per-thread change signal the sessions of a thread share;
//! - [`staging`]: a connection's staging buffer, whose bytes and gathered
//!   pool ranges go out in one vectored write (what a [`session_driver::ByteWrite`]
//!   stages into);
//! - [`buffers`]: the thread's pools of staging buffers and the memory they
//!   give back;
//! - [`tables`]: the table sizes of an endpoint (tracks, groups) and the
//!   block pools and slices it allocates once at start-up;
//! - [`context`]: a client's per-thread resources (tables, pool, session
//!   storage), for drivers that run their own app;
//! - [`reuseport`]: a worker group's UDP sockets on one port and the kernel
//!   filter that steers QUIC datagrams by connection ID to their worker;
//! - [`ws`] and [`tls`]: QMux over WebSocket and over TLS as byte-stream
//!   layers of the session driver (`ws://`, `tls://`, and `wss://` as the one
//!   on the other).

pub mod buffers;
pub mod cancel;
pub mod clock;
pub mod context;
pub mod driver;
pub mod notify;
pub mod quic;
pub mod reuseport;
pub mod sdk;
pub mod session_driver;
pub mod shutdown;
pub mod staging;
pub mod tables;
pub mod tls;
pub mod ws;

pub use sdk::{Client, Config, Error, Runner, connect};

/// The README's examples, compiled as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctests;
