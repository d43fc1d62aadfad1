//! The shards of an outbox table: a relay publishes a shard while it holds the shard's
//! advisory lock, with the shard's own transactional id.

/// The transactional id of a shard's publisher: one per shard, whichever relay holds it, so
/// that the relay taking a shard over fences the one that held it before.
pub(super) fn transactional_id(topology: &str, table: &str, shard: u32) -> String {
    format!("onceflow.{topology}.outbox.{table}.{shard}")
}
