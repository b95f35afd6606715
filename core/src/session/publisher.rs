//! Publisher side: serving the peer's announce requests and subscriptions from
//! local media, and sending group streams (docs/protocol.md §3.6–3.9, §4).
//!
//! A subscription the peer holds on one of our tracks is a [`Served`] entry: the
//! track, the subscriber's [`Window`] of wanted groups, and whether
//! SUBSCRIBE_START / SUBSCRIBE_END went out. Each time the session is driven it
//! looks at the track's live edge and, newest group first (§4.6), opens one uni
//! Group stream per wanted group: a GROUP header with the subscription's id and
//! the group's sequence, then the group's stored bytes verbatim, then FIN. A
//! group that goes stale while its stream is open is reset with OLD (§4.7).
//! Once the track has finished and every group in range was delivered or given
//! up, SUBSCRIBE_END (exclusive) goes out, then FIN.
//!
//! A wanted group that was trimmed (its first bytes already released, see
//! [`crate::model::group`]) cannot be sent from byte 0: it is skipped, no stream
//! is opened for it, and delivery goes on with the next wanted group.
//!
//! Group data is written by [`flush_groups`](Session::flush_groups) in
//! priority order within each stream's QMux credit; reading the group there is
//! what advances its furthest-read position; after its writes each stream
//! reports its remaining credit to the group ([`group::Consumer::pace`]), which
//! holds a self-pacing producer within one credit window of its fastest reader.

use core::cmp::{Reverse, min};

use super::control::{AnnounceState, Kind, Step, SubState, decode_within, join, rooted, rx_of};
use super::{Gather, Session};
use crate::model::group::{self, Next, ReadError};
use crate::model::hops::HopList;
use crate::model::path::{Path, PathBuf};
use crate::model::{broadcast, origin, track};
use crate::transport::Transport;

/// A copy of a broadcast path (or of its part under a prefix).
type BroadcastPath = PathBuf<{ broadcast::MAX_PATH_LEN }>;
use crate::pool::Slice;
use crate::time::{Duration, Instant};
use crate::window::{self, GroupRange, Request, Timeline, Window, WindowError};
use crate::wire::Writer;
use crate::wire::lite::{
    Announce, AnnounceOk, AnnounceRequest, AnnounceStatus, Group, Hops, SessionCode, StreamCode,
    Subscribe, SubscribeResponse, SubscribeUpdate, UniStreamType, write_message,
};
use crate::wire::qmux::{Dir, StreamId};

/// Disjoint ranges a served subscription's window may hold (newest-first
/// delivery leaves holes; see [`crate::window`]).
pub const WINDOW_RANGES: usize = 4;

/// Longest GROUP header with its stream type: type (1) + length (1) + two 8-byte varints.
const GROUP_HEADER: usize = 18;

/// A subscription the peer holds on one of our tracks.
pub(crate) struct Served<'a, 'p> {
    /// The peer's Subscribe ID (used in our GROUP headers).
    pub(super) id: u64,
    /// The control slot of its Subscribe stream.
    pub(super) slot: usize,
    pub(super) source: track::Ref<'a, 'p>,
    pub(super) window: Window<WINDOW_RANGES>,
    pub(super) started: bool,
    /// A SUBSCRIBE for the latest group that came while the track held none:
    /// the window wants nothing until the first group is held, then starts at
    /// the newest held (an upstream with several groups sends the newest first,
    /// and the older ones are not the live edge this subscriber asked for).
    pub(super) latest_pending: bool,
}

/// The `served` index of a group stream that answers a FETCH: no subscription.
const NOT_SERVED: usize = usize::MAX;

/// A group stream that answers a FETCH (docs/protocol.md §3.10) on the peer's
/// Fetch stream rather than a subscription on a stream of ours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Fetched {
    /// The control slot of the Fetch stream.
    pub(super) slot: usize,
    /// The peer's priority.
    pub(super) priority: u8,
}

/// One group stream we send.
pub(crate) struct GroupOut<'a, 'p> {
    pub(super) id: StreamId,
    /// Index of the served subscription ([`NOT_SERVED`] for a fetch).
    pub(super) served: usize,
    /// The FETCH it answers, if it answers one.
    pub(super) fetch: Option<Fetched>,
    pub(super) seq: u64,
    consumer: group::Consumer<'a, 'p>,
    header: [u8; GROUP_HEADER],
    header_len: usize,
    header_sent: usize,
}

/// docs/protocol.md §4.7, for a group whose stream is already open: stale once the
/// point where its successor began is more than `max_age` behind the newest frame.
fn is_stale(source: track::Ref<'_, '_>, max_age: Duration, seq: u64) -> bool {
    match source.latest() {
        Some(latest) if seq < latest => match source.superseded_at(seq) {
            Some(at) => source.newest().saturating_duration_since(at) > max_age,
            None => true,
        },
        _ => false,
    }
}

/// The exclusive end of a finished track (docs/protocol.md §3.8: latest + 1, 0 without groups).
fn track_end(source: track::Ref<'_, '_>) -> Option<u64> {
    match source.status() {
        track::Status::Finished => Some(source.latest().map_or(0, |l| l.saturating_add(1))),
        _ => None,
    }
}

/// The highest wanted group at or below `latest`.
fn highest_wanted(window: &Window<WINDOW_RANGES>, latest: u64) -> Option<u64> {
    window
        .ranges()
        .take_while(|r| r.first() <= latest)
        .last()
        .map(|r| min(r.last(), latest))
}

