//! Reading a topic to its end under read_committed: what a command sees of a topic is what
//! its committed transactions wrote, up to the end offsets taken when it starts.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::{Offset, TopicPartitionList};

use super::Cluster;
use super::batch::{BatchQueue, Polled};

/// Why a topic could not be read to its end.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
    #[error("topic {0} does not exist")]
    NoTopic(String),
    #[error("no progress for {}s reading {topic}; partitions still pending: {pending:?}", .idle.as_secs())]
    Stalled {
        topic: String,
        idle: Duration,
        pending: BTreeMap<i32, i64>,
    },
}

/// How long a read may see nothing before it gives up.
const MAX_IDLE: Duration = Duration::from_secs(30);
/// Bound of each metadata and offset request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// A read_committed consumer of `group` that never commits by itself and starts at the
/// beginning where the group has no offset.
pub fn reader(cluster: &Cluster, group: &str) -> Result<BaseConsumer, KafkaError> {
    cluster
        .config()
        .set("group.id", group)
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set(
            "fetch.queue.backoff.ms",
            crate::kafka::clients::FETCH_QUEUE_BACKOFF_MS,
        )
        .create()
}

/// A [`reader`] of `group` assigned partitions `0..partitions` of `topic` from their
/// beginning, whatever the group has committed.
pub fn reader_from_beginning(
    cluster: &Cluster,
    group: &str,
    topic: &str,
    partitions: i32,
) -> Result<BaseConsumer, KafkaError> {
    let consumer = reader(cluster, group)?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    Ok(consumer)
}

/// The low and end offsets of every partition of `topic` now.
pub fn watermarks(
    consumer: &BaseConsumer,
    topic: &str,
) -> Result<BTreeMap<i32, (i64, i64)>, ReadError> {
    let metadata = consumer.fetch_metadata(Some(topic), REQUEST_TIMEOUT)?;
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    if partitions.is_empty() {
        return Err(ReadError::NoTopic(topic.to_string()));
    }
    let mut marks = BTreeMap::new();
    for p in partitions {
        marks.insert(p, consumer.fetch_watermarks(topic, p, REQUEST_TIMEOUT)?);
    }
    Ok(marks)
}

/// Reads `topic` from the group's committed offsets (or the beginning) up to the end offsets
/// taken at the start, calling `each` for every record.
pub fn read_to_end<E: From<ReadError>>(
    consumer: &BaseConsumer,
    topic: &str,
    mut each: impl FnMut(&BorrowedMessage<'_>) -> Result<(), E>,
) -> Result<(), E> {
    let mut pending = assign_from_committed(consumer, topic)?;
    let mut idle_since = Instant::now();
    while !pending.is_empty() {
        // Under read_committed a partition's end may be a transaction marker that is never
        // delivered: positions tell when it is passed.
        let positions = consumer.position().map_err(ReadError::from)?;
        for e in positions.elements() {
            if let Offset::Offset(pos) = e.offset()
                && pending.get(&e.partition()).is_some_and(|end| pos >= *end)
            {
                pending.remove(&e.partition());
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
            Some(Err(e)) => return Err(ReadError::from(e).into()),
            None if idle_since.elapsed() > MAX_IDLE => {
                return Err(ReadError::Stalled {
                    topic: topic.to_string(),
                    idle: MAX_IDLE,
                    pending,
                }
                .into());
            }
            None => {}
        }
    }
    Ok(())
}

/// Assigns every partition of `topic` at the group's committed offset (or its low
/// watermark), and returns the end offset of each partition that has records to read.
fn assign_from_committed(
    consumer: &BaseConsumer,
    topic: &str,
) -> Result<BTreeMap<i32, i64>, ReadError> {
    let marks = watermarks(consumer, topic)?;
    let mut tpl = TopicPartitionList::new();
    for p in marks.keys() {
        tpl.add_partition(topic, *p);
    }
    let committed = consumer.committed_offsets(tpl, REQUEST_TIMEOUT)?;
    let mut assign = TopicPartitionList::new();
    let mut pending = BTreeMap::new();
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
    Ok(pending)
}

/// Partition to `[start, end)`.
pub type Ranges = BTreeMap<i32, (i64, i64)>;
/// Partition to the end offset a read did not reach.
pub type Unfinished = BTreeMap<i32, i64>;

/// What [`read_ranges_split`] reads, and with what.
pub struct Split<'a> {
    pub cluster: &'a Cluster,
    /// The group of its readers (assigned partitions, never joined or committed).
    pub group: &'a str,
    pub topic: &'a str,
    /// Partition to `[start, end)`.
    pub ranges: &'a BTreeMap<i32, (i64, i64)>,
    /// How long a read may see nothing before it gives up (see [`read_ranges`]).
    pub idle: Duration,
    /// How many readers at most (at most one per partition).
    pub threads: usize,
}

/// Reads `split.ranges` of `split.topic` like [`read_ranges`], over up to `split.threads`
/// threads, each with its own [`reader`] and its own share of the partitions (whole
/// partitions, so each one is still read in offset order). `init` makes a thread's state,
/// `each` is called with it for every record of its partitions; the states come back with
/// the partitions each thread could not finish, for the caller to merge. `progress` is called
/// on the calling thread, about every 200 ms, with the records read so far.
pub fn read_ranges_split<S: Send, E: From<ReadError> + Send>(
    split: &Split<'_>,
    init: impl Fn() -> S + Sync,
    each: impl Fn(&mut S, &Polled<'_>) -> Result<(), E> + Sync,
    progress: &mut dyn FnMut(u64),
) -> Result<Vec<(S, Unfinished)>, E> {
    let shares = deal(split.ranges, split.threads);
    let read = AtomicU64::new(0);
    let done = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        let workers: Vec<_> = shares
            .iter()
            .map(|share| {
                let (init, each, read, done) = (&init, &each, &read, &done);
                scope.spawn(move || {
                    let result = read_share(split, share, init, each, read);
                    done.fetch_add(1, Ordering::Release);
                    result
                })
            })
            .collect();
        while done.load(Ordering::Acquire) < workers.len() {
            std::thread::sleep(Duration::from_millis(200));
            progress(read.load(Ordering::Relaxed));
        }
        progress(read.load(Ordering::Relaxed));
        workers
            .into_iter()
            .map(|w| match w.join() {
                Ok(result) => result,
                // A panic in a reader is a bug: carry it on to the caller's thread.
                Err(panic) => std::panic::resume_unwind(panic),
            })
            .collect()
    })
}

