//! Unit tests of the group: the wire layout, statuses, eviction, limits and
//! backpressure, the frame reader, trimming, and a property test.

extern crate std;

use super::*;
use crate::model::frame::{Frame, Header};
use crate::pool::{BlockMeta, Pool, PoolStorage};
use crate::wire::Writer;
use core::ptr::NonNull;
use proptest::prelude::*;
use std::vec;
use std::vec::Vec;

/// docs/protocol.md §6 V12: the group stream after its GROUP header.
const V12: &[u8] = &[
    0x47, 0xd0, 0x05, b'h', b'e', b'l', b'l', b'o', //
    0x40, 0x42, 0x06, b'w', b'o', b'r', b'l', b'd', b'!',
];

/// Reads every available raw byte.
fn drain(c: &mut Consumer<'_, '_>) -> (Vec<u8>, Result<Next<()>, ReadError>) {
    let mut out = Vec::new();
    loop {
        match c.chunk() {
            Ok(Next::Ready(b)) => {
                let n = b.len();
                assert!(n > 0);
                out.extend_from_slice(b);
                c.advance(n);
            }
            Ok(Next::Pending) => return (out, Ok(Next::Pending)),
            Ok(Next::Finished) => return (out, Ok(Next::Finished)),
            Err(e) => return (out, Err(e)),
        }
    }
}

#[test]
#[allow(unsafe_code)]
fn foreign_payload_joins_the_chain_without_a_copy() {
    // Another pool's bytes: two frames' payloads, 10 and 7 bytes.
    let foreign = *b"0123456789abcdefg";
    let mut storage = PoolStorage::<8, 4>::new();
    let pool = Pool::new(&mut storage);
    let state = State::new(&pool, 1 << 20);
    state.reset(3);
    let mut c = state.consumer();
    let mut p = state.producer().unwrap();
    // SAFETY: `foreign` outlives the pool and is never written.
    let anchor = unsafe { pool.adopt(NonNull::from(&foreign).cast(), 17, 42) }.unwrap();
    p.begin_frame(5, 10).unwrap();
    p.write_payload(b"01").unwrap();
    assert_eq!(p.write_payload_from(&anchor, 2, 6), Ok(4));
    // Contiguous bytes grow the same piece.
    assert_eq!(p.write_payload_from(&anchor, 6, 10), Ok(4));
    assert_eq!(pool.in_use(), 3, "own block, foreign block, one piece");
    assert_eq!(
        p.write_payload_from(&anchor, 10, 11),
        Err(WriteError::NoFrame)
    );
    p.begin_frame(6, 7).unwrap();
    assert_eq!(
        p.write_payload_from(&anchor, 10, 17),
        Ok(7),
        "a piece may end the frame"
    );
    p.write_frame(7, b"xy").unwrap();
    p.finish().unwrap();
    drop(anchor);
    assert_eq!(state.bytes_written(), 2 + 10 + 2 + 7 + 4);
    // Records may gather short blocks: the count walks the chain.
    c.chunk().unwrap();
    assert_eq!(
        c.readable_within(1),
        4,
        "header (2) + `01` in the first block"
    );
    assert_eq!(c.readable_within(2), 12);
    assert_eq!(c.readable_within(4), 21);
    assert_eq!(c.readable_within(100), 25);
    assert_eq!(
        frames(&mut c),
        vec![
            (5, b"0123456789".to_vec()),
            (6, b"abcdefg".to_vec()),
            (7, b"xy".to_vec()),
        ]
    );
    drop((c, p));
    assert_eq!(
        pool.take_released(),
        None,
        "the group still holds the pieces"
    );
    state.clear();
    assert_eq!(pool.take_released(), Some(42));
    assert_eq!(pool.in_use(), 0);
}

