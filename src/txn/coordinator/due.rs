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
use crate::record::Origin;
use crate::txn::AbortReason;

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
    pub fn add_due<C: ConsumerContext>(
        &mut self,
        consumer: &BaseConsumer<C>,
        at: Position<'_>,
        outputs: &[Outgoing<'_>],
    ) -> Result<Added, TxnError> {
        debug_assert!(!self.overlap.committing());
        // The last record read: its offset is committed again as it was, at least.
        self.offsets.record(at.topic, at.partition, at.next - 1);
        if self.begin_if_closed(consumer)? == Added::Aborted {
            return Ok(Added::Aborted);
        }
        for out in outputs {
            let origin: &Origin = &out.record.origin;
            let lineage = out.lineage.then_some(Lineage { origin, id: None });
            let sent = self.collector.send(
                self.producer.client(),
                out.topic,
                &out.record,
                lineage,
                self.settings.operation_timeout,
            );
            if let Err(err) = sent {
                self.fail(consumer, err, AbortReason::ProduceFailed)?;
                return Ok(Added::Aborted);
            }
        }
        self.send_changes(consumer)
    }
}
