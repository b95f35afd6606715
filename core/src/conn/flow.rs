//! Flow-control accounting: the credit the peer grants us and the windows we grant the peer.
//!
//! Both kinds count abstract units: bytes for MAX_DATA / MAX_STREAM_DATA, and
//! streams for MAX_STREAMS (docs/protocol.md §2.3, §2.4). Nothing here encodes
//! frames; the connection turns a raised window into a pending update.

use core::fmt;

/// The peer lowered a limit it had already granted (docs/protocol.md §2.3: moq-dev closes the
/// session on a decreasing MAX_DATA, MAX_STREAM_DATA or MAX_STREAMS; so do we).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Decreased;

impl fmt::Display for Decreased {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("limit decreased")
    }
}

/// The peer sent more than the window we granted (docs/protocol.md §2.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Exceeded;

impl fmt::Display for Exceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("window exceeded")
    }
}

/// Send-side credit: how much the peer allows us to use in total, and how much we used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct SendCredit {
    max: u64,
    used: u64,
}

impl SendCredit {
    /// Credit with an initial limit and nothing used.
    pub const fn new(max: u64) -> Self {
        SendCredit { max, used: 0 }
    }

    /// The current absolute limit.
    #[cfg(test)]
    pub const fn max(&self) -> u64 {
        self.max
    }

    /// Units used so far (for a stream: its send offset).
    pub const fn used(&self) -> u64 {
        self.used
    }

    /// Units that may still be used.
    pub const fn available(&self) -> u64 {
        self.max.saturating_sub(self.used)
    }

    /// Uses up to `n` units and returns how many were granted (never more than [`available`](Self::available)).
    pub fn claim(&mut self, n: u64) -> u64 {
        let n = n.min(self.available());
        self.used += n;
        n
    }

    /// Applies a new absolute limit from a MAX_* frame; an equal value is a no-op.
    ///
    /// # Errors
    /// [`Decreased`] if `new_max` is below the current limit (the limit is unchanged).
    pub fn raise(&mut self, new_max: u64) -> Result<(), Decreased> {
        if new_max < self.max {
            return Err(Decreased);
        }
        self.max = new_max;
        Ok(())
    }

    /// Raises the limit to at least `max`, ignoring a lower value (initial parameters
    /// arriving after a MAX_* frame).
    pub fn raise_at_least(&mut self, max: u64) {
        self.max = self.max.max(max);
    }
}

/// Receive-side window we grant, with moq-dev's update rule (docs/protocol.md §2.4).
///
/// `received` counts what arrived, `released` what the application has consumed
/// (and so what may be granted again). Credit is raised by the released amount
/// once `received + 2 × pending > max`, where `pending` is what was released since
/// the last raise: roughly one update per half window, and the window the peer
/// sees never grows beyond its initial size past what was consumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct RecvWindow {
    max: u64,
    received: u64,
    released: u64,
    pending: u64,
}

impl RecvWindow {
    /// A window of `max` units, nothing received.
    pub const fn new(max: u64) -> Self {
        RecvWindow {
            max,
            received: 0,
            released: 0,
            pending: 0,
        }
    }

    /// The limit granted so far (absolute).
    pub const fn max(&self) -> u64 {
        self.max
    }

    /// Units received so far.
    pub const fn received(&self) -> u64 {
        self.received
    }

    /// Units received but not yet released by the application.
    pub const fn unreleased(&self) -> u64 {
        self.received - self.released
    }

    /// Charges `n` arriving units.
    ///
    /// # Errors
    /// [`Exceeded`] if that would pass the granted limit (nothing is charged).
    pub fn receive(&mut self, n: u64) -> Result<(), Exceeded> {
        match self.received.checked_add(n) {
            Some(total) if total <= self.max => {
                self.received = total;
                Ok(())
            }
            _ => Err(Exceeded),
        }
    }

    /// Raises `received` to `total` if it is higher (stream counts: opening index `i`
    /// opens `0..=i`, so `total = i + 1`).
    ///
    /// # Errors
    /// [`Exceeded`] if `total` passes the granted limit.
    pub fn receive_up_to(&mut self, total: u64) -> Result<(), Exceeded> {
        if total > self.max {
            return Err(Exceeded);
        }
        self.received = self.received.max(total);
        Ok(())
    }

