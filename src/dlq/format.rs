//! What a dead-letter record carries: the original key, value and headers verbatim, plus
//! `onceflow.*` headers saying what failed, where it came from and when.

use std::collections::BTreeMap;

use rdkafka::message::{BorrowedMessage, Headers, Message};

use crate::record::Record;

pub const H_KIND: &str = "onceflow.error.kind";
pub const H_MESSAGE: &str = "onceflow.error.message";
pub const H_STAGE: &str = "onceflow.error.stage";
pub const H_ATTEMPTS: &str = "onceflow.error.attempts";
// A dead letter names its original in the three-header form of lineage (outputs carry one
// `onceflow.origin` header): `dlq inspect` and `dlq replay` read these, and dead letters are
// few, so the broker's cost per header does not weigh here.
pub const H_TOPIC: &str = crate::lineage::TOPIC;
pub const H_PARTITION: &str = crate::lineage::PARTITION;
pub const H_OFFSET: &str = crate::lineage::OFFSET;
/// The original's event id (see [`crate::lineage::ID`]), when it carries one.
pub const H_ID: &str = crate::lineage::ID;
pub const H_TIMESTAMP: &str = "onceflow.origin.timestamp";
pub const H_TOPOLOGY: &str = "onceflow.topology";
pub const H_INSTANCE: &str = "onceflow.instance";
pub const H_FAILED_AT: &str = "onceflow.failed.at";
/// Set on a dead-letter record whose value was left out because the record would be too
/// large for the dead-letter topic (its producer's `message.max.bytes`): says how large it
/// was. The original stays at its origin (`onceflow.origin.*`), where `dlq replay` reads it
/// back from, for as long as that topic retains it.
pub const H_VALUE_DROPPED: &str = "onceflow.error.value-dropped";
/// Set on the marker `onceflow reconcile` writes to every output partition (and the
/// dead-letter topic's) to prove no transaction hangs there: no dead letter, and every
/// reader of onceflow's passes over it.
pub const H_MARKER: &str = "onceflow.reconcile.marker";
/// Set on a replayed record: `<dead-letter topic>/<partition>/<offset>` it was replayed from.
pub const H_REPLAYED_FROM: &str = "onceflow.replayed.from";

const PREFIX: &str = "onceflow.";

/// Why a record is dead-lettered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The error kind, a bounded label such as `decode` or `expression`.
    pub kind: String,
    pub message: String,
    /// The stage that failed, e.g. `pipeline[2] map`.
    pub stage: String,
    pub attempts: u32,
}

/// The dead-letter record of `original`: its key, value, timestamp and headers verbatim, plus
/// the `onceflow.*` headers describing the failure.
pub fn dead_letter(
    original: &Record,
    failure: &Failure,
    topology: &str,
    instance: &str,
    failed_at_ms: i64,
) -> Record {
    let mut rec = original.clone();
    // A record replayed from a dead-letter topic and failing again must not carry two sets.
    rec.headers.retain(|(k, _)| !k.starts_with(PREFIX));
    let o = &original.origin;
    let add = |h: &mut Vec<(String, Vec<u8>)>, k: &str, v: String| {
        h.push((k.to_string(), v.into_bytes()))
    };
    add(&mut rec.headers, H_KIND, failure.kind.clone());
    add(&mut rec.headers, H_MESSAGE, failure.message.clone());
    add(&mut rec.headers, H_STAGE, failure.stage.clone());
    add(&mut rec.headers, H_ATTEMPTS, failure.attempts.to_string());
    add(&mut rec.headers, H_TOPIC, o.topic.to_string());
    add(&mut rec.headers, H_PARTITION, o.partition.to_string());
    add(&mut rec.headers, H_OFFSET, o.offset.to_string());
    if let Some(ts) = original.timestamp {
        add(&mut rec.headers, H_TIMESTAMP, ts.to_string());
    }
    add(&mut rec.headers, H_TOPOLOGY, topology.to_string());
    add(&mut rec.headers, H_INSTANCE, instance.to_string());
    add(&mut rec.headers, H_FAILED_AT, failed_at_ms.to_string());
    rec
}

/// A dead-letter record read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub timestamp: Option<i64>,
    /// The original headers, without the `onceflow.*` ones.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The `onceflow.*` headers.
    pub meta: BTreeMap<String, String>,
}

impl DeadLetter {
    pub fn from_message(msg: &BorrowedMessage<'_>) -> DeadLetter {
        let mut headers = Vec::new();
        let mut meta = BTreeMap::new();
        if let Some(hs) = msg.headers() {
            for h in hs.iter() {
                let value = h.value.unwrap_or_default();
                if h.key.starts_with(PREFIX) {
                    meta.insert(
                        h.key.to_string(),
                        String::from_utf8_lossy(value).into_owned(),
                    );
                } else {
                    headers.push((h.key.to_string(), value.to_vec()));
                }
            }
        }
        DeadLetter {
            partition: msg.partition(),
            offset: msg.offset(),
            key: msg.key().map(<[u8]>::to_vec),
            value: msg.payload().map(<[u8]>::to_vec),
            timestamp: msg.timestamp().to_millis(),
            headers,
            meta,
        }
    }

    pub fn meta(&self, key: &str) -> &str {
        self.meta.get(key).map_or("", String::as_str)
    }

    fn meta_i64(&self, key: &str) -> Option<i64> {
        self.meta.get(key).and_then(|v| v.parse().ok())
    }
}

