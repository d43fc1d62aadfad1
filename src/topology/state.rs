//! Stateful steps as written in a topology file (`aggregate`, `dedupe`, `join`), and their
//! checks. Every stateful step keeps a store. Those of `aggregate` and `dedupe` are keyed by
//! the record key and their changes are written to a compacted changelog topic in the job's
//! transaction; that of a `join` is a table read from a compacted topic, which is its own
//! changelog ([`crate::state`]).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::check::is_valid_name;
use super::{Guarantee, Processor, Topology};

/// Settings of `aggregate`: per record key, folds the records into a state value and hands
/// the new state downstream.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AggregateConfig {
    /// The store's name, unique in the topology; its changelog is the topic
    /// `<topology>.<name>.changelog`.
    pub name: String,
    /// How records fold into the state.
    pub op: AggregateOp,
    /// CEL: what of the record `sum`, `min`, `max`, `latest` and `first` take (e.g.
    /// `value.amount`). Not for `count` and `reduce`.
    #[serde(default)]
    pub of: Option<String>,
    /// CEL, `reduce` only: the state of a key's first record, before `reduce` folds it in.
    #[serde(default)]
    pub init: Option<String>,
    /// CEL, `reduce` only: the new state, from `state` (the key's state) and the record.
    #[serde(default)]
    pub reduce: Option<String>,
    /// CEL predicate: a record for which it is true removes its key's state (and a tombstone
    /// goes downstream). A record without a value (a tombstone) always does.
    #[serde(default)]
    pub delete: Option<String>,
    /// Where the new state goes in the record: a field of its JSON value. Default: the state
    /// replaces the value.
    #[serde(default, rename = "as")]
    pub into: Option<String>,
    /// When the new state goes downstream: on every update (the default), once per key per
    /// commit with the key's latest state, or (windows only) once per window and key when it
    /// closes.
    #[serde(default)]
    pub emit: Emit,
    /// The state is kept per key and per time window ([`super::time`]).
    #[serde(default)]
    pub window: Option<Box<super::time::WindowConfig>>,
}

/// When an `aggregate` hands its new state downstream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Emit {
    /// After every record: each update is an output.
    #[default]
    Update,
    /// Once per key per transaction: the outputs of a key's last record in the transaction
    /// (what the pipeline makes of its latest state), sent as it commits. Outputs must be
    /// Kafka topics.
    PerCommit,
    /// Windows only: once per window and key, its final state, when stream time passes the
    /// window's end plus its grace.
    Final,
}

/// Settings of `dedupe`: passes the first record of each id (the record key unless `id` says
/// otherwise), and drops the records of that id that follow within `within` of it (by the
/// records' timestamps).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DedupeConfig {
    /// The store's name, unique in the topology; its changelog is the topic
    /// `<topology>.<name>.changelog`.
    pub name: String,
    /// How long a key is remembered, e.g. `7d`, `12h`, `30m` (by the records' timestamps:
    /// a record more than this after its key's first passes, and is remembered instead).
    /// Default: for ever.
    #[serde(default)]
    pub within: Option<String>,
    /// CEL: the id remembered, e.g. `headers["message-id"]` or `value.event_id` (a string as
    /// its UTF-8 bytes, a number in decimal). Default: the record key. Remembered per input
    /// partition: the copies of an event must share its record key, as a producer's retries
    /// and an outbox relay's replays do.
    #[serde(default)]
    pub id: Option<String>,
}

impl DedupeConfig {
    /// `within` in milliseconds; `None` for ever, `Err` when it does not parse.
    pub fn within_ms(&self) -> Result<Option<i64>, String> {
        self.within
            .as_deref()
            .map(|w| {
                humantime::parse_duration(w)
                    .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
                    .map_err(|e| format!("`{w}` is not a duration like 7d, 12h or 30m: {e}"))
            })
            .transpose()
    }
}

