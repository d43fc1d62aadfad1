//! `aggregate`: per record key, a record folds into its key's state, kept in a store
//! ([`crate::state`]), and the new state goes on downstream. The fold itself ([`fold`]) is a
//! pure function of the old state and the record's part.

use std::borrow::Cow;

use serde_json::Value as Json;

use super::expr::Expression;
use super::{FieldPath, Work, eval_json, filter, json_mut};
use crate::codec::Value;
use crate::codec::json::{Doc, Field, type_name};
use crate::record::{ErrorKind, RecordError};
use crate::state::KeyedState;
use crate::topology::AggregateOp;

/// A compiled `aggregate` step.
pub(super) struct Aggregate {
    /// Its store's index (the order of stateful steps in the pipeline).
    pub store: usize,
    pub op: AggregateOp,
    /// `of`, or for `reduce` the `reduce` expression.
    pub of: Option<Expression>,
    pub init: Option<Expression>,
    pub delete: Option<Expression>,
    pub into: Option<FieldPath>,
}

impl Aggregate {
    /// Folds `work` into its key's state and puts the new state in `work`; a tombstone, or a
    /// record `delete` is true for, deletes the key's state and goes on as a tombstone.
    pub fn apply(
        &self,
        work: &mut Work<'_>,
        state: &mut dyn KeyedState,
        fail: &impl Fn(ErrorKind, String) -> RecordError,
    ) -> Result<(), RecordError> {
        let Some(key) = work.key.clone() else {
            return Err(fail(
                ErrorKind::MissingField,
                "the record has no key: `aggregate` keeps a state per record key".into(),
            ));
        };
        let partition = work.origin.partition;
        let deleted = matches!(work.body, Value::Raw(None) | Value::Json(None))
            || match &self.delete {
                Some(e) => filter(e, work, fail)?,
                None => false,
            };
        if deleted {
            state.put(self.store, partition, &key, None);
            work.body = tombstone(&work.body);
            return Ok(());
        }
        let stored = state.get(self.store, partition, &key).map_err(|e| {
            fail(
                ErrorKind::Unavailable,
                format!("the state of this key cannot be read: {e}"),
            )
        })?;
        let stored = stored.map(std::borrow::Cow::into_owned);
        let new = self.fold_record(stored.as_deref(), work, fail)?;
        let bytes =
            serde_json::to_vec(&new).map_err(|e| fail(ErrorKind::WrongType, e.to_string()))?;
        state.put(self.store, partition, &key, Some(bytes));
        match &self.into {
            None => work.body = Value::Json(Some(doc_of(new))),
            Some(path) => json_mut(work, fail)?
                .set(path, new)
                .map_err(|m| fail(ErrorKind::WrongType, m))?,
        }
        Ok(())
    }

    /// The new state from the stored one (`None`: the key's first record) and `work`.
    pub fn fold_record(
        &self,
        stored: Option<&[u8]>,
        work: &mut Work<'_>,
        fail: &impl Fn(ErrorKind, String) -> RecordError,
    ) -> Result<Json, RecordError> {
        let old: Option<Json> = match stored {
            None => None,
            Some(bytes) => Some(serde_json::from_slice(bytes).map_err(|e| {
                fail(
                    ErrorKind::BadJson,
                    format!("the stored state of this key is not JSON: {e}"),
                )
            })?),
        };
        match self.op {
            AggregateOp::Count => fold(self.op, old, Json::Null),
            AggregateOp::Reduce => self.reduce(old, work, fail)?,
            _ => {
                let Some(of) = &self.of else {
                    return Err(fail(ErrorKind::Expression, "no `of` expression".into()));
                };
                let part = eval_json(of, work, fail)?;
                fold(self.op, old, part)
            }
        }
        .map_err(|m| fail(ErrorKind::WrongType, m))
    }

    /// What `work` contributes to a fold: `of`'s value (nothing for `count`). Not for
    /// `reduce`, which takes the whole record.
    pub fn part(
        &self,
        work: &mut Work<'_>,
        fail: &impl Fn(ErrorKind, String) -> RecordError,
    ) -> Result<Json, RecordError> {
        match (self.op, &self.of) {
            (AggregateOp::Count, _) => Ok(Json::Null),
            (AggregateOp::Reduce, _) | (_, None) => Err(fail(
                ErrorKind::Expression,
                format!("`{}` keeps no part of a record", self.op.name()),
            )),
            (_, Some(of)) => eval_json(of, work, fail),
        }
    }

