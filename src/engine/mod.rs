//! The read-process-write loop of one job.
//!
//! One thread owns the consumer and, through [`txn::Txn`], the transactional producer. It
//! polls a record, runs the pipeline, adds the outputs and the consumed offset to the open
//! transaction, and commits when the transaction is due. The consumer's rebalance callback
//! runs on the same thread (inside `poll`) and commits the transaction in flight before
//! partitions are revoked, or aborts it when they were lost.
//!
//! Every call here blocks; [`run`] is meant for a dedicated thread (`spawn_blocking`), never
//! for an async executor's worker.

pub mod classify;
pub mod clients;
pub mod offsets;
pub mod retry;
pub mod txn;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::{ClientContext, TopicPartitionList};

use crate::dlq;
use crate::sink::SinkErrorKind;
use crate::sync::lock;
use crate::telemetry::{self, AbortReason, health::Health};
use crate::topology::{OnError, OnExhausted, Topology};
use crate::transform::{ErrorKind, Origin, Pipeline, Record, Stage, TransformError};
pub use clients::Identity;
use retry::Backoff;
use txn::{Added, Committed, Txn, TxnSettings, TxnStats};

/// How many records the loop handles between two servings of the producer's delivery reports
/// (and at every idle poll).
const SERVE_DELIVERIES_EVERY: u32 = 64;

/// Why a job stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("invalid topology: {0}")]
    Config(String),
    #[error("kafka client: {0}")]
    Client(String),
    #[error("{0}")]
    Fatal(String),
    #[error("consumer fenced or failed fatally: {0}")]
    ConsumerFatal(String),
    #[error("record {topic}[{partition}]@{offset} failed: {message}")]
    Transform {
        topic: String,
        partition: i32,
        offset: i64,
        message: String,
    },
    #[error(transparent)]
    Sink(#[from] crate::sink::SinkError),
}

/// How a run ends besides a shutdown signal.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Stop once this many consumed records are committed.
    pub stop_after_records: Option<u64>,
    /// Test-only failpoint: abort every n-th transaction instead of committing it.
    pub abort_every: Option<u64>,
    /// Test-only failpoint: the pipeline fails transiently this many times (in all) first.
    pub transient_failures: u64,
    /// How often a progress line is logged.
    pub progress_every: Option<Duration>,
    /// Where the job reports its readiness.
    pub health: Arc<Health>,
    /// librdkafka statistics (lag, rtt, queues) this often; `None` turns them off.
    pub statistics_every: Option<Duration>,
}

/// What a run did, counting committed work only (except `skipped`).
#[derive(Debug, Clone)]
pub struct Summary {
    pub txn: TxnStats,
    /// Records the pipeline failed on and `runtime.on_error: skip` passed over. Counted when
    /// processed: a record of a transaction that was aborted and redone counts twice.
    pub skipped: u64,
    pub elapsed: Duration,
    /// Time from the first consumed record to the end: throughput without start-up.
    pub busy: Duration,
}

/// The consumer's context: it reaches the transaction owner from the rebalance callback.
struct EngineContext {
    txn: Arc<Mutex<Txn>>,
    /// A fatal error raised inside a callback, for the loop to return.
    failure: Mutex<Option<EngineError>>,
    health: Arc<Health>,
    assigned: std::sync::atomic::AtomicI64,
}

impl ClientContext for EngineContext {
    fn stats(&self, statistics: rdkafka::Statistics) {
        telemetry::client_statistics("consumer", &statistics);
    }
}

impl ConsumerContext for EngineContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => {
                telemetry::partitions_assigned(&partitions(tpl));
                self.count_assigned(tpl.count() as i64);
            }
            Rebalance::Revoke(tpl) => {
                self.count_assigned(-(tpl.count() as i64));
                let lost = consumer.assignment_lost();
                telemetry::partitions_revoked(&partitions(tpl), lost);
                let mut txn = lock(&self.txn);
                // Lost partitions may already belong to another member: nothing of ours for
                // them may commit. Revoked ones are handed over cleanly: commit first.
                let result = if lost {
                    txn.abort_and_rewind(consumer, AbortReason::PartitionsLost, "")
                } else {
                    txn.commit(consumer).map(|_| ())
                };
                if let Err(e) = result {
                    *lock(&self.failure) = Some(e);
                }
            }
            Rebalance::Error(e) => telemetry::consumer_error(e),
        }
    }
}

