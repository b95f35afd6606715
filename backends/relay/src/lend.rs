//! Zero-copy fan-out between worker threads: a worker lends pool blocks to
//! another instead of sending their bytes over the link between them.
//!
//! Every two workers run one moq-lite session over a Unix socket pair (the
//! relay's worker mesh, `relay::Mesh`). Both ends turn on STREAM_REF
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
//!   the bytes into its pool, tagged with a token naming the link and slot,
//!   and marks the slot adopted: a second STREAM_REF naming it before the
//!   lender lends it again is refused ([`BorrowError::Adopted`]), so one
//!   lending is never adopted twice (two foreign blocks over the same bytes
//!   would return the slot twice, the second time while the lender may
//!   already have freed or relent it);
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
//! lent, the lender sends the bytes themselves (copied into the borrower's
//! own blocks) until slots come back. So a borrower that holds on to blocks (its
//! cache) costs the lender at most that many blocks, and the lender always
//! keeps half its pool for its own groups: pinned blocks can never starve
//! the publisher that would evict them. The return ring has room for every
//! slot, so a return never waits.

use std::cell::{Cell, RefCell};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicPtr, AtomicU8, AtomicU32, AtomicUsize, Ordering};

use skiff_core::pool::{Block, Pool, Slice};
use skiff_core::session::{Foreign, ForeignError};
use skiff_core::time::{Duration, Instant};

/// The lending end of a link between two workers of one process: group
/// payload crosses as references to pool blocks the peer adopts, instead of
/// bytes (STREAM_REF).
pub trait Lend {
    /// Lends `slice` to the peer: the token that names it in a STREAM_REF
    /// record, or `None` to send its bytes instead (every slot lent).
    fn lend(&self, slice: Slice<'static>) -> Option<u64>;
    /// Ranges lent and not taken back yet.
    fn outstanding(&self) -> usize;
    /// Ranges the peer has given back so far (a count that only grows).
    fn returned(&self) -> u64;
}

/// How soon a link with blocks lent out looks for returned ones when nothing
/// else wakes it, at first and at most ([`Reclaim`]).
const LEND_RECLAIM: (Duration, Duration) = (Duration::from_millis(20), Duration::from_secs(1));

/// When a link's session looks for the blocks the other worker gave back:
/// the borrower does not wake the lender, so while ranges are out the link
/// makes a pass of its own `LEND_RECLAIM`'s first wait after its last one,
/// the wait doubling (up to the second) while nothing comes back, so an idle
/// link whose blocks the other worker keeps cached hardly runs.
#[derive(Debug)]
pub struct Reclaim {
    /// The wait before the next look.
    wait: Duration,
    /// The lender's [`Lend::returned`] at the last look.
    returns_seen: u64,
}

impl Default for Reclaim {
    fn default() -> Self {
        Reclaim {
            wait: LEND_RECLAIM.0,
            returns_seen: 0,
        }
    }
}

impl Reclaim {
    /// The instant of the next look for returned blocks after a pass at
    /// `now`, or `None` while `lender` has nothing out.
    pub fn next(&mut self, lender: &dyn Lend, now: Instant) -> Option<Instant> {
        if lender.outstanding() == 0 {
            return None;
        }
        self.wait = if lender.returned() != self.returns_seen {
            LEND_RECLAIM.0
        } else {
            self.wait.saturating_add(self.wait).min(LEND_RECLAIM.1)
        };
        self.returns_seen = lender.returned();
        Some(now.saturating_add(self.wait))
    }
}

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

/// [`Slot::state`]: not lent (the lender holds nothing for it).
const FREE: u8 = 0;
/// [`Slot::state`]: lent, and not adopted by the borrower yet.
const LENT: u8 = 1;
/// [`Slot::state`]: adopted by the borrower; stays so until the lender takes
/// the slot back ([`Lender::reclaim`]).
const ADOPTED: u8 = 2;

/// One lent range as the borrower sees it.
#[derive(Debug)]
struct Slot {
    ptr: AtomicPtr<u8>,
    len: AtomicUsize,
    /// [`FREE`] → [`LENT`] (lender, release: publishes `ptr` and `len`) →
    /// [`ADOPTED`] (borrower) → [`FREE`] (lender, once the slot came back
    /// through the return ring, so after the borrower's store).
    state: AtomicU8,
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
                    state: AtomicU8::new(FREE),
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
                let s = &self.share.slots[slot as usize];
                // The borrower marked the slot adopted before it sent the
                // slot back (the ring's release/acquire orders the two), so
                // this store comes after its own.
                s.state.store(FREE, Ordering::Relaxed);
                s.ptr.store(std::ptr::null_mut(), Ordering::Relaxed);
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
        s.ptr.store(bytes.as_ptr().cast_mut(), Ordering::Relaxed);
        // Release: the bytes, the pointer and the length are visible to a
        // borrower that loads the state with acquire ordering.
        s.state.store(LENT, Ordering::Release);
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

impl Lend for Lender {
    fn lend(&self, slice: Slice<'static>) -> Option<u64> {
        Lender::lend(self, slice)
    }

