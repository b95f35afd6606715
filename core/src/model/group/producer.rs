//! [`Producer`]: the one writer of a group.

use core::fmt;
use core::task::{Context, Poll};

use super::{ABORT_DROPPED, State, Status, WriteError};
use crate::model::frame::{Header, MAX_HEADER_LEN};
use crate::pool::Block;
use crate::wire::Writer;

/// The one writer of a group (from [`State::producer`]).
///
/// Dropping it before [`Producer::finish`] aborts the group with [`ABORT_DROPPED`].
pub struct Producer<'a, 'p> {
    pub(super) state: &'a State<'p>,
    pub(super) generation: u64,
    /// Payload bytes the streamed frame still needs.
    pub(super) frame_left: usize,
}

impl<'a, 'p> Producer<'a, 'p> {
    /// The shared state this producer writes.
    pub fn state(&self) -> &'a State<'p> {
        self.state
    }

    /// The group sequence number.
    pub fn sequence(&self) -> u64 {
        self.state.sequence()
    }

    /// Payload bytes the streamed frame still needs (0 outside a streamed frame).
    pub fn frame_remaining(&self) -> usize {
        self.frame_left
    }

    fn check(&self) -> Result<(), WriteError> {
        if self.state.generation.get() != self.generation {
            return Err(WriteError::Evicted);
        }
        match self.state.status.get() {
            Status::Open => Ok(()),
            Status::Finished => Err(WriteError::Finished),
            Status::Aborted(code) => Err(WriteError::Aborted(code)),
            Status::Idle => Err(WriteError::Evicted),
        }
    }

    /// Encodes the FRAME header for `timestamp`/`len` after the previous frame.
    fn header(
        &self,
        timestamp: u64,
        len: usize,
    ) -> Result<([u8; MAX_HEADER_LEN], usize), WriteError> {
        let mut buf = [0u8; MAX_HEADER_LEN];
        let mut w = Writer::new(&mut buf);
        // docs/protocol.md §3.9: the delta is from the previous frame of this group (first: from 0).
        let n = Header::new(timestamp, len)
            .encode(self.state.last_timestamp.get(), &mut w)
            .map_err(|_| WriteError::TimestampRange)?;
        Ok((buf, n))
    }

    fn begun(&self, timestamp: u64) {
        self.state.frames.set(self.state.frames.get() + 1);
        self.state.last_timestamp.set(timestamp);
    }

    /// Appends one whole frame at absolute `timestamp`, all or nothing.
    ///
    /// # Errors
    /// [`WriteError::PoolExhausted`] if the pool lacks the blocks it needs,
    /// [`WriteError::GroupTooLarge`] over the group's maximum,
    /// [`WriteError::InFrame`] while a streamed frame is incomplete,
    /// [`WriteError::TimestampRange`], or the group's state
    /// ([`WriteError::Finished`], [`WriteError::Aborted`], [`WriteError::Evicted`]).
    /// Nothing is written on error.
    pub fn write_frame(&mut self, timestamp: u64, payload: &[u8]) -> Result<(), WriteError> {
        self.check()?;
        if self.frame_left > 0 {
            return Err(WriteError::InFrame);
        }
        let (header, n) = self.header(timestamp, payload.len())?;
        let total = n as u64 + payload.len() as u64;
        self.state.check_room(total)?;
        self.state.reserve(total)?;
        let written = self.state.write_bytes(&header[..n]) + self.state.write_bytes(payload);
        debug_assert_eq!(written as u64, total);
        self.begun(timestamp);
        Ok(())
    }

    /// Starts a frame of `len` payload bytes at absolute `timestamp`, to be
    /// filled by [`Producer::write_payload`] (a relay receiving a large frame in pieces).
    ///
    /// The header is written all or nothing; the whole frame must fit the
    /// group's maximum. Readers see the payload as it arrives. A frame with
    /// `len == 0` is complete at once.
    ///
    /// # Errors
    /// As [`Producer::write_frame`]; nothing is written on error.
    pub fn begin_frame(&mut self, timestamp: u64, len: usize) -> Result<(), WriteError> {
        self.check()?;
        if self.frame_left > 0 {
            return Err(WriteError::InFrame);
        }
        let (header, n) = self.header(timestamp, len)?;
        self.state.check_room(n as u64 + len as u64)?;
        self.state.reserve(n as u64)?;
        let written = self.state.write_bytes(&header[..n]);
        debug_assert_eq!(written, n);
        self.begun(timestamp);
        self.frame_left = len;
        Ok(())
    }

    /// Appends payload bytes of the streamed frame; returns how many were taken,
    /// which is fewer than `data.len()` when the pool runs dry.
    ///
    /// # Errors
    /// [`WriteError::PoolExhausted`] if not one byte could be stored,
    /// [`WriteError::NoFrame`] outside a streamed frame,
    /// [`WriteError::PayloadOverrun`] if `data` is longer than the frame's
    /// remaining payload (nothing written), or the group's state.
    pub fn write_payload(&mut self, data: &[u8]) -> Result<usize, WriteError> {
        self.check()?;
        if self.frame_left == 0 {
            return Err(WriteError::NoFrame);
        }
        if data.len() > self.frame_left {
            return Err(WriteError::PayloadOverrun);
        }
        let n = self.state.write_bytes(data);
        if n == 0 && !data.is_empty() {
            return Err(WriteError::PoolExhausted);
        }
        self.frame_left -= n;
        Ok(n)
    }

