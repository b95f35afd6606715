//! Subscription windows: which groups of a track a subscriber still wants.
//!
//! A subscriber asks for a range of groups with SUBSCRIBE and changes it with
//! SUBSCRIBE_UPDATE (docs/protocol.md §3.8): a start (the latest group, or an
//! absolute group), an end (open, or an absolute group, inclusive), a
//! priority and a max latency. [`Request`] carries exactly that. Resolving a
//! request against the track's live edge ([`Timeline`]) gives a [`Window`].
//!
//! # What a window holds
//!
//! A [`Window<N>`] is two things, both inline (no heap, O(N) operations with
//! tiny `N`):
//!
//! * a **set** of wanted groups, kept as at most `N` sorted, disjoint,
//!   non-adjacent inclusive [`GroupRange`]s. Resolution makes it one range
//!   running from the resolved start to `u64::MAX`; the relay removes groups as
//!   it delivers or drops them ([`Window::remove`], [`Window::remove_through`]).
//!   Delivery is newest-first (§4.6), so removals can leave holes; that is what
//!   `N > 1` is for. A change that would need more than `N` ranges fails with
//!   [`WindowError::TooManyRanges`] and leaves the window unchanged.
//! * a **cap**: the request's end. §3.8: the end is a serving cap, not a
//!   terminator; groups past it are held until an update raises or clears it.
//!   Keeping the cap apart from the set means lowering and raising it never
//!   re-adds a group that was already delivered.
//!
//! Every query ([`Window::contains`], [`Window::first`], ...) sees the set
//! limited to the cap. An open end is the cap `u64::MAX`: as a set of `u64`
//! group numbers "everything from the start" and "up to `u64::MAX` inclusive"
//! are the same, so both spell it that way and no computation overflows.
//!
//! # Expiry
//!
//! §4.7: a group older than the latest is stale for a subscriber once the
//! point where its successor began is more than the subscriber's max latency
//! behind the newest frame of the latest group; max latency 0 means only the
//! live edge; the latest group is never stale. A [`Timeline`] reports the
//! latest group, the newest frame's time, and for an older group the time its
//! successor began (`None` if the caller no longer holds that group, which
//! makes it undeliverable too). Times are whatever clock the caller measures
//! age in: presentation time converted to microseconds, as moq-dev does, or
//! arrival time.
//!
//! Resolution skips the stale head of the requested range with a binary
//! search, so it costs O(log range) timeline calls, never O(range): staleness
//! must therefore be monotonic (older groups are stale first), which holds
//! when a group's successor never begins before the group itself.

use core::cmp::{max, min};
use core::fmt;

use crate::time::{Duration, Instant};

/// Where a subscription starts (docs/protocol.md §3.8 `Group Start`, `Opt(i)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Start {
    /// The group that is latest when serving begins (wire value 0).
    Latest,
    /// This absolute group (wire value `n + 1`).
    Group(u64),
}

impl From<Option<u64>> for Start {
    /// Maps a decoded `Opt(i)` (`None` = absent) to a start.
    fn from(opt: Option<u64>) -> Self {
        match opt {
            None => Start::Latest,
            Some(seq) => Start::Group(seq),
        }
    }
}

impl From<Start> for Option<u64> {
    fn from(start: Start) -> Self {
        match start {
            Start::Latest => None,
            Start::Group(seq) => Some(seq),
        }
    }
}

/// Where a subscription ends (docs/protocol.md §3.8 `Group End`, `Opt(i)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum End {
    /// Unbounded (wire value 0).
    Open,
    /// The last group to deliver, inclusive (wire value `n + 1`).
    Group(u64),
}

impl End {
    /// The last group this end admits: the group itself, or `u64::MAX` when open.
    #[inline]
    pub const fn cap(self) -> u64 {
        match self {
            End::Open => u64::MAX,
            End::Group(seq) => seq,
        }
    }
}

impl From<Option<u64>> for End {
    /// Maps a decoded `Opt(i)` (`None` = absent) to an end.
    fn from(opt: Option<u64>) -> Self {
        match opt {
            None => End::Open,
            Some(seq) => End::Group(seq),
        }
    }
}

impl From<End> for Option<u64> {
    fn from(end: End) -> Self {
        match end {
            End::Open => None,
            End::Group(seq) => Some(seq),
        }
    }
}

/// A subscriber's preferences from SUBSCRIBE or SUBSCRIBE_UPDATE (§3.8).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Request {
    /// First group wanted.
    pub start: Start,
    /// Last group wanted (a serving cap).
    pub end: End,
    /// Retired on the wire (write 0, ignore on read; §4.6), kept for re-serving.
    pub ordered: bool,
    /// Subscriber priority; higher is more important (§4.6).
    pub priority: u8,
    /// Max age of a non-latest group; zero means only the live edge (§4.7).
    pub max_latency: Duration,
}

impl Request {
    /// An unordered request, for tests: priority, max latency in ms, range.
    #[cfg(test)]
    pub(crate) fn test(priority: u8, ms: u64, start: Start, end: End) -> Request {
        Request {
            start,
            end,
            ordered: false,
            priority,
            max_latency: Duration::from_millis(ms),
        }
    }

    /// moq-dev's default subscription: the live edge onwards, priority 0,
    /// max latency 0.
    pub const LIVE: Request = Request {
        start: Start::Latest,
        end: End::Open,
        ordered: false,
        priority: 0,
        max_latency: Duration::ZERO,
    };

