//! Outputs that cannot join a Kafka transaction, and so must be idempotent: applying a record
//! once or ten times leaves the same state.
//!
//! The transaction owner ([`crate::engine::txn`]) holds the job's [`Sinks`]. Every record the
//! pipeline produces is staged in each sink; when the Kafka transaction commits, the sinks are
//! flushed first (each applies its batch in a database transaction of its own, and once all
//! have, they commit), and only then are the consumed offsets committed. A crash between the two replays the batch, and each sink absorbs the
//! replay (the PostgreSQL sink through its inbox table). An aborted Kafka transaction discards
//! what was staged; the records come again after the rewind.
//!
//! Errors carry what to do about them ([`SinkErrorKind`]): transient ones are retried with
//! backoff within the transaction's time; a permanent one is a record's fault and names it,
//! and the record then goes the way `runtime.on_error` says (by default to the dead-letter
//! topic, [`SinkError::failure`]); a fatal one stops the job.

pub mod postgres;

use std::time::{Duration, Instant};

use crate::telemetry;
use crate::topology::Topology;
use crate::transform::{ErrorKind, Origin, Record, Stage, TransformError};
use postgres::{PostgresError, PostgresSink, RecordError};

/// What to do about a sink error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SinkErrorKind {
    /// The same write may succeed later (connection lost, server restarting, deadlock):
    /// retry with backoff, or abort and rewind the Kafka transaction when time runs out.
    Transient,
    /// The record named by the error can never be written (a constraint violation, a value
    /// that is not JSON): it goes the way `runtime.on_error` says, by default to the
    /// dead-letter topic.
    Permanent,
    /// The output itself is unusable (configuration, permissions, a missing table): stop.
    Fatal,
}

/// A sink failed; `origin` names the record at fault when the error is permanent.
#[derive(Debug, thiserror::Error)]
#[error("postgres output `{output}`{}: {cause}{}", at(.origin), advice(*.kind, .origin.is_some()))]
pub struct SinkError {
    pub kind: SinkErrorKind,
    /// The output's name in the topology.
    pub output: String,
    /// The output's index in the topology, when known.
    pub index: Option<usize>,
    /// The consumed record at fault.
    pub origin: Option<Origin>,
    /// What went wrong (already part of the message, so not repeated as its source).
    pub cause: Box<PostgresError>,
    /// Other records of the same batch refused with it (permanent errors, each with its
    /// origin).
    pub also: Vec<SinkError>,
}

fn at(origin: &Option<Origin>) -> String {
    origin.as_ref().map_or(String::new(), |o| {
        format!(": record {}[{}]@{}", o.topic, o.partition, o.offset)
    })
}

fn advice(kind: SinkErrorKind, found: bool) -> &'static str {
    match kind {
        SinkErrorKind::Permanent if found => {
            " (a permanent error: nothing of this batch was committed, in no database nor in Kafka; the record goes the way runtime.on_error says)"
        }
        SinkErrorKind::Permanent => {
            " (a permanent error no record could be found for: the Kafka transaction did not commit)"
        }
        SinkErrorKind::Transient => " (transient: retried until the transaction's time ran out)",
        SinkErrorKind::Fatal => "",
    }
}

impl SinkError {
    pub fn new(output: &str, origin: Option<Origin>, cause: PostgresError) -> SinkError {
        SinkError {
            kind: cause.kind(),
            output: output.to_string(),
            index: None,
            origin,
            cause: Box::new(cause),
            also: Vec::new(),
        }
    }

    fn at_output(mut self, index: usize) -> SinkError {
        self.index = Some(index);
        for other in &mut self.also {
            other.index = Some(index);
        }
        self
    }

    /// This error and the others of its batch.
    pub fn all(&self) -> impl Iterator<Item = &SinkError> {
        std::iter::once(self).chain(&self.also)
    }

    /// The record's failure, as the engine handles a record the pipeline could not process:
    /// a row the database refused is `rejected`; a value that cannot become a row is
    /// `wrong_type` or `missing_field`, as it would be in the pipeline.
    pub fn failure(&self) -> TransformError {
        let kind = match &*self.cause {
            PostgresError::Record(RecordError::NotAnObject(_)) => ErrorKind::WrongType,
            PostgresError::Record(RecordError::Missing { .. } | RecordError::NoEventId(_)) => {
                ErrorKind::MissingField
            }
            _ => ErrorKind::Rejected,
        };
        TransformError {
            kind,
            stage: Stage::Output {
                index: self.index.unwrap_or_default(),
                name: self.output.clone(),
            },
            message: self.cause.to_string(),
        }
    }
}

/// Capped exponential backoff: 50 ms, doubling, at most 2 s.
#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
    attempt: u32,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            next: Duration::from_millis(50),
            attempt: 0,
        }
    }
}

impl Backoff {
    const MAX: Duration = Duration::from_secs(2);

    /// The delay before the next attempt, or `None` when it would end past `deadline`.
    pub fn next_delay(&mut self, deadline: Instant) -> Option<Duration> {
        let delay = self.next;
        if Instant::now() + delay >= deadline {
            return None;
        }
        self.attempt += 1;
        self.next = (self.next * 2).min(Self::MAX);
        Some(delay)
    }

    /// Attempts made so far, after the first.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }
}

/// Environment variable of a test-only failpoint: the process aborts right after the n-th
/// database commit of its sinks, before the Kafka transaction commits.
pub const FAILPOINT_EXIT_AFTER_DB_COMMIT: &str = "ONCEFLOW_FAILPOINT_EXIT_AFTER_DB_COMMIT";

