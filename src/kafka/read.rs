//! Reading a topic to its end under read_committed: what a command sees of a topic is what
//! its committed transactions wrote, up to the end offsets taken when it starts.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::{Offset, TopicPartitionList};

use super::Cluster;

/// Why a topic could not be read to its end.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
    #[error("topic {0} does not exist")]
    NoTopic(String),
    #[error("no progress for {}s reading {topic}; partitions still pending: {pending:?}", .idle.as_secs())]
    Stalled {
        topic: String,
        idle: Duration,
        pending: BTreeMap<i32, i64>,
    },
}

/// How long a read may see nothing before it gives up.
const MAX_IDLE: Duration = Duration::from_secs(30);
/// Bound of each metadata and offset request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// A read_committed consumer of `group` that never commits by itself and starts at the
/// beginning where the group has no offset.
pub fn reader(cluster: &Cluster, group: &str) -> Result<BaseConsumer, KafkaError> {
    cluster
        .config()
        .set("group.id", group)
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .create()
}

/// A [`reader`] of `group` assigned partitions `0..partitions` of `topic` from their
/// beginning, whatever the group has committed.
pub fn reader_from_beginning(
    cluster: &Cluster,
    group: &str,
    topic: &str,
    partitions: i32,
) -> Result<BaseConsumer, KafkaError> {
    let consumer = reader(cluster, group)?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    Ok(consumer)
}

/// The low and end offsets of every partition of `topic` now.
pub fn watermarks(
    consumer: &BaseConsumer,
    topic: &str,
) -> Result<BTreeMap<i32, (i64, i64)>, ReadError> {
    let metadata = consumer.fetch_metadata(Some(topic), REQUEST_TIMEOUT)?;
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    if partitions.is_empty() {
        return Err(ReadError::NoTopic(topic.to_string()));
    }
    let mut marks = BTreeMap::new();
    for p in partitions {
        marks.insert(p, consumer.fetch_watermarks(topic, p, REQUEST_TIMEOUT)?);
    }
    Ok(marks)
}

/// Reads `topic` from the group's committed offsets (or the beginning) up to the end offsets
/// taken at the start, calling `each` for every record.
pub fn read_to_end<E: From<ReadError>>(
    consumer: &BaseConsumer,
    topic: &str,
    mut each: impl FnMut(&BorrowedMessage<'_>) -> Result<(), E>,
) -> Result<(), E> {
    let mut pending = assign_from_committed(consumer, topic)?;
    let mut idle_since = Instant::now();
    while !pending.is_empty() {
        // Under read_committed a partition's end may be a transaction marker that is never
        // delivered: positions tell when it is passed.
        let positions = consumer.position().map_err(ReadError::from)?;
        for e in positions.elements() {
            if let Offset::Offset(pos) = e.offset()
                && pending.get(&e.partition()).is_some_and(|end| pos >= *end)
            {
                pending.remove(&e.partition());
            }
        }
        if pending.is_empty() {
            break;
        }
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(msg)) => {
                idle_since = Instant::now();
                if pending
                    .get(&msg.partition())
                    .is_some_and(|end| msg.offset() < *end)
                {
                    each(&msg)?;
                }
            }
            Some(Err(e)) => return Err(ReadError::from(e).into()),
            None if idle_since.elapsed() > MAX_IDLE => {
                return Err(ReadError::Stalled {
                    topic: topic.to_string(),
                    idle: MAX_IDLE,
                    pending,
                }
                .into());
            }
            None => {}
        }
    }
    Ok(())
}

/// Assigns every partition of `topic` at the group's committed offset (or its low
/// watermark), and returns the end offset of each partition that has records to read.
fn assign_from_committed(
    consumer: &BaseConsumer,
    topic: &str,
) -> Result<BTreeMap<i32, i64>, ReadError> {
    let marks = watermarks(consumer, topic)?;
    let mut tpl = TopicPartitionList::new();
    for p in marks.keys() {
        tpl.add_partition(topic, *p);
    }
    let committed = consumer.committed_offsets(tpl, REQUEST_TIMEOUT)?;
    let mut assign = TopicPartitionList::new();
    let mut pending = BTreeMap::new();
    for e in committed.elements() {
        let (low, end) = marks.get(&e.partition()).copied().unwrap_or((0, 0));
        let start = match e.offset() {
            Offset::Offset(o) => o.max(low),
            _ => low,
        };
        assign.add_partition_offset(topic, e.partition(), Offset::Offset(start))?;
        if start < end {
            pending.insert(e.partition(), end);
        }
    }
    consumer.assign(&assign)?;
    Ok(pending)
}

