//! On-demand tracks: a hook that lets the owner of a session create a track
//! the peer asked for when the broadcast is known but the track is not.
//!
//! A relay learns a broadcast's path from an announcement but not its track
//! names: those arrive with the downstream requests. docs/protocol.md §4.4–4.5: a
//! relay answers a TRACK or SUBSCRIBE for a track of a broadcast it routes by
//! creating the track, subscribing upstream once, and serving every
//! downstream subscriber from it. [`Resolve::resolve`] is asked, synchronously,
//! while the session parses the request; the track it returns is served at
//! once (SUBSCRIBE_START waits for its first group). If the upstream
//! subscription later fails, the owner aborts the track with the upstream
//! code and the session passes it on (docs/protocol.md §4.4).
//!
//! Limitation: a TRACK request for a resolved track is answered with the
//! track's own [`track::Info`], which for a fresh relay track holds defaults
//! rather than the upstream TRACK_INFO (not known yet when it is answered).

use super::Session;
use crate::model::path::Path;
use crate::model::{broadcast, origin, track};
use crate::transport::Transport;
use crate::wire::lite::StreamCode;

/// Creates a track of a known broadcast on demand, for a relay whose tracks appear as subscribers ask.
pub trait Resolve<'a, 'p> {
    /// The track `name` of `broadcast`, created now, or the code to refuse
    /// the request with (NOT_FOUND 0x33 for a track that cannot exist; a
    /// relay over a quota picks its own, see its docs). The track should be
    /// added to the broadcast so later requests find it without asking again.
    ///
    /// # Errors
    /// The stream code the request is refused with.
    fn resolve(
        &self,
        broadcast: broadcast::Ref<'a, 'p>,
        name: &str,
    ) -> Result<track::Ref<'a, 'p>, StreamCode>;

    /// The track `name` of broadcast `path`, which is not in the origin now,
    /// that a TRACK request already waiting for its TRACK_INFO may go on
    /// waiting for: a relay's broadcast whose source is gone, within its
    /// failover grace (the next source answers it). `None`, the default:
    /// the request is refused as unroutable.
    fn waiting(&self, path: Path<'_>, name: &str) -> Option<track::Ref<'a, 'p>> {
        let _ = (path, name);
        None
    }
}

impl<'s, 'a, 'p, const N: usize, T: Transport> Session<'s, 'a, 'p, N, T> {
    /// Installs (or removes, with `None`) the hook asked for tracks the peer
    /// requests in a broadcast of our origin that has no such track yet.
    pub fn set_resolver(&mut self, resolver: Option<&'s dyn Resolve<'a, 'p>>) {
        self.resolver = resolver;
        self.dirty = true;
    }
}

/// The local track `name` of broadcast `broadcast` for a peer whose Hop ID
/// is `requester` (docs/protocol.md §4.4: an unknown broadcast is
/// UNROUTABLE, an unknown track NOT_FOUND; §4.3: so is a broadcast whose
/// route crosses the requester, split horizon).
pub(super) fn lookup<'a, 'p>(
    origin: Option<origin::Ref<'a, 'p>>,
    broadcast: Path<'_>,
    name: &str,
    requester: u64,
) -> Result<track::Ref<'a, 'p>, StreamCode> {
    let b = origin
        .and_then(|o| o.get(broadcast))
        .filter(|b| !b.hops_contain(requester))
        .ok_or(StreamCode::Unroutable)?;
    b.track(name).ok_or(StreamCode::NotFound)
}

/// Like [`lookup`], then asks `resolver` for a track the
/// broadcast lacks (docs/protocol.md §4.4: unknown broadcast UNROUTABLE, unknown
/// track NOT_FOUND).
pub(super) fn lookup_or_resolve<'a, 'p>(
    origin: Option<origin::Ref<'a, 'p>>,
    resolver: Option<&dyn Resolve<'a, 'p>>,
    path: Path<'_>,
    name: &str,
    requester: u64,
) -> Result<track::Ref<'a, 'p>, StreamCode> {
    match lookup(origin, path, name, requester) {
        Err(StreamCode::NotFound) => match resolver.zip(origin.and_then(|o| o.get(path))) {
            Some((r, b)) => r.resolve(b, name),
            None => Err(StreamCode::NotFound),
        },
        found => found,
    }
}

#[cfg(test)]
mod tests {
    extern crate std;

    use core::cell::Cell;

    use super::super::harness::{Ev, Node, Pair};
    use super::super::{Config, Session, Storage};
    use super::*;
    use crate::model::group::Next;
    use crate::pool::{Pool, PoolStorage};
    use crate::time::{Duration, Instant};
    use crate::window::Request;
    use crate::wire::qmux::Side;

    type St<'a, 'p> = Storage<'a, 'p, 16, 256, 4, 4, 8, 8, 32>;

