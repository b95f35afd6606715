//! FETCH served by the publisher side (docs/protocol.md §3.10), against a
//! raw QMux peer that writes the requests by hand: held groups answered with
//! their stored bytes, refusals with their codes, cancellation, the limit,
//! and misses handed to the application.

use super::*;

/// A FETCH stream's first bytes: the type, then FETCH for `broadcast`,
/// `track`, priority `priority`, group `group` (one-byte varint).
fn fetch_bytes(broadcast: &str, track: &str, priority: u8, group: u8) -> Vec<u8> {
    let mut body = Vec::new();
    body.push(broadcast.len() as u8);
    body.extend_from_slice(broadcast.as_bytes());
    body.push(track.len() as u8);
    body.extend_from_slice(track.as_bytes());
    body.push(priority);
    body.push(group);
    let mut out = vec![0x03, body.len() as u8];
    out.extend(body);
    out
}

/// Every stored byte of group `seq` of `track` (which must be complete).
fn stored_bytes(track: track::Ref<'_, '_>, seq: u64) -> Vec<u8> {
    let mut c = track.group(seq).expect("group held");
    let mut out = Vec::new();
    loop {
        match c.chunk().expect("read") {
            Next::Ready(chunk) => {
                let n = chunk.len();
                out.extend_from_slice(chunk);
                c.advance(n);
            }
            Next::Finished => return out,
            Next::Pending => panic!("group {seq} incomplete"),
        }
    }
}

#[test]
fn a_held_group_is_answered_with_its_stored_bytes() {
    let mut ps = PoolStorage::<16, 64>::new();
    let pool = Pool::new(&mut ps);
    published!(pool, o, "b", "t", t, tp);
    write_group(&tp, 2, &[(0, b"old")]);
    // Timestamps 5000 and 5040: stored from 0 within the group.
    write_group(&tp, 3, &[(5000, b"key frame bytes"), (5040, b"delta")]);
    raw_pair!(Side::Server, Config::new(), Some(o.handle()), st, pair);
    pair.b.open(Dir::Uni, &hex("01 01 00"), true);
    let f = pair.b.open(Dir::Bidi, &fetch_bytes("b", "t", 7, 3), false);
    pair.settle(Duration::from_millis(50));

    let want = stored_bytes(t.handle(), 3);
    assert_eq!(pair.b.received(f.value()), want.as_slice());
    assert!(pair.b.streams[&f.value()].1, "answer finished");
    // The bytes are the FRAMEs of §3.9, the deltas counted from 0: 5000
    // (zigzag 10000), 15 bytes, then 40 (zigzag 80), 5 bytes.
    assert_eq!(&want[..3], &hex("67 10 0f")[..]);
    assert_eq!(&want[18..21], &hex("40 50 05")[..]);
    assert_eq!(pair.a.session.sending_groups(), 0);
    assert_eq!(pair.a.session.active_fetches(), 0);
    assert!(pair.b.resets.is_empty());
    // The requester ends its half: the slot is freed.
    pair.b.write(f, &[], true);
    pair.settle(Duration::from_millis(50));
    assert!(
        pair.a
            .session
            .control
            .iter()
            .all(|c| !matches!(c.kind, super::control::Kind::FetchIn { .. }))
    );
    assert_eq!(pair.b.closed, None);
}

#[test]
fn gathered_answers_leave_the_payload_in_the_pool() {
    let mut ps = PoolStorage::<16, 64>::new();
    let pool = Pool::new(&mut ps);
    published!(pool, o, "b", "t", t, tp);
    let big = [0x5au8; 150];
    write_group(&tp, 0, &[(0, &big), (10, &big)]);
    raw_pair!(Side::Server, Config::new(), Some(o.handle()), st, pair);
    pair.a.gather = Some(Vec::new());
    pair.b.open(Dir::Uni, &hex("01 01 00"), true);
    let f = pair.b.open(Dir::Bidi, &fetch_bytes("b", "t", 0, 0), false);
    pair.settle(Duration::from_millis(50));
    assert_eq!(
        pair.b.received(f.value()),
        stored_bytes(t.handle(), 0).as_slice()
    );
    assert!(pair.b.streams[&f.value()].1);
    assert!(pair.a.gathered > 0, "payload gathered from the pool blocks");
}

