//! Which source serves each broadcast path a relay worker knows, and what
//! happens when sources come and go: routing by announcement, standbys and
//! spares, publisher failover within a grace period, and relay tracks made
//! on demand (docs/protocol.md §4).
//!
//! Sans-IO: the caller passes every event in (an announcement, a withdrawal,
//! a source gone, a track request, an upstream subscription over) with the
//! time, and asks [`Router::poll_timeout`] when to call
//! [`Router::handle_timeout`]. The upstream SUBSCRIBEs a decision needs go out
//! through the caller's [`Upstreams`]. Every table is fixed at start-up
//! ([`RouterStorage`]), and every entry comes back once nothing uses it.
//!
//! # Rules
//!
//! * A path announced by a source for the first time is routed: a broadcast
//!   in the worker's origin (what its subscribers see), and, for a source of
//!   this worker (`local`), in its local origin too (what its links offer the
//!   other workers).
//! * A path routed already: while its source is gone (the grace period
//!   runs), the new source adopts it (every open track is asked for again
//!   from it, subscribers stay where they are; a track the old source
//!   finished leaves the broadcast, so its name is asked of the new
//!   source).
//! * The newest client announcement wins: a client source of this worker
//!   announcing a path that another live client source of this worker
//!   routes takes the route over at once. A camera whose close was lost
//!   (its old connection lingers until the transport's idle timeout) and
//!   that reconnects is served again as soon as it announces. Each open
//!   track's producer is let go (its open group aborted with CANCEL), the
//!   track is asked for again from the new source, and its subscribers stay
//!   where they are and go on at the new source's latest group; the old
//!   session's late groups are refused (its producers are stale), and its
//!   peer forgets those upstream subscriptions ([`super::Peer`]). The old
//!   source waits as a spare of the path. Without a free spare place the
//!   announcement is refused ([`AnnounceRefused::Full`]) and nothing changes.
//! * A local source of a path learned from another worker becomes a
//!   standby (in the local origin only, so the worker serving the route can
//!   fail over to it); any other source (a worker link, the upstream, a
//!   second client while a standby stands) waits as a spare, next in line
//!   when the current one goes away. A link's announcement displaces a
//!   source of this worker only with a shorter route (below).
//! * Between the workers of one relay, hop lists decide only when one route
//!   is shorter (or identified against anonymous, see `across`): both workers
//!   see the same lists, so they agree. A local source with a shorter route
//!   than the link serving a path takes it over (the link waits as a
//!   spare), and a link offering a shorter route than this worker's own
//!   source takes the route over while the source stands by (a broadcast
//!   of its own in the local origin, so the other worker keeps it as its
//!   spare): the node ends on one route, with one upstream subscription.
//! * Otherwise, between workers the newest announcement does not win: a camera that
//!   reconnects to another worker than its old session's is a standby
//!   there, and the viewers of every worker stay on the old session until
//!   it ends (at most the transport's idle timeout); then the standby takes
//!   over everywhere at once (a spare through the links on the old
//!   session's worker, the standby on its own). Taking over across a link
//!   would let each worker serve the other's source when two announce at
//!   once, and a route taken by a link must leave the local origin, which
//!   withdraws it from the other worker in turn.
//! * A source gone: its standbys are withdrawn, and each of its routes is
//!   adopted by a spare at once (the newest: the source most recently
//!   displaced, or the last to arrive), or by the source of this worker's
//!   standby of the path, or unannounced and kept for the grace period,
//!   then withdrawn (its tracks end with SESSION_CLOSED).
//! * A worker link's withdrawal ([`Router::source_left`]) is handled as
//!   that link gone for that path, not as the end of the broadcast: the
//!   link cannot tell an ended source from a lost one, and a new source
//!   may be announcing the path while the withdrawal crosses the link. A
//!   request the link refuses as unroutable meanwhile waits with its route
//!   for the next source ([`Router::upstream_unroutable`]), within the
//!   grace period, instead of being refused.
//! * Routes carry the hop list they came by ([`Via`], docs/protocol.md
//!   §4.3). Among this worker's own sources of a path (clients and cluster
//!   peers) the best by [`HopList::rank`] serves it, the newest among
//!   equals: a better announcement takes the route over as a reconnecting
//!   client does, a restart replaces the list in place, and a withdrawal or
//!   a lost source hands the route to the best spare at once
//!   ([`Router::withdrawn`]), the live tracks moving with it.
//! * A track request for a name the broadcast lacks makes a relay track
//!   (from the [`TrackTable`]) and one upstream SUBSCRIBE from the route's
//!   source; while the source has not answered, the request counts against
//!   the asking connection's and the broadcast's quotas.

use core::cell::{Cell, RefCell};
use core::fmt;

use super::broadcasts::{BroadcastTable, ClaimError};
use super::tracks::TrackTable;
use crate::model::hops::HopList;
use crate::model::path::{Path, PathBuf};
use crate::model::{broadcast, origin, track};
use crate::time::{Duration, Instant};
use crate::wire::lite::StreamCode;

/// Who announced a route: a connection, a worker link or the upstream, as
/// the caller numbers them.
pub type SourceId = u64;

/// Where the upstream SUBSCRIBEs a routing decision needs go.
pub trait Upstreams<'a, 'p> {
    /// Asks source `owner` for relay track `track` of `broadcast` (one
    /// SUBSCRIBE, made by the session of that source).
    fn subscribe(
        &self,
        owner: SourceId,
        broadcast: broadcast::Ref<'a, 'p>,
        track: track::Ref<'a, 'p>,
    );
}

/// The way an announcement came: its completed hop list (docs/protocol.md
/// §4.3) and whether a cluster peer forwarded it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Via {
    /// The hops the broadcast crossed, origin first, the announcing one
    /// last (what this node writes when it offers the route on).
    pub hops: HopList,
    /// Forwarded (by a cluster peer, or by a session passing on another's
    /// broadcast): ranked with the shared tie-break, not as a broadcast
    /// published on this node ([`HopList::rank`]).
    pub peer: bool,
    /// Announced by a session marked as a cluster peer: counted against
    /// [`RouterLimits::peer_announces`], not [`RouterLimits::announces`]
    /// (a client cannot earn the larger quota by sending a hop list).
    pub cluster: bool,
}

impl Via {
    /// The ordering key of a route to `path` by this way (lower wins);
    /// `local`: announced by a source of this worker. A route a source of
    /// this worker publishes itself is one published on this node; a
    /// forwarded one or a link's is not.
    fn rank(&self, path: &str, local: bool) -> (bool, bool, usize, u64) {
        self.hops.rank(path, local && !self.peer, self.peer)
    }
}

/// One route: a broadcast, who serves it, and where it is offered. Its hop
/// list is the broadcast's ([`broadcast::Ref::hops`]).
pub struct Route<'a, 'p> {
    broadcast: broadcast::Ref<'a, 'p>,
    producer: broadcast::Producer<'a, 'p>,
    owner: SourceId,
    /// Forwarded ([`Via::peer`]).
    peer: bool,
    /// Announced by a source of this worker.
    local: bool,
    /// In the worker's origin; false for a standby.
    routed: bool,
    /// While the source is gone: when the grace period ends.
    orphan_until: Option<Instant>,
}

impl fmt::Debug for Route<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Route")
            .field("path", &self.broadcast.path())
            .field("owner", &self.owner)
            .field("local", &self.local)
            .field("routed", &self.routed)
            .field("orphan_until", &self.orphan_until)
            .finish()
    }
}

/// A source announcing a path another source serves: next in line for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spare {
    path: PathBuf<{ broadcast::MAX_PATH_LEN }>,
    owner: SourceId,
    local: bool,
    /// The way its announcement came.
    via: Via,
    /// Order of arrival: the newest spare of a path takes over first.
    seq: u64,
}

/// A free spare slot and the path a spare there will hold
/// ([`Router::spare_place`]).
type SparePlace<'r> = (
    &'r RefCell<Option<Spare>>,
    PathBuf<{ broadcast::MAX_PATH_LEN }>,
);

/// A relay track made for a client's request, until its source answers.
#[derive(Clone, Copy)]
pub struct Pending<'a, 'p> {
    track: track::Ref<'a, 'p>,
    conn: SourceId,
    broadcast: broadcast::Ref<'a, 'p>,
}

impl Pending<'_, '_> {
    /// Still waiting: the same track, open, without its TRACK_INFO.
    fn waits(&self) -> bool {
        self.track.is_current()
            && !self.track.info_known()
            && self.track.status() == track::Status::Open
    }
}

/// The tables of a [`Router`], made once by the caller (sizes are its
/// configuration): routes, spares, pending track requests.
pub struct RouterStorage<'r, 'a, 'p> {
    /// Routes (routed broadcasts and standbys).
    pub routes: &'r [RefCell<Option<Route<'a, 'p>>>],
    /// Spare sources.
    pub spares: &'r [RefCell<Option<Spare>>],
    /// Track requests waiting for their source's first answer.
    pub pending: &'r [Cell<Option<Pending<'a, 'p>>>],
}

/// What one peer may take of a [`Router`]'s tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouterLimits {
    /// Routes and spares one local source holds at once.
    pub announces: usize,
    /// Routes and spares one cluster peer holds at once ([`Via::cluster`]).
    pub peer_announces: usize,
    /// Track requests of one connection waiting for their source.
    pub pending_per_conn: usize,
    /// Track requests waiting for their source in one broadcast.
    pub pending_per_broadcast: usize,
    /// How long a broadcast whose source left waits for a new one.
    pub grace: Duration,
}

/// Why an announcement was not taken; nothing changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum AnnounceRefused {
    /// The source holds [`RouterLimits::announces`] routes and spares already.
    Quota,
    /// The route, spare or broadcast table is full.
    Full,
    /// The path does not fit a broadcast.
    Path,
    /// The route crosses this node already, or names the announcing peer
    /// twice (a reflection): a loop (docs/protocol.md §4.3).
    Loop,
    /// The route crosses more hops than this node accepts.
    Hops,
}

impl fmt::Display for AnnounceRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AnnounceRefused::Quota => write!(f, "over quota: {}", Quota::Announces),
            AnnounceRefused::Full => f.write_str("route table full"),
            AnnounceRefused::Path => f.write_str("path too long"),
            AnnounceRefused::Loop => f.write_str("route loops through this node"),
            AnnounceRefused::Hops => f.write_str("route crosses too many hops"),
        }
    }
}

