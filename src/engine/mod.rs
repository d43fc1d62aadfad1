//! The read-process-write loop of one job: source → decode → transform → encode → sinks,
//! in transactions owned by [`crate::txn`].
//!
//! One thread owns the consumer and, through [`Txn`], the transactional producer. It polls a
//! record, runs the pipeline, lets [`outcome::decide`] say what becomes of the record
//! (outputs, retry, dead letter, pause, fail, skip), carries that out in the open
//! transaction, and commits when the transaction is due. The consumer's rebalance callback
//! runs on the same thread (inside `poll`) and commits the transaction in flight before
//! partitions are revoked, or aborts it when they were lost.
//!
//! Every call here blocks; [`run`] is meant for a dedicated thread (`spawn_blocking`), never
//! for an async executor's worker.

mod due;
pub mod outcome;
mod size;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::BorrowedMessage;

use crate::dlq;
use crate::fence::{ConsumerEnd, Incarnation, Next, Rejoins};
use crate::instance::{Identity, RunOptions, Summary, call_bound};
use crate::kafka::clients;
use crate::record::check_sizes;
use crate::record::{Origin, Record, RecordError};
use crate::retry::Backoff;
use crate::sink::{SinkError, SinkErrorKind, Sinks};
use crate::source::{self, Paused, SourceContext, TopicError};
use crate::state::{self, changelog};
use crate::sync::lock;
use crate::telemetry;
use crate::topology::{ConfigIssue, Target, Topology};
use crate::transform::Pipeline;
use crate::txn::{AbortReason, Added, Committed, Consumed, Outgoing, Txn, TxnError, TxnSettings};
use outcome::{Outcome, Policy};
use size::fit_dead_letter;

pub use crate::topology::MESSAGE_ID_HEADER;

/// How many records the loop handles between two servings of the producer's delivery reports
/// (and at every idle poll).
const SERVE_DELIVERIES_EVERY: u32 = 64;

/// The longest a poll waits for a record, so that housekeeping (a due commit, paused
/// partitions to resume, the shutdown flag) runs at least this often.
const MAX_POLL_WAIT: Duration = Duration::from_millis(100);

