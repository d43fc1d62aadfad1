//! Metric names, their help texts, and the Prometheus recorder.
//!
//! Labels carry bounded values only: topic, partition, output topic, error kind, abort
//! reason, retry stage, broker. The topology is a global label (one process runs one job).
//! Per-record counts are accumulated by the transaction owner and added here at commit, so
//! the counters count committed work exactly and the hot path touches no registry.

use std::time::Duration;

use metrics::{Counter, Unit, counter, describe_counter, describe_gauge, describe_histogram};
use metrics_exporter_prometheus::BuildError;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use metrics_util::MetricKindMask;

pub const RECORDS_CONSUMED: &str = "onceflow_records_consumed_total";
pub const BYTES_CONSUMED: &str = "onceflow_bytes_consumed_total";
pub const RECORDS_PRODUCED: &str = "onceflow_records_produced_total";
pub const BYTES_PRODUCED: &str = "onceflow_bytes_produced_total";
pub const RECORDS_FILTERED: &str = "onceflow_records_filtered_total";
pub const RECORDS_DEAD_LETTERED: &str = "onceflow_records_dead_lettered_total";
pub const TXN_COMMITTED: &str = "onceflow_transactions_committed_total";
pub const TXN_ABORTED: &str = "onceflow_transactions_aborted_total";
pub const COMMIT_DURATION: &str = "onceflow_commit_duration_seconds";
pub const TXN_RECORDS: &str = "onceflow_transaction_records";
pub const TXN_OPEN_AGE: &str = "onceflow_open_transaction_age_seconds";
pub const OUTPUT_TXN_AGE: &str = "onceflow_output_open_transaction_age_seconds";
pub const CONSUMER_LAG: &str = "onceflow_consumer_lag_records";
pub const REBALANCES: &str = "onceflow_rebalances_total";
pub const ASSIGNED_PARTITIONS: &str = "onceflow_assigned_partitions";
pub const BUILD_INFO: &str = "onceflow_build_info";
pub const START_TIME: &str = "onceflow_process_start_time_seconds";
pub const PRODUCER_REBUILDS: &str = "onceflow_producer_rebuilds_total";
pub const CALLS_ABANDONED: &str = "onceflow_client_calls_abandoned_total";
pub const FENCED: &str = "onceflow_fenced_total";
pub const RETRIES: &str = "onceflow_retries_total";
pub const CONSUMER_ERRORS: &str = "onceflow_consumer_errors_total";
pub const BROKER_RTT: &str = "onceflow_kafka_broker_rtt_seconds";
pub const BROKER_UP: &str = "onceflow_kafka_broker_up";
pub const CLIENT_QUEUE_MESSAGES: &str = "onceflow_kafka_client_queue_messages";
pub const INBOX_DUPLICATES: &str = "onceflow_inbox_duplicates_absorbed_total";
pub const SEQUENCE_GAPS: &str = "onceflow_sequence_gaps_total";
pub const HTTP_REQUESTS: &str = "onceflow_http_requests_total";
pub const HTTP_RETRIES: &str = "onceflow_http_retries_total";
pub const HTTP_DEDUPLICATED: &str = "onceflow_http_deduplicated_total";
pub const HTTP_DURATION: &str = "onceflow_http_request_duration_seconds";
pub const OUTBOX_PUBLISHED: &str = "onceflow_outbox_rows_published_total";
pub const OUTBOX_BATCHES: &str = "onceflow_outbox_batches_total";
pub const OUTBOX_RESOLVED: &str = "onceflow_outbox_rows_resolved_total";
pub const OUTBOX_PENDING: &str = "onceflow_outbox_pending_rows";
pub const OUTBOX_OLDEST: &str = "onceflow_outbox_oldest_pending_seconds";
pub const OUTBOX_SHARDS: &str = "onceflow_outbox_shards_owned";
pub const OUTBOX_LATENCY: &str = "onceflow_outbox_publish_latency_seconds";
pub const STATE_KEYS: &str = "onceflow_state_keys";
pub const DEDUPE_DROPPED: &str = "onceflow_dedupe_dropped_total";
pub const JOIN_MISSES: &str = "onceflow_join_misses_total";
pub const LATE_RECORDS: &str = "onceflow_state_late_records_total";
pub const DELAY_LATENESS: &str = "onceflow_delay_lateness_seconds";
pub const DELAY_EMITTED: &str = "onceflow_delay_emitted_total";
pub const TABLE_RECORDS: &str = "onceflow_table_records_read_total";
pub const STATE_BYTES: &str = "onceflow_state_bytes";
pub const STATE_CHANGES: &str = "onceflow_state_changes_total";
pub const STATE_RESTORE_REMAINING: &str = "onceflow_state_restore_remaining_records";
pub const STATE_RESTORED: &str = "onceflow_state_restored_records_total";
pub const STATE_RESTORE_DURATION: &str = "onceflow_state_restore_duration_seconds";

