//! What fits in a Kafka message: outputs too large to send are refused before any is sent,
//! and a dead letter too large keeps its headers without its value.

use crate::dlq;
use crate::record::{ErrorKind, Record, RecordError, Stage};
use crate::topology::Topology;

/// The producer's `message.max.bytes`: a larger record fails at send, for good.
pub(super) fn max_message_bytes(topology: &Topology) -> usize {
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
pub(super) fn check_sizes(outputs: &[(usize, Record)], max: usize) -> Result<(), RecordError> {
    match outputs.iter().find(|(_, r)| encoded_size(r) > max) {
        None => Ok(()),
        Some((index, r)) => Err(RecordError {
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

/// A dead-letter record too large to send keeps its headers and drops its value, saying so
/// ([`dlq::H_VALUE_DROPPED`]): `dlq replay` reads the original back from its origin.
pub(super) fn fit_dead_letter(mut letter: Record, max: usize) -> Record {
    let size = encoded_size(&letter);
    if size > max {
        letter.value = None;
        let why = format!(
            "too large: about {size} bytes with its value, over message.max.bytes ({max}); the original stays at its origin"
        );
        letter
            .headers
            .push((dlq::H_VALUE_DROPPED.into(), why.into_bytes()));
    }
    letter
}
