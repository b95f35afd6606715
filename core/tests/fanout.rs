//! Fan-out of one track to many readers: shared blocks, independent positions,
//! lag, eviction (ring, byte budget, max age), out-of-order groups, and blocks
//! returning to the pool.

use skiff_core::model::broadcast;
use skiff_core::model::group::{self, Next as GroupNext, ReadError as GroupReadError};
use skiff_core::model::origin;
use skiff_core::model::path::Path;
use skiff_core::model::track::{self, Info, Limits, Next};
use skiff_core::pool::{Pool, PoolStorage};
use skiff_core::time::Duration;
use skiff_core::window::{End, GroupRange, Request, Start, Window};

const FRAMES: [&[u8]; 3] = [
    b"a keyframe that is a bit longer than one block of the pool",
    b"delta one",
    b"delta two, also spanning a block boundary or two here",
];

/// Reads the next whole frame: (timestamp, payload).
fn read_frame(g: &mut group::Consumer<'_, '_>) -> Option<(u64, Vec<u8>)> {
    let GroupNext::Ready(h) = g.read_frame_header().unwrap() else {
        return None;
    };
    let mut payload = vec![0u8; h.len];
    let mut got = 0;
    while got < h.len {
        match g.read_payload(&mut payload[got..]).unwrap() {
            GroupNext::Ready(n) => got += n,
            other => panic!("payload stalled: {other:?}"),
        }
    }
    Some((h.timestamp, payload))
}

fn write_group(p: &track::Producer<'_, '_>, seq: u64, frames: &[&[u8]]) {
    let mut g = p.create_group(seq).unwrap();
    for (i, f) in frames.iter().enumerate() {
        g.write_frame(seq * 100 + i as u64, f).unwrap();
    }
    g.finish().unwrap();
}

fn next_seq(c: &mut track::Consumer<'_, '_>) -> u64 {
    match c.next_group().unwrap() {
        Next::Ready(g) => g.sequence(),
        other => panic!("expected a group, got {other:?}"),
    }
}

// --- sharing -------------------------------------------------------------------------

/// Pool blocks in use while `n` readers each hold a reader of the same group at
/// their own position.
fn blocks_with_readers(n: usize) -> usize {
    let mut storage = PoolStorage::<64, 16>::new();
    let pool = Pool::new(&mut storage);
    let track = track::State::<4>::new(&pool, Info::new("video").unwrap());
    let p = track.producer().unwrap();
    write_group(&p, 0, &FRAMES);
    let stored = pool.in_use();
    let mut consumers: Vec<_> = (0..n).map(|_| track.consumer(Start::Latest)).collect();
    let mut readers: Vec<_> = consumers
        .iter_mut()
        .map(|c| c.next_group().unwrap().ready().unwrap())
        .collect();
    // Reader i reads i % 4 frames (0 to all 3).
    for (i, r) in readers.iter_mut().enumerate() {
        for (f, frame) in FRAMES.iter().enumerate().take(i % 4) {
            let (ts, payload) = read_frame(r).unwrap();
            assert_eq!(ts, f as u64);
            assert_eq!(payload, *frame);
        }
    }
    if n > 3 {
        let positions: std::collections::BTreeSet<u64> =
            readers[..4].iter().map(|r| r.position()).collect();
        assert_eq!(positions.len(), 4, "each reader at its own position");
    }
    assert_eq!(pool.in_use(), stored, "readers copy nothing");
    let used = pool.in_use();
    drop(readers);
    drop(consumers);
    assert_eq!(pool.in_use(), stored);
    used
}

#[test]
fn readers_share_the_stored_blocks() {
    let one = blocks_with_readers(1);
    assert_eq!(blocks_with_readers(100), one);
    assert_eq!(blocks_with_readers(10_000), one);
}

// --- lag -------------------------------------------------------------------------------