/// Why a job stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("invalid topology: {}", issues(.0))]
    Config(Vec<ConfigIssue>),
    #[error("kafka client: {what}: {error}")]
    Client { what: String, error: KafkaError },
    #[error(transparent)]
    Topic(#[from] TopicError),
    #[error(transparent)]
    Pause(#[from] source::PauseError),
    #[error(transparent)]
    Txn(#[from] TxnError),
    #[error("consumer fenced or failed fatally: {0}")]
    ConsumerFatal(RDKafkaErrorCode),
    #[error(
        "consumer fenced again within {}s of its last fence ({code}): does another running process use group.instance.id {instance}?",
        crate::fence::FENCE_WINDOW.as_secs()
    )]
    FencedAgain {
        instance: String,
        code: RDKafkaErrorCode,
    },
    #[error("record {topic}[{partition}]@{offset} failed: {message}")]
    Transform {
        topic: String,
        partition: i32,
        offset: i64,
        message: String,
    },
    #[error(transparent)]
    Sink(#[from] SinkError),
    #[error(transparent)]
    Changelog(#[from] changelog::ChangelogError),
    #[error(transparent)]
    State(#[from] state::OpenError),
    /// The schema registry refused an output's schema (incompatible with its subject), or
    /// cannot be reached when the job starts.
    #[error("schema registry: {0}")]
    Registry(String),
}

fn issues(list: &[ConfigIssue]) -> String {
    list.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

type JobConsumer = BaseConsumer<SourceContext>;

/// Runs one job of a topology with Kafka inputs (an outbox relay is [`crate::relay::run`]; [`crate::job::run`] picks) until `shutdown` is set, `options` say stop, or a fatal error.
pub fn run(
    topology: &Topology,
    identity: &Identity,
    options: &RunOptions,
    shutdown: &AtomicBool,
) -> Result<Summary, EngineError> {
    // A fence, or an instance id refused: join again or stop, as crate::fence::Rejoins says.
    let mut rejoins = Rejoins::new(Instant::now());
    loop {
        let mut seen = Incarnation::default();
        let result = run_once(topology, identity, options, shutdown, &mut seen);
        let code = match &result {
            Err(EngineError::ConsumerFatal(code)) if !shutdown.load(Ordering::Relaxed) => *code,
            _ => return result.inspect_err(|e| telemetry::fatal(e)),
        };
        let now = Instant::now();
        let end = seen.end(code, now);
        match rejoins.after(end, seen.consumed, now) {
            Next::Rejoin(after) => {
                let own_session = end == ConsumerEnd::FencedAfterSessionTimeout;
                telemetry::rejoining_after_fence(&code, own_session, after);
                std::thread::sleep(after);
            }
            Next::WaitForId(after) => {
                telemetry::instance_id_held(&code, after);
                std::thread::sleep(after);
            }
            Next::FencedAgain => {
                let e = EngineError::FencedAgain {
                    instance: identity.instance_id.clone(),
                    code,
                };
                telemetry::fatal(&e);
                return Err(e);
            }
            Next::Stop => return result.inspect_err(|e| telemetry::fatal(e)),
        }
    }
}

/// One incarnation of the job; fills `seen` in.
fn run_once(
    topology: &Topology,
    identity: &Identity,
    options: &RunOptions,
    shutdown: &AtomicBool,
    seen: &mut Incarnation,
) -> Result<Summary, EngineError> {
    let started = Instant::now();
    let _job_span = tracing::info_span!("job", topology = %topology.name).entered();
    let (consumer, txn) = connect(topology, identity, options)?;
    let mut job = Job::new(topology, identity, options, Arc::clone(&txn))?;
    let inputs = topology.input_topics();
    consumer
        .subscribe(&inputs)
        .map_err(|error| EngineError::Client {
            what: format!("cannot subscribe to {inputs:?}"),
            error,
        })?;
    telemetry::job_started(
        &topology.name,
        &clients::transactional_id(topology, &identity.instance_id),
        &topology.group_id(),
        &inputs,
    );
    let result = job.run_loop(&consumer, shutdown).map_err(|e| {
        let consumer_fatal = consumer.client().fatal_error().map(|(code, _)| code);
        consumer_fence_first(e, consumer_fatal)
    });
    seen.consumed = job.first_record.is_some();
    seen.session_timed_out = consumer.context().session_timed_out();
    // Commit what is in flight on a clean stop; on an error, abort it (best effort: a
    // fenced producer cannot abort, and the broker aborts it on timeout or when the
    // transactional.id is next initialised).
    let finish = {
        let mut txn = lock(&txn);
        match &result {
            Ok(()) => txn.commit(&consumer).map(|_| ()).map_err(EngineError::from),
            Err(_) => {
                if txn.is_open() {
                    let _ = txn.abort_and_rewind(&consumer, AbortReason::Stopping, "");
                }
                Ok(())
            }
        }
    };
    let stats = lock(&txn).stats().clone();
    result.and(finish)?;
    drop(consumer);
    Ok(Summary {
        txn: stats,
        skipped: job.skipped,
        elapsed: started.elapsed(),
        busy: job.first_record.map_or(Duration::ZERO, |t| t.elapsed()),
    })
}

/// An error met after the consumer was fenced is that fence, whatever call met it (a
/// rewind's offset fetch, refused with librdkafka's "Erroneous state", says nothing of it):
/// the fence rule of [`run`] then decides, as for a fence the loop's poll reports. So does a
/// commit whose TxnOffsetCommit was refused because another member took the membership,
/// which the consumer itself learns only at its next heartbeat.
fn consumer_fence_first(e: EngineError, consumer_fatal: Option<RDKafkaErrorCode>) -> EngineError {
    match (consumer_fatal, &e) {
        (_, EngineError::ConsumerFatal(_)) => e,
        (Some(RDKafkaErrorCode::FencedInstanceId), _)
        | (_, EngineError::Txn(TxnError::MemberFenced { .. })) => {
            EngineError::ConsumerFatal(RDKafkaErrorCode::FencedInstanceId)
        }
        _ => e,
    }
}

/// The transaction owner with the job's sinks, and the consumer whose context reaches it;
/// every output topic checked to exist.
fn connect(
    topology: &Topology,
    identity: &Identity,
    options: &RunOptions,
) -> Result<(JobConsumer, Arc<Mutex<Txn>>), EngineError> {
    let runtime = &topology.runtime;
    let settings = TxnSettings {
        commit_interval: Duration::from_millis(runtime.commit_interval_ms),
        max_records: runtime.max_records_per_txn,
        max_bytes: runtime.max_bytes_per_txn,
        operation_timeout: Duration::from_millis(runtime.transaction_timeout_ms),
        abort_every: options.abort_every,
        lose_commit_every: options.lose_commit_every,
        exit_after_participant_commit: options.exit_after_db_commit,
        guarantee: runtime.guarantee,
        overlap_commits: runtime.overlap_commits,
    };
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
    let sinks = Sinks::from_topology(topology)?;
    let stores = crate::state::open(topology, &identity.instance_id, &consumer_config)?;
    let changelogs = stores.changelog_topics();
    let tables = stores.table_topics();
    let txn = Txn::new(producer_config, settings, Arc::clone(&health))?
        .with_participants(sinks.into_participants())
        .with_state(stores);
    let txn = Arc::new(Mutex::new(txn));
    let consumer: JobConsumer = consumer_config
        .create_with_context(SourceContext::new(Arc::clone(&txn), health))
        .map_err(|error| EngineError::Client {
            what: "cannot create the consumer".into(),
            error,
        })?;
    if let Some(input) = topology.input_topics().first() {
        let timeout = Duration::from_millis(runtime.transaction_timeout_ms);
        if !changelogs.is_empty() {
            let cluster = clients::cluster(topology, identity);
            changelog::ensure(&cluster, &consumer, input, &changelogs, timeout)?;
        }
        changelog::check_tables(&consumer, input, &tables, timeout)?;
    }
    let outputs = topology.kafka_output_topics();
    source::check_topics_exist(
        &consumer,
        &outputs,
        "an output topic",
        Duration::from_millis(runtime.transaction_timeout_ms),
    )?;
    Ok((consumer, txn))
}

/// The loop's state: what it needs of the topology, and what it keeps between records.
struct Job<'t> {
    topology: &'t Topology,
    instance_id: &'t str,
    options: &'t RunOptions,
    pipeline: Pipeline,
    txn: Arc<Mutex<Txn>>,
    policy: Policy,
    /// The topic of each output, by the pipeline's output index; `None` for a sink.
    topics: Vec<Option<&'t str>>,
    /// Whether each output's records carry their lineage, by output index.
    lineage: Vec<bool>,
    /// The event-id header of each input topic.
    id_headers: Vec<(&'t str, &'t str)>,
    dead_letter_topic: String,
    /// Checked when the first record needs it: a job without poison records needs none.
    dead_letter_checked: bool,
    metadata_timeout: Duration,
    max_message_bytes: usize,
    /// An `aggregate` emits once per key per commit: outputs are held, the latest per key.
    coalesce: bool,
    injected_failures: u64,
    paused: Paused,
    /// What the pipeline made of the record at hand: (output index, record).
    produced: Vec<(usize, Record)>,
    /// Its Kafka outputs with their topics (kept to reuse the allocation).
    outputs: Vec<Outgoing<'t>>,
    skipped: u64,
    consumed: u64,
    first_record: Option<Instant>,
    last_progress: Instant,
    next_tick: Instant,
    since_poll: u32,
    /// How long the next poll may wait for a record: until the open transaction is due, at
    /// most [`MAX_POLL_WAIT`]. Set by [`Job::housekeeping`] from the clock it reads anyway,
    /// so a record costs no second clock read and no second lock of the transaction.
    poll_wait: Duration,
    /// The store of each `delay` step, and when the job next looks for due records.
    delays: Vec<usize>,
    next_punctuation: Instant,
}

/// Whether the loop goes on.
enum Flow {
    Continue,
    Stop,
}

impl<'t> Job<'t> {
    fn new(
        topology: &'t Topology,
        identity: &'t Identity,
        options: &'t RunOptions,
        txn: Arc<Mutex<Txn>>,
    ) -> Result<Job<'t>, EngineError> {
        let codecs = match crate::codec::Codecs::connect(topology) {
            Ok(c) => c,
            Err(crate::codec::SetupError::Config(issues)) => {
                return Err(EngineError::Config(issues));
            }
            Err(crate::codec::SetupError::Registry(message)) => {
                return Err(EngineError::Registry(message));
            }
        };
        let pipeline = Pipeline::compile_with(topology, codecs).map_err(EngineError::Config)?;
        let runtime = &topology.runtime;
        let topics = topology
            .outputs
            .iter()
            .map(|o| match o.target() {
                Some(Target::Topic(topic)) => Some(topic),
                _ => None,
            })
            .collect();
        Ok(Job {
            topology,
            instance_id: &identity.instance_id,
            options,
            pipeline,
            txn,
            policy: Policy {
                on_error: runtime.on_error,
                on_exhausted: runtime.on_exhausted,
                backoff: Backoff {
                    initial: Duration::from_millis(runtime.retry_backoff_ms),
                    max: Duration::from_millis(runtime.retry_backoff_max_ms),
                    max_attempts: runtime.max_attempts,
                },
            },
            topics,
            lineage: topology.outputs.iter().map(|o| o.lineage).collect(),
            id_headers: topology
                .inputs
                .iter()
                .map(|i| (i.topic.as_str(), i.id_header.as_str()))
                .collect(),
            dead_letter_topic: topology.dead_letter_topic(),
            dead_letter_checked: false,
            metadata_timeout: Duration::from_millis(runtime.transaction_timeout_ms),
            max_message_bytes: topology.max_message_bytes(),
            coalesce: topology.coalescing_step().is_some(),
            injected_failures: options.transient_failures,
            paused: Paused::default(),
            produced: Vec::new(),
            outputs: Vec::new(),
            skipped: 0,
            consumed: 0,
            first_record: None,
            last_progress: Instant::now(),
            next_tick: Instant::now(),
            since_poll: 0,
            poll_wait: MAX_POLL_WAIT,
            delays: due::delay_stores(topology),
            next_punctuation: Instant::now(),
        })
    }

    fn run_loop(
        &mut self,
        consumer: &JobConsumer,
        shutdown: &AtomicBool,
    ) -> Result<(), EngineError> {
        loop {
            if shutdown.load(Ordering::Relaxed) {
                telemetry::shutting_down();
                return Ok(());
            }
            let polled = consumer.poll(self.poll_wait);
            if let Some(e) = consumer.context().take_failure() {
                return Err(e.into());
            }
            let txn = Arc::clone(&self.txn);
            let mut txn = lock(&txn);
            let idle = polled.is_none();
            match polled {
                None => {}
                Some(Err(KafkaError::MessageConsumptionFatal(code))) => {
                    if code == RDKafkaErrorCode::FencedInstanceId {
                        telemetry::consumer_fenced(&code);
                    }
                    return Err(EngineError::ConsumerFatal(code));
                }
                Some(Err(e)) => telemetry::consumer_error(&e),
                Some(Ok(msg)) => self.handle(consumer, &mut txn, &msg)?,
            }
            if let Flow::Stop = self.housekeeping(consumer, &mut txn, idle)? {
                return Ok(());
            }
        }
    }

    /// One consumed message: processed, decided on, carried out.
    fn handle(
        &mut self,
        consumer: &JobConsumer,
        txn: &mut Txn,
        msg: &BorrowedMessage<'_>,
    ) -> Result<(), EngineError> {
        self.consumed += 1;
        self.first_record.get_or_insert_with(Instant::now);
        let origin = source::origin_of(msg);
        let _record_span = source::record_span(&origin, msg).entered();
        if txn.keep_redo_apart(consumer, &origin)? == Committed::Aborted {
            return Ok(());
        }
        let mut attempt = 1;
        let outcome = loop {
            let result = self.process(consumer, txn, msg, &origin)?;
            match outcome::decide(
                result.as_ref().map(|_| ()),
                attempt,
                &self.policy,
                rand::random::<f64>,
            ) {
                Outcome::Retry { delay } => {
                    // The open transaction commits first, so it is not held open while
                    // waiting.
                    if txn.commit_before(consumer, &origin)? == Committed::Aborted {
                        // The rewind moved this partition back: the record comes again.
                        return Ok(());
                    }
                    if let Err(e) = &result {
                        telemetry::record_retry(&origin, e, attempt, delay);
                    }
                    std::thread::sleep(delay);
                    attempt += 1;
                }
                other => break other,
            }
        };
        self.carry_out(consumer, txn, msg, origin, outcome, attempt)
    }

    /// Processes the record once: the pipeline, the size check, staging in the sinks. A
    /// record a sink refused in an aborted transaction is not processed again: it fails.
    /// The outer error stops the job (a sink that cannot stage for another reason than the
    /// record's fault).
    fn process(
        &mut self,
        consumer: &JobConsumer,
        txn: &mut Txn,
        msg: &BorrowedMessage<'_>,
        origin: &Origin,
    ) -> Result<Result<(), RecordError>, EngineError> {
        self.produced.clear();
        txn.state().begin_record();
        if let Some(refusal) = txn.refused(origin) {
            return Ok(Err(refusal));
        }
        if self.injected_failures > 0 {
            self.injected_failures -= 1;
            return Ok(Err(crate::failpoints::injected_failure()));
        }
        // The pipeline reads key and value where they were consumed, and copies into the
        // records it writes only what they hold; the consumed message stays at hand for a
        // dead-letter copy of the original.
        let processed = self
            .pipeline
            .process_input(
                source::to_input(msg, origin.clone()),
                txn.state(),
                &mut self.produced,
            )
            .and_then(|()| check_sizes(&self.produced, self.max_message_bytes));
        if processed.is_err() || !txn.has_participants() {
            return Ok(processed);
        }
        // A record a sink cannot take (its value cannot become a row) fails like one the
        // pipeline cannot process.
        let Err(e) = txn.stage(&self.produced) else {
            return Ok(Ok(()));
        };
        let refusal = e.refusals().into_iter().next();
        match refusal {
            Some(refusal) if e.severity() == SinkErrorKind::Permanent => Ok(Err(refusal.failure)),
            _ => {
                let _ = txn.abort_and_rewind(consumer, AbortReason::SinkFailed, &e.to_string());
                Err(TxnError::Participant(e).into())
            }
        }
    }

    /// Carries out what [`outcome::decide`] said.
    fn carry_out(
        &mut self,
        consumer: &JobConsumer,
        txn: &mut Txn,
        msg: &BorrowedMessage<'_>,
        origin: Origin,
        outcome: Outcome,
        attempts: u32,
    ) -> Result<(), EngineError> {
        let consumed = Consumed {
            origin: &origin,
            id: self.event_id(msg),
            bytes: source::consumed_bytes(msg),
        };
        let on_error = self.topology.runtime.on_error;
        match outcome {
            Outcome::Retry { .. } => Ok(()),
            Outcome::Output => {
                // Outputs without a topic are sinks, staged already. The lineage is written
                // as each record is sent.
                let topics = &self.topics;
                let lineage = &self.lineage;
                self.outputs.clear();
                self.outputs
                    .extend(self.produced.drain(..).filter_map(|(index, record)| {
                        Some(Outgoing {
                            topic: topics.get(index).copied().flatten()?,
                            record,
                            lineage: lineage.get(index).copied().unwrap_or(true),
                        })
                    }));
                let rejected = txn.state().take_rejected();
                if !rejected.is_empty() {
                    return self.add_with_rejected(consumer, txn, consumed, rejected);
                }
                let _ = if self.coalesce {
                    txn.add_latest(
                        consumer,
                        consumed,
                        rdkafka::Message::key(msg),
                        &self.outputs,
                    )?
                } else {
                    txn.add(consumer, consumed, &self.outputs)?
                };
                Ok(())
            }
            Outcome::Pause { for_ } => {
                // The record leaves no change (it comes again), then: keep the transaction
                // clean, commit what is open, stop this partition at this record and try it
                // again later.
                txn.state().discard_record();
                if txn.commit_before(consumer, &origin)? != Committed::Aborted {
                    self.paused.pause_at(consumer, &origin, for_)?;
                    telemetry::partition_paused(&origin, for_);
                }
                // Aborted: the rewind moved this partition back, the record comes again.
                Ok(())
            }
            Outcome::DeadLetter(e) => {
                telemetry::record_failed(&origin, &e, on_error, attempts);
                self.produced.clear();
                txn.state().discard_record();
                self.ensure_dead_letter_topic(consumer, txn)?;
                let letter = self.dead_letter(msg, consumed, &e, attempts);
                // A dead letter carries its origin in headers of its own.
                let letters = [Outgoing {
                    topic: self.dead_letter_topic.as_str(),
                    record: letter,
                    lineage: false,
                }];
                if txn.add(consumer, consumed, &letters)? == Added::Yes {
                    telemetry::dead_lettered(e.kind.name());
                }
                Ok(())
            }
            Outcome::Fail(e) => {
                telemetry::record_failed(&origin, &e, on_error, attempts);
                let _ =
                    txn.abort_and_rewind(consumer, AbortReason::TransformFailed, &e.to_string());
                Err(EngineError::Transform {
                    topic: origin.topic.to_string(),
                    partition: origin.partition,
                    offset: origin.offset,
                    message: e.to_string(),
                })
            }
            // Skipped on purpose: the offset commits with no output, and the record was
            // logged with its origin.
            Outcome::Skip(e) => {
                telemetry::record_failed(&origin, &e, on_error, attempts);
                self.skipped += 1;
                self.produced.clear();
                txn.state().discard_record();
                let _ = txn.add(consumer, consumed, &[])?;
                Ok(())
            }
        }
    }

    /// Adds the record's outputs with the dead letters of the records it made that failed
    /// after it (a window's final results), in one go.
    fn add_with_rejected(
        &mut self,
        consumer: &JobConsumer,
        txn: &mut Txn,
        consumed: Consumed<'_>,
        rejected: Vec<(Record, RecordError)>,
    ) -> Result<(), EngineError> {
        self.ensure_dead_letter_topic(consumer, txn)?;
        let mut all = self.outputs.clone();
        for (record, e) in &rejected {
            telemetry::record_failed(&record.origin, e, self.topology.runtime.on_error, 1);
            let letter = dlq::dead_letter(
                record,
                &dlq::Failure {
                    kind: e.kind.name().to_string(),
                    message: e.message.clone(),
                    stage: e.stage.to_string(),
                    attempts: 1,
                },
                &self.topology.name,
                self.instance_id,
                now_ms(),
            );
            all.push(Outgoing {
                topic: self.dead_letter_topic.as_str(),
                record: fit_dead_letter(letter, self.max_message_bytes),
                lineage: false,
            });
        }
        if txn.add(consumer, consumed, &all)? == Added::Yes {
            for (_, e) in &rejected {
                telemetry::dead_lettered(e.kind.name());
            }
        }
        Ok(())
    }

    /// The dead-letter topic must exist before the first record goes there; nothing of this
    /// record is committed when it does not: it comes again.
    fn ensure_dead_letter_topic(
        &mut self,
        consumer: &JobConsumer,
        txn: &mut Txn,
    ) -> Result<(), EngineError> {
        if self.dead_letter_checked {
            return Ok(());
        }
        if let Err(err) = source::check_topics_exist(
            consumer,
            &[self.dead_letter_topic.as_str()],
            "the dead-letter topic (dead_letter.topic; or set runtime.on_error to fail or skip)",
            self.metadata_timeout,
        ) {
            let _ = txn.abort_and_rewind(consumer, AbortReason::TransformFailed, &err.to_string());
            return Err(err.into());
        }
        self.dead_letter_checked = true;
        Ok(())
    }

    /// The event id of a consumed message: its input's `id_header`, when it carries one.
    fn event_id<'m>(&self, msg: &'m BorrowedMessage<'_>) -> Option<&'m [u8]> {
        use rdkafka::message::{Headers, Message};
        let name = self
            .id_headers
            .iter()
            .find(|(topic, _)| *topic == msg.topic())
            .map(|(_, h)| *h)?;
        let headers = msg.headers()?;
        crate::lineage::event_id(
            headers.iter().map(|h| (h.key, h.value.unwrap_or_default())),
            name,
        )
    }

    fn dead_letter(
        &self,
        msg: &BorrowedMessage<'_>,
        consumed: Consumed<'_>,
        e: &RecordError,
        attempts: u32,
    ) -> Record {
        let mut letter = dlq::dead_letter(
            &source::to_record(msg, consumed.origin.clone()),
            &dlq::Failure {
                kind: e.kind.name().to_string(),
                message: e.message.clone(),
                stage: e.stage.to_string(),
                attempts,
            },
            &self.topology.name,
            self.instance_id,
            now_ms(),
        );
        if let Some(id) = consumed.id {
            letter.headers.push((dlq::H_ID.into(), id.to_vec()));
        }
        fit_dead_letter(letter, self.max_message_bytes)
    }

    /// Between records: delivery reports, paused partitions, the commit when due, progress.
    fn housekeeping(
        &mut self,
        consumer: &JobConsumer,
        txn: &mut Txn,
        idle: bool,
    ) -> Result<Flow, EngineError> {
        // Serving delivery reports costs a few clock reads and a lock: once in a while is
        // enough (the commit waits for every one of them anyway).
        self.since_poll += 1;
        if self.since_poll >= SERVE_DELIVERIES_EVERY || idle {
            txn.poll();
            self.since_poll = 0;
            txn.state()
                .follow_tables()
                .map_err(|e| TxnError::State(e.to_string()))?;
        }
        if idle {
            txn.idle()?;
        }
        // A commit running in the background that has ended is settled (what was processed
        // meanwhile goes into the next transaction); a due one starts.
        txn.progress(consumer)?;
        let now = Instant::now();
        self.paused.resume_due(consumer, now);
        if now >= self.next_tick {
            telemetry::open_txn_age(txn.age(now).unwrap_or_default());
            telemetry::process_info();
            self.next_tick = now + Duration::from_secs(1);
        }
        self.punctuate_if_due(consumer, txn, now)?;
        if txn.is_due(now) {
            txn.commit_in_background(consumer)?;
        }
        self.poll_wait = txn
            .due_in(now)
            .map_or(MAX_POLL_WAIT, |d| d.min(MAX_POLL_WAIT));
        // Checked on every pass: a commit may also have settled inside add or a rebalance.
        let s = txn.stats();
        if self
            .options
            .stop_after_records
            .is_some_and(|n| s.committed > 0 && s.records_committed >= n)
        {
            return Ok(Flow::Stop);
        }
        if let Some(every) = self.options.progress_every
            && self.last_progress.elapsed() >= every
        {
            let s = txn.stats();
            let rate = self.consumed as f64 / self.last_progress.elapsed().as_secs_f64();
            telemetry::progress(
                s.records_committed,
                s.outputs_committed,
                s.committed,
                s.aborted,
                rate,
            );
            self.consumed = 0;
            self.last_progress = Instant::now();
        }
        Ok(Flow::Continue)
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_after_the_consumer_was_fenced_is_that_fence() {
        let rewind = || {
            EngineError::Txn(TxnError::Rewind {
                what: "reading committed offsets".into(),
                error: KafkaError::OffsetFetch(RDKafkaErrorCode::State),
            })
        };
        let fenced = Some(RDKafkaErrorCode::FencedInstanceId);
        assert!(matches!(
            consumer_fence_first(rewind(), fenced),
            EngineError::ConsumerFatal(RDKafkaErrorCode::FencedInstanceId)
        ));
        // Without a fence, or with another fatal error of the consumer, the error stands.
        assert!(matches!(
            consumer_fence_first(rewind(), None),
            EngineError::Txn(_)
        ));
        assert!(matches!(
            consumer_fence_first(rewind(), Some(RDKafkaErrorCode::Fatal)),
            EngineError::Txn(_)
        ));
        // A consumer error already says what it is.
        assert!(matches!(
            consumer_fence_first(
                EngineError::ConsumerFatal(RDKafkaErrorCode::UnreleasedInstanceId),
                fenced
            ),
            EngineError::ConsumerFatal(RDKafkaErrorCode::UnreleasedInstanceId)
        ));
        // A commit refused for the membership is that fence before the consumer knows it.
        let refused = || {
            EngineError::Txn(TxnError::MemberFenced {
                error: KafkaError::Global(RDKafkaErrorCode::FencedInstanceId),
            })
        };
        assert!(matches!(
            consumer_fence_first(refused(), None),
            EngineError::ConsumerFatal(RDKafkaErrorCode::FencedInstanceId)
        ));
    }
}