#[test]
fn unknown_broadcast_track_and_group_are_refused_per_stream() {
    let mut ps = PoolStorage::<16, 64>::new();
    let pool = Pool::new(&mut ps);
    published!(pool, o, "b", "t", _t, tp);
    write_group(&tp, 1, &[(0, b"x")]);
    raw_pair!(Side::Server, Config::new(), Some(o.handle()), st, pair);
    pair.b.open(Dir::Uni, &hex("01 01 00"), true);
    let no_broadcast = pair
        .b
        .open(Dir::Bidi, &fetch_bytes("nope", "t", 0, 1), false);
    let no_track = pair
        .b
        .open(Dir::Bidi, &fetch_bytes("b", "nope", 0, 1), false);
    let no_group = pair.b.open(Dir::Bidi, &fetch_bytes("b", "t", 0, 9), false);
    pair.settle(Duration::from_millis(50));
    for (id, code) in [(no_broadcast, 0x36), (no_track, 0x33), (no_group, 0x33)] {
        assert!(pair.b.resets.contains(&(id.value(), code)), "{id:?}");
        assert!(pair.b.stops.contains(&(id.value(), code)), "{id:?}");
        assert!(pair.b.received(id.value()).is_empty());
    }
    assert_eq!(pair.b.closed, None);
    // The session goes on: the held group is still fetched.
    let ok = pair.b.open(Dir::Bidi, &fetch_bytes("b", "t", 0, 1), false);
    pair.settle(Duration::from_millis(50));
    assert!(pair.b.streams[&ok.value()].1);
}

#[test]
fn bad_fetches_are_refused_not_the_session() {
    let mut ps = PoolStorage::<16, 64>::new();
    let pool = Pool::new(&mut ps);
    published!(pool, o, "b", "t", _t, tp);
    write_group(&tp, 1, &[(0, b"x")]);
    raw_pair!(Side::Server, Config::new(), Some(o.handle()), st, pair);
    pair.b.open(Dir::Uni, &hex("01 01 00"), true);
    // lite-06's frame bounds: trailing bytes in the body.
    let trailing = pair
        .b
        .open(Dir::Bidi, &hex("03 08 01 62 01 74 00 01 00 00"), false);
    // The stream ends inside the message.
    let truncated = pair.b.open(Dir::Bidi, &hex("03 06 01 62"), true);
    // The stream ends right after its type.
    let empty = pair.b.open(Dir::Bidi, &hex("03"), true);
    // A byte after a FETCH that is being answered.
    pair.settle(Duration::from_millis(50));
    for id in [trailing, truncated, empty] {
        assert!(pair.b.resets.contains(&(id.value(), 0)), "{id:?}");
    }
    assert_eq!(pair.b.closed, None);
    assert_eq!(pair.a.session.active_fetches(), 0);
}

/// A server session over `origin` against a raw client whose bidi streams
/// take `credit` bytes at a time, so an answer stays in flight.
macro_rules! slow_raw_pair {
    ($origin:expr, $credit:expr, $storage:ident, $pair:ident) => {
        let mut $storage = St::new();
        let session = Session::new(
            Side::Server,
            Config::new(),
            Instant::ZERO,
            &mut $storage,
            $origin,
        )
        .unwrap();
        let raw = Raw::new(
            Side::Client,
            conn::Config {
                max_stream_data_bidi_local: $credit,
                ..conn::Config::new()
            },
        );
        let mut $pair = Pair::new(Node::new(session), raw);
        assert!($pair.run(1000, |p| p.b.established && p.a.session.is_established()));
    };
}

#[test]
fn a_group_still_being_written_is_not_served() {
    let mut ps = PoolStorage::<16, 64>::new();
    let pool = Pool::new(&mut ps);
    published!(pool, o, "b", "t", _t, tp);
    let mut g = tp.create_group(4).unwrap();
    g.write_frame(0, b"first").unwrap();
    raw_pair!(Side::Server, Config::new(), Some(o.handle()), st, pair);
    pair.b.open(Dir::Uni, &hex("01 01 00"), true);
    let f = pair.b.open(Dir::Bidi, &fetch_bytes("b", "t", 0, 4), false);
    pair.settle(Duration::from_millis(50));
    assert!(pair.b.resets.contains(&(f.value(), 0x33)));
    assert!(pair.b.received(f.value()).is_empty());
    // Once whole, it is.
    g.finish().unwrap();
    let again = pair.b.open(Dir::Bidi, &fetch_bytes("b", "t", 0, 4), false);
    pair.settle(Duration::from_millis(50));
    assert_eq!(
        pair.b.received(again.value()),
        &hex("00 05 66 69 72 73 74")[..]
    );
    assert!(pair.b.streams[&again.value()].1);
}