/// What became of an announcement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Announced {
    /// A new route (`routed`: in the worker's origin; false: a standby).
    Route {
        /// In the worker's origin (false: a standby, in the local origin only).
        routed: bool,
    },
    /// The source adopted a route whose source was gone; this many open
    /// tracks were asked for again from it.
    Adopted {
        /// Open tracks asked for again.
        tracks: usize,
    },
    /// The source took over a route another client source of this worker
    /// served (the newest announcement wins); `from` waits as a spare now.
    TookOver {
        /// The source that served the route until now.
        from: SourceId,
        /// Open tracks asked for from the new source.
        tracks: usize,
    },
    /// Kept as a spare (or was one already).
    Spare,
    /// The source announced a path it serves again with another route (a
    /// restart, docs/protocol.md §3.6): its hop list was replaced in place.
    Updated,
}

/// Which of a [`Router`]'s per-peer quotas ([`RouterLimits`]) a request
/// went past; a relay names it after its own setting in logs and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Quota {
    /// Routes and spares one local source holds ([`RouterLimits::announces`]).
    Announces,
    /// Track requests of one connection waiting for their source
    /// ([`RouterLimits::pending_per_conn`]).
    PendingTracks,
    /// Track requests of one broadcast waiting for their source
    /// ([`RouterLimits::pending_per_broadcast`]).
    PendingTracksPerBroadcast,
    /// Relay tracks: the [`TrackTable`] has no free place.
    RelayTracks,
}

impl fmt::Display for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Quota::Announces => "announcements per source",
            Quota::PendingTracks => "pending track requests per connection",
            Quota::PendingTracksPerBroadcast => "pending track requests per broadcast",
            Quota::RelayTracks => "relay tracks",
        })
    }
}

/// Why a track request was refused, with the code the request gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum ResolveRefused {
    /// No such broadcast routed, a name that cannot be a track, or every
    /// track place of the broadcast taken: NOT_FOUND.
    NotFound,
    /// Over a quota: EVICTED (0x35, "dropped under memory pressure", the
    /// closest code for a refusal to hold more state).
    Quota(Quota),
}

impl ResolveRefused {
    /// The stream code the request is refused with.
    pub fn code(self) -> StreamCode {
        match self {
            ResolveRefused::NotFound => StreamCode::NotFound,
            ResolveRefused::Quota(_) => StreamCode::Evicted,
        }
    }
}

/// The routing state of one relay worker (see the module docs).
pub struct Router<'r, 'a, 'p, const T: usize, const G: usize> {
    origin: origin::Ref<'a, 'p>,
    local_origin: origin::Ref<'a, 'p>,
    broadcasts: &'r BroadcastTable<'a, 'p, T>,
    tracks: &'r TrackTable<'a, 'p, G>,
    storage: RouterStorage<'r, 'a, 'p>,
    limits: RouterLimits,
    /// The next spare's arrival number.
    next_spare: Cell<u64>,
    /// Routes and spares held (kept as they change: read on every pass).
    held: Cell<(usize, usize)>,
    /// Routes waiting for a new source (their grace running).
    orphans: Cell<usize>,
}

impl<'r, 'a, 'p, const T: usize, const G: usize> Router<'r, 'a, 'p, T, G> {
    /// A router over the worker's `origin` (what its subscribers see) and
    /// `local_origin` (what its links offer other workers), with its tables.
    pub fn new(
        origin: origin::Ref<'a, 'p>,
        local_origin: origin::Ref<'a, 'p>,
        broadcasts: &'r BroadcastTable<'a, 'p, T>,
        tracks: &'r TrackTable<'a, 'p, G>,
        storage: RouterStorage<'r, 'a, 'p>,
        limits: RouterLimits,
    ) -> Self {
        Router {
            origin,
            local_origin,
            broadcasts,
            tracks,
            storage,
            limits,
            next_spare: Cell::new(0),
            held: Cell::new((0, 0)),
            orphans: Cell::new(0),
        }
    }

    /// The worker's origin.
    pub fn origin(&self) -> origin::Ref<'a, 'p> {
        self.origin
    }

    /// The broadcasts of this worker's own sources.
    pub fn local_origin(&self) -> origin::Ref<'a, 'p> {
        self.local_origin
    }

    /// How many relay tracks are claimed, retired (still serving their last
    /// readers) and free.
    pub fn track_counts(&self) -> super::Counts {
        self.tracks.counts()
    }

    /// Routes held now (routed broadcasts, standbys, orphans in their grace). O(1).
    pub fn routes(&self) -> usize {
        self.held.get().0
    }

    /// Spare sources waiting now. O(1).
    pub fn spares(&self) -> usize {
        self.held.get().1
    }

    fn count(&self, routes: isize, spares: isize) {
        let (r, s) = self.held.get();
        self.held.set((
            r.saturating_add_signed(routes),
            s.saturating_add_signed(spares),
        ));
    }

    /// Empties spare slot `s`, if it holds one.
    fn clear_spare(&self, s: &RefCell<Option<Spare>>) -> Option<Spare> {
        let spare = s.borrow_mut().take();
        if spare.is_some() {
            self.count(0, -1);
        }
        spare
    }

    /// Registers broadcast `path` announced by `owner` (`local`: a source of
    /// this worker, not a link or the upstream) at `now`; see the module docs.
    ///
    /// # Errors
    /// [`AnnounceRefused`]; nothing changed then.
    pub fn announce(
        &self,
        path: Path<'_>,
        owner: SourceId,
        local: bool,
        upstreams: &dyn Upstreams<'a, 'p>,
    ) -> Result<Announced, AnnounceRefused> {
        self.announce_via(path, owner, local, &Via::default(), upstreams)
    }

    /// [`Router::announce`] of a route that came `via` (its hop list, a
    /// cluster peer's or not). Among this worker's own sources of one path
    /// the best route by [`HopList::rank`] serves it (equals: the newest);
    /// a source announcing a path it holds again replaces its hop list in
    /// place (a restart), and the best spare takes the route over if it
    /// ranks better now.
    ///
    /// # Errors
    /// [`AnnounceRefused`]; nothing changed then.
    pub fn announce_via(
        &self,
        path: Path<'_>,
        owner: SourceId,
        local: bool,
        via: &Via,
        upstreams: &dyn Upstreams<'a, 'p>,
    ) -> Result<Announced, AnnounceRefused> {
        if let Some(done) = self.restart(path, owner, via, upstreams) {
            return done;
        }
        let quota = if via.cluster {
            self.limits.peer_announces
        } else {
            self.limits.announces
        };
        if local && self.held_by(owner) >= quota {
            return Err(AnnounceRefused::Quota);
        }
        let mut routed = true;
        for slot in self.storage.routes {
            let mut r = slot.borrow_mut();
            let Some(route) = r
                .as_mut()
                .filter(|r| r.routed && r.broadcast.has_path(path))
            else {
                continue;
            };
            if route.orphan_until.is_some() {
                let tracks = self.adopt(route, owner, local, via, true, upstreams);
                return Ok(Announced::Adopted { tracks });
            }
            if local && route.local {
                let held = Via {
                    hops: route.broadcast.hops(),
                    peer: route.peer,
                    ..Via::default()
                };
                if via.rank(path.as_str(), true) <= held.rank(path.as_str(), true) {
                    return self.take_over(route, path, owner, via, upstreams);
                }
                drop(r);
                return self.add_spare(path, owner, local, via);
            }
            let held = route.broadcast.hops();
            let shorter = across(&via.hops) < across(&held);
            if !local && route.local && shorter {
                // Another worker's source has a shorter route: the route
                // moves to its link, this worker's source stands by.
                if let Some((from, tracks)) = self.stand_by(route, path, owner, via, upstreams) {
                    return Ok(Announced::TookOver { from, tracks });
                }
            }
            if !local && !route.local && shorter {
                // Served by another worker, the upstream, or this worker's
                // standby source: the shorter route takes over. The old
                // source waits as a spare, unless it stands by already.
                let old = route.owner;
                let was = Via {
                    hops: held,
                    peer: route.peer,
                    ..Via::default()
                };
                let stands = self
                    .standby_of(route.broadcast, owner)
                    .is_some_and(|(s, _)| s == old);
                let place = if stands {
                    None
                } else {
                    self.spare_place(path, old)?
                };
                let tracks = self.move_to(route, owner, false, via, upstreams);
                if let Some(place) = place {
                    self.put_spare(place, old, false, &was);
                }
                return Ok(Announced::TookOver { from: old, tracks });
            }
            let standby = self.local_origin.get(path).is_some();
            if local && !route.local && !standby && shorter {
                // Shorter than the other worker's: this source serves here,
                // and is offered to that worker, which moves to it in turn.
                return self.take_over(route, path, owner, via, upstreams);
            }
            if !local || standby {
                drop(r);
                return self.add_spare(path, owner, local, via);
            }
            routed = false;
            break;
        }
        let slot = self
            .storage
            .routes
            .iter()
            .find(|s| s.borrow().is_none())
            .ok_or(AnnounceRefused::Full)?;
        let broadcast = self.broadcasts.claim(path).map_err(|e| match e {
            ClaimError::Full => AnnounceRefused::Full,
            ClaimError::Path => AnnounceRefused::Path,
        })?;
        let Ok(producer) = broadcast.producer() else {
            self.broadcasts.retire(broadcast);
            return Err(AnnounceRefused::Full);
        };
        producer.set_hops(&via.hops);
        if routed && self.origin.announce(broadcast).is_err() {
            drop(producer);
            self.broadcasts.retire(broadcast);
            return Err(AnnounceRefused::Full);
        }
        if local {
            // A full local origin only means the other workers do not see it.
            let _ = self.local_origin.announce(broadcast);
        }
        self.count(1, 0);
        *slot.borrow_mut() = Some(Route {
            broadcast,
            producer,
            owner,
            peer: via.peer,
            local,
            routed,
            orphan_until: None,
        });
        Ok(Announced::Route { routed })
    }

    /// Routes and spares `owner` holds.
    fn held_by(&self, owner: SourceId) -> usize {
        let routes = self
            .storage
            .routes
            .iter()
            .filter(|r| r.borrow().as_ref().is_some_and(|r| r.owner == owner))
            .count();
        let spares = self
            .storage
            .spares
            .iter()
            .filter(|s| s.borrow().as_ref().is_some_and(|s| s.owner == owner))
            .count();
        routes + spares
    }

