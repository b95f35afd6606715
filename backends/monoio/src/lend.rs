//! Zero-copy fan-out between worker threads: a worker lends pool blocks to
//! another instead of sending their bytes over the link between them.
//!
//! Every two workers run one moq-lite session over a Unix socket pair
//! ([`crate::relay::Mesh`]). Both ends turn on STREAM_REF
//! (`conn::Config::stream_refs`): a group stream's payload then crosses as
//! small records that name a lent block range, and the borrowing worker links
//! that range into its own relay track's groups as pieces of a *foreign
//! block* ([`skiff_core::pool::Pool::adopt`]). Its subscribers are served
//! straight from the lending worker's blocks: no copy between cores, and no
//! lock on the per-frame path.
//!
//! For one direction of one link there is one [`LinkShare`], shared by the
//! two workers:
//!
//! * the lender ([`Lender`], on the worker that owns the blocks) keeps each
//!   lent [`Slice`] in a slot, so its block stays allocated and unchanged,
//!   and publishes the slot's address and length with release ordering
//!   before the STREAM_REF record that names the slot leaves through the
//!   socket;
//! * the borrower ([`Borrower`], the other worker's session's
//!   [`Foreign`] resolver) reads the slot with acquire ordering and adopts
//!   the bytes into its pool, tagged with a token naming the link and slot;
//! * once the borrower's pool has released the foreign block (its groups
//!   were evicted or trimmed past it), [`return_released`] puts the slot
//!   number in the share's return ring, a single-producer single-consumer
//!   queue of atomics, and the lender frees the slot (dropping the slice) at
//!   the next session pass on its worker (`Relay::return_lent`, which also
//!   wakes producers waiting for pool room). The borrower does not wake the
//!   lender, so while ranges are out the link task runs a pass of its own
//!   20 ms after its last one, the wait doubling up to a second while none
//!   come back.
//!
//! Bounds: at most [`LEND_SLOTS`] ranges lent per direction, and the relay
//! lends at most half its pool over all its links together; with every slot
//! lent, the lender sends bytes again (the old way, into the borrower's own
//! blocks) until slots come back. So a borrower that holds on to blocks (its
//! cache) costs the lender at most that many blocks, and the lender always
//! keeps half its pool for its own groups: pinned blocks can never starve
//! the publisher that would evict them. The return ring has room for every
//! slot, so a return never waits.

use std::cell::{Cell, RefCell};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicUsize, Ordering};

use skiff_core::pool::{Block, Pool, Slice};
use skiff_core::session::{Foreign, ForeignError};

/// Block ranges one worker may have lent to another at once.
pub const LEND_SLOTS: usize = 4096;

/// How many ranges one link may lend at once for a relay of `threads`
/// workers whose pools hold `blocks` blocks each: the links of a worker
/// together lend at most half its pool (at least 16 ranges per link, at most
/// [`LEND_SLOTS`]).
pub fn lend_limit(blocks: usize, threads: usize) -> usize {
    let links = threads.saturating_sub(1).max(1);
    (blocks / (2 * links)).clamp(16, LEND_SLOTS)
}

/// Spare metadata slots a worker's pool needs for what the other workers
/// may lend it at once: a foreign block and at most two pieces per range.
pub fn spare_slots(blocks: usize, threads: usize) -> usize {
    3 * lend_limit(blocks, threads) * threads.saturating_sub(1)
}

/// One lent range as the borrower sees it.
#[derive(Debug)]
struct Slot {
    ptr: AtomicPtr<u8>,
    len: AtomicUsize,
}

/// What the two workers of one link direction share: the lent slots and the
/// ring that brings them back.
#[derive(Debug)]
pub struct LinkShare {
    slots: Box<[Slot]>,
    ring: Box<[AtomicU32]>,
    /// Next ring position the borrower writes (only it stores).
    head: AtomicUsize,
    /// Next ring position the lender reads (only it stores).
    tail: AtomicUsize,
}

impl LinkShare {
    /// A share with [`LEND_SLOTS`] slots, none lent.
    pub fn new() -> Arc<Self> {
        Self::with_slots(LEND_SLOTS)
    }

    fn with_slots(slots: usize) -> Arc<Self> {
        Arc::new(LinkShare {
            slots: (0..slots)
                .map(|_| Slot {
                    ptr: AtomicPtr::new(std::ptr::null_mut()),
                    len: AtomicUsize::new(0),
                })
                .collect(),
            // One more than the slots: a full ring never looks empty.
            ring: (0..=slots).map(|_| AtomicU32::new(0)).collect(),
            head: AtomicUsize::new(0),
            tail: AtomicUsize::new(0),
        })
    }

