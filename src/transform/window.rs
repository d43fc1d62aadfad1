//! Windows of an `aggregate`: the state is kept per key and per time window, and windows
//! close by **stream time**, the largest event time the step has seen on the partition.
//!
//! A record's event time cuts the windows it falls in ([`windows_of`]); it folds into those
//! still open, each its own state. Stream time is kept in the same store (under the key
//! `t`), so it is written to the changelog in the transaction that moved it, restored with
//! the windows, and the same after a restart or a rebalance as before. A window closes when
//! stream time reaches its end plus the grace ([`is_closed`]): a record whose every window
//! has closed is late (dropped and counted, or dead-lettered). A closed window leaves the
//! store (a tombstone in the changelog); with `emit: final` its state goes downstream then,
//! once, in the transaction that deletes it: a crash before that commit leaves both undone,
//! and the records that come again close it again.
//!
//! Sessions are cut by each key's records: a record less than the gap (by event time) from
//! a session of its key joins it, and one that bridges several merges them, their states
//! merged ([`super::aggregate::merge`]). A session is `[start, end]`, its first and last
//! record's time, and closes when stream time reaches its end plus the gap plus the grace:
//! until then a record may still extend it. A key's open sessions are listed under a key of
//! their own ([`list_key`]).
//!
//! A sliding window is each record's: `[time - sliding, time]`, its key's records at most
//! that much older (records of one time share one). The parts the records contribute (`of`)
//! are listed per key, in time order, as long as an open window may reach them, and a
//! window's state is their fold: with `emit: final` when it closes (stream time at its end
//! plus the grace), on update the record's own window and the later records' windows it
//! falls in. A record is late when its own window has closed.
//!
//! A window's key is its end, its start and the record key ([`window_key`]): the store is
//! timed, so the windows that close are found in end order without a scan
//! ([`crate::state::KeyedState::due`]).

use serde_json::Value as Json;

use super::aggregate::{Aggregate, doc_of};
use super::expr::Expression;
use super::{Work, eval_json};
use crate::codec::Value;
use crate::codec::json::type_name;
use crate::record::{ErrorKind, RecordError};
use crate::state::{KeyedState, key_time, time_key};
use crate::topology::{Late, WindowKind, WindowSpec};

/// The key stream time is kept under in a windowed store (no window key is this short, and
/// a store takes no empty key).
const STREAM_TIME: &[u8] = b"t";

/// A compiled `window`.
pub(super) struct Window {
    pub spec: WindowSpec,
    /// The event time; `None`: the record's timestamp.
    pub time: Option<Expression>,
    pub late: Late,
    /// Whether a window's state goes downstream once when it closes (`emit: final`), not on
    /// every update.
    pub emit_final: bool,
    /// The field of the output the state goes in (`as`; default `value`).
    pub field: String,
}

/// The windows `[start, end)` a record at `ts` falls in, oldest first.
pub fn windows_of(ts: i64, spec: &WindowSpec) -> Vec<(i64, i64)> {
    let WindowKind::Time {
        size_ms,
        advance_ms,
    } = spec.kind
    else {
        return Vec::new();
    };
    let last = ts.div_euclid(advance_ms).saturating_mul(advance_ms);
    let count = size_ms / advance_ms;
    (0..count)
        .rev()
        .map(|n| {
            let start = last.saturating_sub(n.saturating_mul(advance_ms));
            (start, start.saturating_add(size_ms))
        })
        .collect()
}

/// The event times a job takes: from year 1 to year 9999. Beyond, the window arithmetic
/// would overflow, and one record would set stream time beyond every other record's.
pub const TIMES: std::ops::RangeInclusive<i64> = -62_135_596_800_000..=253_402_300_799_999;

/// Whether a window ending at `end` has closed at `stream_time`: no record is taken into it
/// any more, and its final state is due.
pub fn is_closed(end: i64, grace_ms: i64, stream_time: i64) -> bool {
    end.saturating_add(grace_ms) <= stream_time
}

/// The store key of the window `[start, end)` of `key`: in end order.
pub fn window_key(start: i64, end: i64, key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(16 + key.len());
    k.extend_from_slice(&time_key(end));
    k.extend_from_slice(&time_key(start));
    k.extend_from_slice(key);
    k
}

