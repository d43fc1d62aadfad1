//! Staging: consumed records become rows ([`crate::pg::Mapping`]), waiting for the flush.
//! Pure: no database and no async type here, so staging is unit-tested with plain values.
//!
//! A batch is kept by column: one array of text values per mapped column, plus the message's
//! identity in the inbox (`mids`) and whether it is a deletion. The flush sends them as
//! `text[]` parameters and PostgreSQL casts each value to its column's type. A row's position
//! in the arrays is its order in the batch (the last one wins among unversioned rows of one
//! id).

use crate::pg::{Mapping, RecordError};
use crate::record::{Origin, Record};

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
        let Some(row) = mapping.row(record)? else {
            return Ok(false);
        };
        if self.columns.len() != mapping.width() {
            self.columns = vec![Vec::new(); mapping.width()];
        }
        for (column, value) in self.columns.iter_mut().zip(row.values) {
            column.push(value);
        }
        self.mids.push(row.mid);
        self.deleted.push(row.deleted);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::Topology;
    use crate::topology::postgres::PostgresOutput;

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
        let i = mapping.position(name).unwrap();
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
