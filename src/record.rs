//! The record that flows from a source through the pipeline to the sinks, where it came
//! from, and the failure that reaches the engine when a record cannot be processed.
//!
//! These are plain values: every layer (source, codec, transform, sink, transaction owner)
//! speaks them, and none of them knows Kafka client or async types.

use std::sync::Arc;

/// Where a consumed record came from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Origin {
    /// Shared, not copied: every record of a topic names it, and a record's origin is made
    /// and cloned on the hot path (the Kafka source keeps one per topic).
    pub topic: Arc<str>,
    pub partition: i32,
    pub offset: i64,
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}[{}]@{}", self.topic, self.partition, self.offset)
    }
}

/// A record flowing through the pipeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: Vec<(String, Vec<u8>)>,
    /// Milliseconds since the epoch, when the source record had one.
    pub timestamp: Option<i64>,
    pub origin: Origin,
}

/// What kind of failure a record met. Every kind so far is permanent: processing the same
/// record again fails the same way, so it belongs in a dead-letter queue, not in a retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The value is not valid JSON (or not UTF-8 JSON) where JSON is expected.
    BadJson,
    /// An expression or processor needed a field the record does not have.
    MissingField,
    /// A value has the wrong type for what is done with it.
    WrongType,
    /// An expression failed otherwise (division by zero, overflow, a function's error).
    Expression,
    /// The encoded record is larger than the producer may send (`message.max.bytes`).
    TooLarge,
    /// Something the record needs is unavailable for now (a sink, a registry): retry.
    Unavailable,
    /// An output outside Kafka refused the record's row: a constraint it violates, or a value
    /// that does not fit its column.
    Rejected,
    /// An output with `on_sequence_gap: dead_letter` met a sequence that does not follow the
    /// stored one: the sequences between are missing.
    SequenceGap,
    /// A record has nowhere to go: the topic its route names does not exist.
    Unroutable,
    /// The value is not Avro in the Confluent wire format where Avro is expected: a wrong
    /// magic byte, a truncated or corrupt payload, bytes left over after the record.
    BadAvro,
    /// The value is not Protobuf in the Confluent wire format where Protobuf is expected: a
    /// wrong magic byte, a message index the schema does not have, a truncated or corrupt
    /// message.
    BadProtobuf,
    /// The schema id the value names is unknown to the schema registry (it answered 404), or
    /// names a schema of another format than the input's codec, or one that does not compile.
    UnknownSchema,
    /// A value does not fit a schema: an output's (a missing field, a wrong type, an unknown
    /// enum symbol, a JSON Schema's constraint), or the Avro reader schema it must be resolved
    /// to.
    SchemaMismatch,
    /// The schema registry cannot be reached (or refuses the job's credentials) for a schema
    /// the record needs: transient, and never the record's fault, so the record's partition
    /// is held (paused) once its attempts run out instead of dead-lettering it.
    RegistryUnavailable,
    /// A `join` with `on_miss: dead_letter` found no row for the record's key.
    NoMatch,
    /// A windowed `aggregate` with `late: dead_letter` met the record after every window it
    /// falls in had closed.
    Late,
}

impl ErrorKind {
    /// Whether processing the record again would fail again.
    pub fn is_permanent(self) -> bool {
        match self {
            ErrorKind::BadJson
            | ErrorKind::MissingField
            | ErrorKind::WrongType
            | ErrorKind::Expression
            | ErrorKind::TooLarge
            | ErrorKind::Rejected
            | ErrorKind::SequenceGap
            | ErrorKind::Unroutable
            | ErrorKind::BadAvro
            | ErrorKind::BadProtobuf
            | ErrorKind::UnknownSchema
            | ErrorKind::SchemaMismatch
            | ErrorKind::NoMatch
            | ErrorKind::Late => true,
            ErrorKind::Unavailable | ErrorKind::RegistryUnavailable => false,
        }
    }

    /// Whether a transient failure of this kind holds the record's partition at once, without
    /// retries in the job's loop, whatever `runtime.on_exhausted` says: it is not the record's
    /// fault, so dead-lettering it would lose a good record, and what it waits for is asked in
    /// the background while the other partitions flow.
    pub fn holds_partition(self) -> bool {
        self == ErrorKind::RegistryUnavailable
    }

    /// A short, bounded name (for logs and metric labels).
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::BadJson => "bad_json",
            ErrorKind::MissingField => "missing_field",
            ErrorKind::WrongType => "wrong_type",
            ErrorKind::Expression => "expression",
            ErrorKind::TooLarge => "too_large",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Rejected => "rejected",
            ErrorKind::SequenceGap => "sequence_gap",
            ErrorKind::Unroutable => "unroutable",
            ErrorKind::BadAvro => "bad_avro",
            ErrorKind::BadProtobuf => "bad_protobuf",
            ErrorKind::UnknownSchema => "unknown_schema",
            ErrorKind::SchemaMismatch => "schema_mismatch",
            ErrorKind::RegistryUnavailable => "registry_unavailable",
            ErrorKind::NoMatch => "no_match",
            ErrorKind::Late => "late",
        }
    }
}

/// Where in the pipeline a record failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stage {
    /// Decoding the consumed value.
    Decode,
    /// The processor at `index` of `pipeline`, of kind `name`.
    Processor { index: usize, name: &'static str },
    /// Writing to output `index` (its key expression or its codec).
    Output { index: usize, name: String },
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stage::Decode => write!(f, "decode"),
            Stage::Processor { index, name } => write!(f, "pipeline[{index}] ({name})"),
            Stage::Output { index, name } => write!(f, "outputs[{index}] ({name})"),
        }
    }
}

/// A processor failed on a record. The record is not lost: the engine decides what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{stage}: {}: {message}", kind.name())]
pub struct RecordError {
    pub kind: ErrorKind,
    pub stage: Stage,
    pub message: String,
}

impl RecordError {
    /// Whether processing the record again would fail again.
    pub fn is_permanent(&self) -> bool {
        self.kind.is_permanent()
    }
}

/// Approximate encoded size of a record: key, value, headers and librdkafka's framing.
pub fn encoded_size(rec: &Record) -> usize {
    const OVERHEAD: usize = 128;
    rec.key.as_ref().map_or(0, Vec::len)
        + rec.value.as_ref().map_or(0, Vec::len)
        + rec
            .headers
            .iter()
            .map(|(k, v)| k.len() + v.len() + 8)
            .sum::<usize>()
        + OVERHEAD
}

/// Refuses outputs too large to send, before any of them is sent: a record either goes out
/// whole or to the dead-letter topic.
pub fn check_sizes(outputs: &[(usize, Record)], max: usize) -> Result<(), RecordError> {
    match outputs.iter().find(|(_, r)| encoded_size(r) > max) {
        None => Ok(()),
        Some((index, r)) => Err(RecordError {
            kind: ErrorKind::TooLarge,
            stage: Stage::Output {
                index: *index,
                name: String::new(),
            },
            message: format!(
                "output of about {} bytes exceeds message.max.bytes ({max})",
                encoded_size(r)
            ),
        }),
    }
}