/// Reads every available whole frame.
fn frames(c: &mut Consumer<'_, '_>) -> Vec<(u64, Vec<u8>)> {
    let mut out = Vec::new();
    while let Next::Ready(h) = c.read_frame_header().unwrap() {
        let mut payload = vec![0u8; h.len];
        let mut got = 0;
        while got < h.len {
            match c.read_payload(&mut payload[got..]).unwrap() {
                Next::Ready(n) => got += n,
                other => panic!("payload stalled: {other:?}"),
            }
        }
        assert_eq!(c.read_payload(&mut [0u8; 1]).unwrap(), Next::Finished);
        out.push((h.timestamp, payload));
    }
    out
}

// --- wire layout ---------------------------------------------------------

#[test]
fn stores_v12_bytes_verbatim_across_blocks() {
    let mut storage = PoolStorage::<8, 4>::new();
    let pool = Pool::new(&mut storage);
    let group = State::new(&pool, 1024);
    group.reset(5);
    let mut p = group.producer().unwrap();
    p.write_frame(1000, b"hello").unwrap();
    p.write_frame(1033, b"world!").unwrap();
    p.finish().unwrap();
    assert_eq!(group.bytes_written(), V12.len() as u64);
    assert_eq!(group.frames_written(), 2);
    assert_eq!(group.last_timestamp(), 1033);
    assert_eq!(pool.in_use(), V12.len().div_ceil(4));

    let mut raw = group.consumer();
    assert_eq!(drain(&mut raw), (V12.to_vec(), Ok(Next::Finished)));
    let mut viewer = group.consumer();
    assert_eq!(
        frames(&mut viewer),
        vec![(1000, b"hello".to_vec()), (1033, b"world!".to_vec())]
    );
    assert_eq!(viewer.read_frame_header(), Ok(Next::Finished));
}

#[test]
fn headers_spanning_many_blocks() {
    // Block size 1: every header spans blocks; timestamps need 8-byte varints.
    let mut storage = PoolStorage::<64, 1>::new();
    let pool = Pool::new(&mut storage);
    let group = State::new(&pool, 1024);
    group.reset(0);
    let mut p = group.producer().unwrap();
    p.write_frame(1 << 40, b"ab").unwrap();
    p.write_frame(5, b"").unwrap();
    p.write_frame(7, b"c").unwrap();
    let mut c = group.consumer();
    assert_eq!(
        frames(&mut c),
        vec![
            (1 << 40, b"ab".to_vec()),
            (5, Vec::new()),
            (7, b"c".to_vec())
        ]
    );
    assert_eq!(c.read_frame_header(), Ok(Next::Pending));
    p.finish().unwrap();
    assert_eq!(c.read_frame_header(), Ok(Next::Finished));
}

#[test]
fn consumers_share_blocks() {
    let mut storage = PoolStorage::<4, 8>::new();
    let pool = Pool::new(&mut storage);
    let group = State::new(&pool, 1024);
    group.reset(1);
    let mut p = group.producer().unwrap();
    p.write_frame(0, b"0123456789").unwrap();
    let used = pool.in_use();
    let mut readers: Vec<_> = (0..10).map(|_| group.consumer()).collect();
    for r in &mut readers {
        let (bytes, _) = drain(r);
        assert_eq!(bytes.len(), 12);
    }
    assert_eq!(pool.in_use(), used);
    // A reader keeps only its current block: clearing the group frees the rest.
    group.clear();
    assert_eq!(pool.in_use(), 1);
    drop(readers);
    drop(p);
    assert_eq!(pool.in_use(), 0);
}

// --- statuses --------------------------------------------------------------

