//! The job consumer's context: it reaches the transaction owner from the rebalance callback,
//! which runs on the job's thread inside `poll`.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use rdkafka::client::DefaultClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::{ClientContext, TopicPartitionList};

use crate::sync::lock;
use crate::telemetry::{self, health::Health};
use crate::txn::{AbortReason, Txn, TxnError};

/// The facility of librdkafka's log line for a consumer session that timed out
/// (`rd_kafka_cgrp_session_timeout_check`).
const SESSION_TIMEOUT_LOG: &str = "SESSTMOUT";

pub struct SourceContext {
    txn: Arc<Mutex<Txn>>,
    /// A fatal error raised inside a callback, for the loop to return.
    failure: Mutex<Option<TxnError>>,
    health: Arc<Health>,
    assigned: AtomicI64,
    /// When the consumer's session last timed out, as librdkafka logs it.
    session_timed_out: Mutex<Option<Instant>>,
}

impl SourceContext {
    pub fn new(txn: Arc<Mutex<Txn>>, health: Arc<Health>) -> SourceContext {
        SourceContext {
            txn,
            failure: Mutex::new(None),
            health,
            assigned: AtomicI64::new(0),
            session_timed_out: Mutex::new(None),
        }
    }

    /// Brings the state of the partitions of `tpl` up to their changelogs' ends (nothing for
    /// a stateless job); a failure stops the job.
    fn restore(&self, tpl: &TopicPartitionList) {
        let parts: Vec<i32> = tpl.elements().iter().map(|e| e.partition()).collect();
        let mut txn = lock(&self.txn);
        if let Err(e) = txn.state().restore(&parts) {
            *lock(&self.failure) = Some(TxnError::State(e.to_string()));
        }
    }

    /// When the consumer's session last timed out: librdkafka had no answer from the group
    /// coordinator for `session.timeout.ms`, dropped its member id and joins again
    /// ([`crate::fence::ConsumerEnd::FencedAfterSessionTimeout`]).
    pub fn session_timed_out(&self) -> Option<Instant> {
        *lock(&self.session_timed_out)
    }

    /// The fatal error a callback raised since the last call, if any.
    pub fn take_failure(&self) -> Option<TxnError> {
        lock(&self.failure).take()
    }

    /// Keeps the number of assigned partitions from the rebalance events themselves: asking
    /// the consumer (`assignment()`) from a rebalance callback deadlocks while it closes.
    /// Cooperative rebalances carry the partitions added or removed; eager ones revoke
    /// everything before assigning the new set, so the sum holds for both.
    fn count_assigned(&self, delta: i64) {
        let now = (self.assigned.fetch_add(delta, Ordering::Relaxed) + delta).max(0) as usize;
        telemetry::assignment_size(now);
        self.health.set_assigned(now);
    }
}

impl ClientContext for SourceContext {
    /// librdkafka's logs go where every client's go; its session timeout (`SESSTMOUT`, the
    /// only sign of it librdkafka gives) is noted first.
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        if fac == SESSION_TIMEOUT_LOG {
            *lock(&self.session_timed_out) = Some(Instant::now());
        }
        DefaultClientContext.log(level, fac, log_message);
    }

    fn stats(&self, statistics: rdkafka::Statistics) {
        telemetry::client_statistics("consumer", &statistics);
    }
}

impl ConsumerContext for SourceContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => {
                telemetry::partitions_assigned(&partitions(tpl));
                self.restore(tpl);
                self.count_assigned(tpl.count() as i64);
            }
            Rebalance::Revoke(tpl) => {
                self.count_assigned(-(tpl.count() as i64));
                let lost = consumer.assignment_lost();
                telemetry::partitions_revoked(&partitions(tpl), lost);
                let mut txn = lock(&self.txn);
                // Lost partitions may already belong to another member: nothing of ours for
                // them may commit. Revoked ones are handed over cleanly: commit first.
                let result = if lost {
                    txn.abort_and_rewind(consumer, AbortReason::PartitionsLost, "")
                } else {
                    txn.commit(consumer).map(|_| ())
                };
                if let Err(e) = result {
                    *lock(&self.failure) = Some(e);
                }
                // The partitions' state is another member's now; on disk it stays, with a
                // checkpoint, for when they come back.
                for e in tpl.elements() {
                    if let Err(e) = txn.state().release_partition(e.partition(), lost) {
                        *lock(&self.failure) = Some(TxnError::State(e.to_string()));
                    }
                }
            }
            Rebalance::Error(e) => telemetry::consumer_error(e),
        }
    }
}

fn partitions(tpl: &TopicPartitionList) -> Vec<(String, i32)> {
    tpl.elements()
        .iter()
        .map(|e| (e.topic().to_string(), e.partition()))
        .collect()
}
