//! The topology file: what a job reads, how it transforms records and where it writes them.
//!
//! Every struct refuses unknown fields, every default comes from a named function, and
//! [`Topology::validate`] reports every problem at once with the path of the field it concerns.
//! The language is described in `docs/topology.md`.
//!
//! * [`env`]: `${VAR}` interpolation of the text, before parsing;
//! * [`lines`]: the line number of every field path, for messages;
//! * [`processor`]: the processors of a pipeline, as written in the file.
//!
//! Expressions are compiled (and their problems found) by
//! [`crate::transform::Pipeline::compile`]; [`crate::validate`] puts both together.

pub mod env;
pub mod lines;
pub mod parse;
pub mod processor;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::Deserialize;

pub use processor::{ExplodeConfig, Processor, RouteConfig, RouteMode, RouteRule, SetHeaderConfig};

pub mod avro;
pub mod http;
pub mod outbox;
pub mod postgres;
pub use avro::{AvroInput, AvroOutput, SchemaRegistry, SchemaSource, SubjectStrategy};
pub use http::HttpOutput;
pub use outbox::OutboxInput;
pub use postgres::PostgresOutput;

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
#[derive(Debug, Clone, Deserialize)]
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
    /// The schema registry of Avro inputs and outputs.
    #[serde(default)]
    pub schema_registry: Option<SchemaRegistry>,
    /// The directory of the topology file (set by [`Topology::load`]): files the topology
    /// names (schemas) are relative to it.
    #[serde(skip)]
    pub dir: Option<std::path::PathBuf>,
}

/// The dead-letter topic, written in the same transaction as the outputs.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeadLetter {
    /// Topic name. Default: `<name>.dlq`.
    #[serde(default)]
    pub topic: Option<String>,
}

/// A consumed topic, or an outbox table.
#[derive(Debug, Clone, Deserialize)]
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
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct InputFile {
    #[serde(default)]
    topic: Option<String>,
    #[serde(default)]
    postgres_outbox: Option<OutboxInput>,
    #[serde(default)]
    codec: Codec,
    #[serde(default)]
    avro: Option<AvroInput>,
    #[serde(default)]
    key_codec: Codec,
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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
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
}

impl Codec {
    /// The name used in topology files.
    pub fn name(self) -> &'static str {
        match self {
            Codec::Raw => "raw",
            Codec::Json => "json",
            Codec::Avro => "avro",
        }
    }
}

/// Where records go: exactly one of `topic`, `postgres` or `http`.
#[derive(Debug, Clone, Deserialize)]
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
    /// How values are written. Default: `json` when every input is a document (JSON or
    /// Avro), `raw` otherwise.
    #[serde(default)]
    pub codec: Option<Codec>,
    /// The schema and subject of an `avro` output.
    #[serde(default)]
    pub avro: Option<AvroOutput>,
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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
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

/// What the job does with a record the pipeline cannot process (value not valid JSON, an
/// expression failing on it: missing field, wrong type).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnError {
    /// Write the record to the dead-letter topic, in the same transaction as the outputs and
    /// the offsets, with headers saying what failed, where and when.
    #[default]
    DeadLetter,
    /// Abort the open transaction, rewind, and stop with an error naming the record's origin.
    /// Nothing is lost: the record's offset is never committed.
    Fail,
    /// Commit the record's offset without output, log it with its origin and count it.
    Skip,
}

/// What happens to a record whose transient failure outlasts its attempts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnExhausted {
    /// Handle it as `on_error` says (by default: the dead-letter topic).
    #[default]
    DeadLetter,
    /// Pause its partition, keep the transaction clean, and try it again later.
    Pause,
}

