//! Every log line and metric about the job's life comes from here: one function per event
//! writes the log line and bumps the metric, so wording, fields and names stay in one place.
//! Metric names are constants in [`metrics`]; per-record counts are in
//! [`metrics::TopicCounts`], published at commit.

pub mod health;
pub mod metrics;

use std::time::Duration;

use ::metrics::{counter, gauge, histogram};
use rdkafka::statistics::Statistics;
use tracing::{debug, error, info, warn};

use self::metrics as m;

/// Sets up logging: `json` for machines, human-readable otherwise; `RUST_LOG` filters.
pub fn init_tracing(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // A second initialisation (tests) is harmless: the first subscriber stays.
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

pub fn job_started(topology: &str, transactional_id: &str, group_id: &str, inputs: &[&str]) {
    info!(topology, transactional_id, group_id, ?inputs, "job started");
}

pub fn txn_committed(records: u64, outputs: u64, took: Duration) {
    counter!(m::TXN_COMMITTED).increment(1);
    histogram!(m::COMMIT_DURATION).record(took.as_secs_f64());
    histogram!(m::TXN_RECORDS).record(records as f64);
    debug!(
        records,
        outputs,
        took_ms = took.as_secs_f64() * 1e3,
        "transaction committed"
    );
}

pub fn records_filtered(count: u64) {
    if count > 0 {
        counter!(m::RECORDS_FILTERED).increment(count);
    }
}

/// A transaction was aborted; `reason` is a bounded label (`crate::txn::AbortReason`).
pub fn txn_aborted(reason: &'static str, detail: &str, records: u64) {
    counter!(m::TXN_ABORTED, "reason" => reason).increment(1);
    warn!(
        reason,
        detail, records, "transaction aborted; partitions rewound to their committed offsets"
    );
}

pub fn open_txn_age(age: Duration) {
    gauge!(m::TXN_OPEN_AGE).set(age.as_secs_f64());
}

/// The process's gauges, `onceflow_build_info` and its start time: set by the loops'
/// one-second tick, as gauges not set for a minute are dropped.
pub fn process_info() {
    build_info();
    started();
}

fn build_info() {
    static LIBRDKAFKA: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let librdkafka = LIBRDKAFKA.get_or_init(|| rdkafka::util::get_rdkafka_version().1);
    gauge!(
        m::BUILD_INFO,
        "version" => env!("CARGO_PKG_VERSION"),
        "commit" => env!("ONCEFLOW_COMMIT"),
        "librdkafka" => librdkafka.clone()
    )
    .set(1.0);
}

/// When this process started (the first call), as a gauge.
pub fn started() {
    static START: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    let start = START.get_or_init(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64()
    });
    gauge!(m::START_TIME).set(*start);
}

/// The oldest open transaction on an output partition, as its leader reports it.
pub fn output_txn_age(topic: &str, partition: i32, age_ms: i64) {
    gauge!(m::OUTPUT_TXN_AGE, "topic" => topic.to_string(), "partition" => partition.to_string())
        .set(age_ms as f64 / 1000.0);
}

/// The brokers could not be asked about the output partitions' open transactions (said once
/// per distinct error; the watch tries again).
pub fn txn_watch_failed(error: &dyn std::fmt::Display) {
    warn!(%error, "cannot read the open transactions of the output partitions; trying again");
}

pub fn txn_retry(operation: &'static str, attempt: u32, error: &dyn std::fmt::Display) {
    counter!(m::RETRIES, "stage" => operation).increment(1);
    warn!(operation, attempt, %error, "retriable transaction error; calling again");
}

pub fn client_call_abandoned(call: &'static str, after: std::time::Duration, stuck: usize) {
    counter!(m::CALLS_ABANDONED, "stage" => call).increment(1);
    error!(
        call,
        after_s = after.as_secs_f64(),
        stuck,
        "a transactional client call has not returned long after its timeout: abandoned with its client; a new producer takes the transactional.id"
    );
}

pub fn producer_rebuilt(error: &dyn std::fmt::Display, fenced: bool) {
    counter!(m::PRODUCER_REBUILDS).increment(1);
    if fenced {
        counter!(m::FENCED, "client" => "producer").increment(1);
    }
    warn!(%error, fenced, "fatal producer error; rebuilding the producer with the same transactional.id");
}

