//! Codecs: how a record's bytes become the value the pipeline works on, and back.
//!
//! A [`Decoder`] turns a consumed value into a [`Value`] once, on entry; every processor and
//! expression works on that value; an [`Encoder`] turns it into bytes once per output record.
//! Both are pure (no I/O): a codec that needs a schema registry resolves its schemas before
//! the pipeline runs, so that decoding and encoding stay plain functions of their input.
//!
//! * [`raw`]: bytes as they are.
//! * [`json`]: a lazily decoded JSON document ([`json::Doc`]), validated in one pass by
//!   [`json::scan`], its fields decoded only when something needs them.
//! * [`avro`], [`protobuf`], [`json_schema`]: the schema registry's three formats in the
//!   Confluent wire format, decoded to the same document as JSON; their schemas come from the
//!   [`registry`], looked up once per schema id and cached ([`Codecs`] sets up the outputs'
//!   when the job starts).

pub mod avro;
pub mod json;
pub mod json_schema;
pub mod protobuf;
pub mod raw;
pub mod registry;

use std::collections::HashMap;
use std::sync::Arc;

use crate::record::ErrorKind;
use crate::topology::{Codec, ConfigIssue, Target, Topology};
use avro::{AvroDecoder, AvroEncoder, Given};
use json::Doc;
use json_schema::{JsonSchemaDecoder, JsonSchemaEncoder};
use protobuf::{ProtobufDecoder, ProtobufEncoder};
pub use registry::Registry;
use registry::{Reference, Registered};

/// A record's value while it goes through the pipeline, borrowing the consumed bytes.
#[derive(Debug, Clone)]
pub enum Value<'a> {
    /// Bytes as consumed; `None` is a tombstone.
    Raw(Option<&'a [u8]>),
    /// `None`: a tombstone (no value), `null` to expressions.
    Json(Option<Doc<'a>>),
}

impl Value<'_> {
    /// Whether the record has no value, or an empty one.
    pub fn is_empty(&self) -> bool {
        match self {
            Value::Raw(v) => v.is_none_or(<[u8]>::is_empty),
            Value::Json(v) => v.is_none(),
        }
    }
}

/// A value that cannot be decoded or encoded: the record's fault, for good.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct CodecError {
    pub kind: ErrorKind,
    pub message: String,
}

/// The document an output in a schema's format writes: the value's, or raw bytes parsed as
/// JSON (`format` names the output's format in the error); `None` for a tombstone.
pub(crate) fn document<'v, 'a>(
    value: &'v Value<'a>,
    format: &str,
) -> Result<Option<std::borrow::Cow<'v, Doc<'a>>>, CodecError> {
    match value {
        Value::Json(None) | Value::Raw(None) => Ok(None),
        Value::Json(Some(doc)) => Ok(Some(std::borrow::Cow::Borrowed(doc))),
        Value::Raw(Some(bytes)) => Doc::parse(bytes)
            .map(|d| Some(std::borrow::Cow::Owned(d)))
            .map_err(|e| CodecError {
                kind: ErrorKind::BadJson,
                message: format!(
                    "the value is raw bytes, and {format} output takes a document: it is not \
                     valid JSON: {e}"
                ),
            }),
    }
}

/// Turns a consumed value into the pipeline's [`Value`].
pub trait Decoder: Send + Sync {
    fn decode<'a>(&self, bytes: Option<&'a [u8]>) -> Result<Value<'a>, CodecError>;
}