/// When a transaction commits, and how long it may stay open.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Runtime {
    /// Commit the open transaction after this many milliseconds.
    #[serde(default = "default_commit_interval_ms")]
    pub commit_interval_ms: u64,
    /// ... or once it holds this many consumed records, whichever comes first.
    #[serde(default = "default_max_records_per_txn")]
    pub max_records_per_txn: u64,
    /// ... or once it holds this many produced bytes.
    #[serde(default = "default_max_bytes_per_txn")]
    pub max_bytes_per_txn: u64,
    /// `transaction.timeout.ms` of the producer: the broker aborts a transaction left open
    /// longer than this (for example by a dead instance that never comes back).
    #[serde(default = "default_transaction_timeout_ms")]
    pub transaction_timeout_ms: u64,
    /// Use static group membership (`group.instance.id` = instance id): a restarted instance
    /// gets its partitions back at once, without a rebalance of the whole group.
    #[serde(default = "default_static_membership")]
    pub static_membership: bool,
    /// Consumer `session.timeout.ms`: how long a dead instance keeps its partitions.
    #[serde(default = "default_session_timeout_ms")]
    pub session_timeout_ms: u64,
    /// What to do with a record the pipeline fails on for good: `dead_letter` (default),
    /// `fail` (stop) or `skip` (log, count, commit its offset without output).
    #[serde(default)]
    pub on_error: OnError,
    /// Attempts at a record whose failure is transient (the first included) before it is
    /// handled as `on_error` says.
    #[serde(default = "default_max_attempts")]
    pub max_attempts: u32,
    /// When the attempts at a transiently failing record run out: `dead_letter` (default, as
    /// `on_error` says) or `pause` (commit what is open, pause the record's partition for
    /// `retry_backoff_max_ms`, then try the record again; other partitions keep flowing).
    #[serde(default)]
    pub on_exhausted: OnExhausted,
    /// Delay before the second attempt; it doubles up to `retry_backoff_max_ms`, with jitter.
    #[serde(default = "default_retry_backoff_ms")]
    pub retry_backoff_ms: u64,
    /// Cap of the delay between attempts.
    #[serde(default = "default_retry_backoff_max_ms")]
    pub retry_backoff_max_ms: u64,
    /// `exactly_once` (default): outputs and offsets commit in one Kafka transaction.
    /// `at_least_once`: no transactions; offsets are committed after every output is
    /// acknowledged, so a crash may write some outputs twice. For comparison and for sinks
    /// that are idempotent anyway.
    #[serde(default)]
    pub guarantee: Guarantee,
    /// The consumer group protocol: `classic` (default; cooperative-sticky assignment,
    /// `session_timeout_ms` from here) or `consumer` (KIP-848, brokers 4.0+: the broker
    /// assigns partitions and owns the session timeout, `group.consumer.session.timeout.ms`;
    /// with static membership a second member with a live member's instance id is refused,
    /// instead of fencing the first).
    #[serde(default)]
    pub group_protocol: GroupProtocol,
    /// Go on consuming and processing while a transaction commits (exactly-once jobs whose
    /// outputs are all Kafka topics; the others commit between records anyway). What is
    /// processed meanwhile goes into the next transaction. Off by default: measured against
    /// a broker on the same machine it gained nothing (the wait for the last deliveries, which
    /// it cannot shorten, is most of a commit) and cost CPU (docs/benchmarks.md); it may pay
    /// where the round trips to the coordinators are long.
    #[serde(default = "default_overlap_commits")]
    pub overlap_commits: bool,
}

/// The consumer group protocol of a job.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupProtocol {
    #[default]
    Classic,
    Consumer,
}

/// The delivery guarantee of a job.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Guarantee {
    #[default]
    ExactlyOnce,
    AtLeastOnce,
}

fn default_max_attempts() -> u32 {
    3
}
fn default_retry_backoff_ms() -> u64 {
    100
}
fn default_retry_backoff_max_ms() -> u64 {
    5_000
}
fn default_commit_interval_ms() -> u64 {
    100
}
fn default_max_records_per_txn() -> u64 {
    10_000
}
fn default_max_bytes_per_txn() -> u64 {
    16 * 1024 * 1024
}
fn default_transaction_timeout_ms() -> u64 {
    10_000
}
fn default_static_membership() -> bool {
    true
}
fn default_session_timeout_ms() -> u64 {
    45_000
}
fn default_overlap_commits() -> bool {
    false
}

impl Default for Runtime {
    fn default() -> Self {
        Runtime {
            commit_interval_ms: default_commit_interval_ms(),
            max_records_per_txn: default_max_records_per_txn(),
            max_bytes_per_txn: default_max_bytes_per_txn(),
            transaction_timeout_ms: default_transaction_timeout_ms(),
            static_membership: default_static_membership(),
            session_timeout_ms: default_session_timeout_ms(),
            guarantee: Guarantee::default(),
            group_protocol: GroupProtocol::default(),
            overlap_commits: default_overlap_commits(),
            on_error: OnError::default(),
            max_attempts: default_max_attempts(),
            on_exhausted: OnExhausted::default(),
            retry_backoff_ms: default_retry_backoff_ms(),
            retry_backoff_max_ms: default_retry_backoff_max_ms(),
        }
    }
}

/// Kafka client settings. The bootstrap servers given on the command line win over the file.
#[derive(Debug, Clone, Default, Deserialize)]
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

/// Why a topology could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: String, message: String },
    #[error("{path}: {} environment problem(s):\n{}", issues.len(), issues.iter().map(|i| format!("  - {i}")).collect::<Vec<_>>().join("\n"))]
    Env {
        path: String,
        issues: Vec<env::EnvIssue>,
    },
    #[error("{path}: {} problem(s):\n{}", issues.len(), issues.iter().map(|i| format!("  - {i}")).collect::<Vec<_>>().join("\n"))]
    Invalid {
        path: String,
        issues: Vec<ConfigIssue>,
    },
}

