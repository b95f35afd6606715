//! The relay's state that the core owns: fixed tables sized at start-up whose
//! entries come back once nothing uses them.
//!
//! * [`tracks`]: the relay tracks of one worker, reused through generations
//!   ([`crate::model::track::Ref::reopen`]), so requests for ever new track
//!   names never grow memory.

pub mod tracks;

pub use tracks::{TrackCounts, TrackSlot, TrackTable, TracksFull};
