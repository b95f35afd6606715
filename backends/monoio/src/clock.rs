//! Converts the operating system's monotonic clock into core [`Instant`]s.

use std::time::{Duration as StdDuration, Instant as StdInstant};

use skiff_core::time::{Duration, Instant};

/// A std duration as a core one (saturating at `u64::MAX` microseconds).
pub fn to_core(d: StdDuration) -> Duration {
    Duration::from_micros(u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// A core duration as a std one.
pub(crate) fn to_std(d: Duration) -> StdDuration {
    StdDuration::from_micros(d.as_micros())
}

/// A monotonic clock whose epoch is the moment it was created.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    epoch: StdInstant,
}

impl Clock {
    /// A clock that reads zero now.
    pub fn new() -> Self {
        Clock {
            epoch: StdInstant::now(),
        }
    }

    /// The current time as a core instant.
    pub fn now(&self) -> Instant {
        self.at(StdInstant::now())
    }

    /// Sleeps (on the monoio runtime) until this clock reads `at`.
    pub async fn sleep_until(&self, at: Instant) {
        monoio::time::sleep(to_std(at.saturating_duration_since(self.now()))).await;
    }

    /// The std instant this clock's [`Instant::ZERO`] stands for.
    pub fn epoch(&self) -> StdInstant {
        self.epoch
    }

    /// Converts a std instant taken from the same monotonic clock.
    pub fn at(&self, t: StdInstant) -> Instant {
        let micros = t.saturating_duration_since(self.epoch).as_micros();
        Instant::from_micros(u64::try_from(micros).unwrap_or(u64::MAX))
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_is_monotonic_from_zero() {
        let c = Clock::new();
        let a = c.now();
        let b = c.now();
        assert!(b >= a);
        assert_eq!(c.at(c.epoch), Instant::ZERO);
    }
}
