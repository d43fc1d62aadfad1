//! The offsets reconcile reads between: each input partition from its low watermark to the
//! group's committed offset, each output topic to its end; and reads that stop short of them.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};

use super::{Ranges, ReconcileError};
use crate::kafka::read::{self, ReadError};

/// Every partition of `topic` from its low watermark to the group's committed offset (empty
/// where the group has none).
pub(super) fn committed_ranges(
    consumer: &BaseConsumer,
    topic: &str,
) -> Result<Ranges, ReconcileError> {
    let marks = read::watermarks(consumer, topic)?;
    let mut tpl = TopicPartitionList::new();
    for p in marks.keys() {
        tpl.add_partition(topic, *p);
    }
    let committed = consumer.committed_offsets(tpl, Duration::from_secs(10))?;
    let mut ranges = Ranges::new();
    for e in committed.elements() {
        let (low, _) = marks.get(&e.partition()).copied().unwrap_or((0, 0));
        let to = match e.offset() {
            Offset::Offset(o) => o,
            _ => low,
        };
        ranges.insert(e.partition(), (low, to.max(low)));
    }
    Ok(ranges)
}

/// Every partition of `topic` from its low watermark to its end now; `None` when the topic
/// does not exist (a dead-letter topic nothing was ever sent to).
pub(super) fn topic_ranges(
    consumer: &BaseConsumer,
    topic: &str,
) -> Result<Option<Ranges>, ReconcileError> {
    match read::watermarks(consumer, topic) {
        Ok(marks) => Ok(Some(marks)),
        Err(ReadError::NoTopic(_)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Partitions a read could not finish are an error unless a transaction hangs there (the
/// report says so already).
pub(super) fn stalled(
    topic: &str,
    unfinished: BTreeMap<i32, i64>,
    hanging: &[(String, i32)],
    idle: Duration,
) -> Result<(), ReconcileError> {
    let pending: Vec<i32> = unfinished
        .keys()
        .copied()
        .filter(|p| !hanging.iter().any(|(t, hp)| t == topic && hp == p))
        .collect();
    if pending.is_empty() {
        Ok(())
    } else {
        Err(ReconcileError::Stalled {
            topic: topic.to_string(),
            idle,
            pending,
        })
    }
}
