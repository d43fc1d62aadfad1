//! What follows a transaction that cannot commit: the classifier's decision on its error,
//! the abort, the rewind of the consumer to the committed offsets, and the rebuild of a
//! producer that failed fatally.

use std::time::Instant;

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::producer::Producer as _;
use rdkafka::{Offset, TopicPartitionList};

use super::overlap::Keep;
use super::{Committed, Txn};
use crate::retry;
use crate::telemetry;
use crate::txn::classify::{TxnAction, classify, retries_call, traits_of};
use crate::txn::collector;
use crate::txn::{AbortReason, TxnError};

impl Txn {
    /// Applies the classifier's decision to an error of the open transaction.
    pub(super) fn fail<C: ConsumerContext>(
        &mut self,
        consumer: &BaseConsumer<C>,
        err: KafkaError,
        reason: AbortReason,
    ) -> Result<(), TxnError> {
        match classify(traits_of(&err, self.producer.is_fatal())) {
            TxnAction::Retry | TxnAction::AbortAndRewind => {
                self.abort_and_rewind(consumer, reason, &err.to_string())
            }
            TxnAction::Fatal => self.rebuild(consumer, err),
            TxnAction::Rejoin => {
                self.abort_for_rejoin(consumer, reason, &err.to_string());
                Err(TxnError::MemberFenced { error: err })
            }
        }
    }

    /// Aborts the open transaction (nothing of it becomes visible) and rewinds the consumer.
    /// A commit running in the background is settled first: what it committed stays, what
    /// was held meanwhile is aborted with the rest.
    pub fn abort_and_rewind<C: ConsumerContext>(
        &mut self,
        consumer: &BaseConsumer<C>,
        reason: AbortReason,
        detail: &str,
    ) -> Result<(), TxnError> {
        // What committed in the background stays committed; what was held since is dropped
        // and rewound with the rest.
        if self.settle(consumer, Keep::Nothing)? == Committed::Aborted {
            return Ok(());
        }
        if self.open
            && let Err(err) = self.abort_open(reason, detail)
        {
            return self.rebuild(consumer, err);
        }
        self.rewind(consumer)?;
        self.reset();
        Ok(())
    }

    /// Aborts the open transaction on the producer, its deliveries settled first.
    fn abort_open(&mut self, reason: AbortReason, detail: &str) -> KafkaResult<()> {
        let client = self.producer.client();
        let timeout = self.settings.operation_timeout;
        // abort_transaction waits for the queue to empty, but on this producer only our
        // polling serves delivery reports: let in-flight records finish first. Purging
        // them instead races with librdkafka's own registration of their partitions
        // (the broker then refuses the abort with INVALID_TXN_STATE).
        if collector::drain(client, timeout).is_err() {
            client.purge(rdkafka::producer::PurgeConfig::default().queue());
            let _ = collector::drain(client, timeout);
        }
        let _ = client.context().take_error();
        self.producer.abort()?;
        self.stats.aborted += 1;
        telemetry::txn_aborted(reason.as_str(), detail, self.records);
        Ok(())
    }

    /// Aborts the open transaction of an incarnation that ends because another member took
    /// the consumer's membership, best effort and without a rewind (the next incarnation's
    /// consumer starts from the committed offsets) and never by a rebuild: a new producer
    /// would fence the other member's. Whatever fails, the transaction is closed, so the
    /// stop does not abort it again.
    fn abort_for_rejoin<C: ConsumerContext>(
        &mut self,
        consumer: &BaseConsumer<C>,
        reason: AbortReason,
        detail: &str,
    ) {
        if matches!(self.settle(consumer, Keep::Nothing), Ok(Committed::Aborted)) {
            self.reset();
            return;
        }
        if self.open {
            let _ = self.abort_open(reason, detail);
        }
        self.reset();
    }

