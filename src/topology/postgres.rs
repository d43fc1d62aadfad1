//! The `postgres` output of a topology: upsert-by-id into a table, effect-once through an
//! inbox table and version arbitration. The semantics live in [`crate::sink::postgres`];
//! this is the model of the YAML section and its validation.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::ConfigIssue;

/// Writes every record (a JSON object) as a row of a PostgreSQL table, once in effect.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PostgresOutput {
    /// Name of the environment variable that holds the connection URL
    /// (`postgres://user:password@host:port/database?sslmode=verify-full&sslrootcert=ca.pem`),
    /// so no secret sits in the file. TLS follows libpq's `sslmode` ([`crate::pg::tls`]).
    pub url_env: String,
    /// Target table, optionally schema-qualified (`sales.orders`). onceflow never alters it;
    /// it needs a primary key or unique index on exactly `id_columns`.
    pub table: String,
    /// Columns that identify a row (the conflict target of the upsert).
    pub id_columns: Vec<String>,
    /// Column holding the record's version: a row is only overwritten or deleted by a record
    /// with a greater version, so a late older record never overwrites newer state.
    #[serde(default)]
    pub version_column: Option<String>,
    /// Column holding the record's sequence: consecutive integers per id (1, 2, 3...), which
    /// order the records as a version does (an older or equal sequence is ignored) and show
    /// the records missing between two of them. Not combinable with `version_column`.
    #[serde(default)]
    pub sequence_column: Option<String>,
    /// What a sequence that does not follow the stored one does (default `apply`).
    #[serde(default)]
    pub on_sequence_gap: Option<OnSequenceGap>,
    /// Column name -> field path in the record's JSON value (`customer.id` reads a nested
    /// field). `$key`, `$topic`, `$partition`, `$offset` and `$timestamp` read the Kafka
    /// record's key (as text) and coordinates instead. Values are cast by PostgreSQL to the
    /// column's type; a missing field is NULL.
    pub columns: BTreeMap<String, String>,
    /// Columns that are added to the stored value instead of replacing it (counters):
    /// `n = n + EXCLUDED.n`. Not combinable with `version_column` or `delete_when`.
    #[serde(default)]
    pub increment_columns: Vec<String>,
    /// Field path that marks a deletion: a record whose field is present and neither `null`
    /// nor `false` deletes the row (only if the stored version is older, when versioned).
    #[serde(default)]
    pub delete_when: Option<String>,
    /// Where a message's identity for the inbox comes from. Default: its topic, partition and
    /// offset. With an event id, the same event sent twice (on any offset) applies once.
    #[serde(default)]
    pub event_id: Option<EventId>,
    /// The open Kafka transaction commits once this many records are waiting for this
    /// output: the largest batch written in one database transaction.
    #[serde(default = "default_batch_size")]
    pub batch_size: usize,
    /// The inbox table (created if missing), optionally schema-qualified.
    #[serde(default = "default_inbox_table")]
    pub inbox_table: String,
    /// Inbox rows (and deletion markers) older than this are removed. Keep it longer than any
    /// possible redelivery: a message replayed after its inbox row is gone applies again.
    #[serde(default = "default_inbox_retention_hours")]
    pub inbox_retention_hours: u64,
    /// How often the job looks for expired inbox rows; it removes them 1000 at a time.
    #[serde(default = "default_inbox_cleanup_interval_secs")]
    pub inbox_cleanup_interval_secs: u64,
}

/// What a `postgres` output does with a record whose sequence is not the next one of its id
/// (the sequences between are missing).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnSequenceGap {
    /// Apply it, count the missing sequences and log them with the id.
    #[default]
    Apply,
    /// Refuse the record (kind `sequence_gap`): it goes the way `runtime.on_error` says, by
    /// default to the dead-letter topic, and the row stays as it is.
    DeadLetter,
    /// Stop the job naming the record; nothing of its batch commits.
    Fail,
}