/// One thread of [`read_ranges_split`]: its consumer over its `share`.
fn read_share<S, E: From<ReadError>>(
    split: &Split<'_>,
    share: &BTreeMap<i32, (i64, i64)>,
    init: &impl Fn() -> S,
    each: &impl Fn(&mut S, &Polled<'_>) -> Result<(), E>,
    read: &AtomicU64,
) -> Result<(S, BTreeMap<i32, i64>), E> {
    let consumer = reader(split.cluster, split.group).map_err(ReadError::from)?;
    let mut state = init();
    let mut unreported = 0u64;
    let unfinished = read_ranges(&consumer, split.topic, share, split.idle, |msg| {
        unreported += 1;
        if unreported == 4096 {
            read.fetch_add(unreported, Ordering::Relaxed);
            unreported = 0;
        }
        each(&mut state, msg)
    })?;
    read.fetch_add(unreported, Ordering::Relaxed);
    Ok((state, unfinished))
}

/// `ranges` dealt into at most `n` non-empty shares of whole partitions, balanced by the
/// records each holds (largest first, each to the lightest share).
fn deal(ranges: &BTreeMap<i32, (i64, i64)>, n: usize) -> Vec<BTreeMap<i32, (i64, i64)>> {
    let mut parts: Vec<(i32, (i64, i64))> = ranges
        .iter()
        .filter(|(_, (start, end))| start < end)
        .map(|(&p, &r)| (p, r))
        .collect();
    parts.sort_by_key(|(p, (start, end))| (std::cmp::Reverse(end - start), *p));
    let n = n.clamp(1, parts.len().max(1));
    let mut shares: Vec<(i64, Ranges)> = vec![(0, BTreeMap::new()); n];
    for (p, (start, end)) in parts {
        if let Some(lightest) = shares.iter_mut().min_by_key(|(load, _)| *load) {
            lightest.0 += end - start;
            lightest.1.insert(p, (start, end));
        }
    }
    shares
        .into_iter()
        .map(|(_, share)| share)
        .filter(|share| !share.is_empty())
        .collect()
}

/// Reads `ranges` of `topic` (partition to `[start, end)`), calling `each` for every record
/// in them, as fast as the consumer fetches (taken from its queue a batch at a time,
/// [`BatchQueue`]). Returns the partitions it could not finish:
/// those where nothing came for `idle` (under read_committed, a partition whose last stable
/// offset is held back by an open transaction); the caller decides whether that is an error.
pub fn read_ranges<E: From<ReadError>>(
    consumer: &BaseConsumer,
    topic: &str,
    ranges: &BTreeMap<i32, (i64, i64)>,
    idle: Duration,
    mut each: impl FnMut(&Polled<'_>) -> Result<(), E>,
) -> Result<BTreeMap<i32, i64>, E> {
    let mut assign = TopicPartitionList::new();
    let mut pending = BTreeMap::new();
    for (&p, &(start, end)) in ranges {
        if start < end {
            assign
                .add_partition_offset(topic, p, Offset::Offset(start))
                .map_err(ReadError::from)?;
            pending.insert(p, end);
        }
    }
    if pending.is_empty() {
        return Ok(pending);
    }
    consumer.assign(&assign).map_err(ReadError::from)?;
    let mut queue = BatchQueue::new(consumer).map_err(ReadError::from)?;
    let mut idle_since = Instant::now();
    // Whether a record came since the last empty poll: reading the clock once per record
    // cost more than the rest of this loop.
    let mut active = false;
    let mut since_check = 0usize;
    while !pending.is_empty() {
        let taken = queue
            .poll(Duration::from_millis(100), |msg| {
                let p = msg.partition();
                if let Some(&end) = pending.get(&p) {
                    if msg.offset() < end {
                        each(msg).map_err(Stop::Each)?;
                    }
                    if msg.offset() + 1 >= end {
                        pending.remove(&p);
                    }
                }
                Ok(())
            })
            .map_err(|stop| match stop {
                Stop::Each(e) => e,
                Stop::Kafka(e) => ReadError::from(e).into(),
            })?;
        if taken > 0 {
            active = true;
            since_check += taken;
            // The end may be a transaction marker, never delivered: positions tell.
            if since_check >= 10_000 {
                since_check = 0;
                drop_passed(consumer, &mut pending)?;
            }
        } else {
            drop_passed(consumer, &mut pending)?;
            if active {
                // Silent for at most one poll since the last record.
                active = false;
                idle_since = Instant::now();
            } else if idle_since.elapsed() > idle {
                break;
            }
        }
    }
    Ok(pending)
}

/// Why a batch of [`read_ranges`] stopped: its callback's error, or the consumer's.
enum Stop<E> {
    Each(E),
    Kafka(KafkaError),
}

impl<E> From<KafkaError> for Stop<E> {
    fn from(e: KafkaError) -> Self {
        Stop::Kafka(e)
    }
}

/// Removes from `pending` the partitions whose position is at or past their end.
fn drop_passed(consumer: &BaseConsumer, pending: &mut BTreeMap<i32, i64>) -> Result<(), ReadError> {
    let positions = consumer.position()?;
    for e in positions.elements() {
        if let Offset::Offset(pos) = e.offset()
            && pending.get(&e.partition()).is_some_and(|end| pos >= *end)
        {
            pending.remove(&e.partition());
        }
    }
    Ok(())
}

/// The record at `offset` of `topic[partition]`, read with read_committed, or `None` when the
/// topic no longer holds it (retention or compaction removed it).
pub fn read_one(
    cluster: &Cluster,
    topic: &str,
    partition: i32,
    offset: i64,
) -> Result<Option<rdkafka::message::OwnedMessage>, ReadError> {
    let consumer: BaseConsumer = cluster
        .config()
        .set("group.id", "onceflow.read-one")
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .create()?;
    let (low, end) = consumer.fetch_watermarks(topic, partition, REQUEST_TIMEOUT)?;
    if offset < low || offset >= end {
        return Ok(None);
    }
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Offset(offset))?;
    consumer.assign(&tpl)?;
    let started = Instant::now();
    while started.elapsed() < MAX_IDLE {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(msg)) if msg.offset() == offset => return Ok(Some(msg.detach())),
            // Past it: the offset is a hole (compacted away, or a transaction marker).
            Some(Ok(_)) => return Ok(None),
            Some(Err(e)) => return Err(e.into()),
            None => {}
        }
    }
    Err(ReadError::Stalled {
        topic: topic.to_string(),
        idle: MAX_IDLE,
        pending: [(partition, offset + 1)].into_iter().collect(),
    })
}