impl Topology {
    /// Reads a topology file, interpolates the environment into it, parses and validates it.
    pub fn load(path: &Path) -> Result<Topology, TopologyError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| TopologyError::Read {
            path: shown.clone(),
            source,
        })?;
        let (text, issues) = env::interpolate(
            &text,
            &|name| std::env::var(name).ok(),
            env::Strictness::Strict,
        );
        if !issues.is_empty() {
            return Err(TopologyError::Env {
                path: shown,
                issues,
            });
        }
        let mut topology = Self::parse(&text, &shown)?;
        topology.dir = path.parent().map(Path::to_path_buf);
        Ok(topology)
    }

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

    /// Every problem in the topology, each with its field path; empty when it is valid.
    pub fn validate(&self) -> Vec<ConfigIssue> {
        let mut issues = Vec::new();
        let mut issue = |path: String, message: &str| {
            issues.push(ConfigIssue {
                path,
                message: message.to_string(),
            })
        };
        self.validate_name(&mut issue);
        self.validate_inputs(&mut issue);
        self.validate_outputs(&mut issue);
        self.validate_pipeline(&mut issue);
        for i in self.validate_postgres_outputs() {
            issue(i.path, &i.message);
        }
        self.validate_limits(&mut issue);
        self.validate_dead_letter(&mut issue);
        self.validate_transaction_timeout(&mut issue);
        self.validate_client_settings(&mut issue);
        self.validate_avro(&mut issue);
        issues
    }

    /// Avro inputs and outputs, and their registry. The schemas themselves are parsed when
    /// the pipeline is compiled ([`crate::codec::avro`]).
    fn validate_avro(&self, issue: &mut dyn FnMut(String, &str)) {
        let mut uses_avro = false;
        for (i, input) in self.inputs.iter().enumerate() {
            uses_avro |= input.codec == Codec::Avro || input.key_codec == Codec::Avro;
            if input.avro.is_some() && input.codec != Codec::Avro {
                issue(
                    format!("inputs[{i}].avro"),
                    "is for `codec: avro` inputs only",
                );
            }
            if let Some(a) = &input.avro
                && a.reader_schema.is_some()
                && a.reader_schema_file.is_some()
            {
                issue(
                    format!("inputs[{i}].avro"),
                    "give `reader_schema` or `reader_schema_file`, not both",
                );
            }
        }
        for (o, output) in self.outputs.iter().enumerate() {
            for (codec, settings, field, codec_field) in [
                (output.codec, &output.avro, "avro", "codec"),
                (output.key_codec, &output.key_avro, "key_avro", "key_codec"),
            ] {
                let avro = codec == Some(Codec::Avro);
                uses_avro |= avro;
                let at = format!("outputs[{o}].{field}");
                match (settings, avro) {
                    (Some(_), false) => {
                        issue(at, &format!("is for `{codec_field}: avro` outputs only"))
                    }
                    (None, true) => issue(
                        at,
                        &format!(
                            "Avro needs its schema: `{field}: {{schema: ...}}` or `{field}: {{schema_file: ...}}`"
                        ),
                    ),
                    (Some(a), true) => {
                        if a.schema.is_some() == a.schema_file.is_some() {
                            issue(at, "needs exactly one of `schema` and `schema_file`");
                        }
                        if output.topic.is_none() {
                            issue(
                                format!("outputs[{o}].{codec_field}"),
                                "`avro` is for Kafka topic outputs",
                            );
                        }
                    }
                    (None, false) => {}
                }
            }
        }
        match &self.schema_registry {
            Some(r) => {
                let mut found = Vec::new();
                avro::validate_registry(r, &mut found);
                for i in found {
                    issue(i.path, &i.message);
                }
            }
            None if uses_avro => issue(
                "schema_registry".into(),
                "Avro inputs and outputs need a schema registry: `schema_registry: {url: ...}`",
            ),
            None => {}
        }
    }

    /// The job's name.
    fn validate_name(&self, issue: &mut dyn FnMut(String, &str)) {
        if !is_valid_name(&self.name) {
            issue(
                "name".into(),
                "must be 1-100 characters of [A-Za-z0-9._-]; it is part of the transactional id",
            );
        }
    }

    /// The input topics.
    fn validate_inputs(&self, issue: &mut dyn FnMut(String, &str)) {
        if self.inputs.is_empty() {
            issue("inputs".into(), "at least one input topic is needed");
        }
        for (i, input) in self.inputs.iter().enumerate() {
            if input.id_header.is_empty() {
                issue(format!("inputs[{i}].id_header"), "must not be empty");
            }
            match &input.postgres_outbox {
                None if input.topic.trim().is_empty() => {
                    issue(format!("inputs[{i}].topic"), "must not be empty");
                }
                None => {}
                Some(_) if !input.topic.is_empty() => issue(
                    format!("inputs[{i}]"),
                    "needs exactly one of `topic` and `postgres_outbox`",
                ),
                Some(outbox) => {
                    if self.inputs.len() > 1 {
                        issue(
                            format!("inputs[{i}].postgres_outbox"),
                            "must be the only input of its topology (a relay is a job of its own)",
                        );
                    }
                    if input.codec != Codec::Json {
                        issue(
                            format!("inputs[{i}].codec"),
                            "must be `json` for a `postgres_outbox` input (its payloads are JSON)",
                        );
                    }
                    for i in outbox.validate(&format!("inputs[{i}].postgres_outbox")) {
                        issue(i.path, &i.message);
                    }
                    if self.outputs.is_empty() && !self.pipeline.is_empty() {
                        issue(
                            "pipeline".into(),
                            "a relay without outputs publishes rows as they are (to `topic_prefix` + aggregate type): give outputs to transform them",
                        );
                    }
                    for (o, output) in self.outputs.iter().enumerate() {
                        if output.postgres.is_some() || output.http.is_some() {
                            issue(
                                format!("outputs[{o}]"),
                                "a relay writes Kafka topics only (`topic`)",
                            );
                        }
                    }
                }
            }
        }
    }

    /// The outbox this topology relays, when its input is a `postgres_outbox`.
    pub fn outbox(&self) -> Option<&OutboxInput> {
        self.inputs.iter().find_map(|i| i.postgres_outbox.as_ref())
    }

    /// That there are outputs; the topics and names of topic outputs.
    fn validate_outputs(&self, issue: &mut dyn FnMut(String, &str)) {
        if self.outputs.is_empty() && self.outbox().is_none() {
            issue("outputs".into(), "at least one output is needed");
        }
        let mut names = BTreeSet::new();
        for (i, output) in self.outputs.iter().enumerate() {
            let Some(topic) = &output.topic else {
                if !output.lineage {
                    issue(
                        format!("outputs[{i}].lineage"),
                        "is for Kafka topic outputs (a PostgreSQL output's inbox always records the origin)",
                    );
                }
                continue;
            };
            if topic.trim().is_empty() {
                issue(format!("outputs[{i}].topic"), "must not be empty");
            }
            if self.inputs.iter().any(|input| &input.topic == topic) {
                issue(
                    format!("outputs[{i}].topic"),
                    "must differ from every input topic (the job would consume its own output)",
                );
            }
            if !names.insert(output.name()) {
                issue(
                    format!("outputs[{i}].name"),
                    "another output has the same name (the name defaults to the topic)",
                );
            }
        }
    }

    /// The limits of a transaction and of the attempts at a record.
    fn validate_limits(&self, issue: &mut dyn FnMut(String, &str)) {
        let rt = &self.runtime;
        if rt.commit_interval_ms == 0 {
            issue("runtime.commit_interval_ms".into(), "must be at least 1");
        }
        if rt.max_records_per_txn == 0 {
            issue("runtime.max_records_per_txn".into(), "must be at least 1");
        }
        if rt.max_attempts == 0 {
            issue("runtime.max_attempts".into(), "must be at least 1");
        }
        if rt.retry_backoff_ms > rt.retry_backoff_max_ms {
            issue(
                "runtime.retry_backoff_ms".into(),
                "must not exceed runtime.retry_backoff_max_ms",
            );
        }
    }

    /// The dead-letter topic.
    fn validate_dead_letter(&self, issue: &mut dyn FnMut(String, &str)) {
        let dlq = self.dead_letter_topic();
        if self.inputs.iter().any(|i| i.topic == dlq) {
            issue(
                "dead_letter.topic".into(),
                "must differ from every input topic (failed records would come back forever)",
            );
        }
    }

    /// The transaction timeout, alone and against the commit interval.
    fn validate_transaction_timeout(&self, issue: &mut dyn FnMut(String, &str)) {
        let rt = &self.runtime;
        if rt.transaction_timeout_ms < 1000 {
            issue(
                "runtime.transaction_timeout_ms".into(),
                "must be at least 1000",
            );
        }
        if rt.transaction_timeout_ms <= rt.commit_interval_ms {
            issue(
                "runtime.transaction_timeout_ms".into(),
                "must be greater than runtime.commit_interval_ms, or every transaction times out before it commits",
            );
        } else if rt.commit_interval_ms.saturating_mul(5) > rt.transaction_timeout_ms {
            issue(
                "runtime.commit_interval_ms".into(),
                "must be at most a fifth of runtime.transaction_timeout_ms, or transactions time out before they commit",
            );
        }
    }

    /// The Kafka client settings: none that onceflow sets itself.
    fn validate_client_settings(&self, issue: &mut dyn FnMut(String, &str)) {
        for (section, map) in [
            ("common", &self.kafka.common),
            ("consumer", &self.kafka.consumer),
            ("producer", &self.kafka.producer),
        ] {
            for (key, value) in map {
                let path = format!("kafka.{section}.{key}");
                if PROTECTED_CLIENT_SETTINGS.contains(&key.as_str()) {
                    issue(
                        path,
                        "is set by onceflow for exactly-once and cannot be overridden",
                    );
                } else if section != "consumer"
                    && let Some(message) = idempotence_needs(key, value)
                {
                    issue(path, message);
                }
            }
        }
    }

    /// Checks of the pipeline that need no expression compiled: JSON-only processors on raw
    /// inputs, `route` placement, and the wiring of routes to outputs.
    fn validate_pipeline(&self, issue: &mut dyn FnMut(String, &str)) {
        let document_inputs = self.document_inputs();
        let mut routed: BTreeSet<&str> = BTreeSet::new();
        let mut routes = 0;
        for (i, p) in self.pipeline.iter().enumerate() {
            let here = format!("pipeline[{i}].{}", p.kind());
            if p.needs_json() && !document_inputs {
                issue(
                    here.clone(),
                    "works on JSON values: set `codec: json` on every input",
                );
            }
            match p {
                Processor::Route(route) => {
                    routes += 1;
                    self.validate_route(i, &here, route, &mut routed, issue);
                }
                _ => validate_processor(&here, p, issue),
            }
        }
        self.validate_routing(routes, &routed, issue);
    }

    /// The `route` processor `route`, the `i`th of the pipeline, found at `here`; adds the
    /// outputs it names to `routed`.
    fn validate_route<'a>(
        &'a self,
        i: usize,
        here: &str,
        route: &'a RouteConfig,
        routed: &mut BTreeSet<&'a str>,
        issue: &mut dyn FnMut(String, &str),
    ) {
        if i + 1 != self.pipeline.len() {
            issue(
                here.to_string(),
                "must be the last processor: it hands records to the outputs",
            );
        }
        if route.routes.is_empty() {
            issue(format!("{here}.routes"), "needs at least one route");
        }
        let mut targets: Vec<(String, &String)> = Vec::new();
        for (r, rule) in route.routes.iter().enumerate() {
            for (t, name) in rule.to.iter().enumerate() {
                targets.push((format!("{here}.routes[{r}].to[{t}]"), name));
            }
        }
        for (t, name) in route.default.iter().enumerate() {
            targets.push((format!("{here}.default[{t}]"), name));
        }
        for (path, name) in targets {
            if self.outputs.iter().any(|o| o.name() == name) {
                routed.insert(name);
            } else {
                let known: Vec<&str> = self.outputs.iter().map(Output::name).collect();
                issue(
                    path,
                    &format!("no output is named `{name}` (outputs: {known:?})"),
                );
            }
        }
        for (r, rule) in route.routes.iter().enumerate() {
            if rule.to.is_empty() {
                issue(
                    format!("{here}.routes[{r}].to"),
                    "names no output (drop records with `filter` instead)",
                );
            }
        }
    }

    /// How many `route` processors there are (`routes`), and that every output is `routed`
    /// when there is one.
    fn validate_routing(
        &self,
        routes: usize,
        routed: &BTreeSet<&str>,
        issue: &mut dyn FnMut(String, &str),
    ) {
        if routes > 1 {
            issue(
                "pipeline".into(),
                "at most one `route` processor (it must be the last one)",
            );
        }
        if routes == 0 {
            if self.outputs.len() > 1 {
                issue(
                    "outputs".into(),
                    "several outputs need a `route` processor at the end of the pipeline to say which records go where",
                );
            }
        } else {
            for (i, output) in self.outputs.iter().enumerate() {
                if !output.allow_unused && !routed.contains(output.name()) {
                    issue(
                        format!("outputs[{i}]"),
                        &format!(
                            "output `{}` is named by no route: it would stay empty (remove it, route to it, or set `allow_unused: true`)",
                            output.name()
                        ),
                    );
                }
            }
        }
    }

    /// Whether every input is decoded to a document (JSON or Avro).
    pub fn document_inputs(&self) -> bool {
        !self.inputs.is_empty()
            && self
                .inputs
                .iter()
                .all(|i| matches!(i.codec, Codec::Json | Codec::Avro))
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
}

