//! Wire codecs: QUIC varints, QMux records/frames/transport parameters, moq-lite-05 messages.
//!
//! Every decoder works on a borrowed slice, returns [`DecodeError::Incomplete`]
//! (consuming nothing) when the input is partial, checks a length against its
//! limit before reading the bytes it announces, and never panics.

mod codec;
mod error;
pub mod lite;
pub mod qmux;
pub mod varint;

pub use codec::{Reader, Writer};
pub use error::{DecodeError, EncodeError};
