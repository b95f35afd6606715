//! The block chain of a group: reserving room in the tail block, writing and
//! linking blocks (foreign ones included), trimming the head past the retain
//! limit, the furthest read position, and the pacing limit readers report.

use super::{State, Status, WriteError};
use crate::pool::{Block, BlockMut};

impl<'p> State<'p> {
    pub(super) fn release_chain(&self) {
        // Dropping the head frees the chain iteratively (pool::Pool::release).
        drop(self.tail.take());
        drop(self.head.take());
    }

    /// Releases the head once the group is past its retain limit and no
    /// consumer still waits to anchor its start. O(1) plus the blocks freed.
    pub(super) fn trim_if_due(&self) {
        if self.trimmed.get()
            || self.unanchored.get() > 0
            || self.written.get() <= self.retain.get()
            || !matches!(self.status.get(), Status::Open | Status::Finished)
        {
            return;
        }
        if let Some(head) = self.head.take() {
            trace!(
                "group {} trimmed at {} bytes",
                self.sequence.get(),
                self.written.get()
            );
            self.trimmed.set(true);
            // Frees every block no consumer holds, up to the tail (iteratively).
            drop(head);
        }
    }

    /// A consumer of generation `generation` that waited for the head took it
    /// or went away.
    pub(super) fn anchored(&self, generation: u64) {
        if generation != self.generation.get() {
            return;
        }
        self.unanchored.set(self.unanchored.get().saturating_sub(1));
        self.trim_if_due();
    }

    pub(super) fn wake_producer(&self) {
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }

    pub(super) fn head(&self) -> Option<Block<'p>> {
        let head = self.head.take();
        let out = head.clone();
        self.head.set(head);
        out
    }

    fn tail_spare(&self) -> usize {
        let tail = self.tail.take();
        let n = tail.as_ref().map_or(0, BlockMut::spare_len);
        self.tail.set(tail);
        n
    }

    /// Refuses `n` more bytes over the configured maximum.
    pub(super) fn check_room(&self, n: u64) -> Result<(), WriteError> {
        match self.written.get().checked_add(n) {
            Some(total) if total <= self.max_bytes.get() => Ok(()),
            _ => Err(WriteError::GroupTooLarge),
        }
    }

    /// Makes sure `n` bytes can be appended without running out of blocks.
    pub(super) fn reserve(&self, n: u64) -> Result<(), WriteError> {
        let spare = self.tail_spare() as u64;
        if n <= spare {
            return Ok(());
        }
        let blocks = (n - spare).div_ceil(self.pool.block_size() as u64);
        let blocks = usize::try_from(blocks).unwrap_or(usize::MAX);
        self.pool
            .try_reserve(blocks)
            .map_err(|_| WriteError::PoolExhausted)
    }

    /// Appends as much of `data` as the pool allows, growing the chain; returns the count.
    pub(super) fn write_bytes(&self, data: &[u8]) -> usize {
        let mut tail = self.tail.take();
        let mut done = 0;
        while done < data.len() {
            if let Some(t) = tail.as_mut().filter(|t| t.spare_len() > 0) {
                done += t.append(&data[done..]);
                continue;
            }
            let Ok(block) = self.pool.alloc() else {
                break;
            };
            self.link_after(&mut tail, block);
        }
        self.tail.set(tail);
        self.written.set(self.written.get() + done as u64);
        self.trim_if_due();
        done
    }

    /// Links `block` (fresh from this pool) after the chain's `tail` and makes
    /// it the tail (the head, if the chain was empty).
    fn link_after(&self, tail: &mut Option<BlockMut<'p>>, block: BlockMut<'p>) {
        match tail.as_mut() {
            Some(old) => {
                // Cannot fail: same pool, `old` is the chain's tail (no
                // successor) and `block` is fresh.
                let linked = old.link(block.as_block());
                debug_assert!(linked.is_ok());
            }
            None => self.head.set(Some(block.share())),
        }
        *tail = Some(block);
    }

    /// Appends bytes `start..end` of the foreign block `src` without a copy:
    /// the tail grows if it is a piece ending just before them, else a new
    /// piece is linked after it. False (nothing written) if no metadata slot
    /// is free or `src` is not a foreign block of this pool.
    pub(super) fn append_foreign(&self, src: &Block<'p>, start: usize, end: usize) -> bool {
        let mut tail = self.tail.take();
        let grown = tail.as_mut().is_some_and(|t| t.grow_piece(src, start, end));
        if !grown {
            let piece = match src.piece(start, end) {
                Ok(p) if core::ptr::eq(src.pool(), self.pool) => p,
                _ => {
                    self.tail.set(tail);
                    return false;
                }
            };
            self.link_after(&mut tail, piece);
        }
        self.patched.set(true);
        self.tail.set(tail);
        self.written.set(self.written.get() + (end - start) as u64);
        self.trim_if_due();
        true
    }

    /// A consumer of generation `generation` reached `pos`.
    pub(super) fn note_read(&self, generation: u64, pos: u64) {
        if generation != self.generation.get() || pos <= self.furthest_read.get() {
            return;
        }
        self.furthest_read.set(pos);
    }

    /// A paced reader of generation `generation` accepts up to `limit`: raises
    /// the pacing limit to it and wakes a parked producer that may write again.
    pub(super) fn raise_pace_limit(&self, generation: u64, limit: u64) {
        if generation != self.generation.get() {
            return;
        }
        if self.pace_limit.get().is_some_and(|l| l >= limit) {
            return;
        }
        self.pace_limit.set(Some(limit));
        if self.allowance() > 0 {
            self.wake_producer();
        }
    }

    /// A paced reader of generation `generation` went away; with the last one
    /// the producer is no longer paced (and is woken if it waits).
    pub(super) fn drop_paced_reader(&self, generation: u64) {
        if generation != self.generation.get() {
            return;
        }
        let left = self.paced_readers.get().saturating_sub(1);
        self.paced_readers.set(left);
        if left == 0 {
            self.pace_limit.set(None);
            self.wake_producer();
        }
    }
}