/// Sorts `v` by `key` in place, no allocation: one pass when it is in order
/// already (each key computed once), else a heapsort (O(n log n) keys). A
/// few hundred bytes of code, where core's `sort_unstable` brings several KiB
/// into a firmware image.
fn sort_by_key<T, K: Ord>(v: &mut [T], mut key: impl FnMut(&T) -> K) {
    let mut sorted = true;
    let mut prev: Option<K> = None;
    for x in v.iter() {
        let k = key(x);
        if prev.as_ref().is_some_and(|p| *p > k) {
            sorted = false;
            break;
        }
        prev = Some(k);
    }
    if sorted {
        return;
    }
    let n = v.len();
    for root in (0..n / 2).rev() {
        sift_down(v, root, n, &mut key);
    }
    for end in (1..n).rev() {
        v.swap(0, end);
        sift_down(v, 0, end, &mut key);
    }
}

/// Moves `v[root]` down the max-heap `v[..end]` to its place.
fn sift_down<T, K: Ord>(v: &mut [T], mut root: usize, end: usize, key: &mut impl FnMut(&T) -> K) {
    loop {
        let mut child = 2 * root + 1;
        if child >= end {
            return;
        }
        if child + 1 < end && key(&v[child]) < key(&v[child + 1]) {
            child += 1;
        }
        if key(&v[root]) >= key(&v[child]) {
            return;
        }
        v.swap(root, child);
        root = child;
    }
}

/// Whether an announcement may go to a peer (docs/protocol.md §3.6: no path with a
/// segment starting with `.` below the prefix to lite-05 peers). The Exclude
/// Hop filter is applied beside it, on the broadcast's route.
fn announceable(suffix: Path<'_>) -> bool {
    !suffix.segments().any(|s| s.starts_with('.'))
}

/// Where the initial set's walk over `origin.under(prefix)` resumes, and how
/// many entries finding it visited.
///
/// `next` was the position to resume at when the origin was at `mark`, and
/// `last` the path of the broadcast sent last. Unchanged origin: `next`.
/// Otherwise positions may have moved (a change fills or frees one place, so
/// moves a position by at most one): right after `last` if no change since
/// `mark` names it (its place, and so the split between sent and unsent
/// places, is the same); else early enough that nothing unsent is skipped,
/// at the cost of sending a few broadcasts again.
fn resume_at(
    origin: origin::Ref<'_, '_>,
    prefix: Path<'_>,
    next: usize,
    mark: origin::Cursor,
    last: Option<Path<'_>>,
) -> (usize, usize) {
    let changes = origin.version().wrapping_sub(mark.position());
    if changes == 0 {
        return (next, 0);
    }
    let early = next.saturating_sub(usize::try_from(changes).unwrap_or(usize::MAX));
    let Some(last) = last else {
        return (early, 0);
    };
    let mut log = mark;
    loop {
        match origin.next_change(&mut log) {
            Ok(Some(change)) if change.path() == last => return (early, 0),
            Ok(Some(_)) => {}
            Ok(None) => break,
            // The log moved on: following it fails anyway (the stream is reset).
            Err(_) => return (early, 0),
        }
    }
    let mut visited = 0;
    for (i, b) in origin.iter().filter(|b| b.is_under(prefix)).enumerate() {
        visited += 1;
        if b.has_path(last) {
            return (i + 1, visited);
        }
    }
    (early, visited)
}

