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

/// The SUBSCRIBE for relay track `t` over a mirroring trunk (a link to
/// another worker): [`upstream_request`], but a track holding no group yet
/// starts at group 0, which the peer serves from the oldest group it holds
/// that is fresh for the max age asked, newest first. Whichever start a
/// subscriber here asks for, it then finds what the peer's worker holds:
/// the groups older than the first one held here are still on their way
/// ([`track::Ref::may_arrive`]). A subscriber asking for the latest group
/// starts at the newest one that arrives first.
pub fn mirror_request(t: track::Ref<'_, '_>) -> Request {
    let request = upstream_request(t);
    if t.latest().is_some() {
        return request;
    }
    Request {
        start: Start::Group(0),
        ..request
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
    #[cfg(test)]
    pub fn sent(&self) -> Request {
        self.sent
    }

    /// What to do now for relay track `t` (`now` is asked only while the
    /// track has no subscriber). The start stays what the SUBSCRIBE asked:
    /// an update says "latest", which keeps the upstream's start in force,
    /// where an explicit start would reposition its window and send the
    /// groups it delivered already again.
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
            Step::Update(Request {
                start: Start::Latest,
                ..want
            })
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
    fn a_mirroring_trunk_asks_for_every_group_held_until_the_track_has_one() {
        let mut ps = PoolStorage::<4, 32>::new();
        let pool = Pool::new(&mut ps);
        let state = State::<2>::new(&pool, Info::new("v").unwrap());
        let t = state.handle();
        assert_eq!(
            mirror_request(t),
            Request {
                start: Start::Group(0),
                ..UPSTREAM
            }
        );
        // A subscriber's preferences go up as an update that keeps that start
        // (says "latest"): group 0 again would make the peer resend its groups.
        let mut f = Follow::new(mirror_request(t), LINGER);
        let sub = Request::test(5, 1000, Start::Group(0), End::Open);
        t.add_subscriber(&sub);
        let Step::Update(r) = f.step(t, || Instant::ZERO) else {
            panic!("no update for the first subscriber")
        };
        assert_eq!((r.start, r.priority), (Start::Latest, 5));
        f.updated(r);
        assert_eq!(f.step(t, || Instant::ZERO), Step::Wait(None));
        t.remove_subscriber(&sub);
        // A track that holds groups (a new source takes over) goes on from
        // the new source's latest, as any upstream does.
        let p = t.producer().unwrap();
        let mut g = p.create_group(7).unwrap();
        g.write_frame(0, b"f").unwrap();
        assert_eq!(mirror_request(t), upstream_request(t));
        assert_eq!(mirror_request(t).start, Start::Latest);
    }

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
