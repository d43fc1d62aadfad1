//! Staging: consumed records become JSON rows, waiting for the flush. Pure: no database and
//! no async type here, so the mapping is unit-tested with plain values.
//!
//! Each row is a JSON object keyed by column name, plus three keys of onceflow's own: `$seq`
//! (its position in the batch: the last one wins among unversioned rows of one id), `$mid` (the
//! message's identity in the inbox) and `$del` (a deletion). PostgreSQL casts every value to its
//! column's type (`json_to_recordset`), so the mapping needs no knowledge of the types.

use std::ops::Range;

use serde_json::Value;

use crate::topology::postgres::{EventId, PostgresOutput};
use crate::transform::{Origin, Record};

/// Where a column's value comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Source {
    /// A path into the JSON value.
    Path(Vec<String>),
    Key,
    Topic,
    Partition,
    Offset,
    Timestamp,
}

impl Source {
    fn parse(field: &str) -> Source {
        match field {
            "$key" => Source::Key,
            "$topic" => Source::Topic,
            "$partition" => Source::Partition,
            "$offset" => Source::Offset,
            "$timestamp" => Source::Timestamp,
            path => Source::Path(path.split('.').map(str::to_string).collect()),
        }
    }

    fn read(&self, record: &Record, value: &Value) -> Value {
        match self {
            Source::Path(path) => lookup(value, path).cloned().unwrap_or(Value::Null),
            Source::Key => record.key.as_ref().map_or(Value::Null, |k| {
                Value::String(String::from_utf8_lossy(k).into())
            }),
            Source::Topic => Value::String(record.origin.topic.clone()),
            Source::Partition => Value::from(record.origin.partition),
            Source::Offset => Value::from(record.origin.offset),
            Source::Timestamp => record.timestamp.map_or(Value::Null, Value::from),
        }
    }
}

/// The value at `path`; a numeric step indexes an array.
fn lookup<'v>(value: &'v Value, path: &[String]) -> Option<&'v Value> {
    path.iter().try_fold(value, |v, step| match v {
        Value::Object(map) => map.get(step),
        Value::Array(items) => items.get(step.parse::<usize>().ok()?),
        _ => None,
    })
}

/// A record that cannot become a row: its own fault, whatever the database says.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("the value is not a JSON object: {0}")]
    NotAnObject(String),
    #[error("field `{field}` for column `{column}` is missing or null")]
    Missing { column: String, field: String },
    #[error("the event id ({0}) is missing")]
    NoEventId(String),
}

/// How records map to rows, compiled from a [`PostgresOutput`].
#[derive(Debug, Clone)]
pub struct Mapping {
    /// Column name and where its value comes from, in column order.
    columns: Vec<(String, Source)>,
    /// `"column":` of each column, JSON-escaped once.
    keys: Vec<String>,
    /// Columns that must not be null: ids and the version.
    required: Vec<usize>,
    delete_when: Option<Vec<String>>,
    event_id: Option<EventId>,
}

impl Mapping {
    pub fn new(config: &PostgresOutput) -> Mapping {
        let columns: Vec<(String, Source)> = config
            .columns
            .iter()
            .map(|(column, field)| (column.clone(), Source::parse(field)))
            .collect();
        let required = columns
            .iter()
            .enumerate()
            .filter(|(_, (c, _))| {
                config.id_columns.contains(c) || config.version_column.as_ref() == Some(c)
            })
            .map(|(i, _)| i)
            .collect();
        let keys = columns
            .iter()
            .map(|(c, _)| format!("{}:", Value::String(c.clone())))
            .collect();
        Mapping {
            columns,
            keys,
            required,
            delete_when: config
                .delete_when
                .as_ref()
                .map(|p| p.split('.').map(str::to_string).collect()),
            event_id: config.event_id.clone(),
        }
    }

    /// The message's identity in the inbox.
    fn message_id(&self, record: &Record, value: &Value) -> Result<String, RecordError> {
        match &self.event_id {
            None => Ok(coordinates(&record.origin)),
            Some(EventId::Header(name)) => record
                .headers
                .iter()
                .rev()
                .find(|(k, _)| k == name)
                .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
                .filter(|v| !v.is_empty())
                .ok_or_else(|| RecordError::NoEventId(format!("header `{name}`"))),
            Some(EventId::Field(path)) => {
                let steps: Vec<String> = path.split('.').map(str::to_string).collect();
                match lookup(value, &steps) {
                    Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
                    Some(v @ Value::Number(_)) => Ok(v.to_string()),
                    _ => Err(RecordError::NoEventId(format!("field `{path}`"))),
                }
            }
        }
    }
}

/// `topic/partition/offset`: a consumed message's identity by default.
pub fn coordinates(origin: &Origin) -> String {
    format!("{}/{}/{}", origin.topic, origin.partition, origin.offset)
}

/// The rows waiting for the next flush.
#[derive(Debug, Default)]
pub struct Staged {
    /// The rows (UTF-8 JSON), comma-separated, without the enclosing brackets.
    json: Vec<u8>,
    /// Where each row is in `json`.
    rows: Vec<Range<usize>>,
    /// The consumed record of each row.
    origins: Vec<Origin>,
}