    /// Replaces a producer that failed fatally (as [`crate::txn::producer::Rebuilds`]
    /// allows), and rewinds.
    fn rebuild<C: ConsumerContext>(
        &mut self,
        consumer: &BaseConsumer<C>,
        err: KafkaError,
    ) -> Result<(), TxnError> {
        let detail = err.to_string();
        self.producer.rebuild(err)?;
        self.stats.producer_rebuilds += 1;
        if self.open {
            self.stats.aborted += 1;
            telemetry::txn_aborted(AbortReason::ProducerRebuilt.as_str(), &detail, self.records);
            // The old producer's transaction may have committed after all (its commit call
            // failed once the coordinator had the commit): the new producer's
            // initialization completed it either way, and the changelogs say which. The
            // rewind's committed offsets say the same.
            self.state
                .reload()
                .map_err(|e| TxnError::State(e.to_string()))?;
        }
        self.rewind(consumer)?;
        self.reset();
        Ok(())
    }

    /// Seeks the partitions the aborted transaction consumed from back to their committed
    /// offsets (or, where the group has none yet, to the first offset the transaction
    /// consumed). The other assigned partitions already stand at their committed offsets:
    /// everything consumed before this transaction was committed.
    ///
    /// Reading the committed offsets asks the group coordinator, which may be moving (a
    /// broker restarting): retriable errors are retried until the operation timeout, as the
    /// transactional calls are.
    fn rewind<C: ConsumerContext>(&mut self, consumer: &BaseConsumer<C>) -> Result<(), TxnError> {
        let mut touched = TopicPartitionList::new();
        for (topic, partition, _) in self.offsets.to_commit() {
            touched.add_partition(topic, partition);
        }
        // The record in hand's partition, when the transaction holds nothing of it: every
        // record before it there is committed, so it is rewound to the record itself.
        let in_hand = self
            .in_hand
            .as_ref()
            .filter(|o| self.offsets.first_of(&o.topic, o.partition).is_none());
        if let Some(o) = in_hand {
            touched.add_partition(&o.topic, o.partition);
        }
        if touched.count() == 0 {
            return Ok(());
        }
        let timeout = self.settings.operation_timeout;
        let deadline = Instant::now() + timeout;
        // A consumer that failed for good (fenced by a newer instance with its id) is not
        // waited for: nothing it asks will succeed again.
        let fatal = || consumer.client().fatal_error().is_some();
        let committed = retry_call(deadline, &fatal, || {
            consumer.committed_offsets(touched.clone(), timeout)
        })
        .map_err(|error| TxnError::rewind("reading committed offsets", error))?;
        let mut seeks = TopicPartitionList::new();
        for elem in committed.elements() {
            let target = match elem.offset() {
                Offset::Offset(o) => Some(o),
                _ => self
                    .offsets
                    .first_of(elem.topic(), elem.partition())
                    .or_else(|| {
                        in_hand
                            .filter(|o| {
                                &*o.topic == elem.topic() && o.partition == elem.partition()
                            })
                            .map(|o| o.offset)
                    }),
            };
            if let Some(o) = target {
                seeks
                    .add_partition_offset(elem.topic(), elem.partition(), Offset::Offset(o))
                    .map_err(|error| TxnError::rewind("building the seek list", error))?;
            }
        }
        // A partition's seek can fail on its own (the consumer's state in flux while the
        // coordinator moves): seeking again to the same offsets is harmless.
        let mut failed_at = String::from("seeking");
        retry_call(deadline, &fatal, || {
            failed_at = String::from("seeking");
            let result = consumer.seek_partitions(seeks.clone(), timeout)?;
            for elem in result.elements() {
                if let Err(error) = elem.error() {
                    failed_at = format!("{}[{}]", elem.topic(), elem.partition());
                    return Err(error);
                }
            }
            Ok(())
        })
        .map_err(|error| TxnError::rewind(&failed_at, error))
    }
}

