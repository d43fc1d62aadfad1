//! When a fenced consumer joins again and a fenced producer is rebuilt: the consumer's rule
//! decides which of two processes sharing an id stops, the producer's only bounds rebuilds.
//!
//! A fence does not say who caused it. The codes (`FENCED_INSTANCE_ID` for the consumer;
//! `PRODUCER_FENCED`, `INVALID_PRODUCER_EPOCH` and librdkafka's local `_FENCED` for the
//! producer, all fatal to the client that meets them; `FENCED_INSTANCE_ID` answering a
//! TxnOffsetCommit is only abortable to the producer) come back alike from three causes:
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
//! processes sharing an id by mistake, which take it from each other every few seconds.
//!
//! One identity decides, so that exactly one of two such processes stops: the consumer's.
//! Static membership lets one member hold a `group.instance.id` at a time, and a member takes
//! it only by joining, so the takeovers form one chain: B joins (A fenced once), A joins again
//! (B fenced once), B joins again (A fenced twice: A stops). A consumer fence is recovered
//! from (this incarnation ends, a new one joins) unless the previous one was less than
//! [`FENCE_WINDOW`] ago ([`CONSUMER_FENCES`]). A fence that follows the consumer's own session
//! timeout is the third cause, and is recovered from without being counted
//! ([`ConsumerEnd::FencedAfterSessionTimeout`]): the replacement of a zombie, fenced once by
//! the zombie's join, must not stop when the group coordinator's broker fails a few seconds
//! later. Two live processes sharing an id keep their sessions, so their fences still count.
//! The producer's fences do not take part: every
//! join brings a new producer with it (a new incarnation) and every rebuild fences the other
//! producer, so counted the same way one takeover would fence the survivor twice and could
//! stop both. A fenced producer is rebuilt after [`REBUILD_AFTER_FENCE`], up to
//! [`PRODUCER_FENCES`] times a window: a bound for a process whose consumer keeps its
//! membership while another takes the transactional.id (under KIP-848 a second member with
//! the id is refused, UNRELEASED_INSTANCE_ID, and its retries fence the producer of the
//! first), not the tie-breaker.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use rdkafka::types::RDKafkaErrorCode;

/// The span over which fences are counted. Two live processes sharing an id fence each other
/// within seconds (a rejoin fences the other member at its next heartbeat or commit; a
/// rebuilt producer fences the other at its next transactional call); two broker failovers
/// are minutes apart.
pub const FENCE_WINDOW: Duration = Duration::from_secs(30);

/// Consumer fences recovered from within one [`FENCE_WINDOW`]: one, the tie-breaker.
pub const CONSUMER_FENCES: usize = 1;

/// Producer fences recovered from within one [`FENCE_WINDOW`]. A takeover of the consumer's
/// membership ends in a few seconds with one process left, fencing the other's producer a
/// few times meanwhile (at most one rebuild a [`REBUILD_AFTER_FENCE`]); a process whose
/// producer is fenced every few seconds while its membership stands (a second process
/// refused the membership and retrying) stops after this many.
pub const PRODUCER_FENCES: usize = 6;

/// How long a fenced producer waits before it is rebuilt: two processes rebuilding in turn
/// fence each other at most once a second, so the consumer's fence, which decides (at the
/// next heartbeat, or the next commit's TxnOffsetCommit), comes within a few rebuilds.
pub const REBUILD_AFTER_FENCE: Duration = Duration::from_secs(1);

/// The fences of one identity: the consumer's instance id over the life of the process, or
/// the producer's transactional.id over one incarnation (its producer and rebuilds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fences {
    /// How many fences a window may hold and all be recovered from.
    limit: usize,
    /// When the fences recovered from within the last window happened, oldest first.
    recent: VecDeque<Instant>,
}

impl Fences {
    /// Fences of which `limit` within one [`FENCE_WINDOW`] are recovered from.
    pub fn at_most(limit: usize) -> Fences {
        Fences {
            limit,
            recent: VecDeque::with_capacity(limit),
        }
    }

