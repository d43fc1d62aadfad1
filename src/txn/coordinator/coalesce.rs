//! Emitting once per key per commit (`aggregate` with `emit: per_commit`): the outputs of a
//! record replace those the transaction holds for the same input key, and what is held is
//! sent when the transaction commits, before its offsets. A key's last record's outputs are
//! what the pipeline makes of its latest state, so each key changed in a transaction is
//! emitted once, with that state (or not at all when the last record's outputs were none).
//! Its state changes are sent as the record is added, as for every record; an abort forgets
//! what is held with the rest.

use std::collections::HashMap;

use rdkafka::consumer::{BaseConsumer, ConsumerContext};
use rdkafka::error::KafkaResult;

use super::{Added, Consumed, Outgoing, Txn};
use crate::lineage::Lineage;
use crate::record::{Origin, Record};

/// An output held until the commit.
struct HeldOutput {
    topic: String,
    record: Record,
    /// The lineage it is stamped with: its record's origin and event id.
    lineage: Option<(Origin, Option<Vec<u8>>)>,
}

/// The outputs held for the open transaction, by (input partition, input key).
#[derive(Default)]
pub(super) struct Coalesced {
    by_key: HashMap<(i32, Vec<u8>), Vec<HeldOutput>>,
}

impl Coalesced {
    /// `outputs` of the record at `consumed` replace those held for its `key`.
    fn hold(&mut self, consumed: &Consumed<'_>, key: &[u8], outputs: &[Outgoing<'_>]) {
        let held = outputs
            .iter()
            .map(|o| HeldOutput {
                topic: o.topic.to_string(),
                record: o.record.clone(),
                lineage: o
                    .lineage
                    .then(|| (consumed.origin.clone(), consumed.id.map(<[u8]>::to_vec))),
            })
            .collect();
        self.by_key
            .insert((consumed.origin.partition, key.to_vec()), held);
    }

    pub(super) fn clear(&mut self) {
        self.by_key.clear();
    }
}

impl Txn {
    /// Adds one consumed record whose outputs are emitted once per `key` per commit: its
    /// offset and state changes join the transaction now, its outputs replace the ones held
    /// for `key` (a record without a key is added as [`Txn::add`] does).
    pub fn add_latest<C: ConsumerContext>(
        &mut self,
        consumer: &BaseConsumer<C>,
        consumed: Consumed<'_>,
        key: Option<&[u8]>,
        outputs: &[Outgoing<'_>],
    ) -> Result<Added, super::TxnError> {
        let Some(key) = key else {
            return self.add(consumer, consumed, outputs);
        };
        // A stateful job never commits in the background, so nothing is held for the next
        // transaction meanwhile: the record joins the open one.
        debug_assert!(!self.overlap.committing());
        let added = self.add_now(consumer, consumed, &[], !outputs.is_empty())?;
        if added == Added::Yes {
            self.coalesced.hold(&consumed, key, outputs);
        }
        Ok(added)
    }

    /// Sends every held output, as the transaction commits.
    pub(super) fn send_coalesced(&mut self) -> KafkaResult<()> {
        let held = std::mem::take(&mut self.coalesced.by_key);
        for out in held.into_values().flatten() {
            let lineage = out.lineage.as_ref().map(|(origin, id)| Lineage {
                origin,
                id: id.as_deref(),
            });
            self.collector.send(
                self.producer.client(),
                &out.topic,
                &out.record,
                lineage,
                self.settings.operation_timeout,
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::txn::AbortReason;
    use crate::txn::coordinator::Committed;
    use crate::txn::coordinator::fixture::*;

    fn add_keyed(f: &mut Fixture, o: &Origin, key: &[u8]) {
        let out = [Outgoing {
            topic: OUT,
            record: record(o),
            lineage: true,
        }];
        let added = f
            .txn
            .add_latest(&f.consumer, Consumed::at(o, 1), Some(key), &out)
            .expect("added");
        assert_eq!(added, Added::Yes);
    }

    #[test]
    fn a_key_changed_in_a_transaction_is_emitted_once_with_its_last_record() {
        let mut f = kafka_only(false, 1_000);
        for offset in 0..3 {
            add_keyed(&mut f, &origin(0, offset), b"a");
        }
        add_keyed(&mut f, &origin(0, 3), b"b");
        let held = &f.txn.coalesced.by_key[&(0, b"a".to_vec())];
        assert_eq!(held.len(), 1);
        assert_eq!(held[0].record.origin.offset, 2, "the key's last record");
        assert_eq!(f.txn.commit(&f.consumer).unwrap(), Committed::Done);
        let stats = f.txn.stats();
        assert_eq!((stats.records_committed, stats.outputs_committed), (4, 2));
        assert!(f.txn.coalesced.by_key.is_empty());
    }

    #[test]
    fn an_abort_forgets_what_was_held() {
        let mut f = kafka_only(false, 1_000);
        add_keyed(&mut f, &origin(0, 0), b"a");
        f.txn
            .abort_and_rewind(&f.consumer, AbortReason::TransformFailed, "test")
            .unwrap();
        assert!(f.txn.coalesced.by_key.is_empty());
        add_keyed(&mut f, &origin(0, 0), b"b");
        assert_eq!(f.txn.commit(&f.consumer).unwrap(), Committed::Done);
        assert_eq!(f.txn.stats().outputs_committed, 1);
    }
}
