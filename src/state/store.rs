//! Where the committed state lives: in memory, or on disk (fjall, an LSM tree) with the
//! changelog offset each partition's state reflects stored beside it.
//!
//! A store only ever holds committed changes ([`super::Stores`] applies a transaction's
//! changes after it commits); on disk they are held in memory and written in one atomic
//! batch with the next checkpoints (or when they pass [`DIRTY_BYTES`]). Its *checkpoint* for a
//! store's partition is a changelog offset X such that the state holds every change of the
//! changelog below X: replaying the changelog from X to its end (whole values and
//! tombstones, in order) gives the exact state, whatever the store holds beyond X. A
//! checkpoint is written when a restore reaches the end, and after a commit at most every
//! [`CHECKPOINT_EVERY`], as the changelog's high watermark read right after the commit was
//! applied (everything below it is then applied or aborted).

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{Changes, Table};

/// How often a checkpoint follows a commit: a crash then replays at most this much of the
/// changelog.
pub const CHECKPOINT_EVERY: Duration = Duration::from_secs(10);

/// A checkpoint older than this restores the partition from the beginning instead: a
/// changelog's tombstones are compacted away after `delete.retention.ms` (a day by
/// default), and replaying a tail without a tombstone would keep a deleted key.
pub const CHECKPOINT_MAX_AGE: Duration = Duration::from_secs(12 * 3600);

/// How long a timed store's changelog keeps a tombstone (`delete.retention.ms`, set when the
/// job creates it): every closed window and every sent delayed record leaves one, so a day's
/// worth, the broker's default, would be most of the changelog.
pub const TIMED_TOMBSTONE_RETENTION: Duration = Duration::from_secs(3600);

/// [`CHECKPOINT_MAX_AGE`] for a timed store: well within its tombstones' retention.
pub const TIMED_CHECKPOINT_MAX_AGE: Duration = Duration::from_secs(1800);

/// A store's failure: the disk, or what is on it.
#[derive(Debug, thiserror::Error)]
#[error("state store at {path}: {message}")]
pub struct StoreError {
    pub path: String,
    pub message: String,
}

/// The changelog offset a partition's state reflects, and when it was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checkpoint {
    pub offset: i64,
    /// Milliseconds since the epoch.
    pub at_ms: i64,
}

impl Checkpoint {
    fn encode(self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&self.offset.to_be_bytes());
        b[8..].copy_from_slice(&self.at_ms.to_be_bytes());
        b
    }

    fn decode(bytes: &[u8]) -> Option<Checkpoint> {
        let offset = i64::from_be_bytes(bytes.get(..8)?.try_into().ok()?);
        let at_ms = i64::from_be_bytes(bytes.get(8..16)?.try_into().ok()?);
        Some(Checkpoint { offset, at_ms })
    }
}

/// The committed state of every store, by (store, partition).
pub trait Backend: Send {
    /// The committed value of `key`.
    fn get(&self, at: (usize, i32), key: &[u8]) -> Result<Option<Cow<'_, [u8]>>, StoreError>;
    /// Applies changes, with checkpoints, as one atomic batch.
    fn apply(
        &mut self,
        changes: HashMap<(usize, i32), Changes>,
        checkpoints: &[((usize, i32), Checkpoint)],
    ) -> Result<(), StoreError>;
    /// Makes a store's partition ready to read and write (on disk: opens its keyspace).
    fn open(&mut self, at: (usize, i32)) -> Result<(), StoreError>;
    /// The checkpoint of a store's partition, if it has one.
    fn checkpoint(&self, at: (usize, i32)) -> Result<Option<Checkpoint>, StoreError>;
    /// Forgets a store's partition (its state and checkpoint).
    fn clear(&mut self, at: (usize, i32)) -> Result<(), StoreError>;
    /// Lets a store's partition go (it was revoked): on disk its state and checkpoint stay,
    /// for a later assignment to restore the tail onto; in memory it is dropped.
    fn release(&mut self, at: (usize, i32));
    /// Keys and key and value bytes of each (store, partition) held (on disk: estimates).
    fn sizes(&self) -> Vec<((usize, i32), u64, u64)>;
    /// Every key and value of a store's partition, in key order (for tests and `onceflow
    /// test`).
    fn entries(&self, at: (usize, i32)) -> Vec<(Vec<u8>, Vec<u8>)>;
    /// The (store, partition) pairs it holds state of.
    fn held(&self) -> Vec<(usize, i32)>;
}

