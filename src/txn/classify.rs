//! The one place that decides what a transaction error means.
//!
//! [`classify`] is a pure function of [`ErrorTraits`], which [`traits_of`] reads off a client
//! error, so every branch is unit-tested without a broker. The four outcomes follow Kafka
//! Streams and librdkafka's own flags (`is_retriable`, `txn_requires_abort`, `is_fatal`).

use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// What the transaction owner does about an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxnAction {
    /// Call the same operation again (after a capped backoff).
    Retry,
    /// Abort the transaction, seek every assigned partition back to its committed offset and
    /// carry on: nothing of the aborted transaction is visible to read_committed readers.
    AbortAndRewind,
    /// The producer is unusable (fenced by a newer instance with the same transactional.id,
    /// or a fatal idempotence error): rebuild it, as [`super::producer::Rebuilds`] allows.
    Fatal,
    /// The consumer's membership was taken by a member with the same `group.instance.id`
    /// (`FENCED_INSTANCE_ID` answering TxnOffsetCommit, an abortable error in librdkafka: the
    /// producer is sound). Abort, and end this incarnation of the job: the fence rule of
    /// [`crate::engine`] decides whether it joins again ([`crate::fence`]).
    Rejoin,
}

/// What an error says about itself, stripped of client types.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ErrorTraits {
    /// The producer instance can no longer be used.
    pub fatal: bool,
    /// Another producer with the same transactional.id took over, or the coordinator bumped
    /// the producer's epoch.
    pub fenced: bool,
    /// Another consumer with the same group.instance.id took the membership.
    pub member_fenced: bool,
    /// The transaction cannot commit and must be aborted.
    pub requires_abort: bool,
    /// The same call may succeed if made again.
    pub retriable: bool,
}

/// Decides what to do; a lost membership wins over everything (the incarnation ends, and a
/// producer rebuilt first would only fence the other member's), fatal over abort, abort over
/// retry. An error that says nothing of itself aborts: the safe choice, since an abort loses
/// nothing.
pub fn classify(traits: ErrorTraits) -> TxnAction {
    if traits.member_fenced {
        TxnAction::Rejoin
    } else if traits.fatal || traits.fenced {
        TxnAction::Fatal
    } else if traits.requires_abort {
        TxnAction::AbortAndRewind
    } else if traits.retriable {
        TxnAction::Retry
    } else {
        TxnAction::AbortAndRewind
    }
}

/// Error codes that mean the producer's identity (its transactional.id and epoch) is no
/// longer its own. `FENCED_INSTANCE_ID` is not one: it is the consumer's identity, and says
/// nothing of the producer ([`TxnAction::Rejoin`]).
pub fn is_fencing_code(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::ProducerFenced
            | RDKafkaErrorCode::Fenced
            | RDKafkaErrorCode::InvalidProducerEpoch
            | RDKafkaErrorCode::TransactionalIdAuthorizationFailed
    )
}

/// Reads the traits of a client error. `producer_fatal` is whether the producer itself
/// reports a fatal error (`rd_kafka_fatal_error`), which can stand behind any other error.
pub fn traits_of(err: &KafkaError, producer_fatal: bool) -> ErrorTraits {
    match err {
        KafkaError::Transaction(e) => ErrorTraits {
            fatal: producer_fatal || e.is_fatal(),
            fenced: is_fencing_code(e.code()),
            member_fenced: e.code() == RDKafkaErrorCode::FencedInstanceId,
            requires_abort: e.txn_requires_abort(),
            retriable: may_call_again(e.code(), e.is_retriable()),
        },
        other => {
            let code = other.rdkafka_error_code();
            ErrorTraits {
                fatal: producer_fatal || code == Some(RDKafkaErrorCode::Fatal),
                fenced: code.is_some_and(is_fencing_code),
                member_fenced: code == Some(RDKafkaErrorCode::FencedInstanceId),
                // A failed delivery, a flush that timed out, a missing group metadata: the
                // transaction cannot be committed as it is.
                requires_abort: true,
                retriable: false,
            }
        }
    }
}

/// Whether a transactional call that failed with `code` may succeed if made again, given
/// librdkafka's own `retriable` flag. A conflict is flagged retriable but is not, here: it
/// says another call is in progress, a commit_transaction that timed out and goes on in the
/// background, which only calling commit_transaction again resumes; an abort asked meanwhile
/// fails the same way each time until its deadline. The producer is rebuilt instead.
pub fn may_call_again(code: RDKafkaErrorCode, retriable: bool) -> bool {
    retriable && code != RDKafkaErrorCode::Conflict
}

