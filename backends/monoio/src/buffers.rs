//! Per-thread pools of the large buffers a connection needs only while bytes
//! pass through it: inbox buffers (received bytes the session has not taken
//! yet) and staging buffers (bytes on their way to the socket).
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

/// Received bytes the reader stops at: an inbox buffer holds this many plus
/// one whole read ([`INBOX_READ`]).
pub const INBOX_BYTES: usize = 256 * 1024;

/// Most bytes one read into an inbox asks for (the room kept free after the
/// bytes waiting, at least one whole QMux record).
pub const INBOX_READ: usize = 64 * 1024;

/// Capacity of a staging buffer. Only what a pass stages is ever written
/// (its bytes are initialized as they are first used), so a buffer that
/// carried record headers only is a few KiB of memory in use.
pub const STAGING_CAPACITY: usize = 64 * 1024;

/// Free inbox buffers a thread keeps (each `INBOX_BYTES + INBOX_READ`; the
/// pages no read reached are never touched, so mostly address space).
const MAX_FREE_INBOXES: usize = 64;

/// Free staging buffers a thread keeps.
const MAX_FREE_STAGINGS: usize = 1024;

thread_local! {
    static INBOXES: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
    static STAGINGS: RefCell<Vec<Staging>> = const { RefCell::new(Vec::new()) };
}

/// An inbox buffer of `INBOX_BYTES + INBOX_READ` bytes (zeroed once, when
/// first made), reused if one is free.
pub fn take_inbox() -> Vec<u8> {
    INBOXES
        .with(|p| p.borrow_mut().pop())
        .unwrap_or_else(|| vec![0; INBOX_BYTES + INBOX_READ])
}

/// Gives an inbox buffer back (dropped if the pool is full or it is not one).
pub fn give_inbox(buf: Vec<u8>) {
    if buf.len() != INBOX_BYTES + INBOX_READ {
        return;
    }
    INBOXES.with(|p| {
        let mut free = p.borrow_mut();
        if free.len() < MAX_FREE_INBOXES {
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

/// Free buffers of this thread's pools: (inboxes, stagings).
pub fn free_counts() -> (usize, usize) {
    (
        INBOXES.with(|p| p.borrow().len()),
        STAGINGS.with(|p| p.borrow().len()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_reused_and_the_pools_are_bounded() {
        let a = take_inbox();
        let ptr = a.as_ptr();
        give_inbox(a);
        let again = take_inbox();
        assert_eq!(again.as_ptr(), ptr);
        drop(again);
        give_inbox(vec![0; 8]);
        assert_eq!(free_counts().0, 0);
        for _ in 0..MAX_FREE_INBOXES + 3 {
            give_inbox(vec![0; INBOX_BYTES + INBOX_READ]);
        }
        assert_eq!(free_counts().0, MAX_FREE_INBOXES);

        let mut s = take_staging();
        s.extend_from_slice(b"header");
        give_staging(s);
        let s = take_staging();
        assert!(s.is_empty());
        assert_eq!(s.capacity(), STAGING_CAPACITY);
    }
}