#[test]
fn a_lagging_reader_jumps_and_the_others_go_on() {
    let mut storage = PoolStorage::<64, 32>::new();
    let pool = Pool::new(&mut storage);
    let track = track::State::<3>::new(&pool, Info::new("video").unwrap());
    let p = track.producer().unwrap();
    let mut fast: Vec<_> = (0..100).map(|_| track.consumer(Start::Group(0))).collect();
    let mut slow = track.consumer(Start::Group(0));
    let mut got = vec![Vec::new(); fast.len()];
    for seq in 0..10 {
        write_group(&p, seq, &FRAMES[..1]);
        for (c, got) in fast.iter_mut().zip(&mut got) {
            got.push(next_seq(c));
        }
        if seq == 0 {
            assert_eq!(next_seq(&mut slow), 0);
        }
    }
    let all: Vec<u64> = (0..10).collect();
    assert!(
        got.iter().all(|g| *g == all),
        "fast readers saw every group"
    );
    // The slow reader wanted group 1; groups 7..=9 are kept.
    assert!(matches!(slow.next_group(), Ok(Next::Lagged(8))));
    assert_eq!(next_seq(&mut slow), 9);
    assert!(matches!(slow.next_group(), Ok(Next::Pending)));
    assert!(
        fast.iter_mut()
            .all(|c| matches!(c.next_group(), Ok(Next::Pending)))
    );
}

// --- eviction and the pool ----------------------------------------------------------------

#[test]
fn evicted_blocks_return_when_the_last_reader_drops() {
    let mut storage = PoolStorage::<64, 16>::new();
    let pool = Pool::new(&mut storage);
    {
        let track = track::State::<2>::new(&pool, Info::new("video").unwrap());
        let p = track.producer().unwrap();
        write_group(&p, 0, &FRAMES);
        let group0 = pool.in_use();
        let mut readers: Vec<_> = (0..1000)
            .map(|_| track.handle().group(0).unwrap())
            .collect();
        for r in &mut readers {
            read_frame(r).unwrap();
        }
        // Ring of 2: group 2 evicts group 0 while it is being read.
        write_group(&p, 1, &FRAMES[..1]);
        let two = pool.in_use();
        write_group(&p, 2, &FRAMES[..1]);
        assert!(track.handle().group(0).is_none());
        let groups12 = two - group0 + (two - group0);
        assert!(pool.in_use() > groups12, "readers keep their blocks alive");
        for (i, r) in readers.iter_mut().enumerate() {
            if i % 2 == 0 {
                assert_eq!(r.read_frame_header().unwrap_err(), GroupReadError::Evicted);
            }
        }
        assert!(
            pool.in_use() > groups12,
            "half the readers still hold blocks"
        );
        readers.clear();
        assert_eq!(pool.in_use(), groups12, "back to what groups 1 and 2 hold");
    }
    assert_eq!(pool.in_use(), 0, "dropping the track frees everything");
}

#[test]
fn byte_budget_with_readers() {
    let mut storage = PoolStorage::<64, 16>::new();
    let pool = Pool::new(&mut storage);
    let track = track::State::<8>::with_limits(
        &pool,
        Info::new("video").unwrap(),
        Limits {
            group_bytes: 4096,
            cache_bytes: u64::MAX,
        },
    );
    let t = track.handle();
    let p = track.producer().unwrap();
    write_group(&p, 0, &FRAMES);
    let per_group = pool.in_use();
    assert_eq!(t.held_bytes(), per_group as u64 * 16);
    // Room for two groups.
    t.set_budget(t.held_bytes() * 2);
    // A reader that peeked at its group's first chunk holds the head block.
    let reader = |seq: u64| {
        let mut r = t.group(seq).unwrap();
        assert!(r.chunk().unwrap().ready().is_some());
        r
    };
    let mut readers: Vec<_> = (0..10).map(|_| reader(0)).collect();
    for seq in 1..4 {
        write_group(&p, seq, &FRAMES);
        readers.extend((0..10).map(|_| reader(seq)));
        assert!(t.held_bytes() <= t.budget());
    }
    let mut kept: Vec<u64> = t.sequences().collect();
    kept.sort_unstable();
    assert_eq!(kept, [2, 3]);
    // Readers of evicted groups (at their first block) keep the whole chain alive.
    assert_eq!(pool.in_use(), 4 * per_group);
    readers.clear();
    assert_eq!(pool.in_use(), 2 * per_group);
}

