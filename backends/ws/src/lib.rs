//! QMux over WebSocket, sans-IO (docs/protocol.md §9).
//!
//! Browsers reach a relay with QMux carried in WebSocket binary messages: one
//! message holds exactly one QMux record, without the `Size` prefix a record
//! has on TCP. This crate holds the parts that touch no socket:
//!
//! * [`http`]: the HTTP/1.1 request head (bounded, parsed with `httparse`),
//!   the upgrade check, the choice of subprotocol, the responses, and the
//!   client's request and the check of the server's answer;
//! * [`frame`]: a WebSocket frame decoder that turns binary messages into
//!   QMux/TCP records (`Size` + frames) a session reads as if from TCP, and
//!   the frame headers the writer puts in front of each record.
//!
//! The runtime glue (monoio reader and writer) lives in `skiff-monoio`.

pub mod frame;
pub mod http;

/// The subprotocol skiff speaks: QMux draft 01 records carrying moq-lite-05
/// (docs/protocol.md §9.2).
pub const SUBPROTOCOL: &str = "qmux-01.moq-lite-05";

/// The application protocol [`SUBPROTOCOL`] selects.
pub const APPLICATION: &str = "moq-lite-05";
