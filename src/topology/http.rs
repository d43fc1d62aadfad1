//! The `http` output of a topology: one HTTP call per record, made before the Kafka commit,
//! each with an idempotency key that is the same on every redelivery. The semantics live in
//! [`crate::sink::http`]; this is the model of the YAML section and its validation, with the
//! parsed form of its URL template ([`UrlTemplate`]), which the sink renders per record.

use std::collections::BTreeMap;

use reqwest::header::{HeaderName, HeaderValue};
use schemars::JsonSchema;
use serde::Deserialize;

use super::ConfigIssue;
pub use super::postgres::EventId;

/// Calls an HTTP endpoint for every record; the endpoint must honour idempotency keys.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HttpOutput {
    /// The endpoint, `http://` or `https://`. A template over the record: `{key}` is the
    /// Kafka key (UTF-8) and `{a.b}` the scalar at that field path of the JSON value, each
    /// percent-encoded; see [`UrlTemplate`].
    pub url: String,
    /// `POST` (default), `PUT`, `PATCH` or `DELETE`. The body is the record's encoded value.
    #[serde(default = "default_method")]
    pub method: String,
    /// Headers of every request (`Content-Type`, `Authorization: Bearer ${TOKEN}`...).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// The header carrying each call's idempotency key.
    #[serde(default = "default_idempotency_header")]
    pub idempotency_header: String,
    /// Where the idempotency key comes from: this header of the record or this field of its
    /// JSON value, when the record has it. Default (and fallback): its origin,
    /// `topic/partition/offset`.
    #[serde(default)]
    pub event_id: Option<EventId>,
    /// The longest one request may take (connecting, sending, reading the answer).
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// Requests in flight at once, over all keys (records of one key go one after another).
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight: usize,
    /// A PEM file of the certificate authorities trusted for `https` (default: the system's).
    #[serde(default)]
    pub ca_file: Option<String>,
    /// The open Kafka transaction commits once this many calls are waiting for this output.
    #[serde(default = "default_batch_size")]
    pub batch_size: usize,
    /// Deduplication on this side, for endpoints that do not honour idempotency keys.
    #[serde(default)]
    pub dedup: Option<Dedup>,
}

/// Where an `http` output remembers the keys it delivered.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Dedup {
    /// In the inbox table of the PostgreSQL outputs: after a 2xx, the key is recorded there
    /// (consumer `<topology>/<output>`), and a key recorded is not called again. A crash
    /// between the 2xx and that write still repeats the call, once.
    Postgres(DedupPostgres),
}

/// The inbox a `dedup: {postgres: ...}` records delivered keys in.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DedupPostgres {
    /// Name of the environment variable that holds the connection URL, as for `postgres`
    /// outputs (TLS through its `sslmode`).
    pub url_env: String,
    /// The inbox table (created if missing), optionally schema-qualified.
    #[serde(default = "super::postgres::default_inbox_table")]
    pub inbox_table: String,
    /// Delivered keys older than this are forgotten; keep it longer than any redelivery.
    #[serde(default = "super::postgres::default_inbox_retention_hours")]
    pub inbox_retention_hours: u64,
}

fn default_method() -> String {
    "POST".to_string()
}
fn default_idempotency_header() -> String {
    "Idempotency-Key".to_string()
}
fn default_timeout_ms() -> u64 {
    5_000
}
fn default_max_in_flight() -> usize {
    16
}
fn default_batch_size() -> usize {
    1_000
}

/// The methods an output may call with.
pub const METHODS: &[&str] = &["POST", "PUT", "PATCH", "DELETE"];