/// Checks of processor `p` (any but `route`, see [`Topology::validate_pipeline`]), found at
/// `here`.
fn validate_processor(here: &str, p: &Processor, issue: &mut dyn FnMut(String, &str)) {
    match p {
        Processor::SetHeader(h) => {
            if h.value.is_some() == h.expr.is_some() {
                issue(here.to_string(), "needs exactly one of `value` and `expr`");
            }
            if h.name.is_empty() {
                issue(format!("{here}.name"), "must not be empty");
            }
        }
        Processor::DropFields(fields) => {
            for (f, field) in fields.iter().enumerate() {
                if !is_field_path(field) {
                    issue(format!("{here}[{f}]"), FIELD_PATH_RULE);
                }
            }
        }
        Processor::Rename(map) => {
            for (from, to) in map {
                if !is_field_path(from) || !is_field_path(to) {
                    issue(format!("{here}.{from}"), FIELD_PATH_RULE);
                }
            }
        }
        Processor::Map(map) => {
            for field in map.keys() {
                if !is_field_path(field) {
                    issue(format!("{here}.{field}"), FIELD_PATH_RULE);
                }
            }
        }
        Processor::Explode(e) => {
            if !is_field_path(&e.field) {
                issue(format!("{here}.field"), FIELD_PATH_RULE);
            }
            if e.into.as_deref().is_some_and(|f| !is_field_path(f)) {
                issue(format!("{here}.as"), FIELD_PATH_RULE);
            }
        }
        Processor::Route(_)
        | Processor::Filter(_)
        | Processor::SetKey(_)
        | Processor::DropEmpty {} => {}
    }
}

