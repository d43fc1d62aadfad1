//! Outputs that cannot join a Kafka transaction, and so must be idempotent: applying a record
//! once or ten times leaves the same state.
//!
//! A [`Sink`] stages records, applies a batch (left open) and commits it. Each sink of a job
//! is one [participant](crate::txn::Participant) of its transactions: the transaction owner
//! stages every record the pipeline makes for the sink's output, and when the Kafka
//! transaction commits, every sink applies its batch first, then every one commits, and only
//! then are the consumed offsets committed. A crash between the two replays the batch, and
//! each sink absorbs the replay (the PostgreSQL sink through its inbox table). An aborted
//! Kafka transaction discards what was staged; the records come again after the rewind.
//!
//! Errors carry what to do about them ([`SinkErrorKind`]): transient ones are retried with
//! backoff within the transaction's time; a permanent one is a record's fault and names it,
//! and the record then goes the way `runtime.on_error` says (by default to the dead-letter
//! topic, [`SinkError::failure`]); a fatal one stops the job.

pub mod http;
pub mod postgres;

use std::time::Instant;

use crate::record::{ErrorKind, Origin, Record, RecordError, Stage};
use crate::topology::{Target, Topology};
pub use crate::txn::Severity as SinkErrorKind;
use crate::txn::{Failure, Participant, ParticipantError, Refusal};
use http::HttpSink;
use postgres::{PostgresError, PostgresSink};

/// An output outside Kafka.
pub trait Sink: Send {
    /// Stages a record; a permanent error names a record that can never be written.
    fn stage(&mut self, record: &Record) -> Result<(), SinkError>;
    /// Forgets what was staged for one consumed record.
    fn discard_record(&mut self, origin: &Origin);
    /// Whether the staged batch is full.
    fn is_full(&self) -> bool;
    /// Applies the staged batch and leaves it open, retrying transient errors until
    /// `deadline`; returns whether there was anything to apply.
    fn apply(&mut self, deadline: Instant) -> Result<bool, SinkError>;
    /// Commits the applied batch; returns whether there was one.
    fn commit(&mut self) -> Result<bool, SinkError>;
    /// Forgets the staged batch, rolling back what was applied.
    fn discard(&mut self);
}

/// What a sink's own error says of itself.
pub trait SinkCause: std::error::Error + Send + Sync + 'static {
    /// The kind of sink, for messages: `postgres`, `http`.
    fn sink(&self) -> &'static str;
    fn severity(&self) -> SinkErrorKind;
    /// The failure of the record at fault, when the error is permanent: a row the database
    /// refused is `rejected`; a value that cannot become a row is `wrong_type` or
    /// `missing_field`, as it would be in the pipeline.
    fn record_kind(&self) -> ErrorKind;
}

/// A sink failed; `origin` names the record at fault when the error is permanent.
#[derive(Debug, thiserror::Error)]
#[error("{} output `{output}`{}: {cause}{}", .cause.sink(), at(.origin), advice(*.kind, .origin.is_some()))]
pub struct SinkError {
    pub kind: SinkErrorKind,
    /// The output's name in the topology.
    pub output: String,
    /// The output's index in the topology, when known.
    pub index: Option<u32>,
    /// The consumed record at fault.
    pub origin: Option<Origin>,
    /// What went wrong (already part of the message, so not repeated as its source).
    pub cause: Box<dyn SinkCause>,
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
    pub fn new(output: &str, origin: Option<Origin>, cause: impl SinkCause) -> SinkError {
        SinkError {
            kind: cause.severity(),
            output: output.to_string(),
            index: None,
            origin,
            cause: Box::new(cause),
            also: Vec::new(),
        }
    }

    fn at_output(mut self, index: usize) -> SinkError {
        let index = u32::try_from(index).ok();
        self.index = index;
        for other in &mut self.also {
            other.index = index;
        }
        self
    }

    /// This error and the others of its batch.
    pub fn all(&self) -> impl Iterator<Item = &SinkError> {
        std::iter::once(self).chain(&self.also)
    }

