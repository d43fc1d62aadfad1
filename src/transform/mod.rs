//! Pure record processors. Nothing here knows about Kafka clients or async runtimes: the
//! compiled [`Pipeline`] takes a [`Record`] and pushes zero or more `(output index, record)`
//! pairs to a vector, so every processor is tested with plain values.
//!
//! A record's value is decoded once on entry by its input's [`crate::codec::Decoder`], every
//! processor works on the decoded [`crate::codec::Value`], and it is encoded once per output
//! record by the output's [`crate::codec::Encoder`]. Expressions are CEL, compiled once by
//! [`Pipeline::compile`] (see [`expr`]).

mod aggregate;
mod compile;
mod dedupe;
pub mod delay;
pub mod expr;
mod fast;
mod join;
pub mod window;

use serde_json::Value as Json;

use crate::codec::json::{Doc, type_name};
use crate::codec::{Decoder, Encoder, Value};
use crate::record::{ErrorKind, Origin, Record, RecordError, Stage};
use crate::state::KeyedState;

use crate::topology::{ConfigIssue, HeaderPolicy, Processor, RouteMode, Topology};
use compile::Compiler;
use expr::{Expression, Needs, Scope, ValueRef};

/// A consumed record as the pipeline takes it: key and value borrowed from where it was
/// consumed, the rest its own.
#[derive(Debug)]
pub struct Input<'a> {
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    pub headers: Vec<(String, Vec<u8>)>,
    /// Milliseconds since the epoch, when the source record had one.
    pub timestamp: Option<i64>,
    pub origin: Origin,
}

/// A record while it goes through the pipeline.
#[derive(Debug, Clone)]
struct Work<'a> {
    /// Length of the consumed value, to size the encoded one.
    value_len: usize,
    key: Option<Vec<u8>>,
    /// The key as decoded by its input's `key_codec` (not `raw`), until `set_key` replaces
    /// the key.
    key_doc: Option<Json>,
    body: Value<'a>,
    headers: Vec<(String, Vec<u8>)>,
    timestamp: Option<i64>,
    origin: Origin,
}

impl<'a> Work<'a> {
    /// Decodes what `e` needs of the JSON value.
    fn prepare(&mut self, e: &Expression) {
        if let Value::Json(Some(doc)) = &mut self.body {
            match e.needs() {
                Needs::Nothing => {}
                Needs::Paths(paths) => {
                    for p in paths {
                        doc.prepare(p);
                    }
                }
                Needs::Whole => doc.decode_all(),
            }
        }
    }

    /// The record as it is now, its value JSON (or its bytes), for a dead-letter copy.
    fn to_record(&self) -> Record {
        Record {
            key: self.key.clone(),
            value: match &self.body {
                Value::Raw(b) => b.map(<[u8]>::to_vec),
                Value::Json(doc) => doc.as_ref().map(|d| d.to_json().to_string().into_bytes()),
            },
            headers: self.headers.clone(),
            timestamp: self.timestamp,
            origin: self.origin.clone(),
        }
    }

    fn scope(&self) -> Scope<'_, 'a> {
        Scope {
            value: match &self.body {
                Value::Raw(b) => ValueRef::Raw(*b),
                Value::Json(doc) => ValueRef::Json(doc.as_ref()),
            },
            key: self.key.as_deref(),
            key_doc: self.key_doc.as_ref(),
            headers: &self.headers,
            timestamp: self.timestamp,
            origin: &self.origin,
            state: None,
        }
    }
}

/// The decoder `decoders` holds for `topic`.
fn decoder<'d>(decoders: &'d [(String, Box<dyn Decoder>)], topic: &str) -> Option<&'d dyn Decoder> {
    decoders
        .iter()
        .find(|(t, _)| t == topic)
        .map(|(_, d)| d.as_ref())
}

/// A dotted field path, split once at compile time.
type FieldPath = Vec<String>;

fn split(path: &str) -> FieldPath {
    path.split('.').map(str::to_string).collect()
}

enum HeaderValue {
    Fixed(Vec<u8>),
    Computed(Expression),
}

enum Step {
    Filter(Expression),
    Map(Vec<(FieldPath, Expression)>),
    DropFields(Vec<FieldPath>),
    Rename(Vec<(FieldPath, FieldPath)>),
    SetKey(Expression),
    Explode {
        field: FieldPath,
        into: FieldPath,
    },
    SetHeader {
        name: String,
        value: HeaderValue,
    },
    DropEmpty,
    /// Boxed: an aggregate's expressions make it several times the size of the others.
    Aggregate(Box<aggregate::Aggregate>),
    /// An `aggregate` with a `window`.
    Window(Box<(aggregate::Aggregate, window::Window)>),
    Dedupe(dedupe::Dedupe),
    Join(join::Join),
    Delay(delay::Delay),
}