#[test]
fn pending_finished_and_aborted_are_distinct() {
    let mut storage = PoolStorage::<4, 8>::new();
    let pool = Pool::new(&mut storage);
    let group = State::new(&pool, 1024);
    group.reset(9);
    let mut c = group.consumer();
    assert_eq!(c.chunk(), Ok(Next::Pending));
    assert_eq!(c.read_frame_header(), Ok(Next::Pending));
    let mut p = group.producer().unwrap();
    assert!(group.producer().is_none(), "one producer per group");
    p.write_frame(3, b"x").unwrap();
    assert_eq!(drain(&mut c), (vec![0x06, 0x01, b'x'], Ok(Next::Pending)));
    p.finish().unwrap();
    assert_eq!(c.chunk(), Ok(Next::Finished));
    assert_eq!(p.write_frame(4, b"y"), Err(WriteError::Finished));
    assert!(!group.abort(1), "a finished group cannot be aborted");
    drop((c, p));

    group.reset(10);
    let mut p = group.producer().unwrap();
    let mut c = group.consumer();
    p.write_frame(0, b"abc").unwrap();
    p.abort(0x34);
    assert_eq!(group.status(), Status::Aborted(0x34));
    assert_eq!(c.chunk(), Err(ReadError::Aborted(0x34)));
    assert_eq!(p.write_frame(1, b""), Err(WriteError::Aborted(0x34)));
    assert_eq!(pool.in_use(), 0, "abort releases the blocks");
}

#[test]
fn empty_group_finishes() {
    let mut storage = PoolStorage::<1, 8>::new();
    let pool = Pool::new(&mut storage);
    let group = State::new(&pool, 0);
    group.reset(0);
    let mut p = group.producer().unwrap();
    p.finish().unwrap();
    let mut c = group.consumer();
    assert_eq!(c.chunk(), Ok(Next::Finished));
    assert_eq!(c.read_frame_header(), Ok(Next::Finished));
    assert_eq!(pool.in_use(), 0);
}

#[test]
fn dropped_producer_aborts() {
    let mut storage = PoolStorage::<2, 8>::new();
    let pool = Pool::new(&mut storage);
    let group = State::new(&pool, 64);
    group.reset(2);
    drop(group.producer().unwrap());
    assert_eq!(group.status(), Status::Aborted(ABORT_DROPPED));
    assert!(group.producer().is_none());
}

#[test]
fn idle_slot_reads_evicted() {
    let mut storage = PoolStorage::<1, 8>::new();
    let pool = Pool::new(&mut storage);
    let group = State::new(&pool, 64);
    assert_eq!(group.status(), Status::Idle);
    assert!(group.producer().is_none());
    assert_eq!(group.consumer().chunk(), Err(ReadError::Evicted));
}

// --- eviction ----------------------------------------------------------------

#[test]
fn reset_evicts_old_handles() {
    let mut storage = PoolStorage::<4, 4>::new();
    let pool = Pool::new(&mut storage);
    let group = State::new(&pool, 64);
    group.reset(1);
    let mut old_p = group.producer().unwrap();
    old_p.write_frame(0, b"abcdef").unwrap();
    let mut old_c = group.consumer();
    let Next::Ready(chunk) = old_c.chunk().unwrap() else {
        panic!()
    };
    assert_eq!(chunk, &[0x00, 0x06, b'a', b'b']);

    group.reset(2);
    // The old consumer still holds its block, and through the link the next one.
    assert_eq!(pool.in_use(), 2);
    assert_eq!(old_c.chunk(), Err(ReadError::Evicted));
    assert_eq!(pool.in_use(), 0, "a stale consumer drops its blocks");
    assert_eq!(old_p.write_frame(1, b"x"), Err(WriteError::Evicted));
    assert_eq!(old_c.read_frame_header(), Err(ReadError::Evicted));

    // The new group is unaffected by the old handles, including their drop.
    let mut p = group.producer().unwrap();
    p.write_frame(0, b"new").unwrap();
    drop(old_p);
    drop(old_c);
    assert_eq!(group.status(), Status::Open);
    assert!(group.has_producer());
    let mut c = group.consumer();
    assert_eq!(c.sequence(), 2);
    assert_eq!(frames(&mut c), vec![(0, b"new".to_vec())]);
}

