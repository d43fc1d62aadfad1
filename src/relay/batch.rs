//! One batch of a shard: its rows claimed in a database transaction, their records (through
//! the pipeline, or to their default topic) and its progress record sent in one Kafka
//! transaction, and the rows deleted in the claiming database transaction.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::types::{RDKafkaErrorCode, RDKafkaRespErr};

use crate::dlq::format::{Failure, dead_letter};
use crate::instance::Identity;
use crate::record::{ErrorKind, Record, RecordError, Stage};
use crate::telemetry;
use crate::topology::{OnError, Topology};
use crate::transform::Pipeline;
use crate::txn::{Publisher, TxnStats};

use super::progress::Progress;
use super::row::{self, Row};
use super::{Failed, Relay, RelayError, db, now_ms};

/// How long a topic found missing is taken as missing before it is looked up again.
const MISSING_TOPIC_RECHECK: Duration = Duration::from_secs(10);

impl Relay<'_> {
    /// Claims a batch of the shard, publishes it in one Kafka transaction with its progress
    /// record, then deletes it in the claiming database transaction.
    pub(super) fn publish_batch(&mut self, shard: u32) -> Result<usize, Failed> {
        let Relay {
            runtime,
            conn,
            shards,
            config,
            layout,
            ..
        } = self;
        let Some(conn) = conn.as_mut() else {
            return Ok(0);
        };
        let Some(publisher) = shards.get_mut(&shard).and_then(|s| s.publisher.as_mut()) else {
            return Ok(0);
        };
        let limit = config.batch_size as i64;
        let shards_n = layout.shards as i32;
        let shard_i = shard as i32;
        let claim = conn.claim.clone();
        let delete = conn.delete.clone();
        // A closure over the parts of the relay a batch needs, run inside the database
        // transaction; the Kafka calls in it block, as everywhere in the job.
        let relay_parts = RowPublisher {
            topology: self.topology,
            identity: self.identity,
            pipeline: self.pipeline.as_ref(),
            topics: &self.topics,
            reader: &self.reader,
            known_topics: &mut self.known_topics,
            dead_letter_topic: &self.dead_letter_topic,
            progress_topic: &self.progress_topic,
            timeout: self.timeout,
            skipped: &mut self.skipped,
        };
        let exit_after = self.options.exit_after_kafka_commit;
        let stats = &mut self.stats;
        let first_row = &mut self.first_row;
        let table = config.table.clone();
        let mut undeleted: Option<Vec<String>> = None;
        let left = &mut undeleted;
        let result = runtime.block_on(async move {
            let claim_started = Instant::now();
            let tx = conn.client.transaction().await.map_err(db)?;
            let rows = tx
                .query(&claim, &[&shards_n, &shard_i, &limit])
                .await
                .map_err(db)?;
            if rows.is_empty() {
                return Ok(0);
            }
            first_row.get_or_insert_with(Instant::now);
            let rows = claimed_rows(&rows);
            let started = Instant::now();
            let claimed = started - claim_started;
            let mut parts = relay_parts;
            let (progress, outputs, sending) =
                parts.transact(publisher, &table, shard, &rows, started)?;
            let took = started.elapsed();
            committed(stats, &table, &rows, outputs, took, exit_after);
            // Published: now the rows go, with the locks the claim took.
            let result = async {
                tx.execute(&delete, &[&progress.ids]).await?;
                tx.commit().await
            }
            .await;
            match result {
                Ok(()) => {
                    telemetry::outbox_batch_timing(
                        &table,
                        shard,
                        rows.len(),
                        [claimed, sending, took - sending, started.elapsed() - took],
                    );
                    Ok(rows.len())
                }
                Err(e) => {
                    *left = Some(progress.ids);
                    Err(db(e))
                }
            }
        });
        if let (Some(ids), Some(s)) = (undeleted, shards.get_mut(&shard)) {
            // Kept: the next round of the shard deletes them first.
            s.undeleted = ids;
        }
        result
    }
}

/// The claimed rows, their columns in the order of [`super::table::Layout::claim_sql`].
fn claimed_rows(rows: &[tokio_postgres::Row]) -> Vec<Row> {
    rows.iter()
        .map(|r| Row {
            id: r.get(0),
            aggregatetype: r.get(1),
            aggregateid: r.get(2),
            event_type: r.get(3),
            payload: r.get(4),
            headers: r.get(5),
            created_ms: r.get(6),
        })
        .collect()
}

