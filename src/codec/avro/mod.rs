//! Avro in the Confluent wire format (magic byte 0, a 4-byte big-endian schema id, the Avro
//! binary datum), with schemas from a schema registry.
//!
//! A decoded Avro record is the same document a JSON value decodes to ([`crate::codec::json::Doc`]),
//! so expressions, processors and every output treat both alike, and a pipeline can read Avro
//! and write JSON or the other way round; [`read`] gives the mapping of each Avro type.
//!
//! * Decoding: the writer's schema by the id in the value (fetched once per id, then cached:
//!   [`crate::codec::registry`]); with a reader schema named in the topology, the datum is resolved to it by
//!   Avro's rules (apache-avro's resolution: added fields take their defaults, removed fields
//!   are skipped, `int` is promoted to `long`, `float`, `double`, ...).
//! * Encoding: with the output's schema, registered (or looked up) under its subject when the
//!   job starts, so encoding never calls the registry.
//!
//! Datums are read and written by this module's own walk over a compiled schema
//! ([`schema`], [`read`], [`write`](mod@write)) rather than through apache-avro's generic `Value`: the
//! document is built straight from the bytes, without the intermediate `Value` tree and its
//! per-field name copies (measured in docs/benchmarks.md, "Avro codec"). apache-avro parses
//! and checks every schema, resolves writer to reader, and is the reference the property test
//! holds this reader to.

pub mod read;
pub mod schema;
pub mod write;

use std::collections::HashMap;
use std::io::Cursor;
use std::sync::{Arc, RwLock};

use apache_avro::Schema;
use apache_avro::reader::datum::GenericDatumReader;
use apache_avro::writer::datum::GenericDatumWriter;

use super::json::Doc;
use super::registry::{Format, Registered, schema_text};
pub use super::registry::{Lookup, Registry};
use super::{CodecError, Decoder, Encoder, Value};
use crate::record::ErrorKind;
use schema::Compiled;

pub use super::registry::{HEADER_LEN, MAGIC, frame};

/// The schema id of a value in the Confluent wire format, and its datum.
pub fn split_header(bytes: &[u8]) -> Result<(u32, &[u8]), CodecError> {
    super::registry::split_header(bytes).map_err(bad_avro)
}

fn bad_avro(message: String) -> CodecError {
    CodecError {
        kind: ErrorKind::BadAvro,
        message,
    }
}

/// A schema the topology gives (a reader or an output schema), parsed and compiled.
#[derive(Debug)]
pub struct Given {
    pub schema: Schema,
    pub compiled: Compiled,
    pub canonical: String,
}

impl Given {
    /// Parses schema JSON (a mapping in the topology, or its text).
    pub fn parse(json: &serde_json::Value) -> Result<Given, String> {
        let schema = Schema::parse(json).map_err(|e| format!("not a valid Avro schema: {e}"))?;
        let compiled = Compiled::new(&schema)?;
        Ok(Given {
            canonical: schema_text(&schema),
            schema,
            compiled,
        })
    }

    /// The name of the schema's root type (for the record name strategies).
    pub fn full_name(&self) -> Option<String> {
        self.schema.name().map(|n| n.fullname(None))
    }
}

/// A writer schema as fetched: parsed, compiled, and its text ([`schema_text`], to tell
/// whether it is the reader schema itself).
#[derive(Debug)]
pub struct Writer {
    pub schema: Schema,
    pub compiled: Compiled,
    pub canonical: String,
}

impl Writer {
    pub fn new(schema: Schema) -> Result<Writer, String> {
        let compiled = Compiled::new(&schema)?;
        let canonical = schema_text(&schema);
        Ok(Writer {
            schema,
            compiled,
            canonical,
        })
    }
}

/// The writer schema of `registered` (schema id `id`).
fn writer(id: u32, registered: &Registered) -> Result<Writer, CodecError> {
    Schema::parse_str(&registered.text)
        .map_err(|e| e.to_string())
        .and_then(Writer::new)
        .map_err(|e| CodecError {
            kind: ErrorKind::UnknownSchema,
            message: format!("schema id {id} is not a valid Avro schema: {e}"),
        })
}