pub fn consumer_fenced(error: &dyn std::fmt::Display) {
    counter!(m::FENCED, "client" => "consumer").increment(1);
    error!(%error, "consumer fenced: another instance took over this group.instance.id");
}

pub fn instance_id_held(error: &dyn std::fmt::Display, retry_in: std::time::Duration) {
    warn!(
        %error,
        retry_in_ms = retry_in.as_millis() as u64,
        "this instance id is still held by a previous member of the group (its session has not expired): joining again"
    );
}

/// The process ran again after being frozen past its stall limit, and exits.
pub fn stalled(gap: Duration, limit: Duration) {
    error!(
        frozen_s = gap.as_secs_f64(),
        limit_s = limit.as_secs_f64(),
        "this process was frozen past its stall limit: its group membership may have expired and a replacement may hold its instance id; exiting so that the newer instance keeps it"
    );
}

/// Another member took this instance's id; the job joins again once.
/// The consumer was fenced and joins again; `own_session` when it was fenced for its own
/// membership, which expired a moment before (its session timed out).
pub fn rejoining_after_fence(error: &dyn std::fmt::Display, own_session: bool, after: Duration) {
    if own_session {
        warn!(%error, after_s = after.as_secs_f64(), "fenced for this member's own previous membership, whose session had just timed out (a failover of the group coordinator); joining again, not counted as a fence by another process");
    } else {
        warn!(%error, after_s = after.as_secs_f64(), "fenced (by a member with the same group.instance.id, or by a failover of the group coordinator); joining again");
    }
}

pub fn fatal(error: &dyn std::fmt::Display) {
    error!(%error, "fatal error; the job stops");
}

pub fn partitions_assigned(partitions: &[(String, i32)]) {
    counter!(m::REBALANCES, "kind" => "assign").increment(1);
    info!(count = partitions.len(), ?partitions, "partitions assigned");
}

/// A store's changelog topic was missing and was created.
pub fn changelog_created(topic: &str, partitions: usize) {
    info!(topic, partitions, "state changelog created");
}

/// The disk stores at `path` could not be read: moved to `aside`, started afresh (a full
/// restore from the changelogs follows).
pub fn store_unreadable(
    path: &dyn std::fmt::Display,
    error: &dyn std::fmt::Debug,
    aside: &dyn std::fmt::Display,
) {
    warn!(%path, ?error, %aside, "state stores unreadable: moved aside, restoring from the changelogs");
}

/// The state of `partitions` was brought up to their changelogs' ends, `from_checkpoint` of
/// the store partitions from their checkpoints (the tail), the others from the beginning.
pub fn state_restored(partitions: &[i32], records: u64, from_checkpoint: u64, took: Duration) {
    counter!(m::STATE_RESTORED).increment(records);
    histogram!(m::STATE_RESTORE_DURATION).record(took.as_secs_f64());
    info!(
        ?partitions,
        records,
        from_checkpoint,
        took_ms = took.as_millis() as u64,
        "state restored"
    );
}

/// The restore consumer's client reported an error (it retries on its own).
pub fn restore_client_error(error: &dyn std::fmt::Display, reason: &str) {
    warn!(%error, reason, "state restore: kafka client error");
}

/// A restore waits for the transaction open on a changelog partition (at offset `stable`,
/// its high watermark `high`) to end before it takes the partition's end.
pub fn state_restore_waits(topic: &str, partition: i32, stable: i64, high: i64) {
    info!(
        topic,
        partition,
        stable,
        high,
        "state restore: a transaction is open on the changelog; waiting for it to end"
    );
}

/// The transaction a restore waited for ended after `waited`.
pub fn state_restore_waited(topic: &str, partition: i32, waited: Duration) {
    info!(
        topic,
        partition,
        waited_ms = waited.as_millis() as u64,
        "state restore: the changelog's open transaction ended"
    );
}

/// A restore goes on: `read` records of `topic` so far of at most `to_read`, `open`
/// partitions not at their end.
pub fn state_restoring(topic: &str, open: &[i32], read: u64, to_read: u64) {
    let left = to_read.saturating_sub(read);
    gauge!(m::STATE_RESTORE_REMAINING, "changelog" => topic.to_string()).set(left as f64);
    if !open.is_empty() {
        info!(topic, partitions = ?open, read, to_read, "restoring state");
    }
}

