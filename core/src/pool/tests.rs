//! Unit tests of the pool: foreign blocks, alloc and free, writing while
//! reading, chains, and a property test of random interleavings.

extern crate std;

use super::*;
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::vec;
use std::vec::Vec;

// --- foreign blocks -------------------------------------------------

#[test]
fn foreign_pieces_chain_and_release_their_token_once() {
    let other = *b"0123456789abcdef";
    let mut storage = PoolStorage::<6, 4>::new();
    let pool = Pool::new(&mut storage);
    // SAFETY: `other` outlives the pool and is never written.
    let foreign = unsafe { pool.adopt(NonNull::from(&other).cast(), 16, 77) }.unwrap();
    assert!(foreign.is_foreign() && foreign.is_full());
    assert_eq!(foreign.data(), b"0123456789abcdef");
    // A chain: own block, piece 2..7, own block, piece of a piece 10..12.
    let mut a = pool.alloc().unwrap();
    a.append(b"hd");
    let mut p1 = foreign.piece(2, 7).unwrap();
    assert_eq!((p1.data(), p1.spare_len()), (&b"23456"[..], 0));
    assert_eq!(p1.append(b"x"), 0);
    assert!(p1.spare_mut().is_empty());
    a.link(p1.as_block()).unwrap();
    let mut b = pool.alloc().unwrap();
    b.append(b"mid");
    p1.link(b.as_block()).unwrap();
    let big = foreign.piece(8, 16).unwrap();
    let p2 = big.as_block().piece(2, 4).unwrap();
    drop(big);
    assert_eq!(p2.data(), b"ab");
    b.link(p2.as_block()).unwrap();
    assert_eq!(b.as_block().piece(0, 1).unwrap_err(), PoolError::NotForeign);
    drop(foreign);
    let head = a.into_shared();
    drop((p1, b, p2));
    let mut seen = Vec::new();
    let mut cur = Some(head.clone());
    while let Some(blk) = cur {
        seen.extend_from_slice(blk.data());
        cur = blk.next();
    }
    assert_eq!(seen, b"hd23456midab");
    assert_eq!(pool.take_released(), None, "pieces still hold it");
    drop(head);
    assert!(pool.has_released());
    assert_eq!(pool.in_use(), 1, "only the released foreign block");
    assert_eq!(pool.take_released(), Some(77));
    assert_eq!((pool.take_released(), pool.in_use()), (None, 0));
}

#[test]
fn foreign_blocks_use_metadata_slots() {
    let other = [7u8; 3];
    let mut storage = PoolStorage::<2, 4>::new();
    let pool = Pool::new(&mut storage);
    // SAFETY: `other` outlives the pool and is never written.
    let f = unsafe { pool.adopt(NonNull::from(&other).cast(), 3, 1) }.unwrap();
    let p = f.piece(0, 3).unwrap();
    assert_eq!(f.piece(0, 1).unwrap_err(), PoolError::Exhausted);
    assert_eq!(f.piece(2, 4).unwrap_err(), PoolError::NotForeign);
    assert_eq!(pool.alloc().unwrap_err(), PoolError::Exhausted);
    drop((f, p));
    assert_eq!(pool.take_released(), Some(1));
    assert_eq!(pool.in_use(), 0);
    // A foreign block dropped with no piece comes back at once.
    // SAFETY: as above.
    drop(unsafe { pool.adopt(NonNull::from(&other).cast(), 2, 9) }.unwrap());
    assert_eq!(pool.take_released(), Some(9));
}

#[test]
fn spare_slots_hold_foreign_blocks_and_never_bytes() {
    let other = [1u8; 8];
    let mut bytes = [0u8; 8];
    let mut meta: [BlockMeta; 4] = core::array::from_fn(|_| BlockMeta::new());
    let pool = Pool::from_parts_with_spare(&mut bytes, &mut meta, 2).unwrap();
    assert_eq!((pool.capacity(), pool.block_size()), (2, 4));
    let a = pool.alloc().unwrap();
    let b = pool.alloc().unwrap();
    assert_eq!(
        pool.alloc().unwrap_err(),
        PoolError::Exhausted,
        "spare slots have no bytes"
    );
    drop(b);
    // SAFETY: `other` outlives the pool and is never written.
    let f = unsafe { pool.adopt(NonNull::from(&other).cast(), 8, 3) }.unwrap();
    let mut p = f.piece(0, 2).unwrap();
    assert!(p.grow_piece(&f, 2, 5), "contiguous bytes grow the piece");
    assert!(!p.grow_piece(&f, 6, 7), "a gap does not");
    assert_eq!(p.data(), &other[..5]);
    assert_eq!((pool.spare_in_use(), pool.in_use()), (2, 1));
    // Spare slots gone: foreign blocks fall back to slots with bytes.
    let q = f.piece(5, 8).unwrap();
    assert_eq!((pool.spare_in_use(), pool.in_use()), (2, 2));
    drop((f, p, q, a));
    assert_eq!(pool.take_released(), Some(3));
    assert_eq!((pool.spare_in_use(), pool.in_use()), (0, 0));
    assert_eq!(
        Pool::from_parts_with_spare(&mut [0u8; 4], &mut [BlockMeta::new()], 1).unwrap_err(),
        PoolError::InvalidLayout
    );
}