/// `(start, end, record key)` of a window key.
pub fn split_window_key(k: &[u8]) -> Option<(i64, i64, &[u8])> {
    let end = key_time(k)?;
    let start = key_time(k.get(8..)?)?;
    Some((start, end, &k[16..]))
}

/// The event time of `work`: `time`'s value (milliseconds since the epoch, or an RFC 3339
/// string), or the record's timestamp.
pub(super) fn event_time(
    time: Option<&Expression>,
    work: &mut Work<'_>,
    fail: &impl Fn(ErrorKind, String) -> RecordError,
) -> Result<i64, RecordError> {
    let ts = match time {
        None => work.timestamp.ok_or_else(|| {
            fail(
                ErrorKind::MissingField,
                "the record has no timestamp: give the event time with `time`".into(),
            )
        })?,
        Some(e) => time_of(e, work, fail)?,
    };
    if !TIMES.contains(&ts) {
        return Err(fail(
            ErrorKind::WrongType,
            format!("event time {ts} is not between the years 1 and 9999"),
        ));
    }
    Ok(ts)
}

/// `e`'s value as a time: milliseconds since the epoch, or an RFC 3339 string.
fn time_of(
    e: &Expression,
    work: &mut Work<'_>,
    fail: &impl Fn(ErrorKind, String) -> RecordError,
) -> Result<i64, RecordError> {
    match eval_json(e, work, fail)? {
        Json::Number(n) => n
            .as_i64()
            .or_else(|| n.as_f64().map(|f| f as i64))
            .ok_or_else(|| fail(ErrorKind::WrongType, format!("`{n}` is not a time"))),
        Json::String(s) => humantime::parse_rfc3339_weak(&s)
            .map_err(|err| {
                fail(
                    ErrorKind::WrongType,
                    format!("`{s}` is not an RFC 3339 time: {err}"),
                )
            })
            .map(|t| match t.duration_since(std::time::UNIX_EPOCH) {
                Ok(d) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
                Err(before) => -i64::try_from(before.duration().as_millis()).unwrap_or(i64::MAX),
            }),
        other => Err(fail(
            ErrorKind::WrongType,
            format!(
                "`{}` gave {}: a time is milliseconds since the epoch or an RFC 3339 string",
                e.source(),
                type_name(&other)
            ),
        )),
    }
}

impl Window {
    /// How long after a window's end stream time must reach before it closes: the grace,
    /// and for a session its gap too (until then a record may still extend it).
    fn close_after(&self) -> i64 {
        match self.spec.kind {
            WindowKind::Time { .. } => self.spec.grace_ms,
            WindowKind::Session { gap_ms } => gap_ms.saturating_add(self.spec.grace_ms),
            WindowKind::Sliding { .. } => self.spec.grace_ms,
        }
    }