/// Which dead-letter records a command takes.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Only this error kind.
    pub kind: Option<String>,
    /// Only records that failed at or after this time (ms since the epoch).
    pub since_ms: Option<i64>,
    /// Only records that failed before this time (ms since the epoch).
    pub until_ms: Option<i64>,
    /// Only records from this original partition.
    pub origin_partition: Option<i32>,
}

impl Filter {
    pub fn matches(&self, d: &DeadLetter) -> bool {
        if d.meta.contains_key(H_MARKER) {
            return false;
        }
        let failed_at = d.meta_i64(H_FAILED_AT);
        self.kind.as_deref().is_none_or(|k| d.meta(H_KIND) == k)
            && self
                .since_ms
                .is_none_or(|s| failed_at.is_some_and(|t| t >= s))
            && self
                .until_ms
                .is_none_or(|u| failed_at.is_some_and(|t| t < u))
            && self
                .origin_partition
                .is_none_or(|p| d.meta_i64(H_PARTITION) == Some(i64::from(p)))
    }

    /// A short stable tag of the filter, part of the replay group id so that replays with
    /// different filters keep separate progress.
    pub fn tag(&self) -> String {
        let text = format!("{self:?}");
        // FNV-1a: stable across builds, unlike the std hasher.
        let hash = text.bytes().fold(0xcbf29ce484222325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100000001b3)
        });
        format!("{hash:016x}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Origin;

    fn original() -> Record {
        Record {
            key: Some(b"k".to_vec()),
            value: Some(b"{not json".to_vec()),
            headers: vec![
                ("trace".into(), b"abc".to_vec()),
                (H_KIND.into(), b"stale".to_vec()),
            ],
            timestamp: Some(1_700_000_000_000),
            origin: Origin {
                topic: "orders".into(),
                partition: 3,
                offset: 42,
            },
        }
    }

    fn failure() -> Failure {
        Failure {
            kind: "decode".into(),
            message: "expected value at line 1".into(),
            stage: "decode".into(),
            attempts: 1,
        }
    }

    #[test]
    fn dead_letter_keeps_the_original_verbatim_and_describes_the_failure() {
        let d = dead_letter(&original(), &failure(), "t", "i-0", 1_800_000_000_000);
        assert_eq!(d.key, original().key);
        assert_eq!(d.value, original().value);
        assert_eq!(d.timestamp, original().timestamp);
        let h: BTreeMap<&str, String> = d
            .headers
            .iter()
            .map(|(k, v)| (k.as_str(), String::from_utf8_lossy(v).into_owned()))
            .collect();
        assert_eq!(h["trace"], "abc");
        assert_eq!(
            h[H_KIND], "decode",
            "a stale onceflow header is replaced, not doubled"
        );
        assert_eq!(d.headers.iter().filter(|(k, _)| k == H_KIND).count(), 1);
        assert_eq!(h[H_MESSAGE], "expected value at line 1");
        assert_eq!(h[H_STAGE], "decode");
        assert_eq!(h[H_ATTEMPTS], "1");
        assert_eq!(h[H_TOPIC], "orders");
        assert_eq!(h[H_PARTITION], "3");
        assert_eq!(h[H_OFFSET], "42");
        assert_eq!(h[H_TIMESTAMP], "1700000000000");
        assert_eq!(h[H_TOPOLOGY], "t");
        assert_eq!(h[H_INSTANCE], "i-0");
        assert_eq!(h[H_FAILED_AT], "1800000000000");
    }

    fn letter(kind: &str, partition: &str, at: &str) -> DeadLetter {
        DeadLetter {
            partition: 0,
            offset: 0,
            key: None,
            value: None,
            timestamp: None,
            headers: vec![],
            meta: [
                (H_KIND.to_string(), kind.to_string()),
                (H_PARTITION.to_string(), partition.to_string()),
                (H_FAILED_AT.to_string(), at.to_string()),
            ]
            .into_iter()
            .collect(),
        }
    }

    #[test]
    fn filter_by_kind_time_and_partition() {
        let d = letter("decode", "2", "1000");
        assert!(Filter::default().matches(&d));
        let kind = Filter {
            kind: Some("decode".into()),
            ..Filter::default()
        };
        assert!(kind.matches(&d));
        assert!(!kind.matches(&letter("expression", "2", "1000")));
        let time = Filter {
            since_ms: Some(1000),
            until_ms: Some(2000),
            ..Filter::default()
        };
        assert!(time.matches(&d));
        assert!(!time.matches(&letter("decode", "2", "2000")));
        assert!(!time.matches(&letter("decode", "2", "999")));
        let part = Filter {
            origin_partition: Some(2),
            ..Filter::default()
        };
        assert!(part.matches(&d));
        assert!(!part.matches(&letter("decode", "1", "1000")));
    }

    #[test]
    fn a_reconcile_marker_is_no_dead_letter() {
        let mut d = letter("decode", "2", "1000");
        d.meta.insert(H_MARKER.to_string(), "m".to_string());
        assert!(!Filter::default().matches(&d));
    }

    #[test]
    fn filter_tags_are_stable_and_distinct() {
        let a = Filter::default().tag();
        assert_eq!(a, Filter::default().tag());
        let b = Filter {
            kind: Some("decode".into()),
            ..Filter::default()
        }
        .tag();
        assert_ne!(a, b);
        assert_eq!(a.len(), 16);
    }
}