    /// Whether a fence seen at `now` may be recovered from; if so, counts it. A fence refused
    /// is not counted.
    pub fn recover(&mut self, now: Instant) -> bool {
        while self
            .recent
            .front()
            .is_some_and(|&t| now.saturating_duration_since(t) >= FENCE_WINDOW)
        {
            self.recent.pop_front();
        }
        let allowed = self.recent.len() < self.limit;
        if allowed {
            self.recent.push_back(now);
        }
        allowed
    }
}

/// How long a job refused for an instance id still held waits for it, in all: longer than
/// any session timeout of a previous incarnation (the broker's default is 45 s).
pub const INSTANCE_ID_WAIT: Duration = Duration::from_secs(120);
/// How often a refused job asks again for its instance id.
pub const INSTANCE_ID_RETRY: Duration = Duration::from_secs(2);
/// How long a fenced instance waits before joining again: the zombie that fenced it ends
/// itself within moments of waking.
pub const FENCED_REJOIN_AFTER: Duration = Duration::from_secs(1);

/// What a process does after an incarnation of its job ended on a fatal error of its
/// consumer: the rules of `engine::run`, apart from its clock and its sleeps.
///
/// `FENCED_INSTANCE_ID` comes from a member that joined with this instance's id (a woken
/// zombie whose stall watch has not ended it yet, gone a moment later; a second live process
/// with the id) or from a failover of the group coordinator (this member's own rejoin): join
/// again, within the consumer's fence rule ([`CONSUMER_FENCES`]). Under the KIP-848 protocol a
/// member that joins with the instance id of a member whose session has not expired (this
/// instance's previous incarnation, killed a moment ago) is refused with
/// `UNRELEASED_INSTANCE_ID`: join again until the old session expires, but only while the
/// process has consumed nothing, in any incarnation. One refused after consuming is a
/// process whose place was taken, and stops.
#[derive(Debug, Clone)]
pub struct Rejoins {
    fences: Fences,
    /// Until when a refused instance id is waited for.
    deadline: Instant,
    /// Whether any incarnation of this process has consumed a record.
    consumed: bool,
}

/// The next step after an incarnation ended on a consumer's fatal error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Fenced: join again after this long.
    Rejoin(Duration),
    /// Refused for an instance id still held: ask again after this long.
    WaitForId(Duration),
    /// Fenced again within the window: the other process keeps the id.
    FencedAgain,
    /// Stop with the error.
    Stop,
}

impl Rejoins {
    /// The rules for a process started at `started`.
    pub fn new(started: Instant) -> Rejoins {
        Rejoins {
            fences: Fences::at_most(CONSUMER_FENCES),
            deadline: started + INSTANCE_ID_WAIT,
            consumed: false,
        }
    }

    /// After an incarnation whose consumer ended as `error` at `now`; `consumed` says whether
    /// that incarnation consumed a record.
    pub fn after(&mut self, error: ConsumerEnd, consumed: bool, now: Instant) -> Next {
        self.consumed |= consumed;
        match error {
            ConsumerEnd::Fenced if self.fences.recover(now) => Next::Rejoin(FENCED_REJOIN_AFTER),
            ConsumerEnd::Fenced => Next::FencedAgain,
            ConsumerEnd::FencedAfterSessionTimeout => Next::Rejoin(FENCED_REJOIN_AFTER),
            ConsumerEnd::Refused if !self.consumed && now < self.deadline => {
                Next::WaitForId(INSTANCE_ID_RETRY)
            }
            ConsumerEnd::Refused | ConsumerEnd::Other => Next::Stop,
        }
    }
}

/// How long after the consumer's own session timed out a fence is taken for a fence of its
/// own expired membership. librdkafka times the session out itself when no heartbeat got an
/// answer for `session.timeout.ms` (its coordinator's broker is gone), forgets its member id
/// and joins again; the requests of the old membership that reach the new coordinator are
/// answered `FENCED_INSTANCE_ID` within moments of the rejoin, which waits for the new
/// coordinator to be found (seconds).
pub const OWN_SESSION_FENCE: Duration = Duration::from_secs(30);