/// State in memory: lost with the process, restored in full from the changelog.
#[derive(Debug, Default)]
pub struct Memory {
    tables: HashMap<(usize, i32), Table>,
}

impl Backend for Memory {
    fn get(&self, at: (usize, i32), key: &[u8]) -> Result<Option<Cow<'_, [u8]>>, StoreError> {
        Ok(self
            .tables
            .get(&at)
            .and_then(|t| t.get(key))
            .map(Cow::Borrowed))
    }

    fn apply(
        &mut self,
        changes: HashMap<(usize, i32), Changes>,
        _: &[((usize, i32), Checkpoint)],
    ) -> Result<(), StoreError> {
        for (at, changes) in changes {
            let table = self.tables.entry(at).or_default();
            for (key, value) in changes {
                table.put(key, value);
            }
        }
        Ok(())
    }

    fn open(&mut self, _: (usize, i32)) -> Result<(), StoreError> {
        Ok(())
    }

    /// Nothing survives the process: no checkpoint, a restore reads everything.
    fn checkpoint(&self, _: (usize, i32)) -> Result<Option<Checkpoint>, StoreError> {
        Ok(None)
    }

    fn clear(&mut self, at: (usize, i32)) -> Result<(), StoreError> {
        self.tables.remove(&at);
        Ok(())
    }

    fn release(&mut self, at: (usize, i32)) {
        self.tables.remove(&at);
    }

    fn sizes(&self) -> Vec<((usize, i32), u64, u64)> {
        self.tables
            .iter()
            .map(|(&at, t)| (at, t.len() as u64, t.bytes()))
            .collect()
    }

    fn entries(&self, at: (usize, i32)) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut all: Vec<_> = self
            .tables
            .get(&at)
            .map(|t| t.iter().map(|(k, v)| (k.to_vec(), v.to_vec())).collect())
            .unwrap_or_default();
        all.sort();
        all
    }

    fn held(&self) -> Vec<(usize, i32)> {
        self.tables.keys().copied().collect()
    }
}

/// State on disk: one fjall database per job instance, a keyspace per store partition, and
/// the checkpoints in a keyspace of their own, written in the same batches.
pub struct Disk {
    path: PathBuf,
    db: fjall::Database,
    checkpoints: fjall::Keyspace,
    keyspaces: HashMap<(usize, i32), fjall::Keyspace>,
    /// The committed values written since the store was opened (deletes as `None`), the
    /// least used evicted past [`VALUE_CACHE_BYTES`]: a get of a key written lately is
    /// answered here, not by the LSM tree's read path (a third of the job's CPU in the
    /// count-by-key bench without it).
    values: ValueCache,
    /// Committed changes not on disk yet, by store partition: they reach it in one batch with
    /// the next checkpoints, or when they pass [`DIRTY_BYTES`]. Reads see them first. A key
    /// changed by every transaction is written to the LSM tree once per checkpoint instead of
    /// once per commit (its memtable inserts were a sixth of the count-by-key job's CPU). A
    /// crash loses them with nothing else: the checkpoint on disk is from the last batch that
    /// carried them, and the restore replays the changelog from there.
    dirty: HashMap<(usize, i32), Changes>,
    /// What [`Disk::dirty`] takes, counted as the value cache counts.
    dirty_bytes: u64,
}

/// How much of committed changes [`Disk`] holds in memory before writing them without waiting
/// for a checkpoint. It holds a change of each of 100,000 keys (17 MB); 16 MiB would not,
/// and the count-by-key bench would write each key again once per 100,000 records.
pub const DIRTY_BYTES: u64 = 32 * 1024 * 1024;

/// What a change takes in memory, held or in the value cache.
fn change_bytes(key: &[u8], value: Option<&Vec<u8>>) -> u64 {
    (key.len() + value.map_or(0, Vec::len) + ENTRY_OVERHEAD) as u64
}

/// The bytes of committed values [`Disk`] keeps in memory.
pub const VALUE_CACHE_BYTES: u64 = 64 * 1024 * 1024;

/// A cached value's key: the store's partition and the key.
#[derive(Hash, PartialEq, Eq)]
struct CacheKey {
    at: (usize, i32),
    key: Vec<u8>,
}

/// A [`CacheKey`] borrowed for a lookup: hashes as it does (same fields, same order; a slice
/// hashes as a `Vec` of it).
#[derive(Hash)]
struct CacheRef<'a> {
    at: (usize, i32),
    key: &'a [u8],
}