/// Settings of `join`: a record looks a key up in a table (a compacted topic, the last value
/// of each key) and goes on with the match in a field of its value.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JoinConfig {
    /// The store's name, unique in the topology.
    pub name: String,
    /// The table's topic: compacted, its values JSON, the last value of a key its row and a
    /// tombstone its deletion.
    pub table: String,
    /// Every instance holds the whole table (`true`), or each holds the partitions of the
    /// table it holds of the input (`false`, the default: the table is co-partitioned with the
    /// input, same key and same partition count, and the record key is looked up).
    #[serde(default)]
    pub global: bool,
    /// CEL, global tables only: the key to look up, e.g. `value.customer_id` (a string as its
    /// UTF-8 bytes, a number in decimal). Default: the record key.
    #[serde(default)]
    pub key: Option<String>,
    /// The field of the record's JSON value the row goes into.
    #[serde(rename = "as")]
    pub into: String,
    /// What happens to a record whose key has no row. Default: `keep`.
    #[serde(default)]
    pub on_miss: OnMiss,
}

/// What a `join` does with a record whose key has no row in the table.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnMiss {
    /// The record goes on with `null` in the field.
    #[default]
    Keep,
    /// The record is dropped.
    Drop,
    /// The record goes to the dead-letter topic (error kind `no_match`).
    DeadLetter,
}

/// Where a store's state comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreSource {
    /// The job's own changes (`aggregate`, `dedupe`), written to the store's changelog topic in
    /// the job's transaction.
    Changelog,
    /// A table topic co-partitioned with the input (`join`): an instance holds partition p of
    /// it when it holds input partition p.
    Table,
    /// A table topic every instance holds whole (`join` with `global: true`).
    GlobalTable,
}

/// How `aggregate` folds a record into its key's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AggregateOp {
    /// The number of records.
    Count,
    /// The sum of `of` (numbers).
    Sum,
    /// The least `of` (numbers or strings).
    Min,
    /// The greatest `of` (numbers or strings).
    Max,
    /// `of` of the last record.
    Latest,
    /// `of` of the first record, kept.
    First,
    /// `init`, then `reduce` for every record.
    Reduce,
}

impl AggregateOp {
    pub fn name(self) -> &'static str {
        match self {
            AggregateOp::Count => "count",
            AggregateOp::Sum => "sum",
            AggregateOp::Min => "min",
            AggregateOp::Max => "max",
            AggregateOp::Latest => "latest",
            AggregateOp::First => "first",
            AggregateOp::Reduce => "reduce",
        }
    }
}

impl Topology {
    /// The first `aggregate` that emits once per key per commit, if any: the job then holds
    /// its outputs until the commit, the latest per input key.
    pub fn coalescing_step(&self) -> Option<usize> {
        self.pipeline
            .iter()
            .position(|p| matches!(p, Processor::Aggregate(a) if a.emit == Emit::PerCommit))
    }

    /// Every stateful step's store, in pipeline order (a store's index is its place here):
    /// (pipeline index, store name).
    pub fn stores(&self) -> impl Iterator<Item = (usize, &str)> {
        self.pipeline
            .iter()
            .enumerate()
            .filter_map(|(i, p)| match p {
                Processor::Aggregate(a) => Some((i, a.name.as_str())),
                Processor::Dedupe(d) => Some((i, d.name.as_str())),
                Processor::Join(j) => Some((i, j.name.as_str())),
                Processor::Delay(d) => Some((i, d.name.as_str())),
                _ => None,
            })
    }

    /// Every store's topic and where its state comes from, by store index: the changelog of
    /// an `aggregate` or `dedupe`, the table of a `join`.
    pub fn store_topics(&self) -> Vec<(String, StoreSource)> {
        self.stores()
            .map(|(i, name)| match &self.pipeline[i] {
                Processor::Join(j) if j.global => (j.table.clone(), StoreSource::GlobalTable),
                Processor::Join(j) => (j.table.clone(), StoreSource::Table),
                _ => (self.changelog_topic(name), StoreSource::Changelog),
            })
            .collect()
    }

