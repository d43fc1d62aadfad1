//! Capped exponential backoff with jitter, for transient failures of a record.

use std::time::Duration;

/// How transient failures are retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// Delay before the second attempt.
    pub initial: Duration,
    /// No delay is longer than this.
    pub max: Duration,
    /// Attempts in all, the first included.
    pub max_attempts: u32,
}

impl Backoff {
    /// The delay before attempt `attempt + 1`, after `attempt` failed attempts (1-based):
    /// `initial * 2^(attempt-1)` capped at `max`, then drawn uniformly from its upper half
    /// (`unit` in [0, 1)) so that instances failing together do not retry together.
    pub fn delay(&self, attempt: u32, unit: f64) -> Duration {
        let exp = attempt.saturating_sub(1).min(30);
        let full = self
            .initial
            .saturating_mul(1u32 << exp)
            .min(self.max)
            .as_secs_f64();
        Duration::from_secs_f64(full * (0.5 + 0.5 * unit.clamp(0.0, 1.0)))
    }

    /// Whether another attempt is allowed after `attempt` failed ones.
    pub fn may_retry(&self, attempt: u32) -> bool {
        attempt < self.max_attempts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b() -> Backoff {
        Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(2),
            max_attempts: 3,
        }
    }

    #[test]
    fn delays_double_until_the_cap() {
        let top: Vec<u128> = (1..=8).map(|a| b().delay(a, 1.0).as_millis()).collect();
        assert_eq!(top, vec![100, 200, 400, 800, 1600, 2000, 2000, 2000]);
    }

    #[test]
    fn jitter_stays_in_the_upper_half() {
        for attempt in 1..10 {
            let full = b().delay(attempt, 1.0);
            let low = b().delay(attempt, 0.0);
            assert_eq!(low, full / 2);
            for unit in [0.1, 0.5, 0.99] {
                let d = b().delay(attempt, unit);
                assert!(d >= low && d <= full, "{attempt} {unit} {d:?}");
            }
        }
    }

    #[test]
    fn huge_attempt_numbers_do_not_overflow() {
        assert_eq!(b().delay(u32::MAX, 1.0), Duration::from_secs(2));
    }

    #[test]
    fn attempts_are_bounded() {
        assert!(b().may_retry(1));
        assert!(b().may_retry(2));
        assert!(!b().may_retry(3));
    }
}