/// The record error of a schema that could not be looked up.
pub fn lookup_error(e: Lookup) -> CodecError {
    match e {
        Lookup::Unknown(message) => CodecError {
            kind: ErrorKind::UnknownSchema,
            message,
        },
        Lookup::Unavailable(message) => CodecError {
            kind: ErrorKind::RegistryUnavailable,
            message,
        },
    }
}

/// How a value written with one schema id is read.
enum Plan {
    /// With the writer's own schema (no reader schema, or the reader schema is the writer's).
    Direct(Arc<Writer>),
    /// Resolved from the writer's schema to the reader's, on their physical types.
    Resolve {
        writer: Arc<Writer>,
        reader: Arc<Given>,
        resolver: Box<Resolver>,
    },
}

/// apache-avro's resolving reader (writer schema to reader schema) and a writer of the
/// reader schema, built once per writer schema id. They borrow their schemas for as long as
/// they live, so the two physical schemas are leaked: once per distinct writer schema id a
/// process meets with a reader schema, as the compiled schemas' field names are.
struct Resolver {
    read: GenericDatumReader<'static>,
    write: GenericDatumWriter<'static>,
}

impl Resolver {
    fn new(writer: &Schema, reader: &Schema) -> Result<Resolver, String> {
        let writer: &'static Schema = Box::leak(Box::new(physical(writer)?));
        let reader: &'static Schema = Box::leak(Box::new(physical(reader)?));
        Ok(Resolver {
            read: GenericDatumReader::builder(writer)
                .reader_schema(reader)
                .build()
                .map_err(|e| e.to_string())?,
            // The values it writes are the resolving reader's: valid by construction.
            write: GenericDatumWriter::builder(reader)
                .validate(false)
                .build()
                .map_err(|e| e.to_string())?,
        })
    }
}

/// `schema` without its logical types: what apache-avro resolves. Resolution is on the
/// physical types, as in Avro's Java implementation (a logical type changes how a value is
/// seen, not how it is written); the reader's logical types are applied when the resolved
/// datum is read. (It also keeps clear of apache-avro 0.22 refusing to resolve a `bytes`
/// decimal shorter than its precision could need.)
fn physical(schema: &Schema) -> Result<Schema, String> {
    fn strip(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(map) => {
                if map.remove("logicalType").is_some() {
                    map.remove("precision");
                    map.remove("scale");
                }
                map.values_mut().for_each(strip);
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let mut json = serde_json::to_value(schema).map_err(|e| e.to_string())?;
    strip(&mut json);
    Schema::parse(&json).map_err(|e| e.to_string())
}

/// The Avro decoder of an input.
pub struct AvroDecoder {
    registry: Arc<Registry>,
    reader: Option<Arc<Given>>,
    /// The plan of each schema id met, or why it has none for good.
    plans: RwLock<HashMap<u32, Result<Arc<Plan>, CodecError>>>,
}

impl AvroDecoder {
    pub fn new(registry: Arc<Registry>, reader: Option<Arc<Given>>) -> AvroDecoder {
        AvroDecoder {
            registry,
            reader,
            plans: RwLock::new(HashMap::new()),
        }
    }

    fn plan(&self, id: u32) -> Result<Arc<Plan>, CodecError> {
        if let Some(p) = self
            .plans
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&id)
        {
            return p.clone();
        }
        // Not cached here: the registry remembers an unknown id for a while, and asks again
        // for one it could not fetch.
        let registered = self
            .registry
            .schema(id, Format::Avro)
            .map_err(lookup_error)?;
        // A schema the registry gave is the same next time: what is made of it is kept.
        let planned = writer(id, &registered).and_then(|w| self.plan_for(id, Arc::new(w)));
        self.plans
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(id, planned.clone());
        planned
    }

    fn plan_for(&self, id: u32, writer: Arc<Writer>) -> Result<Arc<Plan>, CodecError> {
        Ok(Arc::new(match &self.reader {
            Some(r) if r.canonical != writer.canonical => {
                match Resolver::new(&writer.schema, &r.schema) {
                    Ok(resolver) => Plan::Resolve {
                        writer,
                        reader: Arc::clone(r),
                        resolver: Box::new(resolver),
                    },
                    Err(e) => {
                        return Err(CodecError {
                            kind: ErrorKind::SchemaMismatch,
                            message: format!("schema id {id} cannot be resolved: {e}"),
                        });
                    }
                }
            }
            _ => Plan::Direct(writer),
        }))
    }
}

impl Decoder for AvroDecoder {
    fn decode<'a>(&self, bytes: Option<&'a [u8]>) -> Result<Value<'a>, CodecError> {
        let Some(bytes) = bytes else {
            return Ok(Value::Json(None));
        };
        let (id, datum) = split_header(bytes)?;
        let plan = self.plan(id)?;
        let doc = match &*plan {
            Plan::Direct(writer) => read::decode(&writer.compiled, datum)
                .map_err(|e| bad_avro(format!("schema id {id}: {e}")))?,
            Plan::Resolve {
                writer,
                reader,
                resolver,
            } => resolve(id, writer, resolver, reader, datum)?,
        };
        Ok(Value::Json(Some(doc)))
    }
}

