//! The topology file: what a job reads, how it transforms records and where it writes them.
//!
//! Every struct refuses unknown fields, every default comes from a named function, and
//! [`Topology::validate`] reports every problem at once with the path of the field it concerns.
//! The language is described in `docs/topology.md`.
//!
//! * [`env`](mod@env): `${VAR}` interpolation of the text, before parsing;
//! * [`file_schema`]: the JSON Schema of the file (`onceflow schema`), from these types;
//! * [`lines`]: the line number of every field path, for messages;
//! * [`parse`]: parsing that goes on past a problem, to report every one;
//! * [`processor`]: the processors of a pipeline, as written in the file;
//! * `runtime`: when a transaction commits and what becomes of a failing record
//!   ([`Runtime`]);
//! * [`state`], [`time`]: the stateful steps, and their event time (windows, `delay`);
//! * [`avro`], [`http`], [`outbox`], [`postgres`]: the sections of Avro, HTTP outputs, outbox
//!   inputs and PostgreSQL outputs, each with the checks of its own fields;
//! * `check`: the checks of a whole topology ([`Topology::validate`]).
//!
//! Expressions are compiled (and their problems found) by
//! [`crate::transform::Pipeline::compile`]; [`crate::load`] puts both together.

pub mod env;
pub mod file_schema;
pub mod lines;
pub mod parse;
pub mod processor;

mod check;
mod runtime;
pub mod state;
pub mod time;

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use processor::{ExplodeConfig, Processor, RouteConfig, RouteMode, RouteRule, SetHeaderConfig};
pub use runtime::{GroupProtocol, Guarantee, OnError, OnExhausted, Runtime, StateStore};
pub use state::{
    AggregateConfig, AggregateOp, DedupeConfig, Emit, JoinConfig, OnMiss, StoreSource,
};
pub use time::{DelayConfig, Late, WindowConfig, WindowKind, WindowSpec};

pub mod avro;
pub mod http;
pub mod outbox;
pub mod postgres;
pub mod schemas;
pub use avro::{AvroInput, AvroOutput, SchemaRegistry, SchemaSource, SubjectStrategy};
pub use http::HttpOutput;
pub use outbox::OutboxInput;
pub use postgres::PostgresOutput;
pub use schemas::{JsonSchemaOutput, ProtobufOutput};

impl Topology {
    /// The producer's `message.max.bytes`: a larger record fails at send, for good.
    pub fn max_message_bytes(&self) -> usize {
        let k = &self.kafka;
        k.producer
            .get("message.max.bytes")
            .or_else(|| k.common.get("message.max.bytes"))
            .and_then(|v| v.parse().ok())
            .unwrap_or(1_000_000)
    }
}

/// Client settings that exactly-once depends on. onceflow sets them itself and refuses any
/// attempt to override them from a topology or a config file.
pub const PROTECTED_CLIENT_SETTINGS: &[&str] = &[
    "isolation.level",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "transactional.id",
    "enable.idempotence",
    "group.id",
    "group.instance.id",
    "bootstrap.servers",
];

/// The header whose value names a message across systems, when producers set it: the event
/// id of a consumed record unless its input names another (`id_header`).
pub const MESSAGE_ID_HEADER: &str = "message-id";

/// One stream job: inputs, an ordered pipeline of processors, and outputs.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Topology {
    /// Name of the job; part of the consumer group id and of the transactional id, so it must
    /// stay the same across restarts and deploys.
    pub name: String,
    /// Consumer group shared by every instance of this job. Default: `onceflow.<name>`.
    #[serde(default)]
    pub group_id: Option<String>,
    /// Topics the job consumes (read_committed, offsets committed in the output transaction).
    pub inputs: Vec<Input>,
    /// Processors applied in order to every record.
    #[serde(default)]
    pub pipeline: Vec<Processor>,
    /// Where the job writes: a Kafka topic (inside its transactions) and/or PostgreSQL tables.
    /// Only an outbox relay may have none (it routes by aggregate type).
    #[serde(default)]
    pub outputs: Vec<Output>,
    /// Transaction and commit settings.
    #[serde(default)]
    pub runtime: Runtime,
    /// Kafka client settings.
    #[serde(default)]
    pub kafka: KafkaSettings,
    /// Where records the pipeline fails on go (with `runtime.on_error: dead_letter`).
    #[serde(default)]
    pub dead_letter: DeadLetter,
    /// The schema registry of Avro, Protobuf and JSON Schema inputs and outputs.
    #[serde(default)]
    pub schema_registry: Option<SchemaRegistry>,
    /// The directory of the topology file (set by [`crate::load::load`]): files the topology
    /// names (schemas) are relative to it.
    #[serde(skip)]
    pub dir: Option<std::path::PathBuf>,
}