/// Records read from a followed table, by topic.
pub fn table_read(topic: &str, records: u64) {
    counter!(m::TABLE_RECORDS, "table" => topic.to_string()).increment(records);
}

/// A transaction committed these records dropped by `dedupe` steps and missed by `join`s,
/// by store.
pub fn state_tally(stores: &[String], tally: &[[u64; 3]]) {
    for (store, &[dropped, missed, late]) in stores.iter().zip(tally) {
        if late > 0 {
            counter!(m::LATE_RECORDS, "store" => store.clone()).increment(late);
        }
        if dropped > 0 {
            counter!(m::DEDUPE_DROPPED, "store" => store.clone()).increment(dropped);
        }
        if missed > 0 {
            counter!(m::JOIN_MISSES, "store" => store.clone()).increment(missed);
        }
    }
}

/// A delayed record of `store` cannot be read back: it is dropped from the store.
pub fn delayed_unreadable(store: &str, why: &str) {
    error!(
        store,
        why, "a delayed record cannot be read back; it is removed from the store, not sent"
    );
}

/// Delayed records of `store` were sent, this late (milliseconds past their due time).
pub fn delay_sent(store: &str, lateness_ms: &[i64]) {
    counter!(m::DELAY_EMITTED, "store" => store.to_string()).increment(lateness_ms.len() as u64);
    let h = histogram!(m::DELAY_LATENESS, "store" => store.to_string());
    for &ms in lateness_ms {
        h.record(ms.max(0) as f64 / 1000.0);
    }
}

/// A transaction committed these state changes, and the stores hold these keys and bytes,
/// by store.
pub fn state_committed(stores: &[String], changes: &[u64], sizes: &[(u64, u64)]) {
    for (i, store) in stores.iter().enumerate() {
        let label = store.clone();
        if let Some(&n) = changes.get(i).filter(|&&n| n > 0) {
            counter!(m::STATE_CHANGES, "store" => label.clone()).increment(n);
        }
        if let Some(&(keys, bytes)) = sizes.get(i) {
            gauge!(m::STATE_KEYS, "store" => label.clone()).set(keys as f64);
            gauge!(m::STATE_BYTES, "store" => label).set(bytes as f64);
        }
    }
}

pub fn partitions_revoked(partitions: &[(String, i32)], lost: bool) {
    if lost {
        counter!(m::REBALANCES, "kind" => "lost").increment(1);
        warn!(count = partitions.len(), ?partitions, "partitions lost");
    } else {
        counter!(m::REBALANCES, "kind" => "revoke").increment(1);
        info!(count = partitions.len(), ?partitions, "partitions revoked");
    }
}

pub fn assignment_size(partitions: usize) {
    gauge!(m::ASSIGNED_PARTITIONS).set(partitions as f64);
}

pub fn consumer_error(error: &dyn std::fmt::Display) {
    counter!(m::CONSUMER_ERRORS).increment(1);
    warn!(%error, "consumer error");
}

pub fn progress(records_in: u64, records_out: u64, committed: u64, aborted: u64, rate: f64) {
    info!(
        records_in,
        records_out,
        txns_committed = committed,
        txns_aborted = aborted,
        records_per_s = rate.round(),
        "progress"
    );
}

/// The pipeline failed on a record; `on_error` says what the engine does about it.
pub fn record_failed(
    origin: &crate::record::Origin,
    error: &crate::record::RecordError,
    on_error: crate::topology::OnError,
    attempts: u32,
) {
    let (topic, partition, offset) = (&*origin.topic, origin.partition, origin.offset);
    let kind = error.kind.name();
    let stage = error.stage.to_string();
    match on_error {
        crate::topology::OnError::DeadLetter => warn!(
            topic, partition, offset, kind, stage, attempts, %error,
            "record failed; written to the dead-letter topic in this transaction"
        ),
        crate::topology::OnError::Fail => error!(
            topic, partition, offset, kind, stage, attempts, %error,
            "record failed; aborting the transaction and stopping (runtime.on_error: fail)"
        ),
        crate::topology::OnError::Skip => warn!(
            topic, partition, offset, kind, stage, attempts, %error,
            "record failed; skipped: its offset commits without output (runtime.on_error: skip)"
        ),
    }
}

