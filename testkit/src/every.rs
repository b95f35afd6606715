//! A period that comes round while a load generator waits: when to print
//! its next progress line.

use std::time::{Duration, Instant};

/// Due every `period` from a start; never due without a period.
#[derive(Debug, Clone, Copy)]
pub struct Every {
    period: Option<Duration>,
    next: Option<Instant>,
}

impl Every {
    /// Due every `seconds` after `from`; `seconds` of 0 or less: never.
    pub fn new(seconds: f64, from: Instant) -> Every {
        let period = (seconds > 0.0).then(|| Duration::from_secs_f64(seconds));
        Every {
            period,
            next: period.map(|p| from + p),
        }
    }

    /// True if it has a period.
    pub fn is_on(&self) -> bool {
        self.period.is_some()
    }

    /// True once the next time has come, which then moves a period on.
    pub fn due(&mut self) -> bool {
        match (self.next, self.period) {
            (Some(at), Some(p)) if Instant::now() >= at => {
                self.next = Some(at + p);
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn due_once_per_period_and_never_without_one() {
        let start = Instant::now() - Duration::from_millis(2500);
        let mut every = Every::new(1.0, start);
        assert!(every.is_on());
        // Two periods have passed: due twice, then not until the third.
        assert!(every.due());
        assert!(every.due());
        assert!(!every.due());
        let mut never = Every::new(0.0, start);
        assert!(!never.is_on());
        assert!(!never.due());
    }
}
