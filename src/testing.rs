//! `onceflow test`: runs a topology's pipeline in-process over given input records, without
//! any broker, and compares what each output receives (key, value, headers) with what a
//! cases file expects. The project's own tests run every example of `topologies/` with it.
//!
//! A cases file:
//!
//! ```yaml
//! cases:
//!   - name: a paid order goes to `paid`, keyed by order id
//!     input:
//!       - topic: orders              # default: the first input
//!         key: c-7                   # default: no key
//!         value: {order_id: 1, status: paid}   # JSON (or a string for raw inputs)
//!         headers: {source: web}
//!     expect:                        # per output name; outputs not listed must stay empty
//!       paid:
//!         - key: "1"                 # null: no key; left out: not compared
//!           value: {order_id: 1, status: paid}
//!           headers: {source: web}   # left out: not compared
//!     errors:                        # records expected to fail (default: none)
//!       - {input: 0, kind: missing_field}
//! ```
//!
//! The record of an Avro input is given as JSON (as expressions see it) and written with the
//! schema of `schema_file` (relative to the cases file) or `schema` (inline), by default the
//! input's reader schema; `raw` gives bytes that are not Avro. What an Avro output receives is
//! decoded and compared as JSON.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use serde_json::Value as Json;

use crate::codec::avro::Given;
use crate::codec::{Decoder, Value};
use crate::record::{Origin, Record};
use crate::topology::{Codec, Output, Target, Topology};
use crate::transform::Pipeline;

/// A cases file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CasesFile {
    /// The cases, run independently of each other.
    pub cases: Vec<Case>,
    /// The directory of the file (set by [`load_cases`]): schema files are relative to it.
    #[serde(skip)]
    pub dir: Option<std::path::PathBuf>,
}

/// Input records and what the outputs must receive from them.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Case {
    /// Shown in reports.
    pub name: String,
    /// Records fed to the pipeline, in order.
    pub input: Vec<InputRecord>,
    /// Output name -> the records it must receive, in order.
    #[serde(default)]
    pub expect: BTreeMap<String, Vec<ExpectedRecord>>,
    /// Input records expected to fail, and how.
    #[serde(default)]
    pub errors: Vec<ExpectedError>,
    /// The stores' state after the last record: store name -> key (UTF-8) -> its state
    /// (JSON). A store named here must hold exactly these keys; stores not named are not
    /// compared.
    #[serde(default)]
    pub state: BTreeMap<String, BTreeMap<String, Json>>,
    /// The rows of the tables of `join` steps before the first record: step name -> key
    /// (UTF-8) -> row (JSON).
    #[serde(default)]
    pub tables: BTreeMap<String, BTreeMap<String, Json>>,
}

/// A record fed to the pipeline.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputRecord {
    /// Input topic. Default: the first input of the topology.
    #[serde(default)]
    pub topic: Option<String>,
    /// Key (UTF-8). Default: none.
    #[serde(default)]
    pub key: Option<String>,
    /// Value: a string is written as its text, anything else as JSON. Default: none (a
    /// tombstone), unless `raw` is given.
    #[serde(default)]
    pub value: Option<Json>,
    /// Value given as exact text (e.g. something that is not JSON). Wins over `value`.
    #[serde(default)]
    pub raw: Option<String>,
    /// Headers (UTF-8 values).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Timestamp, milliseconds since the epoch.
    #[serde(default)]
    pub timestamp: Option<i64>,
    /// Avro, Protobuf and JSON Schema inputs: the schema the value is written with, inline
    /// (Protobuf: the `.proto` text). Default for Avro: the input's reader schema; for JSON
    /// Schema: any value.
    #[serde(default)]
    pub schema: Option<Json>,
    /// ... or in a file, relative to the cases file.
    #[serde(default)]
    pub schema_file: Option<String>,
    /// Protobuf inputs: the message of the schema the value is. Default: its first.
    #[serde(default)]
    pub message: Option<String>,
}

/// What an output record must be; every field left out is not compared.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpectedRecord {
    /// Expected key; `null` for no key.
    #[serde(default, deserialize_with = "present")]
    pub key: Option<Option<String>>,
    /// Expected value: compared as JSON for JSON outputs, as text when a string is given for
    /// a raw output; `null` for no value.
    #[serde(default, deserialize_with = "present")]
    pub value: Option<Json>,
    /// Expected headers, all of them.
    #[serde(default)]
    pub headers: Option<BTreeMap<String, String>>,
}

