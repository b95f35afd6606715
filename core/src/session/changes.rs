//! What a session changed in local media, for its driver to forward.
//!
//! A session writes the tracks it fills (groups, frames, their ends, a
//! subscription's end) and reads the tracks it serves (their bytes go out;
//! what it serves from them changes their demand). Other tasks of the same
//! machine wait on those tracks: the readers of a filled track, the producer
//! of a served one. After each call the session lists the tracks it touched,
//! once each, and the driver wakes exactly their waiters
//! ([`super::Session::poll_changed`]).

use crate::model::track;

/// One change a session call made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum Change {
    /// The media of this track changed (a group, frame bytes, an end, its
    /// TRACK_INFO): wake its readers.
    Media(track::Key),
    /// The session read this track's bytes: wake whoever waits for its
    /// readers (its producer, for pacing and credit).
    Consumed(track::Key),
    /// What the session serves from this track changed (a subscription
    /// started, was updated or ended): wake whoever follows its demand.
    Demand(track::Key),
    /// More tracks changed than the session lists: treat every track as
    /// changed both ways.
    Many,
}

/// Tracks listed before the list gives way to [`Change::Many`].
pub const LISTED_CHANGES: usize = 16;

/// The changes not polled yet: each at most once.
#[derive(Debug)]
pub(crate) struct Changes {
    list: [Change; LISTED_CHANGES],
    len: usize,
    /// Polled up to here.
    next: usize,
    many: bool,
}

impl Changes {
    pub(crate) const fn new() -> Self {
        Changes {
            list: [Change::Many; LISTED_CHANGES],
            len: 0,
            next: 0,
            many: false,
        }
    }

    /// Records `change` unless it is listed already.
    pub(crate) fn add(&mut self, change: Change) {
        if self.many {
            return;
        }
        let listed = self.list.get(..self.len).unwrap_or(&[]);
        if listed.contains(&change) {
            return;
        }
        match self.list.get_mut(self.len) {
            Some(slot) => {
                *slot = change;
                self.len += 1;
            }
            None => self.many = true,
        }
    }

    /// The next change not polled yet; the list empties once all were.
    pub(crate) fn poll(&mut self) -> Option<Change> {
        if self.many {
            *self = Changes::new();
            return Some(Change::Many);
        }
        match self.list.get(self.next..self.len).and_then(|l| l.first()) {
            Some(&c) => {
                self.next += 1;
                Some(c)
            }
            None => {
                self.len = 0;
                self.next = 0;
                None
            }
        }
    }

    /// True if nothing waits to be polled.
    pub(crate) fn is_empty(&self) -> bool {
        !self.many && self.next >= self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: usize) -> track::Key {
        track::Key::from_parts(n, 0)
    }

    #[test]
    fn each_change_once_then_empty() {
        let mut c = Changes::new();
        c.add(Change::Media(key(1)));
        c.add(Change::Consumed(key(1)));
        c.add(Change::Media(key(1)));
        assert_eq!(c.poll(), Some(Change::Media(key(1))));
        assert_eq!(c.poll(), Some(Change::Consumed(key(1))));
        assert_eq!(c.poll(), None);
        assert!(c.is_empty());
        c.add(Change::Media(key(1)));
        assert_eq!(c.poll(), Some(Change::Media(key(1))));
    }

    #[test]
    fn overflow_is_many() {
        let mut c = Changes::new();
        for n in 0..=LISTED_CHANGES {
            c.add(Change::Media(key(n)));
        }
        assert_eq!(c.poll(), Some(Change::Many));
        assert_eq!(c.poll(), None);
    }
}
