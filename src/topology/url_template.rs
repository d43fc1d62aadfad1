//! The URL of an http output's call, a template over its record, and the call's idempotency
//! key. Pure: the sink renders it, validation parses it.
//!
//! The rule of the template: `{key}` is replaced by the record's Kafka key (UTF-8), and
//! `{a.b}` by the value at field path `a.b` of the record's JSON value, which must be a
//! string, a number or a boolean (a string as is, the others as JSON writes them). Each
//! replacement is percent-encoded as one path segment (`/`, `?`, `#`, `%` and other reserved
//! characters are escaped), so a value can never change the URL's shape. A record that lacks
//! a value the template needs is refused (the record's fault). Braces are not otherwise
//! allowed in the template; the template with every placeholder replaced by `x` must be an
//! `http` or `https` URL with a host.

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde_json::Value;

use super::http::EventId;
use crate::record::{Origin, Record};

/// What is kept as is in a replaced segment: the unreserved characters of RFC 3986.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    Key,
    Field(String),
}

/// A parsed URL template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UrlTemplate {
    parts: Vec<Part>,
}

/// Why a record cannot make its URL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    #[error("the URL template needs the record's key, and it has none (or it is not UTF-8)")]
    NoKey,
    #[error("the URL template needs field `{0}`, and the value has none")]
    Missing(String),
    #[error("the URL template needs field `{0}` as a string, number or boolean: {1}")]
    NotScalar(String, String),
    #[error("the URL template reads fields and the value is not JSON: {0}")]
    NotJson(String),
    #[error("the URL made for the record is invalid: {0}")]
    BadUrl(String),
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
                parts.push(Part::Text(rest[..open].to_string()));
            }
            let Some(close) = rest[open..].find('}') else {
                return Err("a `{` without its `}`".into());
            };
            let name = &rest[open + 1..open + close];
            if name == "key" {
                parts.push(Part::Key);
            } else if crate::topology::is_field_path(name) && !name.contains('{') {
                parts.push(Part::Field(name.to_string()));
            } else {
                return Err(format!(
                    "`{{{name}}}` is not a placeholder: use `{{key}}` or `{{field.path}}`"
                ));
            }
            rest = &rest[open + close + 1..];
        }
        if !rest.is_empty() {
            parts.push(Part::Text(rest.to_string()));
        }
        let template = UrlTemplate { parts };
        let sample = template.fill(&mut |_| Ok::<_, String>("x".to_string()))?;
        let url = reqwest::Url::parse(&sample).map_err(|e| format!("not a URL: {e}"))?;
        if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
            return Err("must be an http:// or https:// URL with a host".into());
        }
        Ok(template)
    }

    /// Whether the template reads the JSON value.
    pub fn reads_fields(&self) -> bool {
        self.parts.iter().any(|p| matches!(p, Part::Field(_)))
    }

    /// The URL of one record; `value` is its parsed JSON value when the template reads
    /// fields.
    pub fn url(
        &self,
        record: &Record,
        value: Option<&Value>,
    ) -> Result<reqwest::Url, TemplateError> {
        let text = self.fill(&mut |part| match part {
            Part::Key => record
                .key
                .as_deref()
                .and_then(|k| std::str::from_utf8(k).ok())
                .map(str::to_string)
                .ok_or(TemplateError::NoKey),
            Part::Field(path) => match value.and_then(|v| field(v, path)) {
                None | Some(Value::Null) => Err(TemplateError::Missing(path.clone())),
                Some(v) => scalar(v).ok_or_else(|| {
                    let mut shown = v.to_string();
                    shown.truncate(60);
                    TemplateError::NotScalar(path.clone(), shown)
                }),
            },
            Part::Text(_) => Ok(String::new()),
        })?;
        reqwest::Url::parse(&text).map_err(|e| TemplateError::BadUrl(e.to_string()))
    }

    fn fill<E>(&self, value: &mut dyn FnMut(&Part) -> Result<String, E>) -> Result<String, E> {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Text(t) => out.push_str(t),
                other => out.extend(utf8_percent_encode(&value(other)?, SEGMENT)),
            }
        }
        Ok(out)
    }
}

/// The value at a dotted field path.
pub fn field<'a>(value: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(value, |v, name| v.get(name))
}