    /// Routes and spares `owner` holds now, for a relay's per-peer figures.
    /// O(routes + spares).
    pub fn routes_of(&self, owner: SourceId) -> usize {
        self.held_by(owner)
    }

    /// A source announcing `path` again while it serves it or waits as its
    /// spare: a restart (docs/protocol.md §3.6). A serving source's hop list
    /// is replaced in place; a routed broadcast is announced again with it
    /// (its subscribers' relays see the new route), and the best spare of
    /// the path takes the route over if it ranks better than the new one. A
    /// spare is taken off the list, and `None` returned: its announcement is
    /// then handled as a new one (it may take the route over). `None` too if
    /// `owner` holds no route of `path`.
    fn restart(
        &self,
        path: Path<'_>,
        owner: SourceId,
        via: &Via,
        upstreams: &dyn Upstreams<'a, 'p>,
    ) -> Option<Result<Announced, AnnounceRefused>> {
        for s in self.storage.spares {
            let mine = s
                .borrow()
                .as_ref()
                .is_some_and(|s| s.owner == owner && s.path.as_path() == path);
            if mine {
                // A spare's new route is ranked afresh against the serving
                // one, as a new announcement is.
                self.clear_spare(s);
                return None;
            }
        }
        let mut found = None;
        for slot in self.storage.routes {
            let mut r = slot.borrow_mut();
            let Some(route) = r.as_mut().filter(|r| {
                r.owner == owner && r.orphan_until.is_none() && r.broadcast.has_path(path)
            }) else {
                continue;
            };
            route.peer = via.peer;
            self.set_route(route, &via.hops);
            let mut outcome = Announced::Updated;
            if !route.routed {
                // A standby now shorter than the link serving the path takes
                // the route over.
                drop(r);
                if let Some((from, tracks)) = self.standby_rises(path, owner, via, upstreams) {
                    outcome = Announced::TookOver { from, tracks };
                }
            } else if !route.local {
                // Served by another worker (or the upstream): this worker's
                // standby takes over if it is now shorter.
                let standby = self
                    .standby_of(route.broadcast, owner)
                    .filter(|(_, sv)| across(&sv.hops) < across(&via.hops));
                if let Some((standby, sv)) = standby
                    && let Ok(place) = self.spare_place(path, owner)
                {
                    let tracks = self.move_to(route, standby, false, &sv, upstreams);
                    if let Some(place) = place {
                        self.put_spare(place, owner, false, via);
                    }
                    outcome = Announced::TookOver {
                        from: owner,
                        tracks,
                    };
                }
            } else if let Some((s, spare)) = self.best_spare(route.broadcast) {
                // The best spare takes over if it ranks better now: a source
                // of this worker by the full order, another worker's only
                // with a shorter route (its own source standing by).
                let better = if spare.local {
                    spare.via.rank(path.as_str(), true) < via.rank(path.as_str(), true)
                } else {
                    across(&spare.via.hops) < across(&via.hops)
                };
                if better && let Some(spare) = self.clear_spare(s) {
                    let took = if spare.local {
                        self.take_over(route, path, spare.owner, &spare.via, upstreams)
                            .ok()
                            .map(|a| match a {
                                Announced::TookOver { tracks, .. } => tracks,
                                _ => 0,
                            })
                    } else {
                        self.stand_by(route, path, spare.owner, &spare.via, upstreams)
                            .map(|(_, tracks)| tracks)
                    };
                    match took {
                        Some(tracks) => {
                            outcome = Announced::TookOver {
                                from: owner,
                                tracks,
                            }
                        }
                        // Nothing changed: the spare waits again.
                        None => {
                            if let Ok(Some(place)) = self.spare_place(path, spare.owner) {
                                self.put_spare(place, spare.owner, spare.local, &spare.via);
                            }
                        }
                    }
                }
            }
            // A source may hold a standby and a route of one path: a take-over
            // by either is what the restart did.
            if found.is_none() || matches!(outcome, Announced::TookOver { .. }) {
                found = Some(Ok(outcome));
            }
        }
        found
    }

    /// The standby of `path` held by `owner` announced the route `via`: if
    /// the route serving the path here is another worker's (or the
    /// upstream's) and longer ([`across`]), `owner` takes it over (not
    /// local: its standby stays what the links offer) and the old source
    /// waits as a spare. Returns the old source and how many tracks were
    /// asked for.
    fn standby_rises(
        &self,
        path: Path<'_>,
        owner: SourceId,
        via: &Via,
        upstreams: &dyn Upstreams<'a, 'p>,
    ) -> Option<(SourceId, usize)> {
        for slot in self.storage.routes {
            let Ok(mut r) = slot.try_borrow_mut() else {
                continue;
            };
            let Some(route) = r.as_mut().filter(|r| {
                r.routed
                    && !r.local
                    && r.owner != owner
                    && r.orphan_until.is_none()
                    && r.broadcast.has_path(path)
            }) else {
                continue;
            };
            let held = Via {
                hops: route.broadcast.hops(),
                peer: route.peer,
                ..Via::default()
            };
            if across(&via.hops) >= across(&held.hops) {
                return None;
            }
            let old = route.owner;
            let place = self.spare_place(path, old).ok()?;
            let tracks = self.move_to(route, owner, false, via, upstreams);
            if let Some(place) = place {
                self.put_spare(place, old, false, &held);
            }
            return Some((old, tracks));
        }
        None
    }

    /// Gives `route`'s broadcast the hop list `hops`, and announces it again
    /// in the origins that offer it if the list changed.
    fn set_route(&self, route: &Route<'a, 'p>, hops: &HopList) {
        let b = route.broadcast;
        if b.hops() == *hops {
            return;
        }
        route.producer.set_hops(hops);
        if route.orphan_until.is_some() {
            return;
        }
        let held = b.path();
        let path = held.as_path();
        let mine = |o: origin::Ref<'a, 'p>| o.get(path).is_some_and(|x| x.same_broadcast(&b));
        if mine(self.origin) {
            self.origin.reannounce(path);
        }
        if mine(self.local_origin) {
            self.local_origin.reannounce(path);
        }
    }

    fn add_spare(
        &self,
        path: Path<'_>,
        owner: SourceId,
        local: bool,
        via: &Via,
    ) -> Result<Announced, AnnounceRefused> {
        if let Some(place) = self.spare_place(path, owner)? {
            self.put_spare(place, owner, local, via);
        }
        Ok(Announced::Spare)
    }

