//! Restoring a partition's state from its changelog: read_committed, from the beginning to
//! the end offset the broker reports for read_committed readers (the last stable offset),
//! told by librdkafka's partition-EOF event. Never "until a last record": transaction
//! markers and compaction leave offset gaps, and the end is where the fetch position stands.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::{ClientConfig, ClientContext, Offset, TopicPartitionList};

use super::{Stores, Table};
use crate::telemetry;

/// Why a restore failed.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error("state restore: kafka client: {0}")]
    Client(#[from] KafkaError),
    #[error(
        "state restore: changelog {topic} partition {partition} not read to its end: nothing came for {}s ({read} records read)",
        .after.as_secs()
    )]
    Timeout {
        topic: String,
        partition: i32,
        read: u64,
        after: Duration,
    },
}

/// The restore consumer's context: the end of a partition is what it waits for, not an
/// error to log.
struct RestoreContext;

impl ClientContext for RestoreContext {
    fn error(&self, error: KafkaError, reason: &str) {
        let eof = matches!(
            error,
            KafkaError::PartitionEOF(_) | KafkaError::Global(RDKafkaErrorCode::PartitionEOF)
        );
        if !eof {
            telemetry::restore_client_error(&error, reason);
        }
    }
}

impl ConsumerContext for RestoreContext {}

type RestoreConsumer = BaseConsumer<RestoreContext>;

/// What a restore read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Restored {
    pub records: u64,
    pub keys: u64,
    pub took: Duration,
}

/// The configuration of the restore consumer, from the job consumer's: no group membership,
/// no offset commit, read_committed, partition-EOF events on.
pub fn restore_config(consumer: &ClientConfig) -> ClientConfig {
    let mut config = consumer.clone();
    config.remove("group.instance.id");
    config.remove("group.protocol");
    config.remove("partition.assignment.strategy");
    config.remove("statistics.interval.ms");
    config
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        .set("auto.offset.reset", "earliest");
    config
}

/// Restores the state of every store on `partitions` from their changelogs, replacing what
/// `stores` held of them. Each store's changelog is read in turn (an EOF event names the
/// partition, not the topic); a restore fails when nothing comes for `timeout`.
pub fn restore(
    config: &ClientConfig,
    stores: &mut Stores,
    partitions: &[i32],
    timeout: Duration,
) -> Result<Restored, RestoreError> {
    let started = Instant::now();
    let mut total = Restored::default();
    if partitions.is_empty() {
        return Ok(total);
    }
    let consumer: RestoreConsumer = config.create_with_context(RestoreContext)?;
    for store in 0..stores.changelogs().len() {
        let topic = stores.changelogs()[store].clone();
        let (tables, read) = read_to_end(&consumer, &topic, partitions, timeout)?;
        total.records += read;
        for (partition, table) in tables {
            total.keys += table.len() as u64;
            stores.set_table(store, partition, table);
        }
    }
    total.took = started.elapsed();
    telemetry::state_restored(partitions, total.records, total.keys, total.took);
    Ok(total)
}

/// Every record of `topic`'s `partitions`, folded into a table per partition (the last value
/// of a key counts, a tombstone deletes it); with the number of records read.
fn read_to_end(
    consumer: &RestoreConsumer,
    topic: &str,
    partitions: &[i32],
    timeout: Duration,
) -> Result<(HashMap<i32, Table>, u64), RestoreError> {
    let mut tpl = TopicPartitionList::new();
    for &p in partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    // At most this many records to read: what the log holds, markers and aborted records
    // included (the restore lag the metric shows counts down from it).
    let mut to_read = 0u64;
    for &p in partitions {
        let (low, high) = consumer.fetch_watermarks(topic, p, timeout)?;
        to_read += u64::try_from(high - low).unwrap_or(0);
    }
    telemetry::state_restoring(topic, partitions, 0, to_read);
    let mut tables: HashMap<i32, Table> =
        partitions.iter().map(|&p| (p, Table::default())).collect();
    let mut open: Vec<i32> = partitions.to_vec();
    let mut read = 0u64;
    let mut deadline = Instant::now() + timeout;
    let mut last_log = Instant::now();
    while !open.is_empty() {
        if Instant::now() >= deadline {
            return Err(RestoreError::Timeout {
                topic: topic.to_string(),
                partition: open[0],
                read,
                after: timeout,
            });
        }
        match consumer.poll(Duration::from_millis(100)) {
            None => {}
            Some(Err(KafkaError::PartitionEOF(p))) => open.retain(|&o| o != p),
            Some(Err(e)) => return Err(e.into()),
            Some(Ok(msg)) => {
                read += 1;
                deadline = Instant::now() + timeout;
                let (Some(table), Some(key)) = (tables.get_mut(&msg.partition()), msg.key()) else {
                    continue;
                };
                table.put(key.to_vec(), msg.payload().map(<[u8]>::to_vec));
            }
        }
        if last_log.elapsed() >= Duration::from_secs(5) {
            last_log = Instant::now();
            telemetry::state_restoring(topic, &open, read, to_read);
        }
    }
    telemetry::state_restoring(topic, &open, to_read, to_read);
    consumer.unassign()?;
    Ok((tables, read))
}