/// Every metric with its help text, for `/metrics` and the metric catalogue (docs/observability.md).
pub const CATALOGUE: &[(&str, &str)] = &[
    (
        BUILD_INFO,
        "1, labelled with the build: onceflow's version and commit, and librdkafka's version.",
    ),
    (
        START_TIME,
        "When this process started, in seconds since the Unix epoch: a new value is a restart.",
    ),
    (
        RECORDS_CONSUMED,
        "Consumed records whose offsets were committed, by input topic.",
    ),
    (
        BYTES_CONSUMED,
        "Key and value bytes of those records, by input topic.",
    ),
    (
        RECORDS_PRODUCED,
        "Records committed to an output, by output topic.",
    ),
    (
        BYTES_PRODUCED,
        "Key and value bytes of those records, by output topic.",
    ),
    (
        RECORDS_FILTERED,
        "Committed consumed records the pipeline produced nothing for.",
    ),
    (
        RECORDS_DEAD_LETTERED,
        "Records written to the dead-letter topic (committed or not), by error kind.",
    ),
    (TXN_COMMITTED, "Transactions committed."),
    (
        TXN_ABORTED,
        "Transactions aborted, by reason; their records are consumed again.",
    ),
    (
        COMMIT_DURATION,
        "Time to commit a transaction: draining deliveries, sending offsets, committing.",
    ),
    (TXN_RECORDS, "Consumed records per committed transaction."),
    (
        TXN_OPEN_AGE,
        "Age of the open transaction (0 when none is open).",
    ),
    (
        OUTPUT_TXN_AGE,
        "Age of the oldest open transaction on each Kafka output and dead-letter partition, anyone's, as its leader reports it (0 when none), by topic and partition; polled every 10 s.",
    ),
    (
        CONSUMER_LAG,
        "Records between the consumer position and the last stable offset, by topic and partition.",
    ),
    (
        REBALANCES,
        "Rebalance events, by kind (assign, revoke, lost).",
    ),
    (
        ASSIGNED_PARTITIONS,
        "Partitions currently assigned to this instance.",
    ),
    (PRODUCER_REBUILDS, "Producers rebuilt after a fatal error."),
    (
        CALLS_ABANDONED,
        "Transactional client calls abandoned, with their client, for not returning long after their timeout, by stage.",
    ),
    (
        FENCED,
        "Fencing events: another instance took over this instance's identity, by client.",
    ),
    (RETRIES, "Retried calls, by stage."),
    (CONSUMER_ERRORS, "Non-fatal consumer errors."),
    (
        BROKER_RTT,
        "Broker round-trip time, p99 of librdkafka's last statistics window, by client and broker.",
    ),
    (
        BROKER_UP,
        "1 when librdkafka's connection to the broker is UP, by client and broker.",
    ),
    (
        CLIENT_QUEUE_MESSAGES,
        "Messages waiting in librdkafka's queues, by client.",
    ),
    (
        INBOX_DUPLICATES,
        "Messages a PostgreSQL output had applied before, absorbed by its inbox, by output.",
    ),
    (
        SEQUENCE_GAPS,
        "Sequences missing before rows a PostgreSQL output applied (on_sequence_gap: apply), by output.",
    ),
    (
        HTTP_REQUESTS,
        "Requests of an HTTP output, by output and status class (2xx..5xx, or error when no answer came).",
    ),
    (
        HTTP_RETRIES,
        "Calls of an HTTP output made again after a transient failure, by output.",
    ),
    (
        HTTP_DEDUPLICATED,
        "Calls of an HTTP output not made because its dedup inbox holds their keys, by output.",
    ),
    (
        HTTP_DURATION,
        "Time from sending a request of an HTTP output to its answer, by output.",
    ),
    (
        OUTBOX_PUBLISHED,
        "Outbox rows published (committed in Kafka, then deleted), by table.",
    ),
    (
        OUTBOX_BATCHES,
        "Batches of outbox rows published, one Kafka transaction each, by table.",
    ),
    (
        OUTBOX_RESOLVED,
        "Outbox rows found published but not yet deleted when a relay took their shard (a crash between the Kafka and the database commit), deleted without publishing them again, by table.",
    ),
    (
        OUTBOX_PENDING,
        "Rows in the outbox table, not yet published, by table.",
    ),
    (
        OUTBOX_OLDEST,
        "Age of the oldest row in the outbox table (needs columns.created_at), by table.",
    ),
    (
        OUTBOX_SHARDS,
        "Shards of the outbox table this relay publishes; a relay with none is a standby, by table.",
    ),
    (
        OUTBOX_LATENCY,
        "Time from an outbox row's insert (columns.created_at) to the commit of the Kafka transaction that published it, by table.",
    ),
    (
        STATE_KEYS,
        "Keys held in the stores of the assigned partitions, by store.",
    ),
    (
        DEDUPE_DROPPED,
        "Records a dedupe step dropped as repeats of a key it remembers, committed, by store (the changelog topic).",
    ),
    (
        JOIN_MISSES,
        "Records whose key had no row in a join's table, committed, by store (the table topic).",
    ),
    (
        LATE_RECORDS,
        "Records a windowed aggregate dropped because every window they fall in had closed (stream time past its end plus grace), committed, by store (the changelog topic).",
    ),
    (
        DELAY_LATENESS,
        "How long after its due time a delayed record was sent, in the transaction that emitted it, by store (the changelog topic).",
    ),
    (
        DELAY_EMITTED,
        "Delayed records sent when due, by store (the changelog topic); those of a transaction that aborts are sent again and counted again.",
    ),
    (
        TABLE_RECORDS,
        "Records of a join's table read while following it (after its restore), by table topic.",
    ),
    (
        STATE_BYTES,
        "Key and value bytes held in the stores of the assigned partitions, by store.",
    ),
    (
        STATE_CHANGES,
        "State changes committed (records written to the changelogs), by store.",
    ),
    (
        STATE_RESTORE_REMAINING,
        "Changelog records a restore in progress has at most left to read (the restore lag), by changelog.",
    ),
    (
        STATE_RESTORED,
        "Changelog records read to restore the state of assigned partitions.",
    ),
    (
        STATE_RESTORE_DURATION,
        "Time to restore the state of the partitions of one assignment.",
    ),
];