impl Staged {
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    pub fn clear(&mut self) {
        self.json.clear();
        self.rows.clear();
        self.origins.clear();
    }

    /// Adds `record` as a row. Records without a value (Kafka tombstones, empty values)
    /// write nothing: `Ok(false)`.
    pub fn add(&mut self, mapping: &Mapping, record: &Record) -> Result<bool, RecordError> {
        let Some(bytes) = record.value.as_deref().filter(|v| !v.is_empty()) else {
            return Ok(false);
        };
        let value: Value = match serde_json::from_slice(bytes) {
            Ok(v @ Value::Object(_)) => v,
            Ok(other) => return Err(RecordError::NotAnObject(kind_of(&other).into())),
            Err(e) => return Err(RecordError::NotAnObject(format!("invalid JSON ({e})"))),
        };
        let values: Vec<Value> = mapping
            .columns
            .iter()
            .map(|(_, source)| source.read(record, &value))
            .collect();
        for &i in &mapping.required {
            if values[i].is_null() {
                let (column, source) = &mapping.columns[i];
                return Err(RecordError::Missing {
                    column: column.clone(),
                    field: describe(source),
                });
            }
        }
        let deleted = mapping
            .delete_when
            .as_ref()
            .and_then(|path| lookup(&value, path))
            .is_some_and(|v| !matches!(v, Value::Null | Value::Bool(false)));
        let mid = mapping.message_id(record, &value)?;

        if !self.rows.is_empty() {
            self.json.push(b',');
        }
        let start = self.json.len();
        let out = &mut self.json;
        out.extend_from_slice(format!("{{\"$seq\":{},\"$mid\":", self.rows.len()).as_bytes());
        write_json(out, &Value::String(mid));
        out.extend_from_slice(if deleted {
            b",\"$del\":true"
        } else {
            b",\"$del\":false"
        });
        for (key, v) in mapping.keys.iter().zip(&values) {
            out.push(b',');
            out.extend_from_slice(key.as_bytes());
            write_json(out, v);
        }
        out.push(b'}');
        self.rows.push(start..self.json.len());
        self.origins.push(record.origin.clone());
        Ok(true)
    }

    /// The whole batch as a JSON array.
    pub fn to_json(&self) -> String {
        let mut s = Vec::with_capacity(self.json.len() + 2);
        s.push(b'[');
        s.extend_from_slice(&self.json);
        s.push(b']');
        utf8(s)
    }

    /// Row `i` alone as a JSON array, and its record.
    pub fn row(&self, i: usize) -> (String, &Origin) {
        let mut s = vec![b'['];
        s.extend_from_slice(&self.json[self.rows[i].clone()]);
        s.push(b']');
        (utf8(s), &self.origins[i])
    }

    /// Drops the rows of one consumed record (a dead-lettered record, for instance), keeping
    /// the others in order.
    pub fn remove(&mut self, origin: &Origin) {
        let mut kept = Staged::default();
        for (i, o) in self.origins.iter().enumerate() {
            if o != origin {
                if !kept.rows.is_empty() {
                    kept.json.push(b',');
                }
                let start = kept.json.len();
                // `$seq` keeps its old value: only its order matters.
                kept.json
                    .extend_from_slice(&self.json[self.rows[i].clone()]);
                kept.rows.push(start..kept.json.len());
                kept.origins.push(o.clone());
            }
        }
        *self = kept;
    }
}

/// Appends `v` as JSON. Writing JSON values into memory cannot fail.
fn write_json(out: &mut Vec<u8>, v: &Value) {
    let _ = serde_json::to_writer(out, v);
}

