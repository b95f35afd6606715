//! Keeps one upstream subscription in line with the downstream ones served
//! from its relay track (docs/protocol.md §4.5): the SUBSCRIBE asks
//! for their aggregate, a change of it goes out as SUBSCRIBE_UPDATE, and once
//! the track has had no subscriber for the linger time, the upstream
//! subscription is cancelled. Time is passed in.

use crate::model::track;
use crate::time::{Duration, Instant};
use crate::window::{Request, Start};

/// The upstream request of a relay track nobody subscribes to yet: the live
/// edge, priority 0, with the publisher's default max age, so groups
/// published before the first SUBSCRIBE_UPDATE arrives are not given up.
pub const UPSTREAM: Request = Request {
    max_latency: track::DEFAULT_MAX_AGE,
    ..Request::LIVE
};

/// How long an upstream subscription is kept after its track lost its last
/// downstream subscriber: a subscriber that switches away and back, or
/// reconnects, finds the track still warm.
pub const LINGER: Duration = Duration::from_secs(2);

/// The SUBSCRIBE for relay track `t`: the aggregate of its downstream
/// subscriptions ([`track::Ref::demand`]), or [`UPSTREAM`] while it has none.
/// A track that holds groups already (a new source takes over) continues
/// from the new source's latest group.
pub fn upstream_request(t: track::Ref<'_, '_>) -> Request {
    match t.demand() {
        None => UPSTREAM,
        Some(d) if t.latest().is_some() => Request {
            start: Start::Latest,
            ..d
        },
        Some(d) => d,
    }
}

/// What an upstream subscription should do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Nothing; call again when the track's demand changes or at `Some`
    /// deadline (the end of the linger time).
    Wait(Option<Instant>),
    /// Send this SUBSCRIBE_UPDATE, then [`Follow::updated`].
    Update(Request),
    /// The track had no subscriber for the linger time: cancel the upstream
    /// subscription.
    Cancel,
}

/// The state of one upstream subscription: what it asked for, and since
/// when its track has had no subscriber.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Follow {
    sent: Request,
    idle_since: Option<Instant>,
    linger: Duration,
}

impl Follow {
    /// A subscription that asked for `sent`, cancelled after `linger` without subscriber.
    pub fn new(sent: Request, linger: Duration) -> Self {
        Follow {
            sent,
            idle_since: None,
            linger,
        }
    }

    /// What was asked for last.
    pub fn sent(&self) -> Request {
        self.sent
    }

    /// What to do now for relay track `t` (`now` is asked only while the
    /// track has no subscriber). The start stays what the SUBSCRIBE asked (an
    /// update with another start would reposition the upstream window).
    pub fn step(&mut self, t: track::Ref<'_, '_>, now: impl FnOnce() -> Instant) -> Step {
        let Some(demand) = t.demand() else {
            let now = now();
            let since = *self.idle_since.get_or_insert(now);
            let end = since.saturating_add(self.linger);
            return if now >= end {
                Step::Cancel
            } else {
                Step::Wait(Some(end))
            };
        };
        self.idle_since = None;
        let want = Request {
            start: self.sent.start,
            ..demand
        };
        if want == self.sent {
            Step::Wait(None)
        } else {
            Step::Update(want)
        }
    }

    /// The update `r` went out.
    pub fn updated(&mut self, r: Request) {
        self.sent = r;
    }

    /// Whether [`Follow::step`] would do nothing before `now` (no update
    /// due, no linger to end); `now` is asked only while a linger runs.
    pub fn is_quiet(&self, t: track::Ref<'_, '_>, now: impl FnOnce() -> Instant) -> bool {
        match (t.demand(), self.idle_since) {
            (None, Some(since)) => now() < since.saturating_add(self.linger),
            (Some(d), None) => {
                Request {
                    start: self.sent.start,
                    ..d
                } == self.sent
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::track::{Info, State};
    use crate::pool::{Pool, PoolStorage};
    use crate::window::End;

    #[test]
    fn demand_goes_up_and_back_down_then_lingers_out() {
        let mut ps = PoolStorage::<4, 32>::new();
        let pool = Pool::new(&mut ps);
        let state = State::<2>::new(&pool, Info::new("v").unwrap());
        let t = state.handle();
        let t0 = Instant::ZERO;
        let mut f = Follow::new(upstream_request(t), LINGER);
        assert_eq!(f.sent(), UPSTREAM);
        let low = Request::test(1, 100, Start::Latest, End::Open);
        let high = Request::test(9, 4000, Start::Latest, End::Open);
        t.add_subscriber(&low);
        let Step::Update(r) = f.step(t, || t0) else {
            panic!("no update for the first subscriber")
        };
        assert_eq!(r.priority, 1);
        f.updated(r);
        assert_eq!(f.step(t, || t0), Step::Wait(None));
        t.add_subscriber(&high);
        let Step::Update(r) = f.step(t, || t0) else {
            panic!("no update for a higher priority")
        };
        assert_eq!(
            (r.priority, r.max_latency),
            (9, Duration::from_millis(4000))
        );
        f.updated(r);
        t.remove_subscriber(&high);
        let Step::Update(r) = f.step(t, || t0) else {
            panic!("no update back down")
        };
        assert_eq!(r.priority, 1);
        f.updated(r);
        // The last one leaves: linger, in simulated time.
        t.remove_subscriber(&low);
        let t1 = t0.saturating_add(Duration::from_millis(10));
        let end = t1.saturating_add(LINGER);
        assert_eq!(f.step(t, || t1), Step::Wait(Some(end)));
        assert!(f.is_quiet(t, || t1));
        // Someone comes back within the linger: kept.
        t.add_subscriber(&low);
        assert_eq!(
            f.step(t, || t1.saturating_add(Duration::from_millis(1999))),
            Step::Wait(None)
        );
        t.remove_subscriber(&low);
        let t2 = end;
        assert_eq!(
            f.step(t, || t2),
            Step::Wait(Some(t2.saturating_add(LINGER)))
        );
        assert_eq!(f.step(t, || t2.saturating_add(LINGER)), Step::Cancel);
    }
}
