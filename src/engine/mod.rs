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
pub mod txn;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::{ClientContext, TopicPartitionList};

use crate::telemetry::{self, AbortReason, health::Health};
use crate::topology::Topology;
use crate::transform::{Origin, Pipeline, Record};
pub use clients::Identity;
use txn::{Added, Txn, TxnSettings, TxnStats, lock};

/// Why a job stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("kafka client: {0}")]
    Client(String),
    #[error("{0}")]
    Fatal(String),
    #[error("consumer fenced or failed fatally: {0}")]
    ConsumerFatal(String),
    #[error("transform failed on {topic}[{partition}]@{offset}: {message}")]
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
    /// How often a progress line is logged.
    pub progress_every: Option<Duration>,
    /// Where the job reports its readiness.
    pub health: Arc<Health>,
    /// librdkafka statistics (lag, rtt, queues) this often; `None` turns them off.
    pub statistics_every: Option<Duration>,
}

/// What a run did, counting committed work only.
#[derive(Debug, Clone, Copy)]
pub struct Summary {
    pub txn: TxnStats,
    pub elapsed: Duration,
}

/// The consumer's context: it reaches the transaction owner from the rebalance callback.
struct EngineContext {
    txn: Arc<Mutex<Txn>>,
    /// A fatal error raised inside a callback, for the loop to return.
    failure: Mutex<Option<EngineError>>,
    health: Arc<Health>,
}

impl ClientContext for EngineContext {
    fn stats(&self, statistics: rdkafka::Statistics) {
        telemetry::client_statistics("consumer", &statistics);
    }
}

impl ConsumerContext for EngineContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => telemetry::partitions_assigned(&partitions(tpl)),
            Rebalance::Revoke(tpl) => {
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

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, _: &Rebalance<'_>) {
        let assigned = consumer.assignment().map_or(0, |tpl| tpl.count());
        telemetry::assignment_size(assigned);
        self.health.set_assigned(assigned);
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

/// At debug level, a span with the record's origin and message id, so one message can be
/// followed end to end; at other levels a disabled span that costs next to nothing.
fn record_span(record: &Record) -> tracing::Span {
    if !tracing::enabled!(tracing::Level::DEBUG) {
        return tracing::Span::none();
    }
    let message_id = record
        .headers
        .iter()
        .find(|(k, _)| k == MESSAGE_ID_HEADER)
        .map(|(_, v)| String::from_utf8_lossy(v).into_owned());
    tracing::debug_span!(
        "record",
        topic = %record.origin.topic,
        partition = record.origin.partition,
        offset = record.origin.offset,
        message_id = message_id.as_deref().unwrap_or(""),
    )
}

/// The header whose value names a message across systems, when producers set it.
pub const MESSAGE_ID_HEADER: &str = "message-id";

/// Runs one job until `shutdown` is set, `options` say stop, or a fatal error.
pub fn run(
    topology: &Topology,
    identity: &Identity,
    options: &RunOptions,
    shutdown: &AtomicBool,
) -> Result<Summary, EngineError> {
    let started = Instant::now();
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
    };
    let consumer: BaseConsumer<EngineContext> = consumer_config
        .create_with_context(context)
        .map_err(|e| EngineError::Client(format!("cannot create the consumer: {e}")))?;
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

    let pipeline = Pipeline::new(&topology.pipeline);
    let output = topology.output_topic();
    let mut produced: Vec<Record> = Vec::new();
    let mut outputs: Vec<(&str, Record)> = Vec::new();
    let mut last_progress = Instant::now();
    let mut consumed: u64 = 0;
    let mut next_tick = Instant::now();
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
                let record = to_record(&msg);
                drop(msg);
                let _record_span = record_span(&record).entered();
                produced.clear();
                if let Err(e) = pipeline.process(record.clone(), &mut produced) {
                    // Until dead-lettering exists, a failing record stops the job rather than
                    // being skipped: its offset is never committed, nothing is lost.
                    let _ = txn.abort_and_rewind(
                        &consumer,
                        AbortReason::TransformFailed,
                        &e.to_string(),
                    );
                    break Err(EngineError::Transform {
                        topic: record.origin.topic,
                        partition: record.origin.partition,
                        offset: record.origin.offset,
                        message: e.to_string(),
                    });
                }
                if txn.has_sinks() {
                    if let Err(e) = txn.stage(&produced) {
                        // Like a failing transform: until dead-lettering exists, the job stops
                        // on a record no sink can take, committing nothing of its batch.
                        let _ = txn.abort_and_rewind(
                            &consumer,
                            AbortReason::SinkFailed,
                            &e.to_string(),
                        );
                        break Err(e.into());
                    }
                }
                outputs.clear();
                if let Some(topic) = output {
                    outputs.extend(produced.drain(..).map(|r| (topic, r)));
                }
                match txn.add(&consumer, &record, &outputs) {
                    Ok(Added::Yes | Added::Aborted) => {}
                    Err(e) => break Err(e),
                }
            }
        }
        txn.poll();
        let now = Instant::now();
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
        elapsed: started.elapsed(),
    })
}