impl quick_cache::Equivalent<CacheKey> for CacheRef<'_> {
    fn equivalent(&self, k: &CacheKey) -> bool {
        self.at == k.at && self.key == k.key.as_slice()
    }
}

/// Weighs a cached value by the memory it takes: its key's and value's bytes and
/// [`ENTRY_OVERHEAD`].
#[derive(Clone)]
struct ByBytes;

/// What a cached entry takes beyond its key's and value's bytes: the entry (the key's `Vec`
/// and partition, the value's `Option<Vec>`, the cache's own fields, about 90 bytes) and the
/// allocator's rounding of the two heap buffers (at least 32 bytes each). Counted at 64
/// instead, the 64 MiB cache took about twice that (a 10-million-key job peaked at 536 MiB;
/// docs/state.md).
const ENTRY_OVERHEAD: usize = 160;

impl quick_cache::Weighter<CacheKey, Option<Vec<u8>>> for ByBytes {
    fn weight(&self, k: &CacheKey, v: &Option<Vec<u8>>) -> u64 {
        change_bytes(&k.key, v.as_ref())
    }
}

type ValueCache = quick_cache::unsync::Cache<CacheKey, Option<Vec<u8>>, ByBytes>;

fn value_cache() -> ValueCache {
    ValueCache::with_weighter(
        (VALUE_CACHE_BYTES / ENTRY_OVERHEAD as u64) as usize,
        VALUE_CACHE_BYTES,
        ByBytes,
    )
}

impl std::fmt::Debug for Disk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Disk").field("path", &self.path).finish()
    }
}

/// How much memory the disk stores' block cache may take, for the whole process.
pub const DISK_CACHE_BYTES: u64 = 64 * 1024 * 1024;

/// The largest memtable of a store partition's keyspace before it is flushed to disk
/// (fjall's default is 64 MiB a keyspace, and a job holds one keyspace per store and
/// partition). With the held changes written once per checkpoint, few writes reach the
/// memtables; 8 MiB took a 10-million-key fold to 538 MiB of RSS, 4 MiB to 474.
pub const MEMTABLE_BYTES: u64 = 4 * 1024 * 1024;

/// A store partition's keyspace: filter and index blocks pinned in memory. Unpinned, a get
/// at 10 million keys re-read a filter block larger than a cache shard from disk every
/// time (a 10-million-key run did not finish in 9 minutes; pinned, it ran at 100,000
/// get+upsert records/s: docs/state.md).
fn keyspace_options() -> fjall::KeyspaceCreateOptions {
    use fjall::config::PinningPolicy;
    fjall::KeyspaceCreateOptions::default()
        .filter_block_pinning_policy(PinningPolicy::all(true))
        .index_block_pinning_policy(PinningPolicy::all(true))
        .max_memtable_size(MEMTABLE_BYTES)
}

impl Disk {
    /// Opens (or creates) the stores at `path`. A second process on the same path is refused
    /// by fjall's lock; stores that cannot be read (corrupt, or of another format) are moved
    /// aside to `<path>.unreadable-<ms>` and started afresh: the changelogs rebuild them, so
    /// a damaged disk costs a full restore, not a crash loop.
    pub fn open(path: &Path) -> Result<Disk, StoreError> {
        let fail = |e: &dyn std::fmt::Display| StoreError {
            path: path.display().to_string(),
            message: e.to_string(),
        };
        std::fs::create_dir_all(path).map_err(|e| fail(&e))?;
        let open = || {
            fjall::Database::builder(path)
                .cache_size(DISK_CACHE_BYTES)
                .open()
        };
        let db = match open() {
            Ok(db) => db,
            Err(fjall::Error::Locked) => {
                return Err(fail(
                    &"held by another process: does another running instance use this instance id?",
                ));
            }
            Err(fjall::Error::Io(e)) => return Err(fail(&e)),
            Err(unreadable) => {
                let aside =
                    PathBuf::from(format!("{}.unreadable-{}", path.display(), super::now_ms()));
                crate::telemetry::store_unreadable(&path.display(), &unreadable, &aside.display());
                std::fs::rename(path, &aside).map_err(|e| fail(&e))?;
                std::fs::create_dir_all(path).map_err(|e| fail(&e))?;
                open().map_err(|e| fail(&e))?
            }
        };
        let checkpoints = db
            .keyspace("checkpoints", fjall::KeyspaceCreateOptions::default)
            .map_err(|e| fail(&e))?;
        Ok(Disk {
            path: path.to_path_buf(),
            db,
            checkpoints,
            keyspaces: HashMap::new(),
            values: value_cache(),
            dirty: HashMap::new(),
            dirty_bytes: 0,
        })
    }