#[cfg(test)]
mod tests {
    use rdkafka::error::RDKafkaErrorCode;
    use rdkafka::message::{Header, Headers, OwnedHeaders};
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

    use super::*;
    use crate::kafka::embedded::EmbeddedCluster;

    /// Writes `n` records to each of `partitions` partitions of `topic`: key `p-i`, value
    /// `v-i`, a header `n: i` on every other record, timestamp 1000 + i.
    fn write(cluster: &Cluster, topic: &str, partitions: i32, n: i64) {
        let producer: BaseProducer = cluster.config().set("linger.ms", "5").create().unwrap();
        for p in 0..partitions {
            for i in 0..n {
                let (key, value, number) = (format!("{p}-{i}"), format!("v-{i}"), i.to_string());
                let mut record = BaseRecord::to(topic)
                    .partition(p)
                    .key(&key)
                    .payload(&value)
                    .timestamp(1000 + i);
                if i % 2 == 0 {
                    record = record.headers(OwnedHeaders::new().insert(Header {
                        key: "n",
                        value: Some(number.as_bytes()),
                    }));
                }
                while let Err((e, r)) = producer.send(record) {
                    assert!(matches!(
                        e,
                        KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull)
                    ));
                    producer.poll(Duration::from_millis(10));
                    record = r;
                }
            }
        }
        producer.flush(Duration::from_secs(30)).unwrap();
    }

    #[test]
    fn ranges_are_read_a_batch_at_a_time_each_record_once_in_order_with_its_fields() {
        let embedded = EmbeddedCluster::start(1).unwrap();
        embedded.create_topic("t", 3).unwrap();
        let cluster = Cluster::new(embedded.bootstrap_servers());
        write(&cluster, "t", 3, 3000);
        // Part of partition 0, all of 1 (more than a batch), none of 2.
        let ranges: Ranges = [(0, (100, 1500)), (1, (0, 3000)), (2, (7, 7))]
            .into_iter()
            .collect();
        let consumer = reader(&cluster, "t-readers").unwrap();
        let mut next: BTreeMap<i32, i64> = BTreeMap::new();
        let unfinished = read_ranges(&consumer, "t", &ranges, Duration::from_secs(10), |msg| {
            let (p, o) = (msg.partition(), msg.offset());
            let expected = next.entry(p).or_insert(ranges[&p].0);
            assert_eq!(o, *expected, "partition {p}: offsets in order, none twice");
            *expected += 1;
            assert_eq!(msg.topic(), "t");
            assert_eq!(msg.key(), Some(format!("{p}-{o}").as_bytes()));
            assert_eq!(msg.payload(), Some(format!("v-{o}").as_bytes()));
            assert_eq!(msg.timestamp().to_millis(), Some(1000 + o));
            let headers: Vec<(String, Vec<u8>)> = msg
                .headers()
                .map(|hs| {
                    hs.iter()
                        .map(|h| (h.key.to_string(), h.value.unwrap_or_default().to_vec()))
                        .collect()
                })
                .unwrap_or_default();
            if o % 2 == 0 {
                assert_eq!(headers, vec![("n".to_string(), o.to_string().into_bytes())]);
            } else {
                assert!(headers.is_empty());
            }
            Ok::<_, ReadError>(())
        })
        .unwrap();
        assert!(unfinished.is_empty(), "{unfinished:?}");
        assert_eq!(next, [(0, 1500), (1, 3000)].into_iter().collect());

        // The callback's error ends the read, and is what the read returns.
        let consumer = reader(&cluster, "t-readers").unwrap();
        let mut seen = 0;
        let stopped = read_ranges(&consumer, "t", &ranges, Duration::from_secs(10), |_| {
            seen += 1;
            if seen == 10 {
                Err(ReadError::NoTopic("stop here".into()))
            } else {
                Ok(())
            }
        });
        assert!(matches!(stopped, Err(ReadError::NoTopic(m)) if m == "stop here"));
        assert_eq!(seen, 10, "no record after the error");
    }

    #[test]
    fn partitions_are_dealt_whole_and_balanced() {
        let ranges: BTreeMap<i32, (i64, i64)> = [
            (0, (0, 100)),
            (1, (0, 90)),
            (2, (10, 10)),
            (3, (5, 20)),
            (4, (0, 80)),
        ]
        .into_iter()
        .collect();
        let shares = deal(&ranges, 2);
        assert_eq!(shares.len(), 2);
        let loads: Vec<i64> = shares
            .iter()
            .map(|s| s.values().map(|(a, b)| b - a).sum())
            .collect();
        assert_eq!(loads, vec![115, 170]);
        let mut all: Vec<i32> = shares.iter().flat_map(|s| s.keys().copied()).collect();
        all.sort_unstable();
        assert_eq!(
            all,
            vec![0, 1, 3, 4],
            "every partition with records, once; none empty"
        );
        assert_eq!(deal(&ranges, 16).len(), 4, "no more shares than partitions");
        assert_eq!(deal(&ranges, 0).len(), 1);
        assert!(deal(&BTreeMap::new(), 2).is_empty());
    }
}
