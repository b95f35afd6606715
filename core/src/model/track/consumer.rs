//! [`Consumer`]: one reader of a track at its own position.

use core::fmt;
use core::task::{Context, Poll};

use super::{Next, ReadError, Ref, Status};

/// One reader of a track at its own position (from [`Ref::consumer`]).
///
/// It is given groups in increasing sequence order, each once; a group that
/// arrives after the consumer moved past its sequence is not given (a
/// session that wants late groups uses [`Ref::next_wanted`] with a window).
/// Cloning gives an independent reader at the same position.
#[derive(Clone)]
pub struct Consumer<'t, 'p> {
    pub(super) track: Ref<'t, 'p>,
    pub(super) epoch: u64,
    /// The next sequence wanted.
    pub(super) cursor: u64,
    /// Group `u64::MAX` was given: nothing can follow.
    pub(super) exhausted: bool,
}

impl<'t, 'p> Consumer<'t, 'p> {
    /// The track this consumer reads.
    #[cfg(test)]
    pub fn track(&self) -> Ref<'t, 'p> {
        self.track
    }

    /// The next sequence number this consumer wants.
    pub fn position(&self) -> u64 {
        self.cursor
    }

    /// Moves the consumer so that the next group it is given is the first held at or after `seq`.
    #[cfg(test)]
    pub fn seek(&mut self, seq: u64) {
        self.cursor = seq;
        self.exhausted = false;
    }

    /// The next group for this reader.
    ///
    /// * `Ready(group)`: the lowest held group at or after the position; the
    ///   position moves past it.
    /// * `Lagged(n)`: a group the reader had not been given yet was evicted;
    ///   it skips `n` sequence numbers to the latest group, which the next call returns.
    /// * `Pending`: nothing yet; wait for [`Ref::version`] to change.
    /// * `Finished`: the track is finished and nothing is left at or after the position.
    ///
    /// O(G).
    ///
    /// # Errors
    /// [`ReadError::Aborted`] once the track is aborted; [`ReadError::Stale`]
    /// if the track slot was reopened.
    pub fn next_group(&mut self) -> Result<Next<'t, 'p>, ReadError> {
        let c = self.track.core;
        if c.epoch.get() != self.epoch {
            return Err(ReadError::Stale);
        }
        if let Status::Aborted(code) = c.status.get() {
            return Err(ReadError::Aborted(code));
        }
        if !self.exhausted {
            if let (Some(evicted), Some(latest)) = (c.evicted_max.get(), c.latest.get())
                && self.cursor <= evicted
                && self.cursor < latest
            {
                let skipped = latest - self.cursor;
                debug!("consumer lagged by {} groups", skipped);
                self.cursor = latest;
                return Ok(Next::Lagged(skipped));
            }
            let mut best: Option<(usize, u64)> = None;
            for (i, s) in self.track.slots.iter().enumerate() {
                if !s.held() {
                    continue;
                }
                let seq = s.group.sequence();
                if seq >= self.cursor && best.is_none_or(|(_, b)| seq < b) {
                    best = Some((i, seq));
                }
            }
            if let Some((i, seq)) = best {
                match seq.checked_add(1) {
                    Some(next) => self.cursor = next,
                    None => self.exhausted = true,
                }
                return Ok(Next::Ready(self.track.slot(i).group.consumer()));
            }
        }
        if self.exhausted || c.status.get() == Status::Finished {
            Ok(Next::Finished)
        } else {
            Ok(Next::Pending)
        }
    }

    /// [`Consumer::next_group`] for async readers: `Pending` registers the
    /// task to be woken at the track's next change.
    ///
    /// # Errors
    /// As [`Consumer::next_group`].
    pub fn poll_next_group(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Next<'t, 'p>, ReadError>> {
        match self.next_group() {
            Ok(Next::Pending) => {
                self.track.core.wakers.register(cx.waker());
                Poll::Pending
            }
            other => Poll::Ready(other),
        }
    }
}

impl fmt::Debug for Consumer<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("track::Consumer")
            .field("cursor", &self.cursor)
            .field("epoch", &self.epoch)
            .finish_non_exhaustive()
    }
}