    /// The upstream request that covers both `self` and `other` (§4.5):
    /// highest priority and max latency; the lowest start, or latest if either
    /// asks for latest; the highest end, or open if either is open.
    ///
    /// The caller still clamps `max_latency` to the publisher's max age from
    /// TRACK_INFO.
    #[cfg(test)]
    pub fn aggregate(self, other: Request) -> Request {
        Request {
            start: match (self.start, other.start) {
                (Start::Group(a), Start::Group(b)) => Start::Group(min(a, b)),
                _ => Start::Latest,
            },
            end: match (self.end, other.end) {
                (End::Group(a), End::Group(b)) => End::Group(max(a, b)),
                _ => End::Open,
            },
            ordered: self.ordered || other.ordered,
            priority: max(self.priority, other.priority),
            max_latency: max(self.max_latency, other.max_latency),
        }
    }
}

impl Default for Request {
    fn default() -> Self {
        Request::LIVE
    }
}

/// Why a request or a window change was refused; the window is unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum WindowError {
    /// The result would need more than `N` disjoint ranges.
    TooManyRanges,
    /// The start (absolute, or the live edge for [`Start::Latest`]) is after the end.
    EndBeforeStart,
    /// Every requested group is older than the live edge and stale or gone for
    /// this max latency, and the end stops short of the live edge.
    ///
    /// A publisher answers with SUBSCRIBE_DROP for the range, then
    /// SUBSCRIBE_END (§3.8). Resolution does not move such a request to the
    /// live edge instead, because the subscriber capped its end below it and
    /// would get groups it did not ask for.
    Expired,
}

impl fmt::Display for WindowError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WindowError::TooManyRanges => "window needs too many disjoint ranges",
            WindowError::EndBeforeStart => "subscription ends before it starts",
            WindowError::Expired => "every requested group has expired",
        })
    }
}

impl core::error::Error for WindowError {}

/// An inclusive range of group sequence numbers, `first..=last`, never empty.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct GroupRange {
    first: u64,
    last: u64,
}

impl GroupRange {
    /// `first..=last`.
    ///
    /// # Errors
    ///
    /// [`WindowError::EndBeforeStart`] if `last < first`.
    #[inline]
    pub const fn new(first: u64, last: u64) -> Result<Self, WindowError> {
        if last < first {
            Err(WindowError::EndBeforeStart)
        } else {
            Ok(GroupRange { first, last })
        }
    }

    /// The single group `seq`.
    #[inline]
    pub const fn single(seq: u64) -> Self {
        GroupRange {
            first: seq,
            last: seq,
        }
    }

    /// Every group from `first` on (`first..=u64::MAX`).
    #[inline]
    pub const fn starting_at(first: u64) -> Self {
        GroupRange {
            first,
            last: u64::MAX,
        }
    }

    /// The lowest group in the range.
    #[inline]
    pub const fn first(self) -> u64 {
        self.first
    }

    /// The highest group in the range (inclusive).
    #[inline]
    pub const fn last(self) -> u64 {
        self.last
    }

    /// Whether `seq` is in the range.
    #[inline]
    pub const fn contains(self, seq: u64) -> bool {
        self.first <= seq && seq <= self.last
    }
}

impl fmt::Debug for GroupRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}..={}", self.first, self.last)
    }
}

/// What a window needs to know about its track: the live edge and group ages.
pub trait Timeline {
    /// The latest group, or `None` while the track has no group yet.
    fn latest(&self) -> Option<u64>;

    /// Time of the newest frame of the latest group (§4.7 measures age from here).
    fn newest(&self) -> Instant;

    /// For a group older than the latest: when its successor began, i.e. when
    /// it stopped being the newest. `None` if the group is not held and will
    /// not be, which makes it undeliverable (a track's groups still on their
    /// way from upstream count as held here, see `track::Ref::may_arrive`).
    ///
    /// Must be non-decreasing in `seq` over the groups held (see module docs).
    fn superseded_at(&self, seq: u64) -> Option<Instant>;
}

/// A timeline that keeps no history: only the latest group is deliverable.
///
/// This is all a live-only publisher knows, and enough for tests of the
/// window arithmetic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct LiveEdge {
    /// The latest group, or `None` while the track has none.
    pub latest: Option<u64>,
}

impl Timeline for LiveEdge {
    fn latest(&self) -> Option<u64> {
        self.latest
    }

    fn newest(&self) -> Instant {
        Instant::ZERO
    }

    fn superseded_at(&self, _seq: u64) -> Option<Instant> {
        None
    }
}

/// A timeline from a live edge plus a function giving each older group's
/// supersede time (see [`Timeline::superseded_at`]).
#[derive(Clone, Copy, Debug)]
pub struct History<F> {
    /// The latest group, or `None` while the track has none.
    pub latest: Option<u64>,
    /// Time of the newest frame of the latest group.
    pub newest: Instant,
    /// When an older group's successor began; `None` if the group is not held.
    pub superseded_at: F,
}

impl<F: Fn(u64) -> Option<Instant>> Timeline for History<F> {
    fn latest(&self) -> Option<u64> {
        self.latest
    }

    fn newest(&self) -> Instant {
        self.newest
    }

    fn superseded_at(&self, seq: u64) -> Option<Instant> {
        (self.superseded_at)(seq)
    }
}

// §4.7: whether group `seq` can still be delivered to a subscriber with
// `max_latency`, given the live edge `latest`.
#[inline]
fn is_fresh(t: &impl Timeline, max_latency: Duration, latest: u64, seq: u64) -> bool {
    if seq >= latest {
        // The latest group is never stale; later groups do not exist yet.
        return seq == latest;
    }
    if max_latency == Duration::ZERO {
        // "0 = only the live edge": skipped as soon as a newer group exists.
        return false;
    }
    t.superseded_at(seq)
        .is_some_and(|at| t.newest().saturating_duration_since(at) <= max_latency)
}