/// A field that is present (even as `null`) is `Some`.
fn present<'de, T, D>(d: D) -> Result<Option<T>, D::Error>
where
    T: Deserialize<'de>,
    D: serde::Deserializer<'de>,
{
    T::deserialize(d).map(Some)
}

/// An input record expected to fail.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpectedError {
    /// Index of the record in `input`.
    pub input: usize,
    /// Error kind: `bad_json`, `missing_field`, `wrong_type` or `expression`.
    pub kind: String,
}

/// The result of one case.
#[derive(Debug, Clone)]
pub struct CaseReport {
    pub name: String,
    /// Empty when the case passed; otherwise a readable diff.
    pub mismatches: Vec<String>,
}

impl CaseReport {
    pub fn passed(&self) -> bool {
        self.mismatches.is_empty()
    }
}

/// Why cases could not be run at all.
#[derive(Debug, thiserror::Error)]
pub enum CasesError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}{}: {message}", line.map(|l| format!(":{l}")).unwrap_or_default())]
    Parse {
        path: String,
        line: Option<usize>,
        message: String,
    },
}

/// Reads a cases file.
pub fn load_cases(path: &Path) -> Result<CasesFile, CasesError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| CasesError::Read {
        path: shown.clone(),
        source,
    })?;
    let mut cases = parse_cases(&text, &shown)?;
    cases.dir = path.parent().map(Path::to_path_buf);
    Ok(cases)
}

/// Parses cases text; `origin` names it in errors.
pub fn parse_cases(text: &str, origin: &str) -> Result<CasesFile, CasesError> {
    serde_saphyr::from_str(text).map_err(|e| CasesError::Parse {
        path: origin.to_string(),
        line: e.location().map(|l| l.line() as usize),
        message: e.to_string().lines().next().unwrap_or_default().to_string(),
    })
}

/// Runs every case; a case whose topology refers to unknown outputs or topics is reported
/// as a mismatch, not a panic.
pub fn run_cases(topology: &Topology, pipeline: &Pipeline, cases: &CasesFile) -> Vec<CaseReport> {
    cases
        .cases
        .iter()
        .map(|case| run_case(topology, pipeline, cases.dir.as_deref(), case))
        .collect()
}

fn run_case(
    topology: &Topology,
    pipeline: &Pipeline,
    dir: Option<&Path>,
    case: &Case,
) -> CaseReport {
    let mut mismatches = Vec::new();
    let mut state = crate::state::Stores::new(
        topology.store_topics(),
        Box::<crate::state::store::Memory>::default(),
    )
    .with_timed(topology.timed_stores());
    load_tables(topology, case, &mut state, &mut mismatches);
    let (got, errors) = feed(topology, pipeline, dir, case, &mut state, &mut mismatches);
    for name in case.expect.keys() {
        if !topology.outputs.iter().any(|o| o.name() == name) {
            mismatches.push(format!("expect: no output is named `{name}`"));
        }
    }
    for (index, output) in topology.outputs.iter().enumerate() {
        let expected = case
            .expect
            .get(output.name())
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        let actual = &got[index];
        // Outputs in the registry's formats were decoded to JSON by `feed`.
        let codec = match topology.output_codec(index) {
            c if c.uses_registry() => Codec::Json,
            other => other,
        };
        let same = expected.len() == actual.len()
            && expected
                .iter()
                .zip(actual)
                .all(|(e, a)| matches(e, a, codec));
        if !same {
            mismatches.push(diff(output, codec, expected, actual));
        }
    }
    compare_errors(case, &errors, &mut mismatches);
    compare_state(topology, case, &state, &mut mismatches);
    CaseReport {
        name: case.name.clone(),
        mismatches,
    }
}

/// An input record that failed: its index in `input`, its error kind and message.
type Failure = (usize, String, String);

