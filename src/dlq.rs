//! The dead-letter topic: what a dead-letter record carries, and the `dlq inspect` and
//! `dlq replay` commands.
//!
//! A dead-letter record keeps the original key, value and headers verbatim and adds
//! `onceflow.*` headers saying what failed, where it came from and when. The engine writes
//! it in the same transaction as the outputs and the consumed offsets, so it is exactly-once
//! too. Replay is itself an exactly-once read-process-write job over the dead-letter topic:
//! its consumer group's offsets are committed in the replay transactions, so a second replay
//! over the same range re-produces nothing.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{BorrowedMessage, Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::util::Timeout;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::transform::Record;

pub const H_KIND: &str = "onceflow.error.kind";
pub const H_MESSAGE: &str = "onceflow.error.message";
pub const H_STAGE: &str = "onceflow.error.stage";
pub const H_ATTEMPTS: &str = "onceflow.error.attempts";
pub const H_TOPIC: &str = "onceflow.origin.topic";
pub const H_PARTITION: &str = "onceflow.origin.partition";
pub const H_OFFSET: &str = "onceflow.origin.offset";
pub const H_TIMESTAMP: &str = "onceflow.origin.timestamp";
pub const H_TOPOLOGY: &str = "onceflow.topology";
pub const H_INSTANCE: &str = "onceflow.instance";
pub const H_FAILED_AT: &str = "onceflow.failed.at";
/// Set on a replayed record: `<dead-letter topic>/<partition>/<offset>` it was replayed from.
pub const H_REPLAYED_FROM: &str = "onceflow.replayed.from";

const PREFIX: &str = "onceflow.";

/// Why a record is dead-lettered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The error kind, a bounded label such as `decode` or `expression`.
    pub kind: String,
    pub message: String,
    /// The stage that failed, e.g. `pipeline[2] map`.
    pub stage: String,
    pub attempts: u32,
}

/// The dead-letter record of `original`: its key, value, timestamp and headers verbatim, plus
/// the `onceflow.*` headers describing the failure.
pub fn dead_letter(
    original: &Record,
    failure: &Failure,
    topology: &str,
    instance: &str,
    failed_at_ms: i64,
) -> Record {
    let mut rec = original.clone();
    // A record replayed from a dead-letter topic and failing again must not carry two sets.
    rec.headers.retain(|(k, _)| !k.starts_with(PREFIX));
    let o = &original.origin;
    let add = |h: &mut Vec<(String, Vec<u8>)>, k: &str, v: String| {
        h.push((k.to_string(), v.into_bytes()))
    };
    add(&mut rec.headers, H_KIND, failure.kind.clone());
    add(&mut rec.headers, H_MESSAGE, failure.message.clone());
    add(&mut rec.headers, H_STAGE, failure.stage.clone());
    add(&mut rec.headers, H_ATTEMPTS, failure.attempts.to_string());
    add(&mut rec.headers, H_TOPIC, o.topic.clone());
    add(&mut rec.headers, H_PARTITION, o.partition.to_string());
    add(&mut rec.headers, H_OFFSET, o.offset.to_string());
    if let Some(ts) = original.timestamp {
        add(&mut rec.headers, H_TIMESTAMP, ts.to_string());
    }
    add(&mut rec.headers, H_TOPOLOGY, topology.to_string());
    add(&mut rec.headers, H_INSTANCE, instance.to_string());
    add(&mut rec.headers, H_FAILED_AT, failed_at_ms.to_string());
    rec
}

/// A dead-letter record read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub timestamp: Option<i64>,
    /// The original headers, without the `onceflow.*` ones.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The `onceflow.*` headers.
    pub meta: BTreeMap<String, String>,
}