    /// Folds `work` into its open windows and closes those stream time has passed: what
    /// goes downstream, oldest window first: the closed windows' final states (with `emit:
    /// final`), then each updated window's new state (on update).
    pub fn apply<'a>(
        &self,
        agg: &Aggregate,
        mut work: Work<'a>,
        state: &mut dyn KeyedState,
        fail: &impl Fn(ErrorKind, String) -> RecordError,
    ) -> Result<(Vec<Work<'a>>, Vec<Work<'a>>), RecordError> {
        let Some(key) = work.key.clone() else {
            return Err(fail(
                ErrorKind::MissingField,
                "the record has no key: `aggregate` keeps a state per record key".into(),
            ));
        };
        let (store, partition) = (agg.store, work.origin.partition);
        let ts = event_time(self.time.as_ref(), &mut work, fail)?;
        let seen = state
            .get(store, partition, STREAM_TIME)
            .map_err(|e| unreadable(fail, e))?
            .and_then(|b| std::str::from_utf8(&b).ok()?.parse::<i64>().ok());
        let stream_time = seen.map_or(ts, |s| s.max(ts));
        let open: Vec<(i64, i64)> = match self.spec.kind {
            WindowKind::Time { .. } => windows_of(ts, &self.spec),
            WindowKind::Session { .. } => vec![(ts, ts)],
            WindowKind::Sliding { within_ms } => vec![(ts.saturating_sub(within_ms), ts)],
        }
        .into_iter()
        .filter(|&(_, end)| !is_closed(end, self.close_after(), stream_time))
        .collect();
        if open.is_empty() {
            if self.late == Late::DeadLetter {
                return Err(fail(
                    ErrorKind::Late,
                    format!(
                        "event time {ts} is after every window it falls in closed (stream time {stream_time}, grace {} ms)",
                        self.spec.grace_ms
                    ),
                ));
            }
            state.late(store);
        }
        if seen != Some(stream_time) {
            state.put(
                store,
                partition,
                STREAM_TIME,
                Some(stream_time.to_string().into_bytes()),
            );
        }
        let mut updated = Vec::new();
        if let WindowKind::Sliding { within_ms } = self.spec.kind
            && !open.is_empty()
        {
            let key_at = (partition, key.as_slice());
            for (start, end, new) in
                self.slide(agg, state, key_at, ts, within_ms, &mut work, fail)?
            {
                updated.push(self.result(&work, key.clone(), start, end, new));
            }
        }
        for (start, end) in open.into_iter().filter(|_| !self.is_sliding()) {
            let (start, end, new) = match self.spec.kind {
                WindowKind::Time { .. } => {
                    let wk = window_key(start, end, &key);
                    let new = fold_into(agg, state, (partition, &wk), None, &mut work, fail)?;
                    (start, end, new)
                }
                WindowKind::Session { gap_ms } => {
                    self.extend_session(agg, state, (partition, &key), ts, gap_ms, &mut work, fail)?
                }
                WindowKind::Sliding { .. } => continue,
            };
            if !self.emit_final {
                updated.push(self.result(&work, key.clone(), start, end, new));
            }
        }
        let closed = self.close(agg, partition, stream_time, state, &work, fail)?;
        Ok((closed, updated))
    }

    /// Takes the record at `ts` into its key's session: the sessions it is within the gap
    /// of are merged with it into one. The session's bounds and new state.
    #[allow(clippy::too_many_arguments)]
    fn extend_session(
        &self,
        agg: &Aggregate,
        state: &mut dyn KeyedState,
        (partition, key): (i32, &[u8]),
        ts: i64,
        gap_ms: i64,
        work: &mut Work<'_>,
        fail: &impl Fn(ErrorKind, String) -> RecordError,
    ) -> Result<(i64, i64, Json), RecordError> {
        let store = agg.store;
        let mut sessions = sessions_of(state, store, partition, key, fail)?;
        let (mut near, far): (Vec<_>, Vec<_>) = sessions
            .drain(..)
            .partition(|&(s, e)| s.saturating_sub(gap_ms) <= ts && ts <= e.saturating_add(gap_ms));
        near.sort_unstable();
        let (mut start, mut end) = (ts, ts);
        let mut merged: Option<Json> = None;
        for (s, e) in near {
            let wk = window_key(s, e, key);
            let bytes = state
                .get(store, partition, &wk)
                .map_err(|err| unreadable(fail, err))?
                .map(std::borrow::Cow::into_owned);
            state.put(store, partition, &wk, None);
            let Some(bytes) = bytes else { continue };
            let value = stored_json(&bytes, fail)?;
            merged = Some(match merged {
                None => value,
                Some(m) => super::aggregate::merge(agg.op, m, value)
                    .map_err(|m| fail(ErrorKind::WrongType, m))?,
            });
            (start, end) = (start.min(s), end.max(e));
        }
        let merged = match merged {
            Some(m) => Some(
                serde_json::to_vec(&m).map_err(|e| fail(ErrorKind::WrongType, e.to_string()))?,
            ),
            None => None,
        };
        let wk = window_key(start, end, key);
        let new = fold_into(agg, state, (partition, &wk), Some(merged), work, fail)?;
        sessions = far;
        sessions.push((start, end));
        put_list(state, store, partition, key, &sessions);
        Ok((start, end, new))
    }

    /// Deletes the windows stream time has closed, and with `emit: final` hands their final
    /// states on.
    fn close<'a>(
        &self,
        agg: &Aggregate,
        partition: i32,
        stream_time: i64,
        state: &mut dyn KeyedState,
        work: &Work<'a>,
        fail: &impl Fn(ErrorKind, String) -> RecordError,
    ) -> Result<Vec<Work<'a>>, RecordError> {
        let below = time_key(
            stream_time
                .saturating_sub(self.close_after())
                .saturating_add(1),
        );
        let store = agg.store;
        let mut out = Vec::new();
        let mut slid: Vec<Vec<u8>> = Vec::new();
        for (wk, bytes) in state
            .due(store, partition, &below)
            .map_err(|e| unreadable(fail, e))?
        {
            state.put(store, partition, &wk, None);
            let Some((start, end, k)) = split_window_key(&wk) else {
                continue;
            };
            if let WindowKind::Session { .. } = self.spec.kind {
                let mut sessions = sessions_of(state, store, partition, k, fail)?;
                sessions.retain(|&s| s != (start, end));
                put_list(state, store, partition, k, &sessions);
            }
            if let WindowKind::Sliding { .. } = self.spec.kind {
                if self.emit_final {
                    let parts = parts_of(state, store, partition, k, fail)?;
                    let value = fold_parts(agg, &parts, start, end, fail)?;
                    out.push(self.result(work, k.to_vec(), start, end, value));
                }
                if !slid.iter().any(|s: &Vec<u8>| s == k) {
                    slid.push(k.to_vec());
                }
            } else if self.emit_final {
                let value = stored_json(&bytes, fail)?;
                out.push(self.result(work, k.to_vec(), start, end, value));
            }
        }
        // The parts no open window reaches any more, once the closed ones are folded.
        if let WindowKind::Sliding { within_ms } = self.spec.kind {
            let oldest = stream_time
                .saturating_sub(self.spec.grace_ms)
                .saturating_sub(within_ms);
            for k in slid {
                let parts = parts_of(state, store, partition, &k, fail)?;
                let kept: Vec<_> = parts.into_iter().filter(|(t, _)| *t >= oldest).collect();
                put_list(state, store, partition, &k, &kept);
            }
        }
        Ok(out)
    }

    fn is_sliding(&self) -> bool {
        matches!(self.spec.kind, WindowKind::Sliding { .. })
    }

    /// Keeps the part of the record at `ts` in its key's list, and marks its window `[ts -
    /// within, ts]`; the windows whose state changed, with their new states (its own and,
    /// for a record that came out of order, the later records' windows it falls in).
    #[allow(clippy::too_many_arguments)]
    fn slide(
        &self,
        agg: &Aggregate,
        state: &mut dyn KeyedState,
        (partition, key): (i32, &[u8]),
        ts: i64,
        within_ms: i64,
        work: &mut Work<'_>,
        fail: &impl Fn(ErrorKind, String) -> RecordError,
    ) -> Result<Vec<(i64, i64, Json)>, RecordError> {
        let store = agg.store;
        let part = agg.part(work, fail)?;
        let mut parts = parts_of(state, store, partition, key, fail)?;
        // After every part of the same time: a key's parts stay in the order they came.
        let at = parts.partition_point(|(t, _)| *t <= ts);
        parts.insert(at, (ts, part));
        put_list(state, store, partition, key, &parts);
        state.put(
            store,
            partition,
            &window_key(ts.saturating_sub(within_ms), ts, key),
            Some(b"0".to_vec()),
        );
        if self.emit_final {
            return Ok(Vec::new());
        }
        let mut ends: Vec<i64> = parts
            .iter()
            .map(|(t, _)| *t)
            .filter(|t| *t >= ts && *t <= ts.saturating_add(within_ms))
            .collect();
        ends.dedup();
        ends.into_iter()
            .map(|end| {
                let start = end.saturating_sub(within_ms);
                Ok((start, end, fold_parts(agg, &parts, start, end, fail)?))
            })
            .collect()
    }

    /// What goes downstream of window `[start, end)` of `key` with state `value`: an object
    /// with the window's bounds and the state, keyed by `key`, timed at the window's last
    /// millisecond (so a window of these results puts it in the window it summarises).
    fn result<'a>(
        &self,
        work: &Work<'a>,
        key: Vec<u8>,
        start: i64,
        end: i64,
        value: Json,
    ) -> Work<'a> {
        let mut doc = serde_json::Map::new();
        doc.insert("start".into(), Json::from(start));
        doc.insert("end".into(), Json::from(end));
        doc.insert(self.field.clone(), value);
        Work {
            value_len: 0,
            key: Some(key),
            key_doc: None,
            body: Value::Json(Some(doc_of(Json::Object(doc)))),
            headers: Vec::new(),
            timestamp: Some(match self.spec.kind {
                WindowKind::Time { .. } => end - 1,
                WindowKind::Session { .. } | WindowKind::Sliding { .. } => end,
            }),
            origin: work.origin.clone(),
        }
    }
}

