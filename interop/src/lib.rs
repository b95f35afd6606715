//! Interop test harness: runs the published moq-dev crates (the reference implementation
//! that skiff must be wire-compatible with) over real loopback TCP.
//!
//! * [`reference`] starts a moq-net publisher or subscriber, as a TCP server or client,
//!   on a background thread with its own tokio runtime, so a test can drive it from
//!   plain synchronous code while skiff runs on the test thread.
//! * [`tap`] is a transparent loopback TCP forwarder that records both directions.
//! * [`skiff_driver`] runs one sans-IO skiff session over a std `TcpStream` on the
//!   calling thread (clock, buffers, timers, events, deadline), plus helpers that put
//!   a [`reference::Publication`] into skiff's media model and read local tracks.
//! * [`wire`] is a small, independent QMux record/frame decoder for those recordings
//!   (deliberately not built on skiff-core, so it can cross-check skiff's codecs).
//!
//! Everything binds to `127.0.0.1` only, and every wait is bounded by a timeout.
//! See docs/protocol.md §7.2 (reference clients) and §7.3 (wire-tapping).

pub mod reference;
pub mod skiff_driver;
pub mod tap;
pub mod wire;

/// The only moq-lite version skiff speaks: the ALPN token carried in QMux
/// `application_protocols` (docs/protocol.md §1.5, §3.1).
pub const ALPN_LITE_05: &str = "moq-lite-05";