    /// Whether each store is timed, by store index: its keys begin with a time (a window's
    /// end, a delayed record's due time) and the job keeps them in time order.
    pub fn timed_stores(&self) -> Vec<bool> {
        self.stores()
            .map(|(i, _)| match &self.pipeline[i] {
                Processor::Aggregate(a) => a.window.is_some(),
                Processor::Delay(_) => true,
                _ => false,
            })
            .collect()
    }

    /// The changelog topic of the store called `store`.
    pub fn changelog_topic(&self, store: &str) -> String {
        format!("{}.{store}.changelog", self.name)
    }

    /// What a stateful step needs of the topology: one input topic (a store's partition is
    /// its input's partition), exactly-once when it writes state (state written twice would
    /// count twice), and the record key as the input's partitioning key (no `set_key` before
    /// it, but for a global table's `join`).
    pub(super) fn validate_state(&self, issue: &mut dyn FnMut(String, &str)) {
        let mut names: Vec<&str> = Vec::new();
        let mut writes = false;
        let mut rekeyed: Option<usize> = None;
        for (i, p) in self.pipeline.iter().enumerate() {
            let here = format!("pipeline[{i}].{}", p.kind());
            let name = match p {
                Processor::SetKey(_) => {
                    rekeyed.get_or_insert(i);
                    continue;
                }
                Processor::Aggregate(a) => &a.name,
                Processor::Dedupe(d) => &d.name,
                Processor::Join(j) => &j.name,
                Processor::Delay(d) => &d.name,
                _ => continue,
            };
            if !is_valid_name(name) {
                issue(
                    format!("{here}.name"),
                    "must be 1-100 letters, digits, `.`, `_` or `-`",
                );
            } else if names.contains(&name.as_str()) {
                issue(
                    format!("{here}.name"),
                    "is the name of another store: each stateful step needs its own",
                );
            }
            names.push(name);
            // A delay keeps records by due time, whatever their key.
            let global =
                matches!(p, Processor::Join(j) if j.global) || matches!(p, Processor::Delay(_));
            writes |= !matches!(p, Processor::Join(_));
            if let (Some(k), false) = (rekeyed, global) {
                issue(
                    here.clone(),
                    &format!(
                        "works on the record key, which pipeline[{k}].set_key changed: records of one key would meet on several instances. Write the re-keyed records to a topic and add the step in a second topology that reads it"
                    ),
                );
            }
            match p {
                Processor::Aggregate(a) => validate_aggregate(&here, a, issue),
                Processor::Dedupe(d) => {
                    if let Err(e) = d.within_ms() {
                        issue(format!("{here}.within"), &e);
                    }
                }
                Processor::Join(j) => validate_join(&here, j, issue),
                Processor::Delay(d) => {
                    if let Err((field, e)) = d.fixed_ms() {
                        issue(format!("{here}.{field}"), &e);
                    }
                }
                _ => {}
            }
        }
        if names.is_empty() {
            return;
        }
        if self.input_topics().len() != 1 {
            issue(
                "inputs".into(),
                "a topology with a stateful step reads exactly one topic: its stores are kept per partition of that topic",
            );
        }
        let holding = self
            .coalescing_step()
            .map(|i| {
                (
                    i,
                    "aggregate.emit is `per_commit`, which holds outputs until the commit",
                )
            })
            .or_else(|| {
                self.pipeline
                    .iter()
                    .position(|p| matches!(p, Processor::Delay(_)))
                    .map(|i| (i, "delay holds outputs until they are due"))
            });
        if let Some((i, why)) = holding {
            for (o, out) in self.outputs.iter().enumerate() {
                if out.topic.is_none() {
                    issue(
                        format!("outputs[{o}]"),
                        &format!(
                            "must be a Kafka topic: pipeline[{i}].{why}, and a PostgreSQL or HTTP output commits before the job's transaction"
                        ),
                    );
                }
            }
        }
        if writes && self.runtime.guarantee != Guarantee::ExactlyOnce {
            issue(
                "runtime.guarantee".into(),
                "must be `exactly_once` with a stateful step: under at-least-once a restart folds records into the state twice",
            );
        }
    }
}