/// What `engine::run` learns of an incarnation of the job beside its result.
#[derive(Debug, Default)]
pub struct Incarnation {
    /// Whether it consumed a record.
    pub consumed: bool,
    /// When its consumer's session last timed out (librdkafka's own timeout, with no answer
    /// from the group coordinator for `session.timeout.ms`).
    pub session_timed_out: Option<Instant>,
}

impl Incarnation {
    /// How its consumer ended, at `now`, on the fatal error `code`.
    pub fn end(&self, code: RDKafkaErrorCode, now: Instant) -> ConsumerEnd {
        let since = self
            .session_timed_out
            .map(|t| now.saturating_duration_since(t));
        ConsumerEnd::of(code, since)
    }
}

/// How an incarnation's consumer ended, as [`Rejoins`] tells them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConsumerEnd {
    /// `FENCED_INSTANCE_ID`.
    Fenced,
    /// `FENCED_INSTANCE_ID` within [`OWN_SESSION_FENCE`] of the consumer's own session
    /// timeout: the fence of its own previous membership, which a failover of the group
    /// coordinator brings about. No other process need hold the id, so it is not counted.
    FencedAfterSessionTimeout,
    /// `UNRELEASED_INSTANCE_ID`.
    Refused,
    /// Any other fatal error.
    Other,
}