/// The dead-letter topic, written in the same transaction as the outputs.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeadLetter {
    /// Topic name. Default: `<name>.dlq`.
    #[serde(default)]
    pub topic: Option<String>,
}

/// A consumed topic, or an outbox table.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(try_from = "InputFile")]
pub struct Input {
    /// Topic name (empty for a `postgres_outbox` input: exactly one of the two is given).
    pub topic: String,
    /// A PostgreSQL outbox table relayed to Kafka (see [`OutboxInput`]); the only input of
    /// its topology.
    pub postgres_outbox: Option<OutboxInput>,
    /// How record values of this topic are decoded. Default: `raw`.
    #[serde(default)]
    pub codec: Codec,
    /// The reader schema of an `avro` input.
    pub avro: Option<AvroInput>,
    /// How record keys of this topic are decoded for expressions (`key`): `raw` (default:
    /// bytes), `json` or `avro` (the key's writer schema from the registry). The key bytes
    /// themselves pass to the outputs unchanged unless an output or `set_key` makes another.
    pub key_codec: Codec,
    /// The header whose value is a consumed record's event id, written to its outputs and
    /// dead letters as `onceflow.origin.id` when the record carries it. Default: `message-id`.
    pub id_header: String,
}

impl Input {
    /// The topic records of this input come from: the topic, or `postgres:<table>` for an
    /// outbox.
    pub fn source_name(&self) -> String {
        match &self.postgres_outbox {
            Some(o) => outbox::origin_topic(&o.table),
            None => self.topic.clone(),
        }
    }
}

/// An input as the file gives it: a `topic` is required unless a `postgres_outbox` is given.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("anyOf" = [{"required": ["topic"]}, {"required": ["postgres_outbox"]}]))]
struct InputFile {
    /// The topic consumed. Exactly one of `topic` and `postgres_outbox`.
    #[serde(default)]
    topic: Option<String>,
    /// A PostgreSQL outbox table relayed to Kafka; the only input of its topology.
    #[serde(default)]
    postgres_outbox: Option<OutboxInput>,
    /// How record values are decoded: `raw` (default), `json`, `avro`, `protobuf` or
    /// `json_schema`.
    #[serde(default)]
    codec: Codec,
    /// The reader schema of an `avro` input.
    #[serde(default)]
    avro: Option<AvroInput>,
    /// How record keys are decoded for expressions (`key`): `raw` (default: bytes), `json` or
    /// `avro` (the key's writer schema from the registry).
    #[serde(default)]
    key_codec: Codec,
    /// The header whose value is a consumed record's event id (written to its outputs and
    /// dead letters as `onceflow.origin.id`).
    #[serde(default = "default_id_header")]
    id_header: String,
}

impl TryFrom<InputFile> for Input {
    type Error = String;

    fn try_from(f: InputFile) -> Result<Input, String> {
        match (f.topic, f.postgres_outbox) {
            // Worded as serde words it, so that the problem is named at `inputs[i].topic`.
            (None, None) => Err("missing field `topic`".into()),
            (topic, postgres_outbox) => Ok(Input {
                topic: topic.unwrap_or_default(),
                postgres_outbox,
                codec: f.codec,
                avro: f.avro,
                key_codec: f.key_codec,
                id_header: f.id_header,
            }),
        }
    }
}

