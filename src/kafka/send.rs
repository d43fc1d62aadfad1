//! Sending a record, waiting for room while librdkafka's local queue is full.

use std::time::{Duration, Instant};

use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders, ToBytes};
use rdkafka::producer::{BaseProducer, BaseRecord, ProducerContext};

use crate::lineage::{self, Lineage};
use crate::record::Record;

/// The record to send of `rec` to `topic`: its key, value, headers and timestamp, and the
/// headers of `lineage` when given.
pub fn base_record<'a>(
    topic: &'a str,
    rec: &'a Record,
    lineage: Option<Lineage<'_>>,
) -> BaseRecord<'a, [u8], [u8]> {
    let mut record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic);
    // A header list is a native allocation: only build one when there are headers. Each
    // header is copied into it at once, so the lineage's may be built on the stack.
    let count = lineage::header_count(&rec.headers, lineage);
    if count > 0 {
        let headers = lineage::fold_headers(
            &rec.headers,
            lineage,
            OwnedHeaders::new_with_capacity(count),
            |headers, key, value| {
                headers.insert(Header {
                    key,
                    value: Some(value),
                })
            },
        );
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
    record
}

/// Sends `record`; while the local queue is full, calls `make_room` (which serves delivery
/// reports) and tries again, for at most `timeout`. Any other error is returned at once.
pub fn send<'a, K, P, C>(
    producer: &BaseProducer<C>,
    mut record: BaseRecord<'a, K, P, C::DeliveryOpaque>,
    timeout: Duration,
    mut make_room: impl FnMut(&BaseProducer<C>),
) -> KafkaResult<()>
where
    K: ToBytes + ?Sized,
    P: ToBytes + ?Sized,
    C: ProducerContext,
{
    let mut deadline = None;
    loop {
        match producer.send(record) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back))
                if Instant::now() < *deadline.get_or_insert_with(|| Instant::now() + timeout) =>
            {
                record = back;
                make_room(producer);
            }
            Err((err, _)) => return Err(err),
        }
    }
}

/// The usual way to make room: serve delivery reports for a few milliseconds.
pub fn poll_briefly<C: ProducerContext>(producer: &BaseProducer<C>) {
    producer.poll(Duration::from_millis(5));
}
