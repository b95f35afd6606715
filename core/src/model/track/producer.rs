//! The writers of a track: its one [`Producer`], and a [`GroupProducer`] per
//! group it creates.

use core::fmt;
use core::ops::Deref;

use super::{CreateError, Ref, Slot, Status};
use crate::model::frame::Header;
use crate::model::group;
use crate::pool::Block;

/// The one writer of a track (from [`Ref::producer`]).
///
/// Dropping it while the track is open aborts the track with
/// [`group::ABORT_DROPPED`] (CANCEL); [`Producer::finish`] first for a clean
/// end. In failover mode ([`Ref::set_failover`]) the drop only aborts the open
/// groups and detaches the producer; the track stays open for the next one.
pub struct Producer<'t, 'p> {
    pub(super) track: Ref<'t, 'p>,
    pub(super) epoch: u64,
    /// Which producer of the track this is (`Core::producer_id`).
    pub(super) id: u64,
}

impl<'t, 'p> Producer<'t, 'p> {
    /// The track this producer writes.
    pub fn track(&self) -> Ref<'t, 'p> {
        self.track
    }

    /// Starts group `sequence`, in any order (a relay receives groups newest first).
    ///
    /// A newer group than the latest always gets a slot (the oldest group is
    /// evicted if the ring is full). An older one gets a free slot, or the
    /// slot of an even older group. Both may evict old groups over the byte budget.
    /// In failover mode ([`Ref::set_failover`]) a held group that was aborted
    /// (e.g. cut off by the loss of the previous producer) may be created
    /// again: it takes that group's slot, whose old readers then get
    /// [`group::ReadError::Evicted`].
    ///
    /// # Errors
    /// [`CreateError::Duplicate`] if `sequence` is held (and not an aborted
    /// group in failover mode);
    /// [`CreateError::TooOld`] if it is older than every group held and the
    /// ring is full, or already past the publisher max age;
    /// [`CreateError::Finished`] / [`CreateError::Aborted`] / [`CreateError::Stale`]
    /// for the track's state. Nothing changes on error.
    pub fn create_group(&self, sequence: u64) -> Result<GroupProducer<'t, 'p>, CreateError> {
        if !self.is_current() {
            return Err(CreateError::Stale);
        }
        self.track.create(self.epoch, sequence)
    }

    /// Starts the group after the latest one (group 0 on an empty track).
    ///
    /// # Errors
    /// As [`Producer::create_group`], and [`CreateError::SequenceOverflow`]
    /// after group `u64::MAX`.
    pub fn append_group(&self) -> Result<GroupProducer<'t, 'p>, CreateError> {
        let seq = match self.track.core.latest.get() {
            None => 0,
            Some(l) => l.checked_add(1).ok_or(CreateError::SequenceOverflow)?,
        };
        self.create_group(seq)
    }

    /// Ends the track: no group will be created any more (SUBSCRIBE_END is the
    /// latest group + 1); groups still open can be completed. False if it was
    /// not open or this producer is stale.
    pub fn finish(&mut self) -> bool {
        self.is_current() && self.track.finish()
    }

    /// Abandons the track with stream error `code`, aborting its open groups;
    /// readers get [`ReadError::Aborted`](super::ReadError::Aborted). False if already aborted or this
    /// producer is stale.
    ///
    /// In failover mode ([`Ref::set_failover`]) the track is not ended: the
    /// open groups are aborted with `code` (their readers get
    /// [`group::ReadError::Aborted`]), this producer is detached (stale from
    /// now on: its calls fail with [`CreateError::Stale`] or return false) and
    /// the track keeps its status, so [`Ref::producer`] can continue it.
    pub fn abort(&mut self, code: u64) -> bool {
        if !self.is_current() {
            return false;
        }
        if self.track.core.failover.get() {
            self.track.detach(code)
        } else {
            self.track.abort(code)
        }
    }

    /// Whether this producer still writes the track: not stale after
    /// [`Ref::reopen`] and not detached in failover mode.
    pub fn is_current(&self) -> bool {
        let c = self.track.core;
        c.epoch.get() == self.epoch && c.producer_id.get() == self.id
    }
}

impl Drop for Producer<'_, '_> {
    fn drop(&mut self) {
        if !self.is_current() {
            return;
        }
        self.track.core.has_producer.set(false);
        if self.track.status() == Status::Open {
            if self.track.core.failover.get() {
                self.track.detach(group::ABORT_DROPPED);
            } else {
                self.track.abort(group::ABORT_DROPPED);
            }
        }
    }
}

