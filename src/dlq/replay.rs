//! `dlq replay`: the original records of a dead-letter topic, produced again exactly once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{
    DeadLetter, DlqError, Filter, H_OFFSET, H_PARTITION, H_REPLAYED_FROM, H_TOPIC, H_VALUE_DROPPED,
};
use crate::kafka::Cluster;
use crate::kafka::read::{read_one, read_to_end, reader, watermarks};
use crate::record::{Origin, Record};
use crate::telemetry::health::Health;
use crate::topology::Guarantee;
use crate::txn::{Consumed, Outgoing, Txn, TxnSettings};

/// What a replay did, counting committed work only.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Replayed {
    /// Dead-letter records read.
    pub read: u64,
    /// Records re-produced.
    pub replayed: u64,
}

/// Records per replay transaction, at most.
const RECORDS_PER_TXN: u64 = 1000;

/// Re-produces the original records of the dead-letter topic (those `filter` takes) to their
/// original topic, or to `to` when given, in transactions that also commit the replay
/// group's offsets on the dead-letter topic: a second replay over the same range finds
/// nothing new. A transaction that cannot commit is aborted and its records read again, as
/// in a job. `progress` is called after every transaction with (records read, total).
pub fn replay(
    kafka: &Cluster,
    topic: &str,
    filter: &Filter,
    to: Option<&str>,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Replayed, DlqError> {
    let group = format!("onceflow.replay.{topic}.{}", filter.tag());
    let consumer = reader(kafka, &group)?;
    let mut config = kafka.config();
    config
        .set("transactional.id", &group)
        .set("enable.idempotence", "true")
        .set("linger.ms", "5");
    let settings = TxnSettings {
        commit_interval: Duration::from_secs(5),
        max_records: RECORDS_PER_TXN,
        max_bytes: 64 << 20,
        operation_timeout: Duration::from_secs(30),
        abort_every: None,
        lose_commit_every: None,
        exit_after_participant_commit: None,
        guarantee: Guarantee::ExactlyOnce,
        overlap_commits: false,
    };
    let mut txn = Txn::new(config, settings, Arc::new(Health::default()))?;
    let total: u64 = watermarks(&consumer, topic)?
        .values()
        .map(|(low, end)| (end - low).max(0) as u64)
        .sum();
    let stats = |txn: &Txn| Replayed {
        read: txn.stats().records_committed,
        replayed: txn.stats().outputs_committed,
    };
    read_to_end(&consumer, topic, |msg| -> Result<(), DlqError> {
        let d = DeadLetter::from_message(msg);
        let origin = Origin {
            topic: topic.into(),
            partition: d.partition,
            offset: d.offset,
        };
        let target = to.unwrap_or(d.meta(H_TOPIC)).to_string();
        let record = match filter.matches(&d) {
            false => None,
            true => Some(original(kafka, &d, &origin)?),
        };
        // The replayed record is the original, as it was consumed: no lineage of its own.
        let outputs: Vec<Outgoing<'_>> = match record {
            None => Vec::new(),
            Some(_) if target.is_empty() => {
                return Err(DlqError::NoOrigin {
                    topic: topic.to_string(),
                    partition: d.partition,
                    offset: d.offset,
                    header: H_TOPIC,
                });
            }
            Some(record) => vec![Outgoing {
                topic: target.as_str(),
                record,
                lineage: false,
            }],
        };
        // An aborted transaction rewinds the consumer: its records come again.
        let _ = txn.add(&consumer, Consumed::at(&origin, 0), &outputs)?;
        txn.poll();
        if txn.is_due(Instant::now()) {
            txn.commit(&consumer)?;
            let s = stats(&txn);
            progress(s.read, total);
        }
        Ok(())
    })?;
    txn.commit(&consumer)?;
    let s = stats(&txn);
    progress(s.read, total);
    Ok(s)
}

/// The original record of a dead letter, marked with where it is replayed from. A letter
/// whose value was left out (too large for the dead-letter topic) takes the original's value
/// from its origin, which must still hold it.
fn original(kafka: &Cluster, d: &DeadLetter, origin: &Origin) -> Result<Record, DlqError> {
    let mut headers = d.headers.clone();
    headers.push((
        H_REPLAYED_FROM.to_string(),
        format!("{}/{}/{}", origin.topic, origin.partition, origin.offset).into_bytes(),
    ));
    let mut value = d.value.clone();
    if d.meta.contains_key(H_VALUE_DROPPED) {
        value = value_from_origin(kafka, d, origin)?;
    }
    Ok(Record {
        key: d.key.clone(),
        value,
        headers,
        timestamp: None,
        origin: origin.clone(),
    })
}

/// The value of a dead letter's original, read back from where it was consumed.
fn value_from_origin(
    kafka: &Cluster,
    d: &DeadLetter,
    letter: &Origin,
) -> Result<Option<Vec<u8>>, DlqError> {
    use rdkafka::message::Message;
    let gone = |why: &str| DlqError::OriginalGone {
        letter: letter.to_string(),
        origin: format!(
            "{}[{}]@{}",
            d.meta(H_TOPIC),
            d.meta(H_PARTITION),
            d.meta(H_OFFSET)
        ),
        why: why.to_string(),
    };
    let (Ok(partition), Ok(offset)) = (d.meta(H_PARTITION).parse(), d.meta(H_OFFSET).parse())
    else {
        return Err(gone("the letter does not say where its original is"));
    };
    match read_one(kafka, d.meta(H_TOPIC), partition, offset)? {
        Some(msg) => Ok(msg.payload().map(<[u8]>::to_vec)),
        None => Err(gone(
            "the topic no longer holds it (retention or compaction removed it)",
        )),
    }
}