    /// Where `owner` would wait as a spare of `path`: a free slot and the
    /// path held, or `None` if it is a spare of the path already.
    ///
    /// # Errors
    /// [`AnnounceRefused::Full`] with no free slot, [`AnnounceRefused::Path`]
    /// for a path too long to hold; nothing changed then.
    fn spare_place(
        &self,
        path: Path<'_>,
        owner: SourceId,
    ) -> Result<Option<SparePlace<'r>>, AnnounceRefused> {
        let known = self.storage.spares.iter().any(|s| {
            s.borrow()
                .as_ref()
                .is_some_and(|s| s.owner == owner && s.path.as_path() == path)
        });
        if known {
            return Ok(None);
        }
        let slot = self
            .storage
            .spares
            .iter()
            .find(|s| s.borrow().is_none())
            .ok_or(AnnounceRefused::Full)?;
        let path = PathBuf::from_path(path).map_err(|_| AnnounceRefused::Path)?;
        Ok(Some((slot, path)))
    }

    /// Makes `owner` the newest spare in `place` ([`Router::spare_place`]).
    fn put_spare(&self, (slot, path): SparePlace<'r>, owner: SourceId, local: bool, via: &Via) {
        let seq = self.next_spare.get();
        self.next_spare.set(seq.wrapping_add(1));
        self.count(0, 1);
        *slot.borrow_mut() = Some(Spare {
            path,
            owner,
            local,
            via: *via,
            seq,
        });
    }

    /// Client source `owner` announced `path`, which another client source
    /// of this worker routes: the newest announcement wins (see the module
    /// docs). The route's current producers are let go first (each open
    /// track's producer is detached, its open group aborted with CANCEL), so
    /// the new source's subscriptions can take the tracks; every open track
    /// is then asked for from `owner`, and the old source becomes a spare of
    /// the path. Its session still holds the detached producers: the groups
    /// they would create are refused, and its peer forgets those upstream
    /// subscriptions ([`super::Peer`]).
    ///
    /// # Errors
    /// [`AnnounceRefused::Full`] when no spare place is free for the old
    /// source; nothing changed then.
    fn take_over(
        &self,
        route: &mut Route<'a, 'p>,
        path: Path<'_>,
        owner: SourceId,
        via: &Via,
        upstreams: &dyn Upstreams<'a, 'p>,
    ) -> Result<Announced, AnnounceRefused> {
        let (old, was_local) = (route.owner, route.local);
        let was = Via {
            hops: route.broadcast.hops(),
            peer: route.peer,
            ..Via::default()
        };
        let place = self.spare_place(path, old)?;
        let tracks = self.move_to(route, owner, true, via, upstreams);
        if let Some(place) = place {
            self.put_spare(place, old, was_local, &was);
        }
        Ok(Announced::TookOver { from: old, tracks })
    }

    /// Moves routed `route`, served by a source of this worker, to the
    /// worker link `owner` whose route `via` is shorter ([`across`]); the
    /// source stands by (a broadcast of its own in the local origin, which
    /// the other workers see). Returns the source and how many tracks were
    /// asked for from the link, or `None` (nothing changed) without a free
    /// route or broadcast place.
    fn stand_by(
        &self,
        route: &mut Route<'a, 'p>,
        path: Path<'_>,
        owner: SourceId,
        via: &Via,
        upstreams: &dyn Upstreams<'a, 'p>,
    ) -> Option<(SourceId, usize)> {
        let slot = self
            .storage
            .routes
            .iter()
            .find(|s| s.try_borrow().is_ok_and(|r| r.is_none()))?;
        let broadcast = self.broadcasts.claim(path).ok()?;
        let Ok(producer) = broadcast.producer() else {
            self.broadcasts.retire(broadcast);
            return None;
        };
        let (from, peer) = (route.owner, route.peer);
        producer.set_hops(&route.broadcast.hops());
        let tracks = self.move_to(route, owner, false, via, upstreams);
        let _ = self.local_origin.announce(broadcast);
        self.count(1, 0);
        *slot.borrow_mut() = Some(Route {
            broadcast,
            producer,
            owner: from,
            peer,
            local: true,
            routed: false,
            orphan_until: None,
        });
        Some((from, tracks))
    }

    /// Moves `route` to `owner` at once: each open track's producer is let
    /// go (its open group aborted with CANCEL) and the track is asked for
    /// from `owner`; its subscribers stay and go on at the new source's
    /// latest group. Returns how many tracks were asked for.
    fn move_to(
        &self,
        route: &mut Route<'a, 'p>,
        owner: SourceId,
        local: bool,
        via: &Via,
        upstreams: &dyn Upstreams<'a, 'p>,
    ) -> usize {
        for t in route.broadcast.tracks() {
            t.detach_producer(StreamCode::Cancel.to_code());
        }
        self.adopt(route, owner, local, via, false, upstreams)
    }

    /// The source serving broadcast `b` now (a routed broadcast's, or a
    /// standby's), if a route holds `b`. O(routes).
    pub fn source_of(&self, b: broadcast::Ref<'_, '_>) -> Option<SourceId> {
        self.storage.routes.iter().find_map(|slot| {
            let r = slot.try_borrow().ok()?;
            let r = r.as_ref()?;
            r.broadcast.same_broadcast(&b).then_some(r.owner)
        })
    }

    /// Makes `owner` the source of orphaned `route`: every open track of it
    /// is asked for again from `owner`, and every track the old source ended
    /// leaves the broadcast (given back to the track table once its last
    /// readers are done), so a request for its name reaches the new source.
    /// Returns how many tracks were asked for.
    ///
    /// `settled`: the old source's session is not about to drop its
    /// producers (it is a worker link that withdrew the path and lives on,
    /// or it was dropped long ago). A track it still fills then goes on
    /// being filled by that subscription (the far worker fails over on its
    /// own): under the same source it stays; under a new one it leaves the
    /// broadcast like a finished track, or, while its request has no answer
    /// yet, stays and waits for it ([`Router::upstream_unroutable`] asks
    /// the new source if the old one refuses). Unsettled (the source's
    /// session is closing right now), every open track is asked for again.
    fn adopt(
        &self,
        route: &mut Route<'a, 'p>,
        owner: SourceId,
        local: bool,
        via: &Via,
        settled: bool,
        upstreams: &dyn Upstreams<'a, 'p>,
    ) -> usize {
        let same = route.owner == owner;
        route.owner = owner;
        route.peer = via.peer;
        if route.orphan_until.take().is_some() {
            self.orphans.set(self.orphans.get().saturating_sub(1));
        }
        self.set_route(route, &via.hops);
        let b = route.broadcast;
        let held = b.path();
        let path = held.as_path();
        if self.origin.get(path).is_none() {
            let _ = self.origin.announce(b);
        }
        if route.local && !local {
            self.local_origin.unannounce(path);
        }
        if local && self.local_origin.get(path).is_none() {
            let _ = self.local_origin.announce(b);
        }
        route.local = local;
        let mut asked = 0;
        for t in b.tracks() {
            let fed = settled && t.has_producer();
            if t.status() == track::Status::Open && !fed {
                upstreams.subscribe(owner, b, t);
                asked += 1;
            } else if t.status() == track::Status::Open && (same || !t.info_known()) {
                // Still filled, or still asked, by a subscription that goes on.
            } else {
                // A finished track is over (its subscribers got its end), or
                // the old source goes on filling it for its readers: the new
                // source's track of that name is a new one.
                route.producer.remove(t.info().name.as_str());
                self.tracks.retire(t);
            }
        }
        asked
    }

    /// Withdraws `path` if `owner` announced it (the source ended it); its
    /// tracks end with CANCEL. True if a route was withdrawn. (A source
    /// may hold two routes of one path: its standby, and the route it
    /// adopted from the source that one stood by for.)
    pub fn unannounce(&self, path: Path<'_>, owner: SourceId) -> bool {
        for s in self.storage.spares {
            let mine = s
                .borrow()
                .as_ref()
                .is_some_and(|s| s.owner == owner && s.path.as_path() == path);
            if mine {
                self.clear_spare(s);
            }
        }
        let mut withdrawn = false;
        for slot in self.storage.routes {
            let mine = slot.borrow().as_ref().is_some_and(|r| {
                r.owner == owner && r.orphan_until.is_none() && r.broadcast.has_path(path)
            });
            if mine && let Some(route) = slot.borrow_mut().take() {
                self.withdraw(route, StreamCode::Cancel);
                withdrawn = true;
            }
        }
        withdrawn
    }

    /// The worker link `owner` withdrew `path`; see the module docs ("a
    /// worker link's withdrawal"). True if a route of `owner` was there.
    ///
    /// A link cannot say whether the other worker's source ended the
    /// broadcast or was lost (that worker then runs the grace period for
    /// its own subscribers), and a source announcing the path again may
    /// already be on its way, over the link or on this worker. So the route
    /// is handled as if its source were gone ([`Router::source_gone`]):
    /// adopted at once by a spare or by this worker's standby of the path,
    /// or kept for the grace period, within which the next announcement
    /// adopts it and the requests still waiting on it (a request the link
    /// refused as unroutable, [`Router::upstream_unroutable`]) are asked of
    /// the new source instead of being refused. The subscriptions the link
    /// still serves end as the other worker ends them.
    pub fn source_left(
        &self,
        path: Path<'_>,
        owner: SourceId,
        now: Instant,
        upstreams: &dyn Upstreams<'a, 'p>,
    ) -> bool {
        for s in self.storage.spares {
            let mine = s
                .borrow()
                .as_ref()
                .is_some_and(|s| s.owner == owner && s.path.as_path() == path);
            if mine {
                self.clear_spare(s);
            }
        }
        for slot in self.storage.routes {
            let mut r = slot.borrow_mut();
            let Some(route) = r.as_mut().filter(|r| {
                r.owner == owner && r.orphan_until.is_none() && r.broadcast.has_path(path)
            }) else {
                continue;
            };
            if !route.routed {
                if let Some(route) = r.take() {
                    drop(r);
                    self.withdraw(route, StreamCode::SessionClosed);
                }
                return true;
            }
            self.lose(route, owner, true, now, upstreams);
            return true;
        }
        false
    }

    /// Source `owner` is gone (its session ended, or its announce stream):
    /// see the module docs. Returns how many of its routes now wait for a
    /// new source until `now` plus the grace period.
    pub fn source_gone(
        &self,
        owner: SourceId,
        now: Instant,
        upstreams: &dyn Upstreams<'a, 'p>,
    ) -> usize {
        for s in self.storage.spares {
            if s.borrow().as_ref().is_some_and(|s| s.owner == owner) {
                self.clear_spare(s);
            }
        }
        let mut orphaned = 0;
        for slot in self.storage.routes {
            let mut r = slot.borrow_mut();
            let Some(route) = r.as_mut().filter(|r| r.owner == owner) else {
                continue;
            };
            if !route.routed {
                // A standby: nothing waits on it.
                if let Some(route) = r.take() {
                    drop(r);
                    self.withdraw(route, StreamCode::SessionClosed);
                }
                continue;
            }
            if route.orphan_until.is_some() {
                continue;
            }
            // The session is closing: it still holds its producers.
            if self.lose(route, owner, false, now, upstreams) {
                orphaned += 1;
            }
        }
        orphaned
    }

    /// `route`'s source `gone` is gone: a spare takes over at once (the
    /// announcement stays), else this worker's standby of the path (its
    /// source adopts the route and keeps the standby, which is what the
    /// other workers see), else the route is unannounced and waits for the
    /// grace period. `settled`: see [`Router::adopt`]. True if it waits.
    fn lose(
        &self,
        route: &mut Route<'a, 'p>,
        gone: SourceId,
        settled: bool,
        now: Instant,
        upstreams: &dyn Upstreams<'a, 'p>,
    ) -> bool {
        if let Some(spare) = self.take_spare(route.broadcast) {
            self.adopt(
                route,
                spare.owner,
                spare.local,
                &spare.via,
                settled,
                upstreams,
            );
            return false;
        }
        if let Some((standby, via)) = self.standby_of(route.broadcast, gone) {
            // Not local: the standby stays what the links offer.
            self.adopt(route, standby, false, &via, settled, upstreams);
            return false;
        }
        let held = route.broadcast.path();
        self.origin.unannounce(held.as_path());
        if route.local {
            self.local_origin.unannounce(held.as_path());
        }
        route.orphan_until = Some(now.saturating_add(self.limits.grace));
        self.orphans.set(self.orphans.get() + 1);
        true
    }

    /// The source of this worker's standby of `b`'s path, unless it is
    /// `except`. The route being changed is borrowed, so it is skipped.
    fn standby_of(&self, b: broadcast::Ref<'_, '_>, except: SourceId) -> Option<(SourceId, Via)> {
        let held = b.path();
        self.storage.routes.iter().find_map(|slot| {
            let r = slot.try_borrow().ok()?;
            let r = r.as_ref()?;
            (!r.routed && r.local && r.owner != except && r.broadcast.has_path(held.as_path()))
                .then(|| {
                    let via = Via {
                        hops: r.broadcast.hops(),
                        peer: r.peer,
                        ..Via::default()
                    };
                    (r.owner, via)
                })
        })
    }

    /// The best spare of `b`'s path, taken off the spare list: this
    /// worker's own sources first, then by [`HopList::rank`], then the
    /// newest (the last to arrive, or the source most recently displaced by
    /// a newer one).
    fn take_spare(&self, b: broadcast::Ref<'_, '_>) -> Option<Spare> {
        self.best_spare(b).and_then(|(s, _)| self.clear_spare(s))
    }

    /// The spare [`Router::take_spare`] would take, with its slot.
    fn best_spare(&self, b: broadcast::Ref<'_, '_>) -> Option<(&'r RefCell<Option<Spare>>, Spare)> {
        let held = b.path();
        let path = held.as_str();
        self.storage
            .spares
            .iter()
            .filter_map(|s| {
                let spare = s
                    .borrow()
                    .as_ref()
                    .filter(|x| b.has_path(x.path.as_path()))
                    .cloned()?;
                Some((s, spare))
            })
            .min_by_key(|(_, x)| (x.via.rank(path, x.local), core::cmp::Reverse(x.seq)))
    }

    /// Source `owner` withdrew `path` (ANNOUNCE Ended). The best spare of a
    /// route it served takes it over at once, as a better announcement
    /// does (live tracks move to it, their subscribers go on at its latest
    /// group); without one, a client's route is withdrawn
    /// ([`Router::unannounce`]) and a cluster peer's (`keep`) waits for the
    /// grace period as a lost source's does (the next route may be on its
    /// way through another peer). True if a route of `owner` was there.
    pub fn withdrawn(
        &self,
        path: Path<'_>,
        owner: SourceId,
        keep: bool,
        now: Instant,
        upstreams: &dyn Upstreams<'a, 'p>,
    ) -> bool {
        for slot in self.storage.routes {
            let mut r = slot.borrow_mut();
            let Some(route) = r.as_mut().filter(|r| {
                r.owner == owner
                    && r.routed
                    && r.orphan_until.is_none()
                    && r.broadcast.has_path(path)
            }) else {
                continue;
            };
            if let Some(spare) = self.take_spare(route.broadcast) {
                self.move_to(route, spare.owner, spare.local, &spare.via, upstreams);
                drop(r);
                // Its standby of the path, if any, goes too.
                self.unannounce(path, owner);
                return true;
            }
            if keep {
                drop(r);
                return self.source_left(path, owner, now, upstreams);
            }
            break;
        }
        self.unannounce(path, owner)
    }

    /// When [`Router::handle_timeout`] has something to do: the end of the
    /// earliest grace period running.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.orphans.get() == 0 {
            return None;
        }
        self.storage
            .routes
            .iter()
            .filter_map(|r| r.borrow().as_ref().and_then(|r| r.orphan_until))
            .min()
    }

    /// Withdraws every route whose grace period is over at `now` (its tracks
    /// end with SESSION_CLOSED); returns how many.
    pub fn handle_timeout(&self, now: Instant) -> usize {
        if self.orphans.get() == 0 {
            return 0;
        }
        let mut ended = 0;
        for slot in self.storage.routes {
            let due = slot
                .borrow()
                .as_ref()
                .is_some_and(|r| r.orphan_until.is_some_and(|t| t <= now));
            if due && let Some(route) = slot.borrow_mut().take() {
                self.withdraw(route, StreamCode::SessionClosed);
                ended += 1;
            }
        }
        ended
    }

    /// Ends a route: out of both origins, tracks still waiting for a source
    /// aborted with `code`, the broadcast and tracks given back to their
    /// tables (reused once their last users are gone).
    fn withdraw(&self, route: Route<'a, 'p>, code: StreamCode) {
        self.count(-1, 0);
        let Route {
            broadcast,
            mut producer,
            routed,
            local,
            orphan_until,
            ..
        } = route;
        if orphan_until.is_some() {
            self.orphans.set(self.orphans.get().saturating_sub(1));
        } else {
            let held = broadcast.path();
            if routed {
                self.origin.unannounce(held.as_path());
            }
            if local {
                self.local_origin.unannounce(held.as_path());
            }
        }
        for t in broadcast.tracks() {
            end_track(t, code);
            self.tracks.retire(t);
        }
        producer.finish();
        drop(producer);
        self.broadcasts.retire(broadcast);
    }

    /// The relay track `name` of `broadcast`, made now for connection `conn`
    /// (`None`: a trunk, not held to the client quotas), and one upstream
    /// SUBSCRIBE for it from the route's source (unless the route waits for
    /// a new source, which asks for every track anyway).
    ///
    /// # Errors
    /// [`ResolveRefused`]; nothing is kept for a refused request.
    pub fn resolve(
        &self,
        conn: Option<SourceId>,
        broadcast: broadcast::Ref<'a, 'p>,
        name: &str,
        upstreams: &dyn Upstreams<'a, 'p>,
    ) -> Result<track::Ref<'a, 'p>, ResolveRefused> {
        let found = self.storage.routes.iter().find(|r| {
            r.borrow()
                .as_ref()
                .is_some_and(|r| r.broadcast.same_broadcast(&broadcast))
        });
        let slot = found.ok_or(ResolveRefused::NotFound)?;
        let route = slot.borrow();
        let route = route.as_ref().ok_or(ResolveRefused::NotFound)?;
        let info = track::Info::new(name).map_err(|_| ResolveRefused::NotFound)?;
        let pending = self.storage.pending;
        for p in pending {
            if p.get().is_some_and(|p| !p.waits()) {
                p.set(None);
            }
        }
        let waiting = || pending.iter().filter_map(Cell::get);
        if let Some(conn) = conn {
            if waiting().filter(|p| p.conn == conn).count() >= self.limits.pending_per_conn {
                return Err(ResolveRefused::Quota(Quota::PendingTracks));
            }
            if waiting()
                .filter(|p| p.broadcast.same_broadcast(&broadcast))
                .count()
                >= self.limits.pending_per_broadcast
            {
                return Err(ResolveRefused::Quota(Quota::PendingTracksPerBroadcast));
            }
        }
        let t = self
            .tracks
            .claim(info)
            .map_err(|_| ResolveRefused::Quota(Quota::RelayTracks))?;
        // Its TRACK_INFO is the source's: TRACK requests wait for it.
        t.await_info();
        // The track outlives a source that goes away (failover).
        t.set_failover(true);
        if route.producer.add(t).is_err() {
            // The broadcast's track places are all taken.
            self.tracks.retire(t);
            return Err(ResolveRefused::NotFound);
        }
        if let Some(conn) = conn
            && let Some(free) = pending.iter().find(|p| p.get().is_none())
        {
            free.set(Some(Pending {
                track: t,
                conn,
                broadcast,
            }));
        }
        if route.orphan_until.is_none() {
            upstreams.subscribe(route.owner, broadcast, t);
        }
        Ok(t)
    }

    /// The upstream subscription of relay track `t` is over (`code`: its
    /// error, `None` for a clean end). A track that finished stays in the
    /// cache while its source serves the route (late subscribers still get
    /// its groups and end); one the source
    /// refused or abandoned ends with the code and leaves its broadcast, so
    /// the next request asks again. True if the track ended here.
    pub fn upstream_closed(&self, t: track::Ref<'a, 'p>, code: Option<StreamCode>) -> bool {
        let finished = code.is_none() && t.status() == track::Status::Finished;
        if finished {
            return false;
        }
        end_track(t, code.unwrap_or(StreamCode::Internal));
        self.drop_track(t);
        true
    }

    /// Source `from` refused the upstream request of relay track `t` as
    /// unroutable: it does not serve `t`'s path (any more). From a worker
    /// link, that is the other worker's withdrawal overtaking its
    /// announcement on the way here, or a request it answered after a
    /// source withdrew there and before the next one announced; the
    /// requests waiting on `t` should wait for the next source within the
    /// grace period rather than be refused (see [`Router::source_left`]):
    ///
    /// * `t`'s route waits for a new source: `t` waits with it, and is
    ///   asked of the source that adopts it.
    /// * `t`'s route has a new source already: `t` is asked of it.
    /// * `t`'s route is still `from`'s: the withdrawal is on its way; the
    ///   route waits for a new source from now on.
    /// * `t` is in no route: it ends with UNROUTABLE, as
    ///   [`Router::upstream_closed`] does.
    ///
    /// The wait is bounded twice: by the grace period, after which the
    /// route is withdrawn and `t` ends with SESSION_CLOSED, and by the
    /// tables it holds (a relay track, and a place among the requests
    /// waiting for their source, [`RouterLimits::pending_per_conn`] and
    /// [`RouterLimits::pending_per_broadcast`]), which refuse new requests
    /// once full. True if `t` ended here.
    pub fn upstream_unroutable(
        &self,
        t: track::Ref<'a, 'p>,
        from: SourceId,
        now: Instant,
        upstreams: &dyn Upstreams<'a, 'p>,
    ) -> bool {
        let name = t.info().name;
        for slot in self.storage.routes {
            let mut r = slot.borrow_mut();
            let Some(route) = r.as_mut().filter(|r| {
                r.broadcast
                    .track(name.as_str())
                    .is_some_and(|x| x.same_track(&t))
            }) else {
                continue;
            };
            if t.status() != track::Status::Open || !route.routed {
                break;
            }
            if route.orphan_until.is_none() {
                if route.owner != from {
                    upstreams.subscribe(route.owner, route.broadcast, t);
                } else {
                    self.lose(route, from, true, now, upstreams);
                }
            }
            return false;
        }
        self.upstream_closed(t, Some(StreamCode::Unroutable))
    }

    /// The open track `name` of the broadcast `path` while its route waits
    /// for a new source (unannounced, within its grace period): a TRACK
    /// request already waiting for it goes on waiting
    /// ([`crate::session::Resolve::waiting`]).
    pub fn waiting(&self, path: Path<'_>, name: &str) -> Option<track::Ref<'a, 'p>> {
        if self.orphans.get() == 0 {
            return None;
        }
        self.storage.routes.iter().find_map(|slot| {
            let r = slot.borrow();
            let route = r
                .as_ref()
                .filter(|r| r.orphan_until.is_some() && r.broadcast.has_path(path))?;
            route
                .broadcast
                .track(name)
                .filter(|t| t.status() == track::Status::Open)
        })
    }

    /// Forgets relay track `t` (its upstream subscription ended or was
    /// cancelled): out of its broadcast and back to the track table, so the
    /// next request for its name makes a new one. A newer track of the same
    /// name is left alone. O(routes).
    pub fn drop_track(&self, t: track::Ref<'a, 'p>) {
        let name = t.info().name;
        for slot in self.storage.routes {
            let r = slot.borrow();
            let Some(route) = r.as_ref() else {
                continue;
            };
            if route
                .broadcast
                .track(name.as_str())
                .is_some_and(|x| x.same_track(&t))
            {
                route.producer.remove(name.as_str());
                self.tracks.retire(t);
                return;
            }
        }
    }

    /// Takes back the broadcasts and tracks given up whose last users are
    /// gone; returns how many tracks came back.
    pub fn reclaim(&self) -> usize {
        self.broadcasts.reclaim();
        self.tracks.reclaim()
    }
}