    /// The record's failure, as the engine handles a record the pipeline could not process.
    pub fn failure(&self) -> RecordError {
        RecordError {
            kind: self.cause.record_kind(),
            stage: Stage::Output {
                index: self.index.unwrap_or_default() as usize,
                name: self.output.clone(),
            },
            message: self.cause.to_string(),
        }
    }
}

impl Failure for SinkError {
    fn severity(&self) -> SinkErrorKind {
        self.kind
    }

    fn refusals(&self) -> Vec<Refusal> {
        self.all()
            .map(|e| Refusal {
                origin: e.origin.clone(),
                failure: e.failure(),
                by: e.cause.sink(),
            })
            .collect()
    }
}

/// One sink of a job: the output at `index` of the topology, a participant of every
/// transaction.
pub struct SinkOutput {
    index: usize,
    sink: Box<dyn Sink>,
}

impl SinkOutput {
    pub fn new(index: usize, sink: Box<dyn Sink>) -> SinkOutput {
        SinkOutput { index, sink }
    }
}

fn boxed(e: SinkError) -> ParticipantError {
    Box::new(e)
}

impl Participant for SinkOutput {
    fn stage(&mut self, produced: &[(usize, Record)]) -> Result<(), ParticipantError> {
        for (_, record) in produced.iter().filter(|(i, _)| *i == self.index) {
            self.sink
                .stage(record)
                .map_err(|e| boxed(e.at_output(self.index)))?;
        }
        Ok(())
    }

    fn discard_record(&mut self, origin: &Origin) {
        self.sink.discard_record(origin);
    }

    fn is_full(&self) -> bool {
        self.sink.is_full()
    }

    fn prepare(&mut self, deadline: Instant) -> Result<(), ParticipantError> {
        self.sink
            .apply(deadline)
            .map(|_| ())
            .map_err(|e| boxed(e.at_output(self.index)))
    }

    fn commit(&mut self) -> Result<bool, ParticipantError> {
        self.sink
            .commit()
            .map_err(|e| boxed(e.at_output(self.index)))
    }

    fn discard(&mut self) {
        self.sink.discard();
    }
}

/// The sinks of one job.
#[derive(Default)]
pub struct Sinks {
    outputs: Vec<SinkOutput>,
}

impl Sinks {
    /// Connects every sink output of the topology (creating inbox tables if missing) and
    /// builds the HTTP clients.
    pub fn from_topology(topology: &Topology) -> Result<Sinks, SinkError> {
        let mut sinks = Sinks::default();
        let mut tables: Vec<(String, &str)> = Vec::new();
        for (index, output) in topology.outputs.iter().enumerate() {
            if let Some(Target::Http(config)) = output.target() {
                let name = output.name.as_deref().unwrap_or_default();
                let sink = HttpSink::new(&topology.name, name, config)?;
                sinks.outputs.push(SinkOutput::new(index, Box::new(sink)));
            }
            if let Some(Target::Postgres(config)) = output.target() {
                let name = output.name.as_deref().unwrap_or_default();
                let sink = PostgresSink::connect(&topology.name, name, config)?;
                // The outputs commit together, each in a transaction of its own: two writing one
                // table would wait on each other's rows (validation compares only the names).
                let writes = sink.writes();
                if let Some((_, other)) = tables.iter().find(|(w, _)| *w == writes) {
                    let cause = PostgresError::Schema(format!(
                        "writes `{}` as output `{}` does; one output per table",
                        sink.writes(),
                        other
                    ));
                    return Err(SinkError::new(name, None, cause));
                }
                tables.push((writes, name));
                sinks.outputs.push(SinkOutput::new(index, Box::new(sink)));
            }
        }
        Ok(sinks)
    }

    pub fn is_empty(&self) -> bool {
        self.outputs.is_empty()
    }

    /// The sinks as participants of the job's transactions.
    pub fn into_participants(self) -> Vec<Box<dyn Participant>> {
        self.outputs
            .into_iter()
            .map(|o| Box::new(o) as Box<dyn Participant>)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