/// How a record value is read or written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Codec {
    /// Bytes as they are. Expressions see the value as `bytes`.
    #[default]
    Raw,
    /// A JSON document, decoded once per record and encoded once per output record.
    Json,
    /// Avro in the Confluent wire format, with a schema registry (`schema_registry`): decoded
    /// to the same document as JSON.
    Avro,
    /// Protobuf in the Confluent wire format, with a schema registry: decoded to the same
    /// document as JSON (protobuf's JSON mapping).
    Protobuf,
    /// JSON in the Confluent wire format, checked against a JSON Schema from the registry on
    /// output.
    JsonSchema,
}

impl Codec {
    /// The name used in topology files.
    pub fn name(self) -> &'static str {
        match self {
            Codec::Raw => "raw",
            Codec::Json => "json",
            Codec::Avro => "avro",
            Codec::Protobuf => "protobuf",
            Codec::JsonSchema => "json_schema",
        }
    }

    /// Whether values are documents (JSON and the registry's formats).
    pub fn is_document(self) -> bool {
        !matches!(self, Codec::Raw)
    }

    /// Whether values are in the Confluent wire format, with a schema registry.
    pub fn uses_registry(self) -> bool {
        matches!(self, Codec::Avro | Codec::Protobuf | Codec::JsonSchema)
    }
}

/// Where records go: exactly one of `topic`, `postgres` or `http`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Output {
    /// Name by which `route` refers to this output. Default: the topic name.
    #[serde(default)]
    pub name: Option<String>,
    /// A Kafka topic written inside the job's transactions.
    #[serde(default)]
    pub topic: Option<String>,
    /// A PostgreSQL table, upserted by id, once in effect (see [`PostgresOutput`]). A
    /// `postgres` output needs a `name`: it keys the output's inbox.
    #[serde(default)]
    pub postgres: Option<PostgresOutput>,
    /// An HTTP endpoint called once per record with an idempotency key (see
    /// [`HttpOutput`]). An `http` output needs a `name`.
    #[serde(default)]
    pub http: Option<HttpOutput>,
    /// How values are written. Default: `json` when every input is a document (any codec
    /// but `raw`), `raw` otherwise.
    #[serde(default)]
    pub codec: Option<Codec>,
    /// The schema and subject of an `avro` output.
    #[serde(default)]
    pub avro: Option<AvroOutput>,
    /// The schema, message and subject of a `protobuf` output.
    #[serde(default)]
    pub protobuf: Option<ProtobufOutput>,
    /// The schema and subject of a `json_schema` output.
    #[serde(default)]
    pub json_schema: Option<JsonSchemaOutput>,
    /// How keys are written: `raw` (default: the key bytes), `json` or `avro` (with
    /// `key_avro`'s schema, subject `<topic>-key`). With `json` or `avro` the key is a value:
    /// the output's `key` expression's, else the input's decoded key (its `key_codec`), else
    /// the key bytes as a string.
    #[serde(default)]
    pub key_codec: Option<Codec>,
    /// The schema and subject of an `avro` key.
    #[serde(default)]
    pub key_avro: Option<AvroOutput>,
    /// A CEL expression giving the key of records written here (it replaces the key the
    /// record carries). Default: the record's key, as set by `set_key` or consumed.
    #[serde(default)]
    pub key: Option<String>,
    /// Whether headers are written (`keep`) or left out (`drop`). Default: `keep`.
    #[serde(default)]
    pub headers: HeaderPolicy,
    /// Accept an output that no `route` names (otherwise an error: it would stay empty).
    #[serde(default = "default_allow_unused")]
    pub allow_unused: bool,
    /// Whether records written to this topic carry their origin in `onceflow.origin.*`
    /// headers (topic, partition, offset and event id; see [`crate::lineage`]), whatever
    /// `headers` says. `onceflow reconcile` checks only outputs with lineage. Default: `true`.
    #[serde(default = "default_lineage")]
    pub lineage: bool,
}

/// What happens to record headers on an output.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum HeaderPolicy {
    /// Write every header the record carries.
    #[default]
    Keep,
    /// Write no header.
    Drop,
}