/// Turns the pipeline's [`Value`] into the bytes of an output record; `None` is a tombstone.
pub trait Encoder: Send + Sync {
    /// `size_hint` is the consumed value's length: the encoded one is usually about as long.
    fn encode(&self, value: &Value<'_>, size_hint: usize) -> Result<Option<Vec<u8>>, CodecError>;
}

/// The codecs of a topology: a decoder per input (by source name), an encoder per output (by
/// index), and the schema registry they share.
pub struct Codecs {
    pub decoders: HashMap<String, Box<dyn Decoder>>,
    pub encoders: Vec<Box<dyn Encoder>>,
    /// Key decoders of the inputs whose `key_codec` is not `raw`, by source name.
    pub key_decoders: HashMap<String, Box<dyn Decoder>>,
    /// Key encoders of the outputs whose `key_codec` is not `raw`, by output index.
    pub key_encoders: Vec<Option<Box<dyn Encoder>>>,
    /// Offline (no server) unless made by [`Codecs::connect`].
    pub registry: Arc<Registry>,
}

/// Why a job's codecs cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Config(Vec<ConfigIssue>),
    /// The registry refused an output schema, or cannot be reached.
    #[error("{0}")]
    Registry(String),
}

impl Codecs {
    /// The codecs of `topology` without a registry server: output schemas get local ids.
    /// For checking a topology and for `onceflow test`.
    pub fn offline(topology: &Topology) -> Result<Codecs, Vec<ConfigIssue>> {
        Codecs::build_with(topology, Arc::new(Registry::offline())).map_err(|e| match e {
            SetupError::Config(issues) => issues,
            SetupError::Registry(message) => vec![ConfigIssue {
                path: "schema_registry".into(),
                message,
            }],
        })
    }

    /// The codecs of `topology` with its registry: each output's schema registered (or
    /// looked up) under its subject. The only registry calls besides the first look-up of
    /// each schema id.
    pub fn connect(topology: &Topology) -> Result<Codecs, SetupError> {
        let registry = match &topology.schema_registry {
            Some(config) => Registry::connect(config).map_err(SetupError::Registry)?,
            None => Registry::offline(),
        };
        Codecs::build_with(topology, Arc::new(registry))
    }

    /// The codecs of `topology` with `registry` (its outputs' schemas registered there).
    pub fn build_with(topology: &Topology, registry: Arc<Registry>) -> Result<Codecs, SetupError> {
        let dir = topology.dir.as_deref();
        let mut issues = Vec::new();
        let mut decoders: HashMap<String, Box<dyn Decoder>> = HashMap::new();
        for (i, input) in topology.inputs.iter().enumerate() {
            let decoder: Box<dyn Decoder> = match input.codec {
                Codec::Raw => Box::new(raw::Raw),
                Codec::Json => Box::new(json::Json),
                Codec::Avro => {
                    let source = input.avro.clone().unwrap_or_default().source();
                    let at = format!("inputs[{i}].avro");
                    let reader = match source
                        .json(dir)
                        .and_then(|j| j.map(|j| Given::parse(&j)).transpose())
                    {
                        Ok(r) => r.map(Arc::new),
                        Err(message) => {
                            issues.push(ConfigIssue { path: at, message });
                            None
                        }
                    };
                    Box::new(AvroDecoder::new(Arc::clone(&registry), reader))
                }
                other => decoder_for(other, &registry),
            };
            decoders.insert(input.source_name(), decoder);
        }
        let mut key_decoders: HashMap<String, Box<dyn Decoder>> = HashMap::new();
        for input in &topology.inputs {
            let decoder: Box<dyn Decoder> = match input.key_codec {
                Codec::Raw => continue,
                other => decoder_for(other, &registry),
            };
            key_decoders.insert(input.source_name(), decoder);
        }
        let mut encoders: Vec<Box<dyn Encoder>> = Vec::new();
        let mut key_encoders: Vec<Option<Box<dyn Encoder>>> = Vec::new();
        let mut refused = Vec::new();
        for (o, output) in topology.outputs.iter().enumerate() {
            let key_encoder: Option<Box<dyn Encoder>> = match output.key_codec {
                None | Some(Codec::Raw) => None,
                Some(Codec::Json) => Some(Box::new(json::Json)),
                Some(_) => match output_encoder(topology, o, true, &registry) {
                    Ok(e) => Some(e),
                    Err(fault) => {
                        fault.file(o, output.name(), " key", &mut issues, &mut refused);
                        None
                    }
                },
            };
            key_encoders.push(key_encoder);
            let encoder: Box<dyn Encoder> = match topology.output_codec(o) {
                Codec::Raw => Box::new(raw::Raw),
                Codec::Json => Box::new(json::Json),
                _ => match output_encoder(topology, o, false, &registry) {
                    Ok(e) => e,
                    Err(fault) => {
                        fault.file(o, output.name(), "", &mut issues, &mut refused);
                        Box::new(raw::Raw)
                    }
                },
            };
            encoders.push(encoder);
        }
        if !issues.is_empty() {
            return Err(SetupError::Config(issues));
        }
        if !refused.is_empty() {
            return Err(SetupError::Registry(refused.join("; ")));
        }
        Ok(Codecs {
            decoders,
            encoders,
            key_decoders,
            key_encoders,
            registry,
        })
    }
}