// --- alloc / free ---------------------------------------------------

#[test]
fn alloc_until_exhausted_then_reuse() {
    let mut storage = PoolStorage::<3, 4>::new();
    let pool = Pool::new(&mut storage);
    assert_eq!((pool.capacity(), pool.block_size()), (3, 4));
    let a = pool.alloc().unwrap();
    let b = pool.alloc().unwrap();
    let c = pool.alloc().unwrap();
    assert_eq!(pool.alloc().unwrap_err(), PoolError::Exhausted);
    assert_eq!(pool.exhausted_count(), 1);
    assert_eq!(
        (pool.in_use(), pool.available(), pool.high_water()),
        (3, 0, 3)
    );
    let bi = b.as_block().index();
    let bg = b.as_block().generation();
    drop(b);
    assert_eq!(pool.in_use(), 2);
    let d = pool.alloc().unwrap();
    assert_eq!(d.as_block().index(), bi);
    assert_eq!(d.as_block().generation(), bg.wrapping_add(1));
    assert!(d.is_empty());
    drop((a, c, d));
    assert_eq!((pool.in_use(), pool.high_water()), (0, 3));
}

#[test]
fn empty_pool_never_allocates() {
    let mut storage = PoolStorage::<0, 8>::new();
    let pool = Pool::new(&mut storage);
    assert_eq!(pool.alloc().unwrap_err(), PoolError::Exhausted);
    assert_eq!(pool.try_reserve(0), Ok(()));
    assert_eq!(pool.try_reserve(1), Err(PoolError::Exhausted));
    assert_eq!(pool.exhausted_count(), 2);
}

#[test]
fn reserve_counts_free_blocks() {
    let mut storage = PoolStorage::<4, 2>::new();
    let pool = Pool::new(&mut storage);
    let _a = pool.alloc().unwrap();
    assert_eq!(pool.try_reserve(3), Ok(()));
    assert_eq!(pool.try_reserve(4), Err(PoolError::Exhausted));
    assert_eq!(pool.in_use(), 1);
}

#[test]
fn rebuilding_a_pool_starts_fresh() {
    let mut storage = PoolStorage::<2, 4>::new();
    {
        let pool = Pool::new(&mut storage);
        let w = pool.alloc().unwrap();
        core::mem::forget(w); // leaked inside this pool's life
        assert_eq!(pool.in_use(), 1);
    }
    let pool = Pool::new(&mut storage);
    assert_eq!(pool.in_use(), 0);
    let _a = pool.alloc().unwrap();
    let _b = pool.alloc().unwrap();
}

#[test]
fn from_parts_checks_layout() {
    let mut bytes = [0u8; 10];
    let mut meta: [BlockMeta; 3] = Default::default();
    let pool = Pool::from_parts(&mut bytes, &mut meta).unwrap();
    assert_eq!((pool.capacity(), pool.block_size()), (3, 3));
    let mut w = pool.alloc().unwrap();
    assert_eq!(w.append(b"abcdef"), 3);
    assert_eq!(w.data(), b"abc");
    drop(w);

    let mut none: [BlockMeta; 0] = [];
    assert_eq!(
        Pool::from_parts(&mut bytes, &mut none).unwrap_err(),
        PoolError::InvalidLayout
    );
    let mut tiny = [0u8; 2];
    assert_eq!(
        Pool::from_parts(&mut tiny, &mut meta).unwrap_err(),
        PoolError::InvalidLayout
    );
}

// --- writing while reading --------------------------------------------

#[test]
fn readers_see_committed_prefix_while_writer_appends() {
    let mut storage = PoolStorage::<1, 8>::new();
    let pool = Pool::new(&mut storage);
    let mut w = pool.alloc().unwrap();
    assert_eq!(w.append(b"ab"), 2);
    let r = w.share();
    let early = r.data(); // a live borrow of the committed prefix
    let spare = w.spare_mut();
    spare[..3].copy_from_slice(b"cde");
    assert_eq!(r.data(), b"ab"); // not committed yet
    w.commit(3);
    assert_eq!(early, b"ab");
    assert_eq!(r.data(), b"abcde");
    assert_eq!(w.append(b"fghij"), 3);
    assert!(r.is_full());
    assert_eq!(w.append(b"x"), 0);
    assert_eq!(w.spare_mut().len(), 0);
    let s = r.clone().slice(2, 6).unwrap();
    assert_eq!(&*s, b"cdef");
    assert!(r.clone().slice(3, 9).is_none());
    assert_eq!(r.ref_count(), 3);
    drop((w, r));
    assert_eq!(pool.in_use(), 1);
    drop(s);
    assert_eq!(pool.in_use(), 0);
}

