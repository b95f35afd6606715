//! Converts the operating system's monotonic clock into core [`Instant`]s.

use std::time::Instant as StdInstant;

use skiff_core::time::Instant;

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
