//! Records a participant refused for good: remembered across the abort they caused, so that
//! when they come again after the rewind the engine handles them as failed records instead
//! of processing them again.

use std::collections::HashMap;

use super::Txn;
use crate::record::{Origin, RecordError};
use crate::telemetry;
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
    use crate::txn::{Added, Committed, Consumed};

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
}