/// A string as is, a number or boolean as JSON writes it; `None` otherwise.
fn scalar(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// The idempotency key of a call, the same on every redelivery of its record: the record's
/// event id when configured and present (a non-empty UTF-8 header, or a scalar field of the
/// JSON value), else its origin `topic/partition/offset`. `nth` counts the calls this output
/// already has for the same consumed record (several with `explode`): from the second on, the
/// origin key ends in `/nth`, so that each call has a key of its own.
pub fn idempotency_key(
    record: &Record,
    value: Option<&Value>,
    event_id: Option<&EventId>,
    nth: usize,
) -> String {
    let event = match event_id {
        Some(EventId::Header(name)) => record
            .headers
            .iter()
            .find(|(h, _)| h == name)
            .and_then(|(_, v)| String::from_utf8(v.clone()).ok()),
        Some(EventId::Field(path)) => value.and_then(|v| field(v, path)).and_then(scalar),
        None => None,
    };
    match event.filter(|e| !e.is_empty()) {
        Some(event) => event,
        None => origin_key(&record.origin, nth),
    }
}

fn origin_key(o: &Origin, nth: usize) -> String {
    if nth == 0 {
        format!("{}/{}/{}", o.topic, o.partition, o.offset)
    } else {
        format!("{}/{}/{}/{nth}", o.topic, o.partition, o.offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(key: Option<&str>, value: &str) -> Record {
        Record {
            key: key.map(|k| k.as_bytes().to_vec()),
            value: Some(value.as_bytes().to_vec()),
            headers: vec![("event-id".into(), b"evt-7".to_vec())],
            timestamp: None,
            origin: Origin {
                topic: "orders".into(),
                partition: 2,
                offset: 41,
            },
        }
    }

    fn json(text: &str) -> Value {
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn placeholders_are_filled_and_encoded_as_one_segment() {
        let t =
            UrlTemplate::parse("https://api.example.com/v1/{key}/orders/{order.id}?x=1").unwrap();
        assert!(t.reads_fields());
        let v = json(r#"{"order": {"id": "a/b c?#%"}}"#);
        let url = t.url(&record(Some("k é"), "{}"), Some(&v)).unwrap();
        assert_eq!(
            url.as_str(),
            "https://api.example.com/v1/k%20%C3%A9/orders/a%2Fb%20c%3F%23%25?x=1"
        );
        let numbers = json(r#"{"order": {"id": 12}}"#);
        let url = t.url(&record(Some("k"), "{}"), Some(&numbers)).unwrap();
        assert_eq!(url.path(), "/v1/k/orders/12");
        let plain = UrlTemplate::parse("http://127.0.0.1:8080/hook").unwrap();
        assert!(!plain.reads_fields());
        assert_eq!(
            plain.url(&record(None, "x"), None).unwrap().as_str(),
            "http://127.0.0.1:8080/hook"
        );
    }

    #[test]
    fn a_record_without_what_the_template_needs_is_refused() {
        let t = UrlTemplate::parse("http://h/{key}/{a.b}").unwrap();
        let v = json(r#"{"a": {"b": [1]}}"#);
        assert_eq!(
            t.url(&record(None, "{}"), Some(&v)),
            Err(TemplateError::NoKey)
        );
        assert!(matches!(
            t.url(&record(Some("k"), "{}"), Some(&v)),
            Err(TemplateError::NotScalar(f, _)) if f == "a.b"
        ));
        assert_eq!(
            t.url(&record(Some("k"), "{}"), Some(&json(r#"{"a": {}}"#))),
            Err(TemplateError::Missing("a.b".into()))
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

    #[test]
    fn the_idempotency_key_is_the_event_id_else_the_origin() {
        let r = record(Some("k"), "{}");
        let v = json(r#"{"id": 99, "name": "x", "obj": {}}"#);
        assert_eq!(idempotency_key(&r, Some(&v), None, 0), "orders/2/41");
        assert_eq!(idempotency_key(&r, Some(&v), None, 2), "orders/2/41/2");
        let header = EventId::Header("event-id".into());
        assert_eq!(idempotency_key(&r, Some(&v), Some(&header), 0), "evt-7");
        let missing = EventId::Header("other".into());
        assert_eq!(
            idempotency_key(&r, Some(&v), Some(&missing), 0),
            "orders/2/41"
        );
        let id = EventId::Field("id".into());
        assert_eq!(idempotency_key(&r, Some(&v), Some(&id), 0), "99");
        let obj = EventId::Field("obj".into());
        assert_eq!(idempotency_key(&r, Some(&v), Some(&obj), 0), "orders/2/41");
        assert_eq!(idempotency_key(&r, None, Some(&id), 0), "orders/2/41");
    }
}
