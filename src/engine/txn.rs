//! The owner of transaction state. No other file calls `begin_transaction`,
//! `send_offsets_to_transaction`, `commit_transaction` or `abort_transaction`.
//!
//! A transaction begins lazily with the first consumed record, collects the produced records
//! and the consumed offsets, and commits when it is due (time, records or bytes). Every
//! error goes through [`classify`]: retry the same call, abort and rewind, or rebuild the
//! producer once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::util::Timeout;
use rdkafka::{ClientConfig, ClientContext, Offset, TopicPartitionList};

use super::EngineError;
use super::classify::{TxnAction, classify, traits_of};
use super::offsets::TxnOffsets;
use crate::histogram::Histogram;
use crate::sink::{SinkError, SinkErrorKind, Sinks};
use crate::sync::lock;
use crate::telemetry::health::Health;
use crate::telemetry::metrics::TopicCounts;
use crate::telemetry::{self, AbortReason};
use crate::topology::Guarantee;
use crate::transform::{Origin, Record, TransformError};

/// When a transaction is due, and how long client calls may take.
#[derive(Debug, Clone)]
pub struct TxnSettings {
    pub commit_interval: Duration,
    pub max_records: u64,
    pub max_bytes: u64,
    /// Upper bound of one transactional call, retries included.
    pub operation_timeout: Duration,
    /// Test-only failpoint: abort every n-th transaction instead of committing it.
    pub abort_every: Option<u64>,
    /// Without transactions, a "transaction" is the batch between two offset commits.
    pub guarantee: Guarantee,
}

/// Totals since the job started, counting committed work only.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TxnStats {
    pub committed: u64,
    pub aborted: u64,
    pub records_committed: u64,
    pub outputs_committed: u64,
    pub producer_rebuilds: u64,
    /// How long each committed transaction took to commit: waiting for its deliveries,
    /// sending the offsets and committing (under at-least-once: the offset commit).
    pub commit_durations: Histogram,
}

/// What became of a commit request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Committed {
    /// Nothing was open.
    Nothing,
    /// The transaction committed.
    Done,
    /// The transaction was aborted and the partitions rewound.
    Aborted,
}

/// Whether a record was added to the open transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Added {
    Yes,
    /// The transaction was aborted and rewound: drop the rest of what was polled.
    Aborted,
}

/// Collects delivery failures of the producer, so a commit never goes through after a
/// record of its transaction failed.
#[derive(Default)]
pub struct DeliveryTracker {
    failed: AtomicBool,
    first_error: Mutex<Option<KafkaError>>,
}

impl ClientContext for DeliveryTracker {
    fn stats(&self, statistics: rdkafka::Statistics) {
        telemetry::client_statistics("producer", &statistics);
    }
}

impl ProducerContext for DeliveryTracker {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: Self::DeliveryOpaque) {
        if let Err((err, _)) = result {
            self.failed.store(true, Ordering::Release);
            let mut first = lock(&self.first_error);
            if first.is_none() {
                *first = Some(err.clone());
            }
        }
    }
}

impl DeliveryTracker {
    fn take_error(&self) -> Option<KafkaError> {
        if self.failed.swap(false, Ordering::AcqRel) {
            lock(&self.first_error).take()
        } else {
            None
        }
    }
}

type TxnProducer = BaseProducer<DeliveryTracker>;

/// The transaction owner.
pub struct Txn {
    producer: TxnProducer,
    config: ClientConfig,
    settings: TxnSettings,
    open: bool,
    opened_at: Instant,
    offsets: TxnOffsets,
    records: u64,
    outputs: u64,
    bytes: u64,
    rebuilt: bool,
    attempts: u64,
    stats: TxnStats,
    consumed: TopicCounts,
    produced: TopicCounts,
    filtered: u64,
    health: Arc<Health>,
    span: tracing::Span,
    /// Outputs outside Kafka (PostgreSQL), flushed right before the Kafka commit.
    sinks: Sinks,
    /// Whether the sinks took something of the record being added.
    staged: bool,
    /// Records a sink refused (permanent errors naming them) in an aborted transaction: when
    /// they come again after the rewind, they are handled as failed records instead of being
    /// processed again.
    refused: HashMap<Origin, TransformError>,
}

