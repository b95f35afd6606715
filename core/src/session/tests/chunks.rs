//! Control buffers shared by a session's control slots: lent while a message
//! is on its way or a prefix is kept, given back once empty, and waited for
//! (not refused) when a burst of requests needs more than there are.

use super::*;

/// Control slots, buffer size and buffers of the publisher below: four
/// buffers for sixteen slots.
const CHUNKS: usize = 4;
type Tight<'a, 'p> = Storage<'a, 'p, 16, 256, 8, 1, 8, 1, CHUNKS>;

#[test]
fn a_burst_of_requests_waits_for_control_buffers_and_every_one_is_served() {
    burst(false);
}

#[test]
fn requests_waiting_for_track_info_in_every_buffer_are_all_answered() {
    // Each waiting TRACK request holds a buffer; when the values arrive,
    // every answer goes out in the buffer its request leaves.
    burst(true);
}

/// Five subscriptions to a server with four control buffers; with
/// `waiting`, the server's tracks wait for their TRACK_INFO values first.
fn burst(waiting: bool) {
    let mut ps = PoolStorage::<64, 64>::new();
    let pool = Pool::new(&mut ps);
    let mut pc = PoolStorage::<64, 64>::new();
    let cpool = Pool::new(&mut pc);
    let names = ["t0", "t1", "t2", "t3", "t4"];
    live_room!(pool, names => tracks, bcast, o, bp, producers);
    if waiting {
        tracks.iter().for_each(|t| t.handle().await_info());
    }

    let locals: Vec<_> = names
        .iter()
        .map(|n| track::State::<4>::new(&cpool, track::Info::new(n).unwrap()))
        .collect();
    let mut cst = Storage::<'_, '_, 16, 256, 4, 8, 8, 8, 32>::new();
    let mut sst = Tight::new();
    let client = Tr::session(Side::Client, Config::new(), Instant::ZERO, &mut cst, None).unwrap();
    let server = Tr::session(
        Side::Server,
        Config::new(),
        Instant::ZERO,
        &mut sst,
        Some(o.handle()),
    )
    .unwrap();
    let mut pair = Pair::new(Node::new(client), Node::new(server));
    assert!(pair.run(1000, |p| p.a.session.is_setup() && p.b.session.is_setup()));
    // Both SETUP streams went quiet: their buffers are back.
    assert_eq!(pair.b.session.free_chunks(), CHUNKS);

    // Five subscriptions at once: ten requests (TRACK and SUBSCRIBE each)
    // for four buffers. Those that find none wait in the input.
    for l in &locals {
        pair.a
            .session
            .subscribe(
                "room/live",
                l.handle(),
                Request::test(1, 1000, Start::Latest, End::Open),
            )
            .unwrap();
    }
    if waiting {
        pair.settle(Duration::from_millis(50));
        assert!(pair.b.session.has_deferred_requests());
        assert!(
            pair.b.session.free_chunks() <= 1,
            "the waiting requests hold the buffers"
        );
        for t in &tracks {
            t.handle().set_info(crate::wire::lite::TrackInfo {
                priority: 1,
                max_age: Duration::from_millis(1000),
                timescale: core::num::NonZeroU64::new(1000).unwrap(),
            });
        }
    }
    assert!(pair.run(5000, |p| p.b.session.served_count() == names.len()));
    for l in &locals {
        let h = l.handle();
        assert!(
            pair.run(2000, |_| h.group(0).is_some()),
            "{}",
            h.info().name
        );
    }
    assert_eq!(pair.b.session.refused_track_requests(), 0);
    // Answered and quiet: every buffer is back.
    assert!(pair.run(1000, |p| p.b.session.free_chunks() == CHUNKS));
    assert!(!pair.a.saw(|e| matches!(e, Ev::SubscriptionClosed { .. })));
    if waiting {
        return;
    }

    // An announce request keeps its prefix, and the buffer holding it.
    pair.a.session.announce_request("room").unwrap();
    pair.settle(Duration::from_millis(50));
    assert!(pair.a.saw(|e| matches!(e, Ev::Announced { .. })));
    assert!(pair.run(1000, |p| p.b.session.free_chunks() == CHUNKS - 1));
}