#[test]
fn advancing_a_stale_consumer_does_not_touch_the_new_group() {
    let mut storage = PoolStorage::<4, 8>::new();
    let pool = Pool::new(&mut storage);
    let group = State::new(&pool, 64);
    group.reset(1);
    let mut p = group.producer().unwrap();
    p.write_frame(0, b"abcdef").unwrap();
    let mut c = group.consumer();
    let n = c.chunk().unwrap().ready().unwrap().len();
    group.reset(2);
    c.advance(n); // e.g. a send completed after the eviction
    assert_eq!(group.furthest_read(), 0);
}

// --- limits and backpressure -----------------------------------------------------

#[test]
fn whole_frames_are_all_or_nothing() {
    let mut storage = PoolStorage::<3, 4>::new();
    let pool = Pool::new(&mut storage);
    let group = State::new(&pool, 1024);
    group.reset(0);
    let mut p = group.producer().unwrap();
    p.write_frame(0, b"12345").unwrap(); // 7 bytes: 2 blocks, 1 spare byte
    assert_eq!(p.write_frame(0, b"123456"), Err(WriteError::PoolExhausted)); // needs 8
    assert_eq!(group.bytes_written(), 7);
    assert_eq!(pool.in_use(), 2);
    assert_eq!(pool.exhausted_count(), 1);
    p.write_frame(0, b"abc").unwrap(); // exactly fills 3 blocks
    assert_eq!(pool.in_use(), 3);
    assert_eq!(p.write_frame(0, b""), Err(WriteError::PoolExhausted));
    let mut c = group.consumer();
    assert_eq!(
        frames(&mut c),
        vec![(0, b"12345".to_vec()), (0, b"abc".to_vec())]
    );
}

#[test]
fn group_size_limit() {
    let mut storage = PoolStorage::<8, 8>::new();
    let pool = Pool::new(&mut storage);
    let group = State::new(&pool, 10);
    group.reset(0);
    let mut p = group.producer().unwrap();
    assert_eq!(
        p.write_frame(0, b"123456789"),
        Err(WriteError::GroupTooLarge)
    );
    assert_eq!(p.begin_frame(0, 9), Err(WriteError::GroupTooLarge));
    p.write_frame(0, b"12345678").unwrap(); // exactly 10
    assert_eq!(p.write_frame(0, b""), Err(WriteError::GroupTooLarge));
    assert_eq!(group.bytes_written(), 10);
}

#[test]
fn timestamp_range() {
    let mut storage = PoolStorage::<8, 8>::new();
    let pool = Pool::new(&mut storage);
    let group = State::new(&pool, 100);
    group.reset(0);
    let mut p = group.producer().unwrap();
    assert_eq!(p.write_frame(1 << 61, b""), Err(WriteError::TimestampRange));
    assert_eq!(group.bytes_written(), 0);
}

#[test]
fn streamed_frame_with_partial_writes() {
    let mut storage = PoolStorage::<3, 4>::new();
    let pool = Pool::new(&mut storage);
    let group = State::new(&pool, 1024);
    group.reset(0);
    let mut p = group.producer().unwrap();
    assert_eq!(p.write_payload(b"x"), Err(WriteError::NoFrame));
    p.begin_frame(2, 20).unwrap(); // header `04 14`
    assert_eq!(p.write_frame(0, b""), Err(WriteError::InFrame));
    assert_eq!(p.begin_frame(0, 0), Err(WriteError::InFrame));
    assert_eq!(p.finish(), Err(WriteError::InFrame));
    assert_eq!(p.write_payload(&[7; 21]), Err(WriteError::PayloadOverrun));
    // Readers see the payload as it arrives.
    let mut c = group.consumer();
    assert_eq!(c.read_frame_header(), Ok(Next::Ready(Header::new(2, 20))));
    assert_eq!(p.write_payload(&[1; 6]), Ok(6));
    assert_eq!(c.read_payload(&mut [0; 32]), Ok(Next::Ready(6)));
    assert_eq!(c.payload_remaining(), 14);
    // 12 bytes of room: a partial write, then exhaustion.
    assert_eq!(p.write_payload(&[2; 14]), Ok(4));
    assert_eq!(p.write_payload(&[2; 10]), Err(WriteError::PoolExhausted));
    assert_eq!(p.frame_remaining(), 10);
    assert_eq!(group.bytes_written(), 12);
    assert_eq!(c.payload_chunk(), Ok(Next::Ready(&[2u8; 4][..])));
    c.advance(4);
    assert_eq!(c.payload_chunk(), Ok(Next::Pending));
}

