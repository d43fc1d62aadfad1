//! What the transactions did since the job started: how many committed and aborted, and
//! how long their commits took, step by step.

use super::kafka_commit::StepTimes;
use crate::histogram::Histogram;

/// Totals since the job started, counting committed work only.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TxnStats {
    pub committed: u64,
    pub aborted: u64,
    pub records_committed: u64,
    pub outputs_committed: u64,
    pub producer_rebuilds: u64,
    /// How long each committed transaction took to commit: waiting for its deliveries,
    /// sending the offsets and committing (under at-least-once: the offset commit).
    pub commit_durations: Histogram,
    /// The same commits, step by step.
    pub commit_steps: CommitSteps,
}

/// How long each step of the committed transactions' commits took: where a commit's pause
/// goes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommitSteps {
    /// Waiting for the transaction's last deliveries (the outputs outside Kafka committing
    /// first included).
    pub deliveries: Histogram,
    /// `send_offsets_to_transaction`: AddOffsetsToTxn to the transaction coordinator, then
    /// TxnOffsetCommit to the group coordinator (under at-least-once: the offset commit).
    pub offsets: Histogram,
    /// `commit_transaction`: EndTxn (none under at-least-once).
    pub end: Histogram,
}

impl CommitSteps {
    pub(super) fn record(&mut self, t: StepTimes) {
        self.deliveries.record(t.delivered - t.started);
        self.offsets.record(t.offsets_sent - t.delivered);
        self.end.record(t.ended - t.offsets_sent);
    }
}
