//! Converts between embassy-time and the core's time values (both microsecond counts
//! since the board's time driver started).
//!
//! The core reads no clock: time is a value the backend passes in, and this module is
//! where the backend reads it.

use skiff_core::time::Instant;

/// Converts a microsecond count from the board's time driver into a core instant.
pub const fn instant_from_micros(micros: u64) -> Instant {
    Instant::from_micros(micros)
}

/// The current time of the embassy-time driver, as a core instant.
pub fn now() -> Instant {
    instant_from_micros(embassy_time::Instant::now().as_micros())
}

/// The embassy-time instant of a core instant (for `Timer::at`).
pub fn to_embassy(instant: Instant) -> embassy_time::Instant {
    embassy_time::Instant::from_micros(instant.as_micros())
}

#[cfg(test)]
mod tests {
    use super::*;

    // ---- conversions ----

    #[test]
    fn instants_round_trip_through_embassy() {
        let t = instant_from_micros(1_234_567);
        assert_eq!(to_embassy(t).as_micros(), 1_234_567);
    }
}