/// Calls a consumer's request again while its error is retriable (the group coordinator
/// moved or is loading, a request timed out), with a capped backoff, until `deadline` or
/// until the consumer has failed `fatal`ly.
fn retry_call<T>(
    deadline: Instant,
    fatal: &dyn Fn() -> bool,
    mut call: impl FnMut() -> KafkaResult<T>,
) -> KafkaResult<T> {
    let mut backoff = retry::CLIENT_CALL.retries();
    loop {
        let error = match call() {
            Ok(v) => return Ok(v),
            Err(error) => error,
        };
        let delay = (retries_call(&error) && !fatal())
            .then(|| backoff.next_delay(deadline))
            .flatten();
        let Some(delay) = delay else {
            return Err(error);
        };
        telemetry::txn_retry("rewind", backoff.attempt(), &error);
        std::thread::sleep(delay);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::txn::coordinator::fixture::*;
    use crate::txn::{Added, Committed};

    #[test]
    fn the_rewind_retries_a_group_coordinator_that_moved() {
        use rdkafka_sys::rd_kafka_resp_err_t::*;
        // OffsetFetch: the request behind the committed offsets the rewind seeks back to.
        const OFFSET_FETCH: i16 = 9;
        let mut f = fixture(Some(1));
        add(&mut f, &origin(0, 0));
        f.cluster
            .push_request_errors(
                OFFSET_FETCH,
                &[
                    RD_KAFKA_RESP_ERR_NOT_COORDINATOR,
                    RD_KAFKA_RESP_ERR_COORDINATOR_LOAD_IN_PROGRESS,
                    RD_KAFKA_RESP_ERR_COORDINATOR_NOT_AVAILABLE,
                ],
            )
            .unwrap();
        // The failpoint aborts this transaction, and the rewind must read committed offsets.
        assert_eq!(f.txn.commit(&f.consumer).unwrap(), Committed::Aborted);
        assert!(!f.txn.is_open());
    }

    #[test]
    fn a_fatal_commit_is_cured_by_a_rebuild_each_time_the_rebuilt_producer_committed_since() {
        use rdkafka_sys::rd_kafka_resp_err_t::*;
        let mut f = fixture(None);
        for round in 0..3 {
            // The coordinator refuses the commit as after a failover that aborted it: fatal.
            add(&mut f, &origin(0, 2 * round));
            f.cluster
                .push_request_errors(END_TXN, &[RD_KAFKA_RESP_ERR_INVALID_TXN_STATE])
                .unwrap();
            assert_eq!(
                f.txn.commit(&f.consumer).unwrap(),
                Committed::Aborted,
                "round {round}"
            );
            add(&mut f, &origin(0, 2 * round));
            assert_eq!(f.txn.commit(&f.consumer).unwrap(), Committed::Done);
        }
        assert_eq!(f.txn.stats().producer_rebuilds, 3);
        assert_eq!(f.txn.stats().committed, 3);
    }

    #[test]
    fn fences_are_cured_by_rebuilds_and_one_past_the_windows_limit_stops_the_job() {
        use rdkafka_sys::rd_kafka_resp_err_t::*;
        let mut f = fixture(None);
        add(&mut f, &origin(0, 0));
        f.cluster
            .push_request_errors(END_TXN, &[RD_KAFKA_RESP_ERR_PRODUCER_FENCED])
            .unwrap();
        assert_eq!(f.txn.commit(&f.consumer).unwrap(), Committed::Aborted);
        add(&mut f, &origin(0, 0));
        assert_eq!(f.txn.commit(&f.consumer).unwrap(), Committed::Done);
        assert_eq!(f.txn.stats().producer_rebuilds, 1);
        // The rest of the window's fences, without a commit in between (another producer
        // taking the id in turn while the consumer's rule settles who keeps it).
        for _ in 1..crate::fence::PRODUCER_FENCES {
            add(&mut f, &origin(0, 1));
            f.cluster
                .push_request_errors(END_TXN, &[RD_KAFKA_RESP_ERR_PRODUCER_FENCED])
                .unwrap();
            assert_eq!(f.txn.commit(&f.consumer).unwrap(), Committed::Aborted);
        }
        assert_eq!(
            f.txn.stats().producer_rebuilds,
            crate::fence::PRODUCER_FENCES as u64
        );
        add(&mut f, &origin(0, 1));
        f.cluster
            .push_request_errors(END_TXN, &[RD_KAFKA_RESP_ERR_PRODUCER_FENCED])
            .unwrap();
        let err = f
            .txn
            .commit(&f.consumer)
            .expect_err("fenced once too often");
        assert!(matches!(err, TxnError::FencedAgain { .. }), "{err}");
    }

    /// TxnOffsetCommit refused with FENCED_INSTANCE_ID: another member took the consumer's
    /// membership. The transaction is aborted, the producer is not rebuilt (it was not
    /// fenced), and the error says so, for the engine's consumer rule.
    #[test]
    fn a_commit_refused_for_the_membership_aborts_and_ends_the_incarnation() {
        use rdkafka_sys::rd_kafka_resp_err_t::*;
        let mut f = fixture(None);
        add(&mut f, &origin(0, 0));
        f.cluster
            .push_request_errors(TXN_OFFSET_COMMIT, &[RD_KAFKA_RESP_ERR_FENCED_INSTANCE_ID])
            .unwrap();
        let err = f
            .txn
            .commit(&f.consumer)
            .expect_err("the membership is gone");
        assert!(matches!(err, TxnError::MemberFenced { .. }), "{err}");
        assert_eq!(f.txn.stats().producer_rebuilds, 0);
        assert_eq!(f.txn.stats().aborted, 1);
        assert!(!f.txn.is_open());
    }

    #[test]
    fn a_record_whose_output_cannot_be_sent_comes_again_though_its_partition_is_new_to_the_transaction()
     {
        use rdkafka_sys::rd_kafka_resp_err_t::*;
        let mut f = overlapping();
        let (p0, p1) = fed(&f);
        add_out(&mut f, &p0[0]);
        // The producer fails for good: the first record of partition 1 cannot be sent.
        let reason = std::ffi::CString::new("injected").unwrap();
        // SAFETY: the producer's handle lives as long as the transaction owner.
        unsafe {
            rdkafka_sys::rd_kafka_test_fatal_error(
                f.txn.producer.client().client().native_ptr(),
                RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER,
                reason.as_ptr(),
            );
        }
        assert_eq!(try_add_out(&mut f, &p1[0]), Added::Aborted);
        assert_eq!(f.txn.stats().producer_rebuilds, 1);
        assert_comes_again(
            &f,
            &p0[0],
            &p1[0],
            "the partition of the record that could not be sent",
        );
    }

    #[test]
    fn a_record_waiting_for_a_retry_comes_again_when_the_commit_before_it_aborts() {
        let mut f = kafka_only(false, 1_000);
        let (p0, p1) = fed(&f);
        add_out(&mut f, &p0[0]);
        fail_next_end_txn(&f);
        // The record of partition 1 failed transiently: the transaction commits before the
        // retry, and aborts.
        assert_eq!(
            f.txn.commit_before(&f.consumer, &p1[0]).unwrap(),
            Committed::Aborted
        );
        assert_comes_again(&f, &p0[0], &p1[0], "the partition of the record in hand");
    }

    #[test]
    fn a_rebuilt_producer_failing_again_before_any_commit_stops_the_job() {
        use rdkafka_sys::rd_kafka_resp_err_t::*;
        let mut f = fixture(None);
        add(&mut f, &origin(0, 0));
        f.cluster
            .push_request_errors(
                END_TXN,
                &[
                    RD_KAFKA_RESP_ERR_INVALID_TXN_STATE,
                    RD_KAFKA_RESP_ERR_INVALID_TXN_STATE,
                ],
            )
            .unwrap();
        assert_eq!(f.txn.commit(&f.consumer).unwrap(), Committed::Aborted);
        add(&mut f, &origin(0, 0));
        let err = f.txn.commit(&f.consumer).expect_err("fatal again");
        assert!(matches!(err, TxnError::FatalAgain { .. }), "{err}");
    }
}