/// A `join`'s table and key: a co-partitioned table is looked up by the record key.
fn validate_join(here: &str, j: &JoinConfig, issue: &mut dyn FnMut(String, &str)) {
    if j.table.trim().is_empty() {
        issue(format!("{here}.table"), "must name the table's topic");
    }
    if j.key.is_some() && !j.global {
        issue(
            format!("{here}.key"),
            "a co-partitioned table is looked up by the record key, which is what put the record on its partition; to look up another key, read the table whole with `global: true`",
        );
    }
    if !super::is_field_path(&j.into) {
        issue(
            format!("{here}.as"),
            "a field path is one or more names separated by dots, e.g. `customer`",
        );
    }
}

/// The fields `a` needs by its `op`.
fn validate_aggregate(here: &str, a: &AggregateConfig, issue: &mut dyn FnMut(String, &str)) {
    let op = a.op.name();
    match a.op {
        AggregateOp::Count | AggregateOp::Reduce => {
            if a.of.is_some() {
                issue(format!("{here}.of"), &format!("is not used by `op: {op}`"));
            }
        }
        _ => {
            if a.of.is_none() {
                issue(
                    format!("{here}.of"),
                    &format!(
                        "`op: {op}` needs `of`, the CEL expression it takes of each record, e.g. `value.amount`"
                    ),
                );
            }
        }
    }
    let reduce = a.op == AggregateOp::Reduce;
    for (field, set) in [("init", a.init.is_some()), ("reduce", a.reduce.is_some())] {
        if reduce && !set {
            issue(
                format!("{here}.{field}"),
                "`op: reduce` needs `init` and `reduce`",
            );
        } else if !reduce && set {
            issue(
                format!("{here}.{field}"),
                &format!("is only for `op: reduce`, not `op: {op}`"),
            );
        }
    }
    match (&a.window, a.emit) {
        (None, Emit::Final) => issue(
            format!("{here}.emit"),
            "`final` is for windows: add `window`, e.g. `window: {tumbling: 1m}`",
        ),
        (Some(_), Emit::PerCommit) => issue(
            format!("{here}.emit"),
            "a window emits on every update or, with `final`, once when it closes; not `per_commit`",
        ),
        _ => {}
    }
    if let Some(w) = &a.window {
        if let Err((field, e)) = w.spec() {
            issue(format!("{here}.window.{field}"), &e);
        }
        if w.session.is_some() && a.op == AggregateOp::Reduce {
            issue(
                format!("{here}.op"),
                "session windows merge the states of sessions a record bridges, and `reduce` has no merge: use count, sum, min, max, latest or first",
            );
        }
        if w.sliding.is_some() && a.op == AggregateOp::Reduce {
            issue(
                format!("{here}.op"),
                "a sliding window folds the parts its records keep (`of`), and `reduce` takes the whole record: use count, sum, min, max, latest or first",
            );
        }
        if a.delete.is_some() {
            issue(
                format!("{here}.delete"),
                "a window's state ends when the window closes; `delete` is for aggregates without one",
            );
        }
    }
    if a.into.as_deref().is_some_and(|f| !super::is_field_path(f)) {
        issue(
            format!("{here}.as"),
            "a field path is one or more names separated by dots, e.g. `customer.id`",
        );
    }
}

#[cfg(test)]
mod tests {
    use crate::topology::*;