/// Reads `ranges` of `topic` (partition to `[start, end)`), calling `each` for every record
/// in them, as fast as the consumer fetches. Returns the partitions it could not finish:
/// those where nothing came for `idle` (under read_committed, a partition whose last stable
/// offset is held back by an open transaction); the caller decides whether that is an error.
pub fn read_ranges<E: From<ReadError>>(
    consumer: &BaseConsumer,
    topic: &str,
    ranges: &BTreeMap<i32, (i64, i64)>,
    idle: Duration,
    mut each: impl FnMut(&BorrowedMessage<'_>) -> Result<(), E>,
) -> Result<BTreeMap<i32, i64>, E> {
    let mut assign = TopicPartitionList::new();
    let mut pending = BTreeMap::new();
    for (&p, &(start, end)) in ranges {
        if start < end {
            assign
                .add_partition_offset(topic, p, Offset::Offset(start))
                .map_err(ReadError::from)?;
            pending.insert(p, end);
        }
    }
    if pending.is_empty() {
        return Ok(pending);
    }
    consumer.assign(&assign).map_err(ReadError::from)?;
    let mut idle_since = Instant::now();
    let mut since_check = 0u32;
    while !pending.is_empty() {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(msg)) => {
                idle_since = Instant::now();
                let p = msg.partition();
                if let Some(&end) = pending.get(&p) {
                    if msg.offset() < end {
                        each(&msg)?;
                    }
                    if msg.offset() + 1 >= end {
                        pending.remove(&p);
                    }
                }
                since_check += 1;
                // The end may be a transaction marker, never delivered: positions tell.
                if since_check >= 10_000 {
                    since_check = 0;
                    drop_passed(consumer, &mut pending)?;
                }
            }
            Some(Err(e)) => return Err(ReadError::from(e).into()),
            None => {
                drop_passed(consumer, &mut pending)?;
                if idle_since.elapsed() > idle {
                    break;
                }
            }
        }
    }
    Ok(pending)
}

/// Removes from `pending` the partitions whose position is at or past their end.
fn drop_passed(consumer: &BaseConsumer, pending: &mut BTreeMap<i32, i64>) -> Result<(), ReadError> {
    let positions = consumer.position()?;
    for e in positions.elements() {
        if let Offset::Offset(pos) = e.offset()
            && pending.get(&e.partition()).is_some_and(|end| pos >= *end)
        {
            pending.remove(&e.partition());
        }
    }
    Ok(())
}

/// The record at `offset` of `topic[partition]`, read with read_committed, or `None` when the
/// topic no longer holds it (retention or compaction removed it).
pub fn read_one(
    cluster: &Cluster,
    topic: &str,
    partition: i32,
    offset: i64,
) -> Result<Option<rdkafka::message::OwnedMessage>, ReadError> {
    let consumer: BaseConsumer = cluster
        .config()
        .set("group.id", "onceflow.read-one")
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .create()?;
    let (low, end) = consumer.fetch_watermarks(topic, partition, REQUEST_TIMEOUT)?;
    if offset < low || offset >= end {
        return Ok(None);
    }
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Offset(offset))?;
    consumer.assign(&tpl)?;
    let started = Instant::now();
    while started.elapsed() < MAX_IDLE {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(msg)) if msg.offset() == offset => return Ok(Some(msg.detach())),
            // Past it: the offset is a hole (compacted away, or a transaction marker).
            Some(Ok(_)) => return Ok(None),
            Some(Err(e)) => return Err(e.into()),
            None => {}
        }
    }
    Err(ReadError::Stalled {
        topic: topic.to_string(),
        idle: MAX_IDLE,
        pending: [(partition, offset + 1)].into_iter().collect(),
    })
}
