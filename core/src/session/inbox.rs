//! [`Inbox`]: the received bytes a driver presents to a [`Session`].
//!
//! A driver reads from its socket into [`Inbox::spare_mut`], records the
//! bytes with [`Inbox::commit`] and calls [`Inbox::feed`], which presents
//! everything not consumed yet to [`Session::handle_input`] (and calls it
//! with no bytes when the session is stalled on input it already took).
//! Consumed bytes are dropped by moving a start offset; the unconsumed tail is
//! moved to the front of the buffer only when the room after it runs short
//! (or never, when the session takes everything: the buffer then starts over
//! at its front). Ingress costs the read into the buffer and the session's
//! copy into its pool, not a move of the tail on every call.

use super::{Error, Session};
use crate::time::Instant;

/// Received bytes waiting for a [`Session`], in a caller-provided buffer.
///
/// `B` is the storage: a `&mut [u8]` (a static buffer on a microcontroller),
/// or an owned buffer such as `Vec<u8>` or `Box<[u8]>` filled once to its
/// capacity. The inbox never allocates. Its capacity must hold one whole
/// QMux record (the connection's `max_record_size` plus 8 bytes), or a
/// record that long can never be taken ([`is_full`](Self::is_full) while the
/// session consumes nothing).
#[derive(Debug)]
pub struct Inbox<B> {
    buf: B,
    /// Offset of the first byte not consumed yet.
    start: usize,
    /// Offset just past the last byte received.
    end: usize,
    /// [`spare_mut`](Self::spare_mut) compacts when less room than this is
    /// left after the received bytes.
    min_room: usize,
}

/// What one [`Inbox::feed`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[must_use]
pub struct Fed {
    /// Bytes the session consumed (dropped from the inbox).
    pub consumed: usize,
    /// The session was stalled on input it already took and no longer is.
    pub resumed: bool,
}

impl Fed {
    /// True if the session moved: it consumed bytes or left its stall.
    pub fn progress(&self) -> bool {
        self.consumed > 0 || self.resumed
    }
}

impl<B: AsRef<[u8]> + AsMut<[u8]>> Inbox<B> {
    /// An empty inbox over `buf` (its whole length is the capacity). The
    /// room after the received bytes is kept at a quarter of the capacity
    /// or more when bytes were consumed; see [`with_min_room`](Self::with_min_room).
    pub fn new(buf: B) -> Self {
        let min_room = buf.as_ref().len() / 4;
        Inbox {
            buf,
            start: 0,
            end: 0,
            min_room,
        }
    }

    /// An empty inbox over `buf` whose [`spare_mut`](Self::spare_mut) moves
    /// the unconsumed bytes to the front when less than `min_room` bytes
    /// follow them (a driver whose reads deliver up to `n` bytes at a time
    /// passes `n`, so a read fits whenever the inbox holds at most its
    /// capacity minus `n`).
    pub fn with_min_room(buf: B, min_room: usize) -> Self {
        Inbox {
            min_room,
            ..Self::new(buf)
        }
    }

    /// Total bytes the inbox can hold.
    pub fn capacity(&self) -> usize {
        self.buf.as_ref().len()
    }

    /// Bytes received and not consumed yet.
    pub fn len(&self) -> usize {
        self.end - self.start
    }

    /// True when no received byte waits.
    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }

    /// True when no more bytes fit, even after compaction: stop reading
    /// until the session consumes some.
    pub fn is_full(&self) -> bool {
        self.len() == self.capacity()
    }

    /// The bytes received and not consumed yet, oldest first.
    pub fn unconsumed(&self) -> &[u8] {
        self.buf.as_ref().get(self.start..self.end).unwrap_or(&[])
    }

    /// Room to receive into, after the bytes already received; then call
    /// [`commit`](Self::commit) with the number of bytes written there.
    ///
    /// When less than the minimum room follows the received bytes and some
    /// were consumed, the unconsumed bytes are first moved to the front of
    /// the buffer. Empty only when [`is_full`](Self::is_full).
    pub fn spare_mut(&mut self) -> &mut [u8] {
        let cap = self.capacity();
        if self.start > 0 && cap - self.end < self.min_room.max(1) {
            self.compact();
        }
        self.buf.as_mut().get_mut(self.end..).unwrap_or(&mut [])
    }

    /// Room for exactly `n` bytes after the received ones, the unconsumed
    /// bytes first moved to the front of the buffer if that makes `n` fit
    /// (a read larger than the minimum room, say); then call
    /// [`commit`](Self::commit) with `n`. `None` if the buffer cannot hold
    /// `n` more bytes.
    pub fn spare_for(&mut self, n: usize) -> Option<&mut [u8]> {
        if self.capacity() - self.end < n && self.start > 0 {
            self.compact();
        }
        let end = self.end;
        self.buf.as_mut().get_mut(end..end.checked_add(n)?)
    }

    /// Records `n` bytes written at the front of [`spare_mut`](Self::spare_mut).
    ///
    /// # Panics
    /// If `n` is more than the spare room.
    pub fn commit(&mut self, n: usize) {
        assert!(
            n <= self.capacity() - self.end,
            "commit past the spare room"
        );
        self.end += n;
    }

    /// Drops the first `n` unconsumed bytes (all of them if `n` is larger):
    /// for a driver that presents the bytes itself.
    pub fn consume(&mut self, n: usize) {
        self.start += n.min(self.len());
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    /// Drops every received byte.
    pub fn clear(&mut self) {
        self.start = 0;
        self.end = 0;
    }

    /// Presents the unconsumed bytes to `session` in one
    /// [`Session::handle_input`] call and drops what it consumed. A session
    /// stalled on input it already took ([`Session::is_stalled`]) is called
    /// even when no byte waits; with nothing waiting and no stall, the
    /// session is not called.
    ///
    /// Afterwards drain [`Session::poll_event`] (the session may have stopped
    /// for room in its event queue) and feed again while it
    /// [`progress`](Fed::progress)es.
    ///
    /// # Errors
    /// [`Error::Closed`] once the session is over; the waiting bytes are
    /// meaningless then and are dropped.
    pub fn feed<const N: usize>(
        &mut self,
        session: &mut Session<'_, '_, '_, N>,
        now: Instant,
    ) -> Result<Fed, Error> {
        let stalled = session.is_stalled();
        if self.is_empty() && !stalled {
            return Ok(Fed::default());
        }
        let input = self.buf.as_ref().get(self.start..self.end).unwrap_or(&[]);
        match session.handle_input(now, input) {
            Ok(n) => {
                let consumed = n.min(self.len());
                self.consume(consumed);
                Ok(Fed {
                    consumed,
                    resumed: stalled && !session.is_stalled(),
                })
            }
            Err(e) => {
                self.clear();
                Err(e)
            }
        }
    }

    /// The storage back; the bytes waiting in it are dropped.
    pub fn into_inner(self) -> B {
        self.buf
    }

    /// Moves the unconsumed bytes to the front of the buffer.
    fn compact(&mut self) {
        let len = self.len();
        self.buf.as_mut().copy_within(self.start..self.end, 0);
        self.start = 0;
        self.end = len;
    }
}