#[test]
fn zero_length_streamed_frame_is_complete() {
    let mut storage = PoolStorage::<2, 8>::new();
    let pool = Pool::new(&mut storage);
    let group = State::new(&pool, 64);
    group.reset(0);
    let mut p = group.producer().unwrap();
    p.begin_frame(1, 0).unwrap();
    assert_eq!(p.write_payload(b""), Err(WriteError::NoFrame));
    p.begin_frame(2, 3).unwrap();
    assert_eq!(p.write_payload(b""), Ok(0));
    assert_eq!(p.write_payload(b"abc"), Ok(3));
    p.finish().unwrap();
    let mut c = group.consumer();
    assert_eq!(frames(&mut c), vec![(1, Vec::new()), (2, b"abc".to_vec())]);
}

// --- frame reader details -------------------------------------------------------------

#[test]
fn header_reads_skip_unread_payload() {
    let mut storage = PoolStorage::<8, 3>::new();
    let pool = Pool::new(&mut storage);
    let group = State::new(&pool, 1024);
    group.reset(0);
    let mut p = group.producer().unwrap();
    p.write_frame(10, b"skip me please").unwrap();
    p.write_frame(20, b"keep").unwrap();
    p.finish().unwrap();
    let mut c = group.consumer();
    assert_eq!(c.read_frame_header(), Ok(Next::Ready(Header::new(10, 14))));
    let Next::Ready(first) = c.payload_chunk().unwrap() else {
        panic!()
    };
    assert_eq!(first, b"s"); // the rest of the first block
    c.advance(1);
    assert_eq!(c.read_frame_header(), Ok(Next::Ready(Header::new(20, 4))));
    let mut buf = [0u8; 8];
    assert_eq!(c.read_payload(&mut buf), Ok(Next::Ready(4)));
    assert_eq!(&buf[..4], b"keep");
    assert_eq!(c.read_frame_header(), Ok(Next::Finished));
}

#[test]
fn raw_reads_past_a_frame_are_misaligned() {
    let mut storage = PoolStorage::<4, 16>::new();
    let pool = Pool::new(&mut storage);
    let group = State::new(&pool, 1024);
    group.reset(0);
    let mut p = group.producer().unwrap();
    p.write_frame(0, b"ab").unwrap();
    p.write_frame(0, b"cd").unwrap();
    let mut c = group.consumer();
    c.read_frame_header().unwrap();
    let n = c.chunk().unwrap().ready().unwrap().len();
    c.advance(n); // raw read through the next header
    assert_eq!(c.read_frame_header(), Err(ReadError::Misaligned));
}

#[test]
fn chunk_slices_outlive_the_borrow() {
    let mut storage = PoolStorage::<8, 4>::new();
    let pool = Pool::new(&mut storage);
    let group = State::new(&pool, 1024);
    group.reset(0);
    let mut p = group.producer().unwrap();
    p.write_frame(1000, b"hello").unwrap();
    p.write_frame(1033, b"world!").unwrap();
    p.finish().unwrap();
    let mut c = group.consumer();
    let mut in_flight = Vec::new();
    while let Next::Ready(s) = c.chunk_slice().unwrap() {
        c.advance(s.len());
        in_flight.push(s);
    }
    let bytes: Vec<u8> = in_flight.iter().flat_map(|s| s.iter().copied()).collect();
    assert_eq!(bytes, V12);
    assert_eq!(c.chunk_slice().unwrap().ready().map(|s| s.len()), None);
}

