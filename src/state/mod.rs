//! Keyed state of the stateful steps, kept exactly-once with its changelog in the job's
//! transaction.
//!
//! Each stateful step has a store; a store is kept per partition of the job's input, and its
//! changes are written to a compacted changelog topic, partition p holding the state of
//! input partition p. Three layers, read top down:
//!
//! * the record's changes: what the pipeline wrote while processing the record at hand. They
//!   join the transaction only when the record's outputs do ([`Stores::take_record`]); a
//!   record that fails, is dead-lettered or retried leaves no change;
//! * the transaction's changes: sent to the changelog in the transaction, applied to the
//!   tables only once it commits ([`Stores::commit`]), forgotten when it aborts
//!   ([`Stores::abort`]): commit, then apply, never a wipe and a full restore after an abort;
//! * the store: the committed state of each assigned partition, in memory or on disk
//!   ([`store`]), brought up to the changelog's end when the partition is assigned, before
//!   any of its records is processed ([`restore`]): on disk from its checkpoint (the tail),
//!   in memory or without a valid checkpoint from the beginning. A revoked partition's state
//!   is dropped.
//!
//! Values are JSON (the changelog is readable by any Kafka client); a delete is a tombstone.
//!
//! The store of a `join` is a table: a compacted topic the job reads and never writes, its own
//! changelog. It is restored like the others (a co-partitioned table with its input
//! partitions; a global one whole, at the first assignment, under [`GLOBAL`]), then kept
//! current by a consumer that follows its partitions ([`table`]).

pub mod changelog;
pub mod restore;
pub mod store;
pub mod table;

use std::borrow::Cow;
use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer;

use crate::topology::{StateStore, StoreSource, Topology};
use store::{Backend, Checkpoint, Memory, StoreError};

/// The partition a global table's rows are held under, whatever partition of the table topic
/// they were read from (checkpoints stay per partition).
pub const GLOBAL: i32 = -1;

/// A store's key-value view for the pipeline, over the partition of the record at hand.
pub trait KeyedState {
    /// The value of `key` in store `store` of `partition`; an error when the store cannot be
    /// read (a disk failure).
    fn get(
        &self,
        store: usize,
        partition: i32,
        key: &[u8],
    ) -> Result<Option<Cow<'_, [u8]>>, StoreError>;
    /// Sets (or with `None`, deletes) the value of `key`.
    fn put(&mut self, store: usize, partition: i32, key: &[u8], value: Option<Vec<u8>>);
    /// The record at hand was dropped by store `store` (a `dedupe`): counted when its
    /// transaction commits.
    fn dropped(&mut self, store: usize);
    /// The record at hand's key has no row in table `store` (a `join`): counted when its
    /// transaction commits.
    fn missed(&mut self, store: usize);
    /// The record at hand came after its windows closed and was dropped (a windowed
    /// `aggregate`): counted when its transaction commits.
    fn late(&mut self, store: usize);
    /// A record the record at hand made, not of its own (a window's final result, closed by
    /// it), failed in the steps after: it goes to the dead-letter topic with the record at
    /// hand's outputs, and the record at hand's changes stand.
    fn reject(&mut self, record: crate::record::Record, error: crate::record::RecordError);
    /// The entries of timed store `store` of `partition` whose keys sort below `below`, in key
    /// order, as [`KeyedState::get`] sees them (a timed store's keys begin with a time, see
    /// [`time_key`]).
    fn due(&mut self, store: usize, partition: i32, below: &[u8]) -> Result<Entries, StoreError>;
}

/// A time (milliseconds since the epoch) as 8 bytes that sort as the times do: big-endian,
/// the sign bit flipped. A timed store's keys begin with one.
pub fn time_key(ms: i64) -> [u8; 8] {
    ((ms as u64) ^ (1 << 63)).to_be_bytes()
}

/// The time a key made by [`time_key`] begins with; `None` for a shorter key.
pub fn key_time(key: &[u8]) -> Option<i64> {
    let bytes: [u8; 8] = key.get(..8)?.try_into().ok()?;
    Some((u64::from_be_bytes(bytes) ^ (1 << 63)) as i64)
}

