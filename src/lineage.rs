//! Lineage: every record a job writes to Kafka (an output or a dead letter) names the
//! consumed record it came from, in `onceflow.origin.*` headers. Pure: headers in, headers
//! out, unit-tested with plain values; the engine stamps records as it hands them to the
//! transaction, and `onceflow reconcile` reads the stamps back.
//!
//! The headers are added when a record is written, not by the pipeline: `onceflow test`
//! compares what the pipeline makes, and an output's `headers: drop` drops the record's own
//! headers, never its lineage (only `lineage: false` does).

use crate::record::{Origin, Record};

/// The topic of the consumed record.
pub const TOPIC: &str = "onceflow.origin.topic";
/// Its partition, in decimal.
pub const PARTITION: &str = "onceflow.origin.partition";
/// Its offset, in decimal.
pub const OFFSET: &str = "onceflow.origin.offset";
/// Its event id: the value of its input's `id_header` (`message-id` by default), when it
/// carries one.
pub const ID: &str = "onceflow.origin.id";

const PREFIX: &str = "onceflow.origin.";

/// The event id of a consumed record: the value of header `name`, the last one if the
/// header comes twice (as a header set later replaces an earlier one); `None` when absent or
/// empty.
pub fn event_id<'h>(
    headers: impl Iterator<Item = (&'h str, &'h [u8])>,
    name: &str,
) -> Option<&'h [u8]> {
    headers
        .filter(|(k, _)| *k == name)
        .last()
        .map(|(_, v)| v)
        .filter(|v| !v.is_empty())
}

/// Adds the lineage headers of `origin` (and of its event `id`) to `rec`, replacing any
/// `onceflow.origin.*` header it carried already (a record consumed from another job's
/// output names that job's origin, not this one's).
pub fn stamp(rec: &mut Record, origin: &Origin, id: Option<&[u8]>) {
    if rec.headers.iter().any(|(k, _)| k.starts_with(PREFIX)) {
        rec.headers.retain(|(k, _)| !k.starts_with(PREFIX));
    }
    rec.headers.reserve(3 + usize::from(id.is_some()));
    rec.headers
        .push((TOPIC.to_string(), origin.topic.as_bytes().to_vec()));
    rec.headers.push((
        PARTITION.to_string(),
        origin.partition.to_string().into_bytes(),
    ));
    rec.headers
        .push((OFFSET.to_string(), origin.offset.to_string().into_bytes()));
    if let Some(id) = id {
        rec.headers.push((ID.to_string(), id.to_vec()));
    }
}

/// The origin a written record names, read back from its headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp<'h> {
    pub topic: &'h str,
    pub partition: i32,
    pub offset: i64,
    pub id: Option<&'h [u8]>,
}

/// Why a record's lineage cannot be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unstamped {
    /// It carries no `onceflow.origin.*` header: not written with lineage.
    Absent,
    /// Some of them are missing or not numbers.
    Malformed,
}

/// Reads the lineage headers of a written record (the last of each, as [`stamp`] writes one).
pub fn read<'h>(
    headers: impl Iterator<Item = (&'h str, &'h [u8])>,
) -> Result<Stamp<'h>, Unstamped> {
    let (mut topic, mut partition, mut offset, mut id) = (None, None, None, None);
    let mut any = false;
    for (k, v) in headers {
        let Some(rest) = k.strip_prefix(PREFIX) else {
            continue;
        };
        any = true;
        match rest {
            "topic" => topic = Some(v),
            "partition" => partition = Some(v),
            "offset" => offset = Some(v),
            "id" => id = Some(v),
            _ => {}
        }
    }
    if !any {
        return Err(Unstamped::Absent);
    }
    let number = |v: Option<&[u8]>| {
        v.and_then(|v| std::str::from_utf8(v).ok())
            .and_then(|s| s.parse::<i64>().ok())
    };
    let topic = topic
        .and_then(|t| std::str::from_utf8(t).ok())
        .ok_or(Unstamped::Malformed)?;
    let partition = number(partition)
        .and_then(|p| i32::try_from(p).ok())
        .ok_or(Unstamped::Malformed)?;
    let offset = number(offset).ok_or(Unstamped::Malformed)?;
    Ok(Stamp {
        topic,
        partition,
        offset,
        id,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(headers: Vec<(&str, &str)>) -> Record {
        Record {
            key: None,
            value: Some(b"v".to_vec()),
            headers: headers
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
                .collect(),
            timestamp: None,
            origin: origin(),
        }
    }

    fn origin() -> Origin {
        Origin {
            topic: "orders".into(),
            partition: 3,
            offset: 42,
        }
    }

    fn pairs(r: &Record) -> impl Iterator<Item = (&str, &[u8])> {
        r.headers.iter().map(|(k, v)| (k.as_str(), v.as_slice()))
    }

    #[test]
    fn a_stamp_names_the_origin_and_reads_back() {
        let mut r = record(vec![("trace", "abc")]);
        stamp(&mut r, &origin(), Some(b"e-7"));
        let names: Vec<&str> = r.headers.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, vec!["trace", TOPIC, PARTITION, OFFSET, ID]);
        assert_eq!(
            read(pairs(&r)),
            Ok(Stamp {
                topic: "orders",
                partition: 3,
                offset: 42,
                id: Some(&b"e-7"[..]),
            })
        );
    }

    #[test]
    fn without_an_event_id_there_is_no_id_header() {
        let mut r = record(vec![]);
        stamp(&mut r, &origin(), None);
        assert_eq!(r.headers.len(), 3);
        assert_eq!(read(pairs(&r)).map(|s| s.id), Ok(None));
    }

    #[test]
    fn an_upstream_stamp_is_replaced_not_doubled() {
        let mut r = record(vec![
            (TOPIC, "upstream"),
            (PARTITION, "0"),
            (OFFSET, "9"),
            (ID, "old"),
            ("k", "v"),
        ]);
        stamp(&mut r, &origin(), None);
        assert_eq!(r.headers.iter().filter(|(k, _)| k == TOPIC).count(), 1);
        assert!(!r.headers.iter().any(|(k, _)| k == ID));
        assert_eq!(read(pairs(&r)).map(|s| s.topic), Ok("orders"));
        assert_eq!(r.headers[0].0, "k");
    }

    #[test]
    fn unstamped_and_malformed_records_are_told_apart() {
        assert_eq!(
            read(pairs(&record(vec![("k", "v")]))),
            Err(Unstamped::Absent)
        );
        let bad = record(vec![(TOPIC, "t"), (PARTITION, "x"), (OFFSET, "1")]);
        assert_eq!(read(pairs(&bad)), Err(Unstamped::Malformed));
        let short = record(vec![(TOPIC, "t"), (OFFSET, "1")]);
        assert_eq!(read(pairs(&short)), Err(Unstamped::Malformed));
    }

    #[test]
    fn the_event_id_is_the_last_non_empty_header_of_its_name() {
        let r = record(vec![
            ("message-id", "a"),
            ("other", "x"),
            ("message-id", "b"),
        ]);
        assert_eq!(event_id(pairs(&r), "message-id"), Some(&b"b"[..]));
        assert_eq!(event_id(pairs(&r), "event-id"), None);
        let empty = record(vec![("message-id", "")]);
        assert_eq!(event_id(pairs(&empty), "message-id"), None);
    }
}