#[test]
fn furthest_read_is_the_max_over_readers() {
    let mut storage = PoolStorage::<4, 8>::new();
    let pool = Pool::new(&mut storage);
    let group = State::new(&pool, 1024);
    group.reset(0);
    let mut p = group.producer().unwrap();
    p.write_frame(0, b"0123456789").unwrap();
    let mut a = group.consumer();
    let mut b = group.consumer();
    a.read(&mut [0; 5]).unwrap();
    b.read(&mut [0; 3]).unwrap();
    assert_eq!(group.furthest_read(), 5);
    b.read(&mut [0; 4]).unwrap();
    assert_eq!(group.furthest_read(), 7);
    // A window of 10 past the furthest reader: 17, 12 written.
    b.pace(10);
    assert_eq!(p.allowance(), 5);
}

// --- trimming -------------------------------------------------------------------------

/// Payload byte `i` of frame `k`.
fn pattern(k: u64, i: usize) -> u8 {
    (k.wrapping_mul(7).wrapping_add(i as u64 * 13) % 251) as u8
}

#[test]
fn trimmed_group_memory_is_bounded_by_the_pacing_window() {
    // A 64 MiB group through a 2 MiB pool of 64 KiB blocks, one reader under a
    // 1 MiB window (smaller under Miri, same shape).
    let bs: usize = if cfg!(miri) { 64 } else { 64 << 10 };
    const BLOCKS: usize = 32;
    let window = 16 * bs as u64;
    let total = if cfg!(miri) { 64 * bs } else { 1024 * bs };
    let frame = bs / 4 + 3;
    let step = 3 * bs / 4 + 5;
    let mut bytes = vec![0u8; BLOCKS * bs];
    let mut meta: Vec<BlockMeta> = (0..BLOCKS).map(|_| BlockMeta::new()).collect();
    let pool = Pool::from_parts(&mut bytes, &mut meta).unwrap();
    let group = State::new(&pool, u64::MAX);
    group.set_retain(window);
    group.reset(3);
    let mut p = group.producer().unwrap();
    // Created on the empty group: it still reads from byte 0.
    let mut c = group.consumer();
    let mut payload = vec![0u8; frame];
    let mut buf = vec![0u8; step];
    let (mut k_out, mut k_in, mut got) = (0u64, 0u64, None::<usize>);
    let mut read_payload = 0usize;
    let mut late_checked = false;
    let mut done = false;
    while !done {
        // The producer writes whole frames while the window allows.
        c.pace(window);
        while group.bytes_written() < total as u64 && p.allowance() >= frame as u64 + 4 {
            for (i, b) in payload.iter_mut().enumerate() {
                *b = pattern(k_out, i);
            }
            p.write_frame(k_out, &payload).unwrap();
            k_out += 1;
            assert!(pool.in_use() <= window as usize / bs + 2);
        }
        if group.bytes_written() >= total as u64 && group.is_open() {
            p.finish().unwrap();
        }
        if group.is_trimmed() && !late_checked {
            // A consumer created after the trim cannot start at byte 0.
            let mut late = group.consumer();
            assert!(late.is_trimmed());
            assert_eq!(late.chunk(), Err(ReadError::Trimmed));
            assert_eq!(late.read_frame_header(), Err(ReadError::Trimmed));
            late_checked = true;
        }
        // The reader reads at most `step` payload bytes per turn.
        let mut budget = step;
        while budget > 0 {
            let left = match got {
                Some(n) => frame - n,
                None => match c.read_frame_header().unwrap() {
                    Next::Ready(h) => {
                        assert_eq!((h.timestamp, h.len), (k_in, frame));
                        got = Some(0);
                        frame
                    }
                    Next::Pending => break,
                    Next::Finished => {
                        done = true;
                        break;
                    }
                },
            };
            let want = left.min(budget);
            let Next::Ready(n) = c.read_payload(&mut buf[..want]).unwrap() else {
                break;
            };
            let at = got.unwrap_or(0);
            for (i, b) in buf[..n].iter().enumerate() {
                assert_eq!(*b, pattern(k_in, at + i), "frame {k_in} byte {}", at + i);
            }
            budget -= n;
            read_payload += n;
            got = Some(at + n).filter(|&g| g < frame);
            if got.is_none() {
                k_in += 1;
            }
        }
    }
    assert!(late_checked && group.is_trimmed());
    assert_eq!(k_in, k_out);
    assert_eq!(read_payload, k_out as usize * frame);
    assert!(group.bytes_written() >= total as u64);
    // Never more than one window plus the reader's block and the tail block.
    assert!(
        pool.high_water() <= window as usize / bs + 2,
        "high water {} blocks",
        pool.high_water()
    );
    assert_eq!(pool.exhausted_count(), 0);
    drop(c);
    assert_eq!(pool.in_use(), 0);
}