/// What a record did at a store that a metric counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tally {
    /// Dropped by a `dedupe`.
    Dropped = 0,
    /// Its key had no row in a `join`'s table.
    Missed = 1,
    /// It came after its windows closed.
    Late = 2,
}

/// One change of a store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub store: usize,
    pub partition: i32,
    pub key: Vec<u8>,
    /// `None`: the key is deleted (a tombstone in the changelog).
    pub value: Option<Vec<u8>>,
}

/// The committed state of one store on one partition, and its size.
#[derive(Debug, Default)]
pub struct Table {
    map: HashMap<Vec<u8>, Vec<u8>>,
    /// Key and value bytes held.
    bytes: u64,
}

impl Table {
    /// Sets (or with `None`, deletes) the value of `key`.
    pub fn put(&mut self, key: Vec<u8>, value: Option<Vec<u8>>) {
        let len = key.len() as u64;
        let old = match value {
            Some(v) => {
                self.bytes += len + v.len() as u64;
                self.map.insert(key, v)
            }
            None => self.map.remove(&key),
        };
        if let Some(old) = old {
            self.bytes -= len + old.len() as u64;
        }
    }

    pub fn get(&self, key: &[u8]) -> Option<&[u8]> {
        self.map.get(key).map(Vec::as_slice)
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Key and value bytes held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.map.iter().map(|(k, v)| (k.as_slice(), v.as_slice()))
    }
}

/// Keys with their values, in key order.
pub type Entries = Vec<(Vec<u8>, Vec<u8>)>;

/// Changes by key; `None` deletes the key.
pub type Changes = HashMap<Vec<u8>, Option<Vec<u8>>>;

/// The stores of a job: their topics, the committed state of the assigned partitions, and the
/// changes of the open transaction and of the record at hand.
pub struct Stores {
    /// The topic of each store (its changelog, or a `join`'s table), by store index.
    topics: Vec<String>,
    /// Where each store's state comes from, by store index.
    sources: Vec<StoreSource>,
    /// The committed state.
    backend: Box<dyn Backend>,
    /// The open transaction's changes, by (store, partition) and key; the last one counts.
    pending: HashMap<(usize, i32), Changes>,
    /// The changes of the record at hand, in order.
    record: Vec<Change>,
    /// The records the record at hand made that failed ([`KeyedState::reject`]).
    rejected: Vec<(crate::record::Record, crate::record::RecordError)>,
    /// What metrics count of the record at hand, and of the open transaction by store.
    record_tally: Vec<(usize, Tally)>,
    pending_tally: Vec<[u64; 3]>,
    /// Whether each store is timed, by store index, and the keys of the timed ones by
    /// (store, partition), in time order: every key its layers hold a value of, and keys of
    /// an aborted transaction until a scan finds them gone ([`KeyedState::due`]).
    timed: Vec<bool>,
    timers: HashMap<(usize, i32), std::collections::BTreeSet<Vec<u8>>>,
    /// Keeps the tables of `join`s current.
    tables: table::Follower,
    /// When the last checkpoint was written after a commit.
    checkpointed: Instant,
    /// Whether changes were applied since the last checkpoint of every held partition.
    unchecked: bool,
    /// The input partitions whose state this instance holds (restored, not released).
    assigned: std::collections::BTreeSet<i32>,
    /// What restores assigned partitions and reads the changelogs' ends for a checkpoint
    /// (none: nothing to restore, as in `onceflow test`).
    reader: Option<restore::Reader>,
}

impl Default for Stores {
    fn default() -> Stores {
        Stores::new(Vec::new(), Box::<Memory>::default())
    }
}

impl std::fmt::Debug for Stores {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stores")
            .field("topics", &self.topics)
            .finish()
    }
}

