//! The Protobuf and JSON Schema settings of an output: its schema and subject (see
//! [`crate::codec::protobuf`] and [`crate::codec::json_schema`]). Their inputs need none: a
//! value names its writer's schema by id.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value as Json;

use super::SubjectStrategy;

/// A `protobuf` output's settings.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProtobufOutput {
    /// The `.proto` text records are written with (or `schema_file`): required.
    #[serde(default)]
    pub schema: Option<String>,
    /// The `.proto` file, relative to the topology, instead of inline.
    #[serde(default)]
    pub schema_file: Option<String>,
    /// The message of the schema records are written as (its full name, or its name within
    /// the file's package). Default: the file's first message.
    #[serde(default)]
    pub message: Option<String>,
    /// The files the schema imports, by the name it imports each with, each a `.proto` file
    /// relative to the topology. Default: found by their import names under the directory of
    /// `schema_file` or the nearest of its parents that has them (as `protoc -I` would with
    /// it). Registered before the schema, each under its import name as its subject
    /// (Confluent's default for references). `google/protobuf/*` are built in.
    #[serde(default)]
    pub imports: BTreeMap<String, String>,
    /// How the subject is named: `topic_name` (default, `<topic>-value`), `record_name` (the
    /// message's full name) or `topic_record_name`.
    #[serde(default)]
    pub subject_strategy: SubjectStrategy,
    /// Register the schema under its subject at start (default). `false`: the subject must
    /// have a version with this schema already.
    #[serde(default = "default_auto_register")]
    pub auto_register: bool,
}

/// A `json_schema` output's settings.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JsonSchemaOutput {
    /// The JSON Schema values are checked against and registered with (inline: a mapping or
    /// its JSON text; or `schema_file`): required.
    #[serde(default)]
    pub schema: Option<Json>,
    /// The schema in a file, relative to the topology, instead of inline.
    #[serde(default)]
    pub schema_file: Option<String>,
    /// How the subject is named, as for Avro; the record name strategies use the schema's
    /// `title`.
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

/// `file` relative to the topology's directory `dir`.
pub fn resolve(dir: Option<&Path>, file: &str) -> PathBuf {
    match dir {
        Some(d) if Path::new(file).is_relative() => d.join(file),
        _ => Path::new(file).to_path_buf(),
    }
}

/// The text of `file` (relative to `dir`).
pub fn read_text(dir: Option<&Path>, file: &str) -> Result<String, String> {
    let path = resolve(dir, file);
    std::fs::read_to_string(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

impl ProtobufOutput {
    /// The schema's text, read from its file if it is in one.
    pub fn text(&self, dir: Option<&Path>) -> Result<String, String> {
        match (&self.schema, &self.schema_file) {
            (Some(text), None) => Ok(text.clone()),
            (None, Some(file)) => read_text(dir, file),
            _ => Err("needs exactly one of `schema` and `schema_file`".into()),
        }
    }
}

impl JsonSchemaOutput {
    /// The schema, read from its file if it is in one.
    pub fn json(&self, dir: Option<&Path>) -> Result<Json, String> {
        let source = super::SchemaSource {
            schema: self.schema.clone(),
            schema_file: self.schema_file.clone(),
        };
        source
            .json(dir)?
            .ok_or_else(|| "needs exactly one of `schema` and `schema_file`".into())
    }

    /// The schema's `title`: its record name for the subject strategies.
    pub fn title(schema: &Json) -> Option<&str> {
        schema.get("title").and_then(Json::as_str)
    }
}