/// The next bytes of a group stream: borrowed (to copy behind the record
/// header) or sharing their pool block (to be gathered), with how many bytes
/// one record may gather from there (across blocks).
enum Chunk<'c, 'p> {
    Copied(&'c [u8]),
    Shared(Slice<'p>, usize),
}

/// What one [`Session::flush_groups`] or [`Session::flush_control`] call did.
pub(super) struct Flushed {
    /// Bytes written into the caller's `out`.
    pub(super) bytes: usize,
    /// A group stream ended (FIN sent, or the stream failed), freeing its
    /// slot: the session's `drive` may have more to queue.
    pub(super) ended: bool,
    /// The transport took stream data or a FIN, counted in `bytes` or not
    /// (a transport with its own send buffer writes nothing into `out`).
    pub(super) moved: bool,
}

impl Flushed {
    /// What a control flush did: control streams end in `sweep_control`.
    pub(super) fn control(bytes: usize, moved: bool) -> Self {
        Flushed {
            bytes,
            ended: false,
            moved,
        }
    }
}

/// What writing one group stream did.
enum Wrote {
    /// This many bytes of `out` were used.
    Bytes(usize),
    /// Nothing to send on this stream now (no data, no credit, or it ended).
    Idle,
    /// `out` is full.
    Full,
}

impl<'s, 'a, 'p, const N: usize, T: Transport> Session<'s, 'a, 'p, N, T> {
    // ---- announce requests (docs/protocol.md §3.6) ----

    /// The peer's ANNOUNCE_REQUEST: keep the prefix and start serving.
    pub(super) fn parse_announce_request(
        &mut self,
        slot: usize,
        state: AnnounceState,
        limit: usize,
    ) -> Step {
        if state != AnnounceState::Request {
            self.fail(
                SessionCode::ProtocolViolation,
                "data after ANNOUNCE_REQUEST",
            );
            return Step::Stop;
        }
        let parsed = match decode_within::<AnnounceRequest<'_>>(self.rx_data(slot), limit) {
            Ok((req, n)) => {
                // docs/protocol.md §4.1: the prefix is under the peer's root.
                let prefix = join(self.root.as_str(), req.prefix);
                Ok((n, prefix.ok(), req.exclude_hop))
            }
            Err(e) => Err(e),
        };
        let (n, prefix, exclude) = match parsed {
            Ok(v) => v,
            Err(e) => return self.on_decode_error(slot, e),
        };
        self.rx_consume(slot, n);
        if self.control[slot].rx_len > 0 {
            self.fail(
                SessionCode::ProtocolViolation,
                "data after ANNOUNCE_REQUEST",
            );
            return Step::Stop;
        }
        let Some(prefix) = prefix else {
            self.refuse(slot, StreamCode::Internal);
            return Step::Stop;
        };
        // The stream keeps its buffer while it lives: refused unless two
        // stay free for the other streams' messages and answers.
        if self.free_chunks() < 2 || !self.set_rx_kept(slot, prefix.as_str().as_bytes()) {
            self.refuse(slot, StreamCode::Internal);
            return Step::Stop;
        }
        let state = match self.origin {
            Some(o) => AnnounceState::Initial {
                prefix: prefix.as_str().len(),
                after: None,
                next: 0,
                mark: o.cursor(),
                exclude,
                cursor: o.cursor(),
                ok_sent: false,
            },
            None => {
                // docs/protocol.md §3.6: nothing we may announce is ANNOUNCE_OK with 0, not an error.
                let ok = AnnounceOk {
                    hop: self.hop,
                    active: 0,
                };
                if self.tx_write(slot, |w| write_message(&ok, w)).is_err() {
                    self.refuse(slot, StreamCode::Internal);
                    return Step::Stop;
                }
                AnnounceState::Quiet
            }
        };
        self.control[slot].kind = Kind::AnnounceIn { state };
        Step::Consumed(0)
    }

    /// Sends what is due on every announce stream we serve: ANNOUNCE_OK, the
    /// initial set, then changes, as far as each send buffer allows.
    pub(super) fn serve_announces(&mut self) {
        let Some(origin) = self.origin else {
            return;
        };
        for slot in 0..self.control.span() {
            if let Kind::AnnounceIn { state } = self.control[slot].kind
                && !matches!(state, AnnounceState::Request | AnnounceState::Quiet)
                && !self.control[slot].tx_done
            {
                self.serve_announce(origin, slot, state);
            }
        }
    }

    fn serve_announce(
        &mut self,
        origin: origin::Ref<'a, 'p>,
        slot: usize,
        mut state: AnnounceState,
    ) {
        let (AnnounceState::Initial { prefix: plen, .. }
        | AnnounceState::Live { prefix: plen, .. }) = state
        else {
            return;
        };
        // Up to date with the origin's log (a change whose ANNOUNCE did not fit
        // leaves the cursor before it): nothing to send, nothing to parse.
        if let AnnounceState::Live { cursor, .. } = state
            && cursor.position() == origin.version()
        {
            return;
        }
        // The kept prefix, copied out so the slot's buffers stay writable.
        let Some(prefix_buf) = self
            .rx_kept(slot)
            .get(..plen)
            .and_then(|b| core::str::from_utf8(b).ok())
            .and_then(|s| PathBuf::<{ super::MAX_PATH }>::normalize(s).ok())
        else {
            self.refuse(slot, StreamCode::Internal);
            return;
        };
        let prefix = prefix_buf.as_path();
        loop {
            match state {
                AnnounceState::Request | AnnounceState::Quiet => return,
                AnnounceState::Initial {
                    ok_sent: false,
                    prefix: plen,
                    after,
                    next,
                    mark,
                    exclude,
                    cursor,
                } => {
                    // docs/protocol.md §3.6: our Hop ID, and how many ANNOUNCEs follow.
                    let scope = self.scope;
                    let active = origin
                        .under(prefix)
                        .filter(|(suffix, b)| {
                            announceable(suffix.as_path())
                                && !b.hops_contain(exclude)
                                && Self::visible(scope, b.path().as_str())
                        })
                        .count() as u64;
                    let ok = AnnounceOk {
                        hop: self.hop,
                        active,
                    };
                    if self.tx_write(slot, |w| write_message(&ok, w)).is_err() {
                        return;
                    }
                    state = AnnounceState::Initial {
                        prefix: plen,
                        after,
                        next,
                        mark,
                        exclude,
                        cursor,
                        ok_sent: true,
                    };
                }
                AnnounceState::Initial {
                    ok_sent: true,
                    prefix: plen,
                    after,
                    next,
                    mark,
                    exclude,
                    cursor,
                } => {
                    // Resume only with half the send buffer free, so that each
                    // resumption (which walks past the entries sent before)
                    // sends a good part of a buffer.
                    let c = self.control[slot];
                    if next > 0 && c.tx_keep + c.tx_len > self.buf / 2 {
                        self.control[slot].kind = Kind::AnnounceIn { state };
                        return;
                    }
                    let last_buf = after.and_then(|n| {
                        self.rx_kept(slot)
                            .get(plen..plen + n)
                            .and_then(|b| core::str::from_utf8(b).ok())
                            .and_then(|s| PathBuf::<{ super::MAX_PATH }>::normalize(s).ok())
                    });
                    let last = last_buf.as_ref().map(|p| p.as_path());
                    let (start, found) = resume_at(origin, prefix, next, mark, last);
                    self.count_announce_visits(found);
                    // One pass over the catalog from there, as far as the send
                    // buffer takes it.
                    let mut pos = start;
                    let mut sent: Option<BroadcastPath> = None;
                    let mut full = false;
                    let unsent = origin.iter().filter(|b| b.is_under(prefix)).skip(start);
                    let scope = self.scope;
                    for (suffix, b) in unsent.filter_map(|b| b.suffix(prefix).map(|s| (s, b))) {
                        if announceable(suffix.as_path())
                            && !b.hops_contain(exclude)
                            && Self::visible(scope, b.path().as_str())
                        {
                            // docs/protocol.md §3.6: the route it came by.
                            let hops = b.hops();
                            let msg = Announce {
                                status: AnnounceStatus::Active,
                                suffix: suffix.as_str(),
                                hops: hops.as_hops(),
                            };
                            if self.tx_write(slot, |w| write_message(&msg, w)).is_err() {
                                full = true;
                                break;
                            }
                            self.announces_sent += 1;
                            sent = Some(b.path());
                        }
                        pos += 1;
                    }
                    // Skipped to `start`, walked to `pos`, and one more if it did not fit.
                    self.count_announce_visits(pos + usize::from(full));
                    let mut after = after;
                    if let Some(path) = sent {
                        // Remember the broadcast sent last, after the prefix.
                        let path = path.as_str().as_bytes();
                        if !self.set_rx_kept_at(slot, plen, path) {
                            self.refuse(slot, StreamCode::Internal);
                            return;
                        }
                        after = Some(path.len());
                    }
                    if full {
                        state = AnnounceState::Initial {
                            prefix: plen,
                            after,
                            next: pos,
                            mark: origin.cursor(),
                            exclude,
                            cursor,
                            ok_sent: true,
                        };
                        self.control[slot].kind = Kind::AnnounceIn { state };
                        return;
                    }
                    state = AnnounceState::Live {
                        prefix: plen,
                        exclude,
                        cursor,
                    };
                    self.control[slot].rx_keep = plen;
                }
                AnnounceState::Live {
                    prefix: plen,
                    exclude,
                    cursor,
                } => {
                    let mut next = cursor;
                    let change = match origin.next_change_under(&mut next, prefix) {
                        Ok(Some(c)) => c,
                        Ok(None) => {
                            self.control[slot].kind = Kind::AnnounceIn { state };
                            return;
                        }
                        Err(_) => {
                            // The log moved on without us: we cannot tell which of the
                            // broadcasts we announced ended, so let the subscriber ask again.
                            debug!("session: announce log lagged; resetting the stream");
                            self.refuse(slot, StreamCode::Internal);
                            return;
                        }
                    };
                    let (suffix, change) = change;
                    if announceable(suffix.as_path())
                        && Self::visible(self.scope, change.path().as_str())
                    {
                        // An Active names the route the broadcast came by (a
                        // second one for the same path is a restart: its route
                        // changed); one whose route crosses the peer's Exclude
                        // Hop goes out as Ended (docs/protocol.md §3.6).
                        // moq-dev sends an empty hop list with Ended.
                        let b = change.broadcast();
                        let hops = if change.is_active() && b.is_current() {
                            b.hops()
                        } else {
                            HopList::EMPTY
                        };
                        // A broadcast no longer current has no route to name:
                        // it goes out as Ended, never as a route from here.
                        let active =
                            change.is_active() && b.is_current() && !hops.contains(exclude);
                        let msg = Announce {
                            status: if active {
                                AnnounceStatus::Active
                            } else {
                                AnnounceStatus::Ended
                            },
                            suffix: suffix.as_str(),
                            hops: if active { hops.as_hops() } else { Hops::EMPTY },
                        };
                        if self.tx_write(slot, |w| write_message(&msg, w)).is_err() {
                            self.control[slot].kind = Kind::AnnounceIn { state };
                            return;
                        }
                        self.announces_sent += 1;
                    }
                    state = AnnounceState::Live {
                        prefix: plen,
                        exclude,
                        cursor: next,
                    };
                }
            }
            self.control[slot].kind = Kind::AnnounceIn { state };
        }
    }

    // ---- subscriptions (docs/protocol.md §3.8) ----

    /// SUBSCRIBE, then SUBSCRIBE_UPDATEs, on a Subscribe stream the peer opened.
    pub(super) fn parse_subscribe(&mut self, slot: usize, served: SubState, limit: usize) -> Step {
        match served {
            SubState::Done => Step::Consumed(self.control[slot].rx_len),
            SubState::Serving(i) => {
                match decode_within::<SubscribeUpdate>(self.rx_data(slot), limit) {
                    Ok((u, n)) => {
                        self.on_subscribe_update(i, u);
                        Step::Consumed(n)
                    }
                    Err(e) => self.on_decode_error(slot, e),
                }
            }
            SubState::Waiting => {
                let origin = self.origin;
                let resolver = self.resolver;
                let requester = self.peer_hop();
                let parsed = match decode_within::<Subscribe<'_>>(
                    rx_of(self.chunks, &self.control[slot], self.buf),
                    limit,
                ) {
                    Ok((s, n)) => {
                        let found = match rooted(&self.root, s.broadcast, &mut self.scratch) {
                            // docs/protocol.md §4.10: outside the peer's scope.
                            Some(path) if !Self::visible(self.scope, path.as_str()) => {
                                Err(StreamCode::Unroutable)
                            }
                            Some(path) => super::resolve::lookup_or_resolve(
                                origin, resolver, path, s.track, requester,
                            ),
                            None => Err(StreamCode::NotFound),
                        };
                        let request = Request {
                            start: s.start_group.into(),
                            end: s.end_group.into(),
                            ordered: false,
                            priority: s.priority,
                            max_latency: s.max_age,
                        };
                        Ok((n, s.id, request, found))
                    }
                    Err(e) => Err(e),
                };
                match parsed {
                    Ok((n, id, request, Ok(source))) => {
                        self.on_subscribe(slot, n, id, request, source)
                    }
                    Ok((_, _, _, Err(code))) => {
                        self.refuse(slot, code);
                        Step::Stop
                    }
                    Err(e) => self.on_decode_error(slot, e),
                }
            }
        }
    }

