//! How a consumed record becomes a row of a PostgreSQL output: the value of each mapped column
//! (from a path into the JSON value, or the record's key, topic, partition, offset or
//! timestamp), whether it is a deletion, and its message id in the inbox (its event id, or
//! `topic/partition/offset`). Pure: no database and no async type here.
//!
//! Values are made text, which PostgreSQL casts to each column's type (`unnest($n::text[])`
//! then `::type`), so the mapping needs no knowledge of the types beyond which columns are
//! arrays. The PostgreSQL sink stages the rows it makes; reconcile makes the same to know what
//! the sink wrote of a record, and which message id stands for it in the inbox.

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

/// A consumed record as a row of its output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Row {
    /// The message's identity in the inbox.
    pub(crate) mid: String,
    /// Whether the row deletes its id.
    pub(crate) deleted: bool,
    /// The value of each mapped column, in column order, as text (`None` is NULL).
    pub(crate) values: Vec<Option<String>>,
}

/// How records map to rows, compiled from a [`PostgresOutput`].
#[derive(Debug, Clone)]
pub(crate) struct Mapping {
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
    pub(crate) fn new(config: &PostgresOutput) -> Mapping {
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
    pub(crate) fn with_types(mut self, types: &[(String, String)]) -> Mapping {
        for (i, (column, _)) in self.columns.iter().enumerate() {
            self.arrays[i] = types.iter().any(|(c, t)| c == column && t.ends_with("[]"));
        }
        self
    }

    /// How many columns a row has.
    pub(crate) fn width(&self) -> usize {
        self.columns.len()
    }

    /// The position of `column` among the row's values.
    #[cfg(test)]
    pub(crate) fn position(&self, column: &str) -> Option<usize> {
        self.columns.iter().position(|(c, _)| c == column)
    }

    /// The row `record` makes. A record without a value (a Kafka tombstone, an empty value)
    /// makes none; one that cannot become a row is refused.
    pub(crate) fn row(&self, record: &Record) -> Result<Option<Row>, RecordError> {
        let Some(bytes) = record.value.as_deref().filter(|v| !v.is_empty()) else {
            return Ok(None);
        };
        let value: Value = match serde_json::from_slice(bytes) {
            Ok(v @ Value::Object(_)) => v,
            Ok(other) => return Err(RecordError::NotAnObject(kind_of(&other).into())),
            Err(e) => return Err(RecordError::NotAnObject(format!("invalid JSON ({e})"))),
        };
        let values: Vec<Value> = self
            .columns
            .iter()
            .map(|(_, source)| source.read(record, &value))
            .collect();
        for &i in &self.required {
            if values[i].is_null() {
                let (column, source) = &self.columns[i];
                return Err(RecordError::Missing {
                    column: column.clone(),
                    field: describe(source),
                });
            }
        }
        let deleted = self
            .delete_when
            .as_ref()
            .and_then(|path| lookup(&value, path))
            .is_some_and(|v| !matches!(v, Value::Null | Value::Bool(false)));
        let mid = self.message_id(record, &value)?;
        let values = values
            .into_iter()
            .zip(&self.arrays)
            .map(|(v, array)| to_text(v, *array))
            .collect();
        Ok(Some(Row {
            mid,
            deleted,
            values,
        }))
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
fn coordinates(origin: &Origin) -> String {
    format!("{}/{}/{}", origin.topic, origin.partition, origin.offset)
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
    use serde_json::json;

    fn some(s: &str) -> Option<String> {
        Some(s.to_string())
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
}