    fn outstanding(&self) -> usize {
        Lender::outstanding(self)
    }

    fn returned(&self) -> u64 {
        Lender::returned(self)
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

/// Why [`Borrower::adopt`] gave no block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BorrowError {
    /// The token names no lent range of that length.
    #[error("the token names no lent range of that length")]
    Unknown,
    /// The token's range is adopted already and has not been taken back by
    /// the lender (a repeated or forged STREAM_REF).
    #[error("the lent range is adopted already")]
    Adopted,
    /// The pool has no metadata slot free right now.
    #[error("no metadata slot free in the pool")]
    Exhausted,
}

impl From<BorrowError> for ForeignError {
    fn from(e: BorrowError) -> Self {
        match e {
            BorrowError::Unknown | BorrowError::Adopted => ForeignError::Unknown,
            BorrowError::Exhausted => ForeignError::Exhausted,
        }
    }
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

    /// The `len` lent bytes `token` names, as a foreign block of the pool;
    /// each lending is adopted at most once.
    ///
    /// # Errors
    /// [`BorrowError::Unknown`] if the token names no lent range of that
    /// length, [`BorrowError::Adopted`] if its range was adopted already and
    /// has not been taken back and lent again by the lender, and
    /// [`BorrowError::Exhausted`] if the pool has no metadata slot free (the
    /// range stays unadopted: ask again later).
    pub fn adopt(&self, token: u64, len: u64) -> Result<Block<'static>, BorrowError> {
        let slot = usize::try_from(token)
            .ok()
            .and_then(|t| self.share.slots.get(t))
            .ok_or(BorrowError::Unknown)?;
        // Acquire: pairs with the lender's release store (see `Lender::lend`).
        match slot.state.load(Ordering::Acquire) {
            LENT => {}
            ADOPTED => return Err(BorrowError::Adopted),
            _ => return Err(BorrowError::Unknown),
        }
        let ptr = NonNull::new(slot.ptr.load(Ordering::Relaxed)).ok_or(BorrowError::Unknown)?;
        let n = slot.len.load(Ordering::Relaxed);
        if n as u64 != len {
            return Err(BorrowError::Unknown);
        }
        let tag = (u64::from(self.peer) << 32) | token;
        // SAFETY: the lender keeps the slice behind this slot, whose
        // committed bytes never change, until the slot comes back through
        // the return ring, which happens only after this pool released the
        // foreign block (`return_released`); its writes happened before the
        // release store the state load above synchronizes with. The slot is
        // marked adopted below, so no second foreign block is made over
        // these bytes for this lending. The lending worker's relay
        // keeps its pool's storage while any range it lent is out
        // (`Relay::drop`), so the memory outlives the foreign block.
        let block = unsafe { self.pool.adopt(ptr, n, tag) }.map_err(|_| BorrowError::Exhausted)?;
        // Only this thread moves a slot from LENT, and the lender leaves it
        // alone until it comes back, so no other store races this one.
        slot.state.store(ADOPTED, Ordering::Relaxed);
        Ok(block)
    }
}

impl Foreign<'static> for Borrower {
    fn resolve(&self, token: u64, len: u64) -> Result<Block<'static>, ForeignError> {
        self.adopt(token, len).map_err(|e| {
            if e == BorrowError::Adopted {
                tracing::warn!(token, "stream reference names a range adopted already");
            }
            ForeignError::from(e)
        })
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
    use skiff_monoio::tables::Keep;

