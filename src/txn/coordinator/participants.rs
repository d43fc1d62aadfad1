//! The participants of a commit, outputs outside Kafka: what each record leaves staged in
//! them, their commit right before the Kafka transaction's, and what becomes of the
//! transaction when one of them fails.

use rdkafka::consumer::{BaseConsumer, ConsumerContext};

use super::{Committed, Txn};
use crate::record::Record;
use crate::telemetry;
use crate::txn::participant::{Participant, ParticipantError, Severity};
use crate::txn::{AbortReason, TxnError};

/// The participants of the transaction, and what it knows of them.
#[derive(Default)]
pub(super) struct Participants {
    /// Outputs outside Kafka, committed right before the Kafka transaction.
    list: Vec<Box<dyn Participant>>,
    /// How many of their commits had something to commit, since the job started.
    commits: u64,
    /// Whether the participants took something of the record being added.
    staged: bool,
}

impl Participants {
    pub(super) fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Whether one of them holds a full batch: the transaction should commit.
    pub(super) fn any_full(&self) -> bool {
        self.list.iter().any(|p| p.is_full())
    }

    /// Whether they took something of the record being added; they are then asked afresh.
    pub(super) fn take_staged(&mut self) -> bool {
        std::mem::take(&mut self.staged)
    }

    /// Every participant forgets what was staged, rolling back what was prepared.
    pub(super) fn discard(&mut self) {
        for p in &mut self.list {
            p.discard();
        }
        self.staged = false;
    }
}

impl Txn {
    /// Gives the transaction outputs outside Kafka: they commit right before it does.
    pub fn with_participants(mut self, participants: Vec<Box<dyn Participant>>) -> Txn {
        self.participants.list = participants;
        self
    }

    pub fn has_participants(&self) -> bool {
        !self.participants.is_empty()
    }

    /// Stages what the pipeline made of a consumed record in the participants; call it right
    /// before [`Txn::add`] of the same record. An error names a record some participant
    /// cannot take; nothing of it stays staged in any.
    pub fn stage(&mut self, produced: &[(usize, Record)]) -> Result<(), ParticipantError> {
        self.participants.staged = false;
        let failed = self
            .participants
            .list
            .iter_mut()
            .find_map(|p| p.stage(produced).err());
        if let Some(e) = failed {
            // Whatever the others took of this record goes too: a record is written whole
            // or not at all.
            if let Some((_, rec)) = produced.first() {
                for p in &mut self.participants.list {
                    p.discard_record(&rec.origin);
                }
            }
            return Err(e);
        }
        self.participants.staged = !produced.is_empty();
        Ok(())
    }

    /// Every participant prepares, and only when all have does any commit: a record one of
    /// them refuses leaves nothing in the others. (A failure between two of the commits is
    /// one of the crashes the participants absorb: the Kafka transaction does not commit, and
    /// the batch comes again.) Transient errors are retried while the transaction has time
    /// (a fifth of its timeout is kept for the Kafka commit).
    pub(super) fn commit_participants(&mut self) -> Result<(), ParticipantError> {
        let deadline = self.opened_at + self.settings.operation_timeout.mul_f64(0.8);
        let failed = self
            .participants
            .list
            .iter_mut()
            .find_map(|p| p.prepare(deadline).err());
        if let Some(e) = failed {
            // Rolls back what the others prepared: the Kafka transaction aborts too.
            for p in &mut self.participants.list {
                p.discard();
            }
            return Err(e);
        }
        for p in &mut self.participants.list {
            if p.commit()? {
                self.participants.commits += 1;
                if self.settings.exit_after_participant_commit == Some(self.participants.commits) {
                    telemetry::failpoint_exit_after_db_commit(self.participants.commits);
                    std::process::abort();
                }
            }
        }
        Ok(())
    }

    /// A participant could not commit: nothing of the transaction may. Records it refused
    /// are remembered, and handled as failed records when they come again after the rewind
    /// (the records consumed before them may have been sent to Kafka outputs already; only
    /// an abort takes them back).
    pub(super) fn participants_failed<C: ConsumerContext>(
        &mut self,
        consumer: &BaseConsumer<C>,
        e: ParticipantError,
    ) -> Result<Committed, TxnError> {
        let refusals = e.refusals();
        let detail = e.to_string();
        match e.severity() {
            Severity::Permanent if refusals.iter().any(|r| r.origin.is_some()) => {
                self.refused.remember(refusals);
                self.bound_the_redo();
                self.abort_and_rewind(consumer, AbortReason::SinkRefused, &detail)?;
                Ok(Committed::Aborted)
            }
            Severity::Transient => {
                self.abort_and_rewind(consumer, AbortReason::SinkFailed, &detail)?;
                Ok(Committed::Aborted)
            }
            _ => {
                self.abort_and_rewind(consumer, AbortReason::SinkFailed, &detail)?;
                Err(TxnError::Participant(e))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::txn::coordinator::fixture::*;

    #[test]
    fn every_participant_prepares_before_any_commits_then_kafka_commits() {
        let mut f = fixture(None);
        assert_eq!(f.txn.commit(&f.consumer).unwrap(), Committed::Nothing);
        add(&mut f, &origin(0, 0));
        add(&mut f, &origin(1, 0));
        assert!(f.txn.is_open());
        assert_eq!(f.txn.commit(&f.consumer).unwrap(), Committed::Done);
        assert_eq!(
            log(&f),
            [
                "first prepare",
                "second prepare",
                "first commit",
                "second commit",
                "first discard",
                "second discard"
            ]
        );
        let stats = f.txn.stats();
        assert_eq!((stats.committed, stats.aborted), (1, 0));
        assert_eq!(stats.records_committed, 2);
        assert_eq!(stats.commit_durations.count(), 1);
        assert_eq!(stats.commit_steps.deliveries.count(), 1);
        assert_eq!(stats.commit_steps.offsets.count(), 1);
        assert_eq!(stats.commit_steps.end.count(), 1);
        assert!(!f.txn.is_open());
    }

    #[test]
    fn a_transient_participant_failure_aborts_and_a_fatal_one_stops() {
        let mut f = fixture(None);
        add(&mut f, &origin(0, 0));
        *f.fail_second.lock().unwrap() = Some(StubError {
            severity: Severity::Transient,
            refused: None,
        });
        assert_eq!(f.txn.commit(&f.consumer).unwrap(), Committed::Aborted);
        assert_eq!(f.txn.refused(&origin(0, 0)), None);
        add(&mut f, &origin(0, 0));
        *f.fail_second.lock().unwrap() = Some(StubError {
            severity: Severity::Fatal,
            refused: None,
        });
        let err = f.txn.commit(&f.consumer).expect_err("fatal");
        assert!(matches!(err, TxnError::Participant(_)), "{err}");
        assert_eq!(f.txn.stats().aborted, 2);
        assert!(!f.txn.is_open(), "aborted before stopping");
    }

    #[test]
    fn a_full_participant_makes_the_transaction_due() {
        let mut f = fixture(None);
        let now = Instant::now();
        assert!(!f.txn.is_due(now), "nothing open");
        add(&mut f, &origin(0, 0));
        add(&mut f, &origin(0, 1));
        assert!(!f.txn.is_due(now));
        add(&mut f, &origin(0, 2));
        assert!(f.txn.is_due(now), "the stubs are full at 3 records");
        assert!(f.txn.due_in(now).is_some());
    }
}