/// Runs the inputs of `case` through `pipeline`. Returns what each output received, by
/// output index, and the records that failed; an input that cannot be fed is a mismatch.
fn feed(
    topology: &Topology,
    pipeline: &Pipeline,
    dir: Option<&Path>,
    case: &Case,
    state: &mut crate::state::Stores,
    mismatches: &mut Vec<String>,
) -> (Vec<Vec<Record>>, Vec<Failure>) {
    // Outputs in the registry's formats are compared as the documents they decode to.
    let decoders: Vec<Option<Box<dyn Decoder>>> = (0..topology.outputs.len())
        .map(|index| {
            let codec = topology.output_codec(index);
            codec
                .uses_registry()
                .then(|| crate::codec::decoder_for(codec, pipeline.registry()))
        })
        .collect();
    let mut got: Vec<Vec<Record>> = vec![Vec::new(); topology.outputs.len()];
    let mut errors: Vec<Failure> = Vec::new();
    let mut out = Vec::new();
    // The case's records go through the stateful steps in order, each committed alone: a
    // record that fails leaves no state change, as in a job.
    for (n, input) in case.input.iter().enumerate() {
        let record = match input_record(topology, pipeline, dir, n, input) {
            Ok(record) => record,
            Err(mismatch) => {
                mismatches.push(mismatch);
                continue;
            }
        };
        out.clear();
        state.begin_record();
        let processed = pipeline.process_with(record, state, &mut out);
        for (_, e) in state.take_rejected() {
            errors.push((n, e.kind.name().to_string(), e.to_string()));
        }
        if processed.is_ok() {
            let _ = state.take_record();
            if let Err(e) = state.commit() {
                mismatches.push(format!("input[{n}]: {e}"));
            }
        }
        match processed {
            Ok(()) => {
                for (index, mut rec) in out.drain(..) {
                    if let Some(Some(decoder)) = decoders.get(index) {
                        rec.value = match decoder.decode(rec.value.as_deref()) {
                            Ok(Value::Json(Some(doc))) => {
                                Some(doc.to_json().to_string().into_bytes())
                            }
                            Ok(_) => None,
                            Err(e) => {
                                mismatches.push(format!(
                                    "input[{n}]: its {} output does not decode: {e}",
                                    topology.output_codec(index).name()
                                ));
                                continue;
                            }
                        };
                    }
                    if let Some(list) = got.get_mut(index) {
                        list.push(rec);
                    }
                }
            }
            Err(e) => errors.push((n, e.kind.name().to_string(), e.to_string())),
        }
    }
    (got, errors)
}

/// The record `input`, the `n`th of its case, as consumed; a mismatch when its topic is no
/// input of the topology.
fn input_record(
    topology: &Topology,
    pipeline: &Pipeline,
    dir: Option<&Path>,
    n: usize,
    input: &InputRecord,
) -> Result<Record, String> {
    let topic = input
        .topic
        .clone()
        .or_else(|| topology.inputs.first().map(|i| i.source_name()))
        .unwrap_or_default();
    let Some(source) = topology.inputs.iter().find(|i| i.source_name() == topic) else {
        return Err(format!(
            "input[{n}]: `{topic}` is not an input topic of the topology"
        ));
    };
    let value = match (&input.raw, &input.value) {
        (Some(raw), _) => Some(raw.as_bytes().to_vec()),
        (None, Some(v)) if source.codec == Codec::Avro => Some(
            avro_value(topology, pipeline, dir, source, input, v)
                .map_err(|e| format!("input[{n}]: {e}"))?,
        ),
        (None, Some(v)) if matches!(source.codec, Codec::Protobuf | Codec::JsonSchema) => Some(
            schema_value(pipeline, dir, source.codec, input, v)
                .map_err(|e| format!("input[{n}]: {e}"))?,
        ),
        (None, Some(Json::String(s))) => Some(s.as_bytes().to_vec()),
        (None, Some(v)) => Some(v.to_string().into_bytes()),
        (None, None) => None,
    };
    Ok(Record {
        key: input.key.as_ref().map(|k| k.as_bytes().to_vec()),
        value,
        headers: input
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), v.as_bytes().to_vec()))
            .collect(),
        timestamp: input.timestamp,
        origin: Origin {
            topic: topic.into(),
            partition: 0,
            offset: n as i64,
        },
    })
}

/// `value` written in the Confluent wire format with the schema the case names (or the
/// input's reader schema), registered in the pipeline's offline registry.
fn avro_value(
    topology: &Topology,
    pipeline: &Pipeline,
    dir: Option<&Path>,
    source: &crate::topology::Input,
    input: &InputRecord,
    value: &Json,
) -> Result<Vec<u8>, String> {
    let given = crate::topology::SchemaSource {
        schema: input.schema.clone(),
        schema_file: input.schema_file.clone(),
    }
    .json(dir)?;
    let json = match given {
        Some(j) => j,
        None => source
            .avro
            .clone()
            .unwrap_or_default()
            .source()
            .json(topology.dir.as_deref())?
            .ok_or("an Avro input record needs the schema it is written with: `schema_file` or `schema` (the input has no reader schema)")?,
    };
    let writer = Given::parse(&json)?;
    let id = pipeline
        .registry()
        .register("cases", &writer.schema, true)?;
    let text = value.to_string();
    let doc = crate::codec::json::Doc::parse(text.as_bytes())?;
    let mut datum = Vec::new();
    crate::codec::avro::write::encode(&writer.compiled, &doc, &mut datum)
        .map_err(|e| format!("the value does not fit its schema: {e}"))?;
    Ok(crate::codec::avro::frame(id, &datum))
}

