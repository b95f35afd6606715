//! Per-thread pools of the buffers a connection needs only while bytes pass
//! through it: inbox buffers (received bytes the session has not taken yet)
//! and staging buffers (bytes on their way to the socket).
//!
//! Inbox buffers come in two sizes: a small one, which holds a whole QMux
//! record and a read (all a viewer's requests ever need), and a large one
//! for a backlog (a publisher's burst, a session that stopped taking bytes),
//! which a connection moves to once more than a record waits and leaves once
//! everything is taken.
//!
//! A viewer sends a few hundred bytes a second and its media goes out within
//! the pass that staged it, so it holds neither buffer between passes: a
//! connection costs its session tables and the window of media in flight to
//! it, not a worst-case reservation. Each pool keeps a bounded number of free
//! buffers (more are dropped when given back), so after warm-up taking one
//! allocates nothing and a burst that ends gives its memory back.
//!
//! The pools are thread-local: every connection of a thread-per-core runtime
//! lives on one thread, so no locking.

use std::cell::RefCell;

use crate::staging::Staging;

/// Received bytes the reader stops at: a large inbox buffer holds this many
/// plus one whole read ([`INBOX_READ`]).
pub const INBOX_BYTES: usize = 256 * 1024;

/// Most bytes one read into a large inbox buffer asks for (the room kept
/// free after the bytes waiting).
pub const INBOX_READ: usize = 64 * 1024;

/// A whole QMux record at the default record size, with its head room: what
/// a small inbox buffer must hold for the session to take it.
pub const RECORD_BYTES: usize = 16 * 1024 + 8;

/// Bytes of a small inbox buffer: a whole record waiting and a read after it.
pub const SMALL_INBOX: usize = 2 * RECORD_BYTES;

/// The large inbox buffer's size.
pub const LARGE_INBOX: usize = INBOX_BYTES + INBOX_READ;

/// Capacity of a staging buffer. Only what a pass stages is ever written
/// (its bytes are initialized as they are first used), so a buffer that
/// carried record headers only is a few KiB of memory in use.
pub const STAGING_CAPACITY: usize = 16 * 1024;

/// Free small inbox buffers a thread keeps.
const MAX_FREE_SMALL: usize = 8;

/// Free large inbox buffers a thread keeps.
const MAX_FREE_LARGE: usize = 4;

/// Free staging buffers a thread keeps.
const MAX_FREE_STAGINGS: usize = 64;

thread_local! {
    static SMALL: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
    static LARGE: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
    static STAGINGS: RefCell<Vec<Staging>> = const { RefCell::new(Vec::new()) };
}

/// A small ([`SMALL_INBOX`]) or large ([`LARGE_INBOX`]) inbox buffer
/// (zeroed once, when first made), reused if one is free.
pub fn take_inbox(large: bool) -> Vec<u8> {
    let (pool, len) = if large {
        (&LARGE, LARGE_INBOX)
    } else {
        (&SMALL, SMALL_INBOX)
    };
    pool.with(|p| p.borrow_mut().pop())
        .unwrap_or_else(|| vec![0; len])
}

/// Gives an inbox buffer back (dropped if its pool is full or it is neither size).
pub fn give_inbox(buf: Vec<u8>) {
    let (pool, max) = match buf.len() {
        SMALL_INBOX => (&SMALL, MAX_FREE_SMALL),
        LARGE_INBOX => (&LARGE, MAX_FREE_LARGE),
        _ => return,
    };
    pool.with(|p| {
        let mut free = p.borrow_mut();
        if free.len() < max {
            free.push(buf);
        }
    });
}

/// An empty staging buffer of [`STAGING_CAPACITY`], reused if one is free.
pub fn take_staging() -> Staging {
    STAGINGS
        .with(|p| p.borrow_mut().pop())
        .unwrap_or_else(|| Staging::new(Vec::with_capacity(STAGING_CAPACITY)))
}

/// Gives a staging buffer back, emptied first (its gathered ranges let go
/// of their blocks); dropped if the pool is full or it grew past
/// [`STAGING_CAPACITY`].
pub fn give_staging(mut staging: Staging) {
    staging.clear();
    if staging.capacity() > STAGING_CAPACITY {
        return;
    }
    STAGINGS.with(|p| {
        let mut free = p.borrow_mut();
        if free.len() < MAX_FREE_STAGINGS {
            free.push(staging);
        }
    });
}

/// Free buffers of this thread's pools: (small inboxes, large inboxes, stagings).
pub fn free_counts() -> (usize, usize, usize) {
    (
        SMALL.with(|p| p.borrow().len()),
        LARGE.with(|p| p.borrow().len()),
        STAGINGS.with(|p| p.borrow().len()),
    )
}

/// Bytes the free buffers of this thread's pools hold: memory kept for the
/// next connections, bounded by the pools' limits whatever the load.
pub fn free_bytes() -> usize {
    let inboxes = |p: &RefCell<Vec<Vec<u8>>>| p.borrow().iter().map(Vec::capacity).sum::<usize>();
    SMALL.with(inboxes)
        + LARGE.with(inboxes)
        + STAGINGS.with(|p| p.borrow().iter().map(Staging::capacity).sum::<usize>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_reused_and_the_pools_are_bounded() {
        let a = take_inbox(false);
        assert_eq!(a.len(), SMALL_INBOX);
        let ptr = a.as_ptr();
        give_inbox(a);
        let again = take_inbox(false);
        assert_eq!(again.as_ptr(), ptr);
        drop(again);
        give_inbox(vec![0; 8]);
        assert_eq!(free_counts().0, 0);
        for _ in 0..MAX_FREE_LARGE + 3 {
            give_inbox(vec![0; LARGE_INBOX]);
        }
        assert_eq!(free_counts().1, MAX_FREE_LARGE);
        assert_eq!(take_inbox(true).len(), LARGE_INBOX);

        let mut s = take_staging();
        s.extend_from_slice(b"header");
        give_staging(s);
        let s = take_staging();
        assert!(s.is_empty());
        assert_eq!(s.capacity(), STAGING_CAPACITY);
    }
}
