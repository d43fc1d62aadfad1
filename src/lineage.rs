//! Lineage: every record a job writes to Kafka (an output or a dead letter) names the
//! consumed record it came from. Pure: headers in, headers out, unit-tested with plain values.
//! The engine hands each output to the transaction with the [`Lineage`] it is written with;
//! the send path folds it into the producer's header list ([`fold_headers`]), so no header
//! is built per record on the way; the outbox relay, which keeps its records, [`stamp`]s
//! them. `onceflow reconcile` reads the stamps back.
//!
//! An output carries one header, [`ORIGIN`] = `<topic>/<partition>/<offset>`, plus [`ID`]
//! when the consumed record has an event id. The broker parses every header of every record
//! it takes, so each header costs it CPU on every record (docs/benchmarks.md measures it):
//! one header instead of three. Records written by earlier versions carry the three headers
//! [`TOPIC`], [`PARTITION`] and [`OFFSET`]; [`read`] reads both forms, and dead letters keep
//! the three (`dlq inspect` and `dlq replay` read them; dead letters are few).
//!
//! The headers are added when a record is written, not by the pipeline: `onceflow test`
//! compares what the pipeline makes, and an output's `headers: drop` drops the record's own
//! headers, never its lineage (only `lineage: false` does).

use crate::record::{Origin, Record};

/// The consumed record, as `<topic>/<partition>/<offset>` (partition and offset in decimal;
/// read from the right, so a topic may contain `/`).
pub const ORIGIN: &str = "onceflow.origin";
/// The topic of the consumed record, in the three-header form (dead letters, and outputs
/// written before [`ORIGIN`]).
pub const TOPIC: &str = "onceflow.origin.topic";
/// Its partition, in decimal (three-header form).
pub const PARTITION: &str = "onceflow.origin.partition";
/// Its offset, in decimal (three-header form).
pub const OFFSET: &str = "onceflow.origin.offset";
/// Its event id: the value of its input's `id_header` (`message-id` by default), when it
/// carries one.
pub const ID: &str = "onceflow.origin.id";

const PREFIX: &str = "onceflow.origin.";

/// Whether `name` is a lineage header: [`ORIGIN`] or `onceflow.origin.*`.
fn is_lineage(name: &str) -> bool {
    name.strip_prefix(ORIGIN)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
}

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

/// The consumed record an output comes from, as it is written with it: its origin and its
/// event id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lineage<'a> {
    pub origin: &'a Origin,
    pub id: Option<&'a [u8]>,
}

/// The longest [`ORIGIN`] value built on the stack: a Kafka topic name has at most 249
/// characters, then `/`, an `i32` and `/`, an `i64`. Longer ones (an outbox's
/// `postgres:<table>` origin may be) are built on the heap.
const ORIGIN_ON_STACK: usize = 249 + 1 + 11 + 1 + 20;

/// Calls `f` with the value of the [`ORIGIN`] header of `origin`. Built for every output
/// record: on the stack, with no allocation and no formatting machinery.
pub fn with_origin_value<R>(origin: &Origin, f: impl FnOnce(&[u8]) -> R) -> R {
    let mut partition = itoa::Buffer::new();
    let mut offset = itoa::Buffer::new();
    let parts = [
        origin.topic.as_bytes(),
        b"/",
        partition.format(origin.partition).as_bytes(),
        b"/",
        offset.format(origin.offset).as_bytes(),
    ];
    let len: usize = parts.iter().map(|p| p.len()).sum();
    if len > ORIGIN_ON_STACK {
        return f(&parts.concat());
    }
    let mut buf = [0u8; ORIGIN_ON_STACK];
    let mut at = 0;
    for p in parts {
        buf[at..at + p.len()].copy_from_slice(p);
        at += p.len();
    }
    f(&buf[..len])
}