/// Counts a batch whose Kafka transaction committed (`took` after its start), and logs it;
/// the failpoint `exit_after_kafka_commit` ends the process here, before the delete.
fn committed(
    stats: &mut TxnStats,
    table: &str,
    rows: &[Row],
    outputs: u64,
    took: Duration,
    exit_after: Option<u64>,
) {
    let committed_ms = now_ms();
    telemetry::txn_committed(rows.len() as u64, outputs, took);
    telemetry::outbox_published(
        table,
        rows.len() as u64,
        rows.iter()
            .filter_map(|r| r.created_ms)
            .map(|c| Duration::from_millis((committed_ms - c).max(0) as u64)),
    );
    stats.committed += 1;
    stats.records_committed += rows.len() as u64;
    stats.outputs_committed += outputs;
    stats.commit_durations.record(took);
    if exit_after == Some(stats.committed) {
        telemetry::failpoint_exit_after_kafka_commit(stats.committed);
        std::process::abort();
    }
}

/// Where a row's records go.
enum Routed {
    /// The row's record itself, to this topic.
    As(String),
    /// The records the pipeline made, in `out`.
    Produced,
}

/// What sending a batch's records needs.
struct RowPublisher<'a> {
    topology: &'a Topology,
    identity: &'a Identity,
    pipeline: Option<&'a Pipeline>,
    topics: &'a [String],
    reader: &'a BaseConsumer,
    known_topics: &'a mut HashMap<String, (bool, Instant)>,
    dead_letter_topic: &'a str,
    progress_topic: &'a str,
    timeout: Duration,
    skipped: &'a mut u64,
}