impl Stores {
    /// Stores of these topics and sources, by store index (none: a stateless job), their
    /// committed state kept in `backend`.
    pub fn new(stores: Vec<(String, StoreSource)>, backend: Box<dyn Backend>) -> Stores {
        let (topics, sources) = stores.into_iter().unzip();
        Stores {
            topics,
            sources,
            backend,
            pending: HashMap::new(),
            record: Vec::new(),
            rejected: Vec::new(),
            record_tally: Vec::new(),
            pending_tally: Vec::new(),
            timed: Vec::new(),
            timers: HashMap::new(),
            tables: table::Follower::default(),
            checkpointed: Instant::now(),
            unchecked: false,
            assigned: Default::default(),
            reader: None,
        }
    }

    /// Stores that restore assigned partitions with `reader`.
    pub fn with_reader(mut self, reader: restore::Reader) -> Stores {
        self.reader = Some(reader);
        self
    }

    /// Stores of which those `timed` says are timed (by store index): their keys begin with
    /// a time, and the job keeps them in time order ([`KeyedState::due`]).
    pub fn with_timed(mut self, timed: Vec<bool>) -> Stores {
        self.timed = timed;
        self
    }

    /// Whether store `store` is timed (its keys begin with a time).
    pub fn is_timed(&self, store: usize) -> bool {
        self.timed.get(store).copied().unwrap_or(false)
    }

    /// The timed stores' keys of `partitions`, read from the committed state (after a
    /// restore).
    fn index_timers(&mut self, partitions: &[i32]) {
        for store in (0..self.timed.len()).filter(|&s| self.timed[s]) {
            for &p in partitions {
                let keys = self
                    .backend
                    .entries((store, p))
                    .into_iter()
                    .map(|(k, _)| k)
                    .filter(|k| k.len() >= 8)
                    .collect();
                self.timers.insert((store, p), keys);
            }
        }
    }

    /// The partitions of timed store `store` this instance holds, and the first time a key of
    /// each begins with (`None`: no key).
    pub fn timer_partitions(&self, store: usize) -> Vec<(i32, Option<i64>)> {
        self.timers
            .iter()
            .filter(|((s, _), _)| *s == store)
            .map(|(&(_, p), keys)| (p, keys.first().and_then(|k| key_time(k))))
            .collect()
    }

    /// Stores whose tables are followed by `consumer` once restored.
    pub fn with_follower(mut self, consumer: restore::RestoreConsumer) -> Stores {
        self.tables = table::Follower::new(consumer);
        self
    }

    /// Brings the state of newly assigned `partitions` up to their changelogs' ends, before
    /// any of their records is processed.
    pub fn restore(
        &mut self,
        partitions: &[i32],
    ) -> Result<restore::Restored, restore::RestoreError> {
        let Some(reader) = self.reader.take() else {
            self.index_timers(partitions);
            return Ok(restore::Restored::default());
        };
        self.assigned.extend(partitions);
        let result = restore::restore(&reader, self, partitions, restore::Which::All);
        self.index_timers(partitions);
        self.reader = Some(reader);
        let (restored, reached) = result?;
        for (store, partition, offset) in reached {
            if self.sources[store] == StoreSource::GlobalTable {
                self.tables.held_whole(store);
            }
            let topic = self.topics[store].clone();
            self.tables.follow(&topic, store, partition, offset);
        }
        self.tables.start().map_err(restore::RestoreError::Client)?;
        Ok(restored)
    }

    /// Brings the changelogs' stores of every held partition up to their changelogs' ends
    /// again, the open transaction's changes forgotten: after a transaction whose outcome
    /// this instance does not know (its commit call failed, and the producer that made it
    /// was replaced: the new one's initialization completed it, committed or aborted), the
    /// changelog says what committed, and the consumer's committed offsets agree with it.
    pub fn reload(&mut self) -> Result<restore::Restored, restore::RestoreError> {
        self.abort();
        let Some(reader) = self.reader.take() else {
            return Ok(restore::Restored::default());
        };
        let partitions: Vec<i32> = self.assigned.iter().copied().collect();
        let result = restore::restore(&reader, self, &partitions, restore::Which::Changelogs);
        self.index_timers(&partitions);
        self.reader = Some(reader);
        Ok(result?.0)
    }