/// The decoder of `codec` (for the registry's formats: with no reader schema).
pub fn decoder_for(codec: Codec, registry: &Arc<Registry>) -> Box<dyn Decoder> {
    match codec {
        Codec::Raw => Box::new(raw::Raw),
        Codec::Json => Box::new(json::Json),
        Codec::Avro => Box::new(AvroDecoder::new(Arc::clone(registry), None)),
        Codec::Protobuf => Box::new(ProtobufDecoder::new(Arc::clone(registry))),
        Codec::JsonSchema => Box::new(JsonSchemaDecoder::new(Arc::clone(registry))),
    }
}

enum Fault {
    /// A problem of the topology's settings at `path`.
    Config(String, String),
    Registry(String),
}

impl Fault {
    /// Files the fault of output `o` (named `name`; `what` says which of its schemas).
    fn file(
        self,
        o: usize,
        name: &str,
        what: &str,
        issues: &mut Vec<ConfigIssue>,
        refused: &mut Vec<String>,
    ) {
        match self {
            Fault::Config(path, message) => issues.push(ConfigIssue { path, message }),
            Fault::Registry(message) => {
                refused.push(format!("outputs[{o}] ({name}){what}: {message}"))
            }
        }
    }
}

/// The schema an output writes with, compiled for its codec.
pub enum Compiled {
    Avro(Arc<Given>),
    Protobuf(prost_reflect::MessageDescriptor),
    JsonSchema(Arc<json_schema::Compiled>),
}

/// An output's schema (of its keys when `key`): where it is in the file, its subject, what
/// the registry is given, and the schema compiled.
pub struct OutputSchema {
    /// The field of the output that gives it (`avro`, `key_avro`, `protobuf`, `json_schema`).
    pub field: &'static str,
    pub subject: String,
    pub registered: Registered,
    pub compiled: Compiled,
    pub auto_register: bool,
}

/// The schema of output `o` (of its keys when `key`), if its codec has one: `Err((field,
/// problem))` when it cannot be read or compiled.
pub fn output_schema(
    topology: &Topology,
    o: usize,
    key: bool,
) -> Option<Result<OutputSchema, (&'static str, String)>> {
    let output = &topology.outputs[o];
    let codec = if key {
        output.key_codec.unwrap_or_default()
    } else {
        topology.output_codec(o)
    };
    let dir = topology.dir.as_deref();
    let topic = match output.target() {
        Some(Target::Topic(t)) => t,
        _ => "",
    };
    let (field, made) = match (codec, key) {
        (Codec::Avro, _) => {
            let field = if key { "key_avro" } else { "avro" };
            let config = if key { &output.key_avro } else { &output.avro };
            let auto_register = config.as_ref().is_none_or(|a| a.auto_register);
            let made = avro_subject(topology, o, key).map(|(subject, given)| OutputSchema {
                field,
                subject,
                registered: Registered::new(
                    registry::Format::Avro,
                    registry::schema_text(&given.schema),
                ),
                compiled: Compiled::Avro(Arc::new(given)),
                auto_register,
            });
            (field, made)
        }
        (Codec::Protobuf, false) => ("protobuf", protobuf_schema(output, topic, dir)),
        (Codec::JsonSchema, false) => ("json_schema", json_schema_schema(output, topic, dir)),
        _ => return None,
    };
    Some(made.map_err(|e| (field, e)))
}

