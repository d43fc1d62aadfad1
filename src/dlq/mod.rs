//! The dead-letter topic: what a dead-letter record carries ([`format`](mod@format)), and the
//! `dlq inspect` ([`inspect`](mod@inspect)) and `dlq replay` ([`replay`](mod@replay)) commands.
//!
//! The engine writes a dead-letter record in the same transaction as the outputs and the
//! consumed offsets, so it is exactly-once too. Replay is itself an exactly-once
//! read-process-write job over the dead-letter topic, through the same transaction owner as
//! the job ([`crate::txn`]): its consumer group's offsets are committed in the replay
//! transactions, so a second replay over the same range re-produces nothing.

pub mod format;
pub mod inspect;
pub mod replay;

pub use format::*;
pub use inspect::inspect;
pub use replay::{Replayed, replay};

use crate::kafka::read::ReadError;
use crate::txn::TxnError;

/// Why a dead-letter command failed.
#[derive(Debug, thiserror::Error)]
pub enum DlqError {
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error(transparent)]
    Txn(#[from] TxnError),
    #[error("cannot write the table: {0}")]
    Output(#[from] std::io::Error),
    #[error(
        "{letter}: its value was too large for the dead-letter topic and was left out, and its original {origin} cannot be read back: {why}; leave it out of the replay with a filter (e.g. --until-ms, --origin-partition)"
    )]
    OriginalGone {
        letter: String,
        origin: String,
        why: String,
    },
    #[error("{topic}[{partition}]@{offset} has no {header} header; pass --to")]
    NoOrigin {
        topic: String,
        partition: i32,
        offset: i64,
        header: &'static str,
    },
}