    fn issues(pipeline: &str, extra: &str) -> Vec<(String, String)> {
        let yaml = format!(
            "name: t\ninputs: [{{topic: in, codec: json}}]\npipeline: {pipeline}\noutputs: [{{topic: out}}]\n{extra}"
        );
        Topology::parse_unchecked(&yaml)
            .unwrap()
            .validate()
            .into_iter()
            .map(|i| (i.path, i.message))
            .collect()
    }

    #[test]
    fn a_valid_aggregate_has_no_issue_and_names_its_changelog() {
        let yaml = "name: t\ninputs: [{topic: in, codec: json}]\npipeline: [{aggregate: {name: counts, op: count}}]\noutputs: [{topic: out}]\n";
        let t = Topology::parse(yaml, "t.yaml").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(t.changelog_topic("counts"), "t.counts.changelog");
        assert_eq!(t.stores().collect::<Vec<_>>(), [(0, "counts")]);
    }

    #[test]
    fn every_problem_of_an_aggregate_is_named_with_its_path() {
        let found = issues(
            "[{aggregate: {name: 'a b', op: sum}}, {aggregate: {name: c, op: count, of: value.x, init: '0'}}, {aggregate: {name: c, op: reduce, as: '.x'}}]",
            "",
        );
        let paths: Vec<&str> = found.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(
            paths,
            [
                "pipeline[0].aggregate.name",
                "pipeline[0].aggregate.of",
                "pipeline[1].aggregate.of",
                "pipeline[1].aggregate.init",
                "pipeline[2].aggregate.name",
                "pipeline[2].aggregate.init",
                "pipeline[2].aggregate.reduce",
                "pipeline[2].aggregate.as",
            ],
            "{found:#?}"
        );
        assert!(found[1].1.contains("`op: sum` needs `of`"), "{found:?}");
        assert!(found[4].1.contains("another store"), "{found:?}");
    }

