//! The changelog topics of a job's stores: one per store, compacted, with as many partitions
//! as the input (partition p holds the state of input partition p). The job creates a
//! missing one; one with another partition count stops it, naming both counts. The tables of
//! `join`s are checked, never created: a co-partitioned one must have the input's count.

use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;

use super::store::TIMED_TOMBSTONE_RETENTION;
use crate::kafka::Cluster;
use crate::kafka::admin::{Admin, AdminError};

/// Why the changelogs cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ChangelogError {
    #[error("state changelog: cannot read the metadata of {topic}: {error}")]
    Metadata { topic: String, error: KafkaError },
    #[error("state changelog: the input topic {0} does not exist")]
    NoInput(String),
    #[error(
        "state changelog {topic} has {found} partitions, the input {input} has {expected}: partition p of a changelog holds the state of input partition p. Delete the changelog (its state is rebuilt from nothing) or recreate it with {expected} partitions"
    )]
    Partitions {
        topic: String,
        found: usize,
        input: String,
        expected: usize,
    },
    #[error("state changelog {topic}: {error}")]
    Create { topic: String, error: AdminError },
    #[error("join: the table topic {0} does not exist")]
    NoTable(String),
    #[error(
        "join: table {topic} has {found} partitions, the input {input} has {expected}: a co-partitioned table needs the input's key and partition count (an instance looks a record up in the partition of the table it holds). Repartition the table, or read it whole with `global: true`"
    )]
    TablePartitions {
        topic: String,
        found: usize,
        input: String,
        expected: usize,
    },
}

/// The number of partitions of `topic`, `None` when it does not exist.
fn partitions<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topic: &str,
    timeout: Duration,
) -> Result<Option<usize>, ChangelogError> {
    crate::kafka::partition_count(consumer.client(), topic, timeout).map_err(|error| {
        ChangelogError::Metadata {
            topic: topic.to_string(),
            error,
        }
    })
}

/// The topic settings of a changelog beyond compaction.
fn timed_settings(timed: bool) -> Vec<(&'static str, String)> {
    if !timed {
        return Vec::new();
    }
    vec![
        (
            "delete.retention.ms",
            TIMED_TOMBSTONE_RETENTION.as_millis().to_string(),
        ),
        ("segment.bytes", (64 << 20).to_string()),
    ]
}

/// Checks the tables of `join`s, (topic, global): each exists, and a co-partitioned one has
/// the partition count of `input`.
pub fn check_tables<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    input: &str,
    tables: &[(String, bool)],
    timeout: Duration,
) -> Result<(), ChangelogError> {
    if tables.is_empty() {
        return Ok(());
    }
    let expected = partitions(consumer, input, timeout)?
        .ok_or_else(|| ChangelogError::NoInput(input.into()))?;
    for (topic, global) in tables {
        match partitions(consumer, topic, timeout)? {
            None => return Err(ChangelogError::NoTable(topic.clone())),
            Some(found) if !global && found != expected => {
                return Err(ChangelogError::TablePartitions {
                    topic: topic.clone(),
                    found,
                    input: input.to_string(),
                    expected,
                });
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// Creates every missing changelog of `changelogs` (topic, whether its store is timed) with
/// the partition count of `input`, and checks the count of those that exist. A timed store's
/// changelog keeps its tombstones an hour ([`TIMED_TOMBSTONE_RETENTION`]) in segments of
/// 64 MiB, so that the broker cleans it while it is young: every closed window and every
/// sent delayed record leaves a tombstone.
pub fn ensure<C: ConsumerContext>(
    cluster: &Cluster,
    consumer: &BaseConsumer<C>,
    input: &str,
    changelogs: &[(String, bool)],
    timeout: Duration,
) -> Result<(), ChangelogError> {
    let expected = partitions(consumer, input, timeout)?
        .ok_or_else(|| ChangelogError::NoInput(input.into()))?;
    for (topic, timed) in changelogs {
        match partitions(consumer, topic, timeout)? {
            Some(found) if found == expected => {}
            Some(found) => {
                return Err(ChangelogError::Partitions {
                    topic: topic.clone(),
                    found,
                    input: input.to_string(),
                    expected,
                });
            }
            None => {
                let create = |error| ChangelogError::Create {
                    topic: topic.clone(),
                    error,
                };
                Admin::new(cluster)
                    .map_err(create)?
                    .create_compacted_topic(topic, expected as i32, &timed_settings(*timed))
                    .map_err(create)?;
                crate::telemetry::changelog_created(topic, expected);
            }
        }
    }
    Ok(())
}