// The first fresh group in `lo..=hi` (`hi <= latest`), by binary search over a
// stale-then-fresh sequence. O(log(hi - lo)) timeline calls.
fn first_fresh(
    t: &impl Timeline,
    max_latency: Duration,
    latest: u64,
    lo: u64,
    hi: u64,
) -> Option<u64> {
    if !is_fresh(t, max_latency, latest, hi) {
        return None;
    }
    let (mut a, mut b) = (lo, hi);
    while a < b {
        let mid = a + (b - a) / 2;
        if is_fresh(t, max_latency, latest, mid) {
            b = mid;
        } else {
            a = mid + 1;
        }
    }
    Some(a)
}

/// The groups a subscriber still wants, resolved from a [`Request`]: a set of
/// at most `N` disjoint ranges plus the request's end as a serving cap.
///
/// See the module docs for the model. All operations are O(N), allocate
/// nothing, and leave the window unchanged when they fail.
#[derive(Clone, Copy)]
pub struct Window<const N: usize> {
    request: Request,
    // Inclusive cap from `request.end`.
    cap: u64,
    // Wanted groups: `ranges[..len]`, sorted, disjoint, non-adjacent.
    len: usize,
    ranges: [GroupRange; N],
}

impl<const N: usize> Window<N> {
    /// A window for `request` that wants no group yet; build it up with
    /// [`Window::insert`].
    pub const fn new(request: Request) -> Self {
        Window {
            request,
            cap: request.end.cap(),
            len: 0,
            ranges: [GroupRange::single(0); N],
        }
    }

    /// Resolves a SUBSCRIBE against the track's live edge.
    ///
    /// * [`Start::Latest`] starts at the latest group, or, while the track has
    ///   none, at whichever group comes first: every group that appears later is
    ///   new to this subscriber (§3.8), so the window wants them all.
    /// * An absolute start past the live edge (or on a track with no group) is
    ///   pending: the window waits for that group.
    /// * An absolute start below the live edge skips the groups that are stale
    ///   or not held for this max latency (§4.7, §4.8); the latest group is
    ///   always fresh.
    ///
    /// # Errors
    ///
    /// [`WindowError::EndBeforeStart`] if the absolute start, or for
    /// [`Start::Latest`] the live edge, is past the end;
    /// [`WindowError::Expired`] if the end is below the live edge and every
    /// group up to it is stale; [`WindowError::TooManyRanges`] if `N == 0`.
    pub fn resolve(request: Request, timeline: &impl Timeline) -> Result<Self, WindowError> {
        let end = request.end.cap();
        let latest = timeline.latest();
        let start = match (request.start, latest) {
            (Start::Group(seq), _) => seq,
            (Start::Latest, Some(latest)) => latest,
            (Start::Latest, None) => 0,
        };
        if start > end {
            return Err(WindowError::EndBeforeStart);
        }
        let start = match latest {
            Some(latest) if start < latest => {
                // Candidates older than the live edge: `start..=min(end, latest - 1)`.
                let top = min(end, latest - 1);
                match first_fresh(timeline, request.max_latency, latest, start, top) {
                    Some(seq) => seq,
                    None if end >= latest => latest,
                    None => return Err(WindowError::Expired),
                }
            }
            _ => start,
        };
        let mut window = Window::new(request);
        window.insert(GroupRange::starting_at(start))?;
        trace!("window resolved: start {} cap {}", start, end);
        Ok(window)
    }

    /// Applies a SUBSCRIBE_UPDATE, which replaces every preference (§3.8).
    ///
    /// * The end always becomes the new cap, up or down. Groups already removed
    ///   from the window stay removed when the cap rises again.
    /// * [`Start::Latest`] keeps the start in force, as moq-dev does (it only
    ///   moves its cursor for an explicit start).
    /// * An absolute start moves the start either way: the window is resolved
    ///   afresh like a SUBSCRIBE, forgetting what was removed. Remove the
    ///   groups already delivered again if they must not be resent.
    ///
    /// # Errors
    ///
    /// With an absolute start, as for [`Window::resolve`]; the window is then
    /// unchanged. With [`Start::Latest`], never.
    pub fn update(
        &mut self,
        request: Request,
        timeline: &impl Timeline,
    ) -> Result<(), WindowError> {
        match request.start {
            Start::Group(_) => *self = Window::resolve(request, timeline)?,
            Start::Latest => {
                self.request = request;
                self.cap = request.end.cap();
            }
        }
        Ok(())
    }

    /// The request in force (the last SUBSCRIBE or SUBSCRIBE_UPDATE).
    #[inline]
    pub const fn request(&self) -> &Request {
        &self.request
    }

    /// The serving cap: the last group the request admits (`u64::MAX` if open).
    #[inline]
    #[cfg(test)]
    pub const fn cap(&self) -> u64 {
        self.cap
    }