    /// Accepts a SUBSCRIBE into the served table.
    fn on_subscribe(
        &mut self,
        slot: usize,
        n: usize,
        id: u64,
        request: Request,
        source: track::Ref<'a, 'p>,
    ) -> Step {
        // docs/protocol.md §3.8: Subscribe IDs are unique for the session.
        if self.served.iter().flatten().any(|s| s.id == id) {
            self.fail(SessionCode::ProtocolViolation, "duplicate Subscribe ID");
            return Step::Stop;
        }
        let Some(i) = self.served.first_free() else {
            debug!("session: served table full, refusing subscription {}", id);
            self.refuse(slot, StreamCode::Internal);
            return Step::Stop;
        };
        // docs/protocol.md §4.7: subscriber budgets are clamped to the publisher's max age.
        let request = Request {
            max_latency: min(request.max_latency, source.info().max_age),
            ..request
        };
        let latest_pending = request.start == window::Start::Latest && source.latest().is_none();
        let resolved = if latest_pending {
            Ok(Window::new(request))
        } else {
            Window::resolve(request, &source)
        };
        let window = match resolved {
            Ok(w) => w,
            Err(WindowError::Expired) => {
                // Everything asked for is gone: SUBSCRIBE_DROP the range, then END.
                let start = match request.start {
                    window::Start::Group(s) => s,
                    window::Start::Latest => 0,
                };
                let end = request.end.cap();
                let drop = SubscribeResponse::Drop {
                    start,
                    end,
                    code: 0,
                };
                let fin = SubscribeResponse::End {
                    group: end.saturating_add(1),
                };
                let _ = self.tx_write(slot, |w| {
                    drop.write(w)?;
                    fin.write(w)
                });
                self.control[slot].fin = true;
                self.control[slot].kind = Kind::SubscribeIn {
                    served: SubState::Done,
                };
                return Step::Consumed(n);
            }
            // Nothing to serve until an update moves the start or the end.
            Err(_) => Window::new(request),
        };
        debug!("session: serving subscription {}", id);
        // docs/protocol.md §4.5: the track knows what is served from it (a relay
        // aggregates it upstream); unregistered in `free_served`.
        source.add_subscriber(window.request());
        self.served_changes += 1;
        self.note(super::Change::Demand(source.key()));
        self.served[i] = Some(Served {
            id,
            slot,
            source,
            window,
            started: false,
            latest_pending,
        });
        self.control[slot].kind = Kind::SubscribeIn {
            served: SubState::Serving(i),
        };
        Step::Consumed(n)
    }

