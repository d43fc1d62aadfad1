//! Bringing a partition's state up to its changelog's end when the partition is assigned:
//! from the store's checkpoint when it has a valid one (the tail), else from the beginning
//! into an emptied store. Read with read_committed to the end offset the broker gives
//! read_committed readers (the last stable offset), told by librdkafka's partition-EOF event:
//! never "until a last record", since transaction markers and compaction leave offset gaps.
//!
//! A changelog's end is taken only once no transaction is open on it (its last stable offset
//! has reached its high watermark). A transaction the partition's previous owner was
//! committing when the partition moved (its coordinator's broker down, say) is decided later:
//! read to the last stable offset before that, the state would lack what the transaction
//! commits, while the consumer's committed offsets (read stable, KIP-447) skip its records:
//! a window's final result emitted again, a count short.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::{ClientConfig, ClientContext, Offset, TopicPartitionList};

use super::store::{Backend, CHECKPOINT_MAX_AGE, Checkpoint, StoreError, TIMED_CHECKPOINT_MAX_AGE};
use super::{Changes, GLOBAL, Stores, age, now_ms};
use crate::telemetry;
use crate::topology::StoreSource;

/// Changes read are applied to the store in batches of this many records (state larger than
/// memory restores into a disk store without holding it all).
const APPLY_EVERY: usize = 10_000;

/// Why a restore failed.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error("state restore: kafka client: {0}")]
    Client(#[from] KafkaError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(
        "state restore: changelog {topic} partition {partition} not read to its end: nothing came for {}s ({read} records read)",
        .after.as_secs()
    )]
    Timeout {
        topic: String,
        partition: i32,
        read: u64,
        after: Duration,
    },
    #[error(
        "state restore: changelog {topic} partition {partition} has a transaction open at offset {offset} that did not end within {}s (`onceflow txn doctor` names its producer)",
        .waited.as_secs()
    )]
    OpenTransaction {
        topic: String,
        partition: i32,
        offset: i64,
        waited: Duration,
    },
}

/// What a restore read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Restored {
    pub records: u64,
    /// Partitions read from their checkpoint (the tail) rather than from the beginning.
    pub from_checkpoint: u64,
    pub took: Duration,
}

/// The restore consumer's context: the end of a partition is what it waits for, not an
/// error to log.
pub struct RestoreContext;

impl ClientContext for RestoreContext {
    fn error(&self, error: KafkaError, reason: &str) {
        let eof = matches!(
            error,
            KafkaError::PartitionEOF(_) | KafkaError::Global(RDKafkaErrorCode::PartitionEOF)
        );
        if !eof {
            telemetry::restore_client_error(&error, reason);
        }
    }
}

impl ConsumerContext for RestoreContext {}

/// The consumer that restores state and reads the changelogs' watermarks.
pub type RestoreConsumer = BaseConsumer<RestoreContext>;

/// The configuration of the restore consumer, from the job consumer's: no group membership,
/// no offset commit, read_committed, partition-EOF events on.
pub fn restore_config(consumer: &ClientConfig) -> ClientConfig {
    let mut config = consumer.clone();
    config.remove("group.instance.id");
    config.remove("group.protocol");
    config.remove("partition.assignment.strategy");
    config.remove("statistics.interval.ms");
    config
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        .set("auto.offset.reset", "earliest");
    config
}

/// Creates the restore consumer.
pub fn consumer(config: &ClientConfig) -> Result<RestoreConsumer, KafkaError> {
    config.create_with_context(RestoreContext)
}

/// What restores the stores: the restore consumer, a read_uncommitted client that reads the
/// changelogs' high watermarks (to see a transaction still open), and how long a restore
/// may go without progress ([`patience`]).
pub struct Reader {
    pub consumer: RestoreConsumer,
    ends: RestoreConsumer,
    pub timeout: Duration,
}

impl Reader {
    /// The reader of a restore consumer configured by `config` ([`restore_config`]), for a
    /// job whose transaction timeout is `transaction_timeout`.
    pub fn new(config: &ClientConfig, transaction_timeout: Duration) -> Result<Reader, KafkaError> {
        let mut uncommitted = config.clone();
        uncommitted.set("isolation.level", "read_uncommitted");
        Ok(Reader {
            consumer: consumer(config)?,
            ends: consumer(&uncommitted)?,
            timeout: patience(transaction_timeout),
        })
    }
}