#[test]
#[should_panic(expected = "commit past the end")]
fn commit_past_the_end_panics() {
    let mut storage = PoolStorage::<1, 4>::new();
    let pool = Pool::new(&mut storage);
    let mut w = pool.alloc().unwrap();
    w.commit(5);
}

#[test]
fn freed_block_is_rewritten_only_after_last_reader() {
    let mut storage = PoolStorage::<1, 4>::new();
    let pool = Pool::new(&mut storage);
    let mut w = pool.alloc().unwrap();
    w.append(b"old!");
    let r = w.into_shared();
    assert!(pool.alloc().is_err());
    assert_eq!(r.data(), b"old!");
    drop(r);
    let mut w = pool.alloc().unwrap();
    assert!(w.is_empty());
    w.append(b"new");
    assert_eq!(w.data(), b"new");
}

// --- chains -----------------------------------------------------------

#[test]
fn link_rules() {
    let mut storage = PoolStorage::<3, 2>::new();
    let pool = Pool::new(&mut storage);
    let mut other_storage = PoolStorage::<1, 2>::new();
    let other = Pool::new(&mut other_storage);
    let mut a = pool.alloc().unwrap();
    let mut b = pool.alloc().unwrap();
    let c = pool.alloc().unwrap();
    let x = other.alloc().unwrap();
    assert_eq!(a.link(&a.share()), Err(LinkError::SameBlock));
    assert_eq!(a.link(&x.share()), Err(LinkError::ForeignPool));
    assert_eq!(a.link(&b.share()), Ok(()));
    assert_eq!(a.link(&c.share()), Err(LinkError::AlreadyLinked));
    assert_eq!(b.link(&c.share()), Ok(()));
    // c -> a would close a cycle: a already has a successor.
    let mut c = c;
    assert_eq!(c.link(&a.share()), Err(LinkError::SuccessorLinked));
    assert!(a.next().unwrap().same_block(b.as_block()));
    drop((b, c));
    assert_eq!(pool.in_use(), 3); // kept alive by links from a
    drop(a);
    assert_eq!(pool.in_use(), 0);
}

#[test]
fn reader_keeps_the_rest_of_the_chain() {
    let mut storage = PoolStorage::<3, 1>::new();
    let pool = Pool::new(&mut storage);
    let mut a = pool.alloc().unwrap();
    let mut b = pool.alloc().unwrap();
    let c = pool.alloc().unwrap();
    a.link(b.as_block()).unwrap();
    b.link(c.as_block()).unwrap();
    let mid = a.next().unwrap();
    drop((b, c));
    drop(a);
    assert_eq!(pool.in_use(), 2); // b (held) and c (linked from b)
    drop(mid);
    assert_eq!(pool.in_use(), 0);
}

#[test]
fn long_chain_frees_without_recursion() {
    const N: usize = if cfg!(miri) { 300 } else { 20_000 };
    let mut storage = vec![];
    storage.resize_with(N, BlockMeta::new);
    let mut bytes = vec![0u8; N];
    let pool = Pool::from_parts(&mut bytes, &mut storage).unwrap();
    let mut tail = pool.alloc().unwrap();
    let head = tail.share();
    for _ in 1..N {
        let next = pool.alloc().unwrap();
        tail.link(next.as_block()).unwrap();
        tail = next;
    }
    drop(tail);
    assert_eq!(pool.in_use(), N);
    drop(head);
    assert_eq!(pool.in_use(), 0);
    // Every block is reusable.
    let all: Vec<_> = (0..N).map(|_| pool.alloc().unwrap()).collect();
    assert!(pool.alloc().is_err());
    drop(all);
}

// --- property: random interleavings -----------------------------------

#[derive(Debug, Clone)]
enum Op {
    Alloc,
    Append(usize, Vec<u8>),
    Share(usize),
    Next(usize),
    Link(usize, usize),
    Seal(usize),
    Drop(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => Just(Op::Alloc),
        3 => (any::<usize>(), proptest::collection::vec(any::<u8>(), 0..7))
            .prop_map(|(i, b)| Op::Append(i, b)),
        2 => any::<usize>().prop_map(Op::Share),
        1 => any::<usize>().prop_map(Op::Next),
        2 => (any::<usize>(), any::<usize>()).prop_map(|(i, j)| Op::Link(i, j)),
        1 => any::<usize>().prop_map(Op::Seal),
        3 => any::<usize>().prop_map(Op::Drop),
    ]
}