    /// Borrower side: slot `slot` is free again.
    fn push_return(&self, slot: u32) {
        let head = self.head.load(Ordering::Relaxed);
        let next = (head + 1) % self.ring.len();
        // Each slot is returned once per lending and the ring holds every
        // slot, so it cannot be full; if it were (a bug), dropping the return
        // only keeps one block lent.
        if next == self.tail.load(Ordering::Acquire) {
            debug_assert!(false, "lend return ring full");
            return;
        }
        self.ring[head].store(slot, Ordering::Relaxed);
        self.head.store(next, Ordering::Release);
    }

    /// Lender side: the next returned slot.
    fn pop_return(&self) -> Option<u32> {
        let tail = self.tail.load(Ordering::Relaxed);
        if tail == self.head.load(Ordering::Acquire) {
            return None;
        }
        let slot = self.ring[tail].load(Ordering::Relaxed);
        self.tail
            .store((tail + 1) % self.ring.len(), Ordering::Release);
        Some(slot)
    }
}

/// The lending worker's side of one link direction (lives as long as the
/// worker: lent blocks must stay put until they come back).
#[derive(Debug)]
pub struct Lender {
    share: Arc<LinkShare>,
    lent: RefCell<Vec<Option<Slice<'static>>>>,
    free: RefCell<Vec<u32>>,
    /// Most ranges lent at once.
    limit: usize,
    /// Bytes lent so far.
    lent_bytes: Cell<u64>,
    /// Ranges returned so far.
    returned: Cell<u64>,
}

impl Lender {
    /// The lender over `share`, nothing lent, lending at most `limit`
    /// ranges at once (at most the share's slots).
    pub fn new(share: Arc<LinkShare>, limit: usize) -> Self {
        let n = share.slots.len();
        let limit = limit.min(n);
        Lender {
            share,
            lent: RefCell::new((0..n).map(|_| None).collect()),
            // Popped from the end: slot 0 first.
            free: RefCell::new((0..limit as u32).rev().collect()),
            limit,
            lent_bytes: Cell::new(0),
            returned: Cell::new(0),
        }
    }

    /// Takes back every slot the borrower returned; returns how many.
    pub fn reclaim(&self) -> usize {
        let mut lent = self.lent.borrow_mut();
        let mut free = self.free.borrow_mut();
        let mut n = 0;
        while let Some(slot) = self.share.pop_return() {
            if let Some(held) = lent.get_mut(slot as usize).and_then(Option::take) {
                self.share.slots[slot as usize]
                    .ptr
                    .store(std::ptr::null_mut(), Ordering::Relaxed);
                drop(held);
                free.push(slot);
                n += 1;
            }
        }
        self.returned.set(self.returned.get() + n as u64);
        n
    }

    /// Ranges returned so far.
    pub fn returned(&self) -> u64 {
        self.returned.get()
    }

    /// Lends `slice` (keeping it until it comes back); the token for a
    /// STREAM_REF, or `None` when every slot is lent.
    pub fn lend(&self, slice: Slice<'static>) -> Option<u64> {
        let slot = self.free.borrow_mut().pop()?;
        let bytes = slice.as_bytes();
        let s = &self.share.slots[slot as usize];
        s.len.store(bytes.len(), Ordering::Relaxed);
        // Release: the bytes and the length are visible to a borrower that
        // loads this pointer with acquire ordering.
        s.ptr.store(bytes.as_ptr().cast_mut(), Ordering::Release);
        self.lent_bytes
            .set(self.lent_bytes.get() + bytes.len() as u64);
        self.lent.borrow_mut()[slot as usize] = Some(slice);
        Some(u64::from(slot))
    }

    /// Bytes lent so far.
    pub fn lent_bytes(&self) -> u64 {
        self.lent_bytes.get()
    }

    /// Ranges lent and not returned yet.
    pub fn outstanding(&self) -> usize {
        self.limit - self.free.borrow().len()
    }
}

/// The borrowing worker's side of one link direction: resolves the link
/// session's STREAM_REF tokens into foreign blocks of the worker's pool.
#[derive(Debug)]
pub struct Borrower {
    share: Arc<LinkShare>,
    pool: &'static Pool<'static>,
    /// The lending worker's index, kept in the high half of each adopted
    /// block's token so [`return_released`] knows which link it came by.
    peer: u32,
}

impl Borrower {
    /// The borrower over `share`, adopting into `pool` from worker `peer`.
    pub fn new(share: Arc<LinkShare>, pool: &'static Pool<'static>, peer: usize) -> Self {
        Borrower {
            share,
            pool,
            peer: u32::try_from(peer).unwrap_or(u32::MAX),
        }
    }
}