#[test]
fn a_cancelled_answer_is_reset_and_freed() {
    let mut ps = PoolStorage::<32, 64>::new();
    let pool = Pool::new(&mut ps);
    published!(pool, o, "b", "t", _t, tp);
    let big = [7u8; 400];
    write_group(&tp, 4, &[(0, &big), (10, &big)]);
    slow_raw_pair!(Some(o.handle()), 16, st, pair);
    pair.b.open(Dir::Uni, &hex("01 01 00"), true);
    let reset = pair.b.open(Dir::Bidi, &fetch_bytes("b", "t", 0, 4), false);
    let stopped = pair.b.open(Dir::Bidi, &fetch_bytes("b", "t", 0, 4), false);
    let fin = pair.b.open(Dir::Bidi, &fetch_bytes("b", "t", 0, 4), false);
    assert!(pair.run(1000, |p| {
        [reset, stopped, fin]
            .iter()
            .all(|id| !p.b.received(id.value()).is_empty())
    }));
    assert_eq!(pair.a.session.active_fetches(), 3);
    assert_eq!(pair.a.session.sending_groups(), 3);

    // One requester resets its half, one stops ours, one finishes its half.
    pair.b.conn.reset_stream(reset, 0x1).unwrap();
    pair.b.conn.stop_sending(stopped, 0x7).unwrap();
    pair.b.write(fin, &[], true);
    pair.settle(Duration::from_millis(50));
    assert!(pair.b.resets.contains(&(reset.value(), 0x1)));
    assert!(pair.b.resets.contains(&(fin.value(), 0x1)));
    for id in [reset, stopped, fin] {
        assert!(pair.b.received(id.value()).len() < 800, "{id:?}");
        assert!(!pair.b.streams[&id.value()].1, "never finished");
    }
    assert_eq!(pair.a.session.active_fetches(), 0);
    assert_eq!(pair.a.session.sending_groups(), 0);
    assert_eq!(pair.b.closed, None);
}

#[test]
fn fetches_past_the_limit_are_refused_with_evicted() {
    let mut ps = PoolStorage::<16, 64>::new();
    let pool = Pool::new(&mut ps);
    let archive = track::State::<2>::new(&pool, track::Info::new("t").unwrap());
    let ap = archive.producer().unwrap();
    write_group(&ap, 0, &[(0, b"x")]);
    published!(pool, o, "b", "t", _t, _tp);
    let config = Config {
        max_fetches: 2,
        fetch_misses: true,
        ..Config::new()
    };
    raw_pair!(Side::Server, config, Some(o.handle()), st, pair);
    pair.b.open(Dir::Uni, &hex("01 01 00"), true);
    // Missed fetches wait for the application: each holds its place.
    let ids: Vec<_> = (0..3)
        .map(|_| pair.b.open(Dir::Bidi, &fetch_bytes("b", "t", 0, 0), false))
        .collect();
    pair.settle(Duration::from_millis(50));
    let refused: Vec<_> = ids
        .iter()
        .filter(|id| pair.b.resets.contains(&(id.value(), 0x35)))
        .collect();
    assert_eq!(refused.len(), 1);
    assert_eq!(pair.a.session.active_fetches(), 2);
    let first = pair
        .a
        .events
        .iter()
        .find_map(|e| match e {
            Ev::Fetch { fetch, .. } => Some(*fetch),
            _ => None,
        })
        .unwrap();
    // One answered: another is taken.
    pair.a
        .session
        .answer_fetch(first, archive.handle().group(0).unwrap())
        .unwrap();
    pair.settle(Duration::from_millis(50));
    assert_eq!(pair.a.session.active_fetches(), 1);
    let again = pair.b.open(Dir::Bidi, &fetch_bytes("b", "t", 0, 0), false);
    pair.settle(Duration::from_millis(50));
    assert!(!pair.b.resets.iter().any(|r| r.0 == again.value()));
    assert_eq!(pair.a.session.active_fetches(), 2);
    assert_eq!(pair.b.closed, None);
}

