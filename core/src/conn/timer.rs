//! The connection's three deadlines: handshake, idle and keep-alive.
//!
//! All of them derive from instants the connection records as it receives and
//! sends; nothing here reads a clock.

use crate::time::{Duration, Instant};

/// Which deadline passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub(crate) enum Timer {
    /// The peer's parameters did not arrive in time (docs/protocol.md §1.1).
    Handshake,
    /// Nothing was received for the effective idle timeout (docs/protocol.md §1.4, §2.5).
    Idle,
    /// A third of the idle timeout passed without sending: time for a QX_PING.
    KeepAlive,
}

/// The effective idle timeout: the smaller of the non-zero advertisements, if any (docs/protocol.md §1.4).
pub(crate) fn effective_idle(ours_ms: u64, peer_ms: u64) -> Option<Duration> {
    let ms = match (ours_ms, peer_ms) {
        (0, 0) => return None,
        (0, p) => p,
        (o, 0) => o,
        (o, p) => o.min(p),
    };
    Some(Duration::from_millis(ms))
}

/// Deadline bookkeeping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub(crate) struct Timers {
    /// Deadline for the peer's parameters, until they arrive.
    handshake: Option<Instant>,
    /// Effective idle timeout, known once the peer's parameters arrived.
    idle: Option<Duration>,
    /// Whether to send keep-alive pings.
    keep_alive: bool,
    /// When we last received a whole record.
    last_recv: Instant,
    /// When we last produced bytes to send.
    last_send: Instant,
}

impl Timers {
    /// Timers of a connection created at `now`; a zero `handshake_timeout` waits forever.
    pub fn new(now: Instant, handshake_timeout: Duration, keep_alive: bool) -> Self {
        Timers {
            handshake: (handshake_timeout != Duration::ZERO).then(|| now + handshake_timeout),
            idle: None,
            keep_alive,
            last_recv: now,
            last_send: now,
        }
    }

    /// Records received bytes (restarts the idle deadline).
    pub fn on_recv(&mut self, now: Instant) {
        self.last_recv = self.last_recv.max(now);
    }

    /// Records sent bytes (restarts the keep-alive deadline).
    pub fn on_send(&mut self, now: Instant) {
        self.last_send = self.last_send.max(now);
    }

    /// The peer's parameters arrived: stop the handshake deadline, start the idle one.
    pub fn on_established(&mut self, now: Instant, idle: Option<Duration>) {
        self.handshake = None;
        self.idle = idle;
        self.on_recv(now);
    }

    /// The effective idle timeout, once known.
    pub fn idle(&self) -> Option<Duration> {
        self.idle
    }

    /// When `timer` fires, if it is armed (`ping_pending` disarms the keep-alive).
    pub fn deadline(&self, timer: Timer, ping_pending: bool) -> Option<Instant> {
        match timer {
            Timer::Handshake => self.handshake,
            Timer::Idle => self.idle.map(|d| self.last_recv + d),
            Timer::KeepAlive => {
                if !self.keep_alive || ping_pending {
                    return None;
                }
                // moq-dev pings after a third of the idle window; at least every millisecond.
                let every = self.idle?.as_micros() / 3;
                Some(self.last_send + Duration::from_micros(every.max(1_000)))
            }
        }
    }

    /// The earliest armed deadline.
    pub fn next(&self, ping_pending: bool) -> Option<Instant> {
        [Timer::Handshake, Timer::Idle, Timer::KeepAlive]
            .into_iter()
            .filter_map(|t| self.deadline(t, ping_pending))
            .min()
    }

    /// The most important deadline that has passed at `now`, if any.
    pub fn expired(&self, now: Instant, ping_pending: bool) -> Option<Timer> {
        [Timer::Handshake, Timer::Idle, Timer::KeepAlive]
            .into_iter()
            .find(|&t| self.deadline(t, ping_pending).is_some_and(|d| d <= now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Instant {
        Instant::from_millis(n)
    }

    #[test]
    fn effective_idle_is_the_smaller_non_zero() {
        assert_eq!(effective_idle(0, 0), None);
        assert_eq!(effective_idle(30_000, 0), Some(Duration::from_secs(30)));
        assert_eq!(effective_idle(0, 5_000), Some(Duration::from_secs(5)));
        assert_eq!(effective_idle(30_000, 5_000), Some(Duration::from_secs(5)));
    }

    #[test]
    fn handshake_then_idle_and_keep_alive() {
        let mut t = Timers::new(ms(0), Duration::from_secs(10), true);
        assert_eq!(t.next(false), Some(ms(10_000)));
        assert_eq!(t.expired(ms(9_999), false), None);
        assert_eq!(t.expired(ms(10_000), false), Some(Timer::Handshake));

        t.on_established(ms(100), Some(Duration::from_secs(30)));
        assert_eq!(t.deadline(Timer::Handshake, false), None);
        assert_eq!(t.deadline(Timer::Idle, false), Some(ms(30_100)));
        assert_eq!(
            t.next(false),
            Some(ms(10_000)),
            "keep-alive counts from the last send at 0"
        );
        assert_eq!(
            t.next(true),
            Some(ms(30_100)),
            "a pending ping disarms the keep-alive"
        );
        t.on_send(ms(5_000));
        assert_eq!(t.next(false), Some(ms(15_000)));
        assert_eq!(t.expired(ms(15_000), false), Some(Timer::KeepAlive));
        t.on_recv(ms(20_000));
        assert_eq!(t.deadline(Timer::Idle, false), Some(ms(50_000)));
        assert_eq!(t.expired(ms(50_000), true), Some(Timer::Idle));
    }

    #[test]
    fn disabled_timers_never_fire() {
        let mut t = Timers::new(ms(0), Duration::ZERO, false);
        assert_eq!(t.next(false), None);
        t.on_established(ms(1), None);
        assert_eq!(t.next(false), None);
        assert_eq!(t.expired(Instant::MAX, false), None);
    }
}
