//! The progress records of a relay: what one Kafka transaction of a shard published, written
//! in that transaction and read back by whoever takes the shard next. Pure.

use serde::{Deserialize, Serialize};

/// What one Kafka transaction of a shard published: the ids of its rows. Written in that
/// transaction to the shard's partition of the progress topic, keyed by table and shard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Progress {
    pub(super) table: String,
    pub(super) shard: u32,
    /// Row ids, as text, in the order they were published.
    pub(super) ids: Vec<String>,
    /// The relay instance that published them.
    pub(super) relay: String,
    /// When the transaction was committed (ms since the epoch, the relay's clock).
    pub(super) at_ms: i64,
}

impl Progress {
    /// The record key of a shard's progress.
    pub(super) fn key(table: &str, shard: u32) -> String {
        format!("{table}/{shard}")
    }

    pub(super) fn encode(&self) -> Vec<u8> {
        // A struct of strings and integers always serialises.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// The progress in a record of the progress topic, if it is one of this table's shard.
    pub(super) fn decode(
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        table: &str,
        shard: u32,
    ) -> Option<Progress> {
        if key != Some(Progress::key(table, shard).as_bytes()) {
            return None;
        }
        serde_json::from_slice::<Progress>(value?)
            .ok()
            .filter(|p| p.table == table && p.shard == shard)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_is_read_back_only_for_its_own_shard() {
        let p = Progress {
            table: "t".into(),
            shard: 2,
            ids: vec!["1".into(), "2".into()],
            relay: "r".into(),
            at_ms: 5,
        };
        let key = Progress::key("t", 2);
        let bytes = p.encode();
        assert_eq!(
            Progress::decode(Some(key.as_bytes()), Some(&bytes), "t", 2),
            Some(p.clone())
        );
        assert_eq!(
            Progress::decode(Some(key.as_bytes()), Some(&bytes), "t", 1),
            None
        );
        assert_eq!(Progress::decode(Some(b"u/2"), Some(&bytes), "u", 2), None);
        assert_eq!(
            Progress::decode(Some(key.as_bytes()), Some(b"{"), "t", 2),
            None
        );
    }
}