impl RowPublisher<'_> {
    /// The Kafka transaction of a batch: the rows' records, then its progress record, then
    /// the commit; aborted when any of it fails. Returns the progress record, how many
    /// records were sent, and how long sending them took after `started`.
    fn transact(
        &mut self,
        publisher: &mut Publisher,
        table: &str,
        shard: u32,
        rows: &[Row],
        started: Instant,
    ) -> Result<(Progress, u64, Duration), Failed> {
        let outputs = match self.send_all(publisher, table, shard, rows) {
            Ok(n) => n,
            Err(e) => {
                publisher.abort(&KafkaError::Canceled);
                return Err(e);
            }
        };
        let sending = started.elapsed();
        let progress = Progress::of(table, shard, rows, &self.identity.instance_id, now_ms());
        let sent = publisher
            .send_to(
                self.progress_topic,
                shard as i32,
                Progress::key(table, shard).as_bytes(),
                &progress.encode(),
            )
            .and_then(|()| publisher.commit());
        if let Err(e) = sent {
            publisher.abort(&e);
            return Err(Failed::Kafka(e.to_string()));
        }
        Ok((progress, outputs, sending))
    }

    /// Sends the records of every row (or its dead-letter record); returns how many records
    /// were sent.
    fn send_all(
        &mut self,
        publisher: &mut Publisher,
        table: &str,
        shard: u32,
        rows: &[Row],
    ) -> Result<u64, Failed> {
        let kafka = |e: KafkaError| Failed::Kafka(e.to_string());
        let mut sent = 0;
        let mut produced = Vec::new();
        for row in rows {
            let (record, bad_headers) = row.to_record(table, shard);
            let outcome = match bad_headers {
                Some(e) => Err(RecordError {
                    kind: ErrorKind::BadJson,
                    stage: Stage::Decode,
                    message: e.to_string(),
                }),
                None => self.route(&record, row, &mut produced).map_err(kafka)?,
            };
            match outcome {
                Ok(Routed::As(topic)) => {
                    publisher.send(&topic, &record).map_err(kafka)?;
                    sent += 1;
                }
                Ok(Routed::Produced) => {
                    for (topic, rec) in produced.drain(..) {
                        publisher.send(&topic, &rec).map_err(kafka)?;
                        sent += 1;
                    }
                }
                Err(error) => match self.topology.runtime.on_error {
                    OnError::DeadLetter => {
                        telemetry::outbox_row_failed(table, &row.id, &error);
                        let dead = row_dead_letter(
                            &record,
                            &row.id,
                            &error,
                            &self.topology.name,
                            &self.identity.instance_id,
                            now_ms(),
                        );
                        publisher
                            .send(self.dead_letter_topic, &dead)
                            .map_err(kafka)?;
                        telemetry::dead_lettered(error.kind.name());
                        sent += 1;
                    }
                    OnError::Skip => {
                        telemetry::outbox_row_failed(table, &row.id, &error);
                        *self.skipped += 1;
                    }
                    OnError::Fail => {
                        return Err(Failed::Fatal(RelayError::RowFailed {
                            id: row.id.clone(),
                            error,
                        }));
                    }
                },
            }
        }
        Ok(sent)
    }

    /// The records a row makes, with their topics: through the pipeline to the outputs, or
    /// (without outputs) the row's record as it is to `<topic_prefix><aggregatetype>`. The
    /// outer error is Kafka's (the metadata of a topic could not be read).
    fn route(
        &mut self,
        record: &Record,
        row: &Row,
        out: &mut Vec<(String, Record)>,
    ) -> Result<Result<Routed, RecordError>, KafkaError> {
        let Some(pipeline) = self.pipeline else {
            let prefix = self
                .topology
                .outbox()
                .map_or("outbox.event.", |o| o.topic_prefix.as_str());
            let topic = row::default_topic(prefix, &row.aggregatetype);
            if !self.topic_exists(&topic)? {
                return Ok(Err(RecordError {
                    kind: ErrorKind::Unroutable,
                    stage: Stage::Output {
                        index: 0,
                        name: topic.clone(),
                    },
                    message: format!(
                        "topic `{topic}` (topic_prefix and aggregate type `{}`) does not exist",
                        row.aggregatetype
                    ),
                }));
            }
            return Ok(Ok(Routed::As(topic)));
        };
        let mut produced = Vec::new();
        // The record stays at hand for a dead-letter copy of the original.
        if let Err(e) = pipeline.process(record.clone(), &mut produced) {
            return Ok(Err(e));
        }
        for (index, mut rec) in produced {
            if let Some(topic) = self.topics.get(index) {
                // The row is the origin: the table, the shard, the row id (its event id).
                if self.topology.outputs.get(index).is_none_or(|o| o.lineage) {
                    crate::lineage::stamp(&mut rec, &record.origin, Some(row.id.as_bytes()));
                }
                out.push((topic.clone(), rec));
            }
        }
        Ok(Ok(Routed::Produced))
    }

    /// Whether `topic` exists. A topic found is remembered; a missing one is looked up again
    /// after [`MISSING_TOPIC_RECHECK`] (it may be created meanwhile). Metadata that cannot be
    /// read is an error: the batch is tried again, no row is dead-lettered for it.
    fn topic_exists(&mut self, topic: &str) -> Result<bool, KafkaError> {
        if let Some(exists) = remembered(self.known_topics.get(topic), Instant::now()) {
            return Ok(exists);
        }
        let metadata = self.reader.fetch_metadata(Some(topic), self.timeout)?;
        let listed = metadata
            .topics()
            .iter()
            .find(|t| t.name() == topic)
            .map(|t| (t.error(), t.partitions().len()));
        let exists = listed_exists(listed)?;
        self.known_topics
            .insert(topic.to_string(), (exists, Instant::now()));
        Ok(exists)
    }
}

/// The dead-letter record of a row that failed with `error`: [`dead_letter`] of its record,
/// with the row id as the original's event id.
fn row_dead_letter(
    record: &Record,
    row_id: &str,
    error: &RecordError,
    topology: &str,
    instance: &str,
    at_ms: i64,
) -> Record {
    let failure = Failure {
        kind: error.kind.name().to_string(),
        message: error.message.clone(),
        stage: error.stage.to_string(),
        attempts: 1,
    };
    let mut dead = dead_letter(record, &failure, topology, instance, at_ms);
    dead.headers
        .push((crate::dlq::H_ID.into(), row_id.as_bytes().to_vec()));
    dead
}

/// What is remembered of whether a topic exists, if it still holds at `now`: a topic found,
/// for good; a missing one, for [`MISSING_TOPIC_RECHECK`] after it was looked up.
fn remembered(known: Option<&(bool, Instant)>, now: Instant) -> Option<bool> {
    let &(exists, at) = known?;
    (exists || now.saturating_duration_since(at) < MISSING_TOPIC_RECHECK).then_some(exists)
}

