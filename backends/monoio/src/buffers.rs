//! Per-thread pools of the buffers a connection needs only while bytes pass
//! through it: inbox buffers (received bytes the session has not taken yet)
//! and staging buffers (bytes on their way to the socket).
//!
//! Inbox buffers come in three sizes (`InboxSize`): a tiny one, which holds
//! the short records a viewer sends (credit, acknowledgements, a request), a
//! small one, which holds a whole QMux record and a read, and a large one for
//! a backlog (a publisher's burst, a session that stopped taking bytes). A
//! connection moves up a size once more waits than its buffer is for, and
//! gives the buffer back once everything is taken.
//!
//! A viewer sends a few hundred bytes a second and its media goes out within
//! the pass that staged it, so it holds neither buffer between passes: a
//! connection costs its session tables and the window of media in flight to
//! it, not a worst-case reservation. While its socket is full it holds one
//! staging buffer, which carries only record headers (the payload stays in
//! the block pool), so a thousand slow viewers hold a few KiB each. Each pool
//! keeps as many free buffers as were in use at once since its last trim
//! (at least a floor, made at its first use), so after warm-up taking one
//! allocates nothing, and a trim a second after a burst ends gives its
//! memory back.
//!
//! The pools are thread-local: every connection of a thread-per-core runtime
//! lives on one thread, so no locking. Each session pass checks whether a
//! trim is due: a busy thread trims once a second, an idle one at its next
//! pass.

use std::cell::{Cell, RefCell};

use skiff_core::time::{Duration, Instant};

use crate::staging::Staging;

/// Received bytes the reader stops at: a large inbox buffer holds this many
/// plus one whole read ([`INBOX_READ`]).
pub(crate) const INBOX_BYTES: usize = 256 * 1024;

/// Most bytes one read into a large inbox buffer asks for (the room kept
/// free after the bytes waiting).
pub(crate) const INBOX_READ: usize = 64 * 1024;

/// A whole QMux record at the default record size, with its head room: what
/// a small inbox buffer must hold for the session to take it.
pub(crate) const RECORD_BYTES: usize = 16 * 1024 + 8;

/// Bytes of a tiny inbox buffer: the records a viewer sends, a few dozen
/// bytes each, and a read after them.
pub(crate) const TINY_INBOX: usize = 2 * 1024;

/// Bytes waiting past which a tiny inbox buffer moves up a size (the room
/// kept free for a read after them, too): more than a viewer's records, so
/// most likely the start of a long record.
pub(crate) const TINY_RECORD: usize = TINY_INBOX / 2;

/// Bytes of a small inbox buffer: a whole record waiting and a read after it.
pub(crate) const SMALL_INBOX: usize = 2 * RECORD_BYTES;

/// The large inbox buffer's size.
pub(crate) const LARGE_INBOX: usize = INBOX_BYTES + INBOX_READ;

/// Capacity of a staging buffer: record headers and control messages (group
/// payload is gathered from the pool, not staged). A pass that stages more
/// sends what it has first, so the buffer does not grow.
pub(crate) const STAGING_CAPACITY: usize = 2 * 1024;

/// Free tiny inbox buffers a thread keeps whatever its use.
const MIN_FREE_TINY: usize = 64;

/// Free small inbox buffers a thread keeps whatever its use.
const MIN_FREE_SMALL: usize = 8;

/// Free large inbox buffers a thread keeps whatever its use (and makes at
/// its first use, as every pool makes its floor).
const MIN_FREE_LARGE: usize = 4;

/// Free staging buffers a thread keeps whatever its use.
const MIN_FREE_STAGINGS: usize = 64;

/// Free buffers of one kind, kept up to the most in use at once since the
/// last [`trim`] (at least a floor): a load that holds many at once, pass
/// after pass, takes them without allocating, and once it is gone the next
/// trim drops what it no longer needs.
#[derive(Debug)]
struct FreeList<T> {
    free: Vec<T>,
    /// Taken and not given back.
    in_use: usize,
    /// Most in use at once since the last trim.
    peak: usize,
    /// Free buffers kept whatever the use.
    floor: usize,
    /// Whether the list was filled to its floor ([`FreeList::take_or_make`]).
    warmed: bool,
}

impl<T> FreeList<T> {
    const fn new(floor: usize) -> Self {
        FreeList {
            free: Vec::new(),
            in_use: 0,
            peak: 0,
            floor,
            warmed: false,
        }
    }

