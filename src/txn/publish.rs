//! A transaction that only publishes: records sent and committed, with no consumed offsets,
//! for a source that is not a Kafka topic (the outbox relay). The producer's calls are the
//! transaction owner's ([`super::producer`]); what decides when to commit, and what the
//! transaction stands for, is the caller's.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::producer::{BaseRecord, Producer as _};

use super::TxnError;
use super::collector::{self, Collector};
use super::producer::Producer;
use crate::kafka::send;
use crate::record::Record;
use crate::telemetry::{self, health::Health};

/// A transactional producer publishing batches, each committed whole or not at all.
pub struct Publisher {
    producer: Producer,
    collector: Collector,
    timeout: Duration,
    open: bool,
}

impl Publisher {
    /// Creates the producer and registers its transactional.id: the coordinator fences any
    /// older producer with the id and completes or aborts its open transaction first, so
    /// what that producer committed is visible once this returns.
    pub fn new(
        config: ClientConfig,
        timeout: Duration,
        health: Arc<Health>,
    ) -> Result<Publisher, TxnError> {
        Ok(Publisher {
            producer: Producer::create(config, timeout, true, health)?,
            collector: Collector::new(),
            timeout,
            open: false,
        })
    }

    /// Sends a record in the open transaction (beginning one if none is open).
    pub fn send(&mut self, topic: &str, rec: &Record) -> KafkaResult<()> {
        self.begin()?;
        self.collector
            .send(self.producer.client(), topic, rec, None, self.timeout)
    }

    /// Sends a value to one partition of a topic, in the open transaction.
    pub fn send_to(
        &mut self,
        topic: &str,
        partition: i32,
        key: &[u8],
        value: &[u8],
    ) -> KafkaResult<()> {
        self.begin()?;
        let record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic)
            .partition(partition)
            .key(key)
            .payload(value);
        send::send(
            self.producer.client(),
            record,
            self.timeout,
            collector::await_deliveries,
        )
    }

    fn begin(&mut self) -> KafkaResult<()> {
        if !self.open {
            self.producer.begin()?;
            self.open = true;
        }
        Ok(())
    }

    /// Waits for every delivery and commits. On an error the transaction is not committed:
    /// call [`Publisher::abort`], or drop the publisher (its successor fences it).
    pub fn commit(&mut self) -> KafkaResult<()> {
        if !self.open {
            return Ok(());
        }
        collector::drain(self.producer.client(), self.timeout)?;
        if let Some(err) = self.producer.client().context().take_error() {
            return Err(err);
        }
        self.producer.commit()?;
        self.open = false;
        self.collector.commit();
        Ok(())
    }

    /// Aborts the open transaction, best effort: nothing it sent becomes visible (a producer
    /// that cannot abort is fenced by the next one with its transactional.id).
    pub fn abort(&mut self, why: &KafkaError) {
        if !self.open {
            return;
        }
        self.open = false;
        self.collector.discard();
        self.producer
            .client()
            .purge(rdkafka::producer::PurgeConfig::default().queue().inflight());
        if let Err(e) = self.producer.abort() {
            telemetry::publish_abort_failed(why, &e);
        }
    }
}
