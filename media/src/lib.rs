//! Host media for skiff: what the camera, the viewer and the relay's demo
//! share to carry real H.264 in moq-dev's hang format (docs/protocol.md §10).
//!
//! * [`picture`]: an I420 picture buffer, sized once.
//! * [`pattern`]: the synthetic camera: moving colour bars with a burned-in
//!   frame counter and wall-clock time that survive lossy coding ([`pattern::read_stamp`]).
//! * [`h264`]: openh264's encoder and decoder, wrapped to hang's `avc1` framing.
//! * [`y4m_input`] and [`annexb_input`]: pictures and access units from a pipe.
//! * [`catalog`]: the host-side parser of a hang catalog.
//! * [`png_out`]: decoded pictures as PNG files.
//! * [`node`]: the camera node: a source encoded (or passed through) and
//!   published as a hang broadcast through the client SDK, redialing.

pub mod annexb_input;
pub mod catalog;
pub mod h264;
pub mod node;
pub mod pattern;
pub mod picture;
pub mod png_out;
pub mod y4m_input;