    /// Buffers (in use and free) the list answers for now.
    fn limit(&self) -> usize {
        self.peak.max(self.floor)
    }

    fn take(&mut self) -> Option<T> {
        self.in_use += 1;
        self.peak = self.peak.max(self.in_use);
        self.free.pop()
    }

    /// A free buffer, or a new one by `make`. The first take fills the
    /// list to its floor, so a thread's first connections meet the load
    /// they bring with buffers made at start, not in the middle of it.
    fn take_or_make(&mut self, mut make: impl FnMut() -> T) -> T {
        if !self.warmed {
            self.warmed = true;
            self.free.reserve_exact(self.floor);
            while self.free.len() < self.floor {
                self.free.push(make());
            }
        }
        self.take().unwrap_or_else(make)
    }

    fn give(&mut self, buf: T) {
        self.in_use = self.in_use.saturating_sub(1);
        if self.in_use + self.free.len() < self.limit() {
            self.free.push(buf);
        }
    }

    /// A taken buffer is dropped rather than given back.
    fn discard(&mut self) {
        self.in_use = self.in_use.saturating_sub(1);
    }

    /// Drops the free buffers beyond the peak since the last trim, then
    /// counts the peak again from the buffers in use now.
    /// Returns how many free buffers it dropped.
    fn trim(&mut self) -> usize {
        let keep = self.limit().saturating_sub(self.in_use);
        let dropped = self.free.len().saturating_sub(keep);
        // The list keeps its capacity (a word or three per buffer of the
        // peak), so giving buffers back after a trim never allocates.
        self.free.truncate(keep);
        self.peak = self.in_use;
        dropped
    }
}

thread_local! {
    static TINY: RefCell<FreeList<Vec<u8>>> = const { RefCell::new(FreeList::new(MIN_FREE_TINY)) };
    static SMALL: RefCell<FreeList<Vec<u8>>> = const { RefCell::new(FreeList::new(MIN_FREE_SMALL)) };
    static LARGE: RefCell<FreeList<Vec<u8>>> = const { RefCell::new(FreeList::new(MIN_FREE_LARGE)) };
    static STAGINGS: RefCell<FreeList<Staging>> =
        const { RefCell::new(FreeList::new(MIN_FREE_STAGINGS)) };
    static NEXT_TRIM: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// How often a thread trims its pools ([`trim_if_due`]): a burst's
/// buffers are given back within about this long of its end.
pub(crate) const TRIM_EVERY: Duration = Duration::from_secs(1);

/// Bytes of buffers a [`trim`] drops past which it asks the allocator to
/// return freed memory to the system ([`give_back_memory`]).
const GIVE_BACK_AFTER: usize = 256 * 1024;

/// Drops the free buffers of this thread's pools beyond the most that were
/// in use at once since the last call (or beyond each pool's floor), and
/// starts counting that peak again. When that frees a burst's worth, the
/// allocator is asked to hand it back: glibc keeps freed memory in its heap
/// otherwise, and a relay whose viewers stay connected would keep a burst's
/// buffers resident for good.
fn trim() {
    let dropped = TINY.with(|p| p.borrow_mut().trim()) * TINY_INBOX
        + SMALL.with(|p| p.borrow_mut().trim()) * SMALL_INBOX
        + LARGE.with(|p| p.borrow_mut().trim()) * LARGE_INBOX
        + STAGINGS.with(|p| p.borrow_mut().trim()) * STAGING_CAPACITY;
    if dropped >= GIVE_BACK_AFTER {
        give_back_memory();
    }
}

/// Asks the allocator to return freed memory to the system (glibc keeps the
/// memory of many small frees in its heap for ever otherwise). O(heap): for
/// after a burst only.
pub fn give_back_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes a plain integer and only rearranges the
    // allocator's free lists; it is safe to call from any thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// [`trim`]s this thread's pools if [`TRIM_EVERY`] has passed since the
/// last trim (a session driver calls it on every pass with the time it
/// was passed; no timer of its own, so it never allocates).
pub(crate) fn trim_if_due(now: Instant) {
    let due = NEXT_TRIM.with(|next| match next.get() {
        Some(at) if now < at => false,
        _ => {
            next.set(Some(now + TRIM_EVERY));
            true
        }
    });
    if due {
        trim();
    }
}

/// The sizes of inbox buffer, smallest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum InboxSize {
    /// [`TINY_INBOX`] bytes: a viewer's short records.
    Tiny,
    /// [`SMALL_INBOX`] bytes: a whole record and a read.
    Small,
    /// [`LARGE_INBOX`] bytes: a backlog.
    Large,
}

