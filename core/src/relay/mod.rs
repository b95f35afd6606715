//! The relay's state that the core owns: fixed tables sized at start-up whose
//! entries come back once nothing uses them.
//!
//! * [`tracks`]: the relay tracks of one worker, reused through generations
//!   ([`crate::model::track::Ref::reopen`]), so requests for ever new track
//!   names never grow memory.
//! * [`broadcasts`]: the broadcasts it routes, reused the same way
//!   ([`crate::model::broadcast::Ref::reopen`]), so ever new broadcast paths
//!   never grow memory either.
//! * [`routes`]: which source serves each path, standbys and spares,
//!   publisher failover within a grace period, relay tracks made on demand
//!   and the per-peer quotas on them ([`routes::Router`]).
//! * [`demand`]: one upstream subscription per relay track, following the
//!   merged downstream demand and lingering after the last subscriber.
//! * [`peer`]: the relay's side of one session: its events for the router,
//!   its upstream subscriptions, its on-demand hook ([`peer::Resolver`]).
//!
//! Everything here is sans-IO: time is passed in, deadlines come out.

pub mod broadcasts;
pub mod demand;
#[cfg(test)]
mod mesh;
pub mod peer;
pub mod routes;
mod table;
pub mod tracks;

pub use broadcasts::{BroadcastSlot, BroadcastTable, ClaimError};
pub use demand::{Follow, LINGER, Step, UPSTREAM, mirror_request, upstream_request};
pub use peer::{Effect, Peer, PeerKind, RefusedHook, Resolver, SubscribeQueue, Wake};
pub use routes::{
    AnnounceRefused, Announced, Pending, Quota, ResolveRefused, Route, Router, RouterLimits,
    RouterStorage, SourceId, Spare, Upstreams, Via, end_track,
};
pub use table::Counts;
pub use tracks::{TrackSlot, TrackTable, TracksFull};
