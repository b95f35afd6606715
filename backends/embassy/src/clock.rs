//! Converts embassy-time ticks (already in microseconds here) into core instants.

use skiff_core::time::Instant;

/// Converts a microsecond count from the board's time driver into a core instant.
pub const fn instant_from_micros(micros: u64) -> Instant {
    Instant::from_micros(micros)
}