/// Installs the Prometheus recorder with `topology` as a global label. Gauges of partitions
/// no longer assigned disappear after a minute without updates.
pub fn install(topology: &str) -> Result<PrometheusHandle, BuildError> {
    let handle = PrometheusBuilder::new()
        .add_global_label("topology", topology)
        .idle_timeout(MetricKindMask::GAUGE, Some(Duration::from_secs(60)))
        .set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Full(COMMIT_DURATION.to_string()),
            &[
                0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            ],
        )
        .and_then(|b| {
            b.set_buckets_for_metric(
                metrics_exporter_prometheus::Matcher::Full(TXN_RECORDS.to_string()),
                &[1.0, 10.0, 100.0, 500.0, 1000.0, 5000.0, 10000.0, 50000.0],
            )
        })
        .and_then(|b| {
            b.set_buckets_for_metric(
                metrics_exporter_prometheus::Matcher::Full(HTTP_DURATION.to_string()),
                &[
                    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                ],
            )
        })
        .and_then(|b| {
            b.set_buckets_for_metric(
                metrics_exporter_prometheus::Matcher::Full(OUTBOX_LATENCY.to_string()),
                &[
                    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                ],
            )
        })
        .and_then(|b| {
            b.set_buckets_for_metric(
                metrics_exporter_prometheus::Matcher::Full(DELAY_LATENESS.to_string()),
                &[0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0],
            )
        })
        .and_then(|b| {
            b.set_buckets_for_metric(
                metrics_exporter_prometheus::Matcher::Full(STATE_RESTORE_DURATION.to_string()),
                &[0.01, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0],
            )
        })?
        .install_recorder()?;
    crate::telemetry::started();
    describe();
    Ok(handle)
}

fn describe() {
    for (name, help) in CATALOGUE {
        let name = *name;
        let help = *help;
        if name.ends_with("_total") {
            describe_counter!(name, help);
        } else if [
            COMMIT_DURATION,
            HTTP_DURATION,
            OUTBOX_LATENCY,
            DELAY_LATENESS,
        ]
        .contains(&name)
        {
            describe_histogram!(name, Unit::Seconds, help);
        } else if name == TXN_RECORDS {
            describe_histogram!(name, Unit::Count, help);
        } else {
            describe_gauge!(name, help);
        }
    }
}

/// Committed record and byte counts of one topic, with their counter handles.
#[derive(Debug)]
struct TopicCount {
    topic: String,
    records: u64,
    bytes: u64,
    records_counter: Counter,
    bytes_counter: Counter,
}

/// Counts of the open transaction per topic, added to the counters when it commits and
/// forgotten when it aborts. A job touches few topics: a vector beats a map.
#[derive(Debug)]
pub struct TopicCounts {
    records_name: &'static str,
    bytes_name: &'static str,
    counts: Vec<TopicCount>,
}

impl TopicCounts {
    pub fn consumed() -> TopicCounts {
        TopicCounts::new(RECORDS_CONSUMED, BYTES_CONSUMED)
    }