    /// SUBSCRIBE_UPDATE replaces the preferences (docs/protocol.md §3.8).
    fn on_subscribe_update(&mut self, i: usize, u: SubscribeUpdate) {
        let Some(s) = self.served.get_mut(i).and_then(Option::as_mut) else {
            return;
        };
        let request = Request {
            start: u.start_group.into(),
            end: u.end_group.into(),
            ordered: false,
            priority: u.priority,
            max_latency: min(u.max_age, s.source.info().max_age),
        };
        let source = s.source;
        let before = *s.window.request();
        if s.window.update(request, &source).is_err() {
            debug!("session: subscribe update refused by the window");
        } else if request.start != window::Start::Latest {
            // An explicit start resolved the window.
            s.latest_pending = false;
        }
        source.update_subscriber(&before, s.window.request());
        self.served_changes += 1;
        self.changes.add(super::Change::Demand(source.key()));
        // Groups in flight must not be opened again.
        for o in self.out.iter().flatten() {
            if o.served == i {
                let _ = s.window.remove(GroupRange::single(o.seq));
            }
        }
    }

    /// Stops serving entry `i`: resets its group streams with `code` and frees it.
    pub(super) fn end_served(&mut self, i: usize, code: StreamCode) {
        for o in self.out.iter_mut() {
            if let Some(g) = o
                && g.served == i
            {
                let _ = self.conn.reset_stream(g.id, code.to_code());
                *o = None;
            }
        }
        self.free_served(i);
    }

    /// Frees served entry `i` (if taken) and unregisters it from its track:
    /// every path that ends a served subscription goes through here.
    pub(super) fn free_served(&mut self, i: usize) {
        if let Some(s) = self.served.get_mut(i).and_then(Option::take) {
            s.source.remove_subscriber(s.window.request());
            self.served_changes += 1;
            self.changes.add(super::Change::Demand(s.source.key()));
        }
    }

    /// Advances every served subscription: START, stale groups, new group
    /// streams (newest first), END and FIN.
    pub(super) fn serve_subscriptions(&mut self) {
        for i in 0..self.served.span() {
            if self.served[i].is_some() {
                self.serve_one(i);
            }
        }
    }

