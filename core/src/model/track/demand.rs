//! The tallies behind a track's subscriber books: the requests of the
//! subscriptions served from it, counted per value so their aggregate
//! ([`Demand`]) comes back down when subscribers leave.

use crate::window::{End, Request, Start};

/// Distinct values a [`Tally`] counts exactly.
const TALLY_VALUES: usize = 4;

/// A multiset of up to [`TALLY_VALUES`] distinct values with their counts,
/// so the extremes come back down when values leave. A value that finds no
/// entry is kept as a bound ([`Tally::spill`]) until the tally is emptied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Tally {
    /// `(value, count)`, counts > 0, for the first `len`.
    values: [(u64, u32); TALLY_VALUES],
    len: usize,
    /// The lowest and highest values that found no entry, if any.
    spill: Option<(u64, u64)>,
}

impl Tally {
    const EMPTY: Tally = Tally {
        values: [(0, 0); TALLY_VALUES],
        len: 0,
        spill: None,
    };

    fn counted(&self) -> &[(u64, u32)] {
        self.values.get(..self.len).unwrap_or(&[])
    }

    fn add(&mut self, v: u64) {
        let len = self.len;
        if let Some(e) = self.values.iter_mut().take(len).find(|e| e.0 == v) {
            e.1 = e.1.saturating_add(1);
        } else if let Some(e) = self.values.get_mut(len) {
            *e = (v, 1);
            self.len += 1;
        } else {
            self.spill = Some(self.spill.map_or((v, v), |(lo, hi)| (lo.min(v), hi.max(v))));
        }
    }

    fn remove(&mut self, v: u64) {
        let len = self.len;
        if let Some(i) = self.values.iter().take(len).position(|e| e.0 == v)
            && let Some(e) = self.values.get_mut(i)
        {
            e.1 -= 1;
            if e.1 == 0 {
                self.values.swap(i, len - 1);
                self.len -= 1;
            }
        }
        // Not found: it was spilled, and the spill stays a bound.
    }

    pub(super) fn max(&self) -> Option<u64> {
        let counted = self.counted().iter().map(|e| e.0).max();
        counted.max(self.spill.map(|(_, hi)| hi))
    }

    pub(super) fn min(&self) -> Option<u64> {
        let counted = self.counted().iter().map(|e| e.0).min();
        match (counted, self.spill.map(|(lo, _)| lo)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// The subscriptions served from a track and what they ask for together
/// (docs/protocol.md §4.5); see [`Ref::demand`].
///
/// Counters are exact, and so are the extremes (priority, max latency,
/// explicit starts and ends) while each takes at most [`TALLY_VALUES`]
/// distinct values among the subscriptions served; past that, the values
/// that did not fit bound them until the track has no subscriber.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Demand {
    pub(super) subscribers: u32,
    /// Subscriptions starting at the latest group.
    pub(super) latest_starts: u32,
    /// Subscriptions without an end.
    pub(super) open_ends: u32,
    pub(super) priorities: Tally,
    /// Max latencies, in microseconds.
    pub(super) latencies: Tally,
    /// Explicit starts.
    pub(super) starts: Tally,
    /// Explicit ends.
    pub(super) ends: Tally,
}

impl Demand {
    pub(super) const NONE: Demand = Demand {
        subscribers: 0,
        latest_starts: 0,
        open_ends: 0,
        priorities: Tally::EMPTY,
        latencies: Tally::EMPTY,
        starts: Tally::EMPTY,
        ends: Tally::EMPTY,
    };

    /// Counts `request` in (`sign` true) or out.
    pub(super) fn count(&mut self, request: &Request, sign: bool) {
        let step = |n: &mut u32| {
            *n = if sign {
                n.saturating_add(1)
            } else {
                n.saturating_sub(1)
            }
        };
        let tally = |t: &mut Tally, v: u64| if sign { t.add(v) } else { t.remove(v) };
        step(&mut self.subscribers);
        match request.start {
            Start::Latest => step(&mut self.latest_starts),
            Start::Group(s) => tally(&mut self.starts, s),
        }
        match request.end {
            End::Open => step(&mut self.open_ends),
            End::Group(e) => tally(&mut self.ends, e),
        }
        tally(&mut self.priorities, u64::from(request.priority));
        tally(&mut self.latencies, request.max_latency.as_micros());
    }
}