    /// Records that the application consumed `n` more units (clamped to what is
    /// unreleased) and returns the new limit if an update should be sent.
    pub fn release(&mut self, n: u64) -> Option<u64> {
        let n = n.min(self.unreleased());
        if n == 0 {
            return None;
        }
        self.released += n;
        self.pending += n;
        self.catch_up()
    }

    /// Raises the limit by what was released since the last raise if
    /// `received + 2 × pending > max` holds (docs/protocol.md §2.4, the rule
    /// [`release`](Self::release) applies) and returns the new limit to send.
    ///
    /// Call it when `received` grows without a release: credit held back at
    /// the last release must still reach a peer that comes up to its limit
    /// afterwards. A stream count needs it: streams the peer keeps open
    /// release nothing, so without it the peer would wait for a grant
    /// forever while released streams' credit sits here.
    pub fn catch_up(&mut self) -> Option<u64> {
        if self.pending > 0
            && self.received.saturating_add(self.pending.saturating_mul(2)) > self.max
        {
            self.max = self.max.saturating_add(self.pending);
            self.pending = 0;
            Some(self.max)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // ---- send credit ----

    #[test]
    fn claim_stops_at_the_limit() {
        let mut c = SendCredit::new(10);
        assert_eq!(c.claim(4), 4);
        assert_eq!(c.claim(100), 6);
        assert_eq!(c.claim(1), 0);
        assert_eq!(c.available(), 0);
        assert_eq!(c.used(), 10);
    }

    #[test]
    fn raise_is_monotonic() {
        let mut c = SendCredit::new(10);
        assert_eq!(c.raise(10), Ok(()));
        assert_eq!(c.raise(9), Err(Decreased));
        assert_eq!(c.max(), 10);
        assert_eq!(c.raise(20), Ok(()));
        c.raise_at_least(15);
        assert_eq!(c.max(), 20);
    }

    // ---- receive window ----

    #[test]
    fn receive_rejects_overrun_without_charging() {
        let mut w = RecvWindow::new(10);
        assert_eq!(w.receive(10), Ok(()));
        assert_eq!(w.receive(1), Err(Exceeded));
        assert_eq!(w.received(), 10);
        assert_eq!(w.receive(u64::MAX), Err(Exceeded));
    }

    #[test]
    fn moq_dev_rule_matches_v4() {
        // docs/protocol.md §6 V4: after 131073 bytes consumed of a 262144 window the limit is 393217.
        let mut w = RecvWindow::new(262_144);
        w.receive(131_073).unwrap();
        assert_eq!(w.release(131_073), Some(393_217));
    }

    #[test]
    fn update_waits_for_half_the_window() {
        let mut w = RecvWindow::new(100);
        w.receive(30).unwrap();
        assert_eq!(w.release(30), None); // 30 + 60 = 90, not above 100
        w.receive(10).unwrap();
        assert_eq!(w.release(10), Some(140)); // 40 + 80 > 100: raise by 40
        assert_eq!(w.release(1), None); // nothing unreleased
    }

    #[test]
    fn release_is_clamped_to_received() {
        let mut w = RecvWindow::new(100);
        w.receive(5).unwrap();
        assert_eq!(w.release(50), None);
        assert_eq!(w.unreleased(), 0);
        w.receive(90).unwrap();
        assert_eq!(w.release(90), Some(195));
    }

    #[test]
    fn stream_counts() {
        let mut w = RecvWindow::new(4);
        assert_eq!(w.receive_up_to(3), Ok(()));
        assert_eq!(w.receive_up_to(2), Ok(()));
        assert_eq!(w.received(), 3);
        assert_eq!(w.receive_up_to(5), Err(Exceeded));
        // Three streams retired one by one: 3 + 2 × 1 > 4 at the first.
        assert_eq!(w.release(1), Some(5));
    }

    proptest! {
        /// Whatever the pattern, the peer's view of free window never exceeds the
        /// initial grant and limits only grow.
        #[test]
        fn window_never_grows_past_initial(ops in proptest::collection::vec((0u64..300, 0u64..300), 1..60)) {
            let initial = 1000;
            let mut w = RecvWindow::new(initial);
            let mut last = initial;
            for (recv, rel) in ops {
                let _ = w.receive(recv);
                if let Some(m) = w.release(rel) {
                    prop_assert!(m > last);
                    last = m;
                }
                // max = initial + (released - pending) <= initial + released.
                prop_assert!(w.max() <= initial + (w.received() - w.unreleased()));
            }
        }
    }
}