    /// The wanted ranges within the cap, lowest first.
    pub fn ranges(&self) -> impl Iterator<Item = GroupRange> + '_ {
        let cap = self.cap;
        self.set()
            .iter()
            .take_while(move |r| r.first <= cap)
            .map(move |r| GroupRange {
                first: r.first,
                last: min(r.last, cap),
            })
    }

    /// Whether no group is wanted within the cap (everything delivered, or
    /// paused below the start).
    #[inline]
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.lowest().is_none()
    }

    /// Whether group `seq` is wanted.
    #[inline]
    pub fn contains(&self, seq: u64) -> bool {
        seq <= self.cap && self.set().iter().any(|r| r.contains(seq))
    }

    /// The lowest wanted group.
    #[inline]
    pub fn lowest(&self) -> Option<u64> {
        self.set()
            .first()
            .map(|r| r.first)
            .filter(|&seq| seq <= self.cap)
    }

    /// The highest wanted group (`u64::MAX` while the end is open and the top
    /// of the window is undelivered).
    #[inline]
    #[cfg(test)]
    pub fn highest(&self) -> Option<u64> {
        self.ranges().last().map(|r| r.last)
    }

    /// The first group to deliver now: the lowest wanted group that exists and
    /// is still fresh for this max latency, or `None` while the window waits
    /// for a later group (or the track has none).
    ///
    /// A publisher names this group in SUBSCRIBE_OK (§3.8) and may then
    /// [`Window::remove_through`] everything below it, so a straggler older
    /// than what it announced is never served.
    pub fn first(&self, timeline: &impl Timeline) -> Option<u64> {
        let latest = timeline.latest()?;
        for r in self.ranges() {
            if r.first > latest {
                return None;
            }
            let top = min(r.last, latest);
            if let Some(seq) = first_fresh(timeline, self.request.max_latency, latest, r.first, top)
            {
                return Some(seq);
            }
        }
        None
    }

    /// Whether wanted group `seq` is past saving: older than the live edge and
    /// stale (or no longer held) for this max latency (§4.7: a publisher resets
    /// such a group's stream with OLD, or skips it).
    #[inline]
    pub fn is_expired(&self, seq: u64, timeline: &impl Timeline) -> bool {
        match timeline.latest() {
            Some(latest) => {
                seq < latest && !is_fresh(timeline, self.request.max_latency, latest, seq)
            }
            None => false,
        }
    }

    /// The next wanted group after `seq`, if any (none after `u64::MAX`).
    #[inline]
    #[cfg(test)]
    pub fn next_after(&self, seq: u64) -> Option<u64> {
        let next = seq.checked_add(1)?;
        let r = self.set().iter().find(|r| r.last >= next)?;
        Some(max(r.first, next)).filter(|&seq| seq <= self.cap)
    }

    /// Whether nothing after `latest_delivered` is wanted: with a closed end,
    /// the subscription is complete once the cap is delivered (until an update
    /// raises it, §3.8); with an open end, only after `u64::MAX`.
    ///
    /// With newest-first delivery, groups below `latest_delivered` may still be
    /// wanted; [`Window::is_empty`] tells whether everything was.
    #[inline]
    #[cfg(test)]
    pub fn is_done(&self, latest_delivered: u64) -> bool {
        self.next_after(latest_delivered).is_none()
    }

    /// Adds `range` to the wanted set, merging it with overlapping and adjacent
    /// ranges (`1..=3` plus `4..=6` is `1..=6`). The cap still applies.
    ///
    /// # Errors
    ///
    /// [`WindowError::TooManyRanges`] if the set would need more than `N`
    /// disjoint ranges; the window is unchanged.
    pub fn insert(&mut self, range: GroupRange) -> Result<(), WindowError> {
        let len = self.len;
        let set = self.set();
        // Ranges `lo..hi` overlap or touch `range`; those before `lo` end more
        // than one below it, those from `hi` start more than one above it.
        // Saturating `+ 1` reads `u64::MAX + 1` as "beyond every group".
        let lo = set
            .iter()
            .position(|r| r.last.saturating_add(1) >= range.first)
            .unwrap_or(len);
        let hi = set
            .get(lo..)
            .and_then(|rest| {
                rest.iter()
                    .position(|r| r.first > range.last.saturating_add(1))
            })
            .map_or(len, |p| lo + p);
        let ranges = self.ranges.as_mut_slice();
        if lo == hi {
            if len >= N {
                return Err(WindowError::TooManyRanges);
            }
            ranges.copy_within(lo..len, lo + 1);
            ranges[lo] = range;
            self.len = len + 1;
        } else {
            let merged = GroupRange {
                first: min(range.first, ranges[lo].first),
                last: max(range.last, ranges[hi - 1].last),
            };
            ranges[lo] = merged;
            ranges.copy_within(hi..len, lo + 1);
            self.len = len - (hi - lo - 1);
        }
        Ok(())
    }

    /// Removes `range` from the wanted set (delivered, or dropped with
    /// SUBSCRIBE_DROP).
    ///
    /// # Errors
    ///
    /// [`WindowError::TooManyRanges`] if `range` splits a range in two and the
    /// window already holds `N`; the window is unchanged.
    pub fn remove(&mut self, range: GroupRange) -> Result<(), WindowError> {
        let len = self.len;
        let inner = self
            .set()
            .iter()
            .position(|r| r.first < range.first && r.last > range.last);
        if let Some(i) = inner {
            // `range` lies strictly inside ranges[i]: split it. Both bounds are
            // in range: `range.first > r.first >= 0` and `range.last < r.last <= MAX`.
            if len >= N {
                return Err(WindowError::TooManyRanges);
            }
            let ranges = self.ranges.as_mut_slice();
            let r = ranges[i];
            ranges.copy_within(i + 1..len, i + 2);
            ranges[i] = GroupRange {
                first: r.first,
                last: range.first - 1,
            };
            ranges[i + 1] = GroupRange {
                first: range.last + 1,
                last: r.last,
            };
            self.len = len + 1;
        } else {
            self.cut(range);
        }
        Ok(())
    }

    /// Removes every group up to and including `seq` (all delivered or given
    /// up on). Never fails: trimming from below cannot split a range.
    #[inline]
    pub fn remove_through(&mut self, seq: u64) {
        self.cut(GroupRange {
            first: 0,
            last: seq,
        });
    }

    // Removes `range` where it splits no range (the caller checked).
    fn cut(&mut self, range: GroupRange) {
        let len = self.len;
        let mut kept = 0;
        for i in 0..len {
            let r = self.ranges[i];
            let trimmed = if r.last < range.first || r.first > range.last {
                Some(r)
            } else if r.first < range.first {
                // Overlaps the cut's low end: keep the part below it.
                Some(GroupRange {
                    first: r.first,
                    last: range.first - 1,
                })
            } else if r.last > range.last {
                // Overlaps the cut's high end: keep the part above it.
                Some(GroupRange {
                    first: range.last + 1,
                    last: r.last,
                })
            } else {
                None
            };
            if let Some(r) = trimmed {
                self.ranges[kept] = r;
                kept += 1;
            }
        }
        self.len = kept;
    }

    // The wanted set, ignoring the cap.
    #[inline]
    fn set(&self) -> &[GroupRange] {
        self.ranges.get(..self.len).unwrap_or_default()
    }
}