impl HttpOutput {
    /// Every problem of this section; `at` is its path (`outputs[2].http`).
    pub fn validate(&self, at: &str, issues: &mut Vec<ConfigIssue>) {
        let mut issue = |field: &str, message: String| {
            issues.push(ConfigIssue {
                path: format!("{at}.{field}"),
                message,
            })
        };
        if let Err(message) = UrlTemplate::parse(&self.url) {
            issue("url", message);
        }
        if !METHODS.contains(&self.method.as_str()) {
            issue("method", format!("must be one of {}", METHODS.join(", ")));
        }
        for (name, value) in &self.headers {
            if HeaderName::from_bytes(name.as_bytes()).is_err() {
                issue(&format!("headers.{name}"), "not a valid header name".into());
            } else if name.eq_ignore_ascii_case(&self.idempotency_header) {
                issue(
                    &format!("headers.{name}"),
                    "is the idempotency header, set by onceflow for each call".into(),
                );
            }
            if HeaderValue::from_str(value).is_err() {
                issue(
                    &format!("headers.{name}"),
                    "not a valid header value (visible ASCII and spaces)".into(),
                );
            }
        }
        if HeaderName::from_bytes(self.idempotency_header.as_bytes()).is_err() {
            issue("idempotency_header", "must be a valid header name".into());
        }
        match &self.event_id {
            Some(EventId::Header(h)) if h.is_empty() => {
                issue("event_id.header", "must not be empty".into())
            }
            Some(EventId::Field(f)) if !super::is_field_path(f) => {
                issue("event_id.field", "must be a field path".into())
            }
            _ => {}
        }
        if self.timeout_ms == 0 {
            issue("timeout_ms", "must be at least 1".into());
        }
        if self.max_in_flight == 0 {
            issue("max_in_flight", "must be at least 1".into());
        }
        if self.batch_size == 0 {
            issue("batch_size", "must be at least 1".into());
        }
        if self.ca_file.as_deref().is_some_and(str::is_empty) {
            issue("ca_file", "must name a PEM file".into());
        }
        if let Some(Dedup::Postgres(pg)) = &self.dedup {
            if !super::postgres::is_env_name(&pg.url_env) {
                issue(
                    "dedup.postgres.url_env",
                    "must name an environment variable ([A-Za-z_][A-Za-z0-9_]*) holding the connection URL".into(),
                );
            }
            if !super::postgres::is_table_name(&pg.inbox_table) {
                issue(
                    "dedup.postgres.inbox_table",
                    "must be `table` or `schema.table` (no quotes, no spaces)".into(),
                );
            }
            if pg.inbox_retention_hours == 0 {
                issue(
                    "dedup.postgres.inbox_retention_hours",
                    "must be at least 1".into(),
                );
            }
        }
    }
}

/// A parsed URL template: the text of an http output's `url` and its placeholders, in order.
/// Parsing is all the model does with it; the sink renders it for each record
/// ([`crate::sink::http::url_template`]).
///
/// The rule of the template: `{key}` is replaced by the record's Kafka key (UTF-8), and
/// `{a.b}` by the value at field path `a.b` of the record's JSON value, which must be a
/// string, a number or a boolean (a string as is, the others as JSON writes them). Each
/// replacement is percent-encoded as one path segment (`/`, `?`, `#`, `%` and other reserved
/// characters are escaped), so a value can never change the URL's shape. A record that lacks
/// a value the template needs is refused (the record's fault). Braces are not otherwise
/// allowed in the template; the template with every placeholder replaced by `x` must be an
/// `http` or `https` URL with a host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UrlTemplate {
    parts: Vec<TemplatePart>,
}

/// One part of a [`UrlTemplate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplatePart {
    /// Text kept as it is.
    Text(String),
    /// `{key}`: the record's Kafka key.
    Key,
    /// `{a.b}`: the value at that field path of the record's JSON value.
    Field(String),
}