/// Refused records remembered at most; past it the memory starts over (a record forgotten
/// is refused again and found again, at the cost of one more aborted transaction).
const MAX_REFUSED: usize = 10_000;

impl Txn {
    /// Creates the producer and registers its transactional.id with the coordinator, which
    /// fences any older producer with the same id and aborts its open transaction.
    pub fn new(
        config: ClientConfig,
        settings: TxnSettings,
        health: Arc<Health>,
    ) -> Result<Txn, EngineError> {
        let producer = create_producer(&config, &settings)?;
        Ok(Txn {
            producer,
            config,
            settings,
            open: false,
            opened_at: Instant::now(),
            offsets: TxnOffsets::default(),
            records: 0,
            outputs: 0,
            bytes: 0,
            rebuilt: false,
            attempts: 0,
            stats: TxnStats::default(),
            consumed: TopicCounts::consumed(),
            produced: TopicCounts::produced(),
            filtered: 0,
            health,
            span: tracing::Span::none(),
            sinks: Sinks::default(),
            staged: false,
            refused: HashMap::new(),
        })
    }

    /// Gives the transaction outputs outside Kafka: they commit right before it does.
    pub fn with_sinks(mut self, sinks: Sinks) -> Txn {
        self.sinks = sinks;
        self
    }

    pub fn has_sinks(&self) -> bool {
        !self.sinks.is_empty()
    }

    /// Stages what the pipeline made of a consumed record in the sinks; call it right before
    /// [`Txn::add`] of the same record. An error names a record no sink can take; nothing of
    /// it stays staged.
    pub fn stage(&mut self, produced: &[(usize, Record)]) -> Result<(), SinkError> {
        self.staged = false;
        self.sinks.stage(produced)?;
        self.staged = !produced.is_empty();
        Ok(())
    }

    /// Why a sink refused the record at `origin` in an aborted transaction, if it did: the
    /// engine handles it as a failed record (by default, dead-letters it) instead of
    /// processing it again. The refusal is remembered until a commit moves past the record:
    /// the transaction that dead-letters it may itself be aborted (another record refused)
    /// and the record come once more.
    pub fn refused(&self, origin: &Origin) -> Option<TransformError> {
        if self.refused.is_empty() {
            return None;
        }
        self.refused.get(origin).cloned()
    }

    /// Forgets the refusals of records this commit moved past.
    fn forget_refusals_committed(&mut self) {
        if self.refused.is_empty() {
            return;
        }
        let offsets = &self.offsets;
        self.refused.retain(|o, _| {
            !offsets
                .to_commit()
                .any(|(t, p, next)| p == o.partition && t == o.topic && next > o.offset)
        });
    }

    /// Commits the sinks' batches, retrying transient errors while the transaction has time
    /// (a fifth of its timeout is kept for the Kafka commit).
    fn flush_sinks(&mut self) -> Result<(), SinkError> {
        let deadline = self.opened_at + self.settings.operation_timeout.mul_f64(0.8);
        self.sinks.flush(deadline)
    }

    pub fn stats(&self) -> TxnStats {
        self.stats.clone()
    }

    pub fn is_open(&self) -> bool {
        self.open
    }

    /// Age of the open transaction, if one is open.
    pub fn age(&self, now: Instant) -> Option<Duration> {
        self.open
            .then(|| now.saturating_duration_since(self.opened_at))
    }

    /// Time until the open transaction is due, or `None` when nothing is open.
    pub fn due_in(&self, now: Instant) -> Option<Duration> {
        self.open.then(|| {
            (self.opened_at + self.settings.commit_interval).saturating_duration_since(now)
        })
    }

    /// Whether the open transaction should commit now.
    pub fn is_due(&self, now: Instant) -> bool {
        self.open
            && (self.records >= self.settings.max_records
                || self.bytes >= self.settings.max_bytes
                || now >= self.opened_at + self.settings.commit_interval
                || self.sinks.is_full())
    }