impl OnSequenceGap {
    pub fn as_str(self) -> &'static str {
        match self {
            OnSequenceGap::Apply => "apply",
            OnSequenceGap::DeadLetter => "dead_letter",
            OnSequenceGap::Fail => "fail",
        }
    }
}

/// The identity of a message in the inbox, when it is not its Kafka coordinates.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum EventId {
    /// The value of this record header (UTF-8).
    Header(String),
    /// The value at this field path of the record's JSON value.
    Field(String),
}

fn default_batch_size() -> usize {
    5_000
}
pub(super) fn default_inbox_table() -> String {
    "onceflow_inbox".to_string()
}
pub(super) fn default_inbox_retention_hours() -> u64 {
    7 * 24
}
fn default_inbox_cleanup_interval_secs() -> u64 {
    300
}

/// Pseudo-fields that read the Kafka record instead of its JSON value.
pub const RECORD_FIELDS: &[&str] = &["$key", "$topic", "$partition", "$offset", "$timestamp"];

impl PostgresOutput {
    /// The column that orders the records of an id: the version or the sequence column.
    pub fn ordering_column(&self) -> Option<&str> {
        self.version_column
            .as_deref()
            .or(self.sequence_column.as_deref())
    }

    /// What a sequence gap does.
    pub fn on_sequence_gap(&self) -> OnSequenceGap {
        self.on_sequence_gap.unwrap_or_default()
    }

    /// Every problem of this section; `at` is its path (`outputs[2].postgres`).
    pub fn validate(&self, at: &str, issues: &mut Vec<ConfigIssue>) {
        let mut issue = |field: &str, message: String| {
            issues.push(ConfigIssue {
                path: format!("{at}.{field}"),
                message,
            })
        };
        self.validate_names(&mut issue);
        self.validate_columns(&mut issue);
        self.validate_id_columns(&mut issue);
        self.validate_version_column(&mut issue);
        self.validate_sequence_column(&mut issue);
        self.validate_increment_columns(&mut issue);
        self.validate_record_fields(&mut issue);
        self.validate_limits(&mut issue);
    }

    /// The connection's variable and the tables' names.
    fn validate_names(&self, issue: &mut dyn FnMut(&str, String)) {
        if !is_env_name(&self.url_env) {
            issue(
                "url_env",
                "must name an environment variable ([A-Za-z_][A-Za-z0-9_]*) holding the connection URL".into(),
            );
        }
        if !is_table_name(&self.table) {
            issue(
                "table",
                "must be `table` or `schema.table` (no quotes, no spaces)".into(),
            );
        }
        if !is_table_name(&self.inbox_table) {
            issue(
                "inbox_table",
                "must be `table` or `schema.table` (no quotes, no spaces)".into(),
            );
        }
    }

    /// The mapping of columns to fields.
    fn validate_columns(&self, issue: &mut dyn FnMut(&str, String)) {
        if self.columns.is_empty() {
            issue("columns", "map at least the id columns to fields".into());
        }
        for (column, field) in &self.columns {
            if column.is_empty() || column.starts_with('$') {
                issue(
                    &format!("columns.{column}"),
                    "a column name must not be empty nor start with `$`".into(),
                );
            }
            if field.is_empty() || (field.starts_with('$') && !RECORD_FIELDS.contains(&&**field)) {
                issue(
                    &format!("columns.{column}"),
                    format!(
                        "must be a field path of the JSON value or one of {}",
                        RECORD_FIELDS.join(", ")
                    ),
                );
            }
        }
    }

    /// The columns that identify a row.
    fn validate_id_columns(&self, issue: &mut dyn FnMut(&str, String)) {
        if self.id_columns.is_empty() {
            issue("id_columns", "at least one id column is needed".into());
        }
        for (i, column) in self.id_columns.iter().enumerate() {
            if !self.columns.contains_key(column) {
                issue(
                    &format!("id_columns[{i}]"),
                    format!("`{column}` is not mapped in `columns`"),
                );
            }
            if self.id_columns[..i].contains(column) {
                issue(
                    &format!("id_columns[{i}]"),
                    format!("`{column}` is repeated"),
                );
            }
        }
    }