/// Whether a topic exists, by what the metadata lists of it (its error and its partition
/// count; `None`: not listed). An error other than an unknown topic means the metadata
/// cannot tell: it is returned.
fn listed_exists(listed: Option<(Option<RDKafkaRespErr>, usize)>) -> Result<bool, KafkaError> {
    let Some((error, partitions)) = listed else {
        return Ok(false);
    };
    match error {
        None => Ok(partitions > 0),
        Some(code) => match RDKafkaErrorCode::from(code) {
            RDKafkaErrorCode::UnknownTopicOrPartition | RDKafkaErrorCode::UnknownTopic => Ok(false),
            other => Err(KafkaError::MetadataFetch(other)),
        },
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use rdkafka::types::RDKafkaRespErr;

    use super::*;

    fn row() -> Row {
        Row {
            id: "42".into(),
            aggregatetype: "order".into(),
            aggregateid: "o-7".into(),
            event_type: "OrderPaid".into(),
            payload: Some(br#"{"a":1}"#.to_vec()),
            headers: None,
            created_ms: Some(1000),
        }
    }

    fn header<'r>(record: &'r Record, name: &str) -> Option<&'r [u8]> {
        record
            .headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_slice())
    }

    #[test]
    fn a_failed_row_is_dead_lettered_verbatim_with_its_row_id_and_its_table_as_origin() {
        let (record, _) = row().to_record("orders_outbox", 1);
        let error = RecordError {
            kind: ErrorKind::Unroutable,
            stage: Stage::Output {
                index: 0,
                name: "outbox.event.order".into(),
            },
            message: "topic `outbox.event.order` does not exist".into(),
        };
        let dead = row_dead_letter(&record, "42", &error, "orders", "pod-0", 5000);
        assert_eq!(dead.key.as_deref(), Some(&b"o-7"[..]));
        assert_eq!(dead.value.as_deref(), Some(&br#"{"a":1}"#[..]));
        assert_eq!(header(&dead, "event-id"), Some(&b"42"[..]));
        assert_eq!(header(&dead, crate::dlq::H_ID), Some(&b"42"[..]));
        assert_eq!(
            header(&dead, crate::dlq::format::H_KIND),
            Some(&b"unroutable"[..])
        );
        assert_eq!(
            header(&dead, crate::dlq::format::H_TOPIC),
            Some(&b"postgres:orders_outbox"[..])
        );
        assert_eq!(
            header(&dead, crate::dlq::format::H_PARTITION),
            Some(&b"1"[..])
        );
        assert_eq!(
            header(&dead, crate::dlq::format::H_OFFSET),
            Some(&b"42"[..])
        );
        assert_eq!(
            header(&dead, crate::dlq::format::H_ATTEMPTS),
            Some(&b"1"[..])
        );
    }

    #[test]
    fn a_topic_found_is_remembered_and_a_missing_one_looked_up_again_after_10_seconds() {
        let at = Instant::now();
        assert_eq!(remembered(None, at), None);
        let found = (true, at);
        assert_eq!(
            remembered(Some(&found), at + Duration::from_secs(3600)),
            Some(true)
        );
        let missing = (false, at);
        assert_eq!(
            remembered(Some(&missing), at + Duration::from_secs(9)),
            Some(false)
        );
        assert_eq!(
            remembered(Some(&missing), at + Duration::from_secs(10)),
            None
        );
    }

    #[test]
    fn a_topic_exists_when_listed_with_partitions_and_other_metadata_errors_are_errors() {
        assert!(!listed_exists(None).unwrap());
        assert!(!listed_exists(Some((None, 0))).unwrap());
        assert!(listed_exists(Some((None, 3))).unwrap());
        let unknown = RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART;
        assert!(!listed_exists(Some((Some(unknown), 0))).unwrap());
        let unknown = RDKafkaRespErr::RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC;
        assert!(!listed_exists(Some((Some(unknown), 0))).unwrap());
        let leaderless = RDKafkaRespErr::RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE;
        assert!(matches!(
            listed_exists(Some((Some(leaderless), 1))),
            Err(KafkaError::MetadataFetch(
                RDKafkaErrorCode::LeaderNotAvailable
            ))
        ));
    }

    #[test]
    fn a_committed_batch_counts_one_transaction_its_rows_and_its_records() {
        let rows = [
            row(),
            Row {
                id: "43".into(),
                ..row()
            },
        ];
        let mut stats = TxnStats::default();
        committed(
            &mut stats,
            "orders_outbox",
            &rows,
            3,
            Duration::from_millis(5),
            None,
        );
        committed(
            &mut stats,
            "orders_outbox",
            &rows[..1],
            1,
            Duration::from_millis(7),
            Some(9),
        );
        assert_eq!(stats.committed, 2);
        assert_eq!(stats.records_committed, 3);
        assert_eq!(stats.outputs_committed, 4);
        assert_eq!(stats.commit_durations.count(), 2);
    }
}