    /// Appends payload of the streamed frame that already lies in memory:
    /// bytes `start..end` of the foreign block `src` (see
    /// [`crate::pool::Pool::adopt`]) join the chain without a copy; returns
    /// their count.
    ///
    /// # Errors
    /// [`WriteError::NoFrame`] outside a streamed frame,
    /// [`WriteError::PayloadOverrun`] if the range is longer than the frame's
    /// remaining payload, [`WriteError::PoolExhausted`] if no metadata slot is
    /// free or `src` is not a foreign block of this group's pool (nothing
    /// written in these cases), or the group's state.
    pub fn write_payload_from(
        &mut self,
        src: &Block<'p>,
        start: usize,
        end: usize,
    ) -> Result<usize, WriteError> {
        self.check()?;
        if self.frame_left == 0 {
            return Err(WriteError::NoFrame);
        }
        let n = end.saturating_sub(start);
        if n > self.frame_left {
            return Err(WriteError::PayloadOverrun);
        }
        if n > 0 && !self.state.append_foreign(src, start, end) {
            return Err(WriteError::PoolExhausted);
        }
        self.frame_left -= n;
        Ok(n)
    }

    /// Like [`Producer::begin_frame`], taking the FRAME header from bytes
    /// `start..end` of the foreign block `src` without a copy when they are
    /// exactly the header this call would write (else it writes its own).
    ///
    /// # Errors
    /// As [`Producer::begin_frame`].
    pub fn begin_frame_from(
        &mut self,
        timestamp: u64,
        len: usize,
        src: &Block<'p>,
        start: usize,
        end: usize,
    ) -> Result<(), WriteError> {
        self.check()?;
        if self.frame_left > 0 {
            return Err(WriteError::InFrame);
        }
        let (header, n) = self.header(timestamp, len)?;
        let same = src.data().get(start..end) == header.get(..n);
        if !same {
            return self.begin_frame(timestamp, len);
        }
        self.state.check_room(n as u64 + len as u64)?;
        if !self.state.append_foreign(src, start, end) {
            return Err(WriteError::PoolExhausted);
        }
        self.begun(timestamp);
        self.frame_left = len;
        Ok(())
    }

    /// Ends the group on a frame boundary (FIN): consumers reading to the end get [`Next::Finished`](super::Next::Finished).
    ///
    /// # Errors
    /// [`WriteError::InFrame`] while a streamed frame is incomplete (the group
    /// stays open), or the group's state.
    pub fn finish(&mut self) -> Result<(), WriteError> {
        self.check()?;
        if self.frame_left > 0 {
            return Err(WriteError::InFrame);
        }
        self.state.status.set(Status::Finished);
        drop(self.state.tail.take());
        drop(self.state.waker.take());
        Ok(())
    }

    /// Abandons the group with stream error `code` (RESET_STREAM); no-op unless it is open.
    pub fn abort(&mut self, code: u64) {
        if self.check().is_ok() {
            self.state.abort(code);
        }
    }

    /// Ready while the producer is less than a window ahead of its fastest
    /// reader (the readers' transports take what it writes next), or while no
    /// reader paces it; otherwise parks the task's waker (one slot: the latest
    /// caller's) and returns `Pending` until a reader reports a larger window
    /// or the last paced reader goes away (see the module docs on pacing).
    ///
    /// Also ready once the group is no longer open or the slot was reused, so
    /// the caller's next write reports why. The first call asks the group's
    /// readers to report their windows.
    #[must_use = "Pending means: do not write until woken"]
    pub fn poll_paced(&self, cx: &mut Context<'_>) -> Poll<()> {
        self.state.pace_wanted.set(true);
        if self.check().is_err() || self.state.allowance() > 0 {
            return Poll::Ready(());
        }
        let parked = match self.state.waker.take() {
            Some(w) if w.will_wake(cx.waker()) => w,
            _ => cx.waker().clone(),
        };
        self.state.waker.set(Some(parked));
        Poll::Pending
    }

    /// How many more bytes the producer may write before it is a window ahead
    /// of its fastest reader (`u64::MAX` while no reader paces it), for a
    /// writer that writes partial payloads; like [`Producer::poll_paced`], it
    /// asks the readers to report their windows.
    pub fn allowance(&self) -> u64 {
        self.state.pace_wanted.set(true);
        self.state.allowance()
    }
}

impl Drop for Producer<'_, '_> {
    fn drop(&mut self) {
        if self.state.generation.get() != self.generation {
            return;
        }
        self.state.has_producer.set(false);
        drop(self.state.waker.take());
        if self.state.is_open() {
            self.state.abort(ABORT_DROPPED);
        }
    }
}

impl fmt::Debug for Producer<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Producer")
            .field("sequence", &self.state.sequence())
            .field("generation", &self.generation)
            .field("frame_left", &self.frame_left)
            .finish()
    }
}