    /// Applies what the followed tables received since the last call (a bounded batch):
    /// the rows a `join` sees are as current as this.
    pub fn follow_tables(&mut self) -> Result<u64, table::FollowError> {
        self.tables.read(self.backend.as_mut())
    }

    /// Whether the job has any store.
    pub fn is_stateful(&self) -> bool {
        !self.topics.is_empty()
    }

    /// The topic of each store (its changelog, or a `join`'s table), by store index.
    pub fn topics(&self) -> &[String] {
        &self.topics
    }

    /// Where each store's state comes from, by store index.
    pub fn sources(&self) -> &[StoreSource] {
        &self.sources
    }

    /// The changelog topics, the job writes, each with whether its store is timed.
    pub fn changelog_topics(&self) -> Vec<(String, bool)> {
        (0..self.topics.len())
            .filter(|&s| self.sources[s] == StoreSource::Changelog)
            .map(|s| (self.topics[s].clone(), self.is_timed(s)))
            .collect()
    }

    /// The topics of the tables of `join`s: (topic, whether held whole).
    pub fn table_topics(&self) -> Vec<(String, bool)> {
        let global = self.of_source(|s| s == StoreSource::GlobalTable);
        self.of_source(|s| s == StoreSource::Table)
            .into_iter()
            .map(|t| (t, false))
            .chain(global.into_iter().map(|t| (t, true)))
            .collect()
    }

    fn of_source(&self, which: impl Fn(StoreSource) -> bool) -> Vec<String> {
        self.topics
            .iter()
            .zip(&self.sources)
            .filter(|(_, s)| which(**s))
            .map(|(t, _)| t.clone())
            .collect()
    }

    /// Whether the store at `index` is a global table already restored.
    pub fn holds_global(&self, index: usize) -> bool {
        self.tables.holds_global(index)
    }

    /// A record starts: no change of its own yet.
    pub fn begin_record(&mut self) {
        self.record.clear();
        self.record_tally.clear();
        self.rejected.clear();
    }

    /// The record at hand leaves no change (it failed, is dead-lettered, skipped or retried).
    pub fn discard_record(&mut self) {
        self.record.clear();
        self.record_tally.clear();
        self.rejected.clear();
    }

    /// The records the record at hand made that failed, to dead-letter with its outputs.
    pub fn take_rejected(&mut self) -> Vec<(crate::record::Record, crate::record::RecordError)> {
        std::mem::take(&mut self.rejected)
    }

    /// The record's changes join the open transaction; returned to be sent to the changelog.
    pub fn take_record(&mut self) -> Vec<Change> {
        for (store, tally) in self.record_tally.drain(..) {
            if self.pending_tally.len() <= store {
                self.pending_tally.resize(store + 1, [0; 3]);
            }
            self.pending_tally[store][tally as usize] += 1;
        }
        let changes = std::mem::take(&mut self.record);
        for c in &changes {
            self.pending
                .entry((c.store, c.partition))
                .or_default()
                .insert(c.key.clone(), c.value.clone());
        }
        changes
    }

    /// The transaction committed: its changes reach the store, in one batch.
    pub fn commit(&mut self) -> Result<(), StoreError> {
        let tally = std::mem::take(&mut self.pending_tally);
        crate::telemetry::state_tally(&self.topics, &tally);
        if self.pending.is_empty() {
            return Ok(());
        }
        let mut counts = vec![0u64; self.topics.len()];
        for (&(store, _), changes) in &self.pending {
            if let Some(c) = counts.get_mut(store) {
                *c += changes.len() as u64;
            }
        }
        let pending = std::mem::take(&mut self.pending);
        for ((store, partition), changes) in &pending {
            if let Some(keys) = self.timers.get_mut(&(*store, *partition)) {
                for (key, _) in changes.iter().filter(|(_, v)| v.is_none()) {
                    keys.remove(key);
                }
            }
        }
        self.backend.apply(pending, &[])?;
        self.unchecked = true;
        crate::telemetry::state_committed(&self.topics, &counts, &self.sizes());
        self.checkpoint_if_due()
    }