impl EngineContext {
    /// Keeps the number of assigned partitions from the rebalance events themselves: asking
    /// the consumer (`assignment()`) from a rebalance callback deadlocks while it closes.
    /// Cooperative rebalances carry the partitions added or removed; eager ones revoke
    /// everything before assigning the new set, so the sum holds for both.
    fn count_assigned(&self, delta: i64) {
        let now = (self.assigned.fetch_add(delta, Ordering::Relaxed) + delta).max(0) as usize;
        telemetry::assignment_size(now);
        self.health.set_assigned(now);
    }
}

fn partitions(tpl: &TopicPartitionList) -> Vec<(String, i32)> {
    tpl.elements()
        .iter()
        .map(|e| (e.topic().to_string(), e.partition()))
        .collect()
}

fn to_record(msg: &BorrowedMessage<'_>) -> Record {
    let headers = msg
        .headers()
        .map(|hs| {
            hs.iter()
                .map(|h| {
                    (
                        h.key.to_string(),
                        h.value.map(<[u8]>::to_vec).unwrap_or_default(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    Record {
        key: msg.key().map(<[u8]>::to_vec),
        value: msg.payload().map(<[u8]>::to_vec),
        headers,
        timestamp: msg.timestamp().to_millis(),
        origin: Origin {
            topic: msg.topic().to_string(),
            partition: msg.partition(),
            offset: msg.offset(),
        },
    }
}

/// Every topic the job writes to must exist: a send to a missing topic fails every
/// transaction that holds it, and the job would abort and rewind forever.
fn check_topics_exist<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topics: &[&str],
    what: &str,
    timeout: Duration,
) -> Result<(), EngineError> {
    for topic in topics {
        // A broker that is briefly unreachable (restarting, a lost connection) is waited for
        // until the timeout, as the producer's registration waits for its coordinator.
        let deadline = Instant::now() + timeout;
        let metadata = loop {
            let left = deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(100));
            match consumer.fetch_metadata(Some(topic), left) {
                Ok(m) => break m,
                Err(e) if Instant::now() < deadline => {
                    telemetry::consumer_error(&e);
                    std::thread::sleep(Duration::from_millis(500));
                }
                Err(e) => {
                    return Err(EngineError::Client(format!(
                        "cannot read metadata of {topic}: {e}"
                    )));
                }
            }
        };
        let exists = metadata
            .topics()
            .iter()
            .any(|t| t.name() == *topic && t.error().is_none() && !t.partitions().is_empty());
        if !exists {
            return Err(EngineError::Config(format!(
                "topic `{topic}`, {what}, does not exist: create it first"
            )));
        }
    }
    Ok(())
}

/// Stops fetching `origin`'s partition and seeks it back to the record, so that the record
/// is the first one consumed when the partition resumes.
fn pause_at<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    origin: &Origin,
) -> Result<(), EngineError> {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(&origin.topic, origin.partition);
    consumer.pause(&tpl).map_err(|e| {
        EngineError::Client(format!(
            "cannot pause {}[{}]: {e}",
            origin.topic, origin.partition
        ))
    })?;
    consumer
        .seek(
            &origin.topic,
            origin.partition,
            rdkafka::Offset::Offset(origin.offset),
            Duration::from_secs(10),
        )
        .map_err(|e| {
            EngineError::Client(format!(
                "cannot seek {}[{}]: {e}",
                origin.topic, origin.partition
            ))
        })
}

/// Resumes the paused partitions whose time has come. A partition revoked meanwhile cannot
/// be resumed; that is logged, not fatal (its next owner starts unpaused).
fn resume_due<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    paused: &mut Vec<(String, i32, Instant)>,
    now: Instant,
) {
    if paused.iter().all(|(_, _, until)| *until > now) {
        return;
    }
    let mut tpl = TopicPartitionList::new();
    paused.retain(|(topic, partition, until)| {
        let due = *until <= now;
        if due {
            tpl.add_partition(topic, *partition);
        }
        !due
    });
    if let Err(e) = consumer.resume(&tpl) {
        telemetry::consumer_error(&e);
    }
}

/// The failure the transient failpoint injects.
fn injected_failure() -> TransformError {
    TransformError {
        kind: ErrorKind::Unavailable,
        stage: Stage::Decode,
        message: "injected transient failure".into(),
    }
}

/// The producer's `message.max.bytes`: a larger record fails at send, for good.
fn max_message_bytes(topology: &Topology) -> usize {
    let k = &topology.kafka;
    k.producer
        .get("message.max.bytes")
        .or_else(|| k.common.get("message.max.bytes"))
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000)
}

/// Approximate encoded size of a record: key, value, headers and librdkafka's framing.
fn encoded_size(rec: &Record) -> usize {
    const OVERHEAD: usize = 128;
    rec.key.as_ref().map_or(0, Vec::len)
        + rec.value.as_ref().map_or(0, Vec::len)
        + rec
            .headers
            .iter()
            .map(|(k, v)| k.len() + v.len() + 8)
            .sum::<usize>()
        + OVERHEAD
}

/// Refuses outputs too large to send, before any of them is sent: a record either goes out
/// whole or to the dead-letter topic.
fn check_sizes(outputs: &[(usize, Record)], max: usize) -> Result<(), TransformError> {
    match outputs.iter().find(|(_, r)| encoded_size(r) > max) {
        None => Ok(()),
        Some((index, r)) => Err(TransformError {
            kind: ErrorKind::TooLarge,
            stage: Stage::Output {
                index: *index,
                name: String::new(),
            },
            message: format!(
                "output of about {} bytes exceeds message.max.bytes ({max})",
                encoded_size(r)
            ),
        }),
    }
}

/// A dead-letter record too large to send keeps its headers and drops its value.
fn fit_dead_letter(mut letter: Record, max: usize) -> Record {
    if encoded_size(&letter) > max {
        letter.value = None;
        letter
            .headers
            .push(("onceflow.error.value-dropped".into(), b"too large".to_vec()));
    }
    letter
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// At debug level, a span with the record's origin and message id, so one message can be
/// followed end to end; at other levels a disabled span that costs next to nothing.
fn record_span(origin: &Origin, msg: &BorrowedMessage<'_>) -> tracing::Span {
    if !tracing::enabled!(tracing::Level::DEBUG) {
        return tracing::Span::none();
    }
    let message_id = msg.headers().and_then(|hs| {
        hs.iter()
            .find(|h| h.key == MESSAGE_ID_HEADER)
            .map(|h| String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned())
    });
    tracing::debug_span!(
        "record",
        topic = %origin.topic,
        partition = origin.partition,
        offset = origin.offset,
        message_id = message_id.as_deref().unwrap_or(""),
    )
}

/// The header whose value names a message across systems, when producers set it.
pub const MESSAGE_ID_HEADER: &str = "message-id";

/// How long one transactional client call may take before the process counts as stuck: it
/// is bounded by the transaction timeout itself, so twice that and 5 s more.
pub fn call_bound(topology: &Topology) -> Duration {
    Duration::from_millis(topology.runtime.transaction_timeout_ms.saturating_mul(2) + 5_000)
}

/// Runs one job until `shutdown` is set, `options` say stop, or a fatal error.
pub fn run(
    topology: &Topology,
    identity: &Identity,
    options: &RunOptions,
    shutdown: &AtomicBool,
) -> Result<Summary, EngineError> {
    let started = Instant::now();
    let pipeline = Pipeline::compile(topology).map_err(|issues| {
        EngineError::Config(
            issues
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; "),
        )
    })?;
    let runtime = &topology.runtime;
    let settings = TxnSettings {
        commit_interval: Duration::from_millis(runtime.commit_interval_ms),
        max_records: runtime.max_records_per_txn,
        max_bytes: runtime.max_bytes_per_txn,
        operation_timeout: Duration::from_millis(runtime.transaction_timeout_ms),
        abort_every: options.abort_every,
        guarantee: runtime.guarantee,
    };
    let _job_span = tracing::info_span!("job", topology = %topology.name).entered();
    let health = Arc::clone(&options.health);
    health.set_bound(Duration::from_millis(
        runtime.transaction_timeout_ms + runtime.commit_interval_ms,
    ));
    health.set_call_bound(call_bound(topology));
    let mut producer_config = clients::producer_config(topology, identity);
    let mut consumer_config = clients::consumer_config(topology, identity);
    if let Some(every) = options.statistics_every {
        let ms = every.as_millis().max(1).to_string();
        producer_config.set("statistics.interval.ms", &ms);
        consumer_config.set("statistics.interval.ms", &ms);
    }
    let sinks = crate::sink::Sinks::from_topology(topology)?;
    let txn = Arc::new(Mutex::new(
        Txn::new(producer_config, settings, Arc::clone(&health))?.with_sinks(sinks),
    ));
    let context = EngineContext {
        txn: Arc::clone(&txn),
        failure: Mutex::new(None),
        health: Arc::clone(&health),
        assigned: std::sync::atomic::AtomicI64::new(0),
    };
    let consumer: BaseConsumer<EngineContext> = consumer_config
        .create_with_context(context)
        .map_err(|e| EngineError::Client(format!("cannot create the consumer: {e}")))?;
    let dead_letter_topic = topology.dead_letter_topic();
    let metadata_timeout = Duration::from_millis(runtime.transaction_timeout_ms);
    let outputs_wanted: Vec<&str> = topology
        .output_topics()
        .into_iter()
        .filter(|t| !t.is_empty())
        .collect();
    check_topics_exist(
        &consumer,
        &outputs_wanted,
        "an output topic",
        metadata_timeout,
    )?;
    // Checked when the first record needs it: a job without poison records needs none.
    let mut dead_letter_checked = false;
    let inputs = topology.input_topics();
    consumer
        .subscribe(&inputs)
        .map_err(|e| EngineError::Client(format!("cannot subscribe to {inputs:?}: {e}")))?;
    telemetry::job_started(
        &topology.name,
        &clients::transactional_id(topology, &identity.instance_id),
        &topology.group_id(),
        &inputs,
    );

    let topics = topology.output_topics();
    let mut produced: Vec<(usize, Record)> = Vec::new();
    let mut skipped: u64 = 0;
    let backoff = Backoff {
        initial: Duration::from_millis(runtime.retry_backoff_ms),
        max: Duration::from_millis(runtime.retry_backoff_max_ms),
        max_attempts: runtime.max_attempts,
    };
    let max_message_bytes = max_message_bytes(topology);
    let mut injected_failures = options.transient_failures;
    // Partitions paused on a record whose retries ran out, and when to resume them.
    let mut paused: Vec<(String, i32, Instant)> = Vec::new();
    let mut outputs: Vec<(&str, Record)> = Vec::new();
    let mut last_progress = Instant::now();
    let mut consumed: u64 = 0;
    let mut next_tick = Instant::now();
    let mut since_poll: u32 = 0;
    let mut first_record: Option<Instant> = None;
    let max_wait = Duration::from_millis(100);

    let result = loop {
        if shutdown.load(Ordering::Relaxed) {
            telemetry::shutting_down();
            break Ok(());
        }
        let wait = lock(&txn)
            .due_in(Instant::now())
            .map_or(max_wait, |d| d.min(max_wait));
        let polled = consumer.poll(wait);
        if let Some(e) = lock(&consumer.context().failure).take() {
            break Err(e);
        }
        let mut txn = lock(&txn);
        let idle = polled.is_none();
        match polled {
            None => {}
            Some(Err(KafkaError::MessageConsumptionFatal(code))) => {
                if code == RDKafkaErrorCode::FencedInstanceId {
                    telemetry::consumer_fenced(&code);
                }
                break Err(EngineError::ConsumerFatal(code.to_string()));
            }
            Some(Err(e)) => telemetry::consumer_error(&e),
            Some(Ok(msg)) => {
                consumed += 1;
                first_record.get_or_insert_with(Instant::now);
                // The pipeline takes each attempt's record by value: it is built from the
                // consumed message, which stays at hand for a dead-letter copy of the original,
                // so the common path copies key, value and headers once.
                let origin = Origin {
                    topic: msg.topic().to_string(),
                    partition: msg.partition(),
                    offset: msg.offset(),
                };
                let consumed_bytes =
                    msg.key().map_or(0, <[u8]>::len) + msg.payload().map_or(0, <[u8]>::len);
                let _record_span = record_span(&origin, &msg).entered();
                // Transient failures are retried with backoff; the open transaction commits
                // first, so it is not held open while waiting.
                let mut attempt = 1;
                let mut failure = None;
                // A record a sink refused in an aborted transaction is not processed again:
                // it is handled as failed.
                let refused = txn.refused(&origin);
                let processed = if let Some(refusal) = refused {
                    Some(Err(refusal))
                } else {
                    loop {
                        produced.clear();
                        let result = if injected_failures > 0 {
                            injected_failures -= 1;
                            Err(injected_failure())
                        } else {
                            pipeline.process(to_record(&msg), &mut produced)
                        };
                        match result {
                            Err(e) if !e.is_permanent() && backoff.may_retry(attempt) => {
                                match txn.commit(&consumer) {
                                    Ok(Committed::Done | Committed::Nothing) => {}
                                    // The rewind moved this partition back: the record comes again.
                                    Ok(Committed::Aborted) => break None,
                                    Err(e) => {
                                        failure = Some(e);
                                        break None;
                                    }
                                }
                                let delay = backoff.delay(attempt, rand::random());
                                telemetry::record_retry(&origin, &e, attempt, delay);
                                std::thread::sleep(delay);
                                attempt += 1;
                            }
                            other => break Some(other),
                        }
                    }
                };
                if let Some(e) = failure {
                    break Err(e);
                }
                let processed =
                    processed.map(|r| r.and_then(|()| check_sizes(&produced, max_message_bytes)));
                // A record a sink cannot take (its value cannot become a row) fails like one
                // the pipeline cannot process.
                let processed = match processed {
                    Some(Ok(())) if txn.has_sinks() => match txn.stage(&produced) {
                        Ok(()) => Some(Ok(())),
                        Err(e) if e.kind == SinkErrorKind::Permanent => Some(Err(e.failure())),
                        Err(e) => {
                            let _ = txn.abort_and_rewind(
                                &consumer,
                                AbortReason::SinkFailed,
                                &e.to_string(),
                            );
                            break Err(e.into());
                        }
                    },
                    other => other,
                };
                let mut handled = processed.is_none();
                let exhausted_transient = matches!(&processed, Some(Err(e)) if !e.is_permanent());
                if exhausted_transient && runtime.on_exhausted == OnExhausted::Pause {
                    // Keep the transaction clean: commit what is open, then stop this
                    // partition at this record and try it again after the longest backoff.
                    handled = true;
                    match txn.commit(&consumer) {
                        Ok(Committed::Done | Committed::Nothing) => {
                            let until = Instant::now() + backoff.max;
                            if let Err(e) = pause_at(&consumer, &origin) {
                                break Err(e);
                            }
                            telemetry::partition_paused(&origin, backoff.max);
                            paused.push((origin.topic.clone(), origin.partition, until));
                        }
                        // The rewind moved this partition back: the record comes again.
                        Ok(Committed::Aborted) => {}
                        Err(e) => break Err(e),
                    }
                } else if let Some(Err(e)) = processed {
                    telemetry::record_failed(&origin, &e, runtime.on_error, attempt);
                    match runtime.on_error {
                        OnError::DeadLetter => {
                            produced.clear();
                            if !dead_letter_checked {
                                if let Err(err) = check_topics_exist(
                                    &consumer,
                                    &[dead_letter_topic.as_str()],
                                    "the dead-letter topic (dead_letter.topic; or set runtime.on_error to fail or skip)",
                                    metadata_timeout,
                                ) {
                                    // Nothing of this record is committed: it comes again.
                                    let _ = txn.abort_and_rewind(
                                        &consumer,
                                        AbortReason::TransformFailed,
                                        &err.to_string(),
                                    );
                                    break Err(err);
                                }
                                dead_letter_checked = true;
                            }
                            let letter = dlq::dead_letter(
                                &to_record(&msg),
                                &dlq::Failure {
                                    kind: e.kind.name().to_string(),
                                    message: e.message.clone(),
                                    stage: e.stage.to_string(),
                                    attempts: attempt,
                                },
                                &topology.name,
                                &identity.instance_id,
                                now_ms(),
                            );
                            let letter = fit_dead_letter(letter, max_message_bytes);
                            handled = true;
                            match txn.add(
                                &consumer,
                                &origin,
                                consumed_bytes,
                                &[(dead_letter_topic.as_str(), letter)],
                            ) {
                                Ok(Added::Yes) => telemetry::dead_lettered(e.kind.name()),
                                Ok(Added::Aborted) => {}
                                Err(e) => break Err(e),
                            }
                        }
                        // The offset is never committed, nothing is lost.
                        OnError::Fail => {
                            let _ = txn.abort_and_rewind(
                                &consumer,
                                AbortReason::TransformFailed,
                                &e.to_string(),
                            );
                            break Err(EngineError::Transform {
                                topic: origin.topic,
                                partition: origin.partition,
                                offset: origin.offset,
                                message: e.to_string(),
                            });
                        }
                        // Skipped on purpose: the offset commits with no output, and the
                        // record was logged with its origin.
                        OnError::Skip => {
                            skipped += 1;
                            produced.clear();
                        }
                    }
                }
                if handled {
                    // Dead-lettered, or to come again after a rewind.
                } else {
                    outputs.clear();
                    // Outputs without a topic are sinks, staged above.
                    outputs.extend(produced.drain(..).filter_map(|(index, r)| {
                        let topic = topics.get(index).copied().unwrap_or_default();
                        (!topic.is_empty()).then_some((topic, r))
                    }));
                    match txn.add(&consumer, &origin, consumed_bytes, &outputs) {
                        Ok(Added::Yes | Added::Aborted) => {}
                        Err(e) => break Err(e),
                    }
                }
            }
        }
        // Serving delivery reports costs a few clock reads and a lock: once in a while is
        // enough (the commit waits for every one of them anyway).
        since_poll += 1;
        if since_poll >= SERVE_DELIVERIES_EVERY || idle {
            txn.poll();
            since_poll = 0;
        }
        let now = Instant::now();
        resume_due(&consumer, &mut paused, now);
        if now >= next_tick {
            telemetry::open_txn_age(txn.age(now).unwrap_or_default());
            next_tick = now + Duration::from_secs(1);
        }
        if txn.is_due(now) {
            if let Err(e) = txn.commit(&consumer) {
                break Err(e);
            }
            if options
                .stop_after_records
                .is_some_and(|n| txn.stats().records_committed >= n)
            {
                break Ok(());
            }
        }
        if let Some(every) = options.progress_every {
            if last_progress.elapsed() >= every {
                let s = txn.stats();
                let rate = consumed as f64 / last_progress.elapsed().as_secs_f64();
                telemetry::progress(
                    s.records_committed,
                    s.outputs_committed,
                    s.committed,
                    s.aborted,
                    rate,
                );
                consumed = 0;
                last_progress = Instant::now();
            }
        }
    };

    // Commit what is in flight on a clean stop; on an error, abort it (best effort: a
    // fenced producer cannot abort, and the broker aborts it on timeout or when the
    // transactional.id is next initialised).
    let finish = {
        let mut txn = lock(&txn);
        match &result {
            Ok(()) => txn.commit(&consumer).map(|_| ()),
            Err(_) => {
                if txn.is_open() {
                    let _ = txn.abort_and_rewind(&consumer, AbortReason::Stopping, "");
                }
                Ok(())
            }
        }
    };
    let stats = lock(&txn).stats();
    if let Err(e) = result.and(finish) {
        telemetry::fatal(&e);
        return Err(e);
    }
    drop(consumer);
    Ok(Summary {
        txn: stats,
        skipped,
        elapsed: started.elapsed(),
        busy: first_record.map_or(Duration::ZERO, |t| t.elapsed()),
    })
}