impl DeadLetter {
    pub fn from_message(msg: &BorrowedMessage<'_>) -> DeadLetter {
        let mut headers = Vec::new();
        let mut meta = BTreeMap::new();
        if let Some(hs) = msg.headers() {
            for h in hs.iter() {
                let value = h.value.unwrap_or_default();
                if h.key.starts_with(PREFIX) {
                    meta.insert(
                        h.key.to_string(),
                        String::from_utf8_lossy(value).into_owned(),
                    );
                } else {
                    headers.push((h.key.to_string(), value.to_vec()));
                }
            }
        }
        DeadLetter {
            partition: msg.partition(),
            offset: msg.offset(),
            key: msg.key().map(<[u8]>::to_vec),
            value: msg.payload().map(<[u8]>::to_vec),
            timestamp: msg.timestamp().to_millis(),
            headers,
            meta,
        }
    }

    pub fn meta(&self, key: &str) -> &str {
        self.meta.get(key).map_or("", String::as_str)
    }

    fn meta_i64(&self, key: &str) -> Option<i64> {
        self.meta.get(key).and_then(|v| v.parse().ok())
    }
}

/// Which dead-letter records a command takes.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Only this error kind.
    pub kind: Option<String>,
    /// Only records that failed at or after this time (ms since the epoch).
    pub since_ms: Option<i64>,
    /// Only records that failed before this time (ms since the epoch).
    pub until_ms: Option<i64>,
    /// Only records from this original partition.
    pub origin_partition: Option<i32>,
}

impl Filter {
    pub fn matches(&self, d: &DeadLetter) -> bool {
        let failed_at = d.meta_i64(H_FAILED_AT);
        self.kind.as_deref().is_none_or(|k| d.meta(H_KIND) == k)
            && self
                .since_ms
                .is_none_or(|s| failed_at.is_some_and(|t| t >= s))
            && self
                .until_ms
                .is_none_or(|u| failed_at.is_some_and(|t| t < u))
            && self
                .origin_partition
                .is_none_or(|p| d.meta_i64(H_PARTITION) == Some(i64::from(p)))
    }

    /// A short stable tag of the filter, part of the replay group id so that replays with
    /// different filters keep separate progress.
    pub fn tag(&self) -> String {
        let text = format!("{self:?}");
        // FNV-1a: stable across builds, unlike the std hasher.
        let hash = text.bytes().fold(0xcbf29ce484222325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100000001b3)
        });
        format!("{hash:016x}")
    }
}

/// Why a dead-letter command failed.
#[derive(Debug, thiserror::Error)]
pub enum DlqError {
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error("{0}")]
    Other(String),
}

/// Where the dead-letter topic is: bootstrap servers, and librdkafka settings for both
/// clients of a command (security: `security.protocol`, `ssl.ca.location`, `sasl.*`...).
#[derive(Debug, Clone, Default)]
pub struct Kafka {
    pub bootstrap: String,
    pub settings: Vec<(String, String)>,
}

impl Kafka {
    pub fn new(bootstrap: &str) -> Kafka {
        Kafka {
            bootstrap: bootstrap.to_string(),
            settings: Vec::new(),
        }
    }

    fn config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        for (key, value) in &self.settings {
            config.set(key, value);
        }
        config.set("bootstrap.servers", &self.bootstrap);
        config
    }
}

fn reader(kafka: &Kafka, group: &str) -> Result<BaseConsumer, DlqError> {
    Ok(kafka
        .config()
        .set("group.id", group)
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .create()?)
}

/// The low and end offsets of every partition of `topic` now: a command reads up to them.
fn watermarks(consumer: &BaseConsumer, topic: &str) -> Result<BTreeMap<i32, (i64, i64)>, DlqError> {
    let timeout = Duration::from_secs(10);
    let metadata = consumer.fetch_metadata(Some(topic), timeout)?;
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    if partitions.is_empty() {
        return Err(DlqError::Other(format!("topic {topic} does not exist")));
    }
    let mut marks = BTreeMap::new();
    for p in partitions {
        marks.insert(p, consumer.fetch_watermarks(topic, p, timeout)?);
    }
    Ok(marks)
}