    pub fn produced() -> TopicCounts {
        TopicCounts::new(RECORDS_PRODUCED, BYTES_PRODUCED)
    }

    fn new(records_name: &'static str, bytes_name: &'static str) -> TopicCounts {
        TopicCounts {
            records_name,
            bytes_name,
            counts: Vec::new(),
        }
    }

    /// Adds one record of `bytes` bytes on `topic` to the open transaction.
    pub fn add(&mut self, topic: &str, bytes: usize) {
        let entry = match self.counts.iter().position(|c| c.topic == topic) {
            Some(i) => &mut self.counts[i],
            None => {
                let labels = [("topic", topic.to_string())];
                self.counts.push(TopicCount {
                    topic: topic.to_string(),
                    records: 0,
                    bytes: 0,
                    records_counter: counter!(self.records_name, &labels),
                    bytes_counter: counter!(self.bytes_name, &labels),
                });
                let last = self.counts.len() - 1;
                &mut self.counts[last]
            }
        };
        entry.records += 1;
        entry.bytes += bytes as u64;
    }

    /// The transaction committed: publish its counts.
    pub fn commit(&mut self) {
        for c in &mut self.counts {
            c.records_counter.increment(c.records);
            c.bytes_counter.increment(c.bytes);
            c.records = 0;
            c.bytes = 0;
        }
    }

    /// The transaction aborted: its records will be counted when they commit.
    pub fn discard(&mut self) {
        for c in &mut self.counts {
            c.records = 0;
            c.bytes = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_prometheus_conventions() {
        for (name, help) in CATALOGUE {
            assert!(name.starts_with("onceflow_"), "{name}");
            assert!(
                name.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
                "{name}"
            );
            assert!(!help.is_empty() && help.ends_with('.'), "{name}: {help}");
            if name.ends_with("_total") {
                assert!(!name.contains("seconds"), "{name}");
            }
        }
        let mut names: Vec<_> = CATALOGUE.iter().map(|(n, _)| n).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), CATALOGUE.len(), "duplicate metric name");
    }

    #[test]
    fn every_metric_is_documented_and_on_the_dashboard() {
        let readme = include_str!("../../docs/observability.md");
        let dashboard = include_str!("../../deploy/grafana/onceflow.json");
        for (name, _) in CATALOGUE {
            assert!(
                readme.contains(&format!("`{name}`")),
                "{name} missing from docs/observability.md"
            );
            assert!(
                dashboard.contains(name),
                "{name} missing from the dashboard"
            );
        }
    }

    #[test]
    fn the_build_is_one_gauge_labelled_with_its_versions() {
        let recorder = metrics_util::debugging::DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        metrics::with_local_recorder(&recorder, crate::telemetry::build_info);
        let seen = snapshotter.snapshot().into_vec();
        assert_eq!(seen.len(), 1);
        let (key, _, _, value) = &seen[0];
        assert_eq!(key.key().name(), BUILD_INFO);
        let labels: Vec<(String, String)> = key
            .key()
            .labels()
            .map(|l| (l.key().to_string(), l.value().to_string()))
            .collect();
        let names: Vec<&str> = labels.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["version", "commit", "librdkafka"]);
        assert_eq!(labels[0].1, env!("CARGO_PKG_VERSION"));
        assert!(labels[2].1.starts_with('2'), "{labels:?}");
        assert!(matches!(
            value,
            metrics_util::debugging::DebugValue::Gauge(v) if v.into_inner() == 1.0
        ));
    }

    #[test]
    fn topic_counts_publish_only_committed_work() {
        let recorder = metrics_util::debugging::DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        metrics::with_local_recorder(&recorder, || {
            let mut counts = TopicCounts::consumed();
            counts.add("a", 10);
            counts.add("a", 5);
            counts.discard();
            counts.add("a", 1);
            counts.add("b", 2);
            counts.commit();
        });
        let mut seen: Vec<(String, String, u64)> = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .map(|(key, _, _, value)| {
                let topic = key
                    .key()
                    .labels()
                    .find(|l| l.key() == "topic")
                    .map(|l| l.value().to_string())
                    .unwrap_or_default();
                let v = match value {
                    metrics_util::debugging::DebugValue::Counter(v) => v,
                    other => panic!("unexpected {other:?}"),
                };
                (key.key().name().to_string(), topic, v)
            })
            .collect();
        seen.sort();
        assert_eq!(
            seen,
            vec![
                (BYTES_CONSUMED.into(), "a".into(), 1),
                (BYTES_CONSUMED.into(), "b".into(), 2),
                (RECORDS_CONSUMED.into(), "a".into(), 1),
                (RECORDS_CONSUMED.into(), "b".into(), 1),
            ]
        );
    }
}