#[test]
fn misses_go_to_the_application_which_answers_or_refuses() {
    let mut ps = PoolStorage::<16, 64>::new();
    let pool = Pool::new(&mut ps);
    // Where the application keeps what it answers with.
    let archive = track::State::<2>::new(&pool, track::Info::new("t").unwrap());
    published!(pool, o, "b", "t", _t, tp);
    write_group(&tp, 5, &[(0, b"live")]);
    let ap = archive.producer().unwrap();
    write_group(&ap, 1, &[(0, b"from"), (90, b"disk")]);
    let config = Config {
        fetch_misses: true,
        ..Config::new()
    };
    raw_pair!(Side::Server, config, Some(o.handle()), st, pair);
    pair.b.open(Dir::Uni, &hex("01 01 00"), true);
    let answered = pair.b.open(Dir::Bidi, &fetch_bytes("b", "t", 3, 1), false);
    let refused = pair
        .b
        .open(Dir::Bidi, &fetch_bytes("b/replay", "t", 0, 2), false);
    pair.settle(Duration::from_millis(50));
    let misses: Vec<_> = pair
        .a
        .events
        .iter()
        .filter_map(|e| match e {
            Ev::Fetch {
                fetch,
                broadcast,
                track,
                group,
                priority,
                code,
            } => Some((
                *fetch,
                broadcast.clone(),
                track.clone(),
                *group,
                *priority,
                *code,
            )),
            _ => None,
        })
        .collect();
    assert_eq!(misses.len(), 2);
    assert_eq!(
        (
            &misses[0].1[..],
            &misses[0].2[..],
            misses[0].3,
            misses[0].4,
            misses[0].5
        ),
        ("b", "t", 1, 3, 0x33)
    );
    assert_eq!((&misses[1].1[..], misses[1].5), ("b/replay", 0x36));
    assert_eq!(pair.a.session.active_fetches(), 2);
    assert!(pair.b.received(answered.value()).is_empty());

    pair.a
        .session
        .answer_fetch(misses[0].0, archive.handle().group(1).unwrap())
        .unwrap();
    pair.a
        .session
        .refuse_fetch(misses[1].0, StreamCode::NotFound)
        .unwrap();
    pair.settle(Duration::from_millis(50));
    assert_eq!(
        pair.b.received(answered.value()),
        stored_bytes(archive.handle(), 1).as_slice()
    );
    assert!(pair.b.streams[&answered.value()].1);
    assert!(pair.b.resets.contains(&(refused.value(), 0x33)));
    assert_eq!(pair.a.session.active_fetches(), 0);
    // Answered once: a second answer finds nothing.
    assert_eq!(
        pair.a
            .session
            .answer_fetch(misses[0].0, archive.handle().group(1).unwrap()),
        Err(Error::Unknown)
    );
}

#[test]
fn a_miss_cancelled_before_its_answer_is_unknown_to_the_answer() {
    let mut ps = PoolStorage::<16, 64>::new();
    let pool = Pool::new(&mut ps);
    let archive = track::State::<2>::new(&pool, track::Info::new("t").unwrap());
    published!(pool, o, "b", "t", _t, tp);
    let ap = archive.producer().unwrap();
    write_group(&ap, 1, &[(0, b"x")]);
    let config = Config {
        fetch_misses: true,
        ..Config::new()
    };
    raw_pair!(Side::Server, config, Some(o.handle()), st, pair);
    pair.b.open(Dir::Uni, &hex("01 01 00"), true);
    let f = pair.b.open(Dir::Bidi, &fetch_bytes("b", "t", 0, 1), false);
    pair.settle(Duration::from_millis(50));
    let fetch = pair
        .a
        .events
        .iter()
        .find_map(|e| match e {
            Ev::Fetch { fetch, .. } => Some(*fetch),
            _ => None,
        })
        .expect("miss reported");
    pair.b.conn.reset_stream(f, 0x1).unwrap();
    pair.settle(Duration::from_millis(50));
    assert_eq!(pair.a.session.active_fetches(), 0);
    assert_eq!(
        pair.a
            .session
            .answer_fetch(fetch, archive.handle().group(1).unwrap()),
        Err(Error::Unknown)
    );
    assert_eq!(pair.a.session.sending_groups(), 0);
}

// ---------------------------------------------------------------------------
// Our fetches (requester side)
// ---------------------------------------------------------------------------

