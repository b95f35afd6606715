//! Unit tests of the track: info, creating and reading groups, the byte
//! budget, max age, window-driven reading, notification, reuse, failover and
//! the subscriber books.

extern crate std;

use core::num::NonZeroU64;
use core::task::{Context, Poll, Waker};

use super::*;
use crate::pool::{Pool, PoolStorage};
use crate::time::{Duration, Instant};
use crate::window::{End, GroupRange, Request, Start, Timeline, Window};
use crate::wire::lite::TrackInfo;
use proptest::prelude::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Wake;
use std::vec::Vec;

fn info(name: &str) -> Info {
    Info::new(name).unwrap()
}

/// Held sequences, sorted.
fn held(t: Ref<'_, '_>) -> Vec<u64> {
    let mut v: Vec<u64> = t.sequences().collect();
    v.sort_unstable();
    v
}

/// The sequence of the next group, or a description of what came instead.
fn next(c: &mut Consumer<'_, '_>) -> Result<u64, std::string::String> {
    match c.next_group() {
        Ok(Next::Ready(g)) => Ok(g.sequence()),
        other => Err(std::format!("{other:?}")),
    }
}

/// Writes one frame per group for `seqs` (timestamp = 10 × seq) and finishes them.
fn fill(p: &Producer<'_, '_>, seqs: impl IntoIterator<Item = u64>) {
    for seq in seqs {
        let mut g = p.create_group(seq).unwrap();
        g.write_frame(seq * 10, b"frame").unwrap();
        g.finish().unwrap();
    }
}

struct Counter(AtomicUsize);

