//! The Avro settings of a topology: its schema registry, an input's reader schema, an
//! output's schema and subject (see [`crate::codec::avro`]).

use std::path::Path;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use super::ConfigIssue;

/// A Confluent-compatible schema registry (`url` ends with the API root: for Apicurio,
/// `.../apis/ccompat/v7`). Values may use `${VAR}`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SchemaRegistry {
    /// The registry's Confluent-compatible API root, `http://` or `https://`.
    pub url: String,
    /// The user name of basic authentication.
    #[serde(default)]
    pub username: Option<String>,
    /// The password of basic authentication (e.g. `${REGISTRY_PASSWORD}`).
    #[serde(default)]
    pub password: Option<String>,
    /// Timeout of one registry call.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
}

fn default_timeout_ms() -> u64 {
    5_000
}

/// A schema given in the topology: inline (a mapping, or its JSON text) or in a file, relative
/// to the topology file.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SchemaSource {
    #[serde(default)]
    pub schema: Option<Json>,
    #[serde(default)]
    pub schema_file: Option<String>,
}

impl SchemaSource {
    /// The schema's JSON, read from its file if it is in one. `None` when none is given.
    pub fn json(&self, dir: Option<&Path>) -> Result<Option<Json>, String> {
        match (&self.schema, &self.schema_file) {
            (Some(_), Some(_)) => Err("give `schema` or `schema_file`, not both".into()),
            (Some(Json::String(text)), None) => Ok(Some(
                // A JSON text, or a primitive type's name.
                serde_json::from_str(text).unwrap_or_else(|_| Json::String(text.clone())),
            )),
            (Some(json), None) => Ok(Some(json.clone())),
            (None, Some(file)) => {
                let path = match dir {
                    Some(d) if Path::new(file).is_relative() => d.join(file),
                    _ => Path::new(file).to_path_buf(),
                };
                let text = std::fs::read_to_string(&path)
                    .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
                serde_json::from_str(&text)
                    .map(Some)
                    .map_err(|e| format!("{} is not JSON: {e}", path.display()))
            }
            (None, None) => Ok(None),
        }
    }
}

/// An Avro input's settings.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AvroInput {
    /// The schema records are read as: each is resolved from the schema it was written with
    /// (by the id it carries) to this one. Default: read as written.
    #[serde(default)]
    pub reader_schema: Option<Json>,
    /// The reader schema in a file (`.avsc`), relative to the topology, instead of inline.
    #[serde(default)]
    pub reader_schema_file: Option<String>,
}

impl AvroInput {
    pub fn source(&self) -> SchemaSource {
        SchemaSource {
            schema: self.reader_schema.clone(),
            schema_file: self.reader_schema_file.clone(),
        }
    }
}

/// How an output's subject is named.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SubjectStrategy {
    /// `<topic>-value` (`<topic>-key` for keys).
    #[default]
    TopicName,
    /// The record's full name.
    RecordName,
    /// `<topic>-<record full name>`.
    TopicRecordName,
}

impl SubjectStrategy {
    /// The subject of a value (or key) schema named `record` (its full name) written to
    /// `topic`.
    pub fn subject(self, topic: &str, record: Option<&str>, key: bool) -> Result<String, String> {
        let record = || {
            record.ok_or_else(|| {
                "the record name strategies need a named schema (a record, enum or fixed)"
                    .to_string()
            })
        };
        Ok(match self {
            SubjectStrategy::TopicName if key => format!("{topic}-key"),
            SubjectStrategy::TopicName => format!("{topic}-value"),
            SubjectStrategy::RecordName => record()?.to_string(),
            SubjectStrategy::TopicRecordName => format!("{topic}-{}", record()?),
        })
    }
}

/// An Avro output's settings.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AvroOutput {
    /// The schema records are written with (inline, or `schema_file`): required.
    #[serde(default)]
    pub schema: Option<Json>,
    /// The schema in a file (`.avsc`), relative to the topology, instead of inline.
    #[serde(default)]
    pub schema_file: Option<String>,
    /// How the subject is named: `topic_name` (default, `<topic>-value`), `record_name` or
    /// `topic_record_name`.
    #[serde(default)]
    pub subject_strategy: SubjectStrategy,
    /// Register the schema under its subject at start (default). `false`: the subject must
    /// have a version with this schema already.
    #[serde(default = "default_auto_register")]
    pub auto_register: bool,
}

fn default_auto_register() -> bool {
    true
}

impl AvroOutput {
    pub fn source(&self) -> SchemaSource {
        SchemaSource {
            schema: self.schema.clone(),
            schema_file: self.schema_file.clone(),
        }
    }
}

/// Problems of a schema registry's settings.
pub fn validate_registry(r: &SchemaRegistry, issues: &mut Vec<ConfigIssue>) {
    if !(r.url.starts_with("http://") || r.url.starts_with("https://")) {
        issues.push(ConfigIssue {
            path: "schema_registry.url".into(),
            message: format!("`{}` is not an http:// or https:// URL", r.url),
        });
    }
    if r.password.is_some() && r.username.is_none() {
        issues.push(ConfigIssue {
            path: "schema_registry.password".into(),
            message: "a password needs a `username`".into(),
        });
    }
    if r.timeout_ms == 0 {
        issues.push(ConfigIssue {
            path: "schema_registry.timeout_ms".into(),
            message: "must be more than 0".into(),
        });
    }
}
