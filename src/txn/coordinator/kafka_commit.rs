//! The Kafka side of a transaction's commit: every delivery awaited, the consumed offsets
//! sent, the transaction ended (under at-least-once: the deliveries awaited, then the
//! consumer's own offset commit).

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, ConsumerGroupMetadata,
};
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::producer::Producer as _;
use rdkafka::{Offset, TopicPartitionList};

use super::Txn;
use crate::txn::collector;
use crate::txn::producer::Calls;

/// When each step of one commit ended.
#[derive(Debug, Clone, Copy)]
pub(super) struct StepTimes {
    pub(super) started: Instant,
    pub(super) delivered: Instant,
    pub(super) offsets_sent: Instant,
    pub(super) ended: Instant,
}

impl Txn {
    pub(super) fn try_commit<C: ConsumerContext>(
        &mut self,
        consumer: &BaseConsumer<C>,
        started: Instant,
    ) -> KafkaResult<StepTimes> {
        if !self.producer.transactional() {
            // At-least-once: every output acknowledged first; then the offsets may move.
            await_deliveries(self.producer.client(), self.settings.operation_timeout)?;
            let delivered = Instant::now();
            consumer.commit(&self.offsets_to_commit()?, CommitMode::Sync)?;
            let now = Instant::now();
            return Ok(StepTimes {
                started,
                delivered,
                offsets_sent: now,
                ended: now,
            });
        }
        let (offsets, metadata) = self.commit_request(consumer)?;
        let calls = self.producer.calls();
        let steps = end_transaction(
            &calls,
            &offsets,
            &metadata,
            self.settings.operation_timeout,
            started,
        )?;
        self.producer.committed();
        Ok(steps)
    }

    fn offsets_to_commit(&self) -> KafkaResult<TopicPartitionList> {
        let mut tpl = TopicPartitionList::new();
        for (topic, partition, next) in self.offsets.to_commit() {
            tpl.add_partition_offset(topic, partition, Offset::Offset(next))?;
        }
        Ok(tpl)
    }

    /// What the Kafka commit of the open transaction sends: its offsets, and the group
    /// metadata that fences a zombie of this consumer.
    pub(super) fn commit_request<C: ConsumerContext>(
        &self,
        consumer: &BaseConsumer<C>,
    ) -> KafkaResult<(TopicPartitionList, Arc<ConsumerGroupMetadata>)> {
        let metadata = consumer
            .group_metadata()
            .ok_or(KafkaError::Global(RDKafkaErrorCode::State))?;
        Ok((self.offsets_to_commit()?, Arc::new(metadata)))
    }
}

/// Waits for every delivery of the producer: a record that failed fails the transaction (and
/// commit_transaction's own flush sleeps 100 ms whenever anything is in flight).
fn await_deliveries(client: &collector::Client, timeout: Duration) -> KafkaResult<()> {
    collector::drain(client, timeout)?;
    match client.context().take_error() {
        Some(err) => Err(err),
        None => Ok(()),
    }
}

/// The Kafka side of a transaction's commit, on whichever thread runs it: every delivery
/// awaited, the consumed offsets sent, the transaction ended.
pub(super) fn end_transaction(
    calls: &Calls,
    offsets: &TopicPartitionList,
    metadata: &Arc<ConsumerGroupMetadata>,
    timeout: Duration,
    started: Instant,
) -> KafkaResult<StepTimes> {
    await_deliveries(calls.client(), timeout)?;
    let delivered = Instant::now();
    calls.send_offsets(offsets, metadata)?;
    let offsets_sent = Instant::now();
    calls.end()?;
    Ok(StepTimes {
        started,
        delivered,
        offsets_sent,
        ended: Instant::now(),
    })
}
