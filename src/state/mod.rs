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
//! * the tables: the committed state of each assigned partition, restored from the
//!   changelog (read_committed, up to its end offset) when the partition is assigned, before
//!   any of its records is processed ([`restore`]), and dropped when it is revoked.
//!
//! Values are JSON (the changelog is readable by any Kafka client); a delete is a tombstone.

pub mod changelog;
pub mod restore;

use std::collections::HashMap;

/// A store's key-value view for the pipeline, over the partition of the record at hand.
pub trait KeyedState {
    /// The value of `key` in store `store` of `partition`.
    fn get(&self, store: usize, partition: i32, key: &[u8]) -> Option<&[u8]>;
    /// Sets (or with `None`, deletes) the value of `key`.
    fn put(&mut self, store: usize, partition: i32, key: &[u8], value: Option<Vec<u8>>);
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
}

/// Changes by key; `None` deletes the key.
type Changes = HashMap<Vec<u8>, Option<Vec<u8>>>;

/// The stores of a job: their changelog topics, the tables of the assigned partitions, and
/// the changes of the open transaction and of the record at hand.
#[derive(Debug, Default)]
pub struct Stores {
    /// The changelog topic of each store, by store index.
    changelogs: Vec<String>,
    /// The committed state, by (store, partition).
    tables: HashMap<(usize, i32), Table>,
    /// The open transaction's changes, by (store, partition) and key; the last one counts.
    pending: HashMap<(usize, i32), Changes>,
    /// The changes of the record at hand, in order.
    record: Vec<Change>,
}

impl Stores {
    /// Stores whose changes go to these changelog topics (none: a stateless job).
    pub fn new(changelogs: Vec<String>) -> Stores {
        Stores {
            changelogs,
            ..Stores::default()
        }
    }

    /// Whether the job has any store.
    pub fn is_stateful(&self) -> bool {
        !self.changelogs.is_empty()
    }

    /// The changelog topic of each store, by store index.
    pub fn changelogs(&self) -> &[String] {
        &self.changelogs
    }

    /// A record starts: no change of its own yet.
    pub fn begin_record(&mut self) {
        self.record.clear();
    }

    /// The record at hand leaves no change (it failed, is dead-lettered, skipped or retried).
    pub fn discard_record(&mut self) {
        self.record.clear();
    }

    /// The record's changes join the open transaction; returned to be sent to the changelog.
    pub fn take_record(&mut self) -> Vec<Change> {
        let changes = std::mem::take(&mut self.record);
        for c in &changes {
            self.pending
                .entry((c.store, c.partition))
                .or_default()
                .insert(c.key.clone(), c.value.clone());
        }
        changes
    }

    /// The transaction committed: its changes reach the tables.
    pub fn commit(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let mut counts = vec![0u64; self.changelogs.len()];
        for (at, changes) in self.pending.drain() {
            if let Some(c) = counts.get_mut(at.0) {
                *c += changes.len() as u64;
            }
            let table = self.tables.entry(at).or_default();
            for (key, value) in changes {
                table.put(key, value);
            }
        }
        crate::telemetry::state_committed(&self.changelogs, &counts, &self.sizes());
    }

    /// The transaction aborted: its changes are forgotten (its records come again).
    pub fn abort(&mut self) {
        self.pending.clear();
        self.record.clear();
    }

    /// The partition's state is no longer this instance's: forgotten.
    pub fn drop_partition(&mut self, partition: i32) {
        self.tables.retain(|&(_, p), _| p != partition);
        self.pending.retain(|&(_, p), _| p != partition);
    }

    /// Replaces the committed state of `store` on `partition` (a restore).
    pub fn set_table(&mut self, store: usize, partition: i32, table: Table) {
        self.tables.insert((store, partition), table);
    }

    /// Every committed key and value of `store`, over all partitions, in key order.
    pub fn entries(&self, store: usize) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut all: Vec<(Vec<u8>, Vec<u8>)> = self
            .tables
            .iter()
            .filter(|((s, _), _)| *s == store)
            .flat_map(|(_, t)| t.map.iter().map(|(k, v)| (k.clone(), v.clone())))
            .collect();
        all.sort();
        all
    }

    /// The keys and the key and value bytes of every store, by store index (assigned
    /// partitions only).
    pub fn sizes(&self) -> Vec<(u64, u64)> {
        let mut sizes = vec![(0u64, 0u64); self.changelogs.len()];
        for (&(store, _), table) in &self.tables {
            if let Some((keys, bytes)) = sizes.get_mut(store) {
                *keys += table.len() as u64;
                *bytes += table.bytes();
            }
        }
        sizes
    }
}

impl KeyedState for Stores {
    fn get(&self, store: usize, partition: i32, key: &[u8]) -> Option<&[u8]> {
        if let Some(c) = self
            .record
            .iter()
            .rev()
            .find(|c| c.store == store && c.partition == partition && c.key == key)
        {
            return c.value.as_deref();
        }
        if let Some(v) = self
            .pending
            .get(&(store, partition))
            .and_then(|p| p.get(key))
        {
            return v.as_deref();
        }
        self.tables
            .get(&(store, partition))
            .and_then(|t| t.get(key))
    }

    fn put(&mut self, store: usize, partition: i32, key: &[u8], value: Option<Vec<u8>>) {
        self.record.push(Change {
            store,
            partition,
            key: key.to_vec(),
            value,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stores() -> Stores {
        Stores::new(vec!["t.counts.changelog".into()])
    }

    fn get(s: &Stores, key: &str) -> Option<String> {
        s.get(0, 3, key.as_bytes())
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
        assert!(s.tables.is_empty());
        s.commit();
        assert_eq!(get(&s, "k").as_deref(), Some("1"));
        assert_eq!(s.sizes(), [(1, 2)]);
    }

    #[test]
    fn an_abort_forgets_the_transaction_and_keeps_what_committed() {
        let mut s = stores();
        s.put(0, 3, b"k", Some(b"1".to_vec()));
        let _ = s.take_record();
        s.commit();
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
        s.commit();
        assert_eq!(get(&s, "k"), None);
        assert_eq!(s.sizes(), [(0, 0)]);
    }

    #[test]
    fn partitions_are_apart_and_a_dropped_one_is_forgotten() {
        let mut s = stores();
        s.put(0, 3, b"k", Some(b"1".to_vec()));
        s.put(0, 4, b"k", Some(b"9".to_vec()));
        let _ = s.take_record();
        s.commit();
        assert_eq!(get(&s, "k").as_deref(), Some("1"));
        s.drop_partition(3);
        assert_eq!(get(&s, "k"), None);
        assert_eq!(s.get(0, 4, b"k"), Some(&b"9"[..]));
    }
}