#[test]
fn max_age_expiry_in_presentation_time() {
    let mut storage = PoolStorage::<64, 32>::new();
    let pool = Pool::new(&mut storage);
    // 90 kHz timescale, 1 s max age.
    let info = Info::new("video")
        .unwrap()
        .with_timescale(core::num::NonZeroU64::new(90_000).unwrap())
        .with_max_age(Duration::from_secs(1));
    let track = track::State::<16>::new(&pool, info);
    let t = track.handle();
    let p = track.producer().unwrap();
    // One group per half second of media.
    for seq in 0..4u64 {
        let mut g = p.create_group(seq).unwrap();
        g.write_frame(seq * 45_000, b"frame").unwrap();
        g.finish().unwrap();
    }
    // Newest: 1.5 s. Group 0 superseded at 0.5 s (1 s ago: kept), group 1 at 1 s.
    let mut kept: Vec<u64> = t.sequences().collect();
    kept.sort_unstable();
    assert_eq!(kept, [0, 1, 2, 3]);
    let mut reader = t.group(0).unwrap();
    let mut g = p.create_group(4).unwrap();
    // Newest: 1.75 s. Group 0 is now 1.25 s old, group 1 0.75 s.
    g.write_frame(157_500, b"frame").unwrap();
    let mut kept: Vec<u64> = t.sequences().collect();
    kept.sort_unstable();
    assert_eq!(kept, [1, 2, 3, 4]);
    assert_eq!(
        reader.read_frame_header().unwrap_err(),
        GroupReadError::Evicted
    );
}

// --- relay-style delivery -------------------------------------------------------------------

#[test]
fn out_of_order_groups_reach_a_window_newest_first() {
    let mut storage = PoolStorage::<64, 32>::new();
    let pool = Pool::new(&mut storage);
    let track = track::State::<8>::new(&pool, Info::new("video").unwrap());
    let t = track.handle();
    let p = track.producer().unwrap();
    // A subscriber from group 3 with a generous budget, before anything arrives.
    let req = Request {
        start: Start::Group(3),
        end: End::Open,
        max_latency: Duration::from_secs(10),
        ..Request::LIVE
    };
    let mut window = Window::<4>::resolve(req, &t).unwrap();
    let mut delivered = Vec::new();
    let serve = |window: &mut Window<4>, delivered: &mut Vec<u64>| {
        while let Some(g) = t.next_wanted(window) {
            window.remove(GroupRange::single(g.sequence())).unwrap();
            delivered.push(g.sequence());
        }
    };
    // Upstream sends newest first: 6, then 5 and 4 late, and 2 (not wanted).
    write_group(&p, 6, &FRAMES[..1]);
    serve(&mut window, &mut delivered);
    for seq in [5, 2, 4] {
        write_group(&p, seq, &FRAMES[..1]);
        serve(&mut window, &mut delivered);
    }
    write_group(&p, 3, &FRAMES[..1]);
    write_group(&p, 7, &FRAMES[..1]);
    serve(&mut window, &mut delivered);
    assert_eq!(delivered, [6, 5, 4, 7, 3]);
    assert_eq!(
        p.create_group(5).unwrap_err(),
        track::CreateError::Duplicate
    );
}

// --- the whole chain: origin → broadcast → track ------------------------------------------

#[test]
fn lookup_through_origin_and_broadcast() {
    let mut storage = PoolStorage::<16, 32>::new();
    let pool = Pool::new(&mut storage);
    let video = track::State::<4>::new(&pool, Info::new("video").unwrap());
    let bc = broadcast::State::<4>::new(Path::new("room/cam").unwrap()).unwrap();
    let origin = origin::State::<4, 8>::new();
    let o = origin.handle();
    let bp = bc.producer().unwrap();
    bp.add(video.handle()).unwrap();
    o.announce(bc.handle()).unwrap();
    let tp = video.producer().unwrap();
    write_group(&tp, 0, &FRAMES);

    // A subscriber: SUBSCRIBE room/cam video.
    let b = o.get(Path::new("room/cam").unwrap()).unwrap();
    let t = b.track("video").unwrap();
    assert_eq!(t.info().to_wire().timescale.get(), 1000);
    let mut c = t.consumer(Start::Latest);
    let mut g = c.next_group().unwrap().ready().unwrap();
    assert_eq!(read_frame(&mut g).unwrap().1, FRAMES[0]);
    assert!(b.track("audio").is_none());
    let (suffix, _) = o.under(Path::new("room").unwrap()).next().unwrap();
    assert_eq!(suffix, "cam");
}