/// `value` written in the Confluent wire format as Protobuf or JSON Schema with the schema
/// the case names, registered in the pipeline's offline registry.
fn schema_value(
    pipeline: &Pipeline,
    dir: Option<&Path>,
    codec: Codec,
    input: &InputRecord,
    value: &Json,
) -> Result<Vec<u8>, String> {
    use crate::codec::{Encoder, json_schema, protobuf};
    let registry = pipeline.registry();
    let text = value.to_string();
    let doc = crate::codec::json::Doc::parse(text.as_bytes())?;
    let encoder: Box<dyn Encoder> = if codec == Codec::Protobuf {
        let (proto, imports) = match (&input.schema, &input.schema_file) {
            (Some(Json::String(text)), None) => (text.clone(), Vec::new()),
            (None, Some(file)) => {
                protobuf::read_with_imports(&crate::topology::schemas::resolve(dir, file))?
            }
            _ => {
                return Err(
                    "a Protobuf input record needs the `.proto` it is written with: \
                            `schema_file`, or `schema` as text"
                        .into(),
                );
            }
        };
        let (registered, message) = protobuf::registered(proto, imports, input.message.as_deref())?;
        let id = registry.register_schema("cases", &registered, true)?;
        Box::new(protobuf::ProtobufEncoder::new(id, "cases".into(), message))
    } else {
        let schema = crate::topology::SchemaSource {
            schema: input.schema.clone(),
            schema_file: input.schema_file.clone(),
        }
        .json(dir)?
        .unwrap_or_else(|| Json::Object(Default::default()));
        let compiled = json_schema::Compiled::new(&schema)?;
        let id = registry.register_schema("cases", &compiled.registered, true)?;
        Box::new(json_schema::JsonSchemaEncoder::new(
            id,
            "cases".into(),
            std::sync::Arc::new(compiled),
        ))
    };
    encoder
        .encode(&Value::Json(Some(doc)), text.len())
        .map_err(|e| e.message)?
        .ok_or_else(|| "the value is empty".into())
}

/// What `output` received against what it should have, record by record.
fn diff(output: &Output, codec: Codec, expected: &[ExpectedRecord], actual: &[Record]) -> String {
    let mut diff = format!(
        "output `{}` ({}): expected {} record(s), got {}\n",
        output.name(),
        match output.target() {
            Some(Target::Topic(topic)) => topic,
            Some(Target::Http(_)) => "http",
            _ => "postgres",
        },
        expected.len(),
        actual.len()
    );
    for i in 0..expected.len().max(actual.len()) {
        let e = expected.get(i);
        let a = actual.get(i);
        match (e, a) {
            (Some(e), Some(a)) if matches(e, a, codec) => {
                diff.push_str(&format!("    {}\n", show_actual(a, codec, Some(e))));
            }
            _ => {
                if let Some(e) = e {
                    diff.push_str(&format!("  - {}\n", show_expected(e)));
                }
                if let Some(a) = a {
                    diff.push_str(&format!("  + {}\n", show_actual(a, codec, e)));
                }
            }
        }
    }
    diff.trim_end().to_string()
}

/// The records that failed against those expected to fail.
/// The case's table rows into the stores of the `join`s they name: a global table's under
/// [`crate::state::GLOBAL`], a co-partitioned one's under partition 0 (the case's records').
fn load_tables(
    topology: &Topology,
    case: &Case,
    state: &mut crate::state::Stores,
    mismatches: &mut Vec<String>,
) {
    let sources = topology.store_topics();
    for (name, rows) in &case.tables {
        let Some(store) = topology.stores().position(|(_, n)| n == name) else {
            mismatches.push(format!("tables: no stateful step is named `{name}`"));
            continue;
        };
        let partition = match sources[store].1 {
            crate::topology::StoreSource::GlobalTable => crate::state::GLOBAL,
            crate::topology::StoreSource::Table => 0,
            crate::topology::StoreSource::Changelog => {
                mismatches.push(format!("tables: `{name}` is not a join"));
                continue;
            }
        };
        let rows = rows
            .iter()
            .map(|(k, v)| (k.as_bytes().to_vec(), Some(v.to_string().into_bytes())))
            .collect();
        if let Err(e) = state.load(store, partition, rows) {
            mismatches.push(format!("tables: `{name}`: {e}"));
        }
    }
}

