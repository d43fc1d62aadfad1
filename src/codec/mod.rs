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
//! * [`avro`]: Avro in the Confluent wire format, decoded to the same document as JSON; its
//!   schemas come from a registry, looked up once per schema id and cached ([`Codecs`] sets
//!   them up when the job starts).

pub mod avro;
pub mod json;
pub mod raw;

use std::collections::HashMap;
use std::sync::Arc;

use crate::record::ErrorKind;
use crate::topology::{Codec, ConfigIssue, Target, Topology};
use avro::{AvroDecoder, AvroEncoder, Given, Registry};
use json::Doc;

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
        Codecs::build(topology, Arc::new(Registry::offline())).map_err(|e| match e {
            SetupError::Config(issues) => issues,
            SetupError::Registry(message) => vec![ConfigIssue {
                path: "schema_registry".into(),
                message,
            }],
        })
    }

    /// The codecs of `topology` with its registry: each Avro output's schema registered (or
    /// looked up) under its subject. The only registry calls besides the first look-up of
    /// each schema id.
    pub fn connect(topology: &Topology) -> Result<Codecs, SetupError> {
        let registry = match &topology.schema_registry {
            Some(config) => Registry::connect(config).map_err(SetupError::Registry)?,
            None => Registry::offline(),
        };
        Codecs::build(topology, Arc::new(registry))
    }

    fn build(topology: &Topology, registry: Arc<Registry>) -> Result<Codecs, SetupError> {
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
            };
            decoders.insert(input.source_name(), decoder);
        }
        let mut key_decoders: HashMap<String, Box<dyn Decoder>> = HashMap::new();
        for input in &topology.inputs {
            let decoder: Box<dyn Decoder> = match input.key_codec {
                Codec::Raw => continue,
                Codec::Json => Box::new(json::Json),
                Codec::Avro => Box::new(AvroDecoder::new(Arc::clone(&registry), None)),
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
                Some(Codec::Avro) => match avro_output(topology, o, true, &registry) {
                    Ok(e) => Some(Box::new(e)),
                    Err(Fault::Config(message)) => {
                        issues.push(ConfigIssue {
                            path: format!("outputs[{o}].key_avro"),
                            message,
                        });
                        None
                    }
                    Err(Fault::Registry(message)) => {
                        refused.push(format!("outputs[{o}] ({}) key: {message}", output.name()));
                        None
                    }
                },
            };
            key_encoders.push(key_encoder);
            let encoder: Box<dyn Encoder> = match topology.output_codec(o) {
                Codec::Raw => Box::new(raw::Raw),
                Codec::Json => Box::new(json::Json),
                Codec::Avro => match avro_output(topology, o, false, &registry) {
                    Ok(e) => Box::new(e),
                    Err(Fault::Config(message)) => {
                        issues.push(ConfigIssue {
                            path: format!("outputs[{o}].avro"),
                            message,
                        });
                        Box::new(raw::Raw)
                    }
                    Err(Fault::Registry(message)) => {
                        refused.push(format!("outputs[{o}] ({}): {message}", output.name()));
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

enum Fault {
    Config(String),
    Registry(String),
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

fn avro_output(
    topology: &Topology,
    o: usize,
    key: bool,
    registry: &Registry,
) -> Result<AvroEncoder, Fault> {
    let (subject, given) = avro_subject(topology, o, key).map_err(Fault::Config)?;
    let output = &topology.outputs[o];
    let config = if key { &output.key_avro } else { &output.avro };
    let auto_register = config.as_ref().is_none_or(|a| a.auto_register);
    let id = registry
        .register(&subject, &given.schema, auto_register)
        .map_err(Fault::Registry)?;
    Ok(AvroEncoder::new(id, subject, Arc::new(given)))
}