/// Folds `f` over every header a record with `headers` is written with: its own, and with
/// `lineage` the lineage headers of it instead of any it carried already (a record consumed
/// from another job's output names that job's origin, not this one's). The send path folds
/// them straight into the producer's header list: no header is built on the way.
pub fn fold_headers<A>(
    headers: &[(String, Vec<u8>)],
    lineage: Option<Lineage<'_>>,
    init: A,
    mut f: impl FnMut(A, &str, &[u8]) -> A,
) -> A {
    let Some(lineage) = lineage else {
        return headers.iter().fold(init, |acc, (k, v)| f(acc, k, v));
    };
    let acc = headers
        .iter()
        .filter(|(k, _)| !is_lineage(k))
        .fold(init, |acc, (k, v)| f(acc, k, v));
    let acc = with_origin_value(lineage.origin, |v| f(acc, ORIGIN, v));
    match lineage.id {
        Some(id) => f(acc, ID, id),
        None => acc,
    }
}

/// How many headers [`fold_headers`] gives, at most.
pub fn header_count(headers: &[(String, Vec<u8>)], lineage: Option<Lineage<'_>>) -> usize {
    headers.len() + lineage.map_or(0, |l| 1 + usize::from(l.id.is_some()))
}

/// Adds the lineage headers of `origin` (and of its event `id`) to `rec`, replacing any
/// lineage header it carried already, in either form: what [`fold_headers`] gives, kept in
/// the record, for a path that keeps the record (the outbox relay's).
pub fn stamp(rec: &mut Record, origin: &Origin, id: Option<&[u8]>) {
    if rec.headers.iter().any(|(k, _)| is_lineage(k)) {
        rec.headers.retain(|(k, _)| !is_lineage(k));
    }
    rec.headers.reserve(1 + usize::from(id.is_some()));
    rec.headers.push((
        ORIGIN.to_string(),
        with_origin_value(origin, <[u8]>::to_vec),
    ));
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

/// Reads the lineage headers of a written record, in either form (the last of each, as
/// [`stamp`] writes one); [`ORIGIN`] wins over the three-header form when both are there.
pub fn read<'h>(
    headers: impl Iterator<Item = (&'h str, &'h [u8])>,
) -> Result<Stamp<'h>, Unstamped> {
    let (mut whole, mut topic, mut partition, mut offset, mut id) = (None, None, None, None, None);
    let mut any = false;
    for (k, v) in headers {
        if k == ORIGIN {
            any = true;
            whole = Some(v);
            continue;
        }
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
    let (topic, partition, offset) = match whole {
        Some(v) => split_origin(v).ok_or(Unstamped::Malformed)?,
        None => (
            topic
                .and_then(|t| std::str::from_utf8(t).ok())
                .ok_or(Unstamped::Malformed)?,
            number(partition)
                .and_then(|p| i32::try_from(p).ok())
                .ok_or(Unstamped::Malformed)?,
            number(offset).ok_or(Unstamped::Malformed)?,
        ),
    };
    Ok(Stamp {
        topic,
        partition,
        offset,
        id,
    })
}

/// `<topic>/<partition>/<offset>`, split from the right.
fn split_origin(v: &[u8]) -> Option<(&str, i32, i64)> {
    let s = std::str::from_utf8(v).ok()?;
    let mut parts = s.rsplitn(3, '/');
    let offset = parts.next()?.parse().ok()?;
    let partition = parts.next()?.parse().ok()?;
    let topic = parts.next().filter(|t| !t.is_empty())?;
    Some((topic, partition, offset))
}

