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

    #[test]
    fn a_row_without_payload_or_headers_has_no_value_and_only_the_relay_headers() {
        let row = Row {
            id: "7".into(),
            aggregatetype: "customer".into(),
            aggregateid: "c-1".into(),
            event_type: "CustomerDeleted".into(),
            payload: None,
            headers: None,
            created_ms: None,
        };
        let (rec, err) = row.to_record("outbox", 0);
        assert!(err.is_none());
        assert_eq!(rec.value, None);
        assert_eq!(rec.timestamp, None);
        let names: Vec<&str> = rec.headers.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["event-id", "event-type", "aggregate-type"]);
    }

    #[test]
    fn headers_that_are_not_an_object_name_the_row_and_the_record_keeps_its_own() {
        let row = Row {
            id: "9".into(),
            aggregatetype: "order".into(),
            aggregateid: "o-1".into(),
            event_type: "OrderPaid".into(),
            payload: Some(b"{}".to_vec()),
            headers: Some("not json".into()),
            created_ms: Some(5),
        };
        let (rec, err) = row.to_record("outbox", 2);
        let err = err.unwrap().to_string();
        assert!(
            err.starts_with("row 9: headers column is not an object of strings: "),
            "{err}"
        );
        assert_eq!(rec.headers.len(), 3);
        assert_eq!(rec.timestamp, Some(5));
        assert_eq!(rec.origin.partition, 2);
    }

    #[test]
    fn an_id_that_is_not_a_number_has_offset_minus_one() {
        assert_eq!(origin("t", 3, "1234").offset, 1234);
        let uuid = origin("t", 3, "0b1e9b5e-6f7a-4d3c-9a59-2f6c1f0e4d11");
        assert_eq!(uuid.offset, -1);
        assert_eq!(uuid.partition, 3);
        assert_eq!(&*uuid.topic, "postgres:t");
    }

    #[test]
    fn a_row_goes_by_default_to_the_prefix_and_its_aggregate_type() {
        assert_eq!(
            default_topic("outbox.event.", "order"),
            "outbox.event.order"
        );
        assert_eq!(default_topic("", "order"), "order");
    }
}