    fn serve_one(&mut self, i: usize) {
        let Some(s) = self.served.get(i).and_then(Option::as_ref) else {
            return;
        };
        let (source, slot) = (s.source, s.slot);
        let max_age = s.window.request().max_latency;

        // docs/protocol.md §4.4: the track was abandoned; pass the error on.
        if let track::Status::Aborted(code) = source.status() {
            let code = StreamCode::from_code(code);
            self.end_served(i, code);
            self.control[slot].kind = Kind::SubscribeIn {
                served: SubState::Done,
            };
            self.reset_tx(slot, code);
            return;
        }
        let latest = source.latest();
        // The first group is held: a latest-group subscription starts at the
        // newest one.
        if latest.is_some()
            && let Some(s) = self.served_mut(i)
            && s.latest_pending
        {
            s.latest_pending = false;
            if let Ok(w) = Window::resolve(*s.window.request(), &source) {
                s.window = w;
            }
        }

        // Group streams whose group went stale: reset OLD (§4.7).
        for o in self.out.iter_mut() {
            if let Some(g) = o
                && g.served == i
                && is_stale(source, max_age, g.seq)
            {
                debug!("session: group {} stale, resetting", g.seq);
                let _ = self.conn.reset_stream(g.id, StreamCode::Old.to_code());
                *o = None;
            }
        }

        // SUBSCRIBE_START once the first group is known (§3.8).
        let first = self
            .served_ref(i)
            .filter(|s| !s.started)
            .and_then(|s| s.window.first(&source));
        if let Some(first) = first {
            let start = SubscribeResponse::Start { group: first };
            if self.tx_write(slot, |w| start.write(w)).is_err() {
                return;
            }
            if let Some(s) = self.served_mut(i) {
                s.started = true;
                if first > 0 {
                    s.window.remove_through(first - 1);
                }
            }
        }
        let started = self.served_ref(i).is_some_and(|s| s.started);
        if started && let Some(latest) = latest {
            // Forget wanted groups that are stale or gone (§4.7, §4.8).
            if let Some(s) = self.served_mut(i) {
                match s.window.first(&source) {
                    Some(first) if first > 0 => s.window.remove_through(first - 1),
                    Some(_) => {}
                    None => s.window.remove_through(latest),
                }
            }
            // Open group streams, newest first (§4.6).
            while let Some(seq) = self
                .served_ref(i)
                .and_then(|s| highest_wanted(&s.window, latest))
            {
                let Some(consumer) = source.group(seq) else {
                    // Not held but not expired either: the window's own rule
                    // (`Timeline::superseded_at`) says it is still on its way
                    // from upstream, older than every group held, so it stays
                    // wanted and nothing older is held.
                    if self
                        .served_ref(i)
                        .is_some_and(|s| !s.window.is_expired(seq, &source))
                    {
                        break;
                    }
                    // Not held, and older groups are not either.
                    if let Some(s) = self.served_mut(i) {
                        s.window.remove_through(seq);
                    }
                    continue;
                };
                // A trimmed group cannot be sent from its first byte (see
                // `model::group`): skip it without opening a stream and go on
                // with the next wanted group.
                if consumer.is_trimmed() {
                    debug!("session: group {} trimmed, skipped", seq);
                } else if !self.open_group(i, seq, consumer) {
                    break;
                }
                if let Some(s) = self.served_mut(i)
                    && s.window.remove(GroupRange::single(seq)).is_err()
                {
                    // Too many holes: give up on everything older.
                    s.window.remove_through(seq);
                }
            }
        }
        // The track finished: once every group below its end was delivered or given
        // up, SUBSCRIBE_END (exclusive) and FIN. END waits for the group streams
        // because a lite-05 reader can take END for the end of its track and lose a
        // group whose stream starts behind it (docs/protocol.md §3.8).
        let Some(end) = track_end(source) else {
            return;
        };
        let pending = self
            .served_ref(i)
            .is_some_and(|s| s.window.lowest().is_some_and(|lo| lo < end));
        let in_flight = self.out.iter().flatten().any(|o| o.served == i);
        if pending || in_flight {
            return;
        }
        let msg = SubscribeResponse::End { group: end };
        if self.tx_write(slot, |w| msg.write(w)).is_err() {
            return;
        }
        debug!("session: served subscription complete");
        self.free_served(i);
        self.control[slot].kind = Kind::SubscribeIn {
            served: SubState::Done,
        };
        self.control[slot].fin = true;
    }

    fn served_ref(&self, i: usize) -> Option<&Served<'a, 'p>> {
        self.served.get(i).and_then(Option::as_ref)
    }

    fn served_mut(&mut self, i: usize) -> Option<&mut Served<'a, 'p>> {
        self.served.get_mut(i).and_then(Option::as_mut)
    }

    /// Opens a group stream for group `seq` of served subscription `i`; false if
    /// no stream or slot is available now.
    fn open_group(&mut self, i: usize, seq: u64, consumer: group::Consumer<'a, 'p>) -> bool {
        let Some(sub) = self.served[i].as_ref().map(|s| s.id) else {
            return false;
        };
        let Some(free) = self.out.first_free() else {
            return false;
        };
        let mut header = [0u8; GROUP_HEADER];
        let mut w = Writer::new(&mut header);
        let msg = Group {
            subscribe: sub,
            sequence: seq,
        };
        if UniStreamType::Group.write(&mut w).is_err() || write_message(&msg, &mut w).is_err() {
            return false;
        }
        let header_len = w.position();
        let Ok(id) = self.conn.open_stream(Dir::Uni) else {
            return false;
        };
        if let Some(s) = self.served[i].as_ref() {
            let priority = group_priority(s.window.request().priority, seq);
            self.conn.set_priority(id, priority);
        }
        trace!("session: group {} on stream {}", seq, id.value());
        self.out[free] = Some(GroupOut {
            id,
            served: i,
            fetch: None,
            seq,
            consumer,
            header,
            header_len,
            header_sent: 0,
        });
        true
    }

    /// Sorts the group-stream table into sending order (docs/protocol.md §4.6,
    /// which [`group_priority`] gives a transport that schedules streams):
    /// subscriber priority (higher first), then Subscribe ID (older first),
    /// then group sequence (newest first), the stream ID breaking ties;
    /// streams of no served subscription (never sent) and free slots last.
    /// Returns how many ranks it computed.
    ///
    /// The table is usually in that order already (streams are opened newest
    /// first and keep their rank), which the sort checks in one pass; else a
    /// heapsort, O(S log S).
    fn sort_out(&mut self) -> usize {
        let served = &self.served;
        let mut ranked = 0;
        sort_by_key(self.out.as_mut_slice(), |o| {
            ranked += 1;
            let rank = o.as_ref().and_then(|o| {
                if let Some(f) = o.fetch {
                    // A fetch ranks after the subscriptions of its priority.
                    return Some((Reverse(f.priority), u64::MAX, Reverse(o.seq), o.id.value()));
                }
                let s = served.get(o.served)?.as_ref()?;
                Some((
                    Reverse(s.window.request().priority),
                    s.id,
                    Reverse(o.seq),
                    o.id.value(),
                ))
            });
            (rank.is_none(), rank)
        });
        self.out.trim();
        ranked
    }