/// The staged bytes are serde_json's output: always UTF-8.
fn utf8(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn describe(source: &Source) -> String {
    match source {
        Source::Path(p) => p.join("."),
        Source::Key => "$key".into(),
        Source::Topic => "$topic".into(),
        Source::Partition => "$partition".into(),
        Source::Offset => "$offset".into(),
        Source::Timestamp => "$timestamp".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::Topology;

    fn config(extra: &str) -> PostgresOutput {
        let text = format!(
            "name: t\ninputs: [{{topic: in}}]\noutputs:\n  - name: db\n    postgres:\n      url_env: U\n      table: orders\n      id_columns: [id]\n      version_column: v\n      columns: {{id: id, v: meta.v, name: customer.name, first: items.0, k: $key, p: $partition, o: $offset}}\n{extra}"
        );
        Topology::parse(&text, "t.yaml")
            .unwrap()
            .postgres_outputs()
            .next()
            .unwrap()
            .1
            .clone()
    }

    fn record(value: &str, offset: i64) -> Record {
        Record {
            key: Some(b"k1".to_vec()),
            value: Some(value.as_bytes().to_vec()),
            headers: vec![("event-id".into(), b"e-7".to_vec())],
            timestamp: Some(1000),
            origin: Origin {
                topic: "orders".into(),
                partition: 2,
                offset,
            },
        }
    }

    fn rows(staged: &Staged) -> Vec<Value> {
        serde_json::from_str::<Vec<Value>>(&staged.to_json()).unwrap()
    }

    #[test]
    fn a_record_becomes_a_row_keyed_by_column() {
        let mapping = Mapping::new(&config(""));
        let mut staged = Staged::default();
        let added = staged
            .add(
                &mapping,
                &record(
                    r#"{"id": 5, "meta": {"v": 3}, "customer": {"name": "Ann"}, "items": ["a", "b"]}"#,
                    41,
                ),
            )
            .unwrap();
        assert!(added);
        assert_eq!(
            rows(&staged),
            vec![serde_json::json!({
                "$seq": 0, "$mid": "orders/2/41", "$del": false,
                "id": 5, "v": 3, "name": "Ann", "first": "a", "k": "k1", "p": 2, "o": 41
            })]
        );
    }

    #[test]
    fn missing_optional_fields_are_null_and_missing_ids_or_versions_are_refused() {
        let mapping = Mapping::new(&config(""));
        let mut staged = Staged::default();
        staged
            .add(&mapping, &record(r#"{"id": 5, "meta": {"v": 1}}"#, 1))
            .unwrap();
        assert_eq!(rows(&staged)[0]["name"], Value::Null);
        assert_eq!(
            staged.add(&mapping, &record(r#"{"meta": {"v": 1}}"#, 2)),
            Err(RecordError::Missing {
                column: "id".into(),
                field: "id".into()
            })
        );
        assert_eq!(
            staged.add(&mapping, &record(r#"{"id": 1, "meta": {"v": null}}"#, 3)),
            Err(RecordError::Missing {
                column: "v".into(),
                field: "meta.v".into()
            })
        );
        assert_eq!(staged.len(), 1);
    }

    #[test]
    fn values_that_are_not_json_objects_are_refused_and_empty_ones_skipped() {
        let mapping = Mapping::new(&config(""));
        let mut staged = Staged::default();
        assert!(matches!(
            staged.add(&mapping, &record("[1]", 1)),
            Err(RecordError::NotAnObject(_))
        ));
        assert!(matches!(
            staged.add(&mapping, &record("{oops", 1)),
            Err(RecordError::NotAnObject(_))
        ));
        let mut tombstone = record("", 1);
        assert_eq!(staged.add(&mapping, &tombstone), Ok(false));
        tombstone.value = None;
        assert_eq!(staged.add(&mapping, &tombstone), Ok(false));
        assert!(staged.is_empty());
    }

    #[test]
    fn delete_when_marks_deletions_unless_null_or_false() {
        let mapping = Mapping::new(&config("      delete_when: gone\n"));
        let mut staged = Staged::default();
        for (i, gone) in ["true", "false", "null", "\"2024-01-01\""]
            .iter()
            .enumerate()
        {
            let v = format!(r#"{{"id": 1, "meta": {{"v": {i}}}, "gone": {gone}}}"#);
            staged.add(&mapping, &record(&v, i as i64)).unwrap();
        }
        staged
            .add(&mapping, &record(r#"{"id": 1, "meta": {"v": 9}}"#, 9))
            .unwrap();
        let deleted: Vec<bool> = rows(&staged)
            .iter()
            .map(|r| r["$del"].as_bool().unwrap())
            .collect();
        assert_eq!(deleted, vec![true, false, false, true, false]);
    }

    #[test]
    fn event_ids_come_from_a_header_or_a_field() {
        let mut staged = Staged::default();
        let by_header = Mapping::new(&config("      event_id: {header: event-id}\n"));
        staged
            .add(&by_header, &record(r#"{"id": 1, "meta": {"v": 1}}"#, 1))
            .unwrap();
        let by_field = Mapping::new(&config("      event_id: {field: meta.eid}\n"));
        staged
            .add(
                &by_field,
                &record(r#"{"id": 1, "meta": {"v": 1, "eid": 77}}"#, 2),
            )
            .unwrap();
        assert_eq!(
            staged.add(&by_field, &record(r#"{"id": 1, "meta": {"v": 1}}"#, 3)),
            Err(RecordError::NoEventId("field `meta.eid`".into()))
        );
        let mids: Vec<Value> = rows(&staged).iter().map(|r| r["$mid"].clone()).collect();
        assert_eq!(mids, vec![Value::from("e-7"), Value::from("77")]);
    }

    #[test]
    fn single_rows_and_removal_keep_the_rest_intact() {
        let mapping = Mapping::new(&config(""));
        let mut staged = Staged::default();
        for offset in 0..3 {
            let v = format!(r#"{{"id": {offset}, "meta": {{"v": 1}}}}"#);
            staged.add(&mapping, &record(&v, offset)).unwrap();
        }
        let (one, origin) = staged.row(1);
        assert_eq!(origin.offset, 1);
        assert_eq!(
            serde_json::from_str::<Vec<Value>>(&one).unwrap()[0]["id"],
            1
        );
        let removed = staged.origins[1].clone();
        staged.remove(&removed);
        let ids: Vec<Value> = rows(&staged).iter().map(|r| r["id"].clone()).collect();
        assert_eq!(ids, vec![Value::from(0), Value::from(2)]);
        assert_eq!(staged.row(1).1.offset, 2);
    }
}