impl InboxSize {
    /// The size of buffer with `capacity` bytes, if it is one of these.
    pub(crate) fn of(capacity: usize) -> Option<Self> {
        match capacity {
            TINY_INBOX => Some(InboxSize::Tiny),
            SMALL_INBOX => Some(InboxSize::Small),
            LARGE_INBOX => Some(InboxSize::Large),
            _ => None,
        }
    }

    /// Bytes of a buffer of this size.
    pub(crate) fn bytes(self) -> usize {
        match self {
            InboxSize::Tiny => TINY_INBOX,
            InboxSize::Small => SMALL_INBOX,
            InboxSize::Large => LARGE_INBOX,
        }
    }

    /// Room kept free after the bytes waiting, for the next read.
    pub(crate) fn min_room(self) -> usize {
        match self {
            InboxSize::Tiny => TINY_RECORD,
            InboxSize::Small => RECORD_BYTES,
            InboxSize::Large => INBOX_READ,
        }
    }

    /// The most bytes that may wait in a buffer of this size before it is
    /// outgrown: a tiny buffer's record, a small buffer's whole record.
    pub(crate) fn most_waiting(self) -> usize {
        match self {
            InboxSize::Tiny => TINY_RECORD,
            InboxSize::Small => RECORD_BYTES,
            InboxSize::Large => INBOX_BYTES,
        }
    }

    /// The smallest size that holds `waiting` bytes with room for a read of
    /// `incoming` after them, and is not yet outgrown: more than a tiny
    /// buffer's record waiting moves to a small one, more than a whole
    /// record to a large one.
    pub(crate) fn for_waiting(waiting: usize, incoming: usize) -> Self {
        let fits =
            |size: InboxSize| waiting <= size.most_waiting() && waiting + incoming <= size.bytes();
        if fits(InboxSize::Tiny) {
            InboxSize::Tiny
        } else if fits(InboxSize::Small) {
            InboxSize::Small
        } else {
            InboxSize::Large
        }
    }

    fn pool(self) -> &'static std::thread::LocalKey<RefCell<FreeList<Vec<u8>>>> {
        match self {
            InboxSize::Tiny => &TINY,
            InboxSize::Small => &SMALL,
            InboxSize::Large => &LARGE,
        }
    }
}

/// An inbox buffer of `size` (zeroed once, when first made), reused if one
/// is free.
pub(crate) fn take_inbox(size: InboxSize) -> Vec<u8> {
    size.pool()
        .with(|p| p.borrow_mut().take_or_make(|| vec![0; size.bytes()]))
}

/// Gives an inbox buffer back (dropped if its pool has all it keeps, or it
/// is none of the sizes).
pub(crate) fn give_inbox(buf: Vec<u8>) {
    if let Some(size) = InboxSize::of(buf.len()) {
        size.pool().with(|p| p.borrow_mut().give(buf));
    }
}

/// An empty staging buffer of `STAGING_CAPACITY`, reused if one is free.
pub fn take_staging() -> Staging {
    STAGINGS.with(|p| {
        p.borrow_mut()
            .take_or_make(|| Staging::new(Vec::with_capacity(STAGING_CAPACITY)))
    })
}

/// Gives a staging buffer back, emptied first (its gathered ranges let go
/// of their blocks); dropped if the pool has all it keeps or the buffer
/// grew past `STAGING_CAPACITY`.
pub fn give_staging(mut staging: Staging) {
    staging.clear();
    STAGINGS.with(|p| {
        let mut free = p.borrow_mut();
        if staging.capacity() > STAGING_CAPACITY {
            free.discard();
        } else {
            free.give(staging);
        }
    });
}

/// Free buffers of this thread's pools: (tiny, small and large inboxes, stagings).
#[cfg(test)]
fn free_counts() -> (usize, usize, usize, usize) {
    (
        TINY.with(|p| p.borrow().free.len()),
        SMALL.with(|p| p.borrow().free.len()),
        LARGE.with(|p| p.borrow().free.len()),
        STAGINGS.with(|p| p.borrow().free.len()),
    )
}