impl<const T: usize, const G: usize> fmt::Debug for Router<'_, '_, '_, T, G> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Router")
            .field("routes", &self.routes())
            .field("spares", &self.spares())
            .field("tracks", &self.tracks.counts())
            .finish()
    }
}

/// How routes held by two workers of one relay compare (lower wins): a
/// route that crossed an anonymous hop last, then the shorter list. Both
/// workers see the same lists (a link passes them on unchanged), so they
/// agree; a tie leaves the route where it is.
fn across(hops: &HopList) -> (bool, usize) {
    (hops.is_anonymous(), hops.len())
}

/// Ends relay track `t` with `code` unless it finished or has a source:
/// readers get the error, downstream subscriptions pass it on.
pub fn end_track(t: track::Ref<'_, '_>, code: StreamCode) {
    t.set_failover(false);
    if t.status() == track::Status::Open
        && let Ok(mut p) = t.producer()
    {
        p.abort(code.to_code());
    }
}

#[cfg(test)]
mod tests {
    //! The router's rules in simulated time: producers and consumers of the
    //! media model stand in for the sessions around it.
    extern crate std;

    use core::cell::RefCell;
    use std::vec::Vec;

    use super::*;
    use crate::pool::{Pool, PoolStorage};
    use crate::relay::{BroadcastSlot, TrackSlot};
    use crate::window::Start;

