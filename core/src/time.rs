//! Time as a value: microsecond [`Instant`]s and [`Duration`]s passed in by the caller.
//!
//! Nothing in the core reads a clock. Backends convert their runtime's clock
//! (`std::time::Instant`, `embassy_time::Instant`) into these at the edge.

use core::fmt;
use core::ops::{Add, AddAssign, Sub};

/// A point in time, in microseconds since an epoch the caller chooses (usually boot).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Instant {
    micros: u64,
}

impl Instant {
    /// The epoch itself.
    pub const ZERO: Instant = Instant { micros: 0 };
    /// The latest representable instant; used for "never".
    pub const MAX: Instant = Instant { micros: u64::MAX };

    /// An instant `micros` microseconds after the epoch.
    pub const fn from_micros(micros: u64) -> Self {
        Instant { micros }
    }

    /// An instant `millis` milliseconds after the epoch (saturating).
    pub const fn from_millis(millis: u64) -> Self {
        Instant {
            micros: millis.saturating_mul(1_000),
        }
    }

    /// Microseconds since the epoch.
    pub const fn as_micros(self) -> u64 {
        self.micros
    }

    /// Milliseconds since the epoch (truncated).
    pub const fn as_millis(self) -> u64 {
        self.micros / 1_000
    }

    /// Time elapsed from `earlier` to `self`, or zero if `earlier` is later.
    pub const fn saturating_duration_since(self, earlier: Instant) -> Duration {
        Duration {
            micros: self.micros.saturating_sub(earlier.micros),
        }
    }

    /// `self + d`, clamped to [`Instant::MAX`].
    pub const fn saturating_add(self, d: Duration) -> Instant {
        Instant {
            micros: self.micros.saturating_add(d.micros),
        }
    }
}

impl fmt::Debug for Instant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}.{:06}s",
            self.micros / 1_000_000,
            self.micros % 1_000_000
        )
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;
    fn add(self, rhs: Duration) -> Instant {
        self.saturating_add(rhs)
    }
}

impl AddAssign<Duration> for Instant {
    fn add_assign(&mut self, rhs: Duration) {
        *self = *self + rhs;
    }
}

impl Sub<Instant> for Instant {
    type Output = Duration;
    fn sub(self, rhs: Instant) -> Duration {
        self.saturating_duration_since(rhs)
    }
}

/// A span of time in microseconds.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Duration {
    micros: u64,
}

impl Duration {
    /// No time at all.
    pub const ZERO: Duration = Duration { micros: 0 };
    /// The longest representable span; used for "unbounded".
    pub const MAX: Duration = Duration { micros: u64::MAX };

    /// A span of `micros` microseconds.
    pub const fn from_micros(micros: u64) -> Self {
        Duration { micros }
    }

    /// A span of `millis` milliseconds (saturating).
    pub const fn from_millis(millis: u64) -> Self {
        Duration {
            micros: millis.saturating_mul(1_000),
        }
    }

    /// A span of `secs` seconds (saturating).
    pub const fn from_secs(secs: u64) -> Self {
        Duration {
            micros: secs.saturating_mul(1_000_000),
        }
    }

    /// Whole microseconds.
    pub const fn as_micros(self) -> u64 {
        self.micros
    }

    /// Whole milliseconds (truncated), as moq-lite's `Dur(i)` fields carry them.
    pub const fn as_millis(self) -> u64 {
        self.micros / 1_000
    }

    /// `self + rhs`, clamped to [`Duration::MAX`].
    pub const fn saturating_add(self, rhs: Duration) -> Duration {
        Duration {
            micros: self.micros.saturating_add(rhs.micros),
        }
    }

    /// `self - rhs`, or zero.
    pub const fn saturating_sub(self, rhs: Duration) -> Duration {
        Duration {
            micros: self.micros.saturating_sub(rhs.micros),
        }
    }
}

impl fmt::Debug for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.micros.is_multiple_of(1_000) {
            write!(f, "{}ms", self.micros / 1_000)
        } else {
            write!(f, "{}us", self.micros)
        }
    }
}

impl Add for Duration {
    type Output = Duration;
    fn add(self, rhs: Duration) -> Duration {
        self.saturating_add(rhs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates() {
        let t = Instant::from_millis(5);
        assert_eq!((t + Duration::from_millis(2)).as_micros(), 7_000);
        assert_eq!(Instant::MAX + Duration::from_secs(1), Instant::MAX);
        assert_eq!(Instant::ZERO - t, Duration::ZERO);
        assert_eq!(t - Instant::ZERO, Duration::from_micros(5_000));
        assert_eq!(Duration::from_micros(1_999).as_millis(), 1);
        assert_eq!(
            Duration::MAX.saturating_add(Duration::from_secs(1)),
            Duration::MAX
        );
    }
}