#[test]
fn consumers_created_before_the_trim_read_from_zero() {
    let mut storage = PoolStorage::<16, 8>::new();
    let pool = Pool::new(&mut storage);
    let group = State::new(&pool, 1024);
    group.set_retain(16);
    group.reset(1);
    let mut p = group.producer().unwrap();
    // Created on the empty group, cloned, never read: trimming waits for them.
    let waiting = group.consumer();
    let waiting2 = waiting.clone();
    p.write_frame(0, b"0123456789").unwrap(); // 12 bytes: 2 blocks
    let mut parked = group.consumer(); // anchored at the head block now
    p.write_frame(1, b"abcdefghij").unwrap(); // 24 bytes > 16
    assert!(!group.is_trimmed(), "a waiting consumer holds trimming off");
    drop(waiting);
    assert!(!group.is_trimmed());
    drop(waiting2);
    assert!(group.is_trimmed(), "the last waiting consumer let go");
    assert!(group.consumer().is_trimmed());
    // The parked consumer keeps everything from byte 0 alive.
    p.write_frame(2, b"ABCDEFGHIJ").unwrap();
    assert_eq!(pool.in_use(), 36usize.div_ceil(8));
    p.finish().unwrap();
    assert_eq!(
        frames(&mut parked),
        vec![
            (0, b"0123456789".to_vec()),
            (1, b"abcdefghij".to_vec()),
            (2, b"ABCDEFGHIJ".to_vec())
        ]
    );
    assert_eq!(pool.in_use(), 1, "read blocks went back to the pool");
    drop(parked);
    assert_eq!(pool.in_use(), 0);
    // A consumer that waited and then read anchors the head, then trims.
    group.reset(2);
    let mut p = group.producer().unwrap();
    let mut first = group.consumer();
    p.write_frame(0, b"0123456789").unwrap();
    p.write_frame(1, b"0123456789").unwrap();
    assert!(!group.is_trimmed());
    assert_eq!(first.read(&mut [0u8; 3]), Ok(Next::Ready(3)));
    assert!(group.is_trimmed());
    assert_eq!(pool.in_use(), 3, "the reader's block and on");
    let (rest, end) = drain(&mut first);
    assert_eq!((rest.len(), end), (21, Ok(Next::Pending)));
    assert_eq!(pool.in_use(), 1, "only the tail is left");
    // Trimming is per group: a reset starts whole again; an abort still reports.
    group.reset(3);
    assert!(!group.is_trimmed());
    let mut p = group.producer().unwrap();
    p.write_frame(0, b"0123456789abcdef").unwrap();
    assert!(group.is_trimmed());
    let mut late = group.consumer();
    p.abort(0x9);
    assert_eq!(late.chunk(), Err(ReadError::Aborted(0x9)));
    assert_eq!(first.chunk(), Err(ReadError::Evicted));
}

