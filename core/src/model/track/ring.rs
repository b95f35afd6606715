//! The ring of recent groups: finding a group by sequence, creating one in a
//! free slot, and evicting the oldest non-latest groups when the ring is full,
//! the byte budget is exceeded or they are past the publisher max age.

use super::{CreateError, GroupProducer, Ref, Slot, Status};
use crate::model::group;

impl<'t, 'p> Ref<'t, 'p> {
    pub(super) fn slot(&self, i: usize) -> &'t Slot<'p> {
        // Indices come from iterating `self.slots`.
        &self.slots[i]
    }

    pub(super) fn seq(&self, i: usize) -> u64 {
        self.slot(i).group.sequence()
    }

    pub(super) fn find(&self, seq: u64) -> Option<usize> {
        self.slots
            .iter()
            .position(|s| s.held() && s.group.sequence() == seq)
    }

    /// The held slot with the lowest sequence, skipping sequence `except`.
    pub(super) fn oldest_slot(&self, except: Option<u64>) -> Option<usize> {
        self.oldest_where(|s| Some(s.group.sequence()) != except)
    }

    fn oldest_where(&self, ok: impl Fn(&Slot<'p>) -> bool) -> Option<usize> {
        let mut best: Option<(usize, u64)> = None;
        for (i, s) in self.slots.iter().enumerate() {
            if !s.held() || !ok(s) {
                continue;
            }
            let seq = s.group.sequence();
            if best.is_none_or(|(_, b)| seq < b) {
                best = Some((i, seq));
            }
        }
        best.map(|(i, _)| i)
    }

    fn evict(&self, i: usize) {
        let s = self.slot(i);
        let seq = s.group.sequence();
        trace!("evicting group {}", seq);
        s.group.clear();
        s.begin.set(None);
        let c = self.core;
        c.evicted.set(c.evicted.get() + 1);
        if c.evicted_max.get().is_none_or(|m| seq > m) {
            c.evicted_max.set(Some(seq));
        }
    }

    /// Timestamp of the newest frame of the latest group (docs/protocol.md §4.7);
    /// while the latest group has no frame, the newest frame of any held group.
    pub(super) fn newest_ts(&self) -> u64 {
        if let Some(i) = self.core.latest.get().and_then(|l| self.find(l)) {
            let g = &self.slot(i).group;
            if g.frames_written() > 0 {
                return g.last_timestamp();
            }
        }
        self.slots
            .iter()
            .filter(|s| s.held() && s.group.frames_written() > 0)
            .map(|s| s.group.last_timestamp())
            .max()
            .unwrap_or(0)
    }

    /// Where the successors of `seq` begin: the earliest first frame of the held
    /// groups after it, or the newest frame if none has begun. Non-decreasing in `seq`.
    pub(super) fn superseded_ts(&self, seq: u64) -> u64 {
        self.slots
            .iter()
            .filter(|s| s.held() && s.group.sequence() > seq)
            .filter_map(|s| s.begin.get())
            .min()
            .unwrap_or_else(|| self.newest_ts())
    }

    /// Whether a group `seq` (not the latest) is past the publisher max age.
    fn is_stale(&self, seq: u64) -> bool {
        let info = self.core.info.get();
        let newest = info.instant(self.newest_ts());
        let at = info.instant(self.superseded_ts(seq));
        newest.saturating_duration_since(at) > info.max_age
    }

    /// Drops the oldest non-latest groups while they are past the publisher max age.
    pub(super) fn expire(&self) -> bool {
        let Some(latest) = self.core.latest.get() else {
            return false;
        };
        let mut any = false;
        while let Some(i) = self.oldest_slot(Some(latest)) {
            if !self.is_stale(self.seq(i)) {
                break;
            }
            self.evict(i);
            any = true;
        }
        any
    }

    /// Evicts the oldest non-latest groups holding bytes until `extra` more
    /// bytes for the group in `writing` fit the budget (or nothing is left to
    /// evict). The group being written is a candidate like any other: if it is
    /// the oldest, it goes, and its write fails with `Evicted`.
    pub(super) fn make_room(&self, extra: u64, writing: Option<&Slot<'p>>) -> bool {
        let budget = self.core.budget.get();
        if budget == u64::MAX {
            return false;
        }
        let latest = self.core.latest.get();
        let mut held = self.held_bytes();
        let mut extra = extra;
        let mut any = false;
        while held.saturating_add(extra) > budget {
            let Some(i) = self.oldest_where(|s| {
                Some(s.group.sequence()) != latest
                    && (s.bytes() > 0 || writing.is_some_and(|w| core::ptr::eq(w, s)))
            }) else {
                break;
            };
            let victim = self.slot(i);
            if writing.is_some_and(|w| core::ptr::eq(w, victim)) {
                extra = 0;
            }
            held -= victim.bytes();
            self.evict(i);
            any = true;
        }
        any
    }

    pub(super) fn create(self, epoch: u64, seq: u64) -> Result<GroupProducer<'t, 'p>, CreateError> {
        let c = self.core;
        if c.epoch.get() != epoch {
            return Err(CreateError::Stale);
        }
        match c.status.get() {
            Status::Open => {}
            Status::Finished => return Err(CreateError::Finished),
            Status::Aborted(code) => return Err(CreateError::Aborted(code)),
        }
        // Failover: a group the lost source left aborted may come again from
        // the new one; it takes the aborted group's slot.
        let again = match self.find(seq) {
            Some(i)
                if c.failover.get()
                    && matches!(self.slot(i).group.status(), group::Status::Aborted(_)) =>
            {
                Some(i)
            }
            Some(_) => return Err(CreateError::Duplicate),
            None => None,
        };
        let latest = c.latest.get();
        let is_latest = latest.is_none_or(|l| seq > l);
        // docs/protocol.md §4.8: a late older group is kept only while within max age.
        if !is_latest && self.is_stale(seq) {
            return Err(CreateError::TooOld);
        }
        let free = again.or_else(|| self.slots.iter().position(|s| !s.held()));
        let i = match free {
            Some(i) => i,
            None => {
                // Full ring: the oldest group goes, unless the new one would be older.
                let except = if is_latest { None } else { latest };
                match self.oldest_slot(except) {
                    Some(i) if is_latest || self.seq(i) < seq => {
                        self.evict(i);
                        i
                    }
                    _ => return Err(CreateError::TooOld),
                }
            }
        };
        let slot = self.slot(i);
        slot.group.reset(seq);
        slot.begin.set(None);
        if is_latest {
            c.latest.set(Some(seq));
        }
        self.make_room(0, None);
        self.changed();
        trace!("group {} created", seq);
        let inner = slot.group.producer().ok_or(CreateError::Stale)?;
        Ok(GroupProducer {
            inner,
            track: self,
            slot,
            generation: slot.group.generation(),
            unannounced: 0,
            announce_step: 0,
        })
    }
}
