//! Sending the records of a transaction and tracking their deliveries: a record whose
//! delivery failed fails its transaction, and a commit waits for every delivery first.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rdkafka::ClientContext;
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, DeliveryResult, Producer as _, ProducerContext};

use crate::kafka::send;
use crate::lineage::Lineage;
use crate::record::Record;
use crate::sync::lock;
use crate::telemetry::{self, metrics::TopicCounts};

/// The client under the transactional producer ([`super::producer`]).
pub(super) type Client = BaseProducer<DeliveryTracker>;

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
    /// The first delivery error since the last call, if any.
    pub fn take_error(&self) -> Option<KafkaError> {
        if self.failed.swap(false, Ordering::AcqRel) {
            lock(&self.first_error).take()
        } else {
            None
        }
    }
}

/// What the open transaction sent.
pub(super) struct Collector {
    pub produced: TopicCounts,
    pub outputs: u64,
    /// Key and value bytes sent.
    pub bytes: u64,
}

impl Collector {
    pub fn new() -> Collector {
        Collector {
            produced: TopicCounts::produced(),
            outputs: 0,
            bytes: 0,
        }
    }

    /// Sends one record, with `lineage` when given; while the local queue is full, serves
    /// delivery reports to make room, for at most `timeout`.
    pub fn send(
        &mut self,
        client: &Client,
        topic: &str,
        rec: &Record,
        lineage: Option<Lineage<'_>>,
        timeout: Duration,
    ) -> KafkaResult<()> {
        send::send(
            client,
            send::base_record(topic, rec, lineage),
            timeout,
            await_deliveries,
        )?;
        let len = payload_len(rec);
        self.bytes += len as u64;
        self.produced.add(topic, len);
        self.outputs += 1;
        Ok(())
    }

    /// Sends a state change to partition `partition` of its store's changelog `topic` (the
    /// partition of the input record it comes from); a delete is a tombstone.
    pub fn send_change(
        &mut self,
        client: &Client,
        topic: &str,
        change: &crate::state::Change,
        timeout: Duration,
    ) -> KafkaResult<()> {
        let mut record: rdkafka::producer::BaseRecord<'_, [u8], [u8]> =
            rdkafka::producer::BaseRecord::to(topic)
                .partition(change.partition)
                .key(&change.key[..]);
        if let Some(value) = &change.value {
            record = record.payload(&value[..]);
        }
        send::send(client, record, timeout, await_deliveries)?;
        let len = change.key.len() + change.value.as_ref().map_or(0, Vec::len);
        self.bytes += len as u64;
        Ok(())
    }

    /// The transaction committed: what it sent counts.
    pub fn commit(&mut self) {
        self.produced.commit();
        self.reset();
    }

    /// The transaction aborted: nothing it sent counts.
    pub fn discard(&mut self) {
        self.produced.discard();
        self.reset();
    }

    fn reset(&mut self) {
        self.outputs = 0;
        self.bytes = 0;
    }
}

/// The longest single wait of [`drain`]: a failed delivery's report holds its message until
/// it is served, so a failure is seen at most this late.
const DRAIN_SLICE: Duration = Duration::from_millis(100);

/// Waits until nothing is in flight or `timeout` passes, serving the delivery reports.
///
/// The producer reports failed deliveries only (`delivery.report.only.error`): a message
/// acknowledged is released at once, so `rd_kafka_flush` returns as soon as the last one is,
/// without a poll in between. One flush raises librdkafka's flushing flag (the last batches
/// leave now instead of after linger.ms) and wakes the broker threads once; a loop of short
/// flushes would wake every broker thread every millisecond for as long as the
/// acknowledgements take, and on a loaded machine that took the CPU the brokers needed to
/// send them.
pub(super) fn drain(client: &Client, timeout: Duration) -> KafkaResult<()> {
    let deadline = Instant::now() + timeout;
    loop {
        client.poll(Duration::ZERO);
        if client.in_flight_count() == 0 {
            return Ok(());
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(KafkaError::Flush(RDKafkaErrorCode::OperationTimedOut));
        }
        let wait_ms = left.min(DRAIN_SLICE).as_millis().max(1) as i32;
        // SAFETY: the producer's native handle is valid for as long as `client` lives;
        // rd_kafka_flush is thread-safe and only waits here (failure reports are events,
        // served by the poll above).
        unsafe {
            rdkafka::bindings::rd_kafka_flush(client.client().native_ptr(), wait_ms);
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
pub(super) fn await_deliveries(client: &Client) {
    loop {
        let before = client.in_flight_count();
        client.poll(Duration::ZERO);
        let after = client.in_flight_count();
        if after == 0 {
            return;
        }
        if after >= before {
            break;
        }
    }
    // SAFETY: the producer's native handle is valid for as long as `client` lives;
    // rd_kafka_flush is thread-safe and only waits here (delivery reports are events).
    unsafe {
        rdkafka::bindings::rd_kafka_flush(client.client().native_ptr(), 1);
    }
}

/// Key and value bytes of a record.
pub fn payload_len(rec: &Record) -> usize {
    rec.key.as_ref().map_or(0, Vec::len) + rec.value.as_ref().map_or(0, Vec::len)
}