/// Bytes the free buffers of this thread's pools hold: memory kept for the
/// next connections, bounded by the most buffers in use at once since the
/// last trim.
pub fn free_bytes() -> usize {
    let inboxes =
        |p: &RefCell<FreeList<Vec<u8>>>| p.borrow().free.iter().map(Vec::capacity).sum::<usize>();
    TINY.with(inboxes)
        + SMALL.with(inboxes)
        + LARGE.with(inboxes)
        + STAGINGS.with(|p| p.borrow().free.iter().map(Staging::capacity).sum::<usize>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_reused_and_the_pools_are_bounded() {
        // The first take makes the pool's floor; the buffer given back is
        // the one the next take returns.
        let a = take_inbox(InboxSize::Small);
        assert_eq!(a.len(), SMALL_INBOX);
        assert_eq!(free_counts().1, MIN_FREE_SMALL - 1);
        let ptr = a.as_ptr();
        give_inbox(a);
        let again = take_inbox(InboxSize::Small);
        assert_eq!(again.as_ptr(), ptr);
        give_inbox(again);
        assert_eq!(free_counts().1, MIN_FREE_SMALL);
        // A buffer of none of the sizes is dropped; past the floor (and no
        // peak above it), given buffers are dropped too.
        give_inbox(vec![0; 8]);
        assert_eq!(free_counts().1, MIN_FREE_SMALL);
        assert_eq!(take_inbox(InboxSize::Large).len(), LARGE_INBOX);
        for _ in 0..MIN_FREE_LARGE + 3 {
            give_inbox(vec![0; LARGE_INBOX]);
        }
        assert_eq!(free_counts().2, MIN_FREE_LARGE);
        give_inbox(take_inbox(InboxSize::Tiny));
        assert_eq!(free_counts().0, MIN_FREE_TINY);

        let mut s = take_staging();
        s.extend_from_slice(b"header");
        give_staging(s);
        let s = take_staging();
        assert!(s.is_empty());
        assert_eq!(s.capacity(), STAGING_CAPACITY);
    }

    #[test]
    fn a_pool_keeps_what_its_peak_use_needs_until_a_trim_finds_it_unused() {
        let mut list = FreeList::new(2);
        // Ten in use at once, then all given back: all ten are kept, so the
        // same load again allocates nothing.
        let taken: Vec<_> = (0..10).map(|i| list.take().unwrap_or(i)).collect();
        assert!(taken.iter().all(|&b| b < 10));
        for b in taken {
            list.give(b);
        }
        assert_eq!(list.free.len(), 10);
        for _ in 0..10 {
            assert!(list.take().is_some());
        }
        for b in 0..10 {
            list.give(b);
        }
        // A trim after the peak starts counting again: the next trim with
        // three in use at most keeps three, and then the floor.
        list.trim();
        assert_eq!(list.free.len(), 10);
        let three: Vec<_> = (0..3).filter_map(|_| list.take()).collect();
        for b in three {
            list.give(b);
        }
        list.trim();
        assert_eq!(list.free.len(), 3);
        list.trim();
        assert_eq!(list.free.len(), 2);
        // Buffers in use are never counted out: with five taken, five
        // given back are all kept.
        let five: Vec<_> = (0..5).map(|i| list.take().unwrap_or(i)).collect();
        list.trim();
        for b in five {
            list.give(b);
        }
        assert_eq!(list.free.len(), 5);
    }

    #[test]
    fn an_inbox_moves_up_a_size_once_more_waits_than_it_is_for() {
        assert_eq!(InboxSize::for_waiting(0, 0), InboxSize::Tiny);
        assert_eq!(InboxSize::for_waiting(TINY_RECORD, 0), InboxSize::Tiny);
        assert_eq!(InboxSize::for_waiting(TINY_RECORD + 1, 0), InboxSize::Small);
        assert_eq!(InboxSize::for_waiting(0, TINY_INBOX + 1), InboxSize::Small);
        assert_eq!(InboxSize::for_waiting(RECORD_BYTES, 0), InboxSize::Small);
        assert_eq!(
            InboxSize::for_waiting(RECORD_BYTES + 1, 0),
            InboxSize::Large
        );
        assert_eq!(InboxSize::for_waiting(0, INBOX_READ), InboxSize::Large);
        for size in [InboxSize::Tiny, InboxSize::Small, InboxSize::Large] {
            assert_eq!(InboxSize::of(size.bytes()), Some(size));
            assert!(size.min_room() <= size.bytes() / 2 || size == InboxSize::Large);
        }
    }
}
