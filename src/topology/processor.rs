//! The processors of a pipeline, as written in a topology file. Expressions are CEL source
//! text here; [`crate::transform::Pipeline::compile`] compiles them once, at load.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One step of a pipeline.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Processor {
    /// Keeps the records for which this CEL predicate is true; drops the others.
    Filter(String),
    /// Sets fields of the JSON value: field path (dotted) -> CEL expression. Every expression
    /// sees the record as it enters the step; missing parent objects are created.
    Map(BTreeMap<String, String>),
    /// Removes these fields (dotted paths) from the JSON value; absent ones are ignored.
    DropFields(Vec<String>),
    /// Moves fields of the JSON value: old path -> new path; absent ones are ignored.
    Rename(BTreeMap<String, String>),
    /// Sets the record key (the partition key: records of one key keep their order) to the
    /// result of this CEL expression: a string as its UTF-8 bytes, a number in decimal,
    /// bytes as they are, null for no key.
    SetKey(String),
    /// Hands each record to one or more outputs by predicate. Must be the last processor.
    Route(RouteConfig),
    /// Turns one record into one record per element of an array field.
    Explode(ExplodeConfig),
    /// Adds (or replaces) a header.
    SetHeader(SetHeaderConfig),
    /// Drops records whose value is missing or empty (tombstones included).
    DropEmpty {},
    /// Per record key, folds records into a state value kept in a store, and hands the new
    /// state downstream (see [`super::state`]).
    Aggregate(super::state::AggregateConfig),
    /// Passes the first record of each key and drops the ones that follow within a time
    /// (see [`super::state`]).
    Dedupe(super::state::DedupeConfig),
    /// Looks the record's key up in a table (a compacted topic) and puts the row in a field
    /// (see [`super::state`]).
    Join(super::state::JoinConfig),
    /// Holds each record until it is due, by the wall clock (see [`super::time`]).
    Delay(super::time::DelayConfig),
}

impl Processor {
    /// The processor's name in the file, used in messages and error stages.
    pub fn kind(&self) -> &'static str {
        match self {
            Processor::Filter(_) => "filter",
            Processor::Map(_) => "map",
            Processor::DropFields(_) => "drop_fields",
            Processor::Rename(_) => "rename",
            Processor::SetKey(_) => "set_key",
            Processor::Route(_) => "route",
            Processor::Explode(_) => "explode",
            Processor::SetHeader(_) => "set_header",
            Processor::DropEmpty {} => "drop_empty",
            Processor::Aggregate(_) => "aggregate",
            Processor::Dedupe(_) => "dedupe",
            Processor::Join(_) => "join",
            Processor::Delay(_) => "delay",
        }
    }

    /// Whether the processor changes the JSON document (and so needs JSON inputs). A windowed
    /// `aggregate` makes a document of its own, whatever the input's codec.
    pub fn needs_json(&self) -> bool {
        matches!(
            self,
            Processor::Map(_)
                | Processor::DropFields(_)
                | Processor::Rename(_)
                | Processor::Explode(_)
                | Processor::Join(_)
        ) || matches!(self, Processor::Aggregate(a) if a.into.is_some() && a.window.is_none())
    }
}

/// Where `route` sends records.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    /// Rules tried in order.
    pub routes: Vec<RouteRule>,
    /// Outputs of the records no rule matched; `[]` drops them (explicitly).
    pub default: Vec<String>,
    /// `first`: the first matching rule decides; `all`: every matching rule adds its outputs.
    /// Default: `first`.
    #[serde(default)]
    pub mode: RouteMode,
}

/// One rule of `route`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RouteRule {
    /// CEL predicate.
    pub when: String,
    /// Names of the outputs the record goes to when the predicate is true.
    pub to: Vec<String>,
}

/// How many rules of a `route` may match.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RouteMode {
    /// The first matching rule decides.
    #[default]
    First,
    /// Every matching rule adds its outputs (each output at most once per record).
    All,
}

/// Settings of `explode`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExplodeConfig {
    /// Path of the array field. A record whose array is empty gives no record.
    pub field: String,
    /// Where each element goes in the records produced. Default: `field` itself (the array
    /// is replaced by one element). With another path, `field` is removed.
    #[serde(default, rename = "as")]
    pub into: Option<String>,
}

/// Settings of `set_header`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SetHeaderConfig {
    /// Header name.
    pub name: String,
    /// A fixed value (UTF-8). Exactly one of `value` and `expr`.
    #[serde(default)]
    pub value: Option<String>,
    /// A CEL expression; its result is written like `set_key`'s.
    #[serde(default)]
    pub expr: Option<String>,
}
