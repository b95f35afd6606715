//! After warm-up, the hot paths make no heap allocation: writing frames and
//! groups, and reading them by 1, 100 and 10,000 consumers.
//!
//! A counting global allocator counts the allocations of the current thread
//! only (the test harness runs tests on several threads). To check another
//! path, set it up outside and wrap the step in [`assert_no_alloc`].

use std::task::{Context, Waker};

use skiff_core::model::group::{self, Next as GroupNext};
use skiff_core::model::track::{self, Info, Next};
use skiff_core::pool::{Pool, PoolStorage};
use skiff_core::window::Start;
use skiff_testkit::counting::{Counting, allocs};

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Runs `f` and fails the test, naming the step, if it allocated on the heap.
fn assert_no_alloc<R>(name: &str, f: impl FnOnce() -> R) -> R {
    let before = allocs();
    let out = f();
    let n = allocs() - before;
    assert_eq!(n, 0, "{name}: {n} heap allocation(s)");
    out
}

#[test]
fn the_counter_counts() {
    let before = allocs();
    let v = std::hint::black_box(vec![1u8; 10]);
    assert!(allocs() > before);
    drop(v);
}

// --- helpers ------------------------------------------------------------------------------

/// Reads one whole frame into `buf`; returns its timestamp and length.
fn read_frame(g: &mut group::Consumer<'_, '_>, buf: &mut [u8]) -> Option<(u64, usize)> {
    let GroupNext::Ready(h) = g.read_frame_header().unwrap() else {
        return None;
    };
    let mut got = 0;
    while got < h.len {
        match g.read_payload(&mut buf[got..h.len]).unwrap() {
            GroupNext::Ready(n) => got += n,
            other => panic!("payload stalled: {other:?}"),
        }
    }
    Some((h.timestamp, h.len))
}

// --- write and read -----------------------------------------------------------------------

fn write_and_read_with(consumers: usize) {
    let mut storage = PoolStorage::<256, 64>::new();
    let pool = Pool::new(&mut storage);
    let track = track::State::<4>::new(&pool, Info::new("video").unwrap());
    let t = track.handle();
    let p = track.producer().unwrap();
    let mut cx = Context::from_waker(Waker::noop());
    let payload = [0x5au8; 150];
    let mut buf = [0u8; 256];

    // Warm-up: every consumer and its group reader exist, with room to spare.
    let mut group0 = p.append_group().unwrap();
    group0.write_frame(0, &payload).unwrap();
    let mut tracks: Vec<_> = (0..consumers).map(|_| t.consumer(Start::Latest)).collect();
    let mut readers: Vec<_> = tracks
        .iter_mut()
        .map(|c| c.next_group().unwrap().ready().unwrap())
        .collect();
    for r in &mut readers {
        assert_eq!(read_frame(r, &mut buf), Some((0, payload.len())));
    }
    let version = t.version();
    assert!(t.poll_changed(&mut cx, version).is_pending());

    // Frames.
    assert_no_alloc("write a frame", || {
        group0.write_frame(33, &payload).unwrap();
    });
    assert_no_alloc("read a frame", || {
        for r in &mut readers {
            assert_eq!(read_frame(r, &mut buf), Some((33, payload.len())));
        }
    });
    assert_no_alloc("poll for changes", || {
        assert!(t.poll_changed(&mut cx, version).is_ready());
        let v = t.version();
        assert!(t.poll_changed(&mut cx, v).is_pending());
        for c in &mut tracks {
            assert!(c.poll_next_group(&mut cx).is_pending());
        }
    });

    // Groups: a new one, then every consumer moves on to it.
    assert_no_alloc("finish, start and write a group", || {
        group0.finish().unwrap();
        let mut group1 = p.append_group().unwrap();
        group1.write_frame(66, &payload).unwrap();
        group1.finish().unwrap();
    });
    assert_no_alloc("next group and its first frame", || {
        for (c, r) in tracks.iter_mut().zip(&mut readers) {
            assert_eq!(read_frame(r, &mut buf), None);
            *r = c.next_group().unwrap().ready().unwrap();
            assert_eq!(read_frame(r, &mut buf), Some((66, payload.len())));
        }
    });

    // Ring eviction and lag: a consumer that fell behind jumps to the latest.
    let mut behind = t.consumer(Start::Group(1));
    assert_no_alloc("evict through the ring, lag and catch up", || {
        for seq in 2..8u64 {
            let mut g = p.append_group().unwrap();
            g.write_frame(seq * 33, &payload).unwrap();
            g.finish().unwrap();
        }
        assert!(matches!(behind.next_group(), Ok(Next::Lagged(_))));
        assert_eq!(behind.next_group().unwrap().ready().unwrap().sequence(), 7);
    });

    drop((readers, tracks, behind, group0));
    drop(p);
    drop(track);
    assert_eq!(pool.in_use(), 0);
}

#[test]
fn one_consumer() {
    write_and_read_with(1);
}

#[test]
fn a_hundred_consumers() {
    write_and_read_with(100);
}

#[test]
fn ten_thousand_consumers() {
    write_and_read_with(10_000);
}
