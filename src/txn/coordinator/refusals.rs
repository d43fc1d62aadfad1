//! Records a participant refused for good: remembered across the abort they caused, so that
//! when they come again after the rewind the engine handles them as failed records instead
//! of processing them again.

use std::collections::HashMap;

use rdkafka::consumer::{BaseConsumer, ConsumerContext};

use super::{Committed, Txn};
use crate::record::{Origin, RecordError};
use crate::telemetry;
use crate::txn::TxnError;
use crate::txn::participant::Refusal;

/// Refused records remembered at most; past it the memory starts over (a record forgotten
/// is refused again and found again, at the cost of one more aborted transaction).
const MAX_REFUSED: usize = 10_000;

/// Records a participant refused (permanent errors naming them) in an aborted transaction:
/// when they come again after the rewind, they are handled as failed records instead of
/// being processed again.
#[derive(Default)]
pub(super) struct Refusals {
    by_origin: HashMap<Origin, RecordError>,
    /// Where the transactions refusals aborted had got to: the next offset of each partition
    /// they consumed. Their records, done again, are kept apart from records not seen yet
    /// (which may hold refusals of their own): a transaction holds either kind, never both, so
    /// a refusal costs the one aborted transaction, not a chain of them.
    redo_until: Vec<(String, i32, i64)>,
    /// Whether the open transaction does records again (`Some(true)`), takes new ones
    /// (`Some(false)`), or has neither yet.
    open_redoes: Option<bool>,
}

/// What the record in hand is to the open transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Redo {
    /// It goes in the open transaction.
    Joins,
    /// It is not of the open transaction's kind (a record done again, or a new one): the open
    /// transaction commits first.
    CommitFirst,
}

impl Refusals {
    /// Remembers the records a participant refused (those it could name), each reported; past
    /// [`MAX_REFUSED`] the memory starts over.
    pub(super) fn remember(&mut self, refusals: Vec<Refusal>) {
        if self.by_origin.len() >= MAX_REFUSED {
            self.by_origin.clear();
        }
        for refusal in refusals {
            telemetry::participant_refused(refusal.by, refusal.origin.as_ref(), &refusal.failure);
            if let Some(origin) = refusal.origin {
                self.by_origin.insert(origin, refusal.failure);
            }
        }
    }
}

impl Txn {
    /// Remembers where the transaction being aborted for a refusal had got to (see
    /// [`Refusals::redo_until`]).
    pub(super) fn bound_the_redo(&mut self) {
        for (t, p, next) in self.offsets.to_commit() {
            match self
                .refused
                .redo_until
                .iter_mut()
                .find(|(topic, partition, _)| *partition == p && topic == t)
            {
                Some(bound) => bound.2 = bound.2.max(next),
                None => self.refused.redo_until.push((t.to_string(), p, next)),
            }
        }
        self.refused.open_redoes = None;
    }

    /// Records done again after a refusal, and records not seen before, go in transactions
    /// of their own: the open transaction commits first when the record at `origin` is not
    /// of its kind (`Committed::Nothing` when it joins).
    pub fn keep_redo_apart<C: ConsumerContext>(
        &mut self,
        consumer: &BaseConsumer<C>,
        origin: &Origin,
    ) -> Result<Committed, TxnError> {
        if self.redo(origin) == Redo::Joins {
            return Ok(Committed::Nothing);
        }
        let committed = self.commit_before(consumer, origin)?;
        if committed != Committed::Aborted {
            self.redo(origin);
        }
        Ok(committed)
    }

    /// Whether the record at `origin` may join the open transaction: records done again after
    /// a refusal and records not seen before go in transactions of their own.
    pub fn redo(&mut self, origin: &Origin) -> Redo {
        if self.refused.redo_until.is_empty() {
            return Redo::Joins;
        }
        let again = self.refused.redo_until.iter().any(|(t, p, next)| {
            *p == origin.partition && t.as_str() == &*origin.topic && origin.offset < *next
        });
        match self.refused.open_redoes {
            Some(kind) if self.open && kind != again => Redo::CommitFirst,
            _ => {
                self.refused.open_redoes = Some(again);
                Redo::Joins
            }
        }
    }