    #[test]
    fn an_aggregate_after_set_key_is_refused_and_says_how_to_split_it() {
        let found = issues(
            "[{set_key: value.customer}, {aggregate: {name: counts, op: count}}]",
            "",
        );
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].0, "pipeline[1].aggregate");
        assert!(
            found[0].1.contains("pipeline[0].set_key") && found[0].1.contains("second topology"),
            "{}",
            found[0].1
        );
    }

    #[test]
    fn a_dedupe_is_checked_like_a_store_and_its_window_must_parse() {
        let found = issues(
            "[{dedupe: {name: seen, within: 7d}}, {dedupe: {name: seen, within: soon}}, {set_key: value.x}, {dedupe: {name: other}}]",
            "",
        );
        let paths: Vec<&str> = found.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(
            paths,
            [
                "pipeline[1].dedupe.name",
                "pipeline[1].dedupe.within",
                "pipeline[3].dedupe"
            ],
            "{found:#?}"
        );
    }

    #[test]
    fn emitting_per_commit_needs_every_output_in_kafka() {
        let yaml = "name: t\ninputs: [{topic: a, codec: json}]\npipeline: [{aggregate: {name: counts, op: count, emit: per_commit}}]\noutputs: [{topic: out}, {postgres: {url_env: U, table: t, id_columns: [id], columns: {id: id}}}]\n";
        let topology = Topology::parse_unchecked(yaml).unwrap();
        assert_eq!(topology.coalescing_step(), Some(0));
        let found: Vec<(String, String)> = topology
            .validate()
            .into_iter()
            .map(|i| (i.path, i.message))
            .filter(|(_, m)| m.contains("emit"))
            .collect();
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].0, "outputs[1]");
        assert!(
            found[0].1.contains("pipeline[0].aggregate.emit"),
            "{found:?}"
        );
    }

    #[test]
    fn windows_and_delays_are_checked_with_their_paths() {
        let found = issues(
            "[{aggregate: {name: a, op: count, emit: final}}, {aggregate: {name: b, op: count, emit: per_commit, window: {tumbling: 1m}}}, {aggregate: {name: c, op: reduce, init: '0', reduce: 'state', window: {session: 5m}}}, {aggregate: {name: d, op: count, delete: 'true', window: {hopping: 5m}}}, {delay: {name: e}}, {set_key: value.x}, {delay: {name: f, for: 1m}}]",
            "",
        );
        let paths: Vec<&str> = found.iter().map(|(p, _)| p.as_str()).collect();
        // A delay keeps records by due time: it may follow set_key.
        assert_eq!(
            paths,
            [
                "pipeline[0].aggregate.emit",
                "pipeline[1].aggregate.emit",
                "pipeline[2].aggregate.op",
                "pipeline[3].aggregate.window.advance",
                "pipeline[3].aggregate.delete",
                "pipeline[4].delay.until",
            ],
            "{found:#?}"
        );
        // A window's result is a document of its own: any input codec will do.
        let yaml = "name: t\ninputs: [{topic: a}]\npipeline: [{aggregate: {name: n, op: count, as: n, emit: final, window: {tumbling: 1s}}}]\noutputs: [{topic: out, codec: json}]\n";
        let found = Topology::parse_unchecked(yaml).unwrap().validate();
        assert!(found.is_empty(), "{found:?}");
        let yaml = "name: t\ninputs: [{topic: a, codec: json}]\npipeline: [{delay: {name: later, for: 1m}}]\noutputs: [{topic: out}, {postgres: {url_env: U, table: t, id_columns: [id], columns: {id: id}}}]\n";
        let found: Vec<(String, String)> = Topology::parse_unchecked(yaml)
            .unwrap()
            .validate()
            .into_iter()
            .map(|i| (i.path, i.message))
            .filter(|(p, _)| p == "outputs[1]")
            .collect();
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].1.contains("pipeline[0].delay"), "{found:?}");
    }

    #[test]
    fn a_stateful_topology_reads_one_topic_exactly_once() {
        let yaml = "name: t\ninputs: [{topic: a, codec: json}, {topic: b, codec: json}]\npipeline: [{aggregate: {name: counts, op: count}}]\noutputs: [{topic: out}]\nruntime: {guarantee: at_least_once}\n";
        let found: Vec<String> = Topology::parse_unchecked(yaml)
            .unwrap()
            .validate()
            .into_iter()
            .map(|i| i.path)
            .collect();
        assert_eq!(found, ["inputs", "runtime.guarantee"]);
    }

    #[test]
    fn a_join_looks_up_the_record_key_unless_its_table_is_global() {
        let found = issues(
            "[{join: {name: c, table: customers, key: value.customer, as: customer}}, {set_key: value.x}, {join: {name: d, table: t, as: 'a..b'}}, {join: {name: p, table: products, global: true, key: value.sku, as: product}}]",
            "runtime: {guarantee: at_least_once}\n",
        );
        let paths: Vec<&str> = found.iter().map(|(p, _)| p.as_str()).collect();
        // A join writes no state: at-least-once is fine; a global one may follow set_key.
        assert_eq!(
            paths,
            [
                "pipeline[0].join.key",
                "pipeline[2].join",
                "pipeline[2].join.as"
            ],
            "{found:#?}"
        );
        assert!(found[0].1.contains("global: true"), "{}", found[0].1);
        let yaml = "name: t\ninputs: [{topic: in, codec: json}]\npipeline: [{join: {name: c, table: customers, as: customer}}, {join: {name: p, table: products, global: true, as: p}}, {aggregate: {name: n, op: count}}]\noutputs: [{topic: out}]\n";
        let t = Topology::parse(yaml, "t.yaml").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            t.store_topics(),
            [
                ("customers".to_string(), StoreSource::Table),
                ("products".to_string(), StoreSource::GlobalTable),
                ("t.n.changelog".to_string(), StoreSource::Changelog),
            ]
        );
    }
}