    /// Serves delivery reports. Call it regularly.
    pub fn poll(&self) {
        self.producer.poll(Duration::ZERO);
    }

    /// Adds what the pipeline made of one consumed record (read at `origin`) to the open
    /// transaction.
    pub fn add<C: ConsumerContext>(
        &mut self,
        consumer: &BaseConsumer<C>,
        origin: &Origin,
        consumed_bytes: usize,
        outputs: &[(&str, Record)],
    ) -> Result<Added, EngineError> {
        if !self.open {
            if self.transactional() {
                if let Err(err) = self.producer.begin_transaction() {
                    self.fail(consumer, err, AbortReason::BeginFailed)?;
                    return Ok(Added::Aborted);
                }
            }
            self.open = true;
            self.opened_at = Instant::now();
            self.span = tracing::info_span!("txn", seq = self.attempts + 1);
        }
        for (topic, rec) in outputs {
            if let Err(err) = self.send(topic, rec) {
                self.fail(consumer, err, AbortReason::ProduceFailed)?;
                return Ok(Added::Aborted);
            }
            self.produced.add(topic, payload_len(rec));
            self.outputs += 1;
        }
        self.offsets
            .record(&origin.topic, origin.partition, origin.offset);
        self.consumed.add(&origin.topic, consumed_bytes);
        if outputs.is_empty() && !std::mem::take(&mut self.staged) {
            self.filtered += 1;
        }
        self.records += 1;
        Ok(Added::Yes)
    }