impl<const N: usize> PartialEq for Window<N> {
    fn eq(&self, other: &Self) -> bool {
        self.request == other.request && self.cap == other.cap && self.set() == other.set()
    }
}

impl<const N: usize> Eq for Window<N> {}

impl<const N: usize> fmt::Debug for Window<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Window")
            .field("set", &self.set())
            .field("cap", &self.cap)
            .field("request", &self.request)
            .finish()
    }
}

#[cfg(feature = "defmt")]
impl<const N: usize> defmt::Format for Window<N> {
    fn format(&self, f: defmt::Formatter<'_>) {
        defmt::write!(f, "Window set={} cap={}", self.set(), self.cap)
    }
}

#[cfg(test)]
mod tests {
    extern crate std;

    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;
    use std::string::ToString;
    use std::vec::Vec;

    const MAX: u64 = u64::MAX;

    fn r(first: u64, last: u64) -> GroupRange {
        GroupRange::new(first, last).unwrap()
    }

    fn req(start: Start, end: End) -> Request {
        Request {
            start,
            end,
            ..Request::LIVE
        }
    }

    fn live(latest: u64) -> LiveEdge {
        LiveEdge {
            latest: Some(latest),
        }
    }

    fn set_of<const N: usize>(w: &Window<N>) -> Vec<(u64, u64)> {
        w.ranges().map(|r| (r.first(), r.last())).collect()
    }

    fn raw_of<const N: usize>(w: &Window<N>) -> Vec<(u64, u64)> {
        w.set().iter().map(|r| (r.first(), r.last())).collect()
    }

    // A track whose group `g` was superseded at `g + 1` seconds, holding
    // groups `held..=latest`, with the newest frame at `newest_ms`.
    fn history(latest: u64, held: u64, newest_ms: u64) -> History<impl Fn(u64) -> Option<Instant>> {
        History {
            latest: Some(latest),
            newest: Instant::from_millis(newest_ms),
            superseded_at: move |g: u64| (g >= held).then(|| Instant::from_millis((g + 1) * 1000)),
        }
    }

    fn budget(start: Start, end: End, max_latency: Duration) -> Request {
        Request {
            start,
            end,
            max_latency,
            ..Request::LIVE
        }
    }

    // ---- resolution: start ----

    #[test]
    fn latest_starts_at_the_live_edge() {
        let w = Window::<2>::resolve(Request::LIVE, &live(10)).unwrap();
        assert_eq!(set_of(&w), [(10, MAX)]);
        assert_eq!(w.first(&live(10)), Some(10));
        assert!(!w.contains(9));
    }

    #[test]
    fn latest_with_no_group_wants_whatever_comes_first() {
        let none = LiveEdge { latest: None };
        let w = Window::<2>::resolve(Request::LIVE, &none).unwrap();
        assert_eq!(set_of(&w), [(0, MAX)]);
        assert_eq!(w.first(&none), None, "nothing to send yet");
        // The first group to appear is the first delivered, whatever its number.
        assert_eq!(w.first(&live(42)), Some(42));
    }

    #[test]
    fn absolute_start_past_the_edge_is_pending() {
        let w = Window::<2>::resolve(req(Start::Group(20), End::Open), &live(10)).unwrap();
        assert_eq!(set_of(&w), [(20, MAX)]);
        assert_eq!(w.first(&live(10)), None);
        assert_eq!(w.first(&live(19)), None);
        assert_eq!(w.first(&live(20)), Some(20));
        assert_eq!(
            w.first(&live(25)),
            Some(25),
            "max latency 0: older groups are skipped"
        );
        let none = LiveEdge { latest: None };
        let w = Window::<2>::resolve(req(Start::Group(5), End::Group(9)), &none).unwrap();
        assert_eq!(set_of(&w), [(5, 9)]);
        assert_eq!(w.first(&none), None);
    }

    #[test]
    fn end_before_start_is_refused() {
        let e = Window::<2>::resolve(req(Start::Group(5), End::Group(4)), &live(0));
        assert_eq!(e, Err(WindowError::EndBeforeStart));
        // Latest resolves to the edge, which is past the end.
        let e = Window::<2>::resolve(req(Start::Latest, End::Group(5)), &live(10));
        assert_eq!(e, Err(WindowError::EndBeforeStart));
        // A single group is fine.
        let w = Window::<2>::resolve(req(Start::Group(5), End::Group(5)), &live(0)).unwrap();
        assert_eq!(set_of(&w), [(5, 5)]);
    }

    #[test]
    fn zero_capacity_window_cannot_resolve() {
        assert_eq!(
            Window::<0>::resolve(Request::LIVE, &live(1)),
            Err(WindowError::TooManyRanges)
        );
    }

    // ---- resolution: expiry (§4.7) ----

    #[test]
    fn zero_latency_means_only_the_live_edge() {
        let t = history(10, 0, 10_500);
        let w = Window::<2>::resolve(req(Start::Group(2), End::Open), &t).unwrap();
        assert_eq!(set_of(&w), [(10, MAX)]);
        assert!(w.is_expired(9, &t));
        assert!(!w.is_expired(10, &t));
    }

