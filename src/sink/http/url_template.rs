//! The URL of an http output's call and the call's idempotency key, for one record: the
//! sink's side of the URL template, whose parsed form ([`UrlTemplate`]) and rule are the
//! model's. Each replacement is percent-encoded as one path segment, so that a value can
//! never change the URL's shape; a record that lacks a value the template needs is refused.

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde_json::Value;

use crate::record::{Origin, Record};
use crate::topology::http::{EventId, TemplatePart, UrlTemplate};

/// What is kept as is in a replaced segment: the unreserved characters of RFC 3986.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

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

/// The URL of one record, made from a parsed template.
pub trait RecordUrl {
    /// The URL of `record`; `value` is its parsed JSON value when the template reads fields.
    fn url(&self, record: &Record, value: Option<&Value>) -> Result<reqwest::Url, TemplateError>;
}

impl RecordUrl for UrlTemplate {
    fn url(&self, record: &Record, value: Option<&Value>) -> Result<reqwest::Url, TemplateError> {
        let text = fill(self, &mut |part| match part {
            TemplatePart::Key => record
                .key
                .as_deref()
                .and_then(|k| std::str::from_utf8(k).ok())
                .map(str::to_string)
                .ok_or(TemplateError::NoKey),
            TemplatePart::Field(path) => match value.and_then(|v| field(v, path)) {
                None | Some(Value::Null) => Err(TemplateError::Missing(path.clone())),
                Some(v) => scalar(v).ok_or_else(|| {
                    let mut shown = v.to_string();
                    shown.truncate(60);
                    TemplateError::NotScalar(path.clone(), shown)
                }),
            },
            TemplatePart::Text(_) => Ok(String::new()),
        })?;
        reqwest::Url::parse(&text).map_err(|e| TemplateError::BadUrl(e.to_string()))
    }
}

/// The text of `template`, each placeholder replaced by what `value` gives for it,
/// percent-encoded.
fn fill<E>(
    template: &UrlTemplate,
    value: &mut dyn FnMut(&TemplatePart) -> Result<String, E>,
) -> Result<String, E> {
    let mut out = String::new();
    for part in template.parts() {
        match part {
            TemplatePart::Text(t) => out.push_str(t),
            other => out.extend(utf8_percent_encode(&value(other)?, SEGMENT)),
        }
    }
    Ok(out)
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
