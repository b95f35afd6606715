//! The relay's state that the core owns: fixed tables sized at start-up whose
//! entries come back once nothing uses them.
//!
//! * [`tracks`]: the relay tracks of one worker, reused through generations
//!   ([`crate::model::track::Ref::reopen`]), so requests for ever new track
//!   names never grow memory.
//! * [`broadcasts`]: the broadcasts it routes, reused the same way
//!   ([`crate::model::broadcast::Ref::reopen`]), so ever new broadcast paths
//!   never grow memory either.

pub mod broadcasts;
mod table;
pub mod tracks;

pub use broadcasts::{BroadcastSlot, BroadcastTable, ClaimError};
pub use table::Counts;
pub use tracks::{TrackSlot, TrackTable, TracksFull};