impl fmt::Debug for Producer<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("track::Producer")
            .field("track", &self.track)
            .field("epoch", &self.epoch)
            .finish()
    }
}

/// The writer of one group of a track (from [`Producer::create_group`]).
///
/// A [`group::Producer`] that also keeps the track's books: every write bumps
/// the track version and wakes its readers (payload of a streamed frame may be
/// announced in steps, see [`GroupProducer::set_announce_step`]), evicts old
/// groups over the byte budget before writing, and drops groups past the
/// publisher max age after.
/// Derefs to the [`group::Producer`] for its read-only methods and pacing.
/// Dropping it before [`GroupProducer::finish`] aborts the group with
/// [`group::ABORT_DROPPED`].
pub struct GroupProducer<'t, 'p> {
    pub(super) inner: group::Producer<'t, 'p>,
    pub(super) track: Ref<'t, 'p>,
    pub(super) slot: &'t Slot<'p>,
    pub(super) generation: u64,
    /// Bytes of the streamed frame (header and payload) written since the
    /// last version bump.
    pub(super) unannounced: u64,
    /// Bump the version once this many payload bytes are unannounced (0: every write).
    pub(super) announce_step: u64,
}

impl<'t, 'p> GroupProducer<'t, 'p> {
    /// The track this group belongs to.
    pub fn track(&self) -> Ref<'t, 'p> {
        self.track
    }

    fn is_current(&self) -> bool {
        self.slot.group.generation() == self.generation
    }

    /// Bytes `n` more stored bytes add to the group's held footprint (whole
    /// blocks; a group that is or will then be trimmed holds its tail only).
    fn growth(&self, n: u64) -> u64 {
        let g = &self.slot.group;
        let bs = g.pool().block_size() as u64;
        let now = g.bytes_written();
        let after = now.saturating_add(n);
        if g.is_trimmed() || after > g.retain() {
            return bs.saturating_sub(self.slot.bytes());
        }
        after.div_ceil(bs).saturating_sub(now.div_ceil(bs)) * bs
    }

    fn before_write(&self, n: u64) {
        if self.is_current() && self.track.make_room(self.growth(n), Some(self.slot)) {
            self.track.changed();
        }
    }

    /// Books a frame's start; bumps the version unless `announce` is false
    /// (and nothing expired): a streamed frame's start is then announced
    /// with its payload.
    fn after_frame(&self, timestamp: u64, first: bool, announce: bool) {
        if first {
            self.slot.begin.set(Some(timestamp));
        }
        if self.track.expire() || announce {
            self.track.changed();
        }
    }

    /// Appends one whole frame at absolute `timestamp`, all or nothing (see
    /// [`group::Producer::write_frame`]).
    ///
    /// # Errors
    /// As [`group::Producer::write_frame`]; [`group::WriteError::Evicted`] if
    /// the group itself was the oldest one evicted to make room.
    pub fn write_frame(&mut self, timestamp: u64, payload: &[u8]) -> Result<(), group::WriteError> {
        let g = &self.slot.group;
        let first = g.frames_written() == 0;
        let header = Header::new(timestamp, payload.len())
            .encoded_len(g.last_timestamp())
            .unwrap_or(0);
        self.before_write((header + payload.len()) as u64);
        self.inner.write_frame(timestamp, payload)?;
        self.after_frame(timestamp, first, true);
        Ok(())
    }

    /// Starts a frame of `len` payload bytes to fill with
    /// [`GroupProducer::write_payload`] (see [`group::Producer::begin_frame`]).
    ///
    /// # Errors
    /// As [`group::Producer::begin_frame`].
    pub fn begin_frame(&mut self, timestamp: u64, len: usize) -> Result<(), group::WriteError> {
        self.begin_frame_with(timestamp, len, |inner| inner.begin_frame(timestamp, len))
    }

    /// Like [`GroupProducer::begin_frame`], with the header taken from bytes
    /// `start..end` of a foreign block (see [`group::Producer::begin_frame_from`]).
    ///
    /// # Errors
    /// As [`group::Producer::begin_frame`].
    pub fn begin_frame_from(
        &mut self,
        timestamp: u64,
        len: usize,
        src: &Block<'p>,
        start: usize,
        end: usize,
    ) -> Result<(), group::WriteError> {
        self.begin_frame_with(timestamp, len, |inner| {
            inner.begin_frame_from(timestamp, len, src, start, end)
        })
    }