/// A partition was paused on a record whose retries ran out.
pub fn partition_paused(origin: &crate::record::Origin, for_: Duration) {
    counter!(m::RETRIES, "stage" => "pause").increment(1);
    warn!(
        topic = &*origin.topic,
        partition = origin.partition,
        offset = origin.offset,
        pause_ms = for_.as_millis() as u64,
        "retries ran out; partition paused at the record, to try it again"
    );
}

/// A record was added to the dead-letter topic of the open transaction.
pub fn dead_lettered(kind: &'static str) {
    counter!(m::RECORDS_DEAD_LETTERED, "kind" => kind).increment(1);
}

/// A record failed transiently and is tried again after `delay`.
pub fn record_retry(
    origin: &crate::record::Origin,
    error: &crate::record::RecordError,
    attempt: u32,
    delay: Duration,
) {
    counter!(m::RETRIES, "stage" => "pipeline").increment(1);
    warn!(
        topic = &*origin.topic,
        partition = origin.partition,
        offset = origin.offset,
        attempt,
        delay_ms = delay.as_millis() as u64,
        %error,
        "transient failure; trying the record again"
    );
}

pub fn shutting_down() {
    info!("shutdown requested; committing the transaction in flight");
}

/// The process exits without finishing its stop: what is not committed comes again.
pub fn stop_forced(why: &str) {
    error!(
        why,
        "exiting with status 1 without a clean stop; the open transaction is aborted by the broker (on timeout, or when the next instance with this id starts), and its records come again"
    );
}

/// librdkafka statistics of one client (`client` is "consumer" or "producer").
///
/// Lag is measured against the last stable offset (`ls_offset`): under read_committed the
/// high watermark lies past transaction markers and open transactions, which would show a
/// lag that never reaches 0.
pub fn client_statistics(client: &'static str, stats: &Statistics) {
    gauge!(m::CLIENT_QUEUE_MESSAGES, "client" => client).set(stats.msg_cnt as f64);
    for broker in stats.brokers.values() {
        if broker.nodeid < 0 {
            continue; // bootstrap placeholders
        }
        let labels = [
            ("client", client.to_string()),
            ("broker", broker.nodeid.to_string()),
        ];
        gauge!(m::BROKER_UP, &labels).set(if broker.state == "UP" { 1.0 } else { 0.0 });
        if let Some(rtt) = &broker.rtt {
            gauge!(m::BROKER_RTT, &labels).set(rtt.p99 as f64 / 1e6);
        }
    }
    if client != "consumer" {
        return;
    }
    for (name, topic) in &stats.topics {
        for p in topic.partitions.values() {
            if p.partition < 0 || p.app_offset < 0 || p.ls_offset < 0 {
                continue;
            }
            let lag = (p.ls_offset - p.app_offset).max(0);
            gauge!(m::CONSUMER_LAG, "topic" => name.clone(), "partition" => p.partition.to_string())
                .set(lag as f64);
        }
    }
}

// --- Sinks (PostgreSQL outputs) ---------------------------------------------------------------

pub fn postgres_connected(output: &str, table: &str, inbox: &str) {
    info!(output, table, inbox, "postgres output ready");
}

pub fn sink_retry(output: &str, stage: &'static str, attempt: u32, error: &dyn std::fmt::Display) {
    counter!(m::RETRIES, "stage" => stage).increment(1);
    warn!(output, stage, attempt, %error, "transient database error; retrying after a backoff");
}

/// A batch committed in the database. Messages the inbox had seen before were absorbed: their
/// effect was already there (a replay after a crash or an aborted Kafka transaction).
/// What a committed batch did: distinct `messages`, of which `fresh` the inbox had not seen;
/// rows `upserted` and `deleted`.
pub struct BatchCommitted<'a> {
    pub output: &'a str,
    pub rows: u64,
    pub messages: u64,
    pub fresh: u64,
    pub upserted: u64,
    pub deleted: u64,
    pub took: Duration,
}

pub fn postgres_batch_committed(b: &BatchCommitted<'_>) {
    let (output, rows, took) = (b.output, b.rows, b.took);
    inbox_duplicates_absorbed(output, b.messages.saturating_sub(b.fresh));
    debug!(
        output,
        rows,
        messages = b.messages,
        fresh = b.fresh,
        upserted = b.upserted,
        deleted = b.deleted,
        took_ms = took.as_secs_f64() * 1e3,
        "database batch committed"
    );
}