/// The final state of every store the case names against what it expects: the same keys,
/// each with the same JSON state.
fn compare_state(
    topology: &Topology,
    case: &Case,
    state: &crate::state::Stores,
    mismatches: &mut Vec<String>,
) {
    for (name, expected) in &case.state {
        let Some(store) = topology.stores().position(|(_, n)| n == name) else {
            mismatches.push(format!("state: no stateful step is named `{name}`"));
            continue;
        };
        let actual: BTreeMap<String, Json> = state
            .entries(store)
            .into_iter()
            .map(|(k, v)| {
                let value = serde_json::from_slice(&v)
                    .unwrap_or_else(|_| Json::String(String::from_utf8_lossy(&v).into_owned()));
                (String::from_utf8_lossy(&k).into_owned(), value)
            })
            .collect();
        if &actual != expected {
            mismatches.push(format!(
                "state `{name}`: expected {}, got {}",
                Json::from(
                    expected
                        .clone()
                        .into_iter()
                        .collect::<serde_json::Map<_, _>>()
                ),
                Json::from(actual.into_iter().collect::<serde_json::Map<_, _>>())
            ));
        }
    }
}

fn compare_errors(case: &Case, errors: &[Failure], mismatches: &mut Vec<String>) {
    for (n, kind, message) in errors {
        if !case.errors.iter().any(|e| e.input == *n && &e.kind == kind) {
            mismatches.push(format!("input[{n}] failed unexpectedly: {message}"));
        }
    }
    for e in &case.errors {
        if !errors
            .iter()
            .any(|(n, kind, _)| *n == e.input && *kind == e.kind)
        {
            mismatches.push(format!(
                "input[{}] was expected to fail with {} but did not",
                e.input, e.kind
            ));
        }
    }
}

/// The value of an output record, for comparing and showing: JSON for JSON outputs (or for
/// raw outputs when the expectation is not a string), text otherwise.
fn actual_value(a: &Record, codec: Codec, expected: Option<&Json>) -> Json {
    let Some(bytes) = &a.value else {
        return Json::Null;
    };
    let as_text = codec == Codec::Raw && expected.is_none_or(Json::is_string);
    if !as_text && let Ok(v) = serde_json::from_slice(bytes) {
        return v;
    }
    Json::String(String::from_utf8_lossy(bytes).into_owned())
}

fn headers_of(a: &Record) -> BTreeMap<String, String> {
    a.headers
        .iter()
        .map(|(k, v)| (k.clone(), String::from_utf8_lossy(v).into_owned()))
        .collect()
}

fn key_of(a: &Record) -> Option<String> {
    a.key
        .as_ref()
        .map(|k| String::from_utf8_lossy(k).into_owned())
}

fn matches(e: &ExpectedRecord, a: &Record, codec: Codec) -> bool {
    e.key.as_ref().is_none_or(|k| *k == key_of(a))
        && e.value
            .as_ref()
            .is_none_or(|v| *v == actual_value(a, codec, Some(v)))
        && e.headers.as_ref().is_none_or(|h| *h == headers_of(a))
}

fn show_expected(e: &ExpectedRecord) -> String {
    let mut obj = serde_json::Map::new();
    if let Some(k) = &e.key {
        obj.insert("key".into(), k.clone().map_or(Json::Null, Json::String));
    }
    if let Some(v) = &e.value {
        obj.insert("value".into(), v.clone());
    }
    if let Some(h) = &e.headers {
        obj.insert("headers".into(), serde_json::json!(h));
    }
    Json::Object(obj).to_string()
}

fn show_actual(a: &Record, codec: Codec, e: Option<&ExpectedRecord>) -> String {
    let expected_value = e.and_then(|e| e.value.as_ref());
    serde_json::json!({
        "key": key_of(a),
        "value": actual_value(a, codec, expected_value),
        "headers": headers_of(a),
    })
    .to_string()
}