    fn fail(&self, e: &dyn std::fmt::Display) -> StoreError {
        StoreError {
            path: self.path.display().to_string(),
            message: e.to_string(),
        }
    }

    fn name((store, partition): (usize, i32)) -> String {
        format!("s{store}-p{partition}")
    }

    fn keyspace(&mut self, at: (usize, i32)) -> Result<fjall::Keyspace, StoreError> {
        if let Some(k) = self.keyspaces.get(&at) {
            return Ok(k.clone());
        }
        let k = self
            .db
            .keyspace(&Disk::name(at), keyspace_options)
            .map_err(|e| self.fail(&e))?;
        self.keyspaces.insert(at, k.clone());
        Ok(k)
    }

    /// Writes every held change, then `changes` (newer: a key of both is written once, as
    /// `changes` has it), and `checkpoints` in one atomic batch; the changes then move to the
    /// value cache. Held changes stay in memory until the batch is on disk, so that a failed
    /// write leaves the reads as they were.
    fn write(
        &mut self,
        changes: HashMap<(usize, i32), Changes>,
        checkpoints: &[((usize, i32), Checkpoint)],
    ) -> Result<(), StoreError> {
        let mut batch = self.db.batch().durability(Some(fjall::PersistMode::Buffer));
        let newer =
            |at: &(usize, i32), key: &Vec<u8>| changes.get(at).is_some_and(|c| c.contains_key(key));
        let held = self.dirty.iter().flat_map(|(at, c)| {
            c.iter()
                .filter(move |(key, _)| !newer(at, key))
                .map(move |kv| (at, kv))
        });
        let fresh = changes
            .iter()
            .flat_map(|(at, c)| c.iter().map(move |kv| (at, kv)));
        for (at, (key, value)) in held.chain(fresh) {
            let Some(k) = self.keyspaces.get(at) else {
                continue;
            };
            match value {
                Some(v) => batch.insert(k, key.as_slice(), v.as_slice()),
                None => batch.remove(k, key.as_slice()),
            }
        }
        for (at, cp) in checkpoints {
            batch.insert(&self.checkpoints, Disk::name(*at), cp.encode().to_vec());
        }
        batch.commit().map_err(|e| self.fail(&e))?;
        // Only what the disk holds is cached (the newer value last).
        let held = std::mem::take(&mut self.dirty);
        for (at, changes) in held.into_iter().chain(changes) {
            for (key, value) in changes {
                self.values.insert(CacheKey { at, key }, value);
            }
        }
        self.dirty_bytes = 0;
        Ok(())
    }

    /// Drops the held changes of a store partition (cleared, or let go: its checkpoint on
    /// disk predates them).
    fn forget(&mut self, at: (usize, i32)) {
        if let Some(changes) = self.dirty.remove(&at) {
            let bytes: u64 = changes
                .iter()
                .map(|(k, v)| change_bytes(k, v.as_ref()))
                .sum();
            self.dirty_bytes = self.dirty_bytes.saturating_sub(bytes);
        }
    }
}

