//! The one owner of transactions: every transactional call of the crate is made here, for
//! the job and for `dlq replay` alike.
//!
//! * [`producer`]: the transactional producer, the only caller of `init_transactions`,
//!   `begin_transaction`, `send_offsets_to_transaction`, `commit_transaction` and
//!   `abort_transaction`; each call retried as the classifier says and watched for hangs.
//! * [`bounded`]: a call on a thread of its own, abandoned with its client when it has not
//!   returned well past its own timeout.
//! * [`collector`]: sending records and tracking their deliveries (a failed delivery fails
//!   its transaction; a commit waits for every delivery first).
//! * [`coordinator`]: the transaction's state ([`Txn`]): lazy begin, when it is due, the
//!   commit order (participants, then Kafka), a commit in the background, abort and rewind,
//!   refused records.
//! * [`participant`]: the trait of outputs outside Kafka that commit with it.
//! * [`classify`]: what an error means (retry, abort and rewind, fatal, or the consumer's
//!   membership lost), pure.
//! * [`offsets`]: the offsets a transaction commits (last processed + 1).

mod bounded;
pub mod classify;
mod collector;
mod coordinator;
pub mod offsets;
pub mod participant;
mod producer;
pub mod publish;

use rdkafka::error::KafkaError;

pub use collector::payload_len;
pub use coordinator::{
    Added, CommitSteps, Committed, Consumed, Outgoing, Position, Redo, Txn, TxnSettings, TxnStats,
};
pub use participant::{Failure, Participant, ParticipantError, Refusal, Severity};
pub use publish::Publisher;

/// Why a transaction was aborted; a bounded label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AbortReason {
    BeginFailed,
    ProduceFailed,
    CommitFailed,
    PartitionsLost,
    ProducerRebuilt,
    TransformFailed,
    Stopping,
    Failpoint,
    SinkFailed,
    /// A sink refused a record: the transaction is redone without it.
    SinkRefused,
}

impl AbortReason {
    pub fn as_str(self) -> &'static str {
        match self {
            AbortReason::BeginFailed => "begin_failed",
            AbortReason::ProduceFailed => "produce_failed",
            AbortReason::CommitFailed => "commit_failed",
            AbortReason::PartitionsLost => "partitions_lost",
            AbortReason::ProducerRebuilt => "producer_rebuilt",
            AbortReason::TransformFailed => "transform_failed",
            AbortReason::Stopping => "stopping_on_error",
            AbortReason::Failpoint => "failpoint",
            AbortReason::SinkFailed => "sink_failed",
            AbortReason::SinkRefused => "sink_refused",
        }
    }
}

/// Why the transaction owner cannot go on.
#[derive(Debug, thiserror::Error)]
pub enum TxnError {
    #[error("kafka client: cannot create the producer: {error}")]
    CreateProducer { error: KafkaError },
    #[error(
        "init_transactions failed (is the broker reachable, and does it allow transactions?): {error}"
    )]
    Init { error: KafkaError },
    #[error("producer failed fatally again, before committing since it was rebuilt: {error}")]
    FatalAgain { error: KafkaError },
    #[error(
        "producer fenced more than {} times within {}s: does another running process use the same transactional.id? {error}",
        crate::fence::PRODUCER_FENCES,
        crate::fence::FENCE_WINDOW.as_secs()
    )]
    FencedAgain { error: KafkaError },
    /// The consumer's membership was taken by a member with the same group.instance.id
    /// (TxnOffsetCommit refused with FENCED_INSTANCE_ID); the transaction was aborted.
    #[error("the consumer's group.instance.id was taken by another member: {error}")]
    MemberFenced { error: KafkaError },
    #[error("cannot rewind ({what}): {error}")]
    Rewind { what: String, error: KafkaError },
    /// A participant failed in a way no retry or abort cures.
    #[error("{0}")]
    Participant(ParticipantError),
    /// The state of assigned partitions could not be restored (from the rebalance callback).
    #[error("{0}")]
    State(String),
}

impl TxnError {
    fn rewind(what: &str, error: KafkaError) -> TxnError {
        TxnError::Rewind {
            what: what.to_string(),
            error,
        }
    }
}