    /// Hands out one prepared track, once, for the name "audio".
    struct OneTrack<'b, 'a, 'p> {
        track: track::Ref<'a, 'p>,
        producer: &'b broadcast::Producer<'a, 'p>,
        asked: Cell<usize>,
    }

    impl<'a, 'p> Resolve<'a, 'p> for OneTrack<'_, 'a, 'p> {
        fn resolve(
            &self,
            broadcast: broadcast::Ref<'a, 'p>,
            name: &str,
        ) -> Result<track::Ref<'a, 'p>, StreamCode> {
            self.asked.set(self.asked.get() + 1);
            if name != "audio" || !broadcast.same_broadcast(&self.producer.broadcast()) {
                return Err(StreamCode::NotFound);
            }
            self.producer
                .add(self.track)
                .map_err(|_| StreamCode::NotFound)?;
            Ok(self.track)
        }
    }

    // ---------------------------------------------------------------------------
    // On-demand tracks
    // ---------------------------------------------------------------------------

    #[test]
    fn unknown_track_of_known_broadcast_is_resolved_once() {
        let mut ps = PoolStorage::<32, 128>::new();
        let pool = Pool::new(&mut ps);
        let mut pc = PoolStorage::<32, 128>::new();
        let cpool = Pool::new(&mut pc);
        let audio = track::State::<4>::new(&pool, track::Info::new("audio").unwrap());
        let bcast = broadcast::State::<4>::new(Path::new("live").unwrap()).unwrap();
        let origin = origin::State::<4, 8>::new();
        origin.handle().announce(bcast.handle()).unwrap();
        let bp = bcast.producer().unwrap();
        let hook = OneTrack {
            track: audio.handle(),
            producer: &bp,
            asked: Cell::new(0),
        };
        let first = track::State::<4>::new(&cpool, track::Info::new("audio").unwrap());
        let second = track::State::<4>::new(&cpool, track::Info::new("audio").unwrap());
        let missing = track::State::<4>::new(&cpool, track::Info::new("video").unwrap());

        let mut cst = St::new();
        let mut sst = St::new();
        let client =
            Session::new(Side::Client, Config::new(), Instant::ZERO, &mut cst, None).unwrap();
        let mut server = Session::new(
            Side::Server,
            Config::new(),
            Instant::ZERO,
            &mut sst,
            Some(origin.handle()),
        )
        .unwrap();
        server.set_resolver(Some(&hook));
        let mut pair = Pair::new(Node::new(client), Node::new(server));
        assert!(pair.run(1000, |p| p.a.session.is_setup() && p.b.session.is_setup()));

        let a = pair
            .a
            .session
            .subscribe("live", first.handle(), Request::LIVE)
            .unwrap();
        let v = pair
            .a
            .session
            .subscribe("live", missing.handle(), Request::LIVE)
            .unwrap();
        pair.settle(Duration::from_millis(50));
        // The hook was asked for both; it refused "video" (NOT_FOUND 0x33).
        assert!(pair.a.events.contains(&Ev::SubscriptionClosed {
            subscription: v,
            code: Some(0x33)
        }));
        let b = pair
            .a
            .session
            .subscribe("live", second.handle(), Request::LIVE)
            .unwrap();
        pair.settle(Duration::from_millis(50));
        // The second subscriber found the track in the broadcast: no new request.
        assert_eq!(hook.asked.get(), 2);

        // Groups written into the resolved track reach both subscribers.
        let tp = audio.producer().unwrap();
        let mut g = tp.create_group(0).unwrap();
        g.write_frame(7, b"on demand").unwrap();
        g.finish().unwrap();
        pair.settle(Duration::from_millis(50));
        for (sub, local) in [(a, &first), (b, &second)] {
            assert!(pair.a.events.contains(&Ev::Group {
                subscription: sub,
                sequence: 0
            }));
            let mut c = local.handle().group(0).expect("group delivered");
            let Next::Ready(h) = c.read_frame_header().unwrap() else {
                panic!("no frame");
            };
            assert_eq!((h.timestamp, h.len), (7, 9));
        }
    }

    #[test]
    fn without_a_resolver_unknown_tracks_stay_not_found() {
        let mut ps = PoolStorage::<16, 64>::new();
        let pool = Pool::new(&mut ps);
        let bcast = broadcast::State::<4>::new(Path::new("live").unwrap()).unwrap();
        let origin = origin::State::<4, 8>::new();
        origin.handle().announce(bcast.handle()).unwrap();
        let local = track::State::<4>::new(&pool, track::Info::new("audio").unwrap());
        assert_eq!(
            lookup_or_resolve(
                Some(origin.handle()),
                None,
                Path::new("live").unwrap(),
                "audio",
                0
            )
            .err(),
            Some(StreamCode::NotFound)
        );
        assert_eq!(
            lookup_or_resolve(
                Some(origin.handle()),
                None,
                Path::new("dead").unwrap(),
                "audio",
                0
            )
            .err(),
            Some(StreamCode::Unroutable)
        );
        drop(local);
    }
}
