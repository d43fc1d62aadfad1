//! The `postgres_outbox` input of a topology: a relay from a PostgreSQL outbox table to
//! Kafka, exactly once. The semantics live in [`crate::relay`]; this is the model of the
//! YAML section and its validation, and the origin "topic" its records carry
//! ([`origin_topic`]).

use schemars::JsonSchema;
use serde::Deserialize;

use super::ConfigIssue;
use super::postgres::{is_env_name, is_table_name};

/// Publishes the rows of an outbox table, each once, in the order of their ids per aggregate.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OutboxInput {
    /// Name of the environment variable that holds the connection URL (TLS as the
    /// `postgres` outputs: libpq's `sslmode` and `sslrootcert`).
    pub url_env: String,
    /// The outbox table, optionally schema-qualified.
    #[serde(default = "default_table")]
    pub table: String,
    /// Its column names; the defaults are those of Debezium's outbox event router.
    #[serde(default)]
    pub columns: OutboxColumns,
    /// Rows claimed and published in one transaction at most.
    #[serde(default = "default_batch_size")]
    pub batch_size: usize,
    /// How often the table is looked at when nothing wakes the relay sooner.
    #[serde(default = "default_poll_interval_ms")]
    pub poll_interval_ms: u64,
    /// A channel to `LISTEN` on: a `NOTIFY` on it (from the trigger docs/outbox.md gives) wakes
    /// the relay at once. Without it, the relay polls.
    #[serde(default)]
    pub notify_channel: Option<String>,
    /// The table's rows are split into this many shards by a hash of the aggregate id; a
    /// shard is published by one relay at a time (the holder of its advisory lock), with a
    /// transactional id of its own. More shards let more relays publish at once.
    #[serde(default = "default_shards")]
    pub shards: u32,
    /// The most shards one relay takes (default: all): with `shards: 4, max_shards: 2`, two
    /// relays publish two shards each.
    #[serde(default)]
    pub max_shards: Option<u32>,
    /// The compacted topic where each transaction records the row ids it published, one
    /// partition per shard (created if missing). Default: `<topology>.outbox-progress`.
    #[serde(default)]
    pub progress_topic: Option<String>,
    /// Topic of a row when no `route` picks an output: this prefix and its aggregate type,
    /// as Debezium's `outbox.event.${routedByValue}`.
    #[serde(default = "default_topic_prefix")]
    pub topic_prefix: String,
}

/// Column names of the outbox table.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OutboxColumns {
    /// The event's id (uuid, bigint or text): the order of publication, and the `event-id`
    /// header.
    #[serde(default = "col_id")]
    pub id: String,
    /// The aggregate's type: the topic of a row no `route` picks an output for
    /// (`topic_prefix` and this).
    #[serde(default = "col_aggregatetype")]
    pub aggregatetype: String,
    /// The record's key.
    #[serde(default = "col_aggregateid")]
    pub aggregateid: String,
    /// The `event-type` header.
    #[serde(default = "col_type")]
    pub r#type: String,
    /// The record's value (jsonb, json, text or bytea).
    #[serde(default = "col_payload")]
    pub payload: String,
    /// A jsonb object of header names to string values, when the table has one.
    #[serde(default)]
    pub headers: Option<String>,
    /// An integer column in insert order (a `bigserial`): the order of publication. Needed
    /// when `id` is not an integer (a uuid); default: `id`.
    #[serde(default)]
    pub order: Option<String>,
    /// A timestamp of the row's insert, when the table has one: the age of the oldest row
    /// and the insert-to-publish latency are measured from it.
    #[serde(default)]
    pub created_at: Option<String>,
}

impl Default for OutboxColumns {
    fn default() -> Self {
        OutboxColumns {
            id: col_id(),
            aggregatetype: col_aggregatetype(),
            aggregateid: col_aggregateid(),
            r#type: col_type(),
            payload: col_payload(),
            headers: None,
            order: None,
            created_at: None,
        }
    }
}

fn default_table() -> String {
    "outbox".into()
}
fn default_batch_size() -> usize {
    500
}
fn default_poll_interval_ms() -> u64 {
    1000
}
fn default_shards() -> u32 {
    1
}
fn default_topic_prefix() -> String {
    "outbox.event.".into()
}
fn col_id() -> String {
    "id".into()
}
fn col_aggregatetype() -> String {
    "aggregatetype".into()
}
fn col_aggregateid() -> String {
    "aggregateid".into()
}
fn col_type() -> String {
    "type".into()
}
fn col_payload() -> String {
    "payload".into()
}

