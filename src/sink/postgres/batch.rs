//! Staging: consumed records become rows, waiting for the flush. Pure: no database and no
//! async type here, so the mapping is unit-tested with plain values.
//!
//! A batch is kept by column: one array of text values per mapped column, plus the message's
//! identity in the inbox (`mids`) and whether it is a deletion. The flush sends them as
//! `text[]` parameters and PostgreSQL casts each value to its column's type (`unnest($n::text[])`
//! then `::type`), so the mapping needs no knowledge of the types beyond which columns are
//! arrays. A row's position in the arrays is its order in the batch (the last one wins among
//! unversioned rows of one id).

use serde_json::Value;

use crate::record::{Origin, Record};
use crate::topology::postgres::{EventId, PostgresOutput};

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
            Source::Topic => Value::String(record.origin.topic.to_string()),
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
    /// Whether each column is of an array type: a JSON array becomes an array literal.
    arrays: Vec<bool>,
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
                config.id_columns.contains(c) || config.ordering_column() == Some(c.as_str())
            })
            .map(|(i, _)| i)
            .collect();
        Mapping {
            arrays: vec![false; columns.len()],
            columns,
            required,
            delete_when: config
                .delete_when
                .as_ref()
                .map(|p| p.split('.').map(str::to_string).collect()),
            event_id: config.event_id.clone(),
        }
    }

    /// Marks the columns whose type (`format_type`) is an array.
    pub fn with_types(mut self, types: &[(String, String)]) -> Mapping {
        for (i, (column, _)) in self.columns.iter().enumerate() {
            self.arrays[i] = types.iter().any(|(c, t)| c == column && t.ends_with("[]"));
        }
        self
    }

    /// How many columns a row has.
    pub fn width(&self) -> usize {
        self.columns.len()
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

/// The rows waiting for the next flush, by column.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Staged {
    /// Each row's message identity in the inbox.
    pub mids: Vec<String>,
    /// Whether each row is a deletion.
    pub deleted: Vec<bool>,
    /// The values of each mapped column, as text (`None` is NULL).
    pub columns: Vec<Vec<Option<String>>>,
    /// The consumed record of each row.
    origins: Vec<Origin>,
    /// The same by column, as the inbox's origins table takes them.
    pub origin_topics: Vec<String>,
    pub origin_partitions: Vec<i32>,
    pub origin_offsets: Vec<i64>,
}

impl Staged {
    pub fn len(&self) -> usize {
        self.mids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.mids.is_empty()
    }

    pub fn clear(&mut self) {
        self.mids.clear();
        self.deleted.clear();
        self.columns.iter_mut().for_each(Vec::clear);
        self.origins.clear();
        self.origin_topics.clear();
        self.origin_partitions.clear();
        self.origin_offsets.clear();
    }

    /// Distinct messages in the batch (a consumed record may make several rows).
    pub fn messages(&self) -> u64 {
        let distinct: std::collections::HashSet<&str> =
            self.mids.iter().map(String::as_str).collect();
        distinct.len() as u64
    }

    /// The consumed record of row `i`.
    pub fn origin(&self, i: usize) -> &Origin {
        &self.origins[i]
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

        if self.columns.len() != mapping.width() {
            self.columns = vec![Vec::new(); mapping.width()];
        }
        for ((column, v), array) in self.columns.iter_mut().zip(values).zip(&mapping.arrays) {
            column.push(to_text(v, *array));
        }
        self.mids.push(mid);
        self.deleted.push(deleted);
        self.origins.push(record.origin.clone());
        self.origin_topics.push(record.origin.topic.to_string());
        self.origin_partitions.push(record.origin.partition);
        self.origin_offsets.push(record.origin.offset);
        Ok(true)
    }

    /// Row `i` alone, as a batch of one.
    pub fn row(&self, i: usize) -> Staged {
        Staged {
            mids: vec![self.mids[i].clone()],
            deleted: vec![self.deleted[i]],
            columns: self.columns.iter().map(|c| vec![c[i].clone()]).collect(),
            origins: vec![self.origins[i].clone()],
            origin_topics: vec![self.origin_topics[i].clone()],
            origin_partitions: vec![self.origin_partitions[i]],
            origin_offsets: vec![self.origin_offsets[i]],
        }
    }

    /// Drops the rows of one consumed record (a dead-lettered record, for instance), keeping
    /// the others in order.
    pub fn remove(&mut self, origin: &Origin) {
        let keep: Vec<bool> = self.origins.iter().map(|o| o != origin).collect();
        let mut flags = keep.iter();
        self.mids.retain(|_| *flags.next().unwrap_or(&true));
        let mut flags = keep.iter();
        self.deleted.retain(|_| *flags.next().unwrap_or(&true));
        for column in &mut self.columns {
            let mut flags = keep.iter();
            column.retain(|_| *flags.next().unwrap_or(&true));
        }
        let mut flags = keep.iter();
        self.origin_topics
            .retain(|_| *flags.next().unwrap_or(&true));
        let mut flags = keep.iter();
        self.origin_partitions
            .retain(|_| *flags.next().unwrap_or(&true));
        let mut flags = keep.iter();
        self.origin_offsets
            .retain(|_| *flags.next().unwrap_or(&true));
        self.origins.retain(|o| o != origin);
    }
}

