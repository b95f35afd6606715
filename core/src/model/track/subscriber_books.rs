//! The subscriber books of a track: the subscriptions sessions serve from it
//! ([`Ref::subscribers`]) and their aggregate request ([`Ref::demand`]).

use super::Ref;
use super::demand::Demand;
use crate::time::Duration;
use crate::window::{End, Request, Start};

impl<'t, 'p> Ref<'t, 'p> {
    /// How many subscriptions are served from this track now (every session
    /// registers each subscription it serves for as long as it serves it).
    ///
    /// A relay cancels its upstream subscription once this stays 0
    /// (docs/protocol.md §4.5).
    pub fn subscribers(&self) -> u32 {
        if !self.is_current() {
            return 0;
        }
        self.core.demand.get().subscribers
    }

    /// The aggregate of the requests served from this track, or `None`
    /// without a subscriber: what a relay asks its upstream for (docs/protocol.md
    /// §4.5). Priority and max latency are the highest requested (each
    /// already clamped to this track's max age by the serving session); the
    /// start is [`Start::Latest`] if any subscription starts at the latest
    /// group, else the lowest explicit start; the end is [`End::Open`] if any
    /// subscription is unbounded, else the highest explicit end.
    ///
    /// O(1), no scan of the subscriptions, and exact while each value takes
    /// at most 4 distinct values among them (past that, an upper bound
    /// until the track has no subscriber). Counts are always exact.
    pub fn demand(&self) -> Option<Request> {
        let d = self.core.demand.get();
        if d.subscribers == 0 || !self.is_current() {
            return None;
        }
        Some(Request {
            start: if d.latest_starts > 0 {
                Start::Latest
            } else {
                Start::Group(d.starts.min().unwrap_or(0))
            },
            end: if d.open_ends > 0 {
                End::Open
            } else {
                End::Group(d.ends.max().unwrap_or(0))
            },
            ordered: false,
            priority: u8::try_from(d.priorities.max().unwrap_or(0)).unwrap_or(u8::MAX),
            max_latency: Duration::from_micros(d.latencies.max().unwrap_or(0)),
        })
    }

    /// Registers a subscription served from this track with `request` (a
    /// session calls it when it starts serving one; balance it with
    /// [`Ref::remove_subscriber`] with the same request).
    pub(crate) fn add_subscriber(&self, request: &Request) {
        if !self.is_current() {
            return;
        }
        let mut d = self.core.demand.get();
        d.count(request, true);
        self.core.demand.set(d);
    }

    /// Unregisters a subscription registered with `request` (it is no longer
    /// served). The last one leaving clears the aggregate.
    pub(crate) fn remove_subscriber(&self, request: &Request) {
        if !self.is_current() {
            return;
        }
        let mut d = self.core.demand.get();
        d.count(request, false);
        if d.subscribers == 0 {
            d = Demand::NONE;
        }
        self.core.demand.set(d);
    }

    /// Replaces registered request `old` with `new` (a SUBSCRIBE_UPDATE).
    pub(crate) fn update_subscriber(&self, old: &Request, new: &Request) {
        if old == new || !self.is_current() {
            return;
        }
        let mut d = self.core.demand.get();
        d.count(old, false);
        d.count(new, true);
        self.core.demand.set(d);
    }
}
