//! skiff-monoio: the monoio runtime glue of skiff on Linux, and a moq-lite
//! client.
//!
//! It drives `skiff-core`'s sans-IO sessions from monoio runtimes, one per
//! thread. The relay server (`skiff-relay`) and the client are both built on
//! these modules:
//!
//! - [`driver`]: builds a thread's runtime on io_uring, with a fallback to
//!   epoll ([`driver::DriverKind`], [`driver::block_on`]);
//! - [`clock`]: the monotonic clock sessions take their instants from, and
//!   conversions between std and core durations;
//! - [`shutdown`]: the drain signal a stop trigger fires on every thread
//!   ([`shutdown::StopTrigger`] → [`shutdown::Shutdown`]);
//! - [`cancel`]: monoio operations cancelled on a drain signal or a time
//!   limit, writes that give up on a peer that stopped reading, and a race
//!   of two futures;
//! - [`staging`]: a connection's staging buffer, whose bytes and gathered
//!   pool ranges go out in one vectored write;
//! - [`buffers`]: the thread's pools of inbox and staging buffers, which a
//!   connection holds only while bytes pass through it;
//! - [`session_driver`]: runs one skiff-core `Session` over a byte stream (a
//!   reader task into an inbox, a session task for input, timers, events,
//!   transmit; GOAWAY on drain) with an [`session_driver::App`] on top;
//! - [`notify`]: the per-thread "media changed" signal the sessions share;
//! - [`tables`]: the table sizes of an endpoint (tracks, groups, block size)
//!   and the block pools and slices it allocates once at start-up;
//! - [`ws`] and [`tls`]: QMux over WebSocket and over TLS as byte-stream
//!   layers of the session driver (`ws://`, `tls://`, and `wss://` as the one
//!   on the other);
//! - [`sdk`]: the client SDK ([`connect`] → [`Client`] and [`Runner`]):
//!   publish and subscribe with linear async code;
//! - [`client`]: sessions driven by hand with ready-made [`session_driver::App`]s
//!   (the tests' and tools' lower-level client).

pub mod buffers;
pub mod cancel;
pub mod clock;
pub mod context;
pub mod driver;
pub mod notify;
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