/// The sinks of one job.
#[derive(Default)]
pub struct Sinks {
    /// Each sink with the index of its output in the topology.
    postgres: Vec<(usize, PostgresSink)>,
    exit_after_db_commit: Option<u64>,
    db_commits: u64,
}

impl Sinks {
    /// Connects every `postgres` output of the topology, creating inbox tables if missing.
    pub fn from_topology(topology: &Topology) -> Result<Sinks, SinkError> {
        let mut sinks = Sinks {
            exit_after_db_commit: std::env::var(FAILPOINT_EXIT_AFTER_DB_COMMIT)
                .ok()
                .and_then(|v| v.parse().ok()),
            ..Sinks::default()
        };
        for (index, output) in topology.outputs.iter().enumerate() {
            if let Some(config) = &output.postgres {
                let name = output.name.as_deref().unwrap_or_default();
                let sink = PostgresSink::connect(&topology.name, name, config)?;
                // The outputs commit together, each in a transaction of its own: two writing one
                // table would wait on each other's rows (validation compares only the names).
                if let Some((_, other)) = sinks
                    .postgres
                    .iter()
                    .find(|(_, s)| s.writes() == sink.writes())
                {
                    let cause = PostgresError::Schema(format!(
                        "writes `{}` as output `{}` does; one output per table",
                        sink.writes(),
                        other.output()
                    ));
                    return Err(SinkError::new(name, None, cause));
                }
                sinks.postgres.push((index, sink));
            }
        }
        Ok(sinks)
    }

    pub fn is_empty(&self) -> bool {
        self.postgres.is_empty()
    }

    /// Stages what the pipeline made of one consumed record (pairs of output index and
    /// record) in the sinks of those outputs.
    pub fn stage(&mut self, produced: &[(usize, Record)]) -> Result<(), SinkError> {
        let mut failed = None;
        'sinks: for (index, sink) in &mut self.postgres {
            for (_, record) in produced.iter().filter(|(i, _)| i == index) {
                if let Err(e) = sink.stage(record) {
                    failed = Some((e.at_output(*index), record.origin.clone()));
                    break 'sinks;
                }
            }
        }
        match failed {
            None => Ok(()),
            Some((e, origin)) => {
                // Whatever the other sinks took of this record goes too: a record is written
                // whole or not at all.
                self.discard_record(&origin);
                Err(e)
            }
        }
    }

    /// Whether a sink holds a full batch: the transaction should commit.
    pub fn is_full(&self) -> bool {
        self.postgres.iter().any(|(_, s)| s.is_full())
    }

    /// Writes and commits what every sink staged, retrying transient errors until
    /// `deadline`. Called right before the Kafka transaction commits.
    ///
    /// Every sink applies its batch first, each in a database transaction left open, and
    /// only then do they commit: a record one output refuses leaves nothing in the others.
    /// (A failure between two of the commits is one of the crashes the inboxes absorb: the
    /// Kafka transaction does not commit, and the batch comes again.)
    pub fn flush(&mut self, deadline: Instant) -> Result<(), SinkError> {
        let failed = self
            .postgres
            .iter_mut()
            .find_map(|(index, sink)| sink.apply(deadline).err().map(|e| e.at_output(*index)));
        if let Some(e) = failed {
            // Rolls back what the others applied: the Kafka transaction aborts too.
            self.discard();
            return Err(e);
        }
        for (index, sink) in &mut self.postgres {
            if sink.commit().map_err(|e| e.at_output(*index))? {
                self.db_commits += 1;
                if self.exit_after_db_commit == Some(self.db_commits) {
                    telemetry::failpoint_exit_after_db_commit(self.db_commits);
                    std::process::abort();
                }
            }
        }
        Ok(())
    }

    /// Forgets everything staged: the Kafka transaction aborted and the records come again.
    pub fn discard(&mut self) {
        for (_, sink) in &mut self.postgres {
            sink.discard();
        }
    }

    /// Forgets what was staged for one consumed record, keeping the rest.
    pub fn discard_record(&mut self, origin: &Origin) {
        for (_, sink) in &mut self.postgres {
            sink.discard_record(origin);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_its_cap_and_stops_at_the_deadline() {
        let mut b = Backoff::default();
        let far = Instant::now() + Duration::from_secs(3600);
        let delays: Vec<u128> = (0..8)
            .map(|_| b.next_delay(far).unwrap().as_millis())
            .collect();
        assert_eq!(delays, vec![50, 100, 200, 400, 800, 1600, 2000, 2000]);
        assert_eq!(b.attempt(), 8);
        assert_eq!(b.next_delay(Instant::now() + Duration::from_secs(1)), None);
    }

    #[test]
    fn a_permanent_error_names_the_record() {
        let e = SinkError::new(
            "orders_db",
            Some(Origin {
                topic: "orders".into(),
                partition: 3,
                offset: 42,
            }),
            PostgresError::Record(postgres::RecordError::NotAnObject("a number".into())),
        );
        assert_eq!(e.kind, SinkErrorKind::Permanent);
        let text = e.to_string();
        assert!(
            text.starts_with("postgres output `orders_db`: record orders[3]@42: the value is not a JSON object: a number"),
            "{text}"
        );
        assert!(
            text.contains("nothing of this batch was committed"),
            "{text}"
        );
    }
}