    /// `init` for a key's first record, then `reduce` with `state` bound to the state.
    fn reduce(
        &self,
        old: Option<Json>,
        work: &mut Work<'_>,
        fail: &impl Fn(ErrorKind, String) -> RecordError,
    ) -> Result<Result<Json, String>, RecordError> {
        let state = match old {
            Some(s) => s,
            None => match &self.init {
                Some(init) => eval_json(init, work, fail)?,
                None => Json::Null,
            },
        };
        let Some(reduce) = &self.of else {
            return Ok(Ok(state));
        };
        work.prepare(reduce);
        let mut scope = work.scope();
        scope.state = Some(&state);
        reduce
            .eval_json(&scope)
            .map(Ok)
            .map_err(|(kind, message)| fail(kind, message))
    }
}

/// The new state of `op` from the old one and the record's part (`of`'s value; nothing for
/// `count`). A part of the wrong type is an error naming it.
pub fn fold(op: AggregateOp, old: Option<Json>, part: Json) -> Result<Json, String> {
    Ok(match (op, old) {
        (AggregateOp::Count, None) => Json::from(1u64),
        (AggregateOp::Count, Some(n)) => Json::from(n.as_u64().unwrap_or(0) + 1),
        (AggregateOp::Sum, old) => add(old.unwrap_or(Json::from(0)), &part)?,
        (AggregateOp::Min | AggregateOp::Max, None) => comparable(part)?,
        (AggregateOp::Min | AggregateOp::Max, Some(old)) => {
            let part = comparable(part)?;
            let less = less_than(&part, &old)?;
            if less == (op == AggregateOp::Min) {
                part
            } else {
                old
            }
        }
        (AggregateOp::Latest, _) | (AggregateOp::First, None) => part,
        (AggregateOp::First, Some(old)) => old,
        (AggregateOp::Reduce, old) => old.unwrap_or(part),
    })
}

/// The state of two sessions merged into one (a record bridged them): `earlier` is the one
/// that started first. `reduce` has no merge (validation refuses it with sessions).
pub fn merge(op: AggregateOp, earlier: Json, later: Json) -> Result<Json, String> {
    match op {
        AggregateOp::Count | AggregateOp::Sum => add(earlier, &later),
        AggregateOp::Min | AggregateOp::Max => fold(op, Some(earlier), later),
        AggregateOp::Latest => Ok(later),
        AggregateOp::First => Ok(earlier),
        AggregateOp::Reduce => Err("`reduce` states cannot be merged".into()),
    }
}

/// `old + part`: integers stay integers (i64), anything else with a fraction is a float.
fn add(old: Json, part: &Json) -> Result<Json, String> {
    let Json::Number(p) = part else {
        return Err(format!(
            "`sum` takes numbers; this record's is {}",
            type_name(part)
        ));
    };
    let Json::Number(o) = &old else {
        return Err(format!(
            "the stored sum is {}, not a number",
            type_name(&old)
        ));
    };
    if let (Some(a), Some(b)) = (o.as_i64(), p.as_i64())
        && let Some(sum) = a.checked_add(b)
    {
        return Ok(Json::from(sum));
    }
    let sum = o.as_f64().unwrap_or(0.0) + p.as_f64().unwrap_or(0.0);
    serde_json::Number::from_f64(sum)
        .map(Json::Number)
        .ok_or_else(|| format!("the sum is not a finite number: {sum}"))
}

fn comparable(v: Json) -> Result<Json, String> {
    match v {
        Json::Number(_) | Json::String(_) => Ok(v),
        other => Err(format!(
            "`min` and `max` take numbers or strings; this record's is {}",
            type_name(&other)
        )),
    }
}

fn less_than(a: &Json, b: &Json) -> Result<bool, String> {
    match (a, b) {
        (Json::Number(x), Json::Number(y)) => match (x.as_i64(), y.as_i64()) {
            (Some(x), Some(y)) => Ok(x < y),
            _ => Ok(x.as_f64().unwrap_or(f64::NAN) < y.as_f64().unwrap_or(f64::NAN)),
        },
        (Json::String(x), Json::String(y)) => Ok(x < y),
        _ => Err(format!(
            "cannot compare {} with the stored {}",
            type_name(a),
            type_name(b)
        )),
    }
}

