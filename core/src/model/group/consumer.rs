//! [`Consumer`]: one reader of a group at its own position.

use core::fmt;

use super::{Next, ReadError, State, Status};
use crate::model::frame::{Header, MAX_HEADER_LEN};
use crate::pool::{Block, Slice};
use crate::wire::{DecodeError, Reader};

/// One reader of a group, with its own position (from [`State::consumer`]).
///
/// Use one of two styles:
/// * raw wire bytes (a relay): [`Consumer::chunk`] (or [`Consumer::chunk_slice`])
///   then [`Consumer::advance`] by what was sent;
/// * frames (a viewer): [`Consumer::read_frame_header`], then
///   [`Consumer::payload_chunk`] + [`Consumer::advance`] or
///   [`Consumer::read_payload`]. Unread payload is skipped by the next
///   `read_frame_header`.
///
/// A consumer holds the block at its position from its creation on (see the
/// module docs on trimming), so a consumer that is never read keeps the group's
/// bytes from its position on alive: drop consumers you do not read.
///
/// Cloning gives an independent reader at the same position.
pub struct Consumer<'a, 'p> {
    pub(super) state: &'a State<'p>,
    pub(super) generation: u64,
    pub(super) sequence: u64,
    /// The block holding `pos` (None before the first block exists, after a
    /// read error, or when created on a trimmed group).
    pub(super) block: Option<Block<'p>>,
    /// Created before the group had a block; counted in `State::unanchored`
    /// until it takes the head.
    pub(super) waiting: bool,
    /// Created after the group was trimmed: it cannot start at byte 0.
    pub(super) trimmed: bool,
    pub(super) offset: usize,
    pub(super) pos: u64,
    /// Where the current frame's payload ends (= where the next FRAME header starts).
    pub(super) frame_end: u64,
    /// Timestamp of the last frame header read (0 before the first).
    pub(super) timestamp: u64,
    /// Counted in `State::paced_readers` (it reported a window).
    pub(super) paced: bool,
}

impl<'a, 'p> Consumer<'a, 'p> {
    /// The group sequence number this consumer reads.
    pub fn sequence(&self) -> u64 {
        self.sequence
    }

    /// True once the group's producer paces itself, so this reader should
    /// report its window with [`Consumer::pace`].
    pub fn pace_wanted(&self) -> bool {
        self.state.pace_wanted.get()
    }

    /// Reports how many more bytes this reader's transport takes now (its send
    /// credit; capped at [`crate::pacing::AHEAD`]): the producer may write up
    /// to this reader's position plus that window, or further if another
    /// reader's reaches further. From the first report until this consumer
    /// drops, it counts as a paced reader (see the module docs on pacing).
    pub fn pace(&mut self, credit: u64) {
        if self.generation != self.state.generation.get() {
            return;
        }
        if !self.paced {
            self.paced = true;
            self.state
                .paced_readers
                .set(self.state.paced_readers.get() + 1);
        }
        let window = crate::pacing::window(Some(credit), None);
        self.state
            .raise_pace_limit(self.generation, self.pos.saturating_add(window));
    }

    /// Bytes read (advanced over) so far.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Payload bytes of the current frame not read yet.
    pub fn payload_remaining(&self) -> u64 {
        self.frame_end.saturating_sub(self.pos)
    }

    /// True if the group is whole: its producer finished it and the slot
    /// still holds it (every byte is there to read, and its end is known).
    pub fn is_finished(&self) -> bool {
        self.state.generation.get() == self.generation
            && self.state.status.get() == Status::Finished
    }

    /// True if this consumer was created after its group was trimmed: it
    /// cannot read from byte 0 and its reads return [`ReadError::Trimmed`].
    pub fn is_trimmed(&self) -> bool {
        self.trimmed
    }

    fn check(&mut self) -> Result<(), ReadError> {
        let s = self.state;
        let err = if s.generation.get() != self.generation {
            ReadError::Evicted
        } else {
            match s.status.get() {
                Status::Open | Status::Finished if self.trimmed => ReadError::Trimmed,
                Status::Open | Status::Finished => return Ok(()),
                Status::Aborted(code) => ReadError::Aborted(code),
                Status::Idle => ReadError::Evicted,
            }
        };
        self.block = None;
        Err(err)
    }

    /// What to report when no committed byte is left to read.
    fn end<T>(&self) -> Next<T> {
        if self.state.status.get() == Status::Finished && self.pos >= self.state.written.get() {
            Next::Finished
        } else {
            Next::Pending
        }
    }