/// Reads `topic` from the group's committed offsets (or the beginning) up to the end offsets
/// taken at the start, calling `each` for every record.
fn read_to_end(
    consumer: &BaseConsumer,
    topic: &str,
    mut each: impl FnMut(&BorrowedMessage<'_>) -> Result<(), DlqError>,
) -> Result<(), DlqError> {
    let marks = watermarks(consumer, topic)?;
    let mut tpl = TopicPartitionList::new();
    for p in marks.keys() {
        tpl.add_partition(topic, *p);
    }
    let committed = consumer.committed_offsets(tpl, Duration::from_secs(10))?;
    let mut assign = TopicPartitionList::new();
    let mut pending: BTreeMap<i32, i64> = BTreeMap::new();
    for e in committed.elements() {
        let (low, end) = marks.get(&e.partition()).copied().unwrap_or((0, 0));
        let start = match e.offset() {
            Offset::Offset(o) => o.max(low),
            _ => low,
        };
        assign.add_partition_offset(topic, e.partition(), Offset::Offset(start))?;
        if start < end {
            pending.insert(e.partition(), end);
        }
    }
    consumer.assign(&assign)?;
    let mut idle_since = Instant::now();
    while !pending.is_empty() {
        // Under read_committed a partition's end may be a transaction marker that is never
        // delivered: positions tell when it is passed.
        let positions = consumer.position()?;
        for e in positions.elements() {
            if let Offset::Offset(pos) = e.offset() {
                if pending.get(&e.partition()).is_some_and(|end| pos >= *end) {
                    pending.remove(&e.partition());
                }
            }
        }
        if pending.is_empty() {
            break;
        }
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(msg)) => {
                idle_since = Instant::now();
                if pending
                    .get(&msg.partition())
                    .is_some_and(|end| msg.offset() < *end)
                {
                    each(&msg)?;
                }
            }
            Some(Err(e)) => return Err(e.into()),
            None if idle_since.elapsed() > Duration::from_secs(30) => {
                return Err(DlqError::Other(format!(
                    "no progress for 30 s reading {topic}; partitions still pending: {pending:?}"
                )));
            }
            None => {}
        }
    }
    Ok(())
}

fn shorten(bytes: Option<&[u8]>, max: usize) -> String {
    match bytes {
        None => "(null)".into(),
        Some(b) => {
            let text: String = String::from_utf8_lossy(b)
                .chars()
                .map(|c| if c.is_control() { ' ' } else { c })
                .collect();
            if text.chars().count() > max {
                format!("{}…", text.chars().take(max).collect::<String>())
            } else {
                text
            }
        }
    }
}

/// Prints the dead-letter records of `topic` as a table.
pub fn inspect(
    kafka: &Kafka,
    topic: &str,
    filter: &Filter,
    limit: usize,
    out: &mut dyn std::io::Write,
) -> Result<usize, DlqError> {
    // A throwaway group: inspecting never moves anybody's offsets.
    let group = format!("onceflow.inspect.{}", std::process::id());
    let consumer = reader(kafka, &group)?;
    let mut shown = 0;
    writeln!(
        out,
        "{:<12} {:<24} {:<12} {:<28} {:<16} {:<40} payload",
        "at", "failed at (ms)", "kind", "origin", "stage", "message"
    )
    .map_err(|e| DlqError::Other(e.to_string()))?;
    read_to_end(&consumer, topic, |msg| {
        let d = DeadLetter::from_message(msg);
        if shown < limit && filter.matches(&d) {
            shown += 1;
            writeln!(
                out,
                "{:<12} {:<24} {:<12} {:<28} {:<16} {:<40} {}",
                format!("{}@{}", d.partition, d.offset),
                d.meta(H_FAILED_AT),
                d.meta(H_KIND),
                format!(
                    "{}[{}]@{}",
                    d.meta(H_TOPIC),
                    d.meta(H_PARTITION),
                    d.meta(H_OFFSET)
                ),
                shorten(Some(d.meta(H_STAGE).as_bytes()), 16),
                shorten(Some(d.meta(H_MESSAGE).as_bytes()), 40),
                shorten(d.value.as_deref(), 60),
            )
            .map_err(|e| DlqError::Other(e.to_string()))?;
        }
        Ok(())
    })?;
    Ok(shown)
}