/// Whether a consumer request that failed with `err` may succeed if made again: the group
/// coordinator moved or is loading (a broker restarting, a leader moving), a request timed
/// out, the connection dropped, or the client's state is in flux while it finds the new
/// coordinator. The rewind after an abort makes such requests; anything else ends the job.
pub fn retries_call(err: &KafkaError) -> bool {
    err.rdkafka_error_code().is_some_and(|code| {
        matches!(
            code,
            RDKafkaErrorCode::NotCoordinator
                | RDKafkaErrorCode::CoordinatorLoadInProgress
                | RDKafkaErrorCode::CoordinatorNotAvailable
                | RDKafkaErrorCode::RequestTimedOut
                | RDKafkaErrorCode::OperationTimedOut
                | RDKafkaErrorCode::NetworkException
                | RDKafkaErrorCode::BrokerTransportFailure
                | RDKafkaErrorCode::AllBrokersDown
                | RDKafkaErrorCode::State
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(fatal: bool, fenced: bool, requires_abort: bool, retriable: bool) -> ErrorTraits {
        ErrorTraits {
            fatal,
            fenced,
            member_fenced: false,
            requires_abort,
            retriable,
        }
    }

    #[test]
    fn every_combination_of_traits_has_the_expected_action() {
        use TxnAction::*;
        for bits in 0u8..32 {
            let traits = ErrorTraits {
                member_fenced: bits & 16 != 0,
                ..t(bits & 1 != 0, bits & 2 != 0, bits & 4 != 0, bits & 8 != 0)
            };
            let expected = if traits.member_fenced {
                Rejoin
            } else if traits.fatal || traits.fenced {
                Fatal
            } else if traits.requires_abort || !traits.retriable {
                AbortAndRewind
            } else {
                Retry
            };
            assert_eq!(classify(traits), expected, "{traits:?}");
        }
    }

    #[test]
    fn fatal_beats_abort_and_retry() {
        assert_eq!(classify(t(true, false, true, true)), TxnAction::Fatal);
    }

    #[test]
    fn fenced_without_fatal_flag_is_still_fatal() {
        assert_eq!(classify(t(false, true, false, true)), TxnAction::Fatal);
    }

    #[test]
    fn abort_beats_retry() {
        assert_eq!(
            classify(t(false, false, true, true)),
            TxnAction::AbortAndRewind
        );
    }

    #[test]
    fn retriable_alone_retries() {
        assert_eq!(classify(t(false, false, false, true)), TxnAction::Retry);
    }

    #[test]
    fn an_error_that_says_nothing_aborts() {
        assert_eq!(classify(ErrorTraits::default()), TxnAction::AbortAndRewind);
    }

    #[test]
    fn delivery_failure_aborts() {
        let err = KafkaError::MessageProduction(RDKafkaErrorCode::MessageTimedOut);
        assert_eq!(classify(traits_of(&err, false)), TxnAction::AbortAndRewind);
    }

    #[test]
    fn delivery_failure_on_a_fatally_failed_producer_is_fatal() {
        let err = KafkaError::MessageProduction(RDKafkaErrorCode::MessageTimedOut);
        assert_eq!(classify(traits_of(&err, true)), TxnAction::Fatal);
    }

    #[test]
    fn fencing_codes_are_fatal_whatever_wraps_them() {
        for code in [
            RDKafkaErrorCode::ProducerFenced,
            RDKafkaErrorCode::Fenced,
            RDKafkaErrorCode::InvalidProducerEpoch,
        ] {
            let err = KafkaError::MessageProduction(code);
            assert_eq!(
                classify(traits_of(&err, false)),
                TxnAction::Fatal,
                "{code:?}"
            );
        }
        assert!(!is_fencing_code(
            RDKafkaErrorCode::CoordinatorLoadInProgress
        ));
    }

    /// librdkafka answers a TxnOffsetCommit refused with FENCED_INSTANCE_ID with an abortable
    /// error (rdkafka_txnmgr.c, rd_kafka_txn_handle_TxnOffsetCommit): the consumer's
    /// membership is gone, the producer is sound. Counted as a producer fence, one takeover by
    /// another process would count twice (this and the other's producer) and could stop both.
    #[test]
    fn a_membership_taken_by_another_member_ends_the_incarnation_and_is_not_a_producer_fence() {
        let err = KafkaError::Global(RDKafkaErrorCode::FencedInstanceId);
        let traits = traits_of(&err, false);
        assert!(!traits.fenced && traits.member_fenced, "{traits:?}");
        assert_eq!(classify(traits), TxnAction::Rejoin);
        let err = KafkaError::MessageProduction(RDKafkaErrorCode::FencedInstanceId);
        assert_eq!(classify(traits_of(&err, true)), TxnAction::Rejoin);
        assert!(!is_fencing_code(RDKafkaErrorCode::FencedInstanceId));
    }

    #[test]
    fn a_conflicting_call_in_progress_is_not_retried() {
        assert!(!may_call_again(RDKafkaErrorCode::Conflict, true));
        assert!(may_call_again(RDKafkaErrorCode::OperationTimedOut, true));
        assert!(!may_call_again(RDKafkaErrorCode::OperationTimedOut, false));
    }

    #[test]
    fn a_moving_group_coordinator_is_retried_by_the_rewind() {
        for err in [
            KafkaError::MetadataFetch(RDKafkaErrorCode::NotCoordinator),
            KafkaError::OffsetFetch(RDKafkaErrorCode::State),
            KafkaError::OffsetFetch(RDKafkaErrorCode::CoordinatorLoadInProgress),
            KafkaError::OffsetFetch(RDKafkaErrorCode::CoordinatorNotAvailable),
            KafkaError::OffsetFetch(RDKafkaErrorCode::RequestTimedOut),
        ] {
            assert!(retries_call(&err), "{err:?}");
        }
    }

    #[test]
    fn other_consumer_errors_end_the_rewind() {
        for err in [
            KafkaError::OffsetFetch(RDKafkaErrorCode::GroupAuthorizationFailed),
            KafkaError::OffsetFetch(RDKafkaErrorCode::UnknownTopicOrPartition),
            KafkaError::OffsetFetch(RDKafkaErrorCode::FencedInstanceId),
            KafkaError::Seek("no such partition".into()),
        ] {
            assert!(!retries_call(&err), "{err:?}");
        }
    }
}