    #[test]
    fn older_start_skips_stale_groups() {
        // Group g is fresh iff 10.5 s - (g + 1) s <= 2 s, i.e. g >= 8.
        let t = history(10, 0, 10_500);
        let two_s = Duration::from_secs(2);
        let w = Window::<2>::resolve(budget(Start::Group(2), End::Open, two_s), &t).unwrap();
        assert_eq!(set_of(&w), [(8, MAX)]);
        assert_eq!(w.first(&t), Some(8));
        assert!(w.is_expired(7, &t));
        assert!(!w.is_expired(8, &t));
        // A fresh start is kept.
        let w = Window::<2>::resolve(budget(Start::Group(9), End::Open, two_s), &t).unwrap();
        assert_eq!(set_of(&w), [(9, MAX)]);
        // End inside the fresh part.
        let w = Window::<2>::resolve(budget(Start::Group(2), End::Group(9), two_s), &t).unwrap();
        assert_eq!(set_of(&w), [(8, 9)]);
    }

    #[test]
    fn unbounded_latency_reaches_back_to_what_is_held() {
        let t = history(10, 4, 10_500);
        let w =
            Window::<2>::resolve(budget(Start::Group(0), End::Open, Duration::MAX), &t).unwrap();
        assert_eq!(set_of(&w), [(4, MAX)], "groups 0..4 are no longer held");
    }

    #[test]
    fn a_fully_expired_range_is_a_typed_outcome() {
        let t = history(10, 0, 10_500);
        let two_s = Duration::from_secs(2);
        let e = Window::<2>::resolve(budget(Start::Group(2), End::Group(5), two_s), &t);
        assert_eq!(e, Err(WindowError::Expired));
        let e = Window::<2>::resolve(req(Start::Group(2), End::Group(9)), &t);
        assert_eq!(e, Err(WindowError::Expired), "max latency 0");
        // Ending at the live edge is never expired: the latest group is fresh.
        let w = Window::<2>::resolve(req(Start::Group(2), End::Group(10)), &t).unwrap();
        assert_eq!(set_of(&w), [(10, 10)]);
    }

    #[test]
    fn huge_ranges_resolve_in_logarithmic_time() {
        use core::cell::Cell;
        let calls = Cell::new(0u32);
        let t = History {
            latest: Some(MAX - 1),
            newest: Instant::from_micros(MAX - 1),
            superseded_at: |g: u64| {
                calls.set(calls.get() + 1);
                Some(Instant::from_micros(g))
            },
        };
        let w = Window::<1>::resolve(
            budget(Start::Group(0), End::Open, Duration::from_micros(1000)),
            &t,
        )
        .unwrap();
        // Fresh iff (MAX - 1) - g <= 1000.
        assert_eq!(set_of(&w), [(MAX - 1001, MAX)]);
        assert!(calls.get() <= 70, "{} calls", calls.get());
    }

    // ---- u64::MAX ----

    #[test]
    fn group_u64_max_never_overflows() {
        let w = Window::<2>::resolve(req(Start::Group(MAX), End::Group(MAX)), &live(MAX)).unwrap();
        assert_eq!(set_of(&w), [(MAX, MAX)]);
        assert!(w.contains(MAX));
        assert_eq!(w.next_after(MAX - 1), Some(MAX));
        assert_eq!(w.next_after(MAX), None);
        assert!(w.is_done(MAX));
        assert!(!w.is_done(MAX - 1));
        assert_eq!(w.first(&live(MAX)), Some(MAX));
        assert_eq!(w.highest(), Some(MAX));

        let w = Window::<2>::resolve(Request::LIVE, &live(MAX)).unwrap();
        assert_eq!(set_of(&w), [(MAX, MAX)]);

        let mut w = Window::<2>::new(Request::LIVE);
        w.insert(r(0, MAX - 2)).unwrap();
        w.insert(r(MAX, MAX)).unwrap();
        assert_eq!(set_of(&w), [(0, MAX - 2), (MAX, MAX)]);
        w.insert(r(MAX - 1, MAX - 1)).unwrap();
        assert_eq!(set_of(&w), [(0, MAX)]);
        w.remove(r(MAX, MAX)).unwrap();
        assert_eq!(set_of(&w), [(0, MAX - 1)]);
        w.remove(r(0, 0)).unwrap();
        assert_eq!(set_of(&w), [(1, MAX - 1)]);
        w.remove_through(MAX);
        assert!(w.is_empty());
    }

    #[test]
    fn open_end_and_end_at_u64_max_are_the_same_set() {
        let a = Window::<1>::resolve(req(Start::Group(3), End::Open), &live(3)).unwrap();
        let b = Window::<1>::resolve(req(Start::Group(3), End::Group(MAX)), &live(3)).unwrap();
        assert_eq!(set_of(&a), set_of(&b));
        assert!(!a.is_done(1 << 62));
        assert_eq!(a.cap(), MAX);
    }

    // ---- set operations ----

    #[test]
    fn insert_merges_adjacent_and_overlapping() {
        let mut w = Window::<4>::new(Request::LIVE);
        w.insert(r(1, 3)).unwrap();
        w.insert(r(4, 6)).unwrap();
        assert_eq!(set_of(&w), [(1, 6)]);
        w.insert(r(10, 12)).unwrap();
        w.insert(r(20, 22)).unwrap();
        w.insert(r(8, 8)).unwrap();
        assert_eq!(set_of(&w), [(1, 6), (8, 8), (10, 12), (20, 22)]);
        assert_eq!(w.insert(r(30, 31)), Err(WindowError::TooManyRanges));
        assert_eq!(
            set_of(&w),
            [(1, 6), (8, 8), (10, 12), (20, 22)],
            "unchanged"
        );
        w.insert(r(7, 21)).unwrap();
        assert_eq!(set_of(&w), [(1, 22)]);
        w.insert(r(0, 0)).unwrap();
        assert_eq!(set_of(&w), [(0, 22)]);
    }