/// What a replay did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Replayed {
    /// Dead-letter records read.
    pub read: u64,
    /// Records re-produced.
    pub replayed: u64,
}

/// Re-produces the original records of the dead-letter topic (those `filter` takes) to their
/// original topic, or to `to` when given, in transactions that also commit the replay
/// group's offsets on the dead-letter topic: a second replay over the same range finds
/// nothing new. `progress` is called after every transaction with (records read, total).
pub fn replay(
    kafka: &Kafka,
    topic: &str,
    filter: &Filter,
    to: Option<&str>,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Replayed, DlqError> {
    let group = format!("onceflow.replay.{topic}.{}", filter.tag());
    let consumer = reader(kafka, &group)?;
    let producer: BaseProducer = kafka
        .config()
        .set("transactional.id", &group)
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .create()?;
    let timeout = Timeout::After(Duration::from_secs(30));
    producer.init_transactions(timeout)?;
    let total: u64 = watermarks(&consumer, topic)?
        .values()
        .map(|(low, end)| (end - low).max(0) as u64)
        .sum();
    let mut stats = Replayed::default();
    let mut in_txn = 0u64;
    let mut next: BTreeMap<i32, i64> = BTreeMap::new();
    producer.begin_transaction()?;
    let commit = |next: &BTreeMap<i32, i64>, consumer: &BaseConsumer| -> Result<(), DlqError> {
        while producer.in_flight_count() > 0 {
            producer.poll(Duration::from_millis(1));
        }
        let mut tpl = TopicPartitionList::new();
        for (p, o) in next {
            tpl.add_partition_offset(topic, *p, Offset::Offset(*o))?;
        }
        let metadata = consumer
            .group_metadata()
            .ok_or_else(|| DlqError::Other("no consumer group metadata".into()))?;
        producer.send_offsets_to_transaction(&tpl, &metadata, timeout)?;
        producer.commit_transaction(timeout)?;
        Ok(())
    };
    read_to_end(&consumer, topic, |msg| {
        stats.read += 1;
        let d = DeadLetter::from_message(msg);
        next.insert(d.partition, d.offset + 1);
        if filter.matches(&d) {
            let target = to.unwrap_or(d.meta(H_TOPIC)).to_string();
            if target.is_empty() {
                return Err(DlqError::Other(format!(
                    "{topic}[{}]@{} has no {H_TOPIC} header; pass --to",
                    d.partition, d.offset
                )));
            }
            let mut headers = OwnedHeaders::new_with_capacity(d.headers.len() + 1);
            for (k, v) in &d.headers {
                headers = headers.insert(Header {
                    key: k,
                    value: Some(v),
                });
            }
            let from = format!("{topic}/{}/{}", d.partition, d.offset);
            headers = headers.insert(Header {
                key: H_REPLAYED_FROM,
                value: Some(&from),
            });
            let mut record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(&target).headers(headers);
            if let Some(k) = &d.key {
                record = record.key(k);
            }
            if let Some(v) = &d.value {
                record = record.payload(v);
            }
            loop {
                match producer.send(record) {
                    Ok(()) => break,
                    Err((
                        rdkafka::error::KafkaError::MessageProduction(
                            rdkafka::types::RDKafkaErrorCode::QueueFull,
                        ),
                        back,
                    )) => {
                        record = back;
                        producer.poll(Duration::from_millis(5));
                    }
                    Err((e, _)) => return Err(e.into()),
                }
            }
            stats.replayed += 1;
        }
        in_txn += 1;
        if in_txn >= 1000 {
            commit(&next, &consumer)?;
            progress(stats.read, total);
            producer.begin_transaction()?;
            in_txn = 0;
        }
        Ok(())
    })?;
    commit(&next, &consumer)?;
    progress(stats.read, total);
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transform::Origin;

    fn original() -> Record {
        Record {
            key: Some(b"k".to_vec()),
            value: Some(b"{not json".to_vec()),
            headers: vec![
                ("trace".into(), b"abc".to_vec()),
                (H_KIND.into(), b"stale".to_vec()),
            ],
            timestamp: Some(1_700_000_000_000),
            origin: Origin {
                topic: "orders".into(),
                partition: 3,
                offset: 42,
            },
        }
    }

    fn failure() -> Failure {
        Failure {
            kind: "decode".into(),
            message: "expected value at line 1".into(),
            stage: "decode".into(),
            attempts: 1,
        }
    }

    #[test]
    fn dead_letter_keeps_the_original_verbatim_and_describes_the_failure() {
        let d = dead_letter(&original(), &failure(), "t", "i-0", 1_800_000_000_000);
        assert_eq!(d.key, original().key);
        assert_eq!(d.value, original().value);
        assert_eq!(d.timestamp, original().timestamp);
        let h: BTreeMap<&str, String> = d
            .headers
            .iter()
            .map(|(k, v)| (k.as_str(), String::from_utf8_lossy(v).into_owned()))
            .collect();
        assert_eq!(h["trace"], "abc");
        assert_eq!(
            h[H_KIND], "decode",
            "a stale onceflow header is replaced, not doubled"
        );
        assert_eq!(d.headers.iter().filter(|(k, _)| k == H_KIND).count(), 1);
        assert_eq!(h[H_MESSAGE], "expected value at line 1");
        assert_eq!(h[H_STAGE], "decode");
        assert_eq!(h[H_ATTEMPTS], "1");
        assert_eq!(h[H_TOPIC], "orders");
        assert_eq!(h[H_PARTITION], "3");
        assert_eq!(h[H_OFFSET], "42");
        assert_eq!(h[H_TIMESTAMP], "1700000000000");
        assert_eq!(h[H_TOPOLOGY], "t");
        assert_eq!(h[H_INSTANCE], "i-0");
        assert_eq!(h[H_FAILED_AT], "1800000000000");
    }

    fn letter(kind: &str, partition: &str, at: &str) -> DeadLetter {
        DeadLetter {
            partition: 0,
            offset: 0,
            key: None,
            value: None,
            timestamp: None,
            headers: vec![],
            meta: [
                (H_KIND.to_string(), kind.to_string()),
                (H_PARTITION.to_string(), partition.to_string()),
                (H_FAILED_AT.to_string(), at.to_string()),
            ]
            .into_iter()
            .collect(),
        }
    }

    #[test]
    fn filter_by_kind_time_and_partition() {
        let d = letter("decode", "2", "1000");
        assert!(Filter::default().matches(&d));
        let kind = Filter {
            kind: Some("decode".into()),
            ..Filter::default()
        };
        assert!(kind.matches(&d));
        assert!(!kind.matches(&letter("expression", "2", "1000")));
        let time = Filter {
            since_ms: Some(1000),
            until_ms: Some(2000),
            ..Filter::default()
        };
        assert!(time.matches(&d));
        assert!(!time.matches(&letter("decode", "2", "2000")));
        assert!(!time.matches(&letter("decode", "2", "999")));
        let part = Filter {
            origin_partition: Some(2),
            ..Filter::default()
        };
        assert!(part.matches(&d));
        assert!(!part.matches(&letter("decode", "1", "1000")));
    }

    #[test]
    fn filter_tags_are_stable_and_distinct() {
        let a = Filter::default().tag();
        assert_eq!(a, Filter::default().tag());
        let b = Filter {
            kind: Some("decode".into()),
            ..Filter::default()
        }
        .tag();
        assert_ne!(a, b);
        assert_eq!(a.len(), 16);
    }

    #[test]
    fn payloads_are_shortened_for_display() {
        assert_eq!(shorten(None, 5), "(null)");
        assert_eq!(shorten(Some(b"abc"), 5), "abc");
        assert_eq!(shorten(Some(b"abcdefgh"), 5), "abcde…");
        assert_eq!(shorten(Some(b"a\nb"), 5), "a b");
    }
}
