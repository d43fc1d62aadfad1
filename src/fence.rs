//! When a fenced consumer joins again and a fenced producer is rebuilt: one rule for both.
//!
//! A fence does not say who caused it. The codes (`FENCED_INSTANCE_ID` for the consumer;
//! `PRODUCER_FENCED`, `INVALID_PRODUCER_EPOCH` and librdkafka's local `_FENCED` for the
//! producer, all flagged fatal by librdkafka) come back alike from three causes:
//!
//! - another live process took the identity (a second instance started with the same id, or
//!   the replacement of a frozen one): the one case where the fenced process should yield;
//! - the transaction coordinator bumped the epoch itself: it aborts a transaction that
//!   outlived `transaction_timeout_ms` with an epoch bump (KIP-588 says the old producer then
//!   sees `PRODUCER_FENCED` "even though a conflicting producer doesn't exist"), and
//!   librdkafka bumps it after messages timed out in flight (`_TIMED_OUT, requires epoch
//!   bump`), both of which a broker failover brings about;
//! - a failover of the group coordinator: a static member whose session timed out against a
//!   dead coordinator rejoins under its instance id and is answered `FENCED_INSTANCE_ID` for
//!   its own previous membership, with no other process holding the id.
//!
//! Only the first is a reason to stop, and it is settled elsewhere: a process frozen past its
//! session timeout (the zombie, the only way an old incarnation comes back) ends itself the
//! moment it runs again ([`crate::supervise`]). What is left of the first cause is two live
//! processes sharing an id by mistake, which take it from each other every few seconds. So a
//! fence is recovered from (the consumer joins again, the producer is rebuilt with the same
//! `transactional.id`) unless the previous one was less than [`FENCE_WINDOW`] ago: the
//! failovers are cured, and of two live processes sharing an id the one fenced twice in a row
//! stops, with status 1, naming the id.

use std::time::{Duration, Instant};

/// The shortest time between two fences that are both recovered from. Two live processes
/// sharing an id fence each other within seconds (a rejoin fences the other member at its
/// next heartbeat or commit; a rebuilt producer fences the other at its next transactional
/// call); two broker failovers are minutes apart.
pub const FENCE_WINDOW: Duration = Duration::from_secs(30);

/// The fences of one identity (the consumer's instance id, or the producer's
/// transactional.id) in the life of the process.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Fences {
    /// When the last fence recovered from happened.
    last: Option<Instant>,
}

impl Fences {
    /// Whether a fence seen at `now` may be recovered from; if so, counts it.
    pub fn recover(&mut self, now: Instant) -> bool {
        let allowed = self
            .last
            .is_none_or(|last| now.saturating_duration_since(last) >= FENCE_WINDOW);
        if allowed {
            self.last = Some(now);
        }
        allowed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fences_far_apart_are_all_recovered_from() {
        let start = Instant::now();
        let mut f = Fences::default();
        assert!(f.recover(start), "the first fence");
        assert!(f.recover(start + FENCE_WINDOW), "one window later");
        assert!(
            f.recover(start + FENCE_WINDOW * 2 + Duration::from_secs(40)),
            "a failover minutes later"
        );
    }

    #[test]
    fn a_fence_within_the_window_of_the_last_one_stops() {
        let start = Instant::now();
        let mut f = Fences::default();
        assert!(f.recover(start));
        assert!(
            !f.recover(start + Duration::from_secs(3)),
            "two live processes taking the id from each other"
        );
        assert!(!f.recover(start + FENCE_WINDOW - Duration::from_millis(1)));
    }

    #[test]
    fn a_refused_fence_does_not_move_the_window() {
        let start = Instant::now();
        let mut f = Fences::default();
        assert!(f.recover(start));
        assert!(!f.recover(start + Duration::from_secs(20)));
        assert!(
            f.recover(start + FENCE_WINDOW),
            "counted from the last fence recovered from"
        );
    }
}