#[test]
fn a_fetch_fills_the_local_track_with_the_group() {
    let mut ps = PoolStorage::<32, 128>::new();
    let pool = Pool::new(&mut ps);
    let mut pc = PoolStorage::<32, 128>::new();
    let cpool = Pool::new(&mut pc);
    published!(pool, o, "b", "t", t, tp);
    t.handle().set_info(crate::wire::lite::TrackInfo {
        priority: 0,
        max_age: Duration::from_millis(500),
        timescale: core::num::NonZeroU64::new(90_000).unwrap(),
    });
    write_group(&tp, 3, &[(9000, b"key"), (12000, b"delta frame")]);
    write_group(&tp, 4, &[(0, b"newer")]);
    let local = track::State::<2>::new(&cpool, track::Info::new("t").unwrap());
    session_pair!(o.handle(), pair);
    let f = pair.a.session.fetch("b", local.handle(), 3, 2).unwrap();
    assert!(pair.run(2000, |p| {
        p.a.saw(|e| matches!(e, Ev::SubscriptionClosed { .. }))
    }));
    assert!(pair.a.events.contains(&Ev::SubscriptionClosed {
        subscription: f,
        code: None
    }));
    // TRACK_INFO first: the timescale.
    assert!(
        pair.a
            .saw(|e| matches!(e, Ev::TrackInfo { subscription, info }
        if *subscription == f && info.timescale.get() == 90_000))
    );
    assert!(pair.a.events.contains(&Ev::Group {
        subscription: f,
        sequence: 3
    }));
    // The timestamps as published.
    assert_eq!(
        read_group(local.handle(), 3),
        frames(&[(9000, "key"), (12000, "delta frame")])
    );
    assert_eq!(read_group(t.handle(), 3).len(), 2);
    assert_eq!(local.handle().status(), track::Status::Finished);
    assert!(local.handle().group(4).is_none());
    pair.settle(Duration::from_millis(50));
    assert_eq!(pair.b.session.active_fetches(), 0);
    assert_eq!(pair.a.session.receiving_groups(), 0);
    // Both ends let go of every control stream of it.
    for s in [&pair.a.session.control, &pair.b.session.control] {
        assert!(s.iter().all(|c| !matches!(
            c.kind,
            super::control::Kind::FetchIn { .. } | super::control::Kind::FetchOut { .. }
        )));
    }
}

#[test]
fn a_refused_fetch_aborts_the_local_track_with_the_code() {
    let mut ps = PoolStorage::<32, 128>::new();
    let pool = Pool::new(&mut ps);
    let mut pc = PoolStorage::<32, 128>::new();
    let cpool = Pool::new(&mut pc);
    published!(pool, o, "b", "t", _t, tp);
    write_group(&tp, 1, &[(0, b"x")]);
    let local = track::State::<2>::new(&cpool, track::Info::new("t").unwrap());
    let other = track::State::<2>::new(&cpool, track::Info::new("nope").unwrap());
    session_pair!(o.handle(), pair);
    let f = pair.a.session.fetch("b", local.handle(), 9, 0).unwrap();
    let g = pair.a.session.fetch("b", other.handle(), 1, 0).unwrap();
    assert!(pair.run(2000, |p| {
        p.a.events
            .iter()
            .filter(|e| matches!(e, Ev::SubscriptionClosed { .. }))
            .count()
            == 2
    }));
    assert!(pair.a.events.contains(&Ev::SubscriptionClosed {
        subscription: f,
        code: Some(0x33)
    }));
    // An unknown track fails at its TRACK request.
    assert!(pair.a.events.contains(&Ev::SubscriptionClosed {
        subscription: g,
        code: Some(0x33)
    }));
    assert_eq!(local.handle().status(), track::Status::Aborted(0x33));
    assert_eq!(pair.b.closed(), None);
}

/// Lets the peer see broadcast `b` only.
struct OnlyB;

impl crate::session::Scope for OnlyB {
    fn admit(&self, _: Option<&str>, _: Role) -> Result<(), &'static str> {
        Ok(())
    }

    fn may_subscribe(&self, path: &str) -> bool {
        path == "b"
    }
}

#[test]
fn a_path_outside_the_scope_is_refused_never_handed_over() {
    let mut ps = PoolStorage::<16, 64>::new();
    let pool = Pool::new(&mut ps);
    published!(pool, o, "b", "t", _t, _tp);
    let config = Config {
        fetch_misses: true,
        ..Config::new()
    };
    let scope = OnlyB;
    raw_pair!(Side::Server, config, Some(o.handle()), st, pair);
    pair.a.session.set_scope(Some(&scope));
    pair.b.open(Dir::Uni, &hex("01 01 00"), true);
    let hidden = pair.b.open(Dir::Bidi, &fetch_bytes("c", "t", 0, 1), false);
    let missed = pair.b.open(Dir::Bidi, &fetch_bytes("b", "t", 0, 1), false);
    pair.settle(Duration::from_millis(50));
    assert!(pair.b.resets.contains(&(hidden.value(), 0x36)));
    let misses: Vec<_> = pair
        .a
        .events
        .iter()
        .filter_map(|e| match e {
            Ev::Fetch { broadcast, .. } => Some(broadcast.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(misses, ["b"]);
    assert!(pair.b.received(missed.value()).is_empty());
}