enum H<'p> {
    W(BlockMut<'p>),
    R(Block<'p>),
}

impl<'p> H<'p> {
    fn block(&self) -> &Block<'p> {
        match self {
            H::W(w) => w.as_block(),
            H::R(r) => r,
        }
    }
}

/// Model of one allocation: expected bytes and successor.
#[derive(Default)]
struct M {
    data: Vec<u8>,
    next: Option<(usize, u32)>,
}

fn key(b: &Block<'_>) -> (usize, u32) {
    (b.index(), b.generation())
}

/// Allocations reachable from live handles through links: exactly the ones that must be
/// allocated.
fn reachable(
    handles: &[H<'_>],
    model: &BTreeMap<(usize, u32), M>,
) -> std::collections::BTreeSet<(usize, u32)> {
    let mut seen = std::collections::BTreeSet::new();
    for h in handles {
        let mut k = Some(key(h.block()));
        while let Some(kk) = k {
            if !seen.insert(kk) {
                break;
            }
            k = model[&kk].next;
        }
    }
    seen
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: if cfg!(miri) { 6 } else { 256 },
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_interleavings(ops in proptest::collection::vec(op(), 0..if cfg!(miri) { 40 } else { 200 })) {
        const CAP: usize = 6;
        let mut storage = PoolStorage::<CAP, 5>::new();
        let pool = Pool::new(&mut storage);
        let mut handles: Vec<H<'_>> = Vec::new();
        let mut model: BTreeMap<(usize, u32), M> = BTreeMap::new();
        for op in ops {
            let n = handles.len();
            match op {
                Op::Alloc => match pool.alloc() {
                    Ok(w) => {
                        let k = key(w.as_block());
                        // A block still reachable must never be handed out again.
                        let live = reachable(&handles, &model);
                        prop_assert!(live.iter().all(|&(i, _)| i != k.0));
                        model.insert(k, M::default());
                        handles.push(H::W(w));
                    }
                    Err(e) => {
                        prop_assert_eq!(e, PoolError::Exhausted);
                        prop_assert_eq!(pool.in_use(), CAP);
                    }
                },
                Op::Append(i, bytes) if n > 0 => {
                    if let H::W(w) = &mut handles[i % n] {
                        let room = w.spare_len();
                        let wrote = w.append(&bytes);
                        prop_assert_eq!(wrote, room.min(bytes.len()));
                        let m = model.get_mut(&key(w.as_block())).unwrap();
                        m.data.extend_from_slice(&bytes[..wrote]);
                    }
                }
                Op::Share(i) if n > 0 => {
                    let b = handles[i % n].block().clone();
                    handles.push(H::R(b));
                }
                Op::Next(i) if n > 0 => {
                    if let Some(b) = handles[i % n].block().next() {
                        let k = model[&key(handles[i % n].block())].next;
                        prop_assert_eq!(Some(key(&b)), k);
                        handles.push(H::R(b));
                    }
                }
                Op::Link(i, j) if n > 0 => {
                    let succ = handles[j % n].block().clone();
                    if let H::W(w) = &mut handles[i % n] {
                        let ka = key(w.as_block());
                        let kb = key(&succ);
                        let expect_ok = ka != kb
                            && model[&ka].next.is_none()
                            && model[&kb].next.is_none();
                        let r = w.link(&succ);
                        prop_assert_eq!(r.is_ok(), expect_ok);
                        if expect_ok {
                            model.get_mut(&ka).unwrap().next = Some(kb);
                        }
                    }
                }
                Op::Seal(i) if n > 0 => {
                    let h = handles.swap_remove(i % n);
                    if let H::W(w) = h {
                        handles.push(H::R(w.into_shared()));
                    } else {
                        handles.push(h);
                    }
                }
                Op::Drop(i) if n > 0 => {
                    drop(handles.swap_remove(i % n));
                }
                _ => {}
            }
            // Invariants after every step.
            prop_assert_eq!(pool.in_use(), reachable(&handles, &model).len());
            prop_assert!(pool.high_water() <= pool.capacity());
            prop_assert!(pool.in_use() <= pool.high_water());
            for h in &handles {
                let b = h.block();
                prop_assert_eq!(b.data(), &model[&key(b)].data[..]);
            }
        }
        drop(handles);
        prop_assert_eq!(pool.in_use(), 0);
        // Every block comes back exactly once: the pool can be filled again, no more.
        let all: Vec<_> = (0..CAP).map(|_| pool.alloc()).collect();
        prop_assert!(all.iter().all(|r| r.is_ok()));
        prop_assert!(pool.alloc().is_err());
    }
}
