//! The punctuation of a job with a `delay`: by the wall clock, records coming in or not, the
//! records held until a time that has come are sent, with their removal from the store, in
//! one transaction ([`crate::txn::Txn::add_due`]). What they are and how they are held is
//! [`crate::transform::delay`]'s.

use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer;
use rdkafka::{Offset, TopicPartitionList};

use super::{EngineError, Job, JobConsumer, now_ms};
use crate::state::{KeyedState, key_time, time_key};
use crate::topology::Processor;
use crate::transform::delay;
use crate::txn::{Added, Outgoing, Position, Txn, TxnError};

/// How often the job looks for due records: a record is sent at most this long after it is
/// due, plus the transaction's commit interval.
pub(super) const PUNCTUATE_EVERY: Duration = Duration::from_millis(50);

/// The most due records of a partition one look sends.
const DUE_PER_LOOK: usize = 5_000;

/// The store index of each `delay` step of `topology`.
pub(super) fn delay_stores(topology: &crate::topology::Topology) -> Vec<usize> {
    topology
        .stores()
        .enumerate()
        .filter(|(_, (i, _))| matches!(topology.pipeline[*i], Processor::Delay(_)))
        .map(|(store, _)| store)
        .collect()
}

impl Job<'_> {
    /// Sends what came due, when the last look is [`PUNCTUATE_EVERY`] old.
    pub(super) fn punctuate_if_due(
        &mut self,
        consumer: &JobConsumer,
        txn: &mut Txn,
        now: Instant,
    ) -> Result<(), EngineError> {
        if self.delays.is_empty() || now < self.next_punctuation {
            return Ok(());
        }
        self.next_punctuation = now + PUNCTUATE_EVERY;
        let now_ms = now_ms();
        for store in self.delays.clone() {
            for (partition, first) in txn.state().timer_partitions(store) {
                if first.is_some_and(|t| t <= now_ms)
                    && self.send_due(consumer, txn, store, partition, now_ms)? == Added::Aborted
                {
                    // Rewound: what was due is still in the store, for the next look.
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    /// Sends the records of `store` due on `partition` at `now_ms`.
    fn send_due(
        &mut self,
        consumer: &JobConsumer,
        txn: &mut Txn,
        store: usize,
        partition: i32,
        now_ms: i64,
    ) -> Result<Added, EngineError> {
        let state_error = |e: String| EngineError::Txn(TxnError::State(e));
        // No record's changes are at hand: what is due is what committed or joined the open
        // transaction.
        txn.state().begin_record();
        let mut due = txn
            .state()
            .due(store, partition, &time_key(now_ms.saturating_add(1)))
            .map_err(|e| state_error(e.to_string()))?;
        // A bounded batch per look: a backlog after an outage goes out over several
        // transactions.
        due.truncate(DUE_PER_LOOK);
        if due.is_empty() {
            return Ok(Added::Yes);
        }
        let topic = self.topology.input_topics()[0];
        let Some(next) = position(consumer, topic, partition, self.metadata_timeout) else {
            // Not this instance's any more, or its offset unknown for now: the next look.
            return Ok(Added::Yes);
        };
        let mut outputs = Vec::new();
        let mut lateness = Vec::with_capacity(due.len());
        for (key, bytes) in due {
            txn.state().put(store, partition, &key, None);
            lateness.push(now_ms - key_time(&key).unwrap_or(now_ms));
            let held = match delay::decode(&bytes) {
                Ok(held) => held,
                Err(e) => {
                    // Unreadable (written by another version?): it can never be sent.
                    crate::telemetry::delayed_unreadable(&txn.state().topics()[store], &e);
                    continue;
                }
            };
            outputs.extend(held.into_iter().filter_map(|h| {
                let (index, record) = h.into_output();
                Some(Outgoing {
                    topic: self.topics.get(index).copied().flatten()?,
                    record,
                    lineage: self.lineage.get(index).copied().unwrap_or(true),
                })
            }));
        }
        let at = Position {
            topic,
            partition,
            next,
        };
        let added = txn.add_due(consumer, at, &outputs)?;
        if added == Added::Yes {
            crate::telemetry::delay_sent(&txn.state().topics()[store], &lateness);
        }
        Ok(added)
    }
}

/// The offset of the next record the consumer reads from `topic`/`partition`: its position,
/// or before it fetched anything, the committed offset. `None` when it has neither (the
/// partition is not assigned, or its offset cannot be read now).
fn position(consumer: &JobConsumer, topic: &str, partition: i32, timeout: Duration) -> Option<i64> {
    let of = |list: &TopicPartitionList| match list.find_partition(topic, partition)?.offset() {
        Offset::Offset(n) => Some(n),
        _ => None,
    };
    if let Some(n) = consumer.position().ok().as_ref().and_then(of) {
        return Some(n);
    }
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(topic, partition);
    consumer
        .committed_offsets(tpl, timeout)
        .ok()
        .as_ref()
        .and_then(of)
}