    /// The job is idle, no transaction open: the checkpoint a commit would have written, if
    /// changes were applied since the last and it is due.
    pub fn idle(&mut self) -> Result<(), StoreError> {
        if self.unchecked {
            self.checkpoint_if_due()?;
        }
        Ok(())
    }

    /// Writes every held partition's checkpoint when the last is [`store::CHECKPOINT_EVERY`]
    /// old (with no transaction open).
    fn checkpoint_if_due(&mut self) -> Result<(), StoreError> {
        let now = Instant::now();
        if self.checkpoint_due(now) {
            self.checkpointed = now;
            self.write_checkpoints(|_| true)?;
            self.unchecked = false;
        }
        Ok(())
    }

    /// Whether a checkpoint is due: the last is [`store::CHECKPOINT_EVERY`] old.
    fn checkpoint_due(&self, now: Instant) -> bool {
        self.is_stateful() && now.duration_since(self.checkpointed) >= store::CHECKPOINT_EVERY
    }

    /// Writes a checkpoint for each held changelog partition `which` selects: the high
    /// watermark its changelog has now (a table's checkpoints are written as it is read). Called with no transaction open, right after a commit was applied
    /// or a revoked partition's transaction ended, and only for partitions still this
    /// instance's: every change below that watermark is then applied here or aborted. (A
    /// member taking a partition over first restores it, then processes and commits: that
    /// takes seconds, the watermark is read a millisecond after the commit.)
    fn write_checkpoints(&mut self, which: impl Fn(i32) -> bool) -> Result<(), StoreError> {
        let Some(reader) = self.reader.take() else {
            return Ok(());
        };
        let (consumer, timeout) = (&reader.consumer, reader.timeout);
        let at_ms = now_ms();
        let checkpoints: Vec<_> = self
            .backend
            .held()
            .into_iter()
            .filter(|&(s, p)| which(p) && self.sources.get(s) == Some(&StoreSource::Changelog))
            .filter_map(|at| {
                let topic = self.topics.get(at.0)?;
                let (_, high) = consumer.fetch_watermarks(topic, at.1, timeout).ok()?;
                Some((
                    at,
                    Checkpoint {
                        offset: high,
                        at_ms,
                    },
                ))
            })
            .collect();
        self.reader = Some(reader);
        if checkpoints.is_empty() {
            return Ok(());
        }
        self.backend.apply(HashMap::new(), &checkpoints)
    }

    /// The transaction aborted: its changes are forgotten (its records come again).
    pub fn abort(&mut self) {
        self.pending.clear();
        self.record.clear();
        self.record_tally.clear();
        self.pending_tally.clear();
    }

    /// The partition was revoked (its transaction committed or aborted first) and is let
    /// go, with a checkpoint when it was handed over cleanly. On disk its state stays: when
    /// the partition comes back, from this instance's restart or a later rebalance, the
    /// restore replays only the changelog since the checkpoint, whatever other members wrote
    /// meanwhile. A `lost` partition may be another member's already: no checkpoint (the
    /// last one stays valid).
    pub fn release_partition(&mut self, partition: i32, lost: bool) -> Result<(), StoreError> {
        self.assigned.remove(&partition);
        self.pending.retain(|&(_, p), _| p != partition);
        self.record.retain(|c| c.partition != partition);
        if !lost {
            self.write_checkpoints(|p| p == partition)?;
        }
        for store in 0..self.topics.len() {
            if self.sources[store] == StoreSource::Table {
                self.tables.unfollow(store, partition)?;
            }
            self.backend.release((store, partition));
            self.timers.remove(&(store, partition));
        }
        Ok(())
    }

    /// Puts committed rows into store `store` of `partition` directly (a table's rows for
    /// `onceflow test`).
    pub fn load(&mut self, store: usize, partition: i32, rows: Changes) -> Result<(), StoreError> {
        self.backend
            .apply(HashMap::from([((store, partition), rows)]), &[])
    }

    /// The store's backend, for a restore.
    pub fn backend(&mut self) -> &mut dyn Backend {
        self.backend.as_mut()
    }

