//! A claimed row of the outbox table as the record a relay publishes, and where that record
//! goes when no output routes it. Pure.

use crate::record::{Origin, Record};

/// Header of every relayed record: the row's id, the key downstream deduplication uses.
const EVENT_ID_HEADER: &str = "event-id";
/// Header of every relayed record: the row's event type.
const EVENT_TYPE_HEADER: &str = "event-type";
/// Header of every relayed record: the row's aggregate type (what routes it by default).
const AGGREGATE_TYPE_HEADER: &str = "aggregate-type";

/// One claimed row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Row {
    pub(super) id: String,
    pub(super) aggregatetype: String,
    pub(super) aggregateid: String,
    pub(super) event_type: String,
    pub(super) payload: Option<Vec<u8>>,
    /// The headers column's text (a JSON object), when there is one.
    pub(super) headers: Option<String>,
    pub(super) created_ms: Option<i64>,
}

/// Why a row cannot become a record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("row {id}: headers column is not an object of strings: {message}")]
pub(super) struct RowError {
    id: String,
    message: String,
}

impl Row {
    /// The record of the row: key = aggregate id, value = payload, headers `event-id`,
    /// `event-type`, `aggregate-type` and those of the headers column. Its origin names the
    /// table, the shard and (as offset) the id.
    pub(super) fn to_record(&self, table: &str, shard: u32) -> (Record, Option<RowError>) {
        let mut headers = vec![
            (EVENT_ID_HEADER.to_string(), self.id.clone().into_bytes()),
            (
                EVENT_TYPE_HEADER.to_string(),
                self.event_type.clone().into_bytes(),
            ),
            (
                AGGREGATE_TYPE_HEADER.to_string(),
                self.aggregatetype.clone().into_bytes(),
            ),
        ];
        let mut error = None;
        if let Some(text) = &self.headers {
            match serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(text) {
                Ok(map) => {
                    for (k, v) in map {
                        match v {
                            serde_json::Value::String(s) => headers.push((k, s.into_bytes())),
                            serde_json::Value::Null => {}
                            other => headers.push((k, other.to_string().into_bytes())),
                        }
                    }
                }
                Err(e) => {
                    error = Some(RowError {
                        id: self.id.clone(),
                        message: e.to_string(),
                    })
                }
            }
        }
        let record = Record {
            key: Some(self.aggregateid.clone().into_bytes()),
            value: self.payload.clone(),
            headers,
            timestamp: self.created_ms,
            origin: origin(table, shard, &self.id),
        };
        (record, error)
    }
}

/// Where a row's record comes from: topic `postgres:<table>`, partition = shard, offset = id
/// (or -1 for an id that is not a number).
pub(super) fn origin(table: &str, shard: u32, id: &str) -> Origin {
    Origin {
        topic: crate::topology::outbox::origin_topic(table).into(),
        partition: shard as i32,
        offset: id.parse().unwrap_or(-1),
    }
}

/// The default topic of a row: `prefix` and its aggregate type (Debezium's
/// `outbox.event.${routedByValue}`).
pub(super) fn default_topic(prefix: &str, aggregatetype: &str) -> String {
    format!("{prefix}{aggregatetype}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_is_a_record_keyed_by_its_aggregate() {
        let row = Row {
            id: "42".into(),
            aggregatetype: "order".into(),
            aggregateid: "o-7".into(),
            event_type: "OrderPaid".into(),
            payload: Some(br#"{"a":1}"#.to_vec()),
            headers: Some(r#"{"trace":"t1","n":2,"z":null}"#.into()),
            created_ms: Some(1000),
        };
        let (rec, err) = row.to_record("orders_outbox", 1);
        assert!(err.is_none());
        assert_eq!(rec.key.as_deref(), Some(&b"o-7"[..]));
        let h: Vec<(&str, &[u8])> = rec
            .headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_slice()))
            .collect();
        assert_eq!(
            h,
            [
                ("event-id", &b"42"[..]),
                ("event-type", b"OrderPaid"),
                ("aggregate-type", b"order"),
                ("n", b"2"),
                ("trace", b"t1")
            ]
        );
        assert_eq!(rec.origin, origin("orders_outbox", 1, "42"));
        assert_eq!(&*rec.origin.topic, "postgres:orders_outbox");
        let bad = Row {
            headers: Some("[1]".into()),
            ..row
        };
        assert!(bad.to_record("t", 0).1.is_some());
    }
}
