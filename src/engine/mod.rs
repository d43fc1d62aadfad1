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
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::{ClientContext, TopicPartitionList};

use crate::telemetry;
use crate::topology::Topology;
use crate::transform::{Origin, Pipeline, Record};
pub use clients::Identity;
use txn::{Added, Txn, TxnSettings, TxnStats, lock};

/// How many records the loop handles between two servings of the producer's delivery reports
/// (and at every idle poll).
const SERVE_DELIVERIES_EVERY: u32 = 64;

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
}

impl ClientContext for EngineContext {}

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
                    txn.abort_and_rewind(consumer, "partitions lost")
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
    let producer_config = clients::producer_config(topology, identity);
    let txn = Arc::new(Mutex::new(Txn::new(producer_config, settings)?));
    let context = EngineContext {
        txn: Arc::clone(&txn),
        failure: Mutex::new(None),
    };
    let consumer: BaseConsumer<EngineContext> = clients::consumer_config(topology, identity)
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
    let mut since_poll: u32 = 0;
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
                break Err(EngineError::ConsumerFatal(code.to_string()));
            }
            Some(Err(e)) => telemetry::consumer_error(&e),
            Some(Ok(msg)) => {
                consumed += 1;
                let record = to_record(&msg);
                drop(msg);
                // The pipeline takes the record; only its origin is needed afterwards (not a
                // copy of its key and value).
                let origin = record.origin.clone();
                produced.clear();
                if let Err(e) = pipeline.process(record, &mut produced) {
                    // Until dead-lettering exists, a failing record stops the job rather than
                    // being skipped: its offset is never committed, nothing is lost.
                    let _ = txn.abort_and_rewind(&consumer, "transform failed");
                    break Err(EngineError::Transform {
                        topic: origin.topic,
                        partition: origin.partition,
                        offset: origin.offset,
                        message: e.to_string(),
                    });
                }
                outputs.clear();
                outputs.extend(produced.drain(..).map(|r| (output, r)));
                match txn.add(&consumer, &origin, &outputs) {
                    Ok(Added::Yes | Added::Aborted) => {}
                    Err(e) => break Err(e),
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
        if txn.is_due(Instant::now()) {
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
                    let _ = txn.abort_and_rewind(&consumer, "job stopping on error");
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