    /// Every committed key and value of `store`, over all partitions, in key order.
    pub fn entries(&self, store: usize) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut all: Vec<(Vec<u8>, Vec<u8>)> = self
            .backend
            .held()
            .into_iter()
            .filter(|&(s, _)| s == store)
            .flat_map(|at| self.backend.entries(at))
            .collect();
        all.sort();
        all
    }

    /// The keys and the key and value bytes of every store, by store index (assigned
    /// partitions only; on disk, estimates).
    pub fn sizes(&self) -> Vec<(u64, u64)> {
        let mut sizes = vec![(0u64, 0u64); self.topics.len()];
        for ((store, _), keys, bytes) in self.backend.sizes() {
            if let Some((k, b)) = sizes.get_mut(store) {
                *k += keys;
                *b += bytes;
            }
        }
        sizes
    }
}

/// Why a job's stores cannot be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot create the state restore consumer: {0}")]
    Client(#[from] rdkafka::error::KafkaError),
}

impl From<table::FollowError> for StoreError {
    fn from(e: table::FollowError) -> StoreError {
        StoreError {
            path: "tables".into(),
            message: e.to_string(),
        }
    }
}

/// The stores of `topology`'s stateful steps (none for a stateless one), on disk in
/// `<state_dir>/<topology>/<instance>` or in memory, with the consumer that restores them
/// (configured from the job consumer's `consumer_config`).
pub fn open(
    topology: &Topology,
    instance: &str,
    consumer_config: &rdkafka::ClientConfig,
) -> Result<Stores, OpenError> {
    let stores = topology.store_topics();
    if stores.is_empty() {
        return Ok(Stores::default());
    }
    let runtime = &topology.runtime;
    let backend: Box<dyn Backend> = match runtime.state_store {
        StateStore::Memory => Box::<Memory>::default(),
        StateStore::Disk => Box::new(store::Disk::open(
            &std::path::Path::new(&runtime.state_dir)
                .join(&topology.name)
                .join(instance),
        )?),
    };
    let config = restore::restore_config(consumer_config);
    let timeout = Duration::from_millis(runtime.transaction_timeout_ms);
    let tables = stores.iter().any(|(_, s)| *s != StoreSource::Changelog);
    let stores = Stores::new(stores, backend)
        .with_timed(topology.timed_stores())
        .with_reader(restore::Reader::new(&config, timeout)?);
    Ok(if tables {
        stores.with_follower(restore::consumer(&config)?)
    } else {
        stores
    })
}

/// Milliseconds since the epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// How old a checkpoint written at `at_ms` is now.
pub fn age(at_ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(now_ms() - at_ms).unwrap_or(0))
}

