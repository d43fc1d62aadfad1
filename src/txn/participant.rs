//! Participants of a commit: outputs outside Kafka (and later state stores) that cannot join
//! its transaction, and so must be idempotent instead.
//!
//! The transaction owner stages what the pipeline made of each consumed record in every
//! participant, and commits in a fixed order: every participant [prepares](Participant::prepare)
//! (applies its batch, left open), then every one [commits](Participant::commit), then Kafka
//! commits the outputs and the consumed offsets. A crash between the two replays the batch,
//! and each participant absorbs the replay; an aborted Kafka transaction
//! [discards](Participant::discard) what was staged, and the records come again after the
//! rewind. The owner knows nothing else of them: PostgreSQL or HTTP is their business.

use std::time::Instant;

use crate::record::{Origin, Record, RecordError};

/// What to do about a participant's error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    /// The same write may succeed later (connection lost, server restarting, deadlock):
    /// retry with backoff, or abort and rewind the Kafka transaction when time runs out.
    Transient,
    /// The record named by the error can never be written (a constraint violation, a value
    /// that does not fit): it goes the way `runtime.on_error` says, by default to the
    /// dead-letter topic.
    Permanent,
    /// The output itself is unusable (configuration, permissions, a missing table): stop.
    Fatal,
}

/// A record a participant refused for good, and why, as the engine handles a record the
/// pipeline could not process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The consumed record at fault, when known.
    pub origin: Option<Origin>,
    pub failure: RecordError,
    /// The kind of participant that refused it, for messages: `postgres`, `http`.
    pub by: &'static str,
}

/// A participant's error: how severe, and which records it refuses.
pub trait Failure: std::error::Error + Send + Sync + 'static {
    fn severity(&self) -> Severity;
    /// Every record refused for good, each with its origin when known (permanent errors).
    fn refusals(&self) -> Vec<Refusal>;
}

/// An error of some participant.
pub type ParticipantError = Box<dyn Failure>;

/// An output outside Kafka, committed right before each Kafka transaction.
pub trait Participant: Send {
    /// Takes its part of what the pipeline made of one consumed record (pairs of output
    /// index and record). A permanent error names a record it can never take.
    fn stage(&mut self, produced: &[(usize, Record)]) -> Result<(), ParticipantError>;
    /// Forgets what was staged for one consumed record, keeping the rest.
    fn discard_record(&mut self, origin: &Origin);
    /// Whether it holds a full batch: the transaction should commit.
    fn is_full(&self) -> bool;
    /// Applies the staged batch and leaves it open for [`Participant::commit`], retrying
    /// transient errors until `deadline`.
    fn prepare(&mut self, deadline: Instant) -> Result<(), ParticipantError>;
    /// Commits what [`Participant::prepare`] left open; returns whether there was anything.
    fn commit(&mut self) -> Result<bool, ParticipantError>;
    /// Forgets everything staged, rolling back what was prepared.
    fn discard(&mut self);
}