    #[test]
    fn lent_blocks_come_back_once_the_borrower_lets_go() {
        let mut keep = Keep::new();
        // SAFETY: every user of the pools is dropped before the keep.
        let (lending, borrowing) =
            unsafe { (keep.pool_of_blocks(4, 64, 0), keep.pool_of_blocks(2, 64, 8)) };
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
    fn a_lent_range_is_adopted_once_per_lending() {
        let mut keep = Keep::new();
        // One data block and one spare slot: room for two foreign blocks,
        // or one once the data block is in use.
        // SAFETY: every user of the pools is dropped before the keep.
        let (lending, borrowing) =
            unsafe { (keep.pool_of_blocks(2, 64, 0), keep.pool_of_blocks(1, 64, 1)) };
        let share = LinkShare::with_slots(2);
        let lender = Lender::new(share.clone(), 2);
        let borrower = Borrower::new(share.clone(), borrowing, 1);
        let mut shares = vec![None; 2];
        shares[1] = Some(share);
        let mut w = lending.alloc().unwrap();
        w.append(b"hello world");
        let block = w.into_shared();
        let a = lender.lend(block.clone().slice(0, 5).unwrap()).unwrap();
        let b = lender.lend(block.clone().slice(6, 11).unwrap()).unwrap();

        let fa = borrower.adopt(a, 5).unwrap();
        assert_eq!(
            borrower.adopt(a, 5).unwrap_err(),
            BorrowError::Adopted,
            "a second resolve of one lending"
        );
        assert_eq!(
            borrower.resolve(a, 5).unwrap_err(),
            ForeignError::Unknown,
            "the session closes on it"
        );
        let _own = borrowing.alloc().unwrap();
        assert_eq!(borrower.adopt(b, 5).unwrap_err(), BorrowError::Exhausted);

        // Released and on its way back: still refused until the lender has
        // taken it back, which frees the bytes.
        drop(fa);
        return_released(borrowing, &shares);
        assert_eq!(borrower.adopt(a, 5).unwrap_err(), BorrowError::Adopted);
        // A range refused for lack of room is adopted once room is back.
        let fb = borrower.adopt(b, 5).unwrap();
        assert_eq!(fb.data(), b"world");
        assert_eq!(lender.reclaim(), 1);
        assert_eq!(borrower.adopt(a, 5).unwrap_err(), BorrowError::Unknown);
        assert_eq!(borrowing.take_released(), None, "one return per lending");

        // Lent again, the slot is adopted again (once).
        let again = lender.lend(block.clone().slice(0, 5).unwrap()).unwrap();
        assert_eq!(again, a, "the slot is reused");
        drop(fb);
        return_released(borrowing, &shares);
        let fa = borrower.adopt(a, 5).unwrap();
        assert_eq!(fa.data(), b"hello");
        assert_eq!(borrower.adopt(a, 5).unwrap_err(), BorrowError::Adopted);
        drop((fa, block));
        return_released(borrowing, &shares);
        assert_eq!(lender.reclaim(), 2);
        assert_eq!((lender.outstanding(), lending.in_use()), (0, 0));
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