fn number(v: Option<&[u8]>) -> Option<i64> {
    v.and_then(|v| std::str::from_utf8(v).ok())
        .and_then(|s| s.parse().ok())
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
        assert_eq!(names, vec!["trace", ORIGIN, ID]);
        assert_eq!(r.headers[1].1, b"orders/3/42");
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
        assert_eq!(r.headers.len(), 1);
        assert_eq!(read(pairs(&r)).map(|s| s.id), Ok(None));
    }

    /// The headers of a record consumed from another job's output: its stamps in both forms,
    /// and headers of its own, one of them named like a lineage header but not one.
    const UPSTREAM: [(&str, &str); 7] = [
        (TOPIC, "upstream"),
        (PARTITION, "0"),
        (OFFSET, "9"),
        (ID, "old"),
        (ORIGIN, "upstream/1/2"),
        ("k", "v"),
        ("onceflow.originals", "kept"),
    ];

    #[test]
    fn an_upstream_stamp_is_replaced_not_doubled() {
        let mut r = record(UPSTREAM.to_vec());
        stamp(&mut r, &origin(), None);
        let names: Vec<&str> = r.headers.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, vec!["k", "onceflow.originals", ORIGIN]);
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
        for bad in [
            "t/1",
            "t/x/1",
            "t/1/x",
            "/1/2",
            "t/1/",
            "",
            "t/99999999999/1",
        ] {
            let r = record(vec![(ORIGIN, bad)]);
            assert_eq!(read(pairs(&r)), Err(Unstamped::Malformed), "{bad:?}");
        }
    }

    #[test]
    fn the_three_header_form_of_earlier_records_reads_the_same() {
        let old = record(vec![
            (TOPIC, "orders"),
            (PARTITION, "3"),
            (OFFSET, "42"),
            (ID, "e-7"),
        ]);
        let mut new = record(vec![]);
        stamp(&mut new, &origin(), Some(b"e-7"));
        assert_eq!(read(pairs(&old)), read(pairs(&new)));
        assert!(read(pairs(&old)).is_ok());
    }

    #[test]
    fn the_origin_is_split_from_the_right_so_a_topic_may_hold_slashes() {
        let mut r = record(vec![]);
        let o = Origin {
            topic: "postgres:a/b".into(),
            partition: 0,
            offset: -1,
        };
        stamp(&mut r, &o, None);
        assert_eq!(
            read(pairs(&r)),
            Ok(Stamp {
                topic: "postgres:a/b",
                partition: 0,
                offset: -1,
                id: None,
            })
        );
    }

    #[test]
    fn the_one_header_form_wins_over_the_three() {
        let r = record(vec![
            (TOPIC, "old"),
            (PARTITION, "0"),
            (OFFSET, "0"),
            (ORIGIN, "orders/3/42"),
        ]);
        assert_eq!(
            read(pairs(&r)).map(|s| (s.topic, s.offset)),
            Ok(("orders", 42))
        );
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

    /// What the send path writes: the headers [`fold_headers`] gives.
    fn written(
        headers: &[(String, Vec<u8>)],
        lineage: Option<Lineage<'_>>,
    ) -> Vec<(String, Vec<u8>)> {
        let out = fold_headers(headers, lineage, Vec::new(), |mut out, k, v| {
            out.push((k.to_string(), v.to_vec()));
            out
        });
        assert!(out.len() <= header_count(headers, lineage));
        out
    }

    #[test]
    fn the_send_path_writes_what_a_stamp_keeps() {
        let long = Origin {
            topic: "t".repeat(400).into(),
            partition: i32::MIN,
            offset: i64::MIN,
        };
        let extreme = Origin {
            topic: "t".repeat(249).into(),
            partition: i32::MIN,
            offset: i64::MIN,
        };
        for headers in [vec![], vec![("k", "v")], UPSTREAM.to_vec()] {
            for o in [origin(), long.clone(), extreme.clone()] {
                for id in [None, Some(&b"e-7"[..])] {
                    let mut r = record(headers.clone());
                    let own = r.headers.clone();
                    stamp(&mut r, &o, id);
                    let lineage = Lineage { origin: &o, id };
                    assert_eq!(written(&own, Some(lineage)), r.headers);
                    assert_eq!(written(&own, None), own);
                    let back = read(pairs(&r)).unwrap();
                    assert_eq!(
                        (back.topic, back.partition, back.offset),
                        (&*o.topic, o.partition, o.offset)
                    );
                }
            }
        }
    }

    #[test]
    fn the_origin_value_is_topic_partition_offset() {
        let value = with_origin_value(&origin(), <[u8]>::to_vec);
        assert_eq!(value, b"orders/3/42");
        let o = Origin {
            topic: "postgres:a/b".into(),
            partition: -1,
            offset: i64::MAX,
        };
        let value = with_origin_value(&o, <[u8]>::to_vec);
        assert_eq!(value, b"postgres:a/b/-1/9223372036854775807");
    }
}