    /// Whether group stream `idx` belongs to a served subscription (only those are sent).
    fn is_ranked(&self, idx: usize) -> bool {
        self.out.get(idx).and_then(Option::as_ref).is_some_and(|o| {
            o.fetch.is_some() || self.served.get(o.served).is_some_and(Option::is_some)
        })
    }

    /// Writes group data into `out` in priority order; returns the bytes
    /// written and whether a stream ended.
    ///
    /// With `gather`, payload stays in the pool: `out` gets the record headers
    /// and `gather` the payload ranges, `base` being where `out` starts in the
    /// caller's buffer.
    ///
    /// The table is sorted into sending order, then each stream in turn writes
    /// until it has nothing to send now (or `out` is full). Taking the streams
    /// in one pass is the same as always going back to the best-ranked stream
    /// that can send: no write here lets a stream that could not send go on
    /// (writing only uses up connection credit and `out`, and brings no data).
    pub(super) fn flush_groups(
        &mut self,
        now: Instant,
        out: &mut [u8],
        base: usize,
        mut gather: Option<&mut dyn Gather<'p>>,
    ) -> Flushed {
        let mut visited = self.sort_out();
        let mut pos = 0;
        let mut ended = false;
        let mut moved = false;
        'streams: for idx in 0..self.out.span() {
            visited += 1;
            if !self.is_ranked(idx) {
                // Sorted last: nothing after it is sent either.
                break;
            }
            loop {
                let room = out.get_mut(pos..).unwrap_or(&mut []);
                match self.write_group(now, idx, room, base + pos, super::reborrow(&mut gather)) {
                    Wrote::Bytes(n) => {
                        pos += n;
                        moved = true;
                        self.note_consumed(idx);
                    }
                    Wrote::Idle => {
                        // A ranked slot is in use when the loop starts, so an
                        // empty one now was ended by this call.
                        ended |= matches!(self.out.get(idx), Some(None));
                        break;
                    }
                    Wrote::Full => {
                        self.pace(idx);
                        break 'streams;
                    }
                }
            }
            self.pace(idx);
        }
        self.count_group_visits(visited);
        Flushed {
            bytes: pos,
            ended,
            moved,
        }
    }

    /// Reports group stream `idx`'s send credit to the group it reads, if the
    /// group's producer paces itself: the producer may run that far past what
    /// the stream sent (see [`group::Consumer::pace`]).
    fn pace(&mut self, idx: usize) {
        if let Some(Some(o)) = self.out.get_mut(idx)
            && o.consumer.pace_wanted()
        {
            let credit = self.conn.send_credit(o.id);
            o.consumer.pace(credit);
        }
    }

    /// Records that group stream `idx` read its served track.
    fn note_consumed(&mut self, idx: usize) {
        if let Some(Some(o)) = self.out.get(idx)
            && let Some(Some(s)) = self.served.get(o.served)
        {
            self.changes.add(super::Change::Consumed(s.source.key()));
        }
    }

    /// Writes one record of group stream `idx` (header, data or FIN); `at` is
    /// where `out` starts in the caller's buffer (for `gather`).
    fn write_group(
        &mut self,
        now: Instant,
        idx: usize,
        out: &mut [u8],
        at: usize,
        mut gather: Option<&mut dyn Gather<'p>>,
    ) -> Wrote {
        let Some(Some(o)) = self.out.get_mut(idx) else {
            return Wrote::Idle;
        };
        let id = o.id;
        if o.header_sent < o.header_len {
            let data = o.header.get(o.header_sent..o.header_len).unwrap_or(&[]);
            return match self.conn.write_stream(now, id, data, false, out) {
                Ok(w) => {
                    o.header_sent += w.data;
                    Wrote::Bytes(w.out)
                }
                Err(crate::conn::WriteError::Blocked) => Wrote::Idle,
                Err(crate::conn::WriteError::BufferTooSmall) => Wrote::Full,
                Err(_) => {
                    self.end_out(idx);
                    Wrote::Idle
                }
            };
        }
        if let Some(g) = gather.as_deref_mut()
            && self.conn.lends()
            && let Ok(Next::Ready(slice)) = o.consumer.chunk_slice()
        {
            // A link inside one process: lend the block instead of sending its bytes.
            let res = self
                .conn
                .write_stream_ref(now, id, slice.len(), false, out, |n| {
                    let mut lent = slice;
                    lent.truncate(n);
                    g.lend(lent)
                });
            match res {
                Ok(Some(w)) => {
                    o.consumer.advance(w.data);
                    return Wrote::Bytes(w.out);
                }
                // Not lent: send the bytes.
                Ok(None) => {}
                Err(crate::conn::WriteError::Blocked) => return Wrote::Idle,
                Err(crate::conn::WriteError::BufferTooSmall) => return Wrote::Full,
                Err(_) => {
                    self.end_out(idx);
                    return Wrote::Idle;
                }
            }
        }
        // Payload left where it lies for a vectored write, if the transport
        // sends that way; copied otherwise (a transport that only lends).
        let next = match gather.as_ref().filter(|_| T::GATHER) {
            Some(g) => {
                let room = g.room();
                match o.consumer.chunk_slice() {
                    Ok(Next::Ready(slice)) => {
                        let len = o.consumer.readable_within(room);
                        Ok(Next::Ready(Chunk::Shared(slice, len)))
                    }
                    other => other.map(|n| n.map(|slice| Chunk::Shared(slice, 0))),
                }
            }
            None => o.consumer.chunk().map(|n| n.map(Chunk::Copied)),
        };
        match next {
            Ok(Next::Ready(chunk)) => {
                // The FIN follows in its own record once the consumer reports the end.
                let res = match (&chunk, &gather) {
                    (Chunk::Shared(..), Some(g)) if g.room() == 0 => return Wrote::Full,
                    // One record may carry payload from several blocks, one
                    // gathered range each.
                    (Chunk::Shared(_, len), _) => {
                        self.conn.write_stream_header(now, id, *len, false, out)
                    }
                    (Chunk::Copied(bytes), _) => self.conn.write_stream(now, id, bytes, false, out),
                };
                match res {
                    Ok(w) => {
                        if let (Chunk::Shared(slice, _), Some(g)) = (chunk, gather) {
                            if !gather_record(&mut o.consumer, slice, w.data, at + w.out, g) {
                                // Cannot happen (`readable_within` promised the
                                // bytes); a short record would garble the
                                // connection, so end it.
                                debug_assert!(false, "gathered record short of its header");
                                self.fail(SessionCode::Internal, "gathered record short");
                            }
                            return Wrote::Bytes(w.out);
                        }
                        o.consumer.advance(w.data);
                        Wrote::Bytes(w.out)
                    }
                    Err(crate::conn::WriteError::Blocked) => Wrote::Idle,
                    Err(crate::conn::WriteError::BufferTooSmall) => Wrote::Full,
                    Err(_) => {
                        self.end_out(idx);
                        Wrote::Idle
                    }
                }
            }
            Ok(Next::Pending) => Wrote::Idle,
            Ok(Next::Finished) => match self.conn.write_stream(now, id, &[], true, out) {
                Ok(w) => {
                    self.end_out(idx);
                    Wrote::Bytes(w.out)
                }
                Err(crate::conn::WriteError::BufferTooSmall) => Wrote::Full,
                Err(_) => {
                    self.end_out(idx);
                    Wrote::Idle
                }
            },
            Err(e) => {
                let code = match e {
                    ReadError::Aborted(code) => code,
                    // The slot was reused for a newer group, or (not opened by
                    // `serve_one`, but kept total) the group's start is gone.
                    ReadError::Evicted | ReadError::Trimmed => StreamCode::Old.to_code(),
                    ReadError::Misaligned => StreamCode::Internal.to_code(),
                };
                let _ = self.conn.reset_stream(id, code);
                self.end_out(idx);
                Wrote::Idle
            }
        }
    }

    /// The peer stopped one of our group streams: reset it with the same code.
    pub(super) fn group_stopped(&mut self, id: StreamId, code: u64) {
        for idx in 0..self.out.span() {
            if self.out[idx].as_ref().is_some_and(|g| g.id == id) {
                let _ = self.conn.reset_stream(id, code);
                self.end_out(idx);
            }
        }
    }

    /// Frees group-stream entry `idx`; a fetch it answered is over.
    pub(super) fn end_out(&mut self, idx: usize) {
        let Some(o) = self.out.get_mut(idx).and_then(Option::take) else {
            return;
        };
        if let Some(f) = o.fetch {
            self.fetch_over(f.slot, o.id);
        }
    }

    /// Answers the FETCH on control slot `slot` (stream `id`) with
    /// `consumer`'s group: a group-stream entry sends its stored bytes on
    /// the Fetch stream, with no header (docs/protocol.md §3.10); false if
    /// no entry is free.
    pub(super) fn serve_fetch(
        &mut self,
        slot: usize,
        id: StreamId,
        priority: u8,
        consumer: group::Consumer<'a, 'p>,
    ) -> bool {
        let Some(free) = self.out.first_free() else {
            return false;
        };
        let seq = consumer.sequence();
        self.conn.set_priority(id, group_priority(priority, seq));
        trace!("session: fetch of group {} on stream {}", seq, id.value());
        self.out[free] = Some(GroupOut {
            id,
            served: NOT_SERVED,
            fetch: Some(Fetched { slot, priority }),
            seq,
            consumer,
            header: [0; GROUP_HEADER],
            header_len: 0,
            header_sent: 0,
        });
        true
    }
}