    /// The version column.
    fn validate_version_column(&self, issue: &mut dyn FnMut(&str, String)) {
        if let Some(version) = &self.version_column {
            if !self.columns.contains_key(version) {
                issue(
                    "version_column",
                    format!("`{version}` is not mapped in `columns`"),
                );
            }
            if self.id_columns.contains(version) {
                issue("version_column", "must not be one of the id columns".into());
            }
        }
    }

    /// The sequence column, and what it cannot be combined with.
    fn validate_sequence_column(&self, issue: &mut dyn FnMut(&str, String)) {
        let Some(sequence) = &self.sequence_column else {
            if self.on_sequence_gap.is_some() {
                issue(
                    "on_sequence_gap",
                    "needs sequence_column (the column holding each id's sequence)".into(),
                );
            }
            return;
        };
        if !self.columns.contains_key(sequence) {
            issue(
                "sequence_column",
                format!("`{sequence}` is not mapped in `columns`"),
            );
        }
        if self.id_columns.contains(sequence) {
            issue(
                "sequence_column",
                "must not be one of the id columns".into(),
            );
        }
        if self.version_column.is_some() {
            issue(
                "sequence_column",
                "cannot be combined with version_column (the sequence orders the records as a version does)"
                    .into(),
            );
        }
        if !self.increment_columns.is_empty() {
            issue(
                "sequence_column",
                "cannot be combined with increment_columns (a counter has no latest sequence)"
                    .into(),
            );
        }
    }

    /// The counters, and what they cannot be combined with.
    fn validate_increment_columns(&self, issue: &mut dyn FnMut(&str, String)) {
        for (i, column) in self.increment_columns.iter().enumerate() {
            let at = format!("increment_columns[{i}]");
            if !self.columns.contains_key(column) {
                issue(&at, format!("`{column}` is not mapped in `columns`"));
            }
            if self.id_columns.contains(column) {
                issue(&at, format!("`{column}` is an id column"));
            }
        }
        if !self.increment_columns.is_empty() {
            if self.version_column.is_some() {
                issue(
                    "increment_columns",
                    "cannot be combined with version_column (a counter has no latest version)"
                        .into(),
                );
            }
            if self.delete_when.is_some() {
                issue(
                    "increment_columns",
                    "cannot be combined with delete_when".into(),
                );
            }
        }
    }

    /// The fields read of a record besides the columns: the deletion mark and the event id.
    fn validate_record_fields(&self, issue: &mut dyn FnMut(&str, String)) {
        if self.delete_when.as_deref().is_some_and(str::is_empty) {
            issue("delete_when", "must be a field path".into());
        }
        match &self.event_id {
            Some(EventId::Header(h)) if h.is_empty() => {
                issue("event_id.header", "must not be empty".into())
            }
            Some(EventId::Field(f)) if f.is_empty() || f.starts_with('$') => {
                issue("event_id.field", "must be a field path".into())
            }
            _ => {}
        }
    }

    /// The batch size and the inbox's retention and cleanup.
    fn validate_limits(&self, issue: &mut dyn FnMut(&str, String)) {
        if self.batch_size == 0 {
            issue("batch_size", "must be at least 1".into());
        }
        if self.inbox_retention_hours == 0 {
            issue(
                "inbox_retention_hours",
                "must be at least 1 (and longer than any redelivery)".into(),
            );
        }
        if self.inbox_cleanup_interval_secs == 0 {
            issue("inbox_cleanup_interval_secs", "must be at least 1".into());
        }
    }
}

pub(crate) fn is_env_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

pub(crate) fn is_table_name(s: &str) -> bool {
    let parts: Vec<&str> = s.split('.').collect();
    parts.len() <= 2
        && parts.iter().all(|p| {
            !p.is_empty()
                && p.len() <= 63
                && p.chars()
                    .all(|c| c.is_alphanumeric() || c == '_' || c == '$')
                && !p.starts_with(|c: char| c.is_ascii_digit() || c == '$')
        })
}
