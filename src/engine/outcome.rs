//! What to do with a processed record: a pure decision, unit-tested case by case; the loop
//! in [`super`] only carries it out.
//!
//! The inputs are plain values: what processing the record gave (its outputs, or the failure
//! that stopped it: the pipeline's, a size check's, a sink's refusal), how many attempts it
//! has had, and the topology's policy (`runtime.on_error`, `runtime.on_exhausted`, the
//! retry backoff).

use std::time::Duration;

use crate::record::RecordError;
use crate::retry::Backoff;
use crate::topology::{OnError, OnExhausted};

/// The topology's rules for failed records.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    pub on_error: OnError,
    pub on_exhausted: OnExhausted,
    pub backoff: Backoff,
}

/// What the loop does with the record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Write its outputs (they are staged in the sinks already) with its offset.
    Output,
    /// A transient failure with attempts left: commit what is open (the transaction is not
    /// held open while waiting), wait `delay`, process the record again.
    Retry { delay: Duration },
    /// Write the original record to the dead-letter topic, with its offset, in the open
    /// transaction.
    DeadLetter(RecordError),
    /// Commit what is open, stop fetching the record's partition and seek it back to the
    /// record, to try it again after `for_`.
    Pause { for_: Duration },
    /// Abort the open transaction and stop the job naming the record: its offset is never
    /// committed, nothing is lost.
    Fail(RecordError),
    /// Commit its offset without any output (logged and counted).
    Skip(RecordError),
}

/// Decides what becomes of a record after its `attempt`-th attempt (1-based) gave `result`.
/// `jitter` draws a number in [0, 1) that spreads the retries of instances failing together;
/// it is called only for a retry, so the common path draws nothing.
pub fn decide(
    result: Result<(), &RecordError>,
    attempt: u32,
    policy: &Policy,
    jitter: impl FnOnce() -> f64,
) -> Outcome {
    let error = match result {
        Ok(()) => return Outcome::Output,
        Err(e) => e,
    };
    // A record waiting on the schema registry holds its partition at once, rather than being
    // retried in the loop: the other partitions flow while the registry is asked in the
    // background (crate::codec::registry).
    if error.kind.holds_partition() {
        return Outcome::Pause {
            for_: policy.backoff.max,
        };
    }
    if !error.is_permanent() {
        if policy.backoff.may_retry(attempt) {
            return Outcome::Retry {
                delay: policy.backoff.delay(attempt, jitter()),
            };
        }
        if policy.on_exhausted == OnExhausted::Pause {
            return Outcome::Pause {
                for_: policy.backoff.max,
            };
        }
    }
    match policy.on_error {
        OnError::DeadLetter => Outcome::DeadLetter(error.clone()),
        OnError::Fail => Outcome::Fail(error.clone()),
        OnError::Skip => Outcome::Skip(error.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{ErrorKind, Stage};

    fn policy(on_error: OnError, on_exhausted: OnExhausted) -> Policy {
        Policy {
            on_error,
            on_exhausted,
            backoff: Backoff {
                initial: Duration::from_millis(100),
                max: Duration::from_secs(2),
                max_attempts: 3,
            },
        }
    }

    fn error(kind: ErrorKind) -> RecordError {
        RecordError {
            kind,
            stage: Stage::Decode,
            message: "m".into(),
        }
    }

    const ON_ERROR: [OnError; 3] = [OnError::DeadLetter, OnError::Fail, OnError::Skip];
    const ON_EXHAUSTED: [OnExhausted; 2] = [OnExhausted::DeadLetter, OnExhausted::Pause];

    fn as_on_error(on_error: OnError, e: &RecordError) -> Outcome {
        match on_error {
            OnError::DeadLetter => Outcome::DeadLetter(e.clone()),
            OnError::Fail => Outcome::Fail(e.clone()),
            OnError::Skip => Outcome::Skip(e.clone()),
        }
    }

    /// Every policy, every result kind, every attempt: the whole matrix.
    #[test]
    fn the_whole_matrix() {
        let permanent = error(ErrorKind::BadJson);
        let transient = error(ErrorKind::Unavailable);
        for on_error in ON_ERROR {
            for on_exhausted in ON_EXHAUSTED {
                let p = policy(on_error, on_exhausted);
                for attempt in 1..=4 {
                    let what = format!("{on_error:?} {on_exhausted:?} attempt {attempt}");
                    // Success always writes the outputs.
                    assert_eq!(
                        decide(Ok(()), attempt, &p, || 0.5),
                        Outcome::Output,
                        "{what}"
                    );
                    // A permanent failure goes the way on_error says, at once.
                    assert_eq!(
                        decide(Err(&permanent), attempt, &p, || 0.5),
                        as_on_error(on_error, &permanent),
                        "{what}"
                    );
                    // A transient one is retried while attempts are left, then paused or
                    // handled as on_error says.
                    let expected = if attempt < 3 {
                        Outcome::Retry {
                            delay: p.backoff.delay(attempt, 0.5),
                        }
                    } else if on_exhausted == OnExhausted::Pause {
                        Outcome::Pause {
                            for_: Duration::from_secs(2),
                        }
                    } else {
                        as_on_error(on_error, &transient)
                    };
                    assert_eq!(
                        decide(Err(&transient), attempt, &p, || 0.5),
                        expected,
                        "{what}"
                    );
                }
            }
        }
    }

    #[test]
    fn every_error_kind_is_retried_only_when_transient() {
        let p = policy(OnError::DeadLetter, OnExhausted::DeadLetter);
        for kind in [
            ErrorKind::BadJson,
            ErrorKind::MissingField,
            ErrorKind::WrongType,
            ErrorKind::Expression,
            ErrorKind::TooLarge,
            ErrorKind::Rejected,
            ErrorKind::SequenceGap,
        ] {
            assert_eq!(
                decide(Err(&error(kind)), 1, &p, || 0.0),
                Outcome::DeadLetter(error(kind)),
                "{kind:?}"
            );
        }
        assert!(matches!(
            decide(Err(&error(ErrorKind::Unavailable)), 1, &p, || 0.0),
            Outcome::Retry { .. }
        ));
    }

    #[test]
    fn retry_delays_grow_with_the_attempt_and_carry_jitter() {
        let p = policy(OnError::DeadLetter, OnExhausted::DeadLetter);
        let e = error(ErrorKind::Unavailable);
        assert_eq!(
            decide(Err(&e), 1, &p, || 0.0),
            Outcome::Retry {
                delay: Duration::from_millis(50)
            }
        );
        assert_eq!(
            decide(Err(&e), 2, &p, || 0.999_999),
            Outcome::Retry {
                delay: p.backoff.delay(2, 0.999_999)
            }
        );
    }

    #[test]
    fn a_single_attempt_policy_never_retries() {
        let mut p = policy(OnError::Skip, OnExhausted::DeadLetter);
        p.backoff.max_attempts = 1;
        let e = error(ErrorKind::Unavailable);
        assert_eq!(decide(Err(&e), 1, &p, || 0.0), Outcome::Skip(e));
    }

    #[test]
    fn a_record_waiting_on_the_registry_holds_its_partition_at_once_under_every_policy() {
        let e = error(ErrorKind::RegistryUnavailable);
        for on_error in ON_ERROR {
            for on_exhausted in ON_EXHAUSTED {
                let p = policy(on_error, on_exhausted);
                for attempt in [1, 3] {
                    assert_eq!(
                        decide(Err(&e), attempt, &p, || 0.0),
                        Outcome::Pause {
                            for_: Duration::from_secs(2)
                        },
                        "{on_error:?} {on_exhausted:?}"
                    );
                }
            }
        }
    }
}