impl Foreign<'static> for Borrower {
    fn resolve(&self, token: u64, len: u64) -> Result<Block<'static>, ForeignError> {
        let slot = usize::try_from(token)
            .ok()
            .and_then(|t| self.share.slots.get(t))
            .ok_or(ForeignError::Unknown)?;
        // Acquire: pairs with the lender's release store (see `Lender::lend`).
        let ptr = NonNull::new(slot.ptr.load(Ordering::Acquire)).ok_or(ForeignError::Unknown)?;
        let n = slot.len.load(Ordering::Relaxed);
        if n as u64 != len {
            return Err(ForeignError::Unknown);
        }
        let tag = (u64::from(self.peer) << 32) | token;
        // SAFETY: the lender keeps the slice behind this slot, whose
        // committed bytes never change, until the slot comes back through
        // the return ring, which happens only after this pool released the
        // foreign block (`return_released`); its writes happened before the
        // release store this load synchronizes with. The lending worker's
        // pool is leaked, so the memory outlives both threads.
        unsafe { self.pool.adopt(ptr, n, tag) }.map_err(|_| ForeignError::Exhausted)
    }
}

/// Sends every foreign block `pool` released back to its lender: `shares`
/// is indexed by the lending worker's index.
pub fn return_released(pool: &Pool<'_>, shares: &[Option<Arc<LinkShare>>]) {
    while let Some(tag) = pool.take_released() {
        let peer = (tag >> 32) as usize;
        if let Some(Some(share)) = shares.get(peer) {
            share.push_return(tag as u32);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_core::pool::BlockMeta;

    fn leak(blocks: usize, spare: usize) -> &'static Pool<'static> {
        let bytes: &'static mut [u8] = Box::leak(vec![0u8; blocks * 64].into_boxed_slice());
        let meta: &'static mut [BlockMeta] = Box::leak(
            (0..blocks + spare)
                .map(|_| BlockMeta::new())
                .collect::<Vec<_>>()
                .into_boxed_slice(),
        );
        Box::leak(Box::new(
            Pool::from_parts_with_spare(bytes, meta, spare).unwrap(),
        ))
    }

    #[test]
    fn lent_blocks_come_back_once_the_borrower_lets_go() {
        let lending = leak(4, 0);
        let borrowing = leak(2, 8);
        let share = LinkShare::with_slots(2);
        let lender = Lender::new(share.clone(), 8);
        let borrower = Borrower::new(share.clone(), borrowing, 3);
        let mut w = lending.alloc().unwrap();
        w.append(b"hello world");
        let block = w.into_shared();
        let a = lender.lend(block.clone().slice(0, 5).unwrap()).unwrap();
        let b = lender.lend(block.clone().slice(6, 11).unwrap()).unwrap();
        assert_eq!(
            lender.lend(block.clone().slice(0, 1).unwrap()),
            None,
            "all lent"
        );
        drop(block);
        assert_eq!(lending.in_use(), 1, "the lent slices hold the block");
        let fa = borrower.resolve(a, 5).unwrap();
        assert_eq!(
            borrower.resolve(b, 4).unwrap_err(),
            ForeignError::Unknown,
            "wrong length"
        );
        assert_eq!(
            borrower.resolve(7, 5).unwrap_err(),
            ForeignError::Unknown,
            "no such slot"
        );
        let fb = borrower.resolve(b, 5).unwrap();
        assert_eq!((fa.data(), fb.data()), (&b"hello"[..], &b"world"[..]));
        assert_eq!(borrowing.in_use(), 0, "foreign blocks take spare slots");
        let mut shares = vec![None; 4];
        shares[3] = Some(share);
        drop(fa);
        return_released(borrowing, &shares);
        assert_eq!(lender.reclaim(), 1);
        assert_eq!(lender.outstanding(), 1);
        drop(fb);
        return_released(borrowing, &shares);
        lender.reclaim();
        assert_eq!((lender.outstanding(), lending.in_use()), (0, 0));
        assert_eq!(
            borrower.resolve(a, 5).unwrap_err(),
            ForeignError::Unknown,
            "a returned slot names nothing"
        );
    }

    #[test]
    fn links_lend_at_most_half_the_pool_together() {
        // 256 MiB of 16 KiB blocks.
        assert_eq!(lend_limit(16_384, 1), LEND_SLOTS);
        assert_eq!(lend_limit(16_384, 2), LEND_SLOTS);
        assert_eq!(lend_limit(16_384, 8), 16_384 / 14);
        assert_eq!(lend_limit(64, 64), 16, "a floor per link");
        assert_eq!(spare_slots(16_384, 1), 0);
        assert_eq!(spare_slots(16_384, 8), 3 * (16_384 / 14) * 7);
    }

    #[test]
    fn the_return_ring_crosses_threads() {
        let share = LinkShare::with_slots(64);
        let other = share.clone();
        let t = std::thread::spawn(move || {
            for round in 0..1000u32 {
                other.push_return(round % 64);
                while other.head.load(Ordering::Acquire) != other.tail.load(Ordering::Acquire) {
                    std::hint::spin_loop();
                }
            }
        });
        let mut got = 0u32;
        while got < 1000 {
            if let Some(slot) = share.pop_return() {
                assert_eq!(slot, got % 64);
                got += 1;
            }
        }
        t.join().unwrap();
    }
}