fn default_allow_unused() -> bool {
    false
}

fn default_lineage() -> bool {
    true
}

/// The header naming a consumed record's event id, unless an input says otherwise.
fn default_id_header() -> String {
    MESSAGE_ID_HEADER.to_string()
}

/// Where an output writes, as code reads it: the file's `topic`, `postgres` and `http`
/// options made one choice (see [`Output::target`]).
#[derive(Debug, Clone, Copy)]
pub enum Target<'a> {
    /// A Kafka topic, written inside the job's transactions.
    Topic(&'a str),
    /// A PostgreSQL table.
    Postgres(&'a PostgresOutput),
    /// An HTTP endpoint.
    Http(&'a HttpOutput),
}

impl Output {
    /// The name `route` uses for this output.
    pub fn name(&self) -> &str {
        self.name
            .as_deref()
            .or(self.topic.as_deref())
            .unwrap_or_default()
    }

    /// Where this output writes. The file keeps `topic`, `postgres` and `http` as options, so
    /// that [`Topology::validate`] reports every problem of a file at once with its field
    /// path (a choice made while parsing would stop at the first); this is the one choice
    /// they make. `None` only for a file that failed validation (neither or both given).
    pub fn target(&self) -> Option<Target<'_>> {
        match (&self.topic, &self.postgres, &self.http) {
            (Some(topic), None, None) => Some(Target::Topic(topic)),
            (None, Some(postgres), None) => Some(Target::Postgres(postgres)),
            (None, None, Some(http)) => Some(Target::Http(http)),
            _ => None,
        }
    }
}

/// Kafka client settings. The bootstrap servers given on the command line win over the file.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KafkaSettings {
    /// Comma-separated `host:port` list.
    #[serde(default)]
    pub bootstrap_servers: Option<String>,
    /// Extra librdkafka settings for both clients (security, timeouts, ...).
    #[serde(default)]
    pub common: BTreeMap<String, String>,
    /// Extra librdkafka settings for the consumer only.
    #[serde(default)]
    pub consumer: BTreeMap<String, String>,
    /// Extra librdkafka settings for the producer only.
    #[serde(default)]
    pub producer: BTreeMap<String, String>,
}

/// A problem in a topology file, with the path of the field it concerns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigIssue {
    /// Dotted path of the field, e.g. `runtime.commit_interval_ms`.
    pub path: String,
    /// What is wrong and what to do.
    pub message: String,
}

impl std::fmt::Display for ConfigIssue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// Why topology text could not be made a topology: it does not parse, or it is not valid.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    #[error("{path}: {message}")]
    Parse { path: String, message: String },
    #[error("{path}: {} problem(s):\n{}", issues.len(), issues.iter().map(|i| format!("  - {i}")).collect::<Vec<_>>().join("\n"))]
    Invalid {
        path: String,
        issues: Vec<ConfigIssue>,
    },
}

impl Topology {
    /// Parses topology text (already interpolated) without validating it.
    pub fn parse_unchecked(text: &str) -> Result<Topology, serde_saphyr::Error> {
        serde_saphyr::from_str(text)
    }