/// Reads `datum` written with `writer` as `reader` says. A datum apache-avro cannot resolve
/// is read with the writer's schema alone to tell corrupt bytes (`bad_avro`) from a datum the
/// reader schema cannot take (`schema_mismatch`).
fn resolve<'a>(
    id: u32,
    writer: &Writer,
    resolver: &Resolver,
    reader: &Given,
    datum: &[u8],
) -> Result<Doc<'a>, CodecError> {
    let mismatch = |e: String| CodecError {
        kind: ErrorKind::SchemaMismatch,
        message: format!("schema id {id} cannot be read with the input's reader schema: {e}"),
    };
    let mut cursor = Cursor::new(datum);
    let value = match resolver.read.read_value(&mut cursor) {
        Ok(v) if cursor.position() as usize == datum.len() => v,
        other => {
            read::decode(&writer.compiled, datum)
                .map_err(|e| bad_avro(format!("schema id {id}: {e}")))?;
            return Err(mismatch(match other {
                Err(e) => e.to_string(),
                Ok(_) => "the resolved datum ends early".into(),
            }));
        }
    };
    // Written again with the reader's schema and read with it: one mapping to documents.
    let resolved = resolver
        .write
        .write_value_to_vec(value)
        .map_err(|e| mismatch(e.to_string()))?;
    read::decode(&reader.compiled, &resolved).map_err(mismatch)
}

/// The Avro encoder of an output: its schema and the id the registry gave it.
pub struct AvroEncoder {
    id: u32,
    subject: String,
    schema: Arc<Given>,
}

impl AvroEncoder {
    pub fn new(id: u32, subject: String, schema: Arc<Given>) -> AvroEncoder {
        AvroEncoder {
            id,
            subject,
            schema,
        }
    }
}

impl Encoder for AvroEncoder {
    fn encode(&self, value: &Value<'_>, size_hint: usize) -> Result<Option<Vec<u8>>, CodecError> {
        // Raw bytes written as Avro must be a JSON document.
        let Some(doc) = super::document(value, "an Avro")? else {
            return Ok(None);
        };
        let doc = doc.as_ref();
        let mut out = Vec::with_capacity(size_hint + HEADER_LEN);
        out.push(MAGIC);
        out.extend_from_slice(&self.id.to_be_bytes());
        write::encode(&self.schema.compiled, doc, &mut out).map_err(|e| CodecError {
            kind: ErrorKind::SchemaMismatch,
            message: format!(
                "the record does not fit the output schema (subject `{}`, id {}): {e}",
                self.subject, self.id
            ),
        })?;
        Ok(Some(out))
    }
}

#[cfg(test)]
mod tests;
/// Reference values and the reference codec, for tests elsewhere that run Avro records.
#[cfg(test)]
pub(crate) use tests::{
    ORDER, decode_json, order_value, reference_encode, registry_with, schema as parsed_schema,
};
