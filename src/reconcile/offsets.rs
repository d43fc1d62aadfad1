//! The offsets reconcile reads between: each input partition from its low watermark to the
//! group's committed offset, each output topic to its end; and reads that stop short of them.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};

use super::{Ranges, ReconcileError};
use crate::kafka::Cluster;
use crate::kafka::read::{self, ReadError};

/// Of each input, every partition from its low watermark to the committed offset of
/// `group`, read with the group's id (assigning, never joining it).
pub(super) fn committed(
    cluster: &Cluster,
    group: &str,
    inputs: &[&str],
) -> Result<Vec<Ranges>, ReconcileError> {
    let committed_reader = read::reader(cluster, group)?;
    let mut input_ranges: Vec<Ranges> = Vec::new();
    for topic in inputs {
        input_ranges.push(committed_ranges(&committed_reader, topic)?);
    }
    Ok(input_ranges)
}

/// How many offsets `ranges` span in all.
pub(super) fn span<'r>(ranges: impl Iterator<Item = &'r Ranges>) -> u64 {
    ranges
        .flat_map(|r| r.values())
        .map(|(a, b)| (b - a).max(0) as u64)
        .sum()
}

/// Every partition of `topic` from its low watermark to the group's committed offset (empty
/// where the group has none).
fn committed_ranges(consumer: &BaseConsumer, topic: &str) -> Result<Ranges, ReconcileError> {
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
