//! Keeping the tables of `join`s current: once a table's partitions are restored, a
//! consumer outside the group follows them from where the restore stopped, and what it
//! receives is applied to the store in bounded batches, each with the offsets it reached as
//! the partitions' checkpoints (a table is its own changelog: a restart reads only its
//! tail). A table is read read_committed; the job never writes it.

use std::collections::HashMap;
use std::time::Duration;

use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

use super::restore::RestoreConsumer;
use super::store::{Backend, Checkpoint, StoreError};
use super::{Changes, GLOBAL, now_ms};

/// At most this many table records are applied per call, so the job's loop goes on.
const READ_AT_MOST: usize = 10_000;

/// Why a table cannot be followed.
#[derive(Debug, thiserror::Error)]
pub enum FollowError {
    #[error("table: kafka client: {0}")]
    Client(#[from] KafkaError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The followed partitions of every table and the consumer that reads them.
#[derive(Default)]
pub struct Follower {
    consumer: Option<RestoreConsumer>,
    /// The next offset of each followed (store, partition), and the store's topic.
    next: HashMap<(usize, i32), (String, i64)>,
    /// Global tables restored whole, by store index.
    global: Vec<usize>,
    /// Partitions followed since the last [`Follower::start`], not yet assigned.
    added: Vec<(String, i32)>,
}

impl Follower {
    pub fn new(consumer: RestoreConsumer) -> Follower {
        Follower {
            consumer: Some(consumer),
            ..Follower::default()
        }
    }

    /// Whether the global table of store `store` was restored whole.
    pub fn holds_global(&self, store: usize) -> bool {
        self.global.contains(&store)
    }

    /// Follows partition `partition` of table `topic` (store `store`) from `offset`, from
    /// the next [`Follower::start`].
    pub fn follow(&mut self, topic: &str, store: usize, partition: i32, offset: i64) {
        self.next
            .insert((store, partition), (topic.to_string(), offset));
        if !self
            .added
            .iter()
            .any(|(t, p)| t == topic && *p == partition)
        {
            self.added.push((topic.to_string(), partition));
        }
    }

    /// Starts fetching the partitions followed since the last call, in one incremental
    /// assignment (each at the earliest next offset of the stores that follow it). The
    /// assignment only ever grows or shrinks by the partitions concerned: replacing it
    /// whole in quick succession meets librdkafka's issue #5573 (a partition stopped twice,
    /// an assertion that aborts the process), fixed upstream after 2.12.1.
    pub fn start(&mut self) -> Result<(), KafkaError> {
        let added = std::mem::take(&mut self.added);
        let Some(consumer) = &self.consumer else {
            return Ok(());
        };
        if added.is_empty() {
            return Ok(());
        }
        let mut tpl = TopicPartitionList::new();
        for (topic, partition) in &added {
            let from = self
                .next
                .iter()
                .filter(|&(&(_, p), (t, _))| t == topic && p == *partition)
                .map(|(_, &(_, o))| o)
                .min();
            if let Some(from) = from {
                tpl.add_partition_offset(topic, *partition, Offset::Offset(from))?;
            }
        }
        consumer.incremental_assign(&tpl)
    }

    /// Marks the global table of `store` as held whole (every partition followed).
    pub fn held_whole(&mut self, store: usize) {
        if !self.global.contains(&store) {
            self.global.push(store);
        }
    }

    /// Stops following partition `partition` of store `store` (its input partition was
    /// revoked).
    pub fn unfollow(&mut self, store: usize, partition: i32) -> Result<(), StoreError> {
        let Some((topic, _)) = self.next.remove(&(store, partition)) else {
            return Ok(());
        };
        let still = self
            .next
            .iter()
            .any(|(&(_, p), (t, _))| p == partition && *t == topic);
        if let (false, Some(consumer)) = (still, &self.consumer) {
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition(&topic, partition);
            consumer
                .incremental_unassign(&tpl)
                .map_err(|e| StoreError {
                    path: "tables".into(),
                    message: e.to_string(),
                })?;
        }
        Ok(())
    }

    /// Applies what the followed partitions received, at most [`READ_AT_MOST`] records, with
    /// the offsets reached as checkpoints; returns the records read.
    pub fn read(&mut self, backend: &mut dyn Backend) -> Result<u64, FollowError> {
        let Some(consumer) = &self.consumer else {
            return Ok(0);
        };
        if self.next.is_empty() {
            return Ok(0);
        }
        let mut batch: HashMap<(usize, i32), Changes> = HashMap::new();
        let mut reached: HashMap<(usize, i32), i64> = HashMap::new();
        let mut read = 0u64;
        let mut by_topic: HashMap<String, u64> = HashMap::new();
        for _ in 0..READ_AT_MOST {
            let msg = match consumer.poll(Duration::ZERO) {
                None => break,
                Some(Err(KafkaError::PartitionEOF(_))) => continue,
                // A broker going away: the client reconnects by itself.
                Some(Err(e)) if super::restore::is_transient(&e) => {
                    crate::telemetry::restore_client_error(&e, "table");
                    break;
                }
                Some(Err(e)) => return Err(e.into()),
                Some(Ok(msg)) => msg,
            };
            read += 1;
            match by_topic.get_mut(msg.topic()) {
                Some(n) => *n += 1,
                None => {
                    by_topic.insert(msg.topic().to_string(), 1);
                }
            }
            let (partition, offset) = (msg.partition(), msg.offset());
            for (&(store, p), (topic, next)) in &mut self.next {
                if p != partition || topic != msg.topic() || offset < *next {
                    continue;
                }
                *next = offset + 1;
                reached.insert((store, p), offset + 1);
                if let Some(key) = msg.key() {
                    let into = if self.global.contains(&store) {
                        GLOBAL
                    } else {
                        p
                    };
                    batch
                        .entry((store, into))
                        .or_default()
                        .insert(key.to_vec(), msg.payload().map(<[u8]>::to_vec));
                }
            }
        }
        if reached.is_empty() {
            return Ok(read);
        }
        let at_ms = now_ms();
        let checkpoints: Vec<_> = reached
            .into_iter()
            .map(|(at, offset)| (at, Checkpoint { offset, at_ms }))
            .collect();
        for (topic, n) in by_topic {
            crate::telemetry::table_read(&topic, n);
        }
        backend.apply(batch, &checkpoints)?;
        Ok(read)
    }
}