const FIELD_PATH_RULE: &str =
    "a field path is one or more names separated by dots, e.g. `customer.id`";

/// A dotted path into a JSON object: `a`, `a.b_c`, `customer.id`.
pub fn is_field_path(path: &str) -> bool {
    !path.is_empty() && path.split('.').all(|s| !s.is_empty())
}

// --- PostgreSQL outputs -------------------------------------------------------------------

impl Topology {
    /// The `postgres` outputs with their names (validated: present and unique).
    pub fn postgres_outputs(&self) -> impl Iterator<Item = (&str, &PostgresOutput)> {
        self.outputs
            .iter()
            .filter_map(|o| Some((o.name.as_deref().unwrap_or(""), o.postgres.as_ref()?)))
    }

    /// Problems of the outputs' shapes and of every `postgres` and `http` section.
    fn validate_postgres_outputs(&self) -> Vec<ConfigIssue> {
        let mut issues = Vec::new();
        for (i, output) in self.outputs.iter().enumerate() {
            let at = format!("outputs[{i}]");
            let given = [
                output.topic.is_some(),
                output.postgres.is_some(),
                output.http.is_some(),
            ];
            if given.iter().filter(|g| **g).count() != 1 {
                issues.push(ConfigIssue {
                    path: at.clone(),
                    message: "needs exactly one of `topic`, `postgres` or `http`".into(),
                });
            }
            if let Some(http) = &output.http {
                self.validate_sink_name(
                    i,
                    "an http output needs a name of 1-100 characters of [A-Za-z0-9._-]",
                    &mut issues,
                );
                http.validate(&format!("{at}.http"), &mut issues);
            }
            let Some(pg) = &output.postgres else {
                continue;
            };
            self.validate_sink_name(i, "a postgres output needs a name of 1-100 characters of [A-Za-z0-9._-]; it keys the output's inbox, so keep it stable", &mut issues);
            // Each output applies its batch in a database transaction of its own, and all of
            // them commit together: two writing one table would wait on each other's rows.
            if self.outputs[..i].iter().any(|o| {
                o.postgres
                    .as_ref()
                    .is_some_and(|p| p.url_env == pg.url_env && p.table == pg.table)
            }) {
                issues.push(ConfigIssue {
                    path: format!("{at}.postgres.table"),
                    message: format!(
                        "another postgres output writes `{}` through `{}` too; one output per table (its `columns` can take every field needed)",
                        pg.table, pg.url_env
                    ),
                });
            }
            pg.validate(&format!("{at}.postgres"), &mut issues);
        }
        issues
    }
}