    /// Parses and validates topology text (already interpolated); `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Topology, TopologyError> {
        let topology: Topology = Self::parse_unchecked(text).map_err(|e| TopologyError::Parse {
            path: origin.to_string(),
            message: e.to_string(),
        })?;
        let issues = topology.validate();
        if issues.is_empty() {
            Ok(topology)
        } else {
            Err(TopologyError::Invalid {
                path: origin.to_string(),
                issues,
            })
        }
    }

    /// The outbox this topology relays, when its input is a `postgres_outbox`.
    pub fn outbox(&self) -> Option<&OutboxInput> {
        self.inputs.iter().find_map(|i| i.postgres_outbox.as_ref())
    }

    /// Whether every input is decoded to a document (JSON, Avro, Protobuf, JSON Schema).
    pub fn document_inputs(&self) -> bool {
        !self.inputs.is_empty() && self.inputs.iter().all(|i| i.codec.is_document())
    }

    /// The codec output `index` writes with: its own, or `json` when every input is a
    /// document.
    pub fn output_codec(&self, index: usize) -> Codec {
        self.outputs
            .get(index)
            .and_then(|o| o.codec)
            .unwrap_or(if self.document_inputs() {
                Codec::Json
            } else {
                Codec::Raw
            })
    }

    /// The dead-letter topic of this job.
    pub fn dead_letter_topic(&self) -> String {
        self.dead_letter
            .topic
            .clone()
            .unwrap_or_else(|| format!("{}.dlq", self.name))
    }

    /// The consumer group of every instance of this job.
    pub fn group_id(&self) -> String {
        self.group_id
            .clone()
            .unwrap_or_else(|| format!("onceflow.{}", self.name))
    }

    /// The output topic names, for display: one per output, in the order of `outputs` (the
    /// pipeline's output indexes), empty for an output that is not a Kafka topic
    /// (`postgres`). Code that acts on outputs reads [`Output::target`], or
    /// [`Topology::kafka_output_topics`] for the topics alone.
    pub fn output_topics(&self) -> Vec<&str> {
        self.outputs
            .iter()
            .map(|o| o.topic.as_deref().unwrap_or_default())
            .collect()
    }

    /// The topics of the outputs that are Kafka topics, in the order of `outputs`.
    pub fn kafka_output_topics(&self) -> Vec<&str> {
        self.outputs
            .iter()
            .filter_map(|o| match o.target() {
                Some(Target::Topic(topic)) => Some(topic),
                _ => None,
            })
            .collect()
    }

    /// The input topic names.
    pub fn input_topics(&self) -> Vec<&str> {
        self.inputs
            .iter()
            .filter(|i| i.postgres_outbox.is_none())
            .map(|i| i.topic.as_str())
            .collect()
    }

    /// The `postgres` outputs with their names (validated: present and unique).
    pub fn postgres_outputs(&self) -> impl Iterator<Item = (&str, &PostgresOutput)> {
        self.outputs
            .iter()
            .filter_map(|o| Some((o.name.as_deref().unwrap_or(""), o.postgres.as_ref()?)))
    }
}

/// A dotted path into a JSON object: `a`, `a.b_c`, `customer.id`.
pub fn is_field_path(path: &str) -> bool {
    !path.is_empty() && path.split('.').all(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = "name: t\ninputs: [{topic: in}]\noutputs: [{topic: out}]\n";

    #[test]
    fn minimal_topology_gets_defaults() {
        let t = Topology::parse(MINIMAL, "t.yaml").unwrap();
        assert_eq!(t.runtime.commit_interval_ms, 100);
        assert_eq!(t.runtime.transaction_timeout_ms, 10_000);
        assert_eq!(t.group_id(), "onceflow.t");
        assert_eq!(t.output_topics(), vec!["out"]);
        assert_eq!(t.runtime.on_error, OnError::DeadLetter);
        assert_eq!(t.dead_letter_topic(), "t.dlq");
        assert_eq!(t.runtime.max_attempts, 3);
        assert_eq!(t.output_codec(0), Codec::Raw);
    }

    #[test]
    fn unknown_field_is_refused_with_its_name() {
        let text = format!("{MINIMAL}runtime: {{commit_interval: 5}}\n");
        let err = Topology::parse(&text, "t.yaml").unwrap_err().to_string();
        assert!(err.contains("commit_interval"), "{err}");
        assert!(err.contains("t.yaml"), "{err}");
    }

    #[test]
    fn lineage_is_on_by_default_and_the_event_id_header_is_message_id() {
        let t = Topology::parse(MINIMAL, "t.yaml").unwrap();
        assert!(t.outputs[0].lineage);
        assert_eq!(t.inputs[0].id_header, "message-id");
        let text = "name: t\ninputs: [{topic: in, id_header: event-id}]\noutputs: [{topic: out, lineage: false, headers: drop}]\n";
        let t = Topology::parse(text, "t.yaml").unwrap();
        assert!(!t.outputs[0].lineage);
        assert_eq!(t.inputs[0].id_header, "event-id");
    }
}
