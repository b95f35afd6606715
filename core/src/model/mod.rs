//! The media model: broadcasts hold tracks, tracks hold groups, groups hold frames.
//!
//! Each level is a module with a producer side and a consumer side.

pub mod broadcast;
pub mod frame;
pub mod group;
pub mod hops;
pub mod origin;
pub mod path;
pub mod track;
