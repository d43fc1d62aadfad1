//! The shards of an outbox table: a relay publishes a shard while it holds the shard's
//! advisory lock, with the shard's own transactional id. Taking free shards, resolving a
//! shard taken (its producer made, which fences the one before; the rows its last progress
//! record names deleted), and a shard's round.

use std::time::{Duration, Instant};

use rdkafka::ClientConfig;

use crate::kafka::clients;
use crate::pg::PgError;
use crate::telemetry;
use crate::txn::{Publisher, TxnError};

use super::{Failed, Relay};

/// How often the rows waiting are counted: a count scans the table, and during a backlog of
/// 100,000 rows of 1 KB a count every second took a third of the relay's throughput.
const COUNT_EVERY: Duration = Duration::from_secs(10);

/// A shard this relay holds.
pub(super) struct Shard {
    /// `None` until the shard is resolved (after it is taken, or after a Kafka failure).
    pub(super) publisher: Option<Publisher>,
    /// Ids published and committed in Kafka whose delete has not committed yet.
    pub(super) undeleted: Vec<String>,
}

/// The transactional id of a shard's publisher: one per shard, whichever relay holds it, so
/// that the relay taking a shard over fences the one that held it before.
pub(super) fn transactional_id(topology: &str, table: &str, shard: u32) -> String {
    format!("onceflow.{topology}.outbox.{table}.{shard}")
}

impl Relay<'_> {
    /// Takes free shards (up to `max_shards`), takes the age of the oldest row and, now and
    /// then, counts the rows waiting.
    pub(super) fn housekeeping(&mut self) -> Result<(), PgError> {
        telemetry::process_info();
        let Some(conn) = &self.conn else {
            return Ok(());
        };
        let client = &conn.client;
        let max = self.config.max_shards() as usize;
        let layout = &self.layout;
        let free: Vec<u32> = (0..self.config.shards)
            .filter(|s| !self.shards.contains_key(s))
            .collect();
        let mut taken = Vec::new();
        let count = Instant::now() >= self.next_count;
        if count {
            self.next_count = Instant::now() + COUNT_EVERY;
        }
        let pending = self.runtime.block_on(async {
            for shard in free {
                if self.shards.len() + taken.len() >= max {
                    break;
                }
                let (k1, k2) = layout.lock_keys(shard);
                let row = client
                    .query_one(
                        "SELECT pg_try_advisory_lock($1::int4, $2::int4)",
                        &[&k1, &k2],
                    )
                    .await?;
                if row.get::<_, bool>(0) {
                    taken.push(shard);
                }
            }
            let rows = match count {
                true => Some(client.query_one(&layout.count_sql(), &[]).await?.get(0)),
                false => None,
            };
            let oldest = match layout.oldest_sql() {
                Some(sql) => Some(
                    client
                        .query_opt(&sql, &[])
                        .await?
                        .map_or(0, |r| r.get::<_, i64>(0)),
                ),
                None => None,
            };
            Ok::<_, PgError>((rows, oldest))
        })?;
        for shard in taken {
            telemetry::shard_taken(&self.config.table, shard);
            self.shards.insert(
                shard,
                Shard {
                    publisher: None,
                    undeleted: Vec::new(),
                },
            );
        }
        telemetry::outbox_pending(&self.config.table, pending.0, pending.1, self.shards.len());
        Ok(())
    }

    /// One round of a shard: resolves it first when needed, then publishes a batch. Returns
    /// the rows published.
    pub(super) fn round(&mut self, shard: u32) -> Result<usize, Failed> {
        let needs_resolving = self
            .shards
            .get(&shard)
            .is_some_and(|s| s.publisher.is_none());
        if needs_resolving {
            self.resolve(shard)?;
        }
        let undeleted = self
            .shards
            .get_mut(&shard)
            .map(|s| std::mem::take(&mut s.undeleted))
            .unwrap_or_default();
        if !undeleted.is_empty() {
            self.delete(shard, undeleted)?;
        }
        self.publish_batch(shard)
    }

    /// Makes the shard's producer (fencing whoever held the shard before) and deletes the
    /// rows its last committed progress record names: published, not yet deleted.
    fn resolve(&mut self, shard: u32) -> Result<(), Failed> {
        let mut config = self.producer_config();
        config.set(
            "transactional.id",
            transactional_id(&self.topology.name, &self.config.table, shard),
        );
        let publisher = Publisher::new(config, self.timeout, self.options.health.clone()).map_err(
            |e| match e {
                TxnError::CreateProducer { .. } => Failed::Fatal(e.into()),
                other => Failed::Kafka(other.to_string()),
            },
        )?;
        let published = self
            .last_progress(shard)
            .map_err(|e| Failed::Kafka(e.to_string()))?;
        if let Some(progress) = published {
            let ids = progress.ids;
            let n = self.delete(shard, ids)?;
            telemetry::outbox_resolved(&self.config.table, shard, n, &progress.relay);
        }
        if let Some(s) = self.shards.get_mut(&shard) {
            s.publisher = Some(publisher);
        }
        Ok(())
    }

    /// Deletes rows by id, in a transaction of its own; returns how many were there.
    fn delete(&mut self, shard: u32, ids: Vec<String>) -> Result<u64, Failed> {
        let Some(conn) = &self.conn else {
            return Err(Failed::Database(PgError::Timeout(Duration::ZERO)));
        };
        let result = self
            .runtime
            .block_on(conn.client.execute(&conn.delete, &[&ids]));
        match result {
            Ok(n) => Ok(n),
            Err(e) => {
                // Kept: the next round of the shard deletes them first.
                if let Some(s) = self.shards.get_mut(&shard) {
                    s.undeleted = ids;
                }
                Err(Failed::Database(e.into()))
            }
        }
    }

    fn producer_config(&self) -> ClientConfig {
        let mut c = clients::producer_config(self.topology, self.identity);
        c.set(
            "transaction.timeout.ms",
            self.topology.runtime.transaction_timeout_ms.to_string(),
        );
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shard_has_one_transactional_id_whichever_relay_holds_it() {
        assert_eq!(
            transactional_id("orders-outbox", "public.orders_outbox", 3),
            "onceflow.orders-outbox.outbox.public.orders_outbox.3"
        );
    }
}