/// A plain column name: letters, digits and `_`, not starting with a digit.
fn is_column_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && name.len() <= 63
}

impl OutboxInput {
    /// The progress topic of the relay of `topology`.
    pub fn progress_topic(&self, topology: &str) -> String {
        self.progress_topic
            .clone()
            .unwrap_or_else(|| format!("{topology}.outbox-progress"))
    }

    /// The most shards one relay takes.
    pub fn max_shards(&self) -> u32 {
        self.max_shards.unwrap_or(self.shards).min(self.shards)
    }

    /// Problems of this section, each with its path under `here`.
    pub fn validate(&self, here: &str) -> Vec<ConfigIssue> {
        let mut issues = Vec::new();
        let mut issue = |path: &str, message: &str| {
            issues.push(ConfigIssue {
                path: format!("{here}.{path}"),
                message: message.to_string(),
            })
        };
        if !is_env_name(&self.url_env) {
            issue(
                "url_env",
                "must name an environment variable ([A-Za-z_][A-Za-z0-9_]*) holding the connection URL",
            );
        }
        if !is_table_name(&self.table) {
            issue(
                "table",
                "must be `table` or `schema.table` (no quotes, no spaces)",
            );
        }
        let c = &self.columns;
        let named = [
            ("id", Some(&c.id)),
            ("aggregatetype", Some(&c.aggregatetype)),
            ("aggregateid", Some(&c.aggregateid)),
            ("type", Some(&c.r#type)),
            ("payload", Some(&c.payload)),
            ("headers", c.headers.as_ref()),
            ("order", c.order.as_ref()),
            ("created_at", c.created_at.as_ref()),
        ];
        for (field, name) in named {
            if name.is_some_and(|n| !is_column_name(n)) {
                issue(
                    &format!("columns.{field}"),
                    "must be a plain column name ([A-Za-z_][A-Za-z0-9_]*, at most 63)",
                );
            }
        }
        if self.batch_size == 0 {
            issue("batch_size", "must be at least 1");
        }
        if self.poll_interval_ms == 0 {
            issue("poll_interval_ms", "must be at least 1");
        }
        if self
            .notify_channel
            .as_deref()
            .is_some_and(|n| !is_column_name(n))
        {
            issue(
                "notify_channel",
                "must be a plain identifier ([A-Za-z_][A-Za-z0-9_]*, at most 63)",
            );
        }
        if self.shards == 0 || self.shards > 1024 {
            issue("shards", "must be between 1 and 1024");
        }
        if self.max_shards == Some(0) {
            issue("max_shards", "must be at least 1");
        }
        if self
            .progress_topic
            .as_deref()
            .is_some_and(|t| t.trim().is_empty())
        {
            issue("progress_topic", "must not be empty");
        }
        issues
    }
}

/// The origin "topic" of the rows of `table`.
pub fn origin_topic(table: &str) -> String {
    format!("postgres:{table}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_debeziums_layout() {
        let c: OutboxInput = serde_saphyr::from_str("url_env: PG\n").unwrap();
        assert_eq!(c.table, "outbox");
        assert_eq!(
            (
                c.columns.id.as_str(),
                c.columns.aggregatetype.as_str(),
                c.columns.aggregateid.as_str(),
                c.columns.r#type.as_str(),
                c.columns.payload.as_str()
            ),
            ("id", "aggregatetype", "aggregateid", "type", "payload")
        );
        assert_eq!((c.batch_size, c.shards, c.max_shards()), (500, 1, 1));
        assert_eq!(c.progress_topic("orders"), "orders.outbox-progress");
        assert_eq!(c.topic_prefix, "outbox.event.");
        assert!(c.validate("inputs[0].postgres_outbox").is_empty());
    }

    #[test]
    fn every_bad_field_is_named() {
        let yaml = "url_env: 'a b'\ntable: 'x y'\ncolumns: {id: '1x', headers: 'h-h'}\nbatch_size: 0\npoll_interval_ms: 0\nnotify_channel: 'a;b'\nshards: 0\nmax_shards: 0\nprogress_topic: ' '\n";
        let c: OutboxInput = serde_saphyr::from_str(yaml).unwrap();
        let paths: Vec<String> = c.validate("i").into_iter().map(|i| i.path).collect();
        assert_eq!(
            paths,
            [
                "i.url_env",
                "i.table",
                "i.columns.id",
                "i.columns.headers",
                "i.batch_size",
                "i.poll_interval_ms",
                "i.notify_channel",
                "i.shards",
                "i.max_shards",
                "i.progress_topic"
            ]
        );
    }
}