#[test]
fn retain_limit_applies_at_once_and_is_not_a_size_limit() {
    let mut storage = PoolStorage::<8, 8>::new();
    let pool = Pool::new(&mut storage);
    let group = State::new(&pool, 40);
    assert_eq!(group.retain(), u64::MAX);
    group.reset(0);
    let mut p = group.producer().unwrap();
    p.write_frame(0, &[1; 30]).unwrap(); // 32 bytes: 4 blocks
    assert!(!group.is_trimmed());
    assert_eq!(pool.in_use(), 4);
    group.set_retain(32);
    assert!(!group.is_trimmed(), "at the limit, not past it");
    group.set_retain(31);
    assert!(group.is_trimmed());
    assert_eq!(pool.in_use(), 1);
    group.set_retain(u64::MAX);
    assert!(
        group.is_trimmed(),
        "raising the limit does not bring bytes back"
    );
    // The size limit still refuses.
    assert_eq!(p.write_frame(1, &[2; 8]), Err(WriteError::GroupTooLarge));
    p.write_frame(1, &[2; 6]).unwrap();
    p.finish().unwrap();
    assert_eq!(pool.in_use(), 0);
    assert_eq!(group.retain(), u64::MAX, "kept across resets");
    group.reset(1);
    assert!(!group.is_trimmed());
}

// --- property: what goes in comes out ---------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig {
        cases: if cfg!(miri) { 4 } else { 128 },
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn frames_round_trip(
        block_size in 1usize..24,
        frames_in in proptest::collection::vec(
            (0u64..100_000, proptest::collection::vec(any::<u8>(), 0..40), any::<bool>()),
            0..if cfg!(miri) { 4 } else { 16 }),
        read_step in 1usize..9,
        retain in prop_oneof![Just(u64::MAX), 0u64..64],
    ) {
        let blocks = 1024 / block_size + 1;
        let mut bytes = vec![0u8; blocks * block_size];
        let mut meta: Vec<BlockMeta> = (0..blocks).map(|_| BlockMeta::new()).collect();
        let pool = Pool::from_parts(&mut bytes, &mut meta).unwrap();
        let group = State::new(&pool, 4096);
        // Trimming must not change what consumers created early read.
        group.set_retain(retain);
        group.reset(7);
        let mut p = group.producer().unwrap();
        let mut raw = group.consumer();
        let mut viewer = group.consumer();
        let mut raw_bytes = Vec::new();
        let mut expect_wire = vec![0u8; 4096];
        let mut w = Writer::new(&mut expect_wire);
        let mut prev = 0;
        for (ts, payload, streamed) in &frames_in {
            if *streamed {
                p.begin_frame(*ts, payload.len()).unwrap();
                for piece in payload.chunks(read_step) {
                    prop_assert_eq!(p.write_payload(piece), Ok(piece.len()));
                }
            } else {
                p.write_frame(*ts, payload).unwrap();
            }
            Frame::new(*ts, payload).encode(prev, &mut w).unwrap();
            prev = *ts;
            // The raw reader trails in small steps.
            let mut buf = vec![0u8; read_step];
            while let Next::Ready(n) = raw.read(&mut buf).unwrap() {
                raw_bytes.extend_from_slice(&buf[..n]);
            }
        }
        p.finish().unwrap();
        let (rest, end) = drain(&mut raw);
        raw_bytes.extend_from_slice(&rest);
        prop_assert_eq!(end, Ok(Next::Finished));
        let n = w.position();
        prop_assert_eq!(&raw_bytes[..], &expect_wire[..n]);
        prop_assert_eq!(group.bytes_written(), n as u64);
        let got = frames(&mut viewer);
        let want: Vec<(u64, Vec<u8>)> =
            frames_in.iter().map(|(t, p, _)| (*t, p.clone())).collect();
        prop_assert_eq!(got, want);
        prop_assert_eq!(viewer.read_frame_header(), Ok(Next::Finished));
        prop_assert_eq!(group.is_trimmed(), group.bytes_written() > retain);
        let mut late = group.consumer();
        if group.is_trimmed() {
            prop_assert_eq!(late.chunk(), Err(ReadError::Trimmed));
        } else {
            prop_assert_eq!(drain(&mut late).0, &expect_wire[..n]);
        }
        drop((raw, viewer, p, late));
        group.clear();
        prop_assert_eq!(pool.in_use(), 0);
    }
}