    fn send(&mut self, topic: &str, rec: &Record) -> KafkaResult<()> {
        let mut record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic);
        // A header list is a native allocation: only build one when there are headers.
        if !rec.headers.is_empty() {
            let mut headers = OwnedHeaders::new_with_capacity(rec.headers.len());
            for (key, value) in &rec.headers {
                headers = headers.insert(Header {
                    key,
                    value: Some(value),
                });
            }
            record = record.headers(headers);
        }
        if let Some(key) = &rec.key {
            record = record.key(key);
        }
        if let Some(value) = &rec.value {
            record = record.payload(value);
        }
        if let Some(ts) = rec.timestamp {
            record = record.timestamp(ts);
        }
        self.bytes +=
            (rec.key.as_ref().map_or(0, Vec::len) + rec.value.as_ref().map_or(0, Vec::len)) as u64;
        let mut deadline = None;
        loop {
            match self.producer.send(record) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back))
                    if Instant::now()
                        < *deadline.get_or_insert_with(|| {
                            Instant::now() + self.settings.operation_timeout
                        }) =>
                {
                    // The local queue is full: serve delivery reports to make room.
                    record = back;
                    self.await_deliveries();
                }
                Err((err, _)) => return Err(err),
            }
        }
    }

    /// Serves every delivery report that is ready; when there is none, waits up to a
    /// millisecond for more, sending lingering batches at once meanwhile.
    ///
    /// The wait is `rd_kafka_flush` with a 1 ms timeout: it raises librdkafka's flushing flag
    /// (linger.ms counts as elapsed, so the transaction's last batches leave now instead of
    /// after linger.ms) and sleeps on a condition variable. It returns without serving
    /// anything: delivery reports come as events that only `poll` serves. rust-rdkafka's
    /// `poll(timeout)` and `flush(timeout)` would do instead: both keep polling until the
    /// timeout, spinning through its last millisecond, which takes the CPU that the
    /// deliveries themselves need.
    fn await_deliveries(&self) {
        loop {
            let before = self.producer.in_flight_count();
            self.producer.poll(Duration::ZERO);
            let after = self.producer.in_flight_count();
            if after == 0 {
                return;
            }
            if after >= before {
                break;
            }
        }
        // SAFETY: the producer's native handle is valid for as long as `self.producer` lives;
        // rd_kafka_flush is thread-safe and only waits here (delivery reports are events).
        unsafe {
            rdkafka::bindings::rd_kafka_flush(self.producer.client().native_ptr(), 1);
        }
    }

    /// Commits the open transaction with the consumed offsets, or aborts and rewinds it when
    /// it cannot commit.
    pub fn commit<C: ConsumerContext>(
        &mut self,
        consumer: &BaseConsumer<C>,
    ) -> Result<Committed, EngineError> {
        if !self.open {
            self.health.progressed();
            return Ok(Committed::Nothing);
        }
        self.attempts += 1;
        let span = self.span.clone();
        let _entered = span.enter();
        if self
            .settings
            .abort_every
            .is_some_and(|n| n > 0 && self.attempts % n == 0)
        {
            self.abort_and_rewind(consumer, AbortReason::Failpoint, "every n-th transaction")?;
            return Ok(Committed::Aborted);
        }
        let started = Instant::now();
        // Outputs outside Kafka commit first: a crash before the Kafka commit replays the
        // batch, and they absorb the replay.
        if let Err(e) = self.flush_sinks() {
            return match (e.kind, &e.origin) {
                // A record the database refuses: nothing of the batch committed. The
                // transaction is redone without it: it comes again after the rewind, and goes
                // the way on_error says (the records consumed before it in the transaction
                // may have been sent to Kafka outputs already; only an abort takes them back).
                (SinkErrorKind::Permanent, Some(_)) => {
                    if self.refused.len() >= MAX_REFUSED {
                        self.refused.clear();
                    }
                    for refusal in e.all() {
                        telemetry::sink_refused(refusal);
                        if let Some(origin) = &refusal.origin {
                            self.refused.insert(origin.clone(), refusal.failure());
                        }
                    }
                    self.abort_and_rewind(consumer, AbortReason::SinkRefused, &e.to_string())?;
                    Ok(Committed::Aborted)
                }
                (SinkErrorKind::Transient, _) => {
                    self.abort_and_rewind(consumer, AbortReason::SinkFailed, &e.to_string())?;
                    Ok(Committed::Aborted)
                }
                _ => {
                    self.abort_and_rewind(consumer, AbortReason::SinkFailed, &e.to_string())?;
                    Err(EngineError::Sink(e))
                }
            };
        }
        match self.try_commit(consumer) {
            Ok(()) => {
                self.forget_refusals_committed();
                self.stats.commit_durations.record(started.elapsed());
                self.stats.committed += 1;
                self.stats.records_committed += self.records;
                self.stats.outputs_committed += self.outputs;
                self.consumed.commit();
                self.produced.commit();
                telemetry::records_filtered(self.filtered);
                telemetry::txn_committed(self.records, self.outputs, started.elapsed());
                self.health.progressed();
                self.reset();
                Ok(Committed::Done)
            }
            Err(err) => {
                self.fail(consumer, err, AbortReason::CommitFailed)?;
                Ok(Committed::Aborted)
            }
        }
    }

    fn try_commit<C: ConsumerContext>(&mut self, consumer: &BaseConsumer<C>) -> KafkaResult<()> {
        // Wait for every delivery first: a failed record must fail the transaction, and
        // commit_transaction's own flush sleeps 100 ms whenever anything is in flight.
        self.drain()?;
        if let Some(err) = self.producer.context().take_error() {
            return Err(err);
        }
        let mut tpl = TopicPartitionList::new();
        for (topic, partition, next) in self.offsets.to_commit() {
            tpl.add_partition_offset(topic, partition, Offset::Offset(next))?;
        }
        if !self.transactional() {
            // At-least-once: every output is acknowledged; now the offsets may move.
            return consumer.commit(&tpl, rdkafka::consumer::CommitMode::Sync);
        }
        let metadata = consumer
            .group_metadata()
            .ok_or(KafkaError::Global(RDKafkaErrorCode::State))?;
        let timeout = self.settings.operation_timeout;
        self.retrying("send_offsets_to_transaction", |p| {
            p.send_offsets_to_transaction(&tpl, &metadata, timeout)
        })?;
        self.retrying("commit_transaction", |p| p.commit_transaction(timeout))
    }

    /// Serves delivery reports until nothing is in flight or the operation timeout passes.
    fn drain(&self) -> KafkaResult<()> {
        let deadline = Instant::now() + self.settings.operation_timeout;
        while self.producer.in_flight_count() > 0 {
            if Instant::now() >= deadline {
                return Err(KafkaError::Flush(RDKafkaErrorCode::OperationTimedOut));
            }
            self.await_deliveries();
        }
        Ok(())
    }

    /// Calls `op` again while the error is retriable, with a capped exponential backoff,
    /// until the operation timeout passes.
    fn retrying<T>(
        &self,
        operation: &'static str,
        mut op: impl FnMut(&TxnProducer) -> KafkaResult<T>,
    ) -> KafkaResult<T> {
        let deadline = Instant::now() + self.settings.operation_timeout;
        let mut backoff = Duration::from_millis(10);
        let mut attempt = 0;
        loop {
            // Watched: librdkafka may wait forever past the call's own timeout
            // (send_offsets_to_transaction on a lost coordinator, librdkafka#5456).
            self.health.call_started(operation);
            let result = op(&self.producer);
            self.health.call_finished();
            match result {
                Ok(v) => return Ok(v),
                Err(err) => {
                    attempt += 1;
                    let retry = classify(traits_of(&err, self.producer_fatal()))
                        == TxnAction::Retry
                        && Instant::now() + backoff < deadline;
                    if !retry {
                        return Err(err);
                    }
                    telemetry::txn_retry(operation, attempt, &err);
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
            }
        }
    }

    fn transactional(&self) -> bool {
        self.settings.guarantee == Guarantee::ExactlyOnce
    }

    fn producer_fatal(&self) -> bool {
        self.producer.client().fatal_error().is_some()
    }

    /// Applies the classifier's decision to an error of the open transaction.
    fn fail<C: ConsumerContext>(
        &mut self,
        consumer: &BaseConsumer<C>,
        err: KafkaError,
        reason: AbortReason,
    ) -> Result<(), EngineError> {
        match classify(traits_of(&err, self.producer_fatal())) {
            TxnAction::Retry | TxnAction::AbortAndRewind => {
                self.abort_and_rewind(consumer, reason, &err.to_string())
            }
            TxnAction::Fatal => self.rebuild(consumer, err),
        }
    }

    /// Aborts the open transaction (nothing of it becomes visible) and rewinds the consumer.
    pub fn abort_and_rewind<C: ConsumerContext>(
        &mut self,
        consumer: &BaseConsumer<C>,
        reason: AbortReason,
        detail: &str,
    ) -> Result<(), EngineError> {
        if self.open {
            // abort_transaction waits for the queue to empty, but on this producer only our
            // polling serves delivery reports: let in-flight records finish first. Purging
            // them instead races with librdkafka's own registration of their partitions
            // (the broker then refuses the abort with INVALID_TXN_STATE).
            if self.drain().is_err() {
                self.producer
                    .purge(rdkafka::producer::PurgeConfig::default().queue());
                let _ = self.drain();
            }
            let _ = self.producer.context().take_error();
            let timeout = self.settings.operation_timeout;
            // Without transactions (at-least-once) there is nothing to abort: what was sent is
            // out, and comes again after the rewind.
            if self.transactional() {
                if let Err(err) =
                    self.retrying("abort_transaction", |p| p.abort_transaction(timeout))
                {
                    return self.rebuild(consumer, err);
                }
            }
            self.stats.aborted += 1;
            telemetry::txn_aborted(reason, detail, self.records);
        }
        self.rewind(consumer)?;
        self.reset();
        Ok(())
    }

    /// Replaces a producer that failed fatally, once in the life of the process: the new
    /// producer's init_transactions aborts whatever the old one left open.
    fn rebuild<C: ConsumerContext>(
        &mut self,
        consumer: &BaseConsumer<C>,
        err: KafkaError,
    ) -> Result<(), EngineError> {
        if self.rebuilt {
            return Err(EngineError::Fatal(format!(
                "producer failed fatally again after being rebuilt: {err}"
            )));
        }
        self.rebuilt = true;
        let fenced = traits_of(&err, false).fenced;
        telemetry::producer_rebuilt(&err, fenced);
        self.producer
            .purge(rdkafka::producer::PurgeConfig::default().queue().inflight());
        self.producer = create_producer(&self.config, &self.settings)?;
        self.stats.producer_rebuilds += 1;
        if self.open {
            self.stats.aborted += 1;
            telemetry::txn_aborted(AbortReason::ProducerRebuilt, &err.to_string(), self.records);
        }
        self.rewind(consumer)?;
        self.reset();
        Ok(())
    }

    /// Seeks the partitions the aborted transaction consumed from back to their committed
    /// offsets (or, where the group has none yet, to the first offset the transaction
    /// consumed). The other assigned partitions already stand at their committed offsets:
    /// everything consumed before this transaction was committed.
    fn rewind<C: ConsumerContext>(
        &mut self,
        consumer: &BaseConsumer<C>,
    ) -> Result<(), EngineError> {
        let fatal = |what: &str, e: &dyn std::fmt::Display| {
            EngineError::Fatal(format!("cannot rewind ({what}): {e}"))
        };
        let mut touched = TopicPartitionList::new();
        for (topic, partition, _) in self.offsets.to_commit() {
            touched.add_partition(topic, partition);
        }
        if touched.count() == 0 {
            return Ok(());
        }
        let committed = consumer
            .committed_offsets(touched, self.settings.operation_timeout)
            .map_err(|e| fatal("reading committed offsets", &e))?;
        let mut seeks = TopicPartitionList::new();
        for elem in committed.elements() {
            let target = match elem.offset() {
                Offset::Offset(o) => Some(o),
                _ => self.offsets.first_of(elem.topic(), elem.partition()),
            };
            if let Some(o) = target {
                seeks
                    .add_partition_offset(elem.topic(), elem.partition(), Offset::Offset(o))
                    .map_err(|e| fatal("building the seek list", &e))?;
            }
        }
        let result = consumer
            .seek_partitions(seeks, self.settings.operation_timeout)
            .map_err(|e| fatal("seeking", &e))?;
        for elem in result.elements() {
            if let Err(e) = elem.error() {
                let at = format!("{}[{}]", elem.topic(), elem.partition());
                return Err(fatal(&at, &e));
            }
        }
        Ok(())
    }

    fn reset(&mut self) {
        self.sinks.discard();
        self.staged = false;
        self.consumed.discard();
        self.produced.discard();
        self.filtered = 0;
        self.span = tracing::Span::none();
        self.open = false;
        self.offsets.clear();
        self.records = 0;
        self.outputs = 0;
        self.bytes = 0;
    }
}

/// Key and value bytes of a record.
pub fn payload_len(rec: &Record) -> usize {
    rec.key.as_ref().map_or(0, Vec::len) + rec.value.as_ref().map_or(0, Vec::len)
}

fn create_producer(
    config: &ClientConfig,
    settings: &TxnSettings,
) -> Result<TxnProducer, EngineError> {
    let producer: TxnProducer = config
        .create_with_context(DeliveryTracker::default())
        .map_err(|e| EngineError::Client(format!("cannot create the producer: {e}")))?;
    if settings.guarantee != Guarantee::ExactlyOnce {
        return Ok(producer);
    }
    let timeout = settings.operation_timeout;
    let deadline = Instant::now() + timeout.max(Duration::from_secs(30));
    loop {
        match producer.init_transactions(Timeout::After(timeout)) {
            Ok(()) => return Ok(producer),
            Err(KafkaError::Transaction(e)) if e.is_retriable() && Instant::now() < deadline => {
                telemetry::txn_retry("init_transactions", 0, &e);
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => {
                return Err(EngineError::Fatal(format!(
                    "init_transactions failed (is the broker reachable, and does it allow transactions?): {e}"
                )));
            }
        }
    }
}