impl Topology {
    /// The name of the sink output at `i`: given, valid and unique.
    fn validate_sink_name(&self, i: usize, rule: &str, issues: &mut Vec<ConfigIssue>) {
        let path = format!("outputs[{i}].name");
        match self.outputs[i].name.as_deref() {
            Some(name) if is_valid_name(name) => {
                if self.outputs[..i]
                    .iter()
                    .any(|o| o.name.as_deref() == Some(name))
                {
                    issues.push(ConfigIssue {
                        path,
                        message: format!("`{name}` names another output too"),
                    });
                }
            }
            _ => issues.push(ConfigIssue {
                path,
                message: rule.to_string(),
            }),
        }
    }
}

/// What the idempotent (and transactional) producer needs of a setting, when `value` does
/// not give it: every record on all in-sync replicas before it counts, and at most 5
/// requests in flight per connection, so that retries keep the order and never duplicate.
fn idempotence_needs(key: &str, value: &str) -> Option<&'static str> {
    match key {
        "acks" | "request.required.acks" if !matches!(value.trim(), "all" | "-1") => Some(
            "must be `all` (or -1): exactly-once needs every record on all in-sync replicas before it counts; leave it unset",
        ),
        "max.in.flight.requests.per.connection" | "max.in.flight"
            if value.trim().parse::<u64>().is_ok_and(|n| n > 5) =>
        {
            Some(
                "must be at most 5: more requests in flight per connection break the idempotent producer's ordering and deduplication; leave it unset",
            )
        }
        _ => None,
    }
}

fn is_valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 100
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
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
    fn every_problem_is_reported_at_once_with_its_path() {
        let text = "name: 'bad name'\ninputs: []\noutputs: [{topic: ''}]\n\
                    runtime: {commit_interval_ms: 5000, transaction_timeout_ms: 10000}\n\
                    kafka: {consumer: {isolation.level: read_uncommitted}, producer: {transactional.id: x}}\n";
        let Err(TopologyError::Invalid { issues, .. }) = Topology::parse(text, "t.yaml") else {
            panic!("expected validation errors");
        };
        let paths: Vec<&str> = issues.iter().map(|i| i.path.as_str()).collect();
        assert_eq!(
            paths,
            vec![
                "name",
                "inputs",
                "outputs[0].topic",
                "runtime.commit_interval_ms",
                "kafka.consumer.isolation.level",
                "kafka.producer.transactional.id",
            ]
        );
    }

    #[test]
    fn routes_must_name_existing_outputs_and_use_every_output() {
        let text = "name: t\ninputs: [{topic: in, codec: json}]\n\
                    pipeline:\n  - route:\n      routes:\n        - {when: 'true', to: [a, nope]}\n      default: [b]\n\
                    outputs: [{topic: a}, {topic: b}, {topic: c}, {topic: d, allow_unused: true}]\n";
        let Err(TopologyError::Invalid { issues, .. }) = Topology::parse(text, "t.yaml") else {
            panic!("expected validation errors");
        };
        let paths: Vec<&str> = issues.iter().map(|i| i.path.as_str()).collect();
        assert_eq!(
            paths,
            vec!["pipeline[0].route.routes[0].to[1]", "outputs[2]"]
        );
    }

    #[test]
    fn several_outputs_need_a_route_and_json_processors_need_json_inputs() {
        let text = "name: t\ninputs: [{topic: in}]\npipeline: [{drop_fields: [a]}]\n\
                    outputs: [{topic: a}, {topic: b}]\nruntime: {commit_interval_ms: 2000, transaction_timeout_ms: 2000}\n";
        let Err(TopologyError::Invalid { issues, .. }) = Topology::parse(text, "t.yaml") else {
            panic!("expected validation errors");
        };
        let paths: Vec<&str> = issues.iter().map(|i| i.path.as_str()).collect();
        assert_eq!(
            paths,
            vec![
                "pipeline[0].drop_fields",
                "outputs",
                "runtime.transaction_timeout_ms"
            ]
        );
    }

    #[test]
    fn output_equal_to_input_is_refused() {
        let text = "name: t\ninputs: [{topic: a}]\noutputs: [{topic: a}]\n";
        let err = Topology::parse(text, "t.yaml").unwrap_err().to_string();
        assert!(err.contains("outputs[0].topic"), "{err}");
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

    #[test]
    fn lineage_settings_are_checked_where_they_are_written() {
        let text = "name: t\ninputs: [{topic: in, id_header: ''}]\npipeline:\n  - route: {routes: [{when: 'true', to: [out, db]}], default: []}\noutputs:\n  - topic: out\n  - name: db\n    lineage: false\n    postgres: {url_env: U, table: t, id_columns: [id], columns: {id: id}}\n";
        let err = Topology::parse(text, "t.yaml").unwrap_err().to_string();
        assert!(err.contains("inputs[0].id_header"), "{err}");
        assert!(err.contains("outputs[1].lineage"), "{err}");
        assert!(!err.contains("outputs[0].lineage"), "{err}");
    }
}