impl Backend for Disk {
    fn get(&self, at: (usize, i32), key: &[u8]) -> Result<Option<Cow<'_, [u8]>>, StoreError> {
        let Some(k) = self.keyspaces.get(&at) else {
            return Ok(None);
        };
        if let Some(v) = self.dirty.get(&at).and_then(|d| d.get(key)) {
            return Ok(v.as_deref().map(Cow::Borrowed));
        }
        if let Some(v) = self.values.get(&CacheRef { at, key }) {
            return Ok(v.as_deref().map(Cow::Borrowed));
        }
        k.get(key)
            .map(|v| v.map(|v| Cow::Owned(v.to_vec())))
            .map_err(|e| self.fail(&e))
    }

    /// Holds the changes, or, when checkpoints come with them or what is held would pass
    /// [`DIRTY_BYTES`], writes them with everything held (and the checkpoints) in one batch.
    fn apply(
        &mut self,
        changes: HashMap<(usize, i32), Changes>,
        checkpoints: &[((usize, i32), Checkpoint)],
    ) -> Result<(), StoreError> {
        let incoming: u64 = changes
            .values()
            .flatten()
            .map(|(k, v)| change_bytes(k, v.as_ref()))
            .sum();
        for &at in changes.keys() {
            self.keyspace(at)?;
        }
        if checkpoints.is_empty() && self.dirty_bytes + incoming <= DIRTY_BYTES {
            for (at, changes) in changes {
                let held = self.dirty.entry(at).or_default();
                for (key, value) in changes {
                    let bytes = change_bytes(&key, value.as_ref());
                    let before = held.get(&key).map(|v| change_bytes(&key, v.as_ref()));
                    held.insert(key, value);
                    self.dirty_bytes = self.dirty_bytes + bytes - before.unwrap_or(0);
                }
            }
            return Ok(());
        }
        self.write(changes, checkpoints)
    }

    fn open(&mut self, at: (usize, i32)) -> Result<(), StoreError> {
        self.keyspace(at).map(|_| ())
    }

    fn checkpoint(&self, at: (usize, i32)) -> Result<Option<Checkpoint>, StoreError> {
        Ok(self
            .checkpoints
            .get(Disk::name(at))
            .map_err(|e| self.fail(&e))?
            .and_then(|v| Checkpoint::decode(&v)))
    }

    fn clear(&mut self, at: (usize, i32)) -> Result<(), StoreError> {
        // Rare (a store rebuilt from its changelog): the whole cache goes.
        self.forget(at);
        self.values.clear();
        self.checkpoints
            .remove(Disk::name(at))
            .map_err(|e| self.fail(&e))?;
        let k = self.keyspace(at)?;
        k.clear().map_err(|e| self.fail(&e))
    }

    fn release(&mut self, at: (usize, i32)) {
        self.forget(at);
        self.keyspaces.remove(&at);
        self.values.clear();
    }

    /// The keys on disk (fjall's estimate) and the changes held, the bytes on disk.
    fn sizes(&self) -> Vec<((usize, i32), u64, u64)> {
        self.keyspaces
            .iter()
            .map(|(&at, k)| {
                let held = self.dirty.get(&at).map_or(0, HashMap::len);
                (at, (k.approximate_len() + held) as u64, k.disk_space())
            })
            .collect()
    }

    fn entries(&self, at: (usize, i32)) -> Vec<(Vec<u8>, Vec<u8>)> {
        let Some(k) = self.keyspaces.get(&at) else {
            return Vec::new();
        };
        let mut all: std::collections::BTreeMap<Vec<u8>, Vec<u8>> = k
            .iter()
            .filter_map(|g| g.into_inner().ok())
            .map(|(key, value)| (key.to_vec(), value.to_vec()))
            .collect();
        for (key, value) in self.dirty.get(&at).into_iter().flatten() {
            match value {
                Some(v) => all.insert(key.clone(), v.clone()),
                None => all.remove(key),
            };
        }
        all.into_iter().collect()
    }

    fn held(&self) -> Vec<(usize, i32)> {
        self.keyspaces.keys().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn changes(pairs: &[(&str, Option<&str>)]) -> HashMap<(usize, i32), Changes> {
        let mut c = Changes::new();
        for (k, v) in pairs {
            c.insert(k.as_bytes().to_vec(), v.map(|v| v.as_bytes().to_vec()));
        }
        HashMap::from([((0, 3), c)])
    }

    fn text(v: Option<Cow<'_, [u8]>>) -> Option<String> {
        v.map(|v| String::from_utf8_lossy(&v).into_owned())
    }

    #[test]
    fn the_disk_store_keeps_its_state_and_checkpoint_across_a_reopen() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cp = Checkpoint {
            offset: 42,
            at_ms: 1_700_000_000_000,
        };
        {
            let mut d = Disk::open(dir.path()).expect("open");
            d.apply(changes(&[("a", Some("1")), ("b", Some("2"))]), &[])
                .expect("apply");
            d.apply(changes(&[("b", None), ("c", Some("3"))]), &[((0, 3), cp)])
                .expect("apply");
            assert_eq!(
                text(d.get((0, 3), b"a").expect("get")).as_deref(),
                Some("1")
            );
        }
        let mut d = Disk::open(dir.path()).expect("reopen");
        assert_eq!(d.checkpoint((0, 3)).expect("checkpoint"), Some(cp));
        // A reopened database knows its keyspaces once they are opened.
        d.open((0, 3)).expect("open the partition");
        let keys: Vec<Vec<u8>> = d.entries((0, 3)).into_iter().map(|(k, _)| k).collect();
        assert_eq!(keys, [b"a".to_vec(), b"c".to_vec()]);
        d.clear((0, 3)).expect("clear");
        assert_eq!(d.checkpoint((0, 3)).expect("checkpoint"), None);
        assert_eq!(d.get((0, 3), b"a").expect("get"), None);
    }

    #[test]
    fn changes_reach_the_disk_with_the_next_checkpoint_and_are_read_before() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cp = |offset| Checkpoint {
            offset,
            at_ms: 1_700_000_000_000,
        };
        {
            let mut d = Disk::open(dir.path()).expect("open");
            d.apply(
                changes(&[("a", Some("1")), ("b", Some("2"))]),
                &[((0, 3), cp(2))],
            )
            .expect("apply");
            // Held in memory, read back as committed state.
            d.apply(changes(&[("a", Some("10")), ("b", None)]), &[])
                .expect("apply");
            assert_eq!(
                text(d.get((0, 3), b"a").expect("get")).as_deref(),
                Some("10")
            );
            assert_eq!(d.get((0, 3), b"b").expect("get"), None);
            assert_eq!(d.entries((0, 3)), [(b"a".to_vec(), b"10".to_vec())]);
        }
        // Dropped as a crash would: the disk holds the state of its checkpoint.
        let mut d = Disk::open(dir.path()).expect("reopen");
        d.open((0, 3)).expect("open the partition");
        assert_eq!(d.checkpoint((0, 3)).expect("checkpoint"), Some(cp(2)));
        assert_eq!(
            text(d.get((0, 3), b"a").expect("get")).as_deref(),
            Some("1")
        );
        assert_eq!(
            text(d.get((0, 3), b"b").expect("get")).as_deref(),
            Some("2")
        );
        // A checkpoint writes what is held with it; a key changed again with the checkpoint
        // is written as it was last.
        d.apply(changes(&[("a", Some("9")), ("b", None)]), &[])
            .expect("apply");
        d.apply(changes(&[("a", Some("10"))]), &[((0, 3), cp(4))])
            .expect("checkpoint");
        assert_eq!(d.dirty_bytes, 0);
        drop(d);
        let mut d = Disk::open(dir.path()).expect("reopen");
        d.open((0, 3)).expect("open the partition");
        assert_eq!(d.checkpoint((0, 3)).expect("checkpoint"), Some(cp(4)));
        assert_eq!(d.entries((0, 3)), [(b"a".to_vec(), b"10".to_vec())]);
        // Held changes of a partition let go are dropped, its disk state kept.
        d.apply(changes(&[("c", Some("3"))]), &[]).expect("apply");
        d.release((0, 3));
        d.open((0, 3)).expect("open the partition");
        assert_eq!(d.get((0, 3), b"c").expect("get"), None);
        assert_eq!(d.dirty_bytes, 0);
    }

    #[test]
    fn a_second_process_cannot_open_the_same_stores() {
        let dir = tempfile::tempdir().expect("tempdir");
        let _first = Disk::open(dir.path()).expect("open");
        assert!(Disk::open(dir.path()).is_err());
    }

    #[test]
    fn unreadable_stores_are_moved_aside_and_started_afresh() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("stores");
        {
            let mut d = Disk::open(&path).expect("open");
            d.apply(changes(&[("a", Some("1"))]), &[]).expect("apply");
        }
        // Every file of the database garbled, as a failing disk would leave it.
        let mut files = vec![path.clone()];
        while let Some(p) = files.pop() {
            for entry in std::fs::read_dir(&p).expect("read_dir") {
                let entry = entry.expect("entry").path();
                if entry.is_dir() {
                    files.push(entry);
                } else if entry.file_name().is_some_and(|n| n != "lock") {
                    std::fs::write(&entry, b"\xff\xfe not a database file").expect("garble");
                }
            }
        }
        let mut d = Disk::open(&path).expect("a fresh store");
        d.open((0, 3)).expect("open the partition");
        assert_eq!(d.get((0, 3), b"a").expect("get"), None);
        let aside = std::fs::read_dir(dir.path())
            .expect("read_dir")
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().contains(".unreadable-"))
            .count();
        assert_eq!(aside, 1, "the unreadable stores are kept aside for a look");
    }

    #[test]
    fn the_memory_store_has_no_checkpoint() {
        let mut m = Memory::default();
        m.apply(
            changes(&[("a", Some("1"))]),
            &[(
                (0, 3),
                Checkpoint {
                    offset: 1,
                    at_ms: 0,
                },
            )],
        )
        .expect("apply");
        assert_eq!(m.checkpoint((0, 3)).expect("checkpoint"), None);
        assert_eq!(
            text(m.get((0, 3), b"a").expect("get")).as_deref(),
            Some("1")
        );
    }
}