pub fn postgres_replay_detected(output: &str) {
    debug!(
        output,
        "the batch holds messages applied before; applying it with ON CONFLICT DO NOTHING"
    );
}

pub fn inbox_duplicates_absorbed(output: &str, count: u64) {
    if count > 0 {
        counter!(m::INBOX_DUPLICATES, "output" => output.to_string()).increment(count);
        info!(
            output,
            count, "messages applied before were absorbed by the inbox"
        );
    }
}

/// Gaps logged one by one per batch at most; the rest are counted in one line.
const GAPS_LOGGED: usize = 100;

/// A PostgreSQL output applied rows that follow missing sequences (`on_sequence_gap:
/// apply`): `missing` sequences in all, and each id with its missing range.
pub fn sequence_gaps<'a>(
    output: &str,
    missing: u64,
    gaps: impl IntoIterator<Item = (&'a str, String)>,
) {
    counter!(m::SEQUENCE_GAPS, "output" => output.to_string()).increment(missing);
    let mut more = 0u64;
    for (i, (id, range)) in gaps.into_iter().enumerate() {
        if i < GAPS_LOGGED {
            warn!(output, id, missing = %range, "sequence gap: applied a record past missing sequences");
        } else {
            more += 1;
        }
    }
    if more > 0 {
        warn!(output, gaps = more, "sequence gap: more gaps in this batch");
    }
}

/// A participant (`by`: a database, an HTTP endpoint) refused a record (the batch committed
/// nothing): the Kafka transaction is aborted and redone, and the record handled as a failed
/// one when it comes again.
pub fn participant_refused(
    by: &'static str,
    origin: Option<&crate::record::Origin>,
    failure: &crate::record::RecordError,
) {
    let who = match by {
        "http" => "the endpoint",
        "postgres" => "the database",
        _ => "an output",
    };
    warn!(
        output = %failure.stage,
        topic = origin.map_or("", |o| &*o.topic),
        partition = origin.map_or(-1, |o| o.partition),
        offset = origin.map_or(-1, |o| o.offset),
        error = failure.message.as_str(),
        "{who} refused a record; redoing the transaction without it"
    );
}

pub fn http_output_ready(output: &str, method: &str, url: &str) {
    info!(output, method, url, "http output ready");
}

/// One request of an HTTP output answered (`class` 2xx..5xx) or failed without an answer
/// (`error`).
pub fn http_request(output: &str, class: &'static str, took: Duration) {
    counter!(m::HTTP_REQUESTS, "output" => output.to_string(), "class" => class).increment(1);
    histogram!(m::HTTP_DURATION, "output" => output.to_string()).record(took.as_secs_f64());
}

pub fn http_retry(
    output: &str,
    origin: &crate::record::Origin,
    attempt: u32,
    error: &dyn std::fmt::Display,
) {
    counter!(m::HTTP_RETRIES, "output" => output.to_string()).increment(1);
    debug!(
        output,
        topic = %origin.topic,
        partition = origin.partition,
        offset = origin.offset,
        attempt,
        %error,
        "transient HTTP failure; calling again with the same idempotency key after a backoff"
    );
}

/// Calls of a batch not made: their keys were delivered before (`dedup`).
pub fn http_deduplicated(output: &str, calls: u64) {
    counter!(m::HTTP_DEDUPLICATED, "output" => output.to_string()).increment(calls);
    debug!(
        output,
        calls, "calls skipped: their keys were delivered before"
    );
}

pub fn http_batch_done(output: &str, calls: u64, took: Duration) {
    debug!(
        output,
        calls,
        took_ms = took.as_secs_f64() * 1e3,
        "every call of the batch made"
    );
}

pub fn sink_record_skipped(output: &str, origin: &crate::record::Origin) {
    debug!(
        output,
        topic = %origin.topic,
        partition = origin.partition,
        offset = origin.offset,
        "record without a value: nothing to write"
    );
}

pub fn inbox_cleaned(output: &str, inbox_rows: u64, tombstones: u64) {
    if inbox_rows + tombstones > 0 {
        info!(
            output,
            inbox_rows, tombstones, "expired inbox rows and deletion markers removed"
        );
    }
}

pub fn inbox_cleanup_failed(output: &str, error: &dyn std::fmt::Display) {
    warn!(output, %error, "removing expired inbox rows failed; trying again later");
}