    /// Moves `block`/`offset` onto an unread committed byte; false if there is none yet.
    fn settle(&mut self) -> bool {
        loop {
            match &self.block {
                // Only a consumer created on an empty group gets here with no
                // block (`check` stops the others); trimming waited for it,
                // so the head is still there once written.
                None if self.waiting => match self.state.head() {
                    Some(head) => {
                        self.block = Some(head);
                        self.offset = 0;
                        self.waiting = false;
                        self.state.anchored(self.generation);
                    }
                    None => return false,
                },
                None => return false,
                Some(b) => {
                    if self.offset < b.len() {
                        return true;
                    }
                    match b.next() {
                        Some(next) => {
                            self.block = Some(next);
                            self.offset = 0;
                        }
                        None => return false,
                    }
                }
            }
        }
    }

    /// The next contiguous committed bytes (up to a block boundary), without consuming them.
    ///
    /// # Errors
    /// [`ReadError::Aborted`] (forward the code as a reset) or [`ReadError::Evicted`].
    pub fn chunk(&mut self) -> Result<Next<&[u8]>, ReadError> {
        self.check()?;
        if !self.settle() {
            return Ok(self.end());
        }
        match &self.block {
            Some(b) => Ok(Next::Ready(b.data().get(self.offset..).unwrap_or(&[]))),
            None => Ok(self.end()),
        }
    }