/// Hands `len` bytes of `consumer`, starting with `first` (its last chunk), to
/// `gather` at `at` as one range per block, consuming them; false if fewer
/// were readable.
fn gather_record<'p>(
    consumer: &mut group::Consumer<'_, 'p>,
    first: Slice<'p>,
    len: usize,
    at: usize,
    gather: &mut dyn Gather<'p>,
) -> bool {
    let mut left = len;
    let mut next = Some(first);
    while left > 0 {
        let Some(mut slice) = next.take() else {
            return false;
        };
        slice.truncate(left);
        let n = slice.len();
        gather.push(at, slice);
        consumer.advance(n);
        left -= n;
        if left > 0 {
            next = match consumer.chunk_slice() {
                Ok(Next::Ready(s)) if !s.is_empty() => Some(s),
                _ => None,
            };
        }
    }
    true
}

/// A group stream's priority for a transport that schedules streams itself
/// (higher first; docs/protocol.md §11.5): the subscriber's priority, then
/// the newer group (the low 23 bits of its sequence), as the session sends
/// them. Every group stream ranks below the request streams (`i32::MAX`).
pub(crate) fn group_priority(subscriber: u8, sequence: u64) -> i32 {
    (i32::from(subscriber) << 23) | (sequence & 0x7f_ffff) as i32
}