    #[test]
    fn newest_first_delivery_leaves_holes() {
        let mut w = Window::<2>::resolve(req(Start::Group(5), End::Open), &live(5)).unwrap();
        w.remove(GroupRange::single(7)).unwrap();
        assert_eq!(set_of(&w), [(5, 6), (8, MAX)]);
        assert_eq!(w.next_after(5), Some(6));
        assert_eq!(w.next_after(6), Some(8));
        // A second hole needs a third range.
        assert_eq!(
            w.remove(GroupRange::single(9)),
            Err(WindowError::TooManyRanges)
        );
        assert_eq!(set_of(&w), [(5, 6), (8, MAX)]);
        // Trimming an edge needs no new range.
        w.remove(GroupRange::single(8)).unwrap();
        assert_eq!(set_of(&w), [(5, 6), (9, MAX)]);
        w.remove(r(6, 9)).unwrap();
        assert_eq!(set_of(&w), [(5, 5), (10, MAX)]);
        w.remove_through(5);
        assert_eq!(set_of(&w), [(10, MAX)]);
        assert_eq!(w.lowest(), Some(10));
    }

    #[test]
    fn is_done_for_a_closed_end() {
        let w = Window::<1>::resolve(req(Start::Group(5), End::Group(7)), &live(5)).unwrap();
        assert!(!w.is_done(5));
        assert!(!w.is_done(6));
        assert!(w.is_done(7));
        assert!(w.is_done(100));
        assert_eq!(w.highest(), Some(7));
        let open = Window::<1>::resolve(req(Start::Group(5), End::Open), &live(5)).unwrap();
        assert!(!open.is_done(1_000_000));
    }

    // ---- updates ----

    #[test]
    fn update_with_latest_keeps_the_start_and_moves_the_cap() {
        let mut w = Window::<2>::resolve(req(Start::Group(5), End::Group(9)), &live(5)).unwrap();
        w.remove_through(6);
        // Lower the cap below everything wanted: paused, not an error.
        w.update(req(Start::Latest, End::Group(4)), &live(8))
            .unwrap();
        assert!(w.is_empty());
        assert!(!w.contains(7));
        // Raise it again: delivered groups 5 and 6 do not come back.
        w.update(
            Request {
                priority: 9,
                ..req(Start::Latest, End::Open)
            },
            &live(8),
        )
        .unwrap();
        assert_eq!(set_of(&w), [(7, MAX)]);
        assert_eq!(w.request().priority, 9);
    }

    #[test]
    fn update_with_an_absolute_start_moves_either_way() {
        let t = live(10);
        let mut w = Window::<2>::resolve(req(Start::Group(20), End::Open), &t).unwrap();
        w.update(req(Start::Group(30), End::Group(40)), &t).unwrap();
        assert_eq!(set_of(&w), [(30, 40)]);
        w.update(req(Start::Group(12), End::Open), &t).unwrap();
        assert_eq!(set_of(&w), [(12, MAX)]);
        let before = w;
        assert_eq!(
            w.update(req(Start::Group(12), End::Group(11)), &t),
            Err(WindowError::EndBeforeStart)
        );
        assert_eq!(w, before, "unchanged on error");
    }

    // ---- aggregation (§4.5) and wire mapping ----

    #[test]
    fn aggregate_covers_both_requests() {
        let a = Request {
            start: Start::Group(5),
            end: End::Group(10),
            ordered: false,
            priority: 3,
            max_latency: Duration::from_millis(100),
        };
        let b = Request {
            start: Start::Group(2),
            end: End::Group(7),
            priority: 9,
            ..Request::LIVE
        };
        let up = a.aggregate(b);
        assert_eq!(up.start, Start::Group(2));
        assert_eq!(up.end, End::Group(10));
        assert_eq!(up.priority, 9);
        assert_eq!(up.max_latency, Duration::from_millis(100));
        let up = a.aggregate(Request::LIVE);
        assert_eq!((up.start, up.end), (Start::Latest, End::Open));
    }

    #[test]
    fn wire_options_map_both_ways() {
        assert_eq!(Start::from(None), Start::Latest);
        assert_eq!(Start::from(Some(0)), Start::Group(0));
        assert_eq!(Option::<u64>::from(Start::Group(7)), Some(7));
        assert_eq!(End::from(None), End::Open);
        assert_eq!(Option::<u64>::from(End::Group(MAX)), Some(MAX));
        assert_eq!(End::Open.cap(), MAX);
        assert_eq!(
            WindowError::Expired.to_string(),
            "every requested group has expired"
        );
        assert_eq!(std::format!("{:?}", r(1, 2)), "1..=2");
    }

    // ---- properties ----

    #[derive(Clone, Debug)]
    enum Op {
        Insert(u64, u64),
        Remove(u64, u64),
        RemoveThrough(u64),
        Cap(Option<u64>),
    }

    const SPAN: u64 = 48;

    fn op() -> impl Strategy<Value = Op> {
        let pair = (0..SPAN, 0..SPAN).prop_map(|(a, b)| (min(a, b), max(a, b)));
        prop_oneof![
            4 => pair.clone().prop_map(|(a, b)| Op::Insert(a, b)),
            2 => pair.prop_map(|(a, b)| Op::Remove(a, b)),
            1 => (0..SPAN).prop_map(Op::RemoveThrough),
            1 => proptest::option::of(0..SPAN).prop_map(Op::Cap),
        ]
    }