/// How long a restore goes without progress before it fails, for a job whose transaction
/// timeout is `transaction_timeout`: twice that plus 10 s. A transaction open on a changelog
/// is aborted by its coordinator at most the transaction timeout after it began, checking
/// every 10 s (`transaction.abort.timed.out.transaction.cleanup.interval.ms`); a broker that
/// died has its partitions' leaders moved within about as long (its session times out).
fn patience(transaction_timeout: Duration) -> Duration {
    transaction_timeout * 2 + Duration::from_secs(10)
}

/// One watermark request's bound, so that a request stuck on a broker that died is asked
/// again (after a metadata refresh) well within the restore's patience.
const WATERMARK_CALL: Duration = Duration::from_secs(3);

/// Whether a changelog partition whose last stable offset is `stable` and high watermark
/// `high` has no transaction open: everything below its end is decided.
fn settled(stable: i64, high: i64) -> bool {
    stable >= high
}

/// A changelog partition's low watermark and its end (the last stable offset) once no
/// transaction is open on it, waited for as the reader's patience allows.
fn settled_watermarks(
    reader: &Reader,
    topic: &str,
    partition: i32,
) -> Result<(i64, i64), RestoreError> {
    let started = Instant::now();
    let mut told = false;
    loop {
        let (low, stable) = watermarks(&reader.consumer, topic, partition, reader.timeout)?;
        let (_, high) = watermarks(&reader.ends, topic, partition, reader.timeout)?;
        if settled(stable, high) {
            if told {
                telemetry::state_restore_waited(topic, partition, started.elapsed());
            }
            return Ok((low, stable));
        }
        let waited = started.elapsed();
        if waited >= reader.timeout {
            return Err(RestoreError::OpenTransaction {
                topic: topic.to_string(),
                partition,
                offset: stable,
                waited,
            });
        }
        if !told {
            telemetry::state_restore_waits(topic, partition, stable, high);
            told = true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Where one partition's restore starts and how far its log goes.
struct Span {
    partition: i32,
    start: i64,
    high: i64,
}

/// Where a restored table goes on from: (store, partition, next offset).
pub type Reached = Vec<(usize, i32, i64)>;

/// Which stores a restore brings up to date.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    /// Every store of newly assigned partitions.
    All,
    /// The changelogs' stores of held partitions again (their tables followed already).
    Changelogs,
}

/// Brings the state of every store on `partitions` up to their topics' ends (and a global
/// table not held yet, whole); a restore fails when nothing comes for the reader's timeout.
/// Returns where each table's partitions were read to, for following them from there.
pub fn restore(
    reader: &Reader,
    stores: &mut Stores,
    partitions: &[i32],
    which: Which,
) -> Result<(Restored, Reached), RestoreError> {
    let (consumer, timeout) = (&reader.consumer, reader.timeout);
    let started = Instant::now();
    let mut total = Restored::default();
    let mut tables = Reached::new();
    if partitions.is_empty() {
        return Ok((total, tables));
    }
    for store in 0..stores.topics().len() {
        let topic = stores.topics()[store].clone();
        let source = stores.sources()[store];
        if which == Which::Changelogs && source != StoreSource::Changelog {
            continue;
        }
        let (spans, into) = match source {
            StoreSource::GlobalTable if stores.holds_global(store) => continue,
            StoreSource::GlobalTable => {
                let n =
                    crate::kafka::partition_count(consumer.client(), &topic, timeout)?.unwrap_or(0);
                let all: Vec<i32> = (0..n as i32).collect();
                let (spans, tail) = global_spans(consumer, &topic, store, &all, stores, timeout)?;
                total.from_checkpoint += tail;
                (spans, Some(GLOBAL))
            }
            StoreSource::Changelog | StoreSource::Table => {
                let mut spans = Vec::new();
                for &partition in partitions {
                    // Only this job writes a changelog; a table's writers may keep a
                    // transaction open at every moment.
                    let (low, high) = if source == StoreSource::Changelog {
                        settled_watermarks(reader, &topic, partition)?
                    } else {
                        watermarks(consumer, &topic, partition, timeout)?
                    };
                    let max_age = if stores.is_timed(store) {
                        TIMED_CHECKPOINT_MAX_AGE
                    } else {
                        CHECKPOINT_MAX_AGE
                    };
                    let (start, tail) =
                        start_of(stores.backend(), (store, partition), (low, high), max_age)?;
                    total.from_checkpoint += u64::from(tail);
                    spans.push(Span {
                        partition,
                        start,
                        high,
                    });
                }
                (spans, None)
            }
        };
        let read = read_to_end(
            consumer,
            (&topic, store, into),
            &spans,
            stores.backend(),
            timeout,
        )?;
        total.records += read.0;
        if source != StoreSource::Changelog {
            tables.extend(read.1.into_iter().map(|(p, o)| (store, p, o)));
        }
        if source == StoreSource::GlobalTable {
            // Held whole: the mark that every partition's checkpoint now stands for it.
            let mark = Checkpoint {
                offset: 0,
                at_ms: now_ms(),
            };
            stores
                .backend()
                .apply(HashMap::new(), &[((store, GLOBAL), mark)])?;
        }
    }
    total.took = started.elapsed();
    telemetry::state_restored(partitions, total.records, total.from_checkpoint, total.took);
    Ok((total, tables))
}

/// Where each partition of a global table restores from: every one from its checkpoint when
/// the table is held whole (its mark) and each checkpoint is valid, else every one from the
/// beginning into the emptied table (its rows are not kept apart by partition). Returns the
/// spans and how many start at a checkpoint.
fn global_spans(
    consumer: &RestoreConsumer,
    topic: &str,
    store: usize,
    partitions: &[i32],
    stores: &mut Stores,
    timeout: Duration,
) -> Result<(Vec<Span>, u64), RestoreError> {
    let backend = stores.backend();
    backend.open((store, GLOBAL))?;
    let marked = backend.checkpoint((store, GLOBAL))?.is_some();
    let mut spans = Vec::new();
    let mut all_valid = marked;
    for &partition in partitions {
        let (low, high) = watermarks(consumer, topic, partition, timeout)?;
        let cp = backend.checkpoint((store, partition))?;
        let start = match cp {
            Some(cp) if valid(cp, low, high, age(cp.at_ms), CHECKPOINT_MAX_AGE) => cp.offset,
            _ => {
                all_valid = false;
                low
            }
        };
        spans.push(Span {
            partition,
            start,
            high,
        });
    }
    if all_valid {
        let n = spans.len() as u64;
        return Ok((spans, n));
    }
    backend.clear((store, GLOBAL))?;
    backend.open((store, GLOBAL))?;
    for s in &mut spans {
        s.start = watermarks(consumer, topic, s.partition, timeout)?.0;
    }
    Ok((spans, 0))
}

/// Whether a consumer error event is transient (a broker down or moving): the client
/// recovers by itself.
pub(crate) fn is_transient(e: &KafkaError) -> bool {
    !matches!(e, KafkaError::MessageConsumptionFatal(_))
}

/// A partition's low and high watermarks, asked again while the broker is unreachable
/// (a broker restarting), for at most `timeout`.
fn watermarks(
    consumer: &RestoreConsumer,
    topic: &str,
    partition: i32,
    timeout: Duration,
) -> Result<(i64, i64), KafkaError> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let bound = left.clamp(Duration::from_secs(1), WATERMARK_CALL);
        match consumer.fetch_watermarks(topic, partition, bound) {
            Ok(w) => return Ok(w),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(e) => {
                telemetry::restore_client_error(&e, "watermarks");
                // librdkafka answers "unknown partition" from a metadata cache that lost the
                // partition (seen for 10 s on end after a broker's restart) and does not ask
                // again by itself, nor for a leader that died: ask for the topic's metadata.
                let _ = consumer.fetch_metadata(Some(topic), Duration::from_secs(1));
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
}

/// Where a store's partition restores from, given its changelog's low and high watermarks:
/// its checkpoint when valid (`true`), else the beginning, the store emptied first. A
/// checkpoint is invalid below the log's start (the records it needs are gone), beyond its
/// end (the changelog was recreated), or older than `max_age` ([`CHECKPOINT_MAX_AGE`], or
/// for a timed store [`TIMED_CHECKPOINT_MAX_AGE`]).
fn start_of(
    backend: &mut dyn Backend,
    at: (usize, i32),
    (low, high): (i64, i64),
    max_age: Duration,
) -> Result<(i64, bool), StoreError> {
    backend.open(at)?;
    match backend.checkpoint(at)? {
        Some(cp) if valid(cp, low, high, age(cp.at_ms), max_age) => Ok((cp.offset, true)),
        _ => {
            backend.clear(at)?;
            backend.open(at)?;
            Ok((low, false))
        }
    }
}

/// Whether a checkpoint of `age` can restore a partition whose log spans `low..high`.
fn valid(cp: Checkpoint, low: i64, high: i64, age: Duration, max_age: Duration) -> bool {
    cp.offset >= low && cp.offset <= high && age < max_age
}

/// The checkpoints of store `store`'s `partitions` at the offsets `reached` gives (below which
/// their state holds every change), as of now.
fn marks(
    store: usize,
    partitions: &[i32],
    reached: &HashMap<i32, i64>,
) -> Vec<((usize, i32), Checkpoint)> {
    let at_ms = now_ms();
    partitions
        .iter()
        .map(|&p| {
            let offset = reached.get(&p).copied().unwrap_or(0);
            ((store, p), Checkpoint { offset, at_ms })
        })
        .collect()
}

/// Reads `topic`'s partitions from their starts to their ends into store `store` of
/// `backend` (all under partition `into` when given, else each under its own), in batches,
/// and writes each partition's checkpoint when it reaches its end; returns the records read
/// and the offset each partition was read to.
fn read_to_end(
    consumer: &RestoreConsumer,
    (topic, store, into): (&str, usize, Option<i32>),
    spans: &[Span],
    backend: &mut dyn Backend,
    timeout: Duration,
) -> Result<(u64, HashMap<i32, i64>), RestoreError> {
    // A partition with nothing past its start (its checkpoint at the log's end, as after a
    // clean stop or a quiet spell) is at its end already: not fetched (the partition-EOF
    // event would come a fetch wait later), its checkpoint written again as of now.
    let (empty, spans): (Vec<&Span>, Vec<&Span>) = spans.iter().partition(|s| s.start >= s.high);
    let mut reached: HashMap<i32, i64> = empty.iter().map(|s| (s.partition, s.start)).collect();
    if !empty.is_empty() {
        let done: Vec<i32> = empty.iter().map(|s| s.partition).collect();
        backend.apply(HashMap::new(), &marks(store, &done, &reached))?;
    }
    if spans.is_empty() {
        telemetry::state_restoring(topic, &[], 0, 0);
        return Ok((0, reached));
    }
    let mut tpl = TopicPartitionList::new();
    for s in &spans {
        tpl.add_partition_offset(topic, s.partition, Offset::Offset(s.start))?;
    }
    consumer.assign(&tpl)?;
    let to_read: u64 = spans
        .iter()
        .map(|s| u64::try_from(s.high - s.start).unwrap_or(0))
        .sum();
    let mut open: Vec<i32> = spans.iter().map(|s| s.partition).collect();
    telemetry::state_restoring(topic, &open, 0, to_read);
    // The next offset each partition's state holds every change below.
    reached.extend(spans.iter().map(|s| (s.partition, s.start)));
    let mut batch: HashMap<(usize, i32), Changes> = HashMap::new();
    let mut batched = 0usize;
    let mut read = 0u64;
    let mut deadline = Instant::now() + timeout;
    let mut last_log = Instant::now();
    while !open.is_empty() {
        if Instant::now() >= deadline {
            return Err(RestoreError::Timeout {
                topic: topic.to_string(),
                partition: open[0],
                read,
                after: timeout,
            });
        }
        match consumer.poll(Duration::from_millis(100)) {
            None => {}
            Some(Err(KafkaError::PartitionEOF(p))) => {
                open.retain(|&o| o != p);
                // Everything below the partition's end is read: applied with its checkpoint.
                backend.apply(std::mem::take(&mut batch), &marks(store, &[p], &reached))?;
                batched = 0;
            }
            // A broker going away is a transient error event: the client reconnects, and
            // the deadline bounds a restore that gets nowhere.
            Some(Err(e)) if is_transient(&e) => telemetry::restore_client_error(&e, "restore"),
            Some(Err(e)) => return Err(e.into()),
            Some(Ok(msg)) => {
                read += 1;
                deadline = Instant::now() + timeout;
                reached.insert(msg.partition(), msg.offset() + 1);
                if let Some(key) = msg.key() {
                    batch
                        .entry((store, into.unwrap_or(msg.partition())))
                        .or_default()
                        .insert(key.to_vec(), msg.payload().map(<[u8]>::to_vec));
                    batched += 1;
                }
                if batched >= APPLY_EVERY {
                    // Written through, with the checkpoint of every partition still read: the
                    // state holds every change below where each stands (a restore cut short
                    // goes on from there).
                    backend.apply(std::mem::take(&mut batch), &marks(store, &open, &reached))?;
                    batched = 0;
                }
            }
        }
        if last_log.elapsed() >= Duration::from_secs(5) {
            last_log = Instant::now();
            telemetry::state_restoring(topic, &open, read, to_read);
        }
    }
    telemetry::state_restoring(topic, &open, to_read, to_read);
    consumer.unassign()?;
    Ok((read, reached))
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: Duration = Duration::from_secs(3600);

    #[test]
    fn a_changelog_is_settled_once_its_last_stable_offset_reaches_its_high_watermark() {
        assert!(settled(40, 40));
        // A transaction open at offset 30: what it commits would be missed.
        assert!(!settled(30, 40));
        // Read one after the other, the stable offset may be the later.
        assert!(settled(41, 40));
        // A transaction is aborted by its coordinator within the timeout plus its check.
        let t = Duration::from_secs(30);
        assert!(patience(t) > t + Duration::from_secs(10));
    }

    #[test]
    fn a_checkpoint_restores_the_tail_only_within_the_log_and_while_fresh() {
        let cp = Checkpoint {
            offset: 100,
            at_ms: 0,
        };
        assert!(valid(cp, 0, 500, HOUR, CHECKPOINT_MAX_AGE));
        assert!(valid(cp, 100, 100, HOUR, CHECKPOINT_MAX_AGE));
        // The records it needs were deleted.
        assert!(!valid(cp, 101, 500, HOUR, CHECKPOINT_MAX_AGE));
        // The changelog was recreated shorter.
        assert!(!valid(cp, 0, 99, HOUR, CHECKPOINT_MAX_AGE));
        // Tombstones may have been compacted away since.
        assert!(!valid(cp, 0, 500, 13 * HOUR, CHECKPOINT_MAX_AGE));
        // A timed store's, kept an hour, sooner.
        assert!(!valid(cp, 0, 500, HOUR, TIMED_CHECKPOINT_MAX_AGE));
        assert!(TIMED_CHECKPOINT_MAX_AGE * 2 <= super::super::store::TIMED_TOMBSTONE_RETENTION);
    }

    #[test]
    fn a_partition_without_a_valid_checkpoint_starts_from_the_beginning_emptied() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut d = super::super::store::Disk::open(dir.path()).expect("open");
        let at = (0, 1);
        let mut c = Changes::new();
        c.insert(b"k".to_vec(), Some(b"1".to_vec()));
        let cp = Checkpoint {
            offset: 40,
            at_ms: now_ms(),
        };
        d.apply(HashMap::from([(at, c)]), &[(at, cp)])
            .expect("apply");
        assert_eq!(
            start_of(&mut d, at, (0, 50), CHECKPOINT_MAX_AGE).expect("start"),
            (40, true)
        );
        assert!(d.get(at, b"k").expect("get").is_some());
        assert_eq!(
            start_of(&mut d, at, (41, 50), CHECKPOINT_MAX_AGE).expect("start"),
            (41, false)
        );
        assert!(d.get(at, b"k").expect("get").is_none());
    }
}