impl Wake for Counter {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn counter() -> (Arc<Counter>, Waker) {
    let c = Arc::new(Counter(AtomicUsize::new(0)));
    (c.clone(), Waker::from(c))
}

fn woken(c: &Arc<Counter>) -> usize {
    c.0.load(Ordering::SeqCst)
}

// --- info -----------------------------------------------------------------------

#[test]
fn info_defaults_and_wire_values() {
    let i = info("video");
    assert_eq!(i.name, "video");
    assert_eq!(i.name.as_str(), "video");
    assert_eq!(
        (i.priority, i.max_age, i.timescale.get()),
        (127, Duration::from_millis(5000), 1000)
    );
    let wire = TrackInfo {
        priority: 3,
        max_age: Duration::from_millis(250),
        timescale: NonZeroU64::new(90_000).unwrap(),
    };
    let j = Info::from_wire("audio", wire).unwrap();
    assert_eq!(j.to_wire(), wire);
    assert_eq!(j.name, "audio");
    let long = [b'x'; MAX_NAME_LEN + 1];
    let long = core::str::from_utf8(&long).unwrap();
    assert_eq!(Info::new(long), Err(NameTooLong));
    assert!(Info::new(&long[1..]).is_ok());
    // 90 kHz: 90_000 units are one second.
    assert_eq!(j.instant(90_000), Instant::from_micros(1_000_000));
    assert_eq!(info("x").instant(u64::MAX), Instant::from_micros(u64::MAX));
    assert_eq!(std::format!("{}", i.name), "video");
    assert_ne!(Name::new("a").unwrap(), Name::new("a ").unwrap());
}

// --- creating groups ------------------------------------------------------------

#[test]
fn append_creates_consecutive_groups() {
    let mut storage = PoolStorage::<16, 32>::new();
    let pool = Pool::new(&mut storage);
    let track = State::<4>::new(&pool, info("v"));
    let p = track.producer().unwrap();
    for expect in 0..3 {
        let g = p.append_group().unwrap();
        assert_eq!(g.sequence(), expect);
    }
    assert_eq!(held(track.handle()), [0, 1, 2]);
    assert_eq!(track.handle().latest(), Some(2));
    assert_eq!(track.handle().oldest(), Some(0));
    // Every group was dropped unfinished, so it was aborted.
    assert_eq!(
        track.handle().group(1).unwrap().chunk().unwrap_err(),
        group::ReadError::Aborted(group::ABORT_DROPPED)
    );
}

#[test]
fn out_of_order_groups_newest_first() {
    let mut storage = PoolStorage::<16, 32>::new();
    let pool = Pool::new(&mut storage);
    let track = State::<3>::new(&pool, info("v"));
    let t = track.handle();
    let p = track.producer().unwrap();
    fill(&p, [10, 8, 9]);
    assert_eq!(held(t), [8, 9, 10]);
    assert_eq!(t.latest(), Some(10));
    assert_eq!(p.create_group(9).unwrap_err(), CreateError::Duplicate);
    // Full ring: an older group than everything kept is skipped, typed.
    assert_eq!(p.create_group(7).unwrap_err(), CreateError::TooOld);
    assert_eq!(held(t), [8, 9, 10], "unchanged on error");
    // A newer one evicts the oldest.
    fill(&p, [12]);
    assert_eq!(held(t), [9, 10, 12]);
    // A late group between kept ones replaces the oldest kept.
    fill(&p, [11]);
    assert_eq!(held(t), [10, 11, 12]);
    assert_eq!(t.latest(), Some(12));
    assert_eq!(t.evicted_count(), 2);
    // The latest group is never evicted, even with a ring of one.
    let mut storage = PoolStorage::<4, 32>::new();
    let pool = Pool::new(&mut storage);
    let one = State::<1>::new(&pool, info("v"));
    let p = one.producer().unwrap();
    fill(&p, [5]);
    assert_eq!(p.create_group(4).unwrap_err(), CreateError::TooOld);
    fill(&p, [6]);
    assert_eq!(held(one.handle()), [6]);
    assert_eq!(pool.in_use(), 1);
}

#[test]
fn one_producer_and_end_states() {
    let mut storage = PoolStorage::<8, 32>::new();
    let pool = Pool::new(&mut storage);
    let track = State::<2>::new(&pool, info("v"));
    let t = track.handle();
    let mut p = track.producer().unwrap();
    assert_eq!(t.producer().unwrap_err(), ProducerTaken);
    let mut open = p.append_group().unwrap();
    assert!(p.finish());
    assert!(!p.finish());
    assert_eq!(t.status(), Status::Finished);
    assert_eq!(p.append_group().unwrap_err(), CreateError::Finished);
    // An open group can still be completed after the track finished.
    open.write_frame(0, b"late").unwrap();
    open.finish().unwrap();
    drop(p);
    assert_eq!(
        t.status(),
        Status::Finished,
        "dropping after finish keeps it finished"
    );
    let p = t.producer().unwrap();
    assert_eq!(p.append_group().unwrap_err(), CreateError::Finished);
    drop(p);

    let other = State::<2>::new(&pool, info("w"));
    let p = other.producer().unwrap();
    let mut g = p.append_group().unwrap();
    g.write_frame(0, b"x").unwrap();
    drop(p);
    assert_eq!(
        other.handle().status(),
        Status::Aborted(group::ABORT_DROPPED),
        "dropping an open track's producer aborts it"
    );
    assert_eq!(
        g.write_frame(1, b"y"),
        Err(group::WriteError::Aborted(group::ABORT_DROPPED))
    );
    assert_eq!(
        other.consumer(Start::Group(0)).next_group().unwrap_err(),
        ReadError::Aborted(group::ABORT_DROPPED)
    );
}

// --- consumers ------------------------------------------------------------------

#[test]
fn consumer_reads_in_order_then_pending_then_finished() {
    let mut storage = PoolStorage::<16, 32>::new();
    let pool = Pool::new(&mut storage);
    let track = State::<4>::new(&pool, info("v"));
    let mut p = track.producer().unwrap();
    let mut from_start = track.consumer(Start::Group(0));
    let mut live = track.consumer(Start::Latest);
    assert!(matches!(from_start.next_group(), Ok(Next::Pending)));
    fill(&p, [0, 1]);
    let mut late_live = track.consumer(Start::Latest);
    assert_eq!(next(&mut from_start), Ok(0));
    assert_eq!(next(&mut from_start), Ok(1));
    assert_eq!(
        next(&mut live),
        Ok(0),
        "no group at start: the first to come"
    );
    assert_eq!(
        next(&mut late_live),
        Ok(1),
        "latest start: the latest group"
    );
    assert!(matches!(late_live.next_group(), Ok(Next::Pending)));
    // A late older group is not given to readers past it.
    fill(&p, [3]);
    assert_eq!(next(&mut late_live), Ok(3));
    fill(&p, [2]);
    assert!(matches!(late_live.next_group(), Ok(Next::Pending)));
    p.finish();
    assert!(matches!(late_live.next_group(), Ok(Next::Finished)));
    assert_eq!(next(&mut from_start), Ok(2));
    assert_eq!(next(&mut from_start), Ok(3));
    assert!(matches!(from_start.next_group(), Ok(Next::Finished)));
    // Each reader reads the group from its first byte.
    let mut g = track
        .consumer(Start::Group(2))
        .next_group()
        .unwrap()
        .ready()
        .unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(
        g.read_frame_header().unwrap().ready().unwrap().timestamp,
        20
    );
    assert_eq!(g.read_payload(&mut buf), Ok(group::Next::Ready(5)));
}

#[test]
fn lagging_consumer_jumps_to_the_latest() {
    let mut storage = PoolStorage::<16, 32>::new();
    let pool = Pool::new(&mut storage);
    let track = State::<2>::new(&pool, info("v"));
    let p = track.producer().unwrap();
    let mut slow = track.consumer(Start::Group(0));
    let mut fast = track.consumer(Start::Group(0));
    fill(&p, [0]);
    assert_eq!(next(&mut slow), Ok(0));
    assert_eq!(next(&mut fast), Ok(0));
    for seq in 1..6 {
        fill(&p, [seq]);
        assert_eq!(
            next(&mut fast),
            Ok(seq),
            "a reader that keeps up never lags"
        );
    }
    assert_eq!(held(track.handle()), [4, 5]);
    // slow wants 1, which is gone: it skips 1..=4 and lands on 5.
    assert!(matches!(slow.next_group(), Ok(Next::Lagged(4))));
    assert_eq!(slow.position(), 5);
    assert_eq!(next(&mut slow), Ok(5));
    assert!(matches!(slow.next_group(), Ok(Next::Pending)));
    // Seeking back into the evicted range lags again.
    slow.seek(2);
    assert!(matches!(slow.next_group(), Ok(Next::Lagged(3))));
}

#[test]
fn reading_an_evicted_group_fails_and_the_next_one_follows() {
    let mut storage = PoolStorage::<16, 8>::new();
    let pool = Pool::new(&mut storage);
    let track = State::<2>::new(&pool, info("v"));
    let p = track.producer().unwrap();
    let mut c = track.consumer(Start::Group(0));
    fill(&p, [0]);
    let mut g0 = c.next_group().unwrap().ready().unwrap();
    let first = g0.chunk().unwrap().ready().unwrap().len();
    g0.advance(first);
    fill(&p, [1, 2]);
    assert_eq!(g0.chunk().unwrap_err(), group::ReadError::Evicted);
    assert_eq!(next(&mut c), Ok(1), "no lag: group 0 had been given");
}

// --- byte budget ----------------------------------------------------------------

#[test]
fn byte_budget_evicts_the_oldest_non_latest() {
    let mut storage = PoolStorage::<32, 16>::new();
    let pool = Pool::new(&mut storage);
    let limits = Limits {
        group_bytes: 1024,
        cache_bytes: 64, // 4 blocks
    };
    let track = State::<8>::with_limits(&pool, info("v"), limits);
    let t = track.handle();
    let p = track.producer().unwrap();
    // Each group: header (2 bytes) + 20 bytes = 22 bytes = 2 blocks.
    for seq in 0..2 {
        let mut g = p.create_group(seq).unwrap();
        g.write_frame(seq, &[seq as u8; 20]).unwrap();
        g.finish().unwrap();
    }
    assert_eq!((t.held_bytes(), pool.in_use()), (64, 4));
    let mut g = p.create_group(2).unwrap();
    assert_eq!(held(t), [0, 1, 2], "an empty group costs nothing");
    g.write_frame(2, &[2; 20]).unwrap();
    assert_eq!(held(t), [1, 2]);
    assert_eq!((t.held_bytes(), pool.in_use()), (64, 4));
    // A latest group growing past the budget is trimmed, not kept whole:
    // it then holds only its tail block, and nothing else had to go for it.
    g.write_frame(3, &[3; 36]).unwrap(); // 22 + 38 bytes: 4 blocks, at the budget
    assert_eq!(held(t), [2]);
    assert_eq!((t.held_bytes(), pool.in_use()), (64, 4));
    g.write_frame(4, &[4; 14]).unwrap(); // 76 bytes > 64: trimmed
    assert!(g.state().is_trimmed());
    assert_eq!((t.held_bytes(), pool.in_use()), (16, 1));
    assert_eq!(
        t.group(2).unwrap().chunk().unwrap_err(),
        group::ReadError::Trimmed
    );
    g.finish().unwrap();
    assert_eq!((t.held_bytes(), pool.in_use()), (0, 0));
    // A late older group is a candidate for eviction too, even while empty.
    t.set_budget(48);
    fill(&p, [3]);
    let mut late = p.create_group(1).unwrap();
    late.write_frame(1, &[1; 10]).unwrap(); // 1 block: 32 bytes held
    assert_eq!(held(t), [1, 2, 3]);
    assert_eq!(
        late.write_frame(1, &[1; 30]), // 2 more blocks: it is the oldest
        Err(group::WriteError::Evicted)
    );
    assert_eq!(held(t), [2, 3]);
    // Raising the budget stops evictions.
    t.set_budget(u64::MAX);
    fill(&p, [4, 5]);
    assert_eq!(held(t), [2, 3, 4, 5]);
}

#[test]
fn group_over_the_budget_is_trimmed_and_held_bytes_stay_bounded() {
    // A 16 MiB group in a 256 KiB budget, through a 512 KiB pool of 16 KiB
    // blocks, read by one track consumer under a 256 KiB pacing window.
    let bs: usize = if cfg!(miri) { 64 } else { 16 << 10 };
    const BLOCKS: usize = 32;
    let budget = 16 * bs as u64;
    let window = budget;
    let total = if cfg!(miri) { 64 * bs } else { 1024 * bs } as u64;
    let frame = bs / 2 + 1;
    let mut bytes = std::vec![0u8; BLOCKS * bs];
    let mut meta: Vec<crate::pool::BlockMeta> =
        (0..BLOCKS).map(|_| crate::pool::BlockMeta::new()).collect();
    let pool = Pool::from_parts(&mut bytes, &mut meta).unwrap();
    let limits = Limits {
        group_bytes: u64::MAX,
        cache_bytes: budget,
    };
    let track = State::<4>::with_limits(&pool, info("v"), limits);
    let t = track.handle();
    let p = track.producer().unwrap();
    let mut c = track.consumer(Start::Group(0));
    let mut g = p.create_group(0).unwrap();
    let mut r = c.next_group().unwrap().ready().unwrap();
    let payload = std::vec![0x5a; frame];
    let (mut read, mut max_held, mut ts) = (0u64, 0u64, 0u64);
    let mut buf = std::vec![0u8; bs + 7];
    loop {
        r.pace(window);
        while g.state().bytes_written() < total && g.allowance() >= frame as u64 + 4 {
            g.write_frame(ts, &payload).unwrap();
            ts += 1;
            max_held = max_held.max(t.held_bytes());
        }
        if g.state().bytes_written() >= total && g.state().is_open() {
            g.finish().unwrap();
        }
        match r.read(&mut buf).unwrap() {
            group::Next::Ready(n) => read += n as u64,
            group::Next::Finished => break,
            group::Next::Pending => panic!("stalled at {read}"),
        }
    }
    assert_eq!(read, g.state().bytes_written());
    assert!(g.state().is_trimmed());
    assert!(max_held <= budget, "held {max_held}");
    assert!(pool.high_water() <= window as usize / bs + 2);
    assert_eq!(
        t.held_bytes(),
        0,
        "finished and trimmed: only the reader's block"
    );
    assert_eq!(pool.in_use(), 1);
    // A reader that comes now cannot start at byte 0.
    assert_eq!(
        t.group(0).unwrap().chunk().unwrap_err(),
        group::ReadError::Trimmed
    );
    // Later groups within the budget are held whole again.
    fill(&p, [1, 2]);
    assert_eq!(held(t), [0, 1, 2]);
    assert_eq!(
        t.group(1)
            .unwrap()
            .chunk()
            .unwrap()
            .ready()
            .map(<[u8]>::len),
        Some(7)
    );
    drop(r);
    assert_eq!(pool.in_use(), 2);
}

// --- max age ----------------------------------------------------------------------

#[test]
fn groups_expire_by_presentation_time() {
    let mut storage = PoolStorage::<32, 32>::new();
    let pool = Pool::new(&mut storage);
    // Timescale 1000: timestamps in ms; max age 100 ms.
    let track = State::<8>::new(&pool, info("v").with_max_age(Duration::from_millis(100)));
    let t = track.handle();
    let p = track.producer().unwrap();
    let frame = |seq: u64, ts: &[u64]| {
        let mut g = p.create_group(seq).unwrap();
        for &x in ts {
            g.write_frame(x, b"f").unwrap();
        }
        g.finish().unwrap();
    };
    frame(0, &[0, 20]);
    frame(1, &[50, 90]);
    frame(2, &[140]);
    // Group 0 is superseded at 50 (group 1 begins), newest is 140: 90 ms old.
    assert_eq!(held(t), [0, 1, 2]);
    assert_eq!(t.superseded_at(0), Some(Instant::from_millis(50)));
    assert_eq!(t.superseded_at(1), Some(Instant::from_millis(140)));
    assert_eq!(Timeline::newest(&t), Instant::from_millis(140));
    assert_eq!(t.superseded_at(7), None);
    let mut g = p.create_group(3).unwrap();
    g.write_frame(151, b"f").unwrap();
    // 151 - 50 = 101 ms > 100 ms: group 0 goes; group 1 (140) stays.
    assert_eq!(held(t), [1, 2, 3]);
    g.write_frame(400, b"f").unwrap();
    assert_eq!(held(t), [3], "the latest group is never stale");
    // A late group already past max age is refused, typed.
    assert_eq!(p.create_group(2).unwrap_err(), CreateError::TooOld);
    assert_eq!(t.evicted_count(), 3);
}

#[test]
fn timeline_with_an_empty_latest_group() {
    let mut storage = PoolStorage::<8, 32>::new();
    let pool = Pool::new(&mut storage);
    let track = State::<4>::new(&pool, info("v"));
    let t = track.handle();
    assert_eq!(t.latest(), None);
    assert_eq!(Timeline::newest(&t), Instant::ZERO);
    let p = track.producer().unwrap();
    fill(&p, [0]);
    let _g1 = p.create_group(1).unwrap();
    // Group 1 has no frame yet: the newest frame is group 0's.
    assert_eq!(Timeline::newest(&t), Instant::from_millis(0));
    assert_eq!(t.superseded_at(0), Some(Instant::from_millis(0)));
}

// --- window-driven reading ----------------------------------------------------------

#[test]
fn next_wanted_is_newest_first_within_the_window() {
    let mut storage = PoolStorage::<32, 32>::new();
    let pool = Pool::new(&mut storage);
    let track = State::<8>::new(&pool, info("v"));
    let t = track.handle();
    let p = track.producer().unwrap();
    fill(&p, [0, 1, 2, 3]);
    let req = Request {
        start: Start::Group(1),
        end: End::Group(2),
        max_latency: Duration::from_secs(10),
        ..Request::LIVE
    };
    let mut w = Window::<4>::resolve(req, &t).unwrap();
    let mut order = Vec::new();
    while let Some(g) = t.next_wanted(&w) {
        order.push(g.sequence());
        w.remove(GroupRange::single(g.sequence())).unwrap();
    }
    assert_eq!(order, [2, 1]);
    // Max latency 0: only the live edge is deliverable.
    let w = Window::<4>::resolve(
        Request {
            start: Start::Group(0),
            ..Request::LIVE
        },
        &t,
    )
    .unwrap();
    assert_eq!(t.next_wanted(&w).map(|g| g.sequence()), Some(3));
    let mut w = w;
    w.remove(GroupRange::single(3)).unwrap();
    assert!(
        t.next_wanted(&w).is_none(),
        "the rest is expired for max latency 0"
    );
    assert_eq!(t.latest_group().map(|g| g.sequence()), Some(3));
    assert!(t.group(9).is_none());
}

// --- notification -----------------------------------------------------------------

#[test]
fn version_bumps_and_wakers_fire() {
    let mut storage = PoolStorage::<8, 32>::new();
    let pool = Pool::new(&mut storage);
    let track = State::<4>::new(&pool, info("v"));
    let t = track.handle();
    let p = track.producer().unwrap();
    let (count, waker) = counter();
    let mut cx = Context::from_waker(&waker);
    let v0 = t.version();
    assert_eq!(t.poll_changed(&mut cx, v0), Poll::Pending);
    assert_eq!(
        t.poll_changed(&mut cx, v0),
        Poll::Pending,
        "same task: one place"
    );
    let mut g = p.append_group().unwrap();
    assert_eq!(woken(&count), 1);
    let v1 = t.version();
    assert!(v1 > v0);
    assert_eq!(t.poll_changed(&mut cx, v0), Poll::Ready(v1));
    for step in 0..3 {
        let before = t.version();
        match step {
            0 => g.write_frame(0, b"x").unwrap(),
            1 => {
                g.begin_frame(1, 2).unwrap();
                g.write_payload(b"ab").unwrap();
            }
            _ => g.finish().unwrap(),
        }
        assert!(t.version() > before, "step {step}");
    }
    // A consumer waiting for a group registers itself.
    let mut c = track.consumer(Start::Group(1));
    assert!(c.poll_next_group(&mut cx).is_pending());
    let woke = woken(&count);
    fill(&p, [1]);
    assert_eq!(woken(&count), woke + 1);
    assert!(matches!(
        c.poll_next_group(&mut cx),
        Poll::Ready(Ok(Next::Ready(_)))
    ));
}

#[test]
fn announce_step_wakes_once_per_step_or_frame() {
    // 4 blocks of 32 bytes: room for one streamed frame of 100 bytes.
    let mut storage = PoolStorage::<4, 32>::new();
    let pool = Pool::new(&mut storage);
    let track = State::<4>::new(&pool, info("a"));
    let t = track.handle();
    let p = track.producer().unwrap();
    let mut g = p.append_group().unwrap();
    g.set_announce_step(40);
    let (count, waker) = counter();
    let mut cx = Context::from_waker(&waker);
    let v = t.version();
    assert_eq!(t.poll_changed(&mut cx, v), Poll::Pending);
    // The frame's start (3 header bytes) and pieces under the step:
    // stored and readable, nobody woken.
    g.begin_frame(0, 100).unwrap();
    assert_eq!(g.write_payload(&[1; 25]).unwrap(), 25);
    assert_eq!((t.version(), woken(&count), g.unannounced()), (v, 0, 28));
    let mut c = track.consumer(Start::Group(0));
    assert!(matches!(
        c.poll_next_group(&mut cx),
        Poll::Ready(Ok(Next::Ready(_)))
    ));
    // The step reached: one wake-up for both pieces.
    assert_eq!(g.write_payload(&[2; 25]).unwrap(), 25);
    assert_eq!((woken(&count), g.unannounced()), (1, 0));
    let v = t.version();
    // `announce` wakes for what is pending, and only then.
    assert_eq!(g.write_payload(&[3; 10]).unwrap(), 10);
    assert_eq!(t.version(), v);
    g.announce();
    assert!(t.version() != v && g.unannounced() == 0);
    let v = t.version();
    g.announce();
    assert_eq!(t.version(), v, "nothing pending: no bump");
    // A writer the pool turns away announces what it stored first.
    let mut held = Vec::new();
    while let Ok(b) = pool.alloc() {
        held.push(b);
    }
    let mut stored = 0;
    let err = loop {
        match g.write_payload(&[4; 1]) {
            Ok(n) => stored += n,
            Err(e) => break e,
        }
    };
    assert_eq!(err, group::WriteError::PoolExhausted);
    assert!(stored < 40);
    assert!(t.version() != v && g.unannounced() == 0);
    // The frame's end always wakes.
    drop(held);
    let v = t.version();
    let rest = g.frame_remaining();
    assert_eq!(g.write_payload(&[5; 100][..rest]).unwrap(), rest);
    assert!(t.version() != v && g.unannounced() == 0);
}

#[test]
fn waker_overflow_wakes_everyone() {
    let wakers = Wakers::<2>::new();
    let tasks: Vec<_> = (0..3).map(|_| counter()).collect();
    wakers.register(&tasks[0].1);
    wakers.register(&tasks[1].1);
    assert_eq!(wakers.len(), 2);
    wakers.register(&tasks[2].1);
    assert_eq!(woken(&tasks[0].0) + woken(&tasks[1].0), 2);
    assert_eq!(wakers.len(), 1);
    wakers.wake();
    assert_eq!(woken(&tasks[2].0), 1);
    assert!(wakers.is_empty());
    // No place at all: woken at once.
    let none = Wakers::<0>::new();
    none.register(&tasks[0].1);
    assert_eq!(woken(&tasks[0].0), 2);
}

// --- reuse ------------------------------------------------------------------------

#[test]
fn reopen_makes_every_handle_stale() {
    let mut storage = PoolStorage::<8, 32>::new();
    let pool = Pool::new(&mut storage);
    let track = State::<4>::new(&pool, info("old"));
    let t = track.handle();
    let p = track.producer().unwrap();
    fill(&p, [0, 1]);
    let mut g = p.append_group().unwrap();
    let mut c = track.consumer(Start::Group(0));
    let mut reader = t.group(0).unwrap();
    let old = t;
    let t = t.reopen(info("new"));
    assert!(!old.is_current() && t.is_current());
    assert_ne!(old.key(), t.key());
    assert!(!old.same_track(&t));
    assert!(old.producer().is_err(), "a stale handle makes no producer");
    assert_eq!(
        old.consumer(Start::Latest).next_group().unwrap_err(),
        ReadError::Stale
    );
    assert_eq!(pool.in_use(), 1, "the reader anchors group 0's first block");
    assert!(t.has_name("new") && !t.has_name("old"));
    assert_eq!((t.latest(), t.len(), t.status()), (None, 0, Status::Open));
    assert_eq!(p.append_group().unwrap_err(), CreateError::Stale);
    assert_eq!(c.next_group().unwrap_err(), ReadError::Stale);
    assert_eq!(reader.chunk().unwrap_err(), group::ReadError::Evicted);
    assert_eq!(pool.in_use(), 0, "a stale reader lets go at its next read");
    assert_eq!(g.write_frame(0, b"x"), Err(group::WriteError::Evicted));
    // A new producer may start at once; the stale one's drop changes nothing.
    let q = t.producer().unwrap();
    drop(p);
    drop(g);
    assert_eq!(t.status(), Status::Open);
    fill(&q, [7]);
    assert_eq!(held(t), [7]);
}

#[test]
fn dropped_group_producer_aborts_and_notifies() {
    let mut storage = PoolStorage::<8, 32>::new();
    let pool = Pool::new(&mut storage);
    let track = State::<4>::new(&pool, info("v"));
    let t = track.handle();
    let p = track.producer().unwrap();
    let mut g = p.append_group().unwrap();
    g.write_frame(0, b"x").unwrap();
    let v = t.version();
    drop(g);
    assert!(t.version() > v);
    assert_eq!(
        t.group(0).unwrap().chunk().unwrap_err(),
        group::ReadError::Aborted(group::ABORT_DROPPED)
    );
    assert_eq!(pool.in_use(), 0);
}

#[test]
fn abort_reaches_groups_and_readers() {
    let mut storage = PoolStorage::<8, 32>::new();
    let pool = Pool::new(&mut storage);
    let track = State::<4>::new(&pool, info("v"));
    let t = track.handle();
    let mut p = track.producer().unwrap();
    fill(&p, [0]);
    let mut open = p.append_group().unwrap();
    open.write_frame(1, b"x").unwrap();
    assert!(p.abort(0x36));
    assert!(!p.abort(0x1));
    assert_eq!(
        open.write_frame(2, b"y"),
        Err(group::WriteError::Aborted(0x36))
    );
    assert_eq!(
        t.group(0).unwrap().chunk().unwrap().ready(),
        Some(&[0x00, 0x05, b'f', b'r', b'a', b'm', b'e'][..])
    );
    assert_eq!(
        track.consumer(Start::Group(0)).next_group().unwrap_err(),
        ReadError::Aborted(0x36)
    );
    assert_eq!(p.append_group().unwrap_err(), CreateError::Aborted(0x36));
}

// --- failover -------------------------------------------------------------------------

#[test]
fn failover_abort_detaches_and_a_new_producer_continues() {
    let mut storage = PoolStorage::<16, 32>::new();
    let pool = Pool::new(&mut storage);
    let track = State::<4>::new(&pool, info("v"));
    let t = track.handle();
    assert!(!t.failover());
    t.set_failover(true);
    assert!(t.failover());
    let mut p = track.producer().unwrap();
    assert!(t.has_producer());
    let mut c = track.consumer(Start::Group(0));
    fill(&p, [0]);
    let mut open = p.create_group(1).unwrap();
    open.write_frame(10, b"cut").unwrap();
    let mut cut = t.group(1).unwrap();
    assert_eq!(next(&mut c), Ok(0));
    let v = t.version();
    assert!(p.abort(0x36));
    // The track is not ended; the open group is, with the code.
    assert_eq!(t.status(), Status::Open);
    assert!(t.version() > v);
    assert!(!t.has_producer());
    assert_eq!(cut.chunk().unwrap_err(), group::ReadError::Aborted(0x36));
    assert_eq!(
        open.write_frame(11, b"x"),
        Err(group::WriteError::Aborted(0x36))
    );
    assert_eq!(
        t.group(0)
            .unwrap()
            .chunk()
            .unwrap()
            .ready()
            .map(<[u8]>::len),
        Some(7)
    );
    // The detached producer is stale; its drop changes nothing.
    assert!(!p.is_current());
    assert_eq!(p.append_group().unwrap_err(), CreateError::Stale);
    assert!(!p.finish());
    assert!(!p.abort(0x1));
    drop(p);
    assert_eq!(t.status(), Status::Open);
    // Readers see no end across the hand-over.
    assert_eq!(next(&mut c), Ok(1), "the aborted group is still given");
    let (count, waker) = counter();
    let mut cx = Context::from_waker(&waker);
    assert!(c.poll_next_group(&mut cx).is_pending());
    // A new producer continues: the cut group may come again, then new ones.
    let q = t.producer().unwrap();
    assert_eq!(q.create_group(0).unwrap_err(), CreateError::Duplicate);
    let mut again = q.create_group(1).unwrap();
    assert_eq!(
        cut.chunk().unwrap_err(),
        group::ReadError::Evicted,
        "the cut group's slot was reused"
    );
    again.write_frame(10, b"whole").unwrap();
    again.finish().unwrap();
    assert_eq!(
        t.group(1).unwrap().chunk().unwrap().ready(),
        Some(&[0x14, 0x05, b'w', b'h', b'o', b'l', b'e'][..])
    );
    assert!(woken(&count) > 0);
    fill(&q, [2]);
    assert_eq!(next(&mut c), Ok(2));
    assert!(matches!(c.next_group(), Ok(Next::Pending)));
    assert_eq!(held(t), [0, 1, 2]);
}

#[test]
fn failover_drop_detaches_and_clearing_the_flag_restores_abort() {
    let mut storage = PoolStorage::<16, 32>::new();
    let pool = Pool::new(&mut storage);
    let track = State::<4>::new(&pool, info("v"));
    let t = track.handle();
    t.set_failover(true);
    let mut c = track.consumer(Start::Group(0));
    let p = track.producer().unwrap();
    fill(&p, [0]);
    let mut open = p.append_group().unwrap();
    open.write_frame(1, b"x").unwrap();
    drop(p);
    assert_eq!(t.status(), Status::Open);
    assert_eq!(
        open.write_frame(2, b"y"),
        Err(group::WriteError::Aborted(group::ABORT_DROPPED))
    );
    drop(open);
    assert_eq!(next(&mut c), Ok(0));
    assert_eq!(next(&mut c), Ok(1));
    // A second loss, then the flag is cleared: the next abort ends the track.
    let p = t.producer().unwrap();
    fill(&p, [2]);
    drop(p);
    assert_eq!(t.status(), Status::Open);
    assert_eq!(next(&mut c), Ok(2));
    t.set_failover(false);
    let mut p = t.producer().unwrap();
    assert!(p.abort(0x5));
    assert_eq!(t.status(), Status::Aborted(0x5));
    assert_eq!(c.next_group().unwrap_err(), ReadError::Aborted(0x5));
    drop(p);
    assert!(t.producer().is_ok());
    assert_eq!(t.status(), Status::Aborted(0x5));
}

/// A relay replacing a track's source lets the old producer go while it
/// still lives: the old one is stale, a new one continues the track.
#[test]
fn detach_producer_lets_a_live_producer_go_and_its_serial_tells() {
    let mut storage = PoolStorage::<16, 32>::new();
    let pool = Pool::new(&mut storage);
    let track = State::<4>::new(&pool, info("v"));
    let t = track.handle();
    let old = t.producer().unwrap();
    assert!(!t.detach_producer(0x1), "only in failover mode");
    t.set_failover(true);
    let serial = t.producer_serial();
    fill(&old, [0]);
    let mut open = old.create_group(1).unwrap();
    open.write_frame(10, b"cut").unwrap();
    assert!(t.detach_producer(0x1));
    assert_ne!(t.producer_serial(), serial, "the holder can tell");
    assert!(!t.detach_producer(0x1), "nothing attached any more");
    assert_eq!(t.status(), Status::Open);
    assert_eq!(
        open.write_frame(11, b"x"),
        Err(group::WriteError::Aborted(0x1))
    );
    // The old producer's late groups are refused; a new one continues.
    assert_eq!(old.create_group(2).unwrap_err(), CreateError::Stale);
    let new = t.producer().unwrap();
    fill(&new, [5]);
    drop(old);
    assert_eq!(t.status(), Status::Open, "the stale drop changes nothing");
    assert!(t.has_producer());
    assert_eq!(held(t), [0, 1, 5]);
}

#[test]
fn failover_keeps_finish_and_reopen_clears_it() {
    let mut storage = PoolStorage::<16, 32>::new();
    let pool = Pool::new(&mut storage);
    let track = State::<4>::new(&pool, info("v"));
    let t = track.handle();
    t.set_failover(true);
    let mut p = track.producer().unwrap();
    let mut open = p.append_group().unwrap();
    assert!(p.finish());
    assert_eq!(t.status(), Status::Finished);
    // Finished: the drop leaves the open group to its writer, as without failover.
    drop(p);
    open.write_frame(0, b"late").unwrap();
    // An abort through a later producer only cuts open groups; the track stays finished.
    let mut q = t.producer().unwrap();
    assert!(q.abort(0x7));
    assert_eq!(t.status(), Status::Finished);
    assert_eq!(
        open.write_frame(1, b"x"),
        Err(group::WriteError::Aborted(0x7))
    );
    drop(q);
    let t = t.reopen(info("w"));
    assert!(!t.failover());
    let p = t.producer().unwrap();
    drop(p);
    assert_eq!(t.status(), Status::Aborted(group::ABORT_DROPPED));
}

// --- property: random interleavings ----------------------------------------------------

#[derive(Debug, Clone)]
enum Op {
    Create(u64),
    Append,
    Write(usize, usize),
    Finish(usize),
    Drop(usize),
    Read(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0u64..24).prop_map(Op::Create),
        2 => Just(Op::Append),
        5 => (any::<usize>(), 0usize..40).prop_map(|(i, n)| Op::Write(i, n)),
        1 => any::<usize>().prop_map(Op::Finish),
        1 => any::<usize>().prop_map(Op::Drop),
        4 => any::<usize>().prop_map(Op::Read),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: if cfg!(miri) { 4 } else { 128 },
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_interleavings(
        ops in proptest::collection::vec(op(), 0..if cfg!(miri) { 30 } else { 120 }),
        budget in prop_oneof![Just(u64::MAX), 48u64..400],
        max_age_ms in prop_oneof![Just(5000u64), 0u64..60],
    ) {
        const G: usize = 4;
        let mut storage = PoolStorage::<48, 16>::new();
        let pool = Pool::new(&mut storage);
        {
            let limits = Limits { group_bytes: 200, cache_bytes: budget };
            let track = State::<G>::with_limits(
                &pool,
                info("v").with_max_age(Duration::from_millis(max_age_ms)),
                limits,
            );
            let t = track.handle();
            let p = track.producer().unwrap();
            let mut writers: Vec<GroupProducer<'_, '_>> = Vec::new();
            let mut readers: Vec<Consumer<'_, '_>> =
                (0..3).map(|i| t.consumer(Start::Group(i * 4))).collect();
            let mut last_given: Vec<Option<u64>> = std::vec![None; readers.len()];
            let mut max_created: Option<u64> = None;
            for op in ops {
                let before: Vec<u64> = t.sequences().collect();
                match op {
                    Op::Create(_) | Op::Append => {
                        let r = match op {
                            Op::Create(seq) => p.create_group(seq).map(|g| (seq, g)),
                            _ => p.append_group().map(|g| (g.sequence(), g)),
                        };
                        match r {
                            Ok((seq, g)) => {
                                prop_assert!(!before.contains(&seq));
                                if max_created.is_none_or(|m| seq > m) {
                                    max_created = Some(seq);
                                }
                                writers.push(g);
                            }
                            Err(CreateError::Duplicate) => {
                                let Op::Create(seq) = op else { unreachable!() };
                                prop_assert!(before.contains(&seq));
                            }
                            Err(CreateError::TooOld) => {
                                prop_assert!(t.latest().is_some());
                            }
                            Err(e) => prop_assert!(false, "unexpected {:?}", e),
                        }
                    }
                    Op::Write(i, n) if !writers.is_empty() => {
                        let k = i % writers.len();
                        let w = &mut writers[k];
                        let ts = w.sequence() * 10 + w.state().frames_written();
                        let _ = w.write_frame(ts, &[7u8; 40][..n]);
                    }
                    Op::Finish(i) if !writers.is_empty() => {
                        let k = i % writers.len();
                        let _ = writers[k].finish();
                    }
                    Op::Drop(i) if !writers.is_empty() => {
                        let k = i % writers.len();
                        drop(writers.swap_remove(k));
                    }
                    Op::Read(i) => {
                        let k = i % readers.len();
                        match readers[k].next_group().unwrap() {
                            Next::Ready(g) => {
                                prop_assert!(last_given[k].is_none_or(|l| g.sequence() > l));
                                last_given[k] = Some(g.sequence());
                            }
                            Next::Lagged(n) => {
                                prop_assert!(n > 0);
                                prop_assert_eq!(Some(readers[k].position()), t.latest());
                            }
                            Next::Pending => {}
                            Next::Finished => prop_assert!(false, "never finished"),
                        }
                    }
                    _ => {}
                }
                // Invariants after every step.
                prop_assert_eq!(t.latest(), max_created);
                let mut held: Vec<u64> = t.sequences().collect();
                held.sort_unstable();
                prop_assert!(held.len() <= G);
                if let Some(l) = t.latest() {
                    prop_assert_eq!(held.last(), Some(&l), "the latest group is kept");
                }
                let over_budget_evictable = held
                    .iter()
                    .filter(|&&s| Some(s) != t.latest())
                    .any(|&s| t.find(s).is_some_and(|i| t.slot(i).bytes() > 0));
                prop_assert!(t.held_bytes() <= budget || !over_budget_evictable);
                let times: Vec<Instant> = held
                    .iter()
                    .filter(|&&s| Some(s) != t.latest())
                    .map(|&s| t.superseded_at(s).unwrap())
                    .collect();
                prop_assert!(times.windows(2).all(|w| w[0] <= w[1]), "monotonic: {:?}", times);
            }
            drop(writers);
            drop(readers);
            drop(p);
        }
        prop_assert_eq!(pool.in_use(), 0);
    }
}

// -----------------------------------------------------------------------
// Subscriber books (docs/protocol.md §4.5)
// -----------------------------------------------------------------------

#[test]
fn demand_counts_and_aggregates_subscribers() {
    let mut storage = PoolStorage::<4, 32>::new();
    let pool = Pool::new(&mut storage);
    let track = State::<2>::new(&pool, info("v"));
    let t = track.handle();
    assert_eq!((t.subscribers(), t.demand()), (0, None));
    let a = Request::test(2, 10, Start::Group(5), End::Group(9));
    let b = Request::test(8, 0, Start::Group(3), End::Group(7));
    t.add_subscriber(&a);
    assert_eq!(t.demand(), Some(a));
    t.add_subscriber(&b);
    assert_eq!(t.subscribers(), 2);
    assert_eq!(
        t.demand(),
        Some(Request::test(8, 10, Start::Group(3), End::Group(9)))
    );
    // Latest and open win while anyone asks for them.
    let c = Request::test(0, 0, Start::Latest, End::Open);
    t.add_subscriber(&c);
    assert_eq!(
        t.demand(),
        Some(Request::test(8, 10, Start::Latest, End::Open))
    );
    t.remove_subscriber(&c);
    assert_eq!(
        t.demand(),
        Some(Request::test(8, 10, Start::Group(3), End::Group(9)))
    );
    // The aggregate follows the subscribers that are left (docs/protocol.md
    // §4.5), and clears at zero.
    t.remove_subscriber(&b);
    assert_eq!(t.subscribers(), 1);
    assert_eq!(t.demand(), Some(a));
    t.remove_subscriber(&a);
    assert_eq!((t.subscribers(), t.demand()), (0, None));
    // Unbalanced removal saturates.
    t.remove_subscriber(&a);
    assert_eq!(t.subscribers(), 0);
    t.add_subscriber(&b);
    assert_eq!(t.demand(), Some(b));
}

#[test]
fn demand_past_four_distinct_values_is_a_bound_until_empty() {
    let mut storage = PoolStorage::<4, 32>::new();
    let pool = Pool::new(&mut storage);
    let track = State::<2>::new(&pool, info("v"));
    let t = track.handle();
    let req = |p: u8| Request::test(p, 0, Start::Latest, End::Open);
    // Priorities 1 to 4 are counted; 9 and 0 find no place and bound the
    // extremes while anyone is left.
    for p in [1, 2, 3, 4, 9, 0] {
        t.add_subscriber(&req(p));
    }
    assert_eq!(t.demand().map(|d| d.priority), Some(9));
    t.remove_subscriber(&req(9));
    assert_eq!(t.demand().map(|d| d.priority), Some(9), "a bound");
    for p in [1, 2, 3, 4, 0] {
        t.remove_subscriber(&req(p));
    }
    assert_eq!(t.demand(), None);
    // Emptied, it is exact again.
    t.add_subscriber(&req(3));
    t.add_subscriber(&req(7));
    t.remove_subscriber(&req(7));
    assert_eq!(t.demand().map(|d| d.priority), Some(3));
}

#[test]
fn demand_update_is_exact() {
    let mut storage = PoolStorage::<4, 32>::new();
    let pool = Pool::new(&mut storage);
    let track = State::<2>::new(&pool, info("v"));
    let t = track.handle();
    let a = Request::test(5, 100, Start::Latest, End::Open);
    let a2 = Request::test(1, 10, Start::Group(4), End::Group(6));
    t.add_subscriber(&a);
    t.update_subscriber(&a, &a2);
    assert_eq!(t.demand(), Some(a2));
    t.update_subscriber(&a2, &a2);
    assert_eq!(t.demand(), Some(a2));
    let b = Request::test(0, 0, Start::Latest, End::Open);
    t.add_subscriber(&b);
    let b2 = Request::test(9, 0, Start::Group(8), End::Group(8));
    t.update_subscriber(&b, &b2);
    assert_eq!(t.subscribers(), 2);
    assert_eq!(
        t.demand(),
        Some(Request::test(9, 10, Start::Group(4), End::Group(8)))
    );
    // Lowered again: the aggregate comes down with it.
    let b3 = Request::test(0, 0, Start::Group(8), End::Group(8));
    t.update_subscriber(&b2, &b3);
    assert_eq!(
        t.demand(),
        Some(Request::test(1, 10, Start::Group(4), End::Group(8)))
    );
    let b2 = b3;
    // Reopening empties the books; the stale handle's unregistering no
    // longer reaches the new track's.
    let old = t;
    let t = t.reopen(info("w"));
    assert_eq!(t.subscribers(), 0);
    t.add_subscriber(&a2);
    old.remove_subscriber(&b2);
    old.add_subscriber(&b2);
    assert_eq!(t.subscribers(), 1);
    assert_eq!(t.demand(), Some(a2));
    t.remove_subscriber(&a2);
    assert_eq!(t.demand(), None);
}

#[test]
fn older_groups_may_still_arrive_only_from_the_upstream_first_to_the_oldest_held() {
    let mut ps = PoolStorage::<16, 32>::new();
    let pool = Pool::new(&mut ps);
    let state = State::<4>::new(&pool, info("v"));
    let t = state.handle();
    let mut p = t.producer().unwrap();
    fill(&p, [5]);
    // No SUBSCRIBE_START seen: a group that is not held is gone.
    assert!(!t.may_arrive(4));
    assert_eq!(t.superseded_at(4), None);
    t.set_upstream_first(3);
    assert!(t.may_arrive(4) && t.may_arrive(3));
    // Before the upstream's first group, at or above the oldest held: never.
    assert!(!t.may_arrive(2) && !t.may_arrive(5) && !t.may_arrive(6));
    // A group still to come is as fresh as the oldest held one's start.
    assert_eq!(t.superseded_at(4), Some(t.info().instant(50)));
    // It arrives: the ones below it may still come.
    fill(&p, [4]);
    assert!(t.may_arrive(3) && !t.may_arrive(4));
    // A finished track gets no more groups.
    p.finish();
    assert!(!t.may_arrive(3));
    // Reopened for another track, the upstream's first group is forgotten.
    let t = t.reopen(info("w"));
    let p = t.producer().unwrap();
    fill(&p, [9]);
    assert!(!t.may_arrive(8));
}
