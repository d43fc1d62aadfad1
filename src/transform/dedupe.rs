//! `dedupe`: the first record of each id (the record key, or a CEL expression's value) passes
//! and is remembered in a store ([`crate::state`]) with its timestamp; a record of a
//! remembered id within the window is dropped. The decision ([`seen_within`]) is a pure function of the remembered time
//! and the record's.

use super::expr::Expression;
use super::{Work, eval_bytes};
use crate::record::{ErrorKind, RecordError};
use crate::state::KeyedState;

/// A compiled `dedupe` step.
pub(super) struct Dedupe {
    /// Its store's index (the order of stateful steps in the pipeline).
    pub store: usize,
    /// How long a key is remembered, in milliseconds; `None`: for ever.
    pub within_ms: Option<i64>,
    /// The id remembered; `None`: the record key.
    pub id: Option<Expression>,
}

impl Dedupe {
    /// Whether `work` passes: the first of its key (or the first after the window), which is
    /// then remembered. A dropped record is counted with the transaction that commits it.
    pub fn apply(
        &self,
        work: &mut Work<'_>,
        state: &mut dyn KeyedState,
        fail: &impl Fn(ErrorKind, String) -> RecordError,
    ) -> Result<bool, RecordError> {
        let id = match &self.id {
            Some(e) => eval_bytes(e, work, fail)?,
            None => work.key.clone(),
        };
        let Some(key) = id.as_deref() else {
            let what = if self.id.is_some() {
                "the record's id is null: `dedupe` remembers ids"
            } else {
                "the record has no key: `dedupe` remembers record keys (or set `id`)"
            };
            return Err(fail(ErrorKind::MissingField, what.into()));
        };
        let partition = work.origin.partition;
        let now = work.timestamp.unwrap_or(0);
        let stored = state.get(self.store, partition, key).map_err(|e| {
            fail(
                ErrorKind::Unavailable,
                format!("the state of this key cannot be read: {e}"),
            )
        })?;
        let first = match stored {
            None => None,
            Some(bytes) => Some(
                std::str::from_utf8(&bytes)
                    .ok()
                    .and_then(|t| t.parse::<i64>().ok())
                    .ok_or_else(|| {
                        fail(
                            ErrorKind::BadJson,
                            "the stored time of this key is not a number".into(),
                        )
                    })?,
            ),
        };
        if seen_within(first, now, self.within_ms) {
            state.dropped(self.store);
            return Ok(false);
        }
        let key = key.to_vec();
        state.put(
            self.store,
            partition,
            &key,
            Some(now.to_string().into_bytes()),
        );
        Ok(true)
    }
}

/// Whether a record at `now` (ms) repeats a key first seen at `first`, within `within`.
pub fn seen_within(first: Option<i64>, now: i64, within: Option<i64>) -> bool {
    match (first, within) {
        (None, _) => false,
        (Some(_), None) => true,
        (Some(first), Some(w)) => now.saturating_sub(first) < w,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{Origin, Record};
    use crate::state::Stores;
    use crate::topology::Topology;
    use crate::transform::Pipeline;

    /// The keys that pass a `dedupe` with `within`, of records (key, timestamp) fed in order,
    /// each committed alone.
    fn passed(within: &str, records: &[(&str, i64)]) -> Vec<String> {
        let yaml = format!(
            "name: t\ninputs: [{{topic: in}}]\npipeline: [{{dedupe: {{name: seen{within}}}}}]\noutputs: [{{topic: out}}]\n"
        );
        let t = Topology::parse(&yaml, "t.yaml").unwrap_or_else(|e| panic!("{e}"));
        let p = Pipeline::compile(&t).unwrap_or_else(|e| panic!("{e:?}"));
        let mut state = Stores::default();
        let mut keys = Vec::new();
        for (key, ts) in records {
            let mut out = Vec::new();
            state.begin_record();
            let record = Record {
                key: Some(key.as_bytes().to_vec()),
                value: Some(b"x".to_vec()),
                headers: Vec::new(),
                timestamp: Some(*ts),
                origin: Origin {
                    topic: "in".into(),
                    partition: 0,
                    offset: 0,
                },
            };
            p.process_with(record, &mut state, &mut out)
                .expect("process");
            let _ = state.take_record();
            state.commit().expect("a memory store");
            keys.extend(out.iter().map(|(_, r)| {
                String::from_utf8_lossy(r.key.as_deref().unwrap_or_default()).into_owned()
            }));
        }
        keys
    }

    #[test]
    fn the_first_record_of_a_key_passes_and_repeats_are_dropped_within_the_window() {
        let records = [
            ("a", 0),
            ("a", 5),
            ("b", 6),
            ("a", 1_000),
            ("a", 60_001),
            ("a", 60_002),
        ];
        assert_eq!(passed("", &records), ["a", "b"]);
        assert_eq!(passed(", within: 1m", &records), ["a", "b", "a"]);
    }

    /// Records (key, message-id header) through `dedupe` by `id`; the ids that passed.
    fn passed_by_header(records: &[(&str, &str)]) -> Vec<String> {
        let yaml = "name: t\ninputs: [{topic: in}]\npipeline: [{dedupe: {name: seen, id: 'headers[\"message-id\"]'}}]\noutputs: [{topic: out}]\n";
        let t = Topology::parse(yaml, "t.yaml").unwrap_or_else(|e| panic!("{e}"));
        let p = Pipeline::compile(&t).unwrap_or_else(|e| panic!("{e:?}"));
        let mut state = Stores::default();
        let mut ids = Vec::new();
        for (key, id) in records {
            let mut out = Vec::new();
            state.begin_record();
            let record = Record {
                key: Some(key.as_bytes().to_vec()),
                value: Some(b"x".to_vec()),
                headers: vec![("message-id".into(), id.as_bytes().to_vec())],
                timestamp: Some(0),
                origin: Origin {
                    topic: "in".into(),
                    partition: 0,
                    offset: 0,
                },
            };
            p.process_with(record, &mut state, &mut out)
                .expect("process");
            let _ = state.take_record();
            state.commit().expect("a memory store");
            ids.extend(out.iter().map(|_| id.to_string()));
        }
        ids
    }

    #[test]
    fn an_id_expression_dedupes_events_of_one_key_by_their_message_id() {
        let records = [
            ("order-1", "m1"),
            ("order-1", "m2"),
            ("order-1", "m1"),
            ("order-2", "m3"),
            ("order-2", "m3"),
        ];
        assert_eq!(passed_by_header(&records), ["m1", "m2", "m3"]);
    }

    #[test]
    fn a_key_repeats_within_its_window_only() {
        assert!(!seen_within(None, 10, Some(5)));
        assert!(seen_within(Some(10), 10, None));
        assert!(seen_within(Some(10), 1_000_000, None));
        assert!(seen_within(Some(10), 14, Some(5)));
        assert!(!seen_within(Some(10), 15, Some(5)));
        // A record older than the key's first (out of order) repeats it.
        assert!(seen_within(Some(10), 3, Some(5)));
    }
}