/// The error of a store that cannot be read.
fn unreadable(
    fail: &impl Fn(ErrorKind, String) -> RecordError,
    e: crate::state::store::StoreError,
) -> RecordError {
    fail(
        ErrorKind::Unavailable,
        format!("the state of this key cannot be read: {e}"),
    )
}

fn stored_json(
    bytes: &[u8],
    fail: &impl Fn(ErrorKind, String) -> RecordError,
) -> Result<Json, RecordError> {
    serde_json::from_slice(bytes).map_err(|e| {
        fail(
            ErrorKind::BadJson,
            format!("the stored state of a window is not JSON: {e}"),
        )
    })
}

/// Folds `work` into the state at `wk` (or, given `base`, into that state instead: a merged
/// session's) and puts the new state there.
fn fold_into(
    agg: &Aggregate,
    state: &mut dyn KeyedState,
    (partition, wk): (i32, &[u8]),
    base: Option<Option<Vec<u8>>>,
    work: &mut Work<'_>,
    fail: &impl Fn(ErrorKind, String) -> RecordError,
) -> Result<Json, RecordError> {
    let stored = match base {
        Some(b) => b,
        None => state
            .get(agg.store, partition, wk)
            .map_err(|e| unreadable(fail, e))?
            .map(std::borrow::Cow::into_owned),
    };
    let new = agg.fold_record(stored.as_deref(), work, fail)?;
    let bytes = serde_json::to_vec(&new).map_err(|e| fail(ErrorKind::WrongType, e.to_string()))?;
    state.put(agg.store, partition, wk, Some(bytes));
    Ok(new)
}