pub fn failpoint_exit_after_db_commit(commits: u64) {
    error!(
        commits,
        "failpoint: aborting the process after a database commit, before the Kafka commit"
    );
}

// The outbox relay.

pub fn relay_started(topology: &str, instance: &str, table: &str, shards: u32, progress: &str) {
    info!(
        topology,
        instance,
        table,
        shards,
        progress_topic = progress,
        "outbox relay started"
    );
}

pub fn progress_topic_created(topic: &str, partitions: u32) {
    info!(
        topic,
        partitions, "outbox progress topic created (compacted, a partition per shard)"
    );
}

pub fn relay_connected(table: &str) {
    info!(table, "outbox relay connected to the database");
}

pub fn shard_taken(table: &str, shard: u32) {
    info!(
        table,
        shard, "outbox shard taken: fencing its previous publisher and resolving it"
    );
}

/// Rows in the table (when counted), the age of the oldest (0 when there is none; when
/// known), and the shards this relay holds.
pub fn outbox_pending(table: &str, rows: Option<i64>, oldest_ms: Option<i64>, shards: usize) {
    let t = table.to_string();
    if let Some(rows) = rows {
        gauge!(m::OUTBOX_PENDING, "table" => t.clone()).set(rows as f64);
    }
    if let Some(ms) = oldest_ms {
        gauge!(m::OUTBOX_OLDEST, "table" => t.clone()).set(ms.max(0) as f64 / 1e3);
    }
    gauge!(m::OUTBOX_SHARDS, "table" => t).set(shards as f64);
}

/// Rows published before (their progress record committed) but not deleted, deleted now.
pub fn outbox_resolved(table: &str, shard: u32, rows: u64, by: &str) {
    counter!(m::OUTBOX_RESOLVED, "table" => table.to_string()).increment(rows);
    if rows > 0 {
        warn!(
            table,
            shard,
            rows,
            published_by = by,
            "outbox rows published before a crash and not deleted: deleted now, not published again"
        );
    }
}

/// A batch committed in Kafka; `latencies` from each row's insert to the commit.
pub fn outbox_published(table: &str, rows: u64, latencies: impl Iterator<Item = Duration>) {
    let t = table.to_string();
    counter!(m::OUTBOX_PUBLISHED, "table" => t.clone()).increment(rows);
    counter!(m::OUTBOX_BATCHES, "table" => t.clone()).increment(1);
    let latency = histogram!(m::OUTBOX_LATENCY, "table" => t);
    for l in latencies {
        latency.record(l.as_secs_f64());
    }
}

pub fn failpoint_exit_after_kafka_commit(commits: u64) {
    error!(
        commits,
        "failpoint: aborting the process after a Kafka commit, before the database commit"
    );
}

pub fn relay_connection_lost(table: &str, shards: usize, error: &dyn std::fmt::Display) {
    warn!(
        table,
        shards,
        %error,
        "outbox relay lost its database connection, and with it its shards; reconnecting"
    );
}

pub fn relay_kafka_failed(table: &str, shard: u32, error: &str) {
    warn!(
        table,
        shard, error, "outbox batch not published (aborted); the shard is resolved again"
    );
}

pub fn relay_retry(attempt: u32, delay: Duration, why: &str) {
    counter!(m::RETRIES, "stage" => "outbox").increment(1);
    debug!(
        attempt,
        delay_ms = delay.as_millis() as u64,
        why,
        "outbox relay retrying after a backoff"
    );
}

pub fn outbox_row_failed(table: &str, id: &str, error: &crate::record::RecordError) {
    warn!(table, id, kind = error.kind.name(), %error, "outbox row failed");
}

pub fn publish_abort_failed(why: &dyn std::fmt::Display, error: &dyn std::fmt::Display) {
    warn!(%why, %error, "cannot abort the transaction; the next producer with its id fences it");
}

/// Where a published batch's time went: claiming its rows, sending its records, committing
/// the Kafka transaction, deleting the rows and committing the database transaction.
pub fn outbox_batch_timing(table: &str, shard: u32, rows: usize, took: [Duration; 4]) {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    debug!(
        table,
        shard,
        rows,
        claim_ms = ms(took[0]),
        send_ms = ms(took[1]),
        commit_ms = ms(took[2]),
        delete_ms = ms(took[3]),
        "outbox batch published"
    );
}