/// A JSON value as the text PostgreSQL reads into a column: strings as they are, numbers and
/// booleans as written, objects (and arrays, unless the column is an array) as JSON, arrays
/// into an array column as an array literal.
fn to_text(v: Value, array_column: bool) -> Option<String> {
    match v {
        Value::Null => None,
        Value::String(s) => Some(s),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => Some(n.to_string()),
        Value::Array(items) if array_column => {
            let mut out = String::new();
            array_literal(&items, &mut out);
            Some(out)
        }
        other => Some(other.to_string()),
    }
}

/// `{1,"a \"b\"",NULL,{2,3}}`: PostgreSQL's array input syntax.
fn array_literal(items: &[Value], out: &mut String) {
    out.push('{');
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        match item {
            Value::Null => out.push_str("NULL"),
            Value::Array(inner) => array_literal(inner, out),
            Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Value::Number(n) => out.push_str(&n.to_string()),
            Value::String(s) => quote_element(s, out),
            Value::Object(_) => quote_element(&item.to_string(), out),
        }
    }
    out.push('}');
}

fn quote_element(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
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
    use serde_json::json;

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

    fn column(staged: &Staged, mapping: &Mapping, name: &str) -> Vec<Option<String>> {
        let i = mapping.columns.iter().position(|(c, _)| c == name).unwrap();
        staged.columns[i].clone()
    }

    fn some(s: &str) -> Option<String> {
        Some(s.to_string())
    }

    #[test]
    fn a_record_becomes_a_row_of_text_values() {
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
        assert_eq!(staged.mids, vec!["orders/2/41".to_string()]);
        assert_eq!(staged.deleted, vec![false]);
        for (name, value) in [
            ("id", "5"),
            ("v", "3"),
            ("name", "Ann"),
            ("first", "a"),
            ("k", "k1"),
            ("p", "2"),
            ("o", "41"),
        ] {
            assert_eq!(column(&staged, &mapping, name), vec![some(value)], "{name}");
        }
    }

    #[test]
    fn values_become_the_text_postgres_reads() {
        assert_eq!(to_text(Value::Null, false), None);
        assert_eq!(to_text(json!(true), false), some("true"));
        assert_eq!(to_text(json!(12.5), false), some("12.5"));
        assert_eq!(to_text(json!({"a": [1]}), false), some(r#"{"a":[1]}"#));
        assert_eq!(to_text(json!([1, 2]), false), some("[1,2]"));
        assert_eq!(
            to_text(json!([1, null, [2, 3], "x \"y\" \\", true]), true),
            some(r#"{1,NULL,{2,3},"x \"y\" \\",true}"#)
        );
    }

    #[test]
    fn missing_optional_fields_are_null_and_missing_ids_or_versions_are_refused() {
        let mapping = Mapping::new(&config(""));
        let mut staged = Staged::default();
        staged
            .add(&mapping, &record(r#"{"id": 5, "meta": {"v": 1}}"#, 1))
            .unwrap();
        assert_eq!(column(&staged, &mapping, "name"), vec![None]);
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
        assert_eq!(staged.deleted, vec![true, false, false, true, false]);
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
        assert_eq!(staged.mids, vec!["e-7".to_string(), "77".to_string()]);
    }

    #[test]
    fn single_rows_and_removal_keep_the_rest_intact() {
        let mapping = Mapping::new(&config(""));
        let mut staged = Staged::default();
        for offset in 0..3 {
            let v = format!(r#"{{"id": {offset}, "meta": {{"v": 1}}}}"#);
            staged.add(&mapping, &record(&v, offset)).unwrap();
        }
        let one = staged.row(1);
        assert_eq!(one.origin(0).offset, 1);
        assert_eq!(column(&one, &mapping, "id"), vec![some("1")]);
        let removed = staged.origin(1).clone();
        staged.remove(&removed);
        assert_eq!(column(&staged, &mapping, "id"), vec![some("0"), some("2")]);
        assert_eq!(
            staged.mids,
            vec!["orders/2/0".to_string(), "orders/2/2".to_string()]
        );
        assert_eq!(staged.origin(1).offset, 2);
    }

    #[test]
    fn array_columns_take_array_literals() {
        let types = vec![("first".to_string(), "text[]".to_string())];
        let text = "name: t\ninputs: [{topic: in}]\noutputs:\n  - name: db\n    postgres:\n      url_env: U\n      table: orders\n      id_columns: [id]\n      columns: {id: id, first: tags}\n";
        let config = Topology::parse(text, "t.yaml")
            .unwrap()
            .postgres_outputs()
            .next()
            .unwrap()
            .1
            .clone();
        let mapping = Mapping::new(&config).with_types(&types);
        let mut staged = Staged::default();
        staged
            .add(&mapping, &record(r#"{"id": 1, "tags": ["a", "b c"]}"#, 1))
            .unwrap();
        assert_eq!(
            column(&staged, &mapping, "first"),
            vec![some(r#"{"a","b c"}"#)]
        );
    }
}