impl UrlTemplate {
    /// Parses a template, saying what is wrong with it.
    pub fn parse(text: &str) -> Result<UrlTemplate, String> {
        let mut parts = Vec::new();
        let mut rest = text;
        while let Some(open) = rest.find(['{', '}']) {
            if rest[open..].starts_with('}') {
                return Err("a `}` without its `{`; braces only mark placeholders".into());
            }
            if open > 0 {
                parts.push(TemplatePart::Text(rest[..open].to_string()));
            }
            let Some(close) = rest[open..].find('}') else {
                return Err("a `{` without its `}`".into());
            };
            let name = &rest[open + 1..open + close];
            if name == "key" {
                parts.push(TemplatePart::Key);
            } else if super::is_field_path(name) && !name.contains('{') {
                parts.push(TemplatePart::Field(name.to_string()));
            } else {
                return Err(format!(
                    "`{{{name}}}` is not a placeholder: use `{{key}}` or `{{field.path}}`"
                ));
            }
            rest = &rest[open + close + 1..];
        }
        if !rest.is_empty() {
            parts.push(TemplatePart::Text(rest.to_string()));
        }
        let template = UrlTemplate { parts };
        let sample = template.sample();
        let url = reqwest::Url::parse(&sample).map_err(|e| format!("not a URL: {e}"))?;
        if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
            return Err("must be an http:// or https:// URL with a host".into());
        }
        Ok(template)
    }

    /// Whether the template reads the JSON value.
    pub fn reads_fields(&self) -> bool {
        self.parts
            .iter()
            .any(|p| matches!(p, TemplatePart::Field(_)))
    }

    /// The parts of the template, in order.
    pub fn parts(&self) -> &[TemplatePart] {
        &self.parts
    }

    /// The template with every placeholder replaced by `x` (which percent-encoding keeps as
    /// it is).
    fn sample(&self) -> String {
        self.parts
            .iter()
            .map(|part| match part {
                TemplatePart::Text(t) => t.as_str(),
                TemplatePart::Key | TemplatePart::Field(_) => "x",
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(yaml: &str) -> HttpOutput {
        serde_saphyr::from_str(yaml).expect("an http section")
    }

    fn problems(yaml: &str) -> Vec<String> {
        let mut issues = Vec::new();
        config(yaml).validate("outputs[0].http", &mut issues);
        issues.into_iter().map(|i| i.path).collect()
    }

    #[test]
    fn defaults() {
        let c = config("url: https://example.com/hook\n");
        assert_eq!(c.method, "POST");
        assert_eq!(c.idempotency_header, "Idempotency-Key");
        assert_eq!(
            (c.timeout_ms, c.max_in_flight, c.batch_size),
            (5_000, 16, 1_000)
        );
        assert!(problems("url: https://example.com/hook/{key}/{order.id}\n").is_empty());
    }

    #[test]
    fn every_problem_is_reported_with_its_path() {
        let yaml = "url: 'ftp://x/{}'\nmethod: GET\nheaders: {'bad name': x, idempotency-key: y, ok: \"a\\nb\"}\nidempotency_header: ''\nevent_id: {field: 'a..b'}\ntimeout_ms: 0\nmax_in_flight: 0\nbatch_size: 0\nca_file: ''\n";
        assert_eq!(
            problems(yaml),
            [
                "outputs[0].http.url",
                "outputs[0].http.method",
                "outputs[0].http.headers.bad name",
                "outputs[0].http.headers.ok",
                "outputs[0].http.idempotency_header",
                "outputs[0].http.event_id.field",
                "outputs[0].http.timeout_ms",
                "outputs[0].http.max_in_flight",
                "outputs[0].http.batch_size",
                "outputs[0].http.ca_file",
            ]
        );
        let same = "url: http://x/\nheaders: {idempotency-key: y}\n";
        assert_eq!(problems(same), ["outputs[0].http.headers.idempotency-key"]);
    }

    #[test]
    fn dedup_in_postgres() {
        let c = config("url: http://x/\ndedup: {postgres: {url_env: PG_URL}}\n");
        let Some(Dedup::Postgres(pg)) = &c.dedup else {
            panic!("dedup: {:?}", c.dedup);
        };
        assert_eq!(
            (
                pg.url_env.as_str(),
                pg.inbox_table.as_str(),
                pg.inbox_retention_hours
            ),
            ("PG_URL", "onceflow_inbox", 168)
        );
        assert!(problems("url: http://x/\ndedup: {postgres: {url_env: PG_URL}}\n").is_empty());
        let bad = "url: http://x/\ndedup: {postgres: {url_env: 'a-b', inbox_table: 'a b', inbox_retention_hours: 0}}\n";
        assert_eq!(
            problems(bad),
            [
                "outputs[0].http.dedup.postgres.url_env",
                "outputs[0].http.dedup.postgres.inbox_table",
                "outputs[0].http.dedup.postgres.inbox_retention_hours",
            ]
        );
    }

    #[test]
    fn bad_templates_say_why() {
        for bad in [
            "http://h/{nope",
            "http://h/}",
            "http://h/{}",
            "http://h/{a..b}",
            "ftp://h/x",
            "not a url",
        ] {
            assert!(UrlTemplate::parse(bad).is_err(), "{bad}");
        }
    }
}
