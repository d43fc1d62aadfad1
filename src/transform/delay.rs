//! `delay`: a record's outputs are held in a store until the record is due, then sent.
//!
//! The steps after `delay` run when the record comes (so a record that fails them fails at
//! once, with its context, as any other), and what they make of it, encoded for its outputs,
//! is held in the step's store under the due time and the record's offset ([`held_key`]),
//! written to the changelog in the record's transaction. The store is timed: the job looks
//! for due records by the wall clock, records coming in or not, and sends them with their
//! removal from the store in one transaction ([`crate::engine`]'s punctuation). A record due
//! already when it comes goes on at once.

use serde::{Deserialize, Serialize};

use super::Work;
use super::expr::Expression;
use super::window::event_time;
use crate::record::{ErrorKind, Origin, Record, RecordError};
use crate::state::{KeyedState, time_key};

/// A compiled `delay` step.
pub struct Delay {
    /// Its store's index (the order of stateful steps in the pipeline).
    pub store: usize,
    /// When a record is due (`until`); `None`: its timestamp plus `fixed_ms`.
    pub until: Option<Expression>,
    pub fixed_ms: Option<i64>,
    /// The producer's `message.max.bytes`: a held output, and what a record holds in the
    /// store, must fit in a message (else they could never be sent).
    pub max_bytes: usize,
}

/// One output held until due: the output's index and the record as encoded for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Held {
    pub output: u32,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: Vec<(String, Vec<u8>)>,
    pub timestamp: Option<i64>,
    /// The consumed record it comes from, for its lineage.
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

impl Held {
    fn of(output: usize, r: Record) -> Held {
        Held {
            output: output as u32,
            key: r.key,
            value: r.value,
            headers: r.headers,
            timestamp: r.timestamp,
            topic: r.origin.topic.to_string(),
            partition: r.origin.partition,
            offset: r.origin.offset,
        }
    }

    /// The output's index and its record.
    pub fn into_output(self) -> (usize, Record) {
        (
            self.output as usize,
            Record {
                key: self.key,
                value: self.value,
                headers: self.headers,
                timestamp: self.timestamp,
                origin: Origin {
                    topic: self.topic.into(),
                    partition: self.partition,
                    offset: self.offset,
                },
            },
        )
    }
}

/// The key a record's outputs are held under: its due time, then its offset.
pub fn held_key(due: i64, offset: i64) -> Vec<u8> {
    let mut k = time_key(due).to_vec();
    k.extend_from_slice(&offset.to_be_bytes());
    k
}

/// The held outputs as the store keeps them (postcard: compact, and the bytes of a value or
/// key stay bytes).
pub fn encode(held: &[Held]) -> Vec<u8> {
    // Serialising owned bytes, strings and integers to a vector cannot fail.
    postcard::to_stdvec(held).unwrap_or_default()
}

/// The held outputs a store value holds.
pub fn decode(bytes: &[u8]) -> Result<Vec<Held>, String> {
    postcard::from_bytes(bytes).map_err(|e| format!("a delayed record's stored form: {e}"))
}

impl Delay {
    /// When `work` is due, in milliseconds since the epoch.
    pub(super) fn due(
        &self,
        work: &mut Work<'_>,
        fail: &impl Fn(ErrorKind, String) -> RecordError,
    ) -> Result<i64, RecordError> {
        match (&self.until, self.fixed_ms) {
            (Some(until), _) => event_time(Some(until), work, fail),
            (None, fixed) => Ok(work
                .timestamp
                .unwrap_or_else(crate::state::now_ms)
                .saturating_add(fixed.unwrap_or(0))),
        }
    }

    /// Holds `outputs` of the record at `partition`/`offset` until `due`, or hands them on
    /// when due already.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn hold(
        &self,
        due: i64,
        partition: i32,
        offset: i64,
        outputs: Vec<(usize, Record)>,
        state: &mut dyn KeyedState,
        out: &mut Vec<(usize, Record)>,
        fail: &impl Fn(ErrorKind, String) -> RecordError,
    ) -> Result<(), RecordError> {
        if outputs.is_empty() {
            return Ok(());
        }
        // Checked now, while the record can still be dead-lettered with its context.
        crate::record::check_sizes(&outputs, self.max_bytes)?;
        if due <= crate::state::now_ms() {
            out.extend(outputs);
            return Ok(());
        }
        let key = held_key(due, offset);
        // Records an `explode` made of one consumed record share its offset.
        let mut held = match state.get(self.store, partition, &key).map_err(|e| {
            fail(
                ErrorKind::Unavailable,
                format!("the delayed records cannot be read: {e}"),
            )
        })? {
            Some(bytes) => decode(&bytes).map_err(|m| fail(ErrorKind::BadJson, m))?,
            None => Vec::new(),
        };
        held.extend(outputs.into_iter().map(|(o, r)| Held::of(o, r)));
        let value = encode(&held);
        if value.len() + key.len() + 128 > self.max_bytes {
            return Err(fail(
                ErrorKind::TooLarge,
                format!(
                    "its outputs held until due take {} bytes, over message.max.bytes ({}): they would not fit in the changelog",
                    value.len(),
                    self.max_bytes
                ),
            ));
        }
        state.put(self.store, partition, &key, Some(value));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outputs_too_large_to_send_are_refused_when_the_record_comes() {
        let yaml = "name: t\ninputs: [{topic: in}]\npipeline: [{delay: {name: later, for: 1h}}]\noutputs: [{topic: out}]\nkafka: {producer: {message.max.bytes: '400'}}\n";
        let t = crate::topology::Topology::parse(yaml, "t.yaml").unwrap_or_else(|e| panic!("{e}"));
        let p = crate::transform::Pipeline::compile(&t).unwrap_or_else(|e| panic!("{e:?}"));
        let mut s = crate::state::Stores::new(
            t.store_topics(),
            Box::<crate::state::store::Memory>::default(),
        )
        .with_timed(t.timed_stores());
        let record = |len: usize| Record {
            key: Some(b"k".to_vec()),
            value: Some(vec![b'x'; len]),
            headers: Vec::new(),
            timestamp: Some(crate::state::now_ms()),
            origin: Origin {
                topic: "in".into(),
                partition: 0,
                offset: 7,
            },
        };
        let mut out = Vec::new();
        s.begin_record();
        p.process_with(record(100), &mut s, &mut out).expect("held");
        assert!(out.is_empty(), "held, not sent");
        s.begin_record();
        let e = p.process_with(record(500), &mut s, &mut out).unwrap_err();
        assert_eq!(e.kind, ErrorKind::TooLarge);
    }

    #[test]
    fn held_outputs_come_back_as_they_went_and_keys_sort_by_due_time() {
        let held = vec![Held {
            output: 1,
            key: Some(b"k".to_vec()),
            value: Some(vec![0, 159, 146, 150]),
            headers: vec![("h".into(), b"v".to_vec())],
            timestamp: Some(1_700_000_000_000),
            topic: "in".into(),
            partition: 3,
            offset: 42,
        }];
        assert_eq!(decode(&encode(&held)), Ok(held.clone()));
        assert!(decode(b"\xff").is_err());
        assert!(held_key(-5, 9) < held_key(10, 1));
        assert!(held_key(10, 1) < held_key(10, 2));
        assert!(held_key(10, i64::MAX) < held_key(11, 0));
        let (index, record) = held[0].clone().into_output();
        assert_eq!((index, record.origin.offset), (1, 42));
    }
}