impl KeyedState for Stores {
    fn get(
        &self,
        store: usize,
        partition: i32,
        key: &[u8],
    ) -> Result<Option<Cow<'_, [u8]>>, StoreError> {
        if let Some(c) = self
            .record
            .iter()
            .rev()
            .find(|c| c.store == store && c.partition == partition && c.key == key)
        {
            return Ok(c.value.as_deref().map(Cow::Borrowed));
        }
        if let Some(v) = self
            .pending
            .get(&(store, partition))
            .and_then(|p| p.get(key))
        {
            return Ok(v.as_deref().map(Cow::Borrowed));
        }
        self.backend.get((store, partition), key)
    }

    fn put(&mut self, store: usize, partition: i32, key: &[u8], value: Option<Vec<u8>>) {
        if value.is_some() && key.len() >= 8 && self.is_timed(store) {
            self.timers
                .entry((store, partition))
                .or_default()
                .insert(key.to_vec());
        }
        self.record.push(Change {
            store,
            partition,
            key: key.to_vec(),
            value,
        });
    }

    fn dropped(&mut self, store: usize) {
        self.record_tally.push((store, Tally::Dropped));
    }

    fn missed(&mut self, store: usize) {
        self.record_tally.push((store, Tally::Missed));
    }

    fn late(&mut self, store: usize) {
        self.record_tally.push((store, Tally::Late));
    }

    fn reject(&mut self, record: crate::record::Record, error: crate::record::RecordError) {
        self.rejected.push((record, error));
    }

    fn due(&mut self, store: usize, partition: i32, below: &[u8]) -> Result<Entries, StoreError> {
        let Some(keys) = self.timers.get(&(store, partition)) else {
            return Ok(Vec::new());
        };
        let candidates: Vec<Vec<u8>> = keys
            .range::<[u8], _>((std::ops::Bound::Unbounded, std::ops::Bound::Excluded(below)))
            .cloned()
            .collect();
        let mut due = Vec::with_capacity(candidates.len());
        let mut gone = Vec::new();
        for key in candidates {
            match self.get(store, partition, &key)? {
                Some(v) => due.push((key, v.into_owned())),
                None => {
                    // A key no layer holds a change of is gone for good (its transaction
                    // aborted, or it was deleted by one that committed).
                    let changing = self
                        .record
                        .iter()
                        .any(|c| c.store == store && c.partition == partition && c.key == key)
                        || self
                            .pending
                            .get(&(store, partition))
                            .is_some_and(|p| p.contains_key(&key));
                    if !changing {
                        gone.push(key);
                    }
                }
            }
        }
        if let Some(keys) = self.timers.get_mut(&(store, partition)) {
            for key in gone {
                keys.remove(&key);
            }
        }
        Ok(due)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stores() -> Stores {
        Stores::new(
            vec![("t.counts.changelog".into(), StoreSource::Changelog)],
            Box::<Memory>::default(),
        )
    }

    fn get(s: &Stores, key: &str) -> Option<String> {
        s.get(0, 3, key.as_bytes())
            .unwrap()
            .map(|v| String::from_utf8(v.to_vec()).unwrap())
    }

    #[test]
    fn a_change_is_seen_at_once_and_reaches_the_table_only_when_its_transaction_commits() {
        let mut s = stores();
        s.begin_record();
        s.put(0, 3, b"k", Some(b"1".to_vec()));
        assert_eq!(get(&s, "k").as_deref(), Some("1"));
        let sent = s.take_record();
        assert_eq!(sent.len(), 1);
        assert_eq!(get(&s, "k").as_deref(), Some("1"));
        assert!(s.backend.held().is_empty());
        s.commit().unwrap();
        assert_eq!(get(&s, "k").as_deref(), Some("1"));
        assert_eq!(s.sizes(), [(1, 2)]);
    }

    #[test]
    fn an_abort_forgets_the_transaction_and_keeps_what_committed() {
        let mut s = stores();
        s.put(0, 3, b"k", Some(b"1".to_vec()));
        let _ = s.take_record();
        s.commit().unwrap();
        s.put(0, 3, b"k", Some(b"2".to_vec()));
        let _ = s.take_record();
        s.put(0, 3, b"k", Some(b"3".to_vec()));
        s.abort();
        assert_eq!(get(&s, "k").as_deref(), Some("1"));
    }

    #[test]
    fn a_discarded_record_leaves_nothing_and_the_last_change_of_a_key_counts() {
        let mut s = stores();
        s.put(0, 3, b"k", Some(b"1".to_vec()));
        s.put(0, 3, b"k", Some(b"2".to_vec()));
        assert_eq!(get(&s, "k").as_deref(), Some("2"));
        s.discard_record();
        assert_eq!(get(&s, "k"), None);
        s.put(0, 3, b"k", Some(b"5".to_vec()));
        s.put(0, 3, b"k", None);
        let _ = s.take_record();
        s.commit().unwrap();
        assert_eq!(get(&s, "k"), None);
        assert_eq!(s.sizes(), [(0, 0)]);
    }

    #[test]
    fn partitions_are_apart_and_a_dropped_one_is_forgotten() {
        let mut s = stores();
        s.put(0, 3, b"k", Some(b"1".to_vec()));
        s.put(0, 4, b"k", Some(b"9".to_vec()));
        let _ = s.take_record();
        s.commit().unwrap();
        assert_eq!(get(&s, "k").as_deref(), Some("1"));
        s.release_partition(3, false).unwrap();
        assert_eq!(get(&s, "k"), None);
        assert_eq!(s.get(0, 4, b"k").unwrap().as_deref(), Some(&b"9"[..]));
    }
}