struct Route {
    rules: Vec<(Expression, Vec<usize>)>,
    default: Vec<usize>,
    mode: RouteMode,
    index: usize,
}

struct OutputSpec {
    name: String,
    encoder: Box<dyn Encoder>,
    /// `None`: keys are written as bytes.
    key_encoder: Option<Box<dyn Encoder>>,
    key: Option<Expression>,
    headers: HeaderPolicy,
}

/// The compiled pipeline of a topology: expressions compiled, output names resolved to
/// indexes. Compiled once at load; [`Pipeline::process`] is then a pure function.
pub struct Pipeline {
    /// Value decoders by topic; looked up for every record, and a job reads a handful of
    /// topics: a list compared by name costs less than hashing the name.
    decoders: Vec<(String, Box<dyn Decoder>)>,
    /// Key decoders by topic (of the inputs whose `key_codec` is not `raw`).
    key_decoders: Vec<(String, Box<dyn Decoder>)>,
    /// The schema registry of the Avro codecs (offline unless the job's).
    registry: std::sync::Arc<crate::codec::Registry>,
    steps: Vec<(Step, &'static str)>,
    route: Option<Route>,
    outputs: Vec<OutputSpec>,
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field(
                "steps",
                &self.steps.iter().map(|(_, n)| *n).collect::<Vec<_>>(),
            )
            .field(
                "outputs",
                &self.outputs.iter().map(|o| &o.name).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Pipeline {
    /// Compiles every expression of `topology` and resolves route targets to output indexes.
    /// Returns every problem at once, each with its field path.
    pub fn compile(topology: &Topology) -> Result<Pipeline, Vec<ConfigIssue>> {
        let codecs = crate::codec::Codecs::offline(topology)?;
        Pipeline::compile_with(topology, codecs)
    }

    /// [`Pipeline::compile`] with codecs already set up (a job's: with its schema registry).
    pub fn compile_with(
        topology: &Topology,
        codecs: crate::codec::Codecs,
    ) -> Result<Pipeline, Vec<ConfigIssue>> {
        let mut compiler = Compiler::new(topology);
        let mut steps = Vec::new();
        let mut route = None;
        for (i, p) in topology.pipeline.iter().enumerate() {
            let here = format!("pipeline[{i}].{}", p.kind());
            if let Processor::Route(r) = p {
                if let Some(compiled) = compiler.route(&here, i, r) {
                    route = Some(compiled);
                }
            } else if let Some(step) = compiler.step(here, p) {
                steps.push((step, p.kind()));
            }
        }
        let outputs = compiler.outputs(topology, codecs.encoders, codecs.key_encoders);
        let issues = compiler.into_issues();
        if issues.is_empty() {
            Ok(Pipeline {
                decoders: codecs.decoders.into_iter().collect(),
                key_decoders: codecs.key_decoders.into_iter().collect(),
                registry: codecs.registry,
                steps,
                route,
                outputs,
            })
        } else {
            Err(issues)
        }
    }

    /// The schema registry its Avro codecs use: offline (schemas added by hand, output
    /// schemas with local ids) unless compiled with a job's codecs.
    pub fn registry(&self) -> &std::sync::Arc<crate::codec::Registry> {
        &self.registry
    }

    /// The number of outputs; output indexes given by [`Pipeline::process`] are below it.
    pub fn output_count(&self) -> usize {
        self.outputs.len()
    }

    /// Runs `record` through every processor and appends `(output index, record)` for each
    /// record to write. On error nothing is appended.
    pub fn process(
        &self,
        record: Record,
        out: &mut Vec<(usize, Record)>,
    ) -> Result<(), RecordError> {
        self.process_with(record, &mut crate::state::Stores::default(), out)
    }

    /// [`Pipeline::process`] with the stores its stateful steps read and change.
    pub fn process_with(
        &self,
        record: Record,
        state: &mut dyn KeyedState,
        out: &mut Vec<(usize, Record)>,
    ) -> Result<(), RecordError> {
        let Record {
            key,
            value,
            headers,
            timestamp,
            origin,
        } = record;
        self.process_input(
            Input {
                key: key.as_deref(),
                value: value.as_deref(),
                headers,
                timestamp,
                origin,
            },
            state,
            out,
        )
    }

    /// [`Pipeline::process`] for a record whose key and value are borrowed from where it was
    /// consumed: they are decoded from there and copied only into what is written.
    pub fn process_input(
        &self,
        input: Input<'_>,
        state: &mut dyn KeyedState,
        out: &mut Vec<(usize, Record)>,
    ) -> Result<(), RecordError> {
        let value = input.value;
        let body = match decoder(&self.decoders, &input.origin.topic) {
            Some(decoder) => decoder.decode(value),
            None => crate::codec::raw::Raw.decode(value),
        }
        .map_err(|e| RecordError {
            kind: e.kind,
            stage: Stage::Decode,
            message: e.message,
        })?;
        let key_doc = match decoder(&self.key_decoders, &input.origin.topic) {
            None => None,
            Some(decoder) => match decoder.decode(input.key) {
                Ok(Value::Json(Some(doc))) => Some(doc.to_json()),
                Ok(_) => None,
                Err(e) => {
                    return Err(RecordError {
                        kind: e.kind,
                        stage: Stage::Decode,
                        message: format!("the key: {}", e.message),
                    });
                }
            },
        };
        let work = Work {
            value_len: value.map_or(0, <[u8]>::len),
            key: input.key.map(<[u8]>::to_vec),
            key_doc,
            body,
            headers: input.headers,
            timestamp: input.timestamp,
            origin: input.origin,
        };
        let start = out.len();
        let result = self.run(0, work, state, out);
        if result.is_err() {
            out.truncate(start);
        }
        result
    }

    /// Runs `work` from step `from` to the end, then hands it to the outputs.
    fn run(
        &self,
        from: usize,
        mut work: Work<'_>,
        state: &mut dyn KeyedState,
        out: &mut Vec<(usize, Record)>,
    ) -> Result<(), RecordError> {
        for (index, (step, name)) in self.steps.iter().enumerate().skip(from) {
            let fail = |kind: ErrorKind, message: String| RecordError {
                kind,
                stage: Stage::Processor { index, name },
                message,
            };
            match step {
                Step::Filter(e) => {
                    if !filter(e, &mut work, &fail)? {
                        return Ok(());
                    }
                }
                Step::Map(fields) => map(fields, &mut work, &fail)?,
                Step::DropFields(paths) => drop_fields(paths, &mut work, &fail)?,
                Step::Rename(moves) => rename(moves, &mut work, &fail)?,
                Step::SetKey(e) => {
                    work.key = eval_bytes(e, &mut work, &fail)?;
                    work.key_doc = None;
                }
                Step::SetHeader {
                    name: header,
                    value,
                } => set_header(header, value, &mut work, &fail)?,
                Step::DropEmpty => {
                    if work.body.is_empty() {
                        return Ok(());
                    }
                }
                Step::Explode { field, into } => {
                    return self.explode(index, (field, into), work, state, out, &fail);
                }
                Step::Aggregate(a) => a.apply(&mut work, state, &fail)?,
                Step::Window(aw) => {
                    let (a, w) = aw.as_ref();
                    let (closed, updated) = w.apply(a, work, state, &fail)?;
                    for each in closed {
                        // A final result that fails after the window is no fault of the
                        // record that closed it: dead-lettered alone.
                        let copy = each.to_record();
                        let mark = out.len();
                        if let Err(e) = self.run(index + 1, each, state, out) {
                            out.truncate(mark);
                            state.reject(copy, e);
                        }
                    }
                    for each in updated {
                        self.run(index + 1, each, state, out)?;
                    }
                    return Ok(());
                }
                Step::Delay(d) => {
                    let due = d.due(&mut work, &fail)?;
                    let (partition, offset) = (work.origin.partition, work.origin.offset);
                    let mut held = Vec::new();
                    self.run(index + 1, work, state, &mut held)?;
                    return d.hold(due, partition, offset, held, state, out, &fail);
                }
                Step::Dedupe(d) => {
                    if !d.apply(&mut work, state, &fail)? {
                        return Ok(());
                    }
                }
                Step::Join(j) => {
                    if !j.apply(&mut work, state, &fail)? {
                        return Ok(());
                    }
                }
            }
        }
        self.emit(work, out)
    }

    /// Runs the steps after `index` once per element of the array at `field`, each copy of
    /// `work` holding its element at `into`.
    fn explode(
        &self,
        index: usize,
        (field, into): (&FieldPath, &FieldPath),
        mut work: Work<'_>,
        state: &mut dyn KeyedState,
        out: &mut Vec<(usize, Record)>,
        fail: &impl Fn(ErrorKind, String) -> RecordError,
    ) -> Result<(), RecordError> {
        let doc = json_mut(&mut work, fail)?;
        let taken = doc.take(field).map_err(|m| fail(ErrorKind::WrongType, m))?;
        let items = match taken {
            Some(Json::Array(items)) => items,
            Some(other) => {
                return Err(fail(
                    ErrorKind::WrongType,
                    format!(
                        "`{}` is {}, not an array",
                        field.join("."),
                        type_name(&other)
                    ),
                ));
            }
            None => {
                return Err(fail(
                    ErrorKind::MissingField,
                    format!("no field `{}`", field.join(".")),
                ));
            }
        };
        let count = items.len();
        for (n, item) in items.into_iter().enumerate() {
            // The last element takes the record itself; the others a copy.
            let mut each = if n + 1 == count {
                std::mem::replace(
                    &mut work,
                    Work {
                        value_len: 0,
                        key: None,
                        key_doc: None,
                        body: Value::Json(None),
                        headers: Vec::new(),
                        timestamp: None,
                        origin: Origin {
                            topic: "".into(),
                            partition: 0,
                            offset: 0,
                        },
                    },
                )
            } else {
                work.clone()
            };
            let doc = json_mut(&mut each, fail)?;
            doc.set(into, item)
                .map_err(|m| fail(ErrorKind::WrongType, m))?;
            self.run(index + 1, each, state, out)?;
        }
        Ok(())
    }

    /// Hands a record that went through every step to its outputs, encoded.
    fn emit(&self, mut work: Work<'_>, out: &mut Vec<(usize, Record)>) -> Result<(), RecordError> {
        let Some(route) = &self.route else {
            return self.write(0, work, out);
        };
        let fail = |kind, message| RecordError {
            kind,
            stage: Stage::Processor {
                index: route.index,
                name: "route",
            },
            message,
        };
        let mut targets: Vec<usize> = Vec::new();
        for (e, to) in &route.rules {
            work.prepare(e);
            let matched = match e.eval_bool(&work.scope()) {
                Ok(Some(b)) => b,
                Ok(None) => {
                    return Err(fail(
                        ErrorKind::WrongType,
                        format!("`{}` did not give a bool", e.source()),
                    ));
                }
                Err(err) => {
                    let (kind, message) = e.failure(err);
                    return Err(fail(kind, message));
                }
            };
            if matched {
                for t in to {
                    if !targets.contains(t) {
                        targets.push(*t);
                    }
                }
                if route.mode == RouteMode::First {
                    break;
                }
            }
        }
        let targets = if targets.is_empty() {
            &route.default
        } else {
            &targets
        };
        match targets.split_last() {
            None => Ok(()),
            Some((last, rest)) => {
                for t in rest {
                    self.write(*t, work.clone(), out)?;
                }
                self.write(*last, work, out)
            }
        }
    }

    /// Encodes `work` for output `index`.
    fn write(
        &self,
        index: usize,
        mut work: Work<'_>,
        out: &mut Vec<(usize, Record)>,
    ) -> Result<(), RecordError> {
        let Some(spec) = self.outputs.get(index) else {
            return Ok(());
        };
        let fail = |kind, message| RecordError {
            kind,
            stage: Stage::Output {
                index,
                name: spec.name.clone(),
            },
            message,
        };
        let key = match (&spec.key_encoder, &spec.key) {
            // `work` is this output's own: its key is moved, not copied.
            (None, None) => work.key.take(),
            (None, Some(e)) => {
                work.prepare(e);
                e.eval_bytes(&work.scope())
                    .map_err(|(kind, message)| fail(kind, message))?
            }
            (Some(encoder), e) => {
                let value = match e {
                    Some(e) => {
                        work.prepare(e);
                        Some(
                            e.eval_json(&work.scope())
                                .map_err(|(kind, message)| fail(kind, message))?,
                        )
                    }
                    None => work.key_doc.clone().or_else(|| {
                        work.key
                            .as_deref()
                            .map(|k| Json::String(String::from_utf8_lossy(k).into_owned()))
                    }),
                };
                let value = Value::Json(value.map(Doc::Other));
                encoder
                    .encode(&value, 0)
                    .map_err(|e| fail(e.kind, format!("the key: {}", e.message)))?
            }
        };
        let value = spec
            .encoder
            .encode(&work.body, work.value_len)
            .map_err(|e| fail(e.kind, e.message))?;
        let headers = match spec.headers {
            HeaderPolicy::Keep => work.headers,
            HeaderPolicy::Drop => Vec::new(),
        };
        out.push((
            index,
            Record {
                key,
                value,
                headers,
                timestamp: work.timestamp,
                origin: work.origin,
            },
        ));
        Ok(())
    }
}

// --- The steps, each on the record at hand; `fail` locates their errors -------------------

/// Whether `work` passes the filter `e`.
fn filter(
    e: &Expression,
    work: &mut Work<'_>,
    fail: &impl Fn(ErrorKind, String) -> RecordError,
) -> Result<bool, RecordError> {
    work.prepare(e);
    match e.eval_bool(&work.scope()) {
        Ok(Some(keep)) => Ok(keep),
        Ok(None) => Err(fail(
            ErrorKind::WrongType,
            format!("`{}` did not give a bool", e.source()),
        )),
        Err(err) => {
            let (kind, message) = e.failure(err);
            Err(fail(kind, message))
        }
    }
}

/// Sets every field of `fields` to its expression's value, all evaluated first.
fn map(
    fields: &[(FieldPath, Expression)],
    work: &mut Work<'_>,
    fail: &impl Fn(ErrorKind, String) -> RecordError,
) -> Result<(), RecordError> {
    let mut values = Vec::with_capacity(fields.len());
    for (_, e) in fields {
        values.push(eval_json(e, work, fail)?);
    }
    let doc = json_mut(work, fail)?;
    for ((path, _), v) in fields.iter().zip(values) {
        doc.set(path, v)
            .map_err(|m| fail(ErrorKind::WrongType, m))?;
    }
    Ok(())
}

/// Removes every field of `paths`.
fn drop_fields(
    paths: &[FieldPath],
    work: &mut Work<'_>,
    fail: &impl Fn(ErrorKind, String) -> RecordError,
) -> Result<(), RecordError> {
    let doc = json_mut(work, fail)?;
    for path in paths {
        doc.remove(path)
            .map_err(|m| fail(ErrorKind::WrongType, m))?;
    }
    Ok(())
}

/// Moves every field of `moves` from its first path to its second.
fn rename(
    moves: &[(FieldPath, FieldPath)],
    work: &mut Work<'_>,
    fail: &impl Fn(ErrorKind, String) -> RecordError,
) -> Result<(), RecordError> {
    let doc = json_mut(work, fail)?;
    for (from, to) in moves {
        if let Some(v) = doc.take(from).map_err(|m| fail(ErrorKind::WrongType, m))? {
            doc.set(to, v).map_err(|m| fail(ErrorKind::WrongType, m))?;
        }
    }
    Ok(())
}

/// Replaces the headers named `header` by one of `value`.
fn set_header(
    header: &str,
    value: &HeaderValue,
    work: &mut Work<'_>,
    fail: &impl Fn(ErrorKind, String) -> RecordError,
) -> Result<(), RecordError> {
    let bytes = match value {
        HeaderValue::Fixed(b) => b.clone(),
        HeaderValue::Computed(e) => eval_bytes(e, work, fail)?.unwrap_or_default(),
    };
    work.headers.retain(|(n, _)| n != header);
    work.headers.push((header.to_string(), bytes));
    Ok(())
}

/// The value of `e` on `work`, as JSON.
fn eval_json(
    e: &Expression,
    work: &mut Work<'_>,
    fail: &impl Fn(ErrorKind, String) -> RecordError,
) -> Result<Json, RecordError> {
    work.prepare(e);
    e.eval_json(&work.scope())
        .map_err(|(kind, message)| fail(kind, message))
}

/// The value of `e` on `work`, as bytes (`None` for null).
fn eval_bytes(
    e: &Expression,
    work: &mut Work<'_>,
    fail: &impl Fn(ErrorKind, String) -> RecordError,
) -> Result<Option<Vec<u8>>, RecordError> {
    work.prepare(e);
    e.eval_bytes(&work.scope())
        .map_err(|(kind, message)| fail(kind, message))
}

/// The JSON document of `work`, for a processor that changes it.
fn json_mut<'w, 'a>(
    work: &'w mut Work<'a>,
    fail: &dyn Fn(ErrorKind, String) -> RecordError,
) -> Result<&'w mut Doc<'a>, RecordError> {
    match &mut work.body {
        Value::Json(Some(Doc::Other(other))) => Err(fail(
            ErrorKind::WrongType,
            format!("the value is {}, not a JSON object", type_name(other)),
        )),
        Value::Json(Some(doc)) => Ok(doc),
        Value::Json(None) => Err(fail(
            ErrorKind::WrongType,
            "the record has no value (a tombstone); drop those first with `drop_empty`".into(),
        )),
        Value::Raw(_) => Err(fail(
            ErrorKind::WrongType,
            "the value is raw bytes; this processor needs `codec: json` inputs".into(),
        )),
    }
}

#[cfg(test)]
mod tests;