    fn check_invariants<const N: usize>(w: &Window<N>) -> Result<(), TestCaseError> {
        let set = w.set();
        prop_assert!(set.len() <= N);
        for r in set {
            prop_assert!(r.first <= r.last);
        }
        for pair in set.windows(2) {
            // Sorted, disjoint and non-adjacent.
            prop_assert!(pair[0].last < pair[1].first && pair[1].first - pair[0].last >= 2);
        }
        Ok(())
    }

    // Runs `ops` on values offset by `base` against a BTreeSet model.
    fn run_model(base: u64, ops: Vec<Op>) -> Result<(), TestCaseError> {
        let mut w = Window::<4>::new(Request::LIVE);
        let mut model = BTreeSet::new();
        let mut cap = MAX;
        let at = |v: u64| base + v;
        for op in ops {
            let before = w;
            let result = match op {
                Op::Insert(a, b) => w
                    .insert(r(at(a), at(b)))
                    .map(|()| model.extend(at(a)..=at(b))),
                Op::Remove(a, b) => w.remove(r(at(a), at(b))).map(|()| {
                    for v in at(a)..=at(b) {
                        model.remove(&v);
                    }
                }),
                Op::RemoveThrough(a) => {
                    w.remove_through(at(a));
                    model.retain(|&v| v > at(a));
                    Ok(())
                }
                Op::Cap(c) => {
                    let end = c.map_or(End::Open, |c| End::Group(at(c)));
                    cap = end.cap();
                    w.update(req(Start::Latest, end), &LiveEdge::default())
                }
            };
            if let Err(e) = result {
                prop_assert_eq!(e, WindowError::TooManyRanges);
                prop_assert_eq!(raw_of(&w), raw_of(&before), "unchanged on error");
            }
            check_invariants(&w)?;
            let wanted: BTreeSet<u64> = model.iter().copied().filter(|&v| v <= cap).collect();
            for v in 0..SPAN {
                prop_assert_eq!(
                    w.contains(at(v)),
                    wanted.contains(&at(v)),
                    "contains {}",
                    at(v)
                );
                let next = wanted.range(at(v).saturating_add(1)..).next().copied();
                let next = if at(v) == MAX { None } else { next };
                prop_assert_eq!(w.next_after(at(v)), next, "next_after {}", at(v));
            }
            prop_assert_eq!(w.lowest(), wanted.first().copied());
            prop_assert_eq!(w.highest(), wanted.last().copied());
            prop_assert_eq!(w.is_empty(), wanted.is_empty());
        }
        Ok(())
    }

    fn any_start() -> impl Strategy<Value = Start> {
        prop_oneof![
            Just(Start::Latest),
            any::<u64>().prop_map(Start::Group),
            (MAX - 4..=MAX).prop_map(Start::Group),
            (0..8u64).prop_map(Start::Group),
        ]
    }

    fn any_end() -> impl Strategy<Value = End> {
        prop_oneof![
            Just(End::Open),
            any::<u64>().prop_map(End::Group),
            (MAX - 4..=MAX).prop_map(End::Group),
            (0..8u64).prop_map(End::Group),
        ]
    }

    fn any_latency() -> impl Strategy<Value = Duration> {
        prop_oneof![
            Just(Duration::ZERO),
            Just(Duration::MAX),
            any::<u64>().prop_map(Duration::from_micros)
        ]
    }

    fn any_latest() -> impl Strategy<Value = Option<u64>> {
        prop_oneof![
            Just(None),
            any::<u64>().prop_map(Some),
            (MAX - 4..=MAX).prop_map(Some),
            (0..8u64).prop_map(Some)
        ]
    }

    proptest! {
        #[test]
        fn set_matches_model_near_zero(ops in proptest::collection::vec(op(), 0..40)) {
            run_model(0, ops)?;
        }

        #[test]
        fn set_matches_model_near_u64_max(ops in proptest::collection::vec(op(), 0..40)) {
            run_model(MAX - (SPAN - 1), ops)?;
        }

        #[test]
        fn resolution_never_panics(
            start in any_start(),
            end in any_end(),
            max_latency in any_latency(),
            latest in any_latest(),
            newest in any::<u64>(),
            step in 0..1_000_000u64,
            held in any::<u64>(),
            update in (any_start(), any_end()),
        ) {
            let request = Request { start, end, ordered: false, priority: 1, max_latency };
            let t = History {
                latest,
                newest: Instant::from_micros(newest),
                superseded_at: |g: u64| (g >= held).then(|| Instant::from_micros(g.saturating_mul(step))),
            };
            match Window::<2>::resolve(request, &t) {
                Ok(mut w) => {
                    check_invariants(&w)?;
                    let lowest = w.lowest();
                    prop_assert!(lowest.is_some());
                    prop_assert!(lowest.unwrap() <= end.cap());
                    if let Start::Group(s) = start {
                        prop_assert!(lowest.unwrap() >= s);
                    }
                    if let (Some(l), Some(low)) = (latest, lowest) && low <= l {
                        // Something is deliverable right now.
                        prop_assert!(w.first(&t).is_some());
                    }
                    let _ = w.next_after(newest);
                    let _ = w.is_expired(newest, &t);
                    let (s, e) = update;
                    let before = w;
                    if w.update(req(s, e), &t).is_err() {
                        prop_assert_eq!(w, before);
                    }
                    check_invariants(&w)?;
                }
                Err(WindowError::EndBeforeStart) => {
                    let s = match start { Start::Group(s) => s, Start::Latest => latest.unwrap_or(0) };
                    prop_assert!(s > end.cap());
                }
                Err(WindowError::Expired) => {
                    prop_assert!(latest.is_some_and(|l| end.cap() < l));
                }
                Err(WindowError::TooManyRanges) => prop_assert!(false, "one range always fits"),
            }
        }
    }
}