/// The key under which a key's open sessions (or a sliding window's parts) are listed:
/// after every time, so never due.
fn list_key(key: &[u8]) -> Vec<u8> {
    let mut k = vec![0xff; 8];
    k.extend_from_slice(key);
    k
}

/// The open sessions of `key`: `(start, end)`, each its first and last record's time.
fn sessions_of(
    state: &mut dyn KeyedState,
    store: usize,
    partition: i32,
    key: &[u8],
    fail: &impl Fn(ErrorKind, String) -> RecordError,
) -> Result<Vec<(i64, i64)>, RecordError> {
    list_of(state, (store, partition), key, "sessions", fail)
}

/// `key`'s list (its open sessions, or its sliding parts), `what` it holds naming it in an
/// error.
fn list_of<T: serde::de::DeserializeOwned>(
    state: &mut dyn KeyedState,
    (store, partition): (usize, i32),
    key: &[u8],
    what: &str,
    fail: &impl Fn(ErrorKind, String) -> RecordError,
) -> Result<Vec<T>, RecordError> {
    match state
        .get(store, partition, &list_key(key))
        .map_err(|e| unreadable(fail, e))?
    {
        None => Ok(Vec::new()),
        Some(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
            fail(
                ErrorKind::BadJson,
                format!("the stored {what} of this key are not JSON: {e}"),
            )
        }),
    }
}

/// Puts `key`'s list (its open sessions, or its sliding parts); an empty one deletes it.
fn put_list<T: serde::Serialize>(
    state: &mut dyn KeyedState,
    store: usize,
    partition: i32,
    key: &[u8],
    list: &[T],
) {
    // Serialising numbers and JSON values to a vector cannot fail.
    let value = (!list.is_empty()).then(|| serde_json::to_vec(list).unwrap_or_default());
    state.put(store, partition, &list_key(key), value);
}