/// `value` as the pipeline's document: an object by its fields, any other value whole.
pub(super) fn doc_of(value: Json) -> Doc<'static> {
    match value {
        Json::Object(map) => Doc::Object(
            map.into_iter()
                .map(|(k, v)| (Cow::Owned(k), Field::Value(v)))
                .collect(),
        ),
        other => Doc::Other(other),
    }
}

/// A record without value, of the kind of `body`.
fn tombstone<'a>(body: &Value<'a>) -> Value<'a> {
    match body {
        Value::Raw(_) => Value::Raw(None),
        Value::Json(_) => Value::Json(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{Origin, Record};
    use crate::state::Stores;
    use crate::topology::Topology;
    use crate::transform::Pipeline;
    use serde_json::json;

    fn job(step: &str) -> Pipeline {
        let yaml = format!(
            "name: t\ninputs: [{{topic: in, codec: json}}]\npipeline: [{{aggregate: {step}}}]\noutputs: [{{topic: out}}]\n"
        );
        let t = Topology::parse(&yaml, "t.yaml").unwrap_or_else(|e| panic!("{e}"));
        Pipeline::compile(&t).unwrap_or_else(|e| panic!("{e:?}"))
    }

    fn rec(key: Option<&str>, value: Option<&str>, partition: i32) -> Record {
        Record {
            key: key.map(|k| k.as_bytes().to_vec()),
            value: value.map(|v| v.as_bytes().to_vec()),
            headers: Vec::new(),
            timestamp: None,
            origin: Origin {
                topic: "in".into(),
                partition,
                offset: 0,
            },
        }
    }

    /// Runs the records through `p`, each committed alone; what each gave (its output's
    /// value, or its error's message).
    fn feed(p: &Pipeline, state: &mut Stores, records: Vec<Record>) -> Vec<String> {
        records
            .into_iter()
            .map(|r| {
                let mut out = Vec::new();
                state.begin_record();
                match p.process_with(r, state, &mut out) {
                    Ok(()) => {
                        let _ = state.take_record();
                        state.commit().expect("a memory store");
                        out.iter()
                            .map(|(_, r)| {
                                String::from_utf8_lossy(r.value.as_deref().unwrap_or(b"<none>"))
                                    .into_owned()
                            })
                            .collect::<Vec<_>>()
                            .join(",")
                    }
                    Err(e) => {
                        state.discard_record();
                        format!("error: {e}")
                    }
                }
            })
            .collect()
    }

    #[test]
    fn a_count_is_kept_per_key_and_per_partition_and_goes_downstream() {
        let p = job("{name: counts, op: count}");
        let mut s = Stores::default();
        let got = feed(
            &p,
            &mut s,
            vec![
                rec(Some("a"), Some("{}"), 0),
                rec(Some("a"), Some("{}"), 0),
                rec(Some("b"), Some("{}"), 0),
                rec(Some("a"), Some("{}"), 1),
                rec(Some("a"), Some("{}"), 0),
            ],
        );
        assert_eq!(got, ["1", "2", "1", "1", "3"]);
    }

    #[test]
    fn a_sum_goes_into_a_field_and_a_tombstone_or_delete_ends_the_key() {
        let p = job(
            "{name: totals, op: sum, of: value.amount, as: total, delete: 'has(value.closed) && value.closed'}",
        );
        let mut s = Stores::default();
        let got = feed(
            &p,
            &mut s,
            vec![
                rec(Some("a"), Some(r#"{"amount": 5}"#), 0),
                rec(Some("a"), Some(r#"{"amount": 7}"#), 0),
                rec(Some("a"), None, 0),
                rec(Some("a"), Some(r#"{"amount": 1}"#), 0),
                rec(Some("a"), Some(r#"{"amount": 1, "closed": true}"#), 0),
                rec(Some("a"), Some(r#"{"amount": 2}"#), 0),
            ],
        );
        assert_eq!(
            got,
            [
                r#"{"amount":5,"total":5}"#,
                r#"{"amount":7,"total":12}"#,
                "<none>",
                r#"{"amount":1,"total":1}"#,
                "<none>",
                r#"{"amount":2,"total":2}"#,
            ]
        );
    }

    #[test]
    fn reduce_folds_with_state_bound_from_init() {
        let p = job(
            "{name: seen, op: reduce, init: '{\"n\": 0, \"last\": \"\"}', reduce: '{\"n\": state.n + 1, \"last\": value.id}'}",
        );
        let mut s = Stores::default();
        let got = feed(
            &p,
            &mut s,
            vec![
                rec(Some("a"), Some(r#"{"id": "x"}"#), 0),
                rec(Some("a"), Some(r#"{"id": "y"}"#), 0),
            ],
        );
        assert_eq!(got, [r#"{"last":"x","n":1}"#, r#"{"last":"y","n":2}"#]);
    }

    #[test]
    fn a_record_without_key_or_with_a_part_of_the_wrong_type_fails_and_changes_nothing() {
        let p = job("{name: totals, op: sum, of: value.amount}");
        let mut s = Stores::default();
        let got = feed(
            &p,
            &mut s,
            vec![
                rec(Some("a"), Some(r#"{"amount": 5}"#), 0),
                rec(None, Some(r#"{"amount": 5}"#), 0),
                rec(Some("a"), Some(r#"{"amount": "x"}"#), 0),
                rec(Some("a"), Some(r#"{"amount": 1}"#), 0),
            ],
        );
        assert_eq!(got[0], "5");
        assert!(got[1].contains("has no key"), "{}", got[1]);
        assert!(got[2].contains("takes numbers"), "{}", got[2]);
        assert_eq!(got[3], "6");
    }

    fn run(op: AggregateOp, parts: &[Json]) -> Result<Json, String> {
        let mut state = None;
        for p in parts {
            state = Some(fold(op, state, p.clone())?);
        }
        state.ok_or_else(|| "no record".into())
    }

    #[test]
    fn each_op_folds_records_in_order() {
        let nums = [json!(3), json!(-1), json!(7)];
        assert_eq!(run(AggregateOp::Count, &nums), Ok(json!(3)));
        assert_eq!(run(AggregateOp::Sum, &nums), Ok(json!(9)));
        assert_eq!(run(AggregateOp::Min, &nums), Ok(json!(-1)));
        assert_eq!(run(AggregateOp::Max, &nums), Ok(json!(7)));
        assert_eq!(run(AggregateOp::Latest, &nums), Ok(json!(7)));
        assert_eq!(run(AggregateOp::First, &nums), Ok(json!(3)));
        let words = [json!("pear"), json!("apple"), json!("fig")];
        assert_eq!(run(AggregateOp::Min, &words), Ok(json!("apple")));
        assert_eq!(run(AggregateOp::Max, &words), Ok(json!("pear")));
    }

    #[test]
    fn merged_sessions_fold_as_if_their_records_had_been_one_run() {
        assert_eq!(merge(AggregateOp::Count, json!(2), json!(3)), Ok(json!(5)));
        assert_eq!(
            merge(AggregateOp::Sum, json!(2), json!(0.5)),
            Ok(json!(2.5))
        );
        assert_eq!(merge(AggregateOp::Min, json!(2), json!(1)), Ok(json!(1)));
        assert_eq!(merge(AggregateOp::Max, json!(2), json!(1)), Ok(json!(2)));
        assert_eq!(
            merge(AggregateOp::Latest, json!("a"), json!("b")),
            Ok(json!("b"))
        );
        assert_eq!(
            merge(AggregateOp::First, json!("a"), json!("b")),
            Ok(json!("a"))
        );
        assert!(merge(AggregateOp::Reduce, json!(1), json!(2)).is_err());
    }

    #[test]
    fn sums_stay_integers_until_a_fraction_comes() {
        assert_eq!(run(AggregateOp::Sum, &[json!(1), json!(2)]), Ok(json!(3)));
        assert_eq!(
            run(AggregateOp::Sum, &[json!(1), json!(0.5)]),
            Ok(json!(1.5))
        );
        assert_eq!(
            run(AggregateOp::Sum, &[json!(i64::MAX), json!(1)]),
            Ok(json!(9.223372036854776e18))
        );
    }

    #[test]
    fn a_part_of_the_wrong_type_is_an_error_naming_it() {
        let e = run(AggregateOp::Sum, &[json!(1), json!("2")]).unwrap_err();
        assert!(e.contains("numbers") && e.contains("string"), "{e}");
        let e = run(AggregateOp::Max, &[json!(1), json!("2")]).unwrap_err();
        assert!(e.contains("cannot compare"), "{e}");
        let e = run(AggregateOp::Min, &[json!({"a": 1})]).unwrap_err();
        assert!(e.contains("object"), "{e}");
    }
}
