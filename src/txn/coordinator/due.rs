//! Outputs no consumed record brings: the records a `delay` held, sent when they come due by
//! the wall clock, with their removal from the store, in the open transaction (or one begun
//! for them).
//!
//! The transaction also commits the offset the consumer is at on the partition they were
//! held on (unchanged). That is what carries the group's generation to the broker: a member
//! that lost the partition in a rebalance it has not seen yet is refused at the commit, its
//! transaction aborted, instead of sending records the partition's new owner sends too.

use rdkafka::consumer::{BaseConsumer, ConsumerContext};

use super::{Added, Outgoing, Txn, TxnError};
use crate::lineage::Lineage;

/// Where the consumer is on the partition due records were held on: its input topic, the
/// partition, and the offset of the next record to read.
#[derive(Debug, Clone, Copy)]
pub struct Position<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub next: i64,
}

impl Txn {
    /// Adds `outputs` of records that came due on `at`'s partition, each with the lineage of
    /// the record it was made of, and the state changes of the record at hand (their removal
    /// from the store).
    pub fn add_due<'o, C: ConsumerContext>(
        &mut self,
        consumer: &BaseConsumer<C>,
        at: Position<'_>,
        outputs: &'o [Outgoing<'_>],
    ) -> Result<Added, TxnError> {
        debug_assert!(!self.overlap.committing());
        // The last record read: its offset is committed again as it was, at least.
        self.offsets.record(at.topic, at.partition, at.next - 1);
        if self.begin_if_closed(consumer)? == Added::Aborted {
            return Ok(Added::Aborted);
        }
        let lineage = |out: &'o Outgoing<'_>| {
            out.lineage.then_some(Lineage {
                origin: &out.record.origin,
                id: None,
            })
        };
        if self.send_outputs(consumer, outputs, lineage)? == Added::Aborted {
            return Ok(Added::Aborted);
        }
        self.send_changes(consumer)
    }
}