/// The parts of `key`'s records a sliding window keeps: `(time, part)`, in time order.
fn parts_of(
    state: &mut dyn KeyedState,
    store: usize,
    partition: i32,
    key: &[u8],
    fail: &impl Fn(ErrorKind, String) -> RecordError,
) -> Result<Vec<(i64, Json)>, RecordError> {
    list_of(state, (store, partition), key, "parts", fail)
}

/// The state of the sliding window `[start, end]`: its parts folded in order.
fn fold_parts(
    agg: &Aggregate,
    parts: &[(i64, Json)],
    start: i64,
    end: i64,
    fail: &impl Fn(ErrorKind, String) -> RecordError,
) -> Result<Json, RecordError> {
    let mut state = None;
    for (_, part) in parts.iter().filter(|(t, _)| *t >= start && *t <= end) {
        state = Some(
            super::aggregate::fold(agg.op, state, part.clone())
                .map_err(|m| fail(ErrorKind::WrongType, m))?,
        );
    }
    Ok(state.unwrap_or(Json::Null))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{Origin, Record};
    use crate::state::Stores;
    use crate::topology::Topology;
    use crate::transform::Pipeline;

    fn job(step: &str) -> (Pipeline, Stores) {
        let yaml = format!(
            "name: t\ninputs: [{{topic: in, codec: json}}]\npipeline: [{{aggregate: {step}}}]\noutputs: [{{topic: out}}]\n"
        );
        let t = Topology::parse(&yaml, "t.yaml").unwrap_or_else(|e| panic!("{e}"));
        let p = Pipeline::compile(&t).unwrap_or_else(|e| panic!("{e:?}"));
        let s = Stores::new(
            t.store_topics(),
            Box::<crate::state::store::Memory>::default(),
        )
        .with_timed(t.timed_stores());
        (p, s)
    }

    /// Feeds (key, event time) records on partition 0, each committed alone (or aborted,
    /// where `commit` says no): what each emitted, as `key:start-end=state`, or its error.
    fn feed(p: &Pipeline, s: &mut Stores, records: &[(&str, i64)], commit: bool) -> Vec<String> {
        records
            .iter()
            .map(|(key, ts)| {
                let mut out = Vec::new();
                s.begin_record();
                let r = Record {
                    key: Some(key.as_bytes().to_vec()),
                    value: Some(b"{}".to_vec()),
                    headers: Vec::new(),
                    timestamp: Some(*ts),
                    origin: Origin {
                        topic: "in".into(),
                        partition: 0,
                        offset: 0,
                    },
                };
                match p.process_with(r, s, &mut out) {
                    Ok(()) => {
                        let rejected: Vec<String> = s
                            .take_rejected()
                            .into_iter()
                            .map(|(r, e)| {
                                format!(
                                    "!{}:{}",
                                    String::from_utf8_lossy(r.key.as_deref().unwrap()),
                                    e.kind.name()
                                )
                            })
                            .collect();
                        let _ = s.take_record();
                        if commit {
                            s.commit().expect("a memory store");
                        } else {
                            s.abort();
                        }
                        out.iter()
                            .map(|(_, r)| {
                                let v: Json =
                                    serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
                                format!(
                                    "{}:{}-{}={}",
                                    String::from_utf8_lossy(r.key.as_deref().unwrap()),
                                    v["start"],
                                    v["end"],
                                    v["n"]
                                )
                            })
                            .chain(rejected)
                            .collect::<Vec<_>>()
                            .join(" ")
                    }
                    Err(e) => {
                        s.discard_record();
                        format!("error: {}", e.kind.name())
                    }
                }
            })
            .collect()
    }

    #[test]
    fn final_results_come_once_per_window_and_key_when_stream_time_passes_end_plus_grace() {
        let (p, mut s) =
            job("{name: n, op: count, as: n, emit: final, window: {tumbling: 10ms, grace: 5ms}}");
        let got = feed(
            &p,
            &mut s,
            &[
                ("a", 1),
                ("b", 3),
                ("a", 8),
                ("a", 12),
                ("b", 14),
                // Out of order, within the grace: counted in [0, 10).
                ("a", 2),
                // Stream time 16: [0, 10) closes.
                ("c", 16),
                // Late: [0, 10) closed. Dropped, counted.
                ("a", 9),
                ("a", 19),
                // Stream time 30: [10, 20) closes.
                ("b", 30),
            ],
            true,
        );
        assert_eq!(
            got,
            [
                "",
                "",
                "",
                "",
                "",
                "",
                "a:0-10=3 b:0-10=1",
                "",
                "",
                "a:10-20=2 b:10-20=1 c:10-20=1",
            ]
        );
        // What is left: stream time and the open window [30, 40) of b.
        assert_eq!(s.sizes(), [(2, 1 + 2 + 17 + 1)]);
    }

    #[test]
    fn a_closing_in_an_aborted_transaction_comes_again_with_the_record_that_closes_it() {
        let (p, mut s) = job("{name: n, op: count, as: n, emit: final, window: {tumbling: 10ms}}");
        feed(&p, &mut s, &[("a", 1), ("a", 2)], true);
        assert_eq!(feed(&p, &mut s, &[("b", 10)], false), ["a:0-10=2"]);
        assert_eq!(feed(&p, &mut s, &[("b", 10)], true), ["a:0-10=2"]);
        assert_eq!(feed(&p, &mut s, &[("b", 11)], true), [""]);
    }

    #[test]
    fn a_record_that_bridges_two_sessions_merges_them_and_a_session_closes_after_its_gap() {
        let (p, mut s) =
            job("{name: n, op: count, as: n, emit: final, window: {session: 10ms, grace: 20ms}}");
        let got = feed(
            &p,
            &mut s,
            &[
                ("a", 1),
                ("a", 5),
                ("b", 200),
                ("b", 215),
                // Within the gap of both b sessions: one session [200, 215] of 3.
                ("b", 208),
                // Stream time 300: every session so far closes (end + gap + grace <= 300).
                ("c", 300),
                // Late: 250 + 10 + 20 <= 300.
                ("b", 250),
                ("c", 400),
            ],
            true,
        );
        assert_eq!(
            got,
            ["", "", "a:1-5=2", "", "", "b:200-215=3", "", "c:300-300=1",]
        );
    }

    #[test]
    fn session_updates_show_the_merged_session() {
        let (p, mut s) = job("{name: n, op: count, as: n, window: {session: 15ms, grace: 20ms}}");
        let got = feed(&p, &mut s, &[("a", 1), ("a", 25), ("a", 13)], true);
        assert_eq!(got, ["a:1-1=1", "a:25-25=1", "a:1-25=3"]);
        // What is left: stream time, the session, and the key's list of sessions.
        assert_eq!(s.sizes()[0].0, 3);
    }

    #[test]
    fn a_sliding_window_holds_its_keys_records_within_its_length_before_it() {
        let (p, mut s) =
            job("{name: n, op: count, as: n, emit: final, window: {sliding: 10ms, grace: 5ms}}");
        let got = feed(
            &p,
            &mut s,
            &[
                ("a", 1),
                ("a", 5),
                ("a", 12),
                ("a", 14),
                ("a", 3),
                ("a", 30),
            ],
            true,
        );
        assert_eq!(
            got,
            [
                "",
                "",
                // Stream time 12: the windows ending at 1 and 5 close.
                "a:-9-1=1 a:-5-5=2",
                "",
                // Late: its own window [-7, 3] closed at 8.
                "",
                "a:2-12=2 a:4-14=3",
            ]
        );
    }

    #[test]
    fn a_record_out_of_order_updates_the_later_sliding_windows_it_falls_in() {
        let (p, mut s) = job("{name: n, op: count, as: n, window: {sliding: 10ms, grace: 10ms}}");
        let got = feed(&p, &mut s, &[("a", 1), ("a", 5), ("a", 3)], true);
        assert_eq!(got, ["a:-9-1=1", "a:-5-5=2", "a:-7-3=2 a:-5-5=3"]);
    }

    #[test]
    fn a_final_result_failing_after_the_window_is_rejected_alone() {
        let yaml = "name: t\ninputs: [{topic: in, codec: json}]\npipeline: [{aggregate: {name: n, op: count, as: n, emit: final, window: {tumbling: 10ms}}}, {set_key: 'string(int(string(key)) * 2)'}]\noutputs: [{topic: out}]\n";
        let t = Topology::parse(yaml, "t.yaml").unwrap_or_else(|e| panic!("{e}"));
        let p = Pipeline::compile(&t).unwrap_or_else(|e| panic!("{e:?}"));
        let mut s = Stores::new(
            t.store_topics(),
            Box::<crate::state::store::Memory>::default(),
        )
        .with_timed(t.timed_stores());
        // `a` is no number: its result fails at `set_key`; the record that closed its window
        // stands, and the window is not closed again.
        let got = feed(&p, &mut s, &[("1", 1), ("a", 2), ("1", 12)], true);
        assert_eq!(got, ["", "", "2:0-10=1 !a:expression"]);
        s.begin_record();
        let mut out = Vec::new();
        let r = Record {
            key: Some(b"1".to_vec()),
            value: Some(b"{}".to_vec()),
            headers: Vec::new(),
            timestamp: Some(25),
            origin: Origin {
                topic: "in".into(),
                partition: 0,
                offset: 0,
            },
        };
        p.process_with(r, &mut s, &mut out).unwrap();
        assert_eq!(out.len(), 1, "only the window [10, 20) of `1`");
        assert!(s.take_rejected().is_empty());
    }

    #[test]
    fn hopping_windows_emit_every_update_and_late_records_can_be_dead_lettered() {
        let (p, mut s) = job(
            "{name: n, op: count, as: n, window: {hopping: 20ms, advance: 10ms, late: dead_letter}}",
        );
        let got = feed(
            &p,
            &mut s,
            &[("a", 15), ("a", 25), ("a", 3), ("a", 45)],
            true,
        );
        assert_eq!(
            got,
            [
                "a:0-20=1 a:10-30=1",
                "a:10-30=2 a:20-40=1",
                "error: late",
                "a:30-50=1 a:40-60=1",
            ]
        );
    }

    fn spec(size_ms: i64, advance_ms: i64) -> WindowSpec {
        WindowSpec {
            kind: WindowKind::Time {
                size_ms,
                advance_ms,
            },
            grace_ms: 0,
        }
    }

    #[test]
    fn a_record_falls_in_one_tumbling_window_and_in_size_over_advance_hopping_ones() {
        assert_eq!(windows_of(0, &spec(60, 60)), [(0, 60)]);
        assert_eq!(windows_of(59, &spec(60, 60)), [(0, 60)]);
        assert_eq!(windows_of(60, &spec(60, 60)), [(60, 120)]);
        assert_eq!(windows_of(-1, &spec(60, 60)), [(-60, 0)]);
        assert_eq!(
            windows_of(65, &spec(60, 20)),
            [(20, 80), (40, 100), (60, 120)]
        );
        assert_eq!(
            windows_of(60, &spec(60, 20)),
            [(20, 80), (40, 100), (60, 120)]
        );
        assert_eq!(
            windows_of(59, &spec(60, 20)),
            [(0, 60), (20, 80), (40, 100)]
        );
    }

    #[test]
    fn a_time_at_the_ends_of_the_range_cuts_bounded_windows() {
        let max = *TIMES.end();
        assert_eq!(windows_of(max, &spec(60, 20)).len(), 3);
        assert_eq!(windows_of(i64::MAX, &spec(60, 20)).len(), 3);
        assert_eq!(windows_of(i64::MIN, &spec(60, 60)).len(), 1);
    }

    #[test]
    fn a_window_closes_when_stream_time_reaches_its_end_plus_grace() {
        assert!(!is_closed(60, 10, 69));
        assert!(is_closed(60, 10, 70));
        assert!(is_closed(60, 0, 60));
        assert!(!is_closed(i64::MAX, 10, i64::MAX - 1));
    }

    #[test]
    fn window_keys_sort_by_end_then_start_and_split_back() {
        let a = window_key(-60, 0, b"k");
        let b = window_key(0, 60, b"a");
        let c = window_key(20, 60, b"a");
        assert!(a < b && b < c);
        assert_eq!(split_window_key(&c), Some((20, 60, &b"a"[..])));
        assert!(time_key(59).as_slice() < &c[..] && &c[..] < time_key(61).as_slice());
    }
}