    const T: usize = 4;
    const G: usize = 4;
    const GRACE: Duration = Duration::from_secs(10);

    fn path(s: &str) -> Path<'_> {
        Path::new(s).unwrap()
    }

    /// Upstream SUBSCRIBEs asked for, as (owner, path, track).
    #[derive(Default)]
    struct Asked<'a, 'p>(RefCell<Vec<(SourceId, std::string::String, track::Ref<'a, 'p>)>>);

    impl<'a, 'p> Upstreams<'a, 'p> for Asked<'a, 'p> {
        fn subscribe(&self, owner: SourceId, b: broadcast::Ref<'a, 'p>, t: track::Ref<'a, 'p>) {
            self.0
                .borrow_mut()
                .push((owner, b.path().as_str().into(), t));
        }
    }

    impl Asked<'_, '_> {
        fn take(&self) -> Vec<(SourceId, std::string::String)> {
            self.0
                .borrow_mut()
                .drain(..)
                .map(|(o, p, _)| (o, p))
                .collect()
        }
    }

    /// A router over small tables, built in the caller's frame.
    macro_rules! router {
        ($pool:ident, $r:ident, $limits:expr) => {
            let mut ps = PoolStorage::<32, 64>::new();
            let $pool = Pool::new(&mut ps);
            let o = origin::State::<8, 16>::new();
            let lo = origin::State::<8, 16>::new();
            let bslots: Vec<BroadcastSlot<'_, '_, T>> =
                (0..4).map(|_| BroadcastSlot::new()).collect();
            let tslots: Vec<TrackSlot<'_, G>> = (0..4)
                .map(|_| TrackSlot::new(&$pool, track::Limits::NONE))
                .collect();
            let broadcasts = BroadcastTable::new(&bslots);
            let tracks = TrackTable::new(&tslots);
            let routes: Vec<RefCell<Option<Route<'_, '_>>>> =
                (0..4).map(|_| RefCell::new(None)).collect();
            let spares: Vec<RefCell<Option<Spare>>> = (0..4).map(|_| RefCell::new(None)).collect();
            let pending: Vec<Cell<Option<Pending<'_, '_>>>> =
                (0..4).map(|_| Cell::new(None)).collect();
            let $r = Router::new(
                o.handle(),
                lo.handle(),
                &broadcasts,
                &tracks,
                RouterStorage {
                    routes: &routes,
                    spares: &spares,
                    pending: &pending,
                },
                $limits,
            );
        };
    }

    /// Announces "cam" from `src` (`local`: a source of this worker) and
    /// resolves its "video" for `sub`: the broadcast and the track.
    macro_rules! cam_video {
        ($r:ident, $src:expr, $local:expr, $sub:expr, $up:expr) => {{
            $r.announce(path("cam"), $src, $local, $up).unwrap();
            let b = $r.origin().get(path("cam")).unwrap();
            let t = $r.resolve($sub, b, "video", $up).unwrap();
            (b, t)
        }};
    }

    fn limits() -> RouterLimits {
        RouterLimits {
            announces: 8,
            peer_announces: 8,
            pending_per_conn: 8,
            pending_per_broadcast: 8,
            grace: GRACE,
        }
    }

    #[test]
    fn a_killed_source_is_adopted_within_the_grace_and_subscribers_stay() {
        router!(pool, r, limits());
        let up = Asked::default();
        let t0 = Instant::ZERO;
        assert_eq!(
            r.announce(path("cam"), 1, true, &up),
            Ok(Announced::Route { routed: true })
        );
        let b = r.origin().get(path("cam")).unwrap();
        // A subscriber asks for "video": one relay track, one SUBSCRIBE to source 1.
        let t = r.resolve(Some(7), b, "video", &up).unwrap();
        assert_eq!(up.take(), [(1, "cam".into())]);
        assert!(
            !t.info_known(),
            "TRACK requests wait for the source's TRACK_INFO"
        );
        t.set_info(crate::wire::lite::TrackInfo {
            priority: 3,
            max_age: Duration::from_secs(2),
            timescale: core::num::NonZeroU64::new(1000).unwrap(),
        });
        let mut reader = t.consumer(Start::Latest);
        // Source 1 fills group 0, then dies in the middle of group 1.
        let p = t.producer().unwrap();
        let mut g = p.create_group(0).unwrap();
        g.write_frame(0, b"a").unwrap();
        g.finish().unwrap();
        drop(g);
        let mut g1 = p.create_group(1).unwrap();
        g1.write_frame(0, b"b").unwrap();
        drop(g1);
        drop(p);
        assert_eq!(r.source_gone(1, t0, &up), 1);
        assert!(r.origin().get(path("cam")).is_none(), "unannounced at once");
        assert_eq!(r.poll_timeout(), Some(t0.saturating_add(GRACE)));
        assert_eq!(t.status(), track::Status::Open, "the track waits");
        // Source 2 announces the path in time: it adopts, and is asked for
        // every open track; the subscriber reads on.
        let t1 = t0.saturating_add(Duration::from_secs(3));
        assert_eq!(r.handle_timeout(t1), 0);
        assert_eq!(
            r.announce(path("cam"), 2, true, &up),
            Ok(Announced::Adopted { tracks: 1 })
        );
        assert_eq!(up.take(), [(2, "cam".into())]);
        assert!(r.origin().get(path("cam")).is_some());
        assert_eq!(r.poll_timeout(), None);
        let p2 = t.producer().unwrap();
        let mut g2 = p2.create_group(2).unwrap();
        g2.write_frame(0, b"c").unwrap();
        g2.finish().unwrap();
        let mut seqs = Vec::new();
        for _ in 0..8 {
            match reader.next_group() {
                Ok(track::Next::Ready(c)) => seqs.push(c.sequence()),
                Ok(track::Next::Lagged(_)) => {}
                _ => break,
            }
        }
        let _ = pool;
        assert!(
            seqs.contains(&2),
            "the subscriber got the new source's group: {seqs:?}"
        );
    }

    #[test]
    fn after_the_grace_the_broadcast_ends_and_its_tables_come_back() {
        router!(pool, r, limits());
        let up = Asked::default();
        let t0 = Instant::ZERO;
        let (b, t) = cam_video!(r, 1, true, None, &up);
        assert_eq!(r.source_gone(1, t0, &up), 1);
        let due = r.poll_timeout().unwrap();
        assert_eq!(r.handle_timeout(due.saturating_add(Duration::ZERO)), 1);
        assert_eq!(
            t.status(),
            track::Status::Aborted(StreamCode::SessionClosed.to_code())
        );
        assert_eq!(r.routes(), 0);
        // Both tables take their entries back; the stale handles reach nothing.
        assert!(r.reclaim() >= 1);
        let again = r.announce(path("other"), 3, true, &up);
        assert_eq!(again, Ok(Announced::Route { routed: true }));
        let b2 = r.origin().get(path("other")).unwrap();
        assert!(!b.is_current(), "the old broadcast's handle is stale");
        let t2 = r.resolve(None, b2, "video", &up).unwrap();
        assert!(!t.is_current() && !t.same_track(&t2));
        assert!(t.producer().is_err());
        let _ = pool;
    }

    /// A client announcing a path another client serves takes it over at
    /// once; the one it displaced waits as a spare, and the newest spare
    /// goes first when the source goes.
    #[test]
    fn the_newest_client_announcement_wins_and_the_displaced_waits_as_a_spare() {
        router!(pool, r, limits());
        let up = Asked::default();
        let t0 = Instant::ZERO;
        let (b, t) = cam_video!(r, 1, true, None, &up);
        assert_eq!(up.take(), [(1, "cam".into())]);
        // Source 1's session fills the track and is in the middle of group 1.
        let old = t.producer().unwrap();
        let mut g0 = old.create_group(0).unwrap();
        g0.write_frame(0, b"a").unwrap();
        g0.finish().unwrap();
        let mut cut = old.create_group(1).unwrap();
        cut.write_frame(1, b"b").unwrap();
        let mut reader = t.consumer(Start::Latest);
        assert!(matches!(reader.next_group(), Ok(track::Next::Ready(_))));
        // Source 2 (a camera reconnecting) takes the route over at once.
        assert_eq!(
            r.announce(path("cam"), 2, true, &up),
            Ok(Announced::TookOver { from: 1, tracks: 1 })
        );
        assert_eq!(up.take(), [(2, "cam".into())]);
        assert_eq!(r.source_of(b), Some(2));
        assert_eq!((r.routes(), r.spares()), (1, 1));
        assert!(
            r.origin()
                .get(path("cam"))
                .is_some_and(|x| x.same_broadcast(&b)),
            "never unannounced"
        );
        // The old producer was let go: its group is cut, its late groups
        // refused; the same track waits for the new source's producer.
        assert!(!old.is_current() && !t.has_producer());
        assert!(cut.write_frame(2, b"c").is_err());
        assert!(old.create_group(2).is_err());
        assert!(b.track("video").is_some_and(|x| x.same_track(&t)));
        assert_eq!(t.status(), track::Status::Open);
        let new = t.producer().unwrap();
        let mut g5 = new.create_group(5).unwrap();
        g5.write_frame(5, b"new").unwrap();
        g5.finish().unwrap();
        drop(old);
        let mut seen = std::vec::Vec::new();
        while let Ok(track::Next::Ready(g)) = reader.next_group() {
            seen.push(g.sequence());
        }
        assert_eq!(seen.last(), Some(&5), "the reader goes on: {seen:?}");
        // Source 3 takes over from 2; then 3 goes: the newest spare (2)
        // takes over again, then 1.
        assert_eq!(
            r.announce(path("cam"), 3, true, &up),
            Ok(Announced::TookOver { from: 2, tracks: 1 })
        );
        drop(new);
        up.take();
        assert_eq!(r.source_gone(3, t0, &up), 0);
        assert_eq!(up.take(), [(2, "cam".into())]);
        assert_eq!(r.source_of(b), Some(2));
        assert_eq!(r.source_gone(2, t0, &up), 0);
        assert_eq!(up.take(), [(1, "cam".into())]);
        assert_eq!(r.poll_timeout(), None, "nothing waited");
        // A link's announcement never displaces a client: it waits as a spare.
        assert_eq!(
            r.announce(path("cam"), 100, false, &up),
            Ok(Announced::Spare)
        );
        assert_eq!(r.source_of(b), Some(1));
        // A spare that withdraws is forgotten.
        assert!(!r.unannounce(path("cam"), 100));
        assert_eq!(r.spares(), 0);
        // The last source goes with no spare left: the route waits its grace.
        assert_eq!(r.source_gone(1, t0, &up), 1);
        assert_eq!(r.poll_timeout(), Some(t0.saturating_add(GRACE)));
        assert!(r.origin().get(path("cam")).is_none());
        let _ = pool;
    }

    /// With no spare place for the displaced source, the announcement is
    /// refused and nothing changes.
    #[test]
    fn a_take_over_without_a_spare_place_is_refused() {
        router!(pool, r, limits());
        let up = Asked::default();
        r.announce(path("cam"), 1, true, &up).unwrap();
        for n in 0..4 {
            assert_eq!(
                r.announce(path("cam"), 100 + n, false, &up),
                Ok(Announced::Spare)
            );
        }
        let b = r.origin().get(path("cam")).unwrap();
        let t = r.resolve(None, b, "video", &up).unwrap();
        let p = t.producer().unwrap();
        assert_eq!(
            r.announce(path("cam"), 2, true, &up),
            Err(AnnounceRefused::Full)
        );
        assert!(p.is_current(), "the producer was kept");
        assert_eq!(r.source_of(b), Some(1));
        let _ = pool;
    }

    #[test]
    fn a_local_source_of_a_linked_path_is_a_standby() {
        router!(pool, r, limits());
        let up = Asked::default();
        // Learned from another worker (not local), then a client of ours.
        r.announce(path("cam"), 100, false, &up).unwrap();
        assert_eq!(
            r.announce(path("cam"), 1, true, &up),
            Ok(Announced::Route { routed: false })
        );
        assert!(
            r.local_origin().get(path("cam")).is_some(),
            "offered to the other workers"
        );
        assert_eq!(r.routes(), 2);
        // The standby's source goes: withdrawn at once, nothing waits.
        assert_eq!(r.source_gone(1, Instant::ZERO, &up), 0);
        assert!(r.local_origin().get(path("cam")).is_none());
        assert_eq!(r.routes(), 1);
        let _ = pool;
    }

    #[test]
    fn quotas_refuse_the_request_past_them_and_keep_nothing() {
        router!(
            pool,
            r,
            RouterLimits {
                announces: 1,
                peer_announces: 1,
                pending_per_conn: 1,
                pending_per_broadcast: 2,
                grace: GRACE,
            }
        );
        let up = Asked::default();
        r.announce(path("a"), 1, true, &up).unwrap();
        assert_eq!(
            r.announce(path("b"), 1, true, &up),
            Err(AnnounceRefused::Quota)
        );
        // Trunks (not local) are not held to it.
        assert!(r.announce(path("c"), 9, false, &up).is_ok());
        let a = r.origin().get(path("a")).unwrap();
        r.resolve(Some(7), a, "x", &up).unwrap();
        assert_eq!(
            r.resolve(Some(7), a, "y", &up).unwrap_err(),
            ResolveRefused::Quota(Quota::PendingTracks)
        );
        r.resolve(Some(8), a, "y", &up).unwrap();
        assert_eq!(
            r.resolve(Some(9), a, "z", &up).unwrap_err(),
            ResolveRefused::Quota(Quota::PendingTracksPerBroadcast)
        );
        assert_eq!(a.len(), 2, "nothing kept for the refused requests");
        // Once the source answers (TRACK_INFO), the request no longer waits.
        let x = a.track("x").unwrap();
        x.set_info(crate::wire::lite::TrackInfo {
            priority: 0,
            max_age: Duration::from_secs(1),
            timescale: core::num::NonZeroU64::new(1000).unwrap(),
        });
        r.resolve(Some(7), a, "w", &up).unwrap();
        // The track table (4 slots) refuses past its size.
        r.resolve(None, a, "v", &up).unwrap();
        assert_eq!(
            r.resolve(None, a, "u", &up).unwrap_err(),
            ResolveRefused::Quota(Quota::RelayTracks)
        );
        assert_eq!(
            ResolveRefused::Quota(Quota::RelayTracks).code(),
            StreamCode::Evicted
        );
        let _ = pool;
    }

    #[test]
    fn a_new_source_adopting_a_route_does_not_inherit_its_finished_tracks() {
        router!(pool, r, limits());
        let up = Asked::default();
        let t0 = Instant::ZERO;
        let (b, done) = cam_video!(r, 1, true, Some(7), &up);
        let open = r.resolve(Some(7), b, "audio", &up).unwrap();
        up.take();
        // Source 1 finishes "video" (it stays cached), then its connection goes.
        let mut p = done.producer().unwrap();
        p.create_group(0).unwrap().finish().unwrap();
        p.finish();
        drop(p);
        assert!(!r.upstream_closed(done, None));
        let mut reader = done.consumer(Start::Latest);
        assert_eq!(r.source_gone(1, t0, &up), 1);
        // Source 2 adopts: only the open track is asked for again; the
        // finished one leaves the broadcast, so its name reaches source 2.
        assert_eq!(
            r.announce(path("cam"), 2, true, &up),
            Ok(Announced::Adopted { tracks: 1 })
        );
        assert_eq!(up.take(), [(2, "cam".into())]);
        assert!(b.track("video").is_none());
        assert!(b.track("audio").is_some_and(|t| t.same_track(&open)));
        // Its reader still gets its group and its end.
        assert!(matches!(reader.next_group(), Ok(track::Next::Ready(_))));
        assert!(matches!(reader.next_group(), Ok(track::Next::Finished)));
        let again = r.resolve(Some(8), b, "video", &up).unwrap();
        assert!(!again.same_track(&done) && again.status() == track::Status::Open);
        assert_eq!(up.take(), [(2, "cam".into())]);
        // With no producer and no subscription served from it, the finished
        // track's slot comes back.
        assert_eq!(r.reclaim(), 1);
        let _ = pool;
    }

    #[test]
    fn a_refused_track_leaves_its_broadcast_and_a_finished_one_stays() {
        router!(pool, r, limits());
        let up = Asked::default();
        r.announce(path("a"), 1, true, &up).unwrap();
        let a = r.origin().get(path("a")).unwrap();
        let nope = r.resolve(Some(7), a, "nope", &up).unwrap();
        assert!(r.upstream_closed(nope, Some(StreamCode::NotFound)));
        assert!(a.track("nope").is_none());
        assert_eq!(
            nope.status(),
            track::Status::Aborted(StreamCode::NotFound.to_code())
        );
        let done = r.resolve(Some(7), a, "done", &up).unwrap();
        let mut p = done.producer().unwrap();
        p.finish();
        assert!(!r.upstream_closed(done, None));
        assert!(a.track("done").is_some(), "late subscribers still get it");
        let _ = pool;
    }

    fn via(hops: &[u64]) -> Via {
        Via {
            hops: HopList::from_slice(hops).unwrap(),
            peer: true,
            ..Via::default()
        }
    }

    /// Two peers' routes to "cam": the shorter serves; a restart that makes
    /// it longer hands the route to the spare at once (its track asked for
    /// there), a restart of the spare onto a shorter route takes it back,
    /// and a restart that changes nothing announces nothing.
    #[test]
    fn restarts_rerank_the_routes_of_a_path() {
        router!(pool, r, limits());
        let up = Asked::default();
        assert_eq!(
            r.announce_via(path("cam"), 1, true, &via(&[9, 1]), &up),
            Ok(Announced::Route { routed: true })
        );
        assert_eq!(
            r.announce_via(path("cam"), 2, true, &via(&[9, 5, 2]), &up),
            Ok(Announced::Spare)
        );
        let b = r.origin().get(path("cam")).unwrap();
        r.resolve(None, b, "video", &up).unwrap();
        assert_eq!(up.take(), [(1, "cam".into())]);
        let v = r.origin().version();
        assert_eq!(
            r.announce_via(path("cam"), 1, true, &via(&[9, 1]), &up),
            Ok(Announced::Updated)
        );
        assert_eq!(r.origin().version(), v, "nothing changed, nothing logged");
        assert_eq!(
            r.announce_via(path("cam"), 1, true, &via(&[9, 6, 7, 1]), &up),
            Ok(Announced::TookOver { from: 1, tracks: 1 })
        );
        assert_eq!(up.take(), [(2, "cam".into())]);
        assert_eq!(r.source_of(b), Some(2));
        assert_eq!(b.hops().as_slice(), [9, 5, 2]);
        assert_eq!(
            r.announce_via(path("cam"), 1, true, &via(&[9, 1]), &up),
            Ok(Announced::TookOver { from: 2, tracks: 1 })
        );
        assert_eq!(up.take(), [(1, "cam".into())]);
        assert_eq!((r.routes(), r.spares()), (1, 1));
        // The serving source withdraws: the spare serves at once.
        assert!(r.withdrawn(path("cam"), 1, true, Instant::ZERO, &up));
        assert_eq!(up.take(), [(2, "cam".into())]);
        assert_eq!(r.source_of(b), Some(2));
        assert_eq!(r.poll_timeout(), None);
        // Then it withdraws too: a peer's route waits for the grace.
        assert!(r.withdrawn(path("cam"), 2, true, Instant::ZERO, &up));
        assert_eq!(r.poll_timeout(), Some(Instant::ZERO.saturating_add(GRACE)));
        let _ = pool;
    }

    /// Between workers only a shorter route decides, on announcements and
    /// on restarts alike; a tie leaves the route where it is.
    #[test]
    fn workers_move_to_the_shorter_route_on_announcements_and_restarts() {
        router!(pool, r, limits());
        let up = Asked::default();
        // Another worker's route (link 100), then this worker's source 1
        // with a route as long: a standby.
        assert_eq!(
            r.announce_via(path("cam"), 100, false, &via(&[9, 5, 2]), &up),
            Ok(Announced::Route { routed: true })
        );
        assert_eq!(
            r.announce_via(path("cam"), 1, true, &via(&[9, 6, 3]), &up),
            Ok(Announced::Route { routed: false })
        );
        let b = r.origin().get(path("cam")).unwrap();
        r.resolve(None, b, "video", &up).unwrap();
        assert_eq!(up.take(), [(100, "cam".into())]);
        // The link's route grows: the standby's source serves, the link
        // waits as a spare.
        assert_eq!(
            r.announce_via(path("cam"), 100, false, &via(&[9, 5, 7, 2]), &up),
            Ok(Announced::TookOver {
                from: 100,
                tracks: 1
            })
        );
        assert_eq!(up.take(), [(1, "cam".into())]);
        assert_eq!(r.source_of(b), Some(1));
        assert!(r.local_origin().get(path("cam")).is_some(), "still offered");
        // The link's route shrinks below it: the route goes back to the link.
        assert_eq!(
            r.announce_via(path("cam"), 100, false, &via(&[9, 2]), &up),
            Ok(Announced::TookOver { from: 1, tracks: 1 })
        );
        assert_eq!(up.take(), [(100, "cam".into())]);
        assert_eq!(r.source_of(b), Some(100));
        // The standby's route shrinks further: it serves again.
        assert_eq!(
            r.announce_via(path("cam"), 1, true, &via(&[9]), &up),
            Ok(Announced::TookOver {
                from: 100,
                tracks: 1
            })
        );
        assert_eq!(up.take(), [(1, "cam".into())]);
        // A tie changes nothing.
        assert_eq!(
            r.announce_via(path("cam"), 100, false, &via(&[2]), &up),
            Ok(Announced::Spare)
        );
        assert_eq!(r.source_of(b), Some(1));
        let _ = pool;
    }

    /// A worker's own source serves a path; another worker offers a shorter
    /// route over their link: the route moves to the link and the source
    /// stands by, offered to the other workers; if the source's route then
    /// becomes the shorter, it serves again.
    #[test]
    fn a_shorter_route_over_a_link_makes_the_local_source_stand_by() {
        router!(pool, r, limits());
        let up = Asked::default();
        r.announce_via(path("cam"), 1, true, &via(&[9, 6, 3]), &up)
            .unwrap();
        let b = r.origin().get(path("cam")).unwrap();
        r.resolve(None, b, "video", &up).unwrap();
        up.take();
        assert_eq!(
            r.announce_via(path("cam"), 100, false, &via(&[9, 2]), &up),
            Ok(Announced::TookOver { from: 1, tracks: 1 })
        );
        assert_eq!(up.take(), [(100, "cam".into())]);
        assert_eq!(r.source_of(b), Some(100));
        let standby = r.local_origin().get(path("cam")).unwrap();
        assert!(!standby.same_broadcast(&b), "a broadcast of its own");
        assert_eq!(standby.hops().as_slice(), [9, 6, 3]);
        assert_eq!(r.routes(), 2);
        assert_eq!(
            r.announce_via(path("cam"), 1, true, &via(&[9]), &up),
            Ok(Announced::TookOver {
                from: 100,
                tracks: 1
            })
        );
        assert_eq!(up.take(), [(1, "cam".into())]);
        assert_eq!(r.source_of(b), Some(1));
        let _ = pool;
    }

    // --- a worker link's withdrawal (the two-worker republish race) -----------

    /// The TRACK_INFO a source answers with.
    fn info() -> crate::wire::lite::TrackInfo {
        crate::wire::lite::TrackInfo {
            priority: 0,
            max_age: Duration::from_secs(1),
            timescale: core::num::NonZeroU64::new(1000).unwrap(),
        }
    }

    /// Worker link 100 offers "cam"; its source there ends and a new one
    /// announces it there again. A viewer's request reaches this worker while
    /// its route is still the link's; the link refuses it as unroutable
    /// before its withdrawal arrives. The request waits and goes to the new
    /// announcement instead of being refused.
    #[test]
    fn a_request_the_link_refuses_before_its_withdrawal_waits_for_the_next_announcement() {
        router!(pool, r, limits());
        let up = Asked::default();
        let t0 = Instant::ZERO;
        let (b, t) = cam_video!(r, 100, false, Some(7), &up);
        assert_eq!(up.take(), [(100, "cam".into())]);
        // The refusal overtakes the withdrawal: the route waits from now.
        assert!(!r.upstream_unroutable(t, 100, t0, &up));
        assert_eq!(t.status(), track::Status::Open, "the request waits");
        assert!(r.origin().get(path("cam")).is_none());
        assert_eq!(r.poll_timeout(), Some(t0.saturating_add(GRACE)));
        // The withdrawal finds the route waiting already.
        let t1 = t0.saturating_add(Duration::from_millis(1));
        assert!(!r.source_left(path("cam"), 100, t1, &up));
        assert_eq!(r.poll_timeout(), Some(t0.saturating_add(GRACE)));
        // The new source's announcement over the link adopts the route and
        // asks for the waiting track.
        assert_eq!(
            r.announce(path("cam"), 100, false, &up),
            Ok(Announced::Adopted { tracks: 1 })
        );
        assert_eq!(up.take(), [(100, "cam".into())]);
        assert!(b.track("video").is_some_and(|x| x.same_track(&t)));
        assert_eq!(r.poll_timeout(), None);
        t.set_info(info());
        assert!(t.info_known());
        let _ = pool;
    }

    /// The same race with the withdrawal first: the route waits for the
    /// grace period, and a request the link refuses meanwhile waits with it.
    /// Nobody announces: at the end of the grace it ends with
    /// SESSION_CLOSED, and the tables come back.
    #[test]
    fn a_withdrawn_link_route_waits_for_the_grace_then_its_requests_end() {
        router!(pool, r, limits());
        let up = Asked::default();
        let t0 = Instant::ZERO;
        let (_, t) = cam_video!(r, 100, false, Some(7), &up);
        up.take();
        assert!(r.source_left(path("cam"), 100, t0, &up));
        assert!(r.origin().get(path("cam")).is_none(), "unannounced at once");
        assert_eq!(r.routes(), 1, "kept for the grace");
        assert!(!r.upstream_unroutable(t, 100, t0, &up));
        assert!(up.take().is_empty(), "nobody to ask yet");
        assert_eq!(t.status(), track::Status::Open);
        // A TRACK request waiting for it goes on waiting.
        assert!(
            r.waiting(path("cam"), "video")
                .is_some_and(|x| x.same_track(&t))
        );
        assert!(r.waiting(path("cam"), "audio").is_none());
        let due = r.poll_timeout().unwrap();
        assert_eq!(due, t0.saturating_add(GRACE));
        assert_eq!(r.handle_timeout(due), 1);
        assert_eq!(
            t.status(),
            track::Status::Aborted(StreamCode::SessionClosed.to_code())
        );
        assert_eq!(r.routes(), 0);
        assert!(r.waiting(path("cam"), "video").is_none(), "refused now");
        assert!(r.reclaim() >= 1);
        // A refusal for a track in no route ends it with UNROUTABLE.
        let (_, u) = cam_video!(r, 100, false, Some(7), &up);
        r.drop_track(u);
        assert!(r.upstream_unroutable(u, 100, due, &up));
        assert_eq!(
            u.status(),
            track::Status::Aborted(StreamCode::Unroutable.to_code())
        );
        let _ = pool;
    }

    /// A source of this worker announces "cam" while the link's route of it
    /// stands (the withdrawal is still crossing the link): it is a standby.
    /// When the withdrawal arrives, the standby's source takes the route
    /// over at once; the broadcast stays announced to this worker's
    /// subscribers, and both routes go when that source withdraws.
    #[test]
    fn a_standby_takes_over_the_route_a_link_withdrew() {
        router!(pool, r, limits());
        let up = Asked::default();
        let t0 = Instant::ZERO;
        r.announce(path("cam"), 100, false, &up).unwrap();
        assert_eq!(
            r.announce(path("cam"), 2, true, &up),
            Ok(Announced::Route { routed: false })
        );
        let b = r.origin().get(path("cam")).unwrap();
        let t = r.resolve(Some(7), b, "video", &up).unwrap();
        assert_eq!(up.take(), [(100, "cam".into())]);
        // The link still fills "video" for its readers; the new source's
        // track of that name is a new one.
        let fed = t.producer().unwrap();
        t.set_info(info());
        assert!(r.source_left(path("cam"), 100, t0, &up));
        assert!(
            r.origin()
                .get(path("cam"))
                .is_some_and(|x| x.same_broadcast(&b)),
            "still announced here"
        );
        assert!(r.local_origin().get(path("cam")).is_some());
        assert_eq!(r.poll_timeout(), None, "nothing waits");
        assert!(b.track("video").is_none());
        fed.create_group(0).unwrap().finish().unwrap();
        assert_eq!(t.latest(), Some(0), "its readers go on");
        drop(fed);
        let again = r.resolve(Some(8), b, "video", &up).unwrap();
        assert!(!again.same_track(&t));
        assert_eq!(up.take(), [(2, "cam".into())]);
        assert!(r.unannounce(path("cam"), 2));
        assert_eq!(r.routes(), 0);
        assert!(r.origin().get(path("cam")).is_none());
        assert!(r.local_origin().get(path("cam")).is_none());
        let _ = pool;
    }

    /// A request still on its way to the link when a source of this worker
    /// adopts the route stays; the link's refusal then asks the new source.
    #[test]
    fn a_request_the_link_refuses_after_a_new_source_adopted_goes_to_it() {
        router!(pool, r, limits());
        let up = Asked::default();
        let t0 = Instant::ZERO;
        let (b, t) = cam_video!(r, 100, false, Some(7), &up);
        up.take();
        // The link's subscription holds the producer, unanswered.
        let asked = t.producer().unwrap();
        assert!(r.source_left(path("cam"), 100, t0, &up));
        assert_eq!(
            r.announce(path("cam"), 2, true, &up),
            Ok(Announced::Adopted { tracks: 0 })
        );
        assert!(up.take().is_empty(), "its request is still out");
        assert!(b.track("video").is_some_and(|x| x.same_track(&t)));
        drop(asked);
        assert!(!r.upstream_unroutable(t, 100, t0, &up));
        assert_eq!(up.take(), [(2, "cam".into())]);
        assert_eq!(t.status(), track::Status::Open);
        let _ = pool;
    }
}
