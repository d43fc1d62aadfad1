//! Offset arithmetic of a transaction, in one place.
//!
//! The offset committed for a partition is the offset of the *next* record to read: the last
//! processed offset plus one. Committing the last processed offset itself would replay that
//! record after every restart.

/// The offset to commit once `last_processed` is done.
pub fn next_offset(last_processed: i64) -> i64 {
    last_processed + 1
}

/// Consumed positions of one partition in the open transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionSpan {
    pub topic: String,
    pub partition: i32,
    /// Offset of the first record consumed in this transaction: where to rewind to when the
    /// broker holds no committed offset for the partition yet.
    pub first: i64,
    /// Offset of the last record consumed in this transaction.
    pub last: i64,
}

/// The partitions touched by the open transaction. A transaction touches few partitions, so a
/// vector searched linearly beats a map and allocates only once per partition.
#[derive(Debug, Clone, Default)]
pub struct TxnOffsets {
    spans: Vec<PartitionSpan>,
}

impl TxnOffsets {
    /// Notes that `offset` of `topic`/`partition` was processed.
    pub fn record(&mut self, topic: &str, partition: i32, offset: i64) {
        match self
            .spans
            .iter_mut()
            .find(|s| s.partition == partition && s.topic == topic)
        {
            Some(span) => {
                span.first = span.first.min(offset);
                span.last = span.last.max(offset);
            }
            None => self.spans.push(PartitionSpan {
                topic: topic.to_string(),
                partition,
                first: offset,
                last: offset,
            }),
        }
    }

    /// `(topic, partition, offset to commit)` for every touched partition.
    pub fn to_commit(&self) -> impl Iterator<Item = (&str, i32, i64)> {
        self.spans
            .iter()
            .map(|s| (s.topic.as_str(), s.partition, next_offset(s.last)))
    }

    /// The first offset this transaction consumed from the partition, if any.
    pub fn first_of(&self, topic: &str, partition: i32) -> Option<i64> {
        self.spans
            .iter()
            .find(|s| s.partition == partition && s.topic == topic)
            .map(|s| s.first)
    }

    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    pub fn clear(&mut self) {
        self.spans.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commit_offset_is_last_processed_plus_one() {
        assert_eq!(next_offset(0), 1);
        assert_eq!(next_offset(41), 42);
    }

    #[test]
    fn spans_track_first_and_last_per_partition() {
        let mut o = TxnOffsets::default();
        o.record("a", 0, 10);
        o.record("a", 1, 5);
        o.record("a", 0, 11);
        o.record("b", 0, 3);
        o.record("a", 0, 12);
        let commits: Vec<_> = o.to_commit().collect();
        assert_eq!(commits, vec![("a", 0, 13), ("a", 1, 6), ("b", 0, 4)]);
        assert_eq!(o.first_of("a", 0), Some(10));
        assert_eq!(o.first_of("b", 1), None);
    }

    #[test]
    fn clear_forgets_everything() {
        let mut o = TxnOffsets::default();
        o.record("a", 0, 1);
        o.clear();
        assert!(o.is_empty());
        assert_eq!(o.to_commit().count(), 0);
    }
}