fn protobuf_schema(
    output: &crate::topology::Output,
    topic: &str,
    dir: Option<&std::path::Path>,
) -> Result<OutputSchema, String> {
    let config = output
        .protobuf
        .as_ref()
        .ok_or("a Protobuf output needs its schema")?;
    let (text, mut imports) = match &config.schema_file {
        Some(file) if config.schema.is_none() => {
            protobuf::read_with_imports(&crate::topology::schemas::resolve(dir, file))?
        }
        _ => (config.text(dir)?, Vec::new()),
    };
    for (name, file) in &config.imports {
        imports.retain(|r| &r.name != name);
        imports.push(Reference {
            name: name.clone(),
            subject: name.clone(),
            text: crate::topology::schemas::read_text(dir, file)?,
        });
    }
    let (registered, message) = protobuf::registered(text, imports, config.message.as_deref())?;
    let subject = config
        .subject_strategy
        .subject(topic, Some(message.full_name()), false)?;
    Ok(OutputSchema {
        field: "protobuf",
        subject,
        registered,
        compiled: Compiled::Protobuf(message),
        auto_register: config.auto_register,
    })
}

fn json_schema_schema(
    output: &crate::topology::Output,
    topic: &str,
    dir: Option<&std::path::Path>,
) -> Result<OutputSchema, String> {
    let config = output
        .json_schema
        .as_ref()
        .ok_or("a JSON Schema output needs its schema")?;
    let schema = config.json(dir)?;
    let compiled = json_schema::Compiled::new(&schema)?;
    let title = crate::topology::JsonSchemaOutput::title(&schema);
    let subject = config
        .subject_strategy
        .subject(topic, title, false)
        .map_err(|e| format!("{e} (a JSON Schema's record name is its `title`)"))?;
    Ok(OutputSchema {
        field: "json_schema",
        subject,
        registered: compiled.registered.clone(),
        compiled: Compiled::JsonSchema(Arc::new(compiled)),
        auto_register: config.auto_register,
    })
}

/// The subject of Avro output `o` (of its keys when `key`), and its parsed schema.
pub fn avro_subject(topology: &Topology, o: usize, key: bool) -> Result<(String, Given), String> {
    let output = &topology.outputs[o];
    let config = if key { &output.key_avro } else { &output.avro };
    let config = config.as_ref().ok_or("an Avro output needs its schema")?;
    let json = config
        .source()
        .json(topology.dir.as_deref())?
        .ok_or("an Avro output needs its schema")?;
    let given = Given::parse(&json)?;
    let topic = match output.target() {
        Some(Target::Topic(t)) => t,
        _ => return Err("`avro` is for Kafka topic outputs".into()),
    };
    let subject = config
        .subject_strategy
        .subject(topic, given.full_name().as_deref(), key)?;
    Ok((subject, given))
}

/// The encoder of output `o` (of its keys when `key`), its schema registered (or looked up).
fn output_encoder(
    topology: &Topology,
    o: usize,
    key: bool,
    registry: &Registry,
) -> Result<Box<dyn Encoder>, Fault> {
    let schema = match output_schema(topology, o, key) {
        Some(Ok(s)) => s,
        Some(Err((field, message))) => {
            return Err(Fault::Config(format!("outputs[{o}].{field}"), message));
        }
        None => return Err(Fault::Config(format!("outputs[{o}]"), "no schema".into())),
    };
    let id = registry
        .register_schema(&schema.subject, &schema.registered, schema.auto_register)
        .map_err(Fault::Registry)?;
    Ok(match schema.compiled {
        Compiled::Avro(given) => Box::new(AvroEncoder::new(id, schema.subject, given)),
        Compiled::Protobuf(message) => Box::new(ProtobufEncoder::new(id, schema.subject, message)),
        Compiled::JsonSchema(c) => Box::new(JsonSchemaEncoder::new(id, schema.subject, c)),
    })
}
