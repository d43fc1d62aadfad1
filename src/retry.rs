//! Capped exponential backoff: the one rule for every retry of the crate.
//!
//! A [`Backoff`] says how delays grow. The engine retries a record a bounded number of
//! attempts, with jitter ([`Backoff::delay`]); client calls and sink writes retry until a
//! deadline ([`Backoff::retries`], [`Retries`]).

use std::time::{Duration, Instant};

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

    /// Delays from `initial`, doubling up to `max`, with no bound on attempts: for retries
    /// bounded by a deadline instead.
    pub const fn capped(initial: Duration, max: Duration) -> Backoff {
        Backoff {
            initial,
            max,
            max_attempts: u32::MAX,
        }
    }

    /// Retries under this backoff, without jitter, each ending before a deadline.
    pub fn retries(self) -> Retries {
        Retries {
            next: self.initial,
            max: self.max,
            attempt: 0,
        }
    }
}

/// Database writes: 50 ms, doubling, at most 2 s.
pub const SINK: Backoff = Backoff::capped(Duration::from_millis(50), Duration::from_secs(2));
/// Transactional client calls: 10 ms, doubling, at most 1 s.
pub const CLIENT_CALL: Backoff = Backoff::capped(Duration::from_millis(10), Duration::from_secs(1));

/// The retries of one operation: each delay doubles up to the cap.
#[derive(Debug, Clone)]
pub struct Retries {
    next: Duration,
    max: Duration,
    attempt: u32,
}

impl Default for Retries {
    fn default() -> Self {
        SINK.retries()
    }
}

impl Retries {
    /// The delay before the next attempt, or `None` when it would end past `deadline`.
    pub fn next_delay(&mut self, deadline: Instant) -> Option<Duration> {
        let delay = self.next;
        if Instant::now() + delay >= deadline {
            return None;
        }
        self.attempt += 1;
        self.next = (self.next * 2).min(self.max);
        Some(delay)
    }

    /// Attempts made so far, after the first.
    pub fn attempt(&self) -> u32 {
        self.attempt
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

    #[test]
    fn backoff_doubles_up_to_its_cap_and_stops_at_the_deadline() {
        let mut b = Retries::default();
        let far = Instant::now() + Duration::from_secs(3600);
        let delays: Vec<u128> = (0..8)
            .map(|_| b.next_delay(far).unwrap().as_millis())
            .collect();
        assert_eq!(delays, vec![50, 100, 200, 400, 800, 1600, 2000, 2000]);
        assert_eq!(b.attempt(), 8);
        assert_eq!(b.next_delay(Instant::now() + Duration::from_secs(1)), None);
    }

    #[test]
    fn client_calls_back_off_from_10_ms_to_1_s() {
        let mut b = CLIENT_CALL.retries();
        let far = Instant::now() + Duration::from_secs(3600);
        let delays: Vec<u128> = (0..9)
            .map(|_| b.next_delay(far).unwrap().as_millis())
            .collect();
        assert_eq!(delays, vec![10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
    }
}