    /// Why a participant refused the record at `origin` in an aborted transaction, if it
    /// did: the engine handles it as a failed record (by default, dead-letters it) instead of
    /// processing it again. The refusal is remembered until a commit moves past the record:
    /// the transaction that dead-letters it may itself be aborted (another record refused)
    /// and the record come once more.
    pub fn refused(&self, origin: &Origin) -> Option<RecordError> {
        if self.refused.by_origin.is_empty() {
            return None;
        }
        self.refused.by_origin.get(origin).cloned()
    }

    /// Forgets the refusals of records this commit moved past.
    pub(super) fn forget_refusals_committed(&mut self) {
        self.refused.open_redoes = None;
        if !self.refused.redo_until.is_empty() {
            let offsets = &self.offsets;
            self.refused.redo_until.retain(|(t, p, next)| {
                !offsets
                    .to_commit()
                    .any(|(topic, partition, at)| partition == *p && topic == t && at >= *next)
            });
        }
        if self.refused.by_origin.is_empty() {
            return;
        }
        let offsets = &self.offsets;
        self.refused.by_origin.retain(|o, _| {
            !offsets
                .to_commit()
                .any(|(t, p, next)| p == o.partition && t == &*o.topic && next > o.offset)
        });
    }
}

#[cfg(test)]
mod tests {
    use crate::record::ErrorKind;
    use crate::txn::Severity;
    use crate::txn::coordinator::fixture::*;
    use crate::txn::{Added, Committed, Consumed, Redo};

    #[test]
    fn a_refused_record_aborts_the_transaction_and_is_remembered_until_a_commit_passes_it() {
        let mut f = fixture(None);
        let refused = origin(0, 1);
        add(&mut f, &origin(0, 0));
        add(&mut f, &refused);
        *f.fail_second.lock().unwrap() = Some(StubError {
            severity: Severity::Permanent,
            refused: Some(refused.clone()),
        });
        assert_eq!(f.txn.commit(&f.consumer).unwrap(), Committed::Aborted);
        assert_eq!(
            log(&f)[..3],
            ["first prepare", "second prepare", "first discard"],
            "a failed prepare rolls back the others; none commits"
        );
        assert_eq!(f.txn.stats().aborted, 1);
        assert_eq!(f.txn.stats().committed, 0);
        let failure = f.txn.refused(&refused).expect("remembered");
        assert_eq!(failure.kind, ErrorKind::Rejected);
        assert_eq!(f.txn.refused(&origin(0, 0)), None);
        // The records come again; the refused one is now handled as failed (added without
        // output), and a commit past it forgets it.
        add(&mut f, &origin(0, 0));
        assert_eq!(
            f.txn
                .add(&f.consumer, Consumed::at(&refused, 1), &[])
                .unwrap(),
            Added::Yes
        );
        assert!(
            f.txn.refused(&refused).is_some(),
            "kept until a commit passes it"
        );
        assert_eq!(f.txn.commit(&f.consumer).unwrap(), Committed::Done);
        assert_eq!(f.txn.refused(&refused), None);
    }

    #[test]
    fn records_done_again_after_a_refusal_and_new_ones_go_in_transactions_of_their_own() {
        let mut f = fixture(None);
        let refused = origin(0, 1);
        add(&mut f, &origin(0, 0));
        add(&mut f, &refused);
        *f.fail_second.lock().unwrap() = Some(StubError {
            severity: Severity::Permanent,
            refused: Some(refused.clone()),
        });
        assert_eq!(f.txn.commit(&f.consumer).unwrap(), Committed::Aborted);
        // The records come again and join one transaction; a record not seen before does not.
        assert_eq!(f.txn.redo(&origin(0, 0)), Redo::Joins);
        add(&mut f, &origin(0, 0));
        assert_eq!(f.txn.redo(&refused), Redo::Joins);
        add(&mut f, &refused);
        assert_eq!(f.txn.redo(&origin(0, 2)), Redo::CommitFirst);
        assert_eq!(f.txn.commit(&f.consumer).unwrap(), Committed::Done);
        // Past the aborted records, every record joins.
        assert_eq!(f.txn.redo(&origin(0, 2)), Redo::Joins);
        add(&mut f, &origin(0, 2));
        assert_eq!(f.txn.redo(&origin(0, 3)), Redo::Joins);
    }
}