#[cfg(test)]
mod postgres_tests {
    use super::*;

    const PG: &str = "name: t\ninputs: [{topic: in}]\noutputs:\n  - name: orders_db\n    postgres:\n      url_env: ORDERS_DB_URL\n      table: sales.orders\n      id_columns: [id]\n      version_column: version\n      columns: {id: id, version: meta.version, name: customer.name, k: $key}\n      delete_when: deleted\n";

    #[test]
    fn a_postgres_output_gets_defaults() {
        let t = Topology::parse(PG, "t.yaml").unwrap();
        assert_eq!(t.output_topics(), vec![""]);
        let (name, pg) = t.postgres_outputs().next().unwrap();
        assert_eq!(name, "orders_db");
        assert_eq!(pg.batch_size, 5_000);
        assert_eq!(pg.inbox_table, "onceflow_inbox");
        assert_eq!(pg.inbox_retention_hours, 168);
        assert_eq!(pg.columns["version"], "meta.version");
    }

    #[test]
    fn a_topic_and_a_postgres_output_go_together() {
        let text = PG.replace(
            "outputs:\n",
            "pipeline:\n  - route: {routes: [{when: 'true', to: [out, orders_db]}], default: [out]}\noutputs:\n  - topic: out\n",
        );
        let t = Topology::parse(&text, "t.yaml").unwrap();
        assert_eq!(t.output_topics(), vec!["out", ""]);
        assert_eq!(t.postgres_outputs().count(), 1);
    }

    #[test]
    fn each_output_has_one_target_and_only_topics_are_kafka_outputs() {
        let text = PG.replace(
            "outputs:\n",
            "pipeline:\n  - route: {routes: [{when: 'true', to: [out, orders_db]}], default: [out]}\noutputs:\n  - topic: out\n",
        );
        let t = Topology::parse(&text, "t.yaml").unwrap();
        assert!(matches!(t.outputs[0].target(), Some(Target::Topic("out"))));
        assert!(
            matches!(t.outputs[1].target(), Some(Target::Postgres(pg)) if pg.table == "sales.orders")
        );
        assert_eq!(t.kafka_output_topics(), vec!["out"]);

        let both = "name: t\ninputs: [{topic: in}]\noutputs:\n  - topic: a\n    postgres: {url_env: U, table: t, id_columns: [id], columns: {id: id}}\n  - {}\n";
        let t = Topology::parse_unchecked(both).unwrap();
        assert!(t.outputs.iter().all(|o| o.target().is_none()));
        assert!(t.kafka_output_topics().is_empty());
    }

    #[test]
    fn two_postgres_outputs_may_not_write_one_table() {
        let second = "  - name: again\n    postgres:\n      url_env: ORDERS_DB_URL\n      table: sales.orders\n      id_columns: [id]\n      columns: {id: id}\n";
        let text = format!("{PG}{second}").replace(
            "outputs:\n",
            "pipeline:\n  - route: {routes: [{when: 'true', to: [orders_db, again]}], default: [again]}\noutputs:\n",
        );
        let issues = Topology::parse(&text, "t.yaml").unwrap_err().to_string();
        assert!(
            issues.contains(
                "outputs[1].postgres.table: another postgres output writes `sales.orders`"
            ),
            "{issues}"
        );
    }