    /// Like [`Consumer::chunk`], but as a [`Slice`] that owns a block reference and
    /// outlives this borrow (hand it to an asynchronous send, then [`Consumer::advance`]).
    ///
    /// # Errors
    /// As [`Consumer::chunk`].
    pub fn chunk_slice(&mut self) -> Result<Next<Slice<'p>>, ReadError> {
        self.check()?;
        if !self.settle() {
            return Ok(self.end());
        }
        let slice = self.block.as_ref().and_then(|b| {
            let end = b.len();
            b.clone().slice(self.offset, end)
        });
        Ok(slice.map_or_else(|| self.end(), Next::Ready))
    }

    /// Committed bytes readable now from the current position in at most
    /// `chunks` contiguous pieces, the first being the last chunk returned
    /// (every block but the chain's tail is full).
    pub fn readable_within(&self, chunks: usize) -> usize {
        let Some(b) = &self.block else {
            return 0;
        };
        let unread = usize::try_from(self.state.written.get().saturating_sub(self.pos))
            .unwrap_or(usize::MAX);
        let first = b.len().saturating_sub(self.offset);
        if !self.state.patched.get() {
            let rest = chunks
                .saturating_sub(1)
                .saturating_mul(self.state.pool.block_size());
            return unread.min(first.saturating_add(rest));
        }
        // Blocks before the tail may be short: count them one by one.
        let mut total = first;
        let mut cur = b.next();
        for _ in 1..chunks {
            let Some(block) = cur.take().filter(|_| total < unread) else {
                break;
            };
            total += block.len();
            cur = block.next();
        }
        unread.min(total)
    }

    /// Consumes `n` bytes of the last chunk.
    ///
    /// # Panics
    /// If `n` exceeds the bytes of the last chunk returned (a caller bug).
    pub fn advance(&mut self, n: usize) {
        if n == 0 {
            return;
        }
        let avail = self.block.as_ref().map_or(0, |b| b.len() - self.offset);
        assert!(n <= avail, "advance past the last chunk");
        self.offset += n;
        self.pos += n as u64;
        self.state.note_read(self.generation, self.pos);
    }

    /// Copies committed bytes into `out` and consumes them; `Ready(n)` with `n > 0`
    /// unless nothing is available.
    ///
    /// # Errors
    /// As [`Consumer::chunk`].
    pub fn read(&mut self, out: &mut [u8]) -> Result<Next<usize>, ReadError> {
        self.copy_out(out, false)
    }

    /// Reads the next FRAME header (skipping any unread payload of the current
    /// frame), even if it spans blocks; returns the absolute timestamp and length.
    ///
    /// `Pending` while the header (or the payload being skipped) is not written
    /// yet; `Finished` after the last frame.
    ///
    /// # Errors
    /// As [`Consumer::chunk`], and [`ReadError::Misaligned`] if raw advances
    /// moved this consumer past the frame it was tracking.
    pub fn read_frame_header(&mut self) -> Result<Next<Header>, ReadError> {
        self.check()?;
        while self.pos < self.frame_end {
            if !self.settle() {
                return Ok(self.end());
            }
            let avail = self.block.as_ref().map_or(0, |b| b.len() - self.offset);
            let skip = (avail as u64).min(self.frame_end - self.pos);
            self.advance(skip as usize);
        }
        if self.pos > self.frame_end {
            return Err(ReadError::Misaligned);
        }
        let mut buf = [0u8; MAX_HEADER_LEN];
        let n = self.peek(&mut buf);
        if n == 0 {
            return Ok(self.end());
        }
        let mut r = Reader::new(&buf[..n]);
        // docs/protocol.md §3.9: the delta is from the previous frame's timestamp (first: from 0).
        match Header::decode(&mut r, self.timestamp, usize::MAX) {
            Ok(header) => {
                self.skip(r.position());
                self.timestamp = header.timestamp;
                self.frame_end = self.pos + header.len as u64;
                Ok(Next::Ready(header))
            }
            // The producer writes a header all at once; a partial one means the
            // rest is still to come.
            Err(DecodeError::Incomplete) => Ok(Next::Pending),
            Err(_) => Err(ReadError::Misaligned),
        }
    }

    /// The next contiguous committed bytes of the current frame's payload;
    /// `Finished` once the payload has been read to its end.
    ///
    /// # Errors
    /// As [`Consumer::chunk`].
    pub fn payload_chunk(&mut self) -> Result<Next<&[u8]>, ReadError> {
        let left = self.payload_remaining();
        if left == 0 {
            self.check()?;
            return Ok(Next::Finished);
        }
        Ok(self.chunk()?.map(|c| {
            let n = (c.len() as u64).min(left) as usize;
            &c[..n]
        }))
    }

    /// Copies payload bytes of the current frame into `out` and consumes them;
    /// `Finished` once the payload has been read to its end.
    ///
    /// # Errors
    /// As [`Consumer::chunk`].
    pub fn read_payload(&mut self, out: &mut [u8]) -> Result<Next<usize>, ReadError> {
        self.copy_out(out, true)
    }

    fn copy_out(&mut self, out: &mut [u8], payload: bool) -> Result<Next<usize>, ReadError> {
        let mut n = 0;
        while n < out.len() {
            let next = if payload {
                self.payload_chunk()?
            } else {
                self.chunk()?
            };
            let k = match next {
                Next::Ready(c) => {
                    let k = c.len().min(out.len() - n);
                    out[n..n + k].copy_from_slice(&c[..k]);
                    k
                }
                Next::Pending | Next::Finished if n > 0 => break,
                Next::Pending => return Ok(Next::Pending),
                Next::Finished => return Ok(Next::Finished),
            };
            self.advance(k);
            n += k;
        }
        Ok(Next::Ready(n))
    }

    /// Copies up to `buf.len()` committed bytes from the current position, across blocks.
    fn peek(&mut self, buf: &mut [u8]) -> usize {
        if !self.settle() {
            return 0;
        }
        let mut n = 0;
        let mut offset = self.offset;
        let mut cur = self.block.clone();
        while let Some(b) = cur {
            let src = b.data().get(offset..).unwrap_or(&[]);
            let k = src.len().min(buf.len() - n);
            buf[n..n + k].copy_from_slice(&src[..k]);
            n += k;
            if n == buf.len() {
                break;
            }
            cur = b.next();
            offset = 0;
        }
        n
    }

    /// Consumes `n` committed bytes that [`Consumer::peek`] saw, across blocks.
    fn skip(&mut self, mut n: usize) {
        while n > 0 && self.settle() {
            let avail = self.block.as_ref().map_or(0, |b| b.len() - self.offset);
            let k = avail.min(n);
            self.advance(k);
            n -= k;
        }
    }
}

impl Clone for Consumer<'_, '_> {
    fn clone(&self) -> Self {
        if self.waiting && self.generation == self.state.generation.get() {
            self.state.unanchored.set(self.state.unanchored.get() + 1);
        }
        Consumer {
            state: self.state,
            generation: self.generation,
            sequence: self.sequence,
            block: self.block.clone(),
            waiting: self.waiting,
            trimmed: self.trimmed,
            offset: self.offset,
            pos: self.pos,
            frame_end: self.frame_end,
            timestamp: self.timestamp,
            // A copy reports its own window, if ever.
            paced: false,
        }
    }
}

impl Drop for Consumer<'_, '_> {
    fn drop(&mut self) {
        if self.waiting {
            self.state.anchored(self.generation);
        }
        if self.paced {
            self.state.drop_paced_reader(self.generation);
        }
    }
}

impl fmt::Debug for Consumer<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Consumer")
            .field("sequence", &self.sequence)
            .field("generation", &self.generation)
            .field("pos", &self.pos)
            .field("frame_end", &self.frame_end)
            .finish_non_exhaustive()
    }
}