impl ConsumerEnd {
    /// The end a consumer's fatal error `code` means; `since_session_timeout` is how long
    /// before it the consumer's session last timed out, if it did.
    pub fn of(code: RDKafkaErrorCode, since_session_timeout: Option<Duration>) -> ConsumerEnd {
        match code {
            RDKafkaErrorCode::FencedInstanceId
                if since_session_timeout.is_some_and(|d| d <= OWN_SESSION_FENCE) =>
            {
                ConsumerEnd::FencedAfterSessionTimeout
            }
            RDKafkaErrorCode::FencedInstanceId => ConsumerEnd::Fenced,
            RDKafkaErrorCode::UnreleasedInstanceId => ConsumerEnd::Refused,
            _ => ConsumerEnd::Other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fences_far_apart_are_all_recovered_from() {
        let start = Instant::now();
        let mut f = Fences::at_most(CONSUMER_FENCES);
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
        let mut f = Fences::at_most(CONSUMER_FENCES);
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
        let mut f = Fences::at_most(CONSUMER_FENCES);
        assert!(f.recover(start));
        assert!(!f.recover(start + Duration::from_secs(20)));
        assert!(
            f.recover(start + FENCE_WINDOW),
            "counted from the last fence recovered from"
        );
    }

    #[test]
    fn a_larger_limit_recovers_that_many_fences_a_window() {
        let start = Instant::now();
        let mut f = Fences::at_most(3);
        let s = Duration::from_secs;
        assert!(f.recover(start));
        assert!(f.recover(start + s(2)));
        assert!(f.recover(start + s(4)));
        assert!(!f.recover(start + s(6)), "a fourth within the window");
        assert!(f.recover(start + s(30)), "the first has left the window");
        assert!(!f.recover(start + s(31)));
        assert!(f.recover(start + s(34)), "so have the second and the third");
    }

    #[test]
    fn a_process_that_never_consumed_waits_for_its_id_until_the_deadline() {
        let start = Instant::now();
        let mut r = Rejoins::new(start);
        let s = Duration::from_secs;
        assert_eq!(
            r.after(ConsumerEnd::Refused, false, start + s(1)),
            Next::WaitForId(INSTANCE_ID_RETRY)
        );
        assert_eq!(
            r.after(ConsumerEnd::Refused, false, start + s(100)),
            Next::WaitForId(INSTANCE_ID_RETRY)
        );
        assert_eq!(
            r.after(ConsumerEnd::Refused, false, start + INSTANCE_ID_WAIT),
            Next::Stop,
            "the old session should have expired long before"
        );
    }

    #[test]
    fn a_process_refused_after_it_consumed_stops_at_once() {
        let start = Instant::now();
        let mut r = Rejoins::new(start);
        assert_eq!(
            r.after(ConsumerEnd::Refused, true, start + Duration::from_secs(5)),
            Next::Stop
        );
    }

    /// An incarnation that joins again after a fence starts from nothing, but the process
    /// behind it has consumed: refused then, it is a process whose place was taken.
    #[test]
    fn what_a_process_consumed_counts_over_every_incarnation() {
        let start = Instant::now();
        let mut r = Rejoins::new(start);
        let s = Duration::from_secs;
        assert_eq!(
            r.after(ConsumerEnd::Fenced, true, start + s(30)),
            Next::Rejoin(FENCED_REJOIN_AFTER)
        );
        assert_eq!(
            r.after(ConsumerEnd::Refused, false, start + s(32)),
            Next::Stop,
            "the rejoined incarnation consumed nothing, the process did"
        );
    }

    #[test]
    fn a_second_fence_within_the_window_stops_and_other_errors_stop_at_once() {
        let start = Instant::now();
        let mut r = Rejoins::new(start);
        let s = Duration::from_secs;
        assert_eq!(r.after(ConsumerEnd::Other, false, start), Next::Stop);
        assert_eq!(
            r.after(ConsumerEnd::Fenced, false, start + s(1)),
            Next::Rejoin(FENCED_REJOIN_AFTER)
        );
        assert_eq!(
            r.after(ConsumerEnd::Fenced, false, start + s(4)),
            Next::FencedAgain
        );
        assert_eq!(
            r.after(ConsumerEnd::Fenced, false, start + s(1) + FENCE_WINDOW),
            Next::Rejoin(FENCED_REJOIN_AFTER),
            "a failover a window later"
        );
    }

    #[test]
    fn a_fence_of_the_consumers_own_expired_session_is_not_counted() {
        let start = Instant::now();
        let mut r = Rejoins::new(start);
        let s = Duration::from_secs;
        assert_eq!(
            r.after(ConsumerEnd::Fenced, true, start),
            Next::Rejoin(FENCED_REJOIN_AFTER),
            "a zombie's join fences its replacement"
        );
        assert_eq!(
            r.after(ConsumerEnd::FencedAfterSessionTimeout, true, start + s(25)),
            Next::Rejoin(FENCED_REJOIN_AFTER),
            "the group coordinator's broker fails over 25 s later"
        );
        assert_eq!(
            r.after(ConsumerEnd::Fenced, true, start + s(28)),
            Next::FencedAgain,
            "a fence of another process still counts against the first"
        );
    }

    #[test]
    fn a_fence_is_of_the_own_session_only_soon_after_the_session_timed_out() {
        let fenced = RDKafkaErrorCode::FencedInstanceId;
        assert_eq!(
            ConsumerEnd::of(fenced, Some(Duration::ZERO)),
            ConsumerEnd::FencedAfterSessionTimeout
        );
        assert_eq!(
            ConsumerEnd::of(fenced, Some(OWN_SESSION_FENCE)),
            ConsumerEnd::FencedAfterSessionTimeout
        );
        assert_eq!(
            ConsumerEnd::of(fenced, Some(OWN_SESSION_FENCE + Duration::from_millis(1))),
            ConsumerEnd::Fenced,
            "a session that timed out long before says nothing of this fence"
        );
        assert_eq!(ConsumerEnd::of(fenced, None), ConsumerEnd::Fenced);
        assert_eq!(
            ConsumerEnd::of(RDKafkaErrorCode::UnreleasedInstanceId, Some(Duration::ZERO)),
            ConsumerEnd::Refused
        );
        assert_eq!(
            ConsumerEnd::of(
                RDKafkaErrorCode::BrokerTransportFailure,
                Some(Duration::ZERO)
            ),
            ConsumerEnd::Other
        );
    }
}