    #[test]
    fn every_postgres_problem_is_reported_with_its_path() {
        let text = "name: t\ninputs: [{topic: in}]\noutputs:\n  - topic: a\n    postgres: {url_env: U, table: t, id_columns: [id], columns: {id: id}}\n  - {}\n  - topic: b\n  - postgres:\n      url_env: 'no way'\n      table: 'a.b.c'\n      id_columns: [id, x, id]\n      version_column: v\n      columns: {id: id, n: $nope, $bad: x}\n      increment_columns: [n, id]\n      batch_size: 0\n      event_id: {field: ''}\n";
        let Err(TopologyError::Invalid { issues, .. }) = Topology::parse(text, "t.yaml") else {
            panic!("expected validation errors");
        };
        let paths: Vec<&str> = issues.iter().map(|i| i.path.as_str()).collect();
        assert_eq!(
            paths,
            vec![
                "outputs",
                "outputs[0]",
                "outputs[0].name",
                "outputs[1]",
                "outputs[3].name",
                "outputs[3].postgres.url_env",
                "outputs[3].postgres.table",
                "outputs[3].postgres.columns.$bad",
                "outputs[3].postgres.columns.n",
                "outputs[3].postgres.id_columns[1]",
                "outputs[3].postgres.id_columns[2]",
                "outputs[3].postgres.version_column",
                "outputs[3].postgres.increment_columns[1]",
                "outputs[3].postgres.increment_columns",
                "outputs[3].postgres.event_id.field",
                "outputs[3].postgres.batch_size",
            ],
            "{issues:#?}"
        );
    }

    #[test]
    fn a_sequence_column_is_mapped_and_orders_alone() {
        let base = "name: t\ninputs: [{topic: in}]\noutputs:\n  - name: db\n    postgres:\n      url_env: U\n      table: t\n      id_columns: [id]\n      columns: {id: id, seq: seq, n: n}\n";
        let ok = format!("{base}      sequence_column: seq\n      on_sequence_gap: dead_letter\n");
        let t = Topology::parse(&ok, "t.yaml").unwrap();
        let (_, pg) = t.postgres_outputs().next().unwrap();
        assert_eq!(pg.ordering_column(), Some("seq"));
        assert_eq!(
            pg.on_sequence_gap(),
            super::postgres::OnSequenceGap::DeadLetter
        );
        let issues = |extra: &str| -> Vec<String> {
            match Topology::parse(&format!("{base}{extra}"), "t.yaml") {
                Err(TopologyError::Invalid { issues, .. }) => {
                    issues.iter().map(|i| i.path.clone()).collect()
                }
                other => panic!("expected validation errors: {other:?}"),
            }
        };
        let at = "outputs[0].postgres";
        assert_eq!(
            issues("      sequence_column: seq\n      version_column: n\n"),
            vec![format!("{at}.sequence_column")]
        );
        assert_eq!(
            issues("      sequence_column: nope\n      increment_columns: [n]\n"),
            vec![
                format!("{at}.sequence_column"),
                format!("{at}.sequence_column")
            ]
        );
        assert_eq!(
            issues("      sequence_column: id\n"),
            vec![format!("{at}.sequence_column")]
        );
        assert_eq!(
            issues("      on_sequence_gap: fail\n"),
            vec![format!("{at}.on_sequence_gap")]
        );
        let bad = Topology::parse(
            &format!("{base}      sequence_column: seq\n      on_sequence_gap: skip\n"),
            "t.yaml",
        );
        assert!(bad.is_err());
    }

    #[test]
    fn the_example_topology_is_valid() {
        let text = include_str!("../../topologies/orders-postgres.yaml");
        let t = Topology::parse(text, "topologies/orders-postgres.yaml").unwrap();
        assert_eq!(t.output_topics(), vec!["orders.enriched", ""]);
        assert_eq!(t.postgres_outputs().count(), 1);
    }

    #[test]
    fn postgres_output_names_must_be_unique() {
        let text = format!(
            "{PG}  - name: orders_db\n    postgres: {{url_env: U, table: t, id_columns: [id], columns: {{id: id}}}}\n"
        );
        let err = Topology::parse(&text, "t.yaml").unwrap_err().to_string();
        assert!(err.contains("outputs[1].name"), "{err}");
    }
}

#[cfg(test)]
mod avro_tests {
    use super::*;

    fn issues(yaml: &str) -> Vec<(String, String)> {
        Topology::parse_unchecked(yaml)
            .unwrap()
            .validate()
            .into_iter()
            .map(|i| (i.path, i.message))
            .collect()
    }

    #[test]
    fn avro_settings_are_checked_where_they_are_written() {
        let found = issues(
            "name: t\ninputs: [{topic: in, codec: json, avro: {}}]\noutputs:\n  - {topic: a, codec: avro}\n  - {topic: b, key_avro: {schema: '\"string\"'}}\n  - {name: db, postgres: {url_env: U, table: t, id_columns: [id], columns: {id: id}}, codec: avro, avro: {schema: '\"string\"', schema_file: x.avsc}}\n",
        );
        let paths: Vec<&str> = found.iter().map(|(p, _)| p.as_str()).collect();
        for expected in [
            "inputs[0].avro",
            "outputs[0].avro",
            "outputs[1].key_avro",
            "outputs[2].avro",
            "outputs[2].codec",
            "schema_registry",
        ] {
            assert!(paths.contains(&expected), "{expected} not in {found:?}");
        }
        let registry = issues(
            "name: t\nschema_registry: {url: 'registry:8081', password: p}\ninputs: [{topic: in, codec: avro}]\noutputs: [{topic: out}]\n",
        );
        let paths: Vec<&str> = registry.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(paths, ["schema_registry.url", "schema_registry.password"]);
    }
}