    fn begin_frame_with(
        &mut self,
        timestamp: u64,
        len: usize,
        begin: impl FnOnce(&mut group::Producer<'t, 'p>) -> Result<(), group::WriteError>,
    ) -> Result<(), group::WriteError> {
        let g = &self.slot.group;
        let first = g.frames_written() == 0;
        let header = Header::new(timestamp, len)
            .encoded_len(g.last_timestamp())
            .unwrap_or(0);
        self.before_write(header as u64);
        begin(&mut self.inner)?;
        // With an announce step, the header goes out with the payload after it.
        let defer = self.announce_step > 0 && len > 0;
        if defer {
            self.unannounced = self.unannounced.saturating_add(header as u64);
        }
        self.after_frame(timestamp, first, !defer);
        Ok(())
    }

    /// Appends payload bytes of the streamed frame; returns how many were taken
    /// (see [`group::Producer::write_payload`]).
    ///
    /// # Errors
    /// As [`group::Producer::write_payload`].
    pub fn write_payload(&mut self, data: &[u8]) -> Result<usize, group::WriteError> {
        self.before_write(data.len() as u64);
        let res = self.inner.write_payload(data);
        self.after_payload(res)
    }

    /// Announces payload just written once a step or the frame is complete.
    fn after_payload(
        &mut self,
        res: Result<usize, group::WriteError>,
    ) -> Result<usize, group::WriteError> {
        match res {
            Ok(n) => {
                self.unannounced = self.unannounced.saturating_add(n as u64);
                if self.inner.frame_remaining() == 0 || self.unannounced >= self.announce_step {
                    self.announce();
                }
                Ok(n)
            }
            Err(e) => {
                // A writer that cannot go on must not leave bytes unannounced:
                // the readers it waits for would not be woken to read them.
                self.announce();
                Err(e)
            }
        }
    }

    /// Appends payload of the streamed frame from bytes `start..end` of a
    /// foreign block, without copying them: see
    /// [`group::Producer::write_payload_from`]; the track version changes as
    /// for [`GroupProducer::write_payload`].
    ///
    /// # Errors
    /// As [`group::Producer::write_payload_from`].
    pub fn write_payload_from(
        &mut self,
        src: &Block<'p>,
        start: usize,
        end: usize,
    ) -> Result<usize, group::WriteError> {
        self.before_write(end.saturating_sub(start) as u64);
        let res = self.inner.write_payload_from(src, start, end);
        self.after_payload(res)
    }

    /// Lets a streamed frame ([`GroupProducer::begin_frame`], then
    /// [`GroupProducer::write_payload`]) bump the track version only once
    /// `bytes` of it are unannounced, or it is complete, instead of on every
    /// write (0, the default).
    ///
    /// Readers woken by version changes then run once per frame (or per
    /// `bytes`) rather than once per piece a relay receives: the bytes are
    /// readable at once all the same. Keep `bytes` below the credit the writer
    /// still has, and call [`GroupProducer::announce`] when it has less (see
    /// [`GroupProducer::unannounced`]): a writer out of credit waits for readers
    /// that only a bump wakes.
    pub fn set_announce_step(&mut self, bytes: u64) {
        self.announce_step = bytes;
    }

    /// Bytes of the streamed frame (its header and payload) written since
    /// the track version last changed for this group.
    pub fn unannounced(&self) -> u64 {
        self.unannounced
    }

    /// Bumps the track version for unannounced payload bytes, if any.
    pub fn announce(&mut self) {
        if self.unannounced > 0 {
            self.unannounced = 0;
            self.track.changed();
        }
    }

    /// Ends the group on a frame boundary (FIN).
    ///
    /// # Errors
    /// As [`group::Producer::finish`].
    pub fn finish(&mut self) -> Result<(), group::WriteError> {
        self.inner.finish()?;
        self.unannounced = 0;
        self.track.changed();
        Ok(())
    }

    /// Abandons the group with stream error `code` (RESET_STREAM); no-op unless it is open.
    pub fn abort(&mut self, code: u64) {
        if self.is_current() && self.slot.group.is_open() {
            self.inner.abort(code);
            self.unannounced = 0;
            self.track.changed();
        }
    }
}

impl<'t, 'p> Deref for GroupProducer<'t, 'p> {
    type Target = group::Producer<'t, 'p>;
    fn deref(&self) -> &Self::Target {
        &self.inner
    }
}

impl Drop for GroupProducer<'_, '_> {
    fn drop(&mut self) {
        // Abort here rather than in the inner producer's drop so readers are notified.
        self.abort(group::ABORT_DROPPED);
    }
}

impl fmt::Debug for GroupProducer<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("track::GroupProducer")
            .field("group", &self.inner)
            .finish()
    }
}
