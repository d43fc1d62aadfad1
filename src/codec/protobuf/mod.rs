//! Protobuf in the Confluent wire format: magic byte 0, a 4-byte big-endian schema id, the
//! message indexes (which message of the schema's file the value is), then the protobuf
//! message. Schemas are `.proto` text from the registry, with the files they import
//! (registered as references), compiled at run time by protox; messages are read by
//! onceflow's own reader ([`mod@read`]) and written as prost-reflect's dynamic messages.
//!
//! A decoded message is the same document a JSON value decodes to ([`crate::codec::json::Doc`]),
//! in protobuf's JSON mapping as [`doc`] sets it: fields by their `.proto` names, every field
//! present (unset scalars at their defaults, an unset message `null`), 64-bit integers as
//! numbers, enums by name, bytes as base64, `google.protobuf.Timestamp` and `Duration` as their
//! RFC 3339 and `"1.5s"` text, wrappers as their value, `Struct` as an object. Encoding takes
//! the same document back (and the mapping's other spellings: camelCase names, enum numbers,
//! 64-bit integers as text).
//!
//! * Decoding: the writer's schema by the id in the value (fetched and compiled once per id,
//!   then cached), the message by its indexes, read by [`mod@read`] over the message compiled to
//!   [`table`]s once per id and indexes (prost-reflect's dynamic message for what the tables do
//!   not cover: a well-known type at the root, groups, extensions).
//! * Encoding: with the output's schema and message, registered (or looked up) under its
//!   subject when the job starts, so encoding never calls the registry.

pub mod doc;
pub mod read;
pub mod table;
pub mod wire;

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use prost_reflect::prost::Message as _;
use prost_reflect::{DynamicMessage, FileDescriptor, MessageDescriptor};
use protox::file::{ChainFileResolver, File, FileResolver, GoogleFileResolver};

use self::table::Table;
use super::registry::{Format, Reference, Registered, Registry};
use super::{CodecError, Decoder, Encoder, Value};
use crate::record::ErrorKind;

/// The name the root schema is compiled under: the registry names only the files a schema
/// imports, not the schema itself.
const ROOT: &str = "onceflow-root.proto";

/// A `.proto` file compiled with its imports.
#[derive(Debug, Clone)]
pub struct Schema {
    pub file: FileDescriptor,
}

impl Schema {
    /// Compiles `text` with the files it imports: `imports` by the name it imports each with,
    /// then protobuf's own `google/protobuf/*` files.
    pub fn compile(text: &str, imports: &[Reference]) -> Result<Schema, String> {
        let mut files: HashMap<String, String> = imports
            .iter()
            .map(|r| (r.name.clone(), r.text.clone()))
            .collect();
        files.insert(ROOT.to_string(), text.to_string());
        let mut resolver = ChainFileResolver::new();
        resolver.add(Files(files));
        resolver.add(GoogleFileResolver::new());
        let mut compiler = protox::Compiler::with_file_resolver(resolver);
        compiler.include_imports(true);
        compiler.open_file(ROOT).map_err(|e| e.to_string())?;
        let file = compiler
            .descriptor_pool()
            .get_file_by_name(ROOT)
            .ok_or("the compiled schema has no root file")?;
        Ok(Schema { file })
    }

    /// The message at `indexes`: the position among the messages declared at each level
    /// (top-level, then nested), as the Confluent wire format counts them.
    pub fn message_at(&self, indexes: &[i32]) -> Option<MessageDescriptor> {
        let (first, rest) = indexes.split_first()?;
        let mut message = self.file.messages().nth(usize::try_from(*first).ok()?)?;
        for i in rest {
            let next = declared(&message).nth(usize::try_from(*i).ok()?)?;
            message = next;
        }
        Some(message)
    }

    /// The message named `name` (its full name, or its name when the file has no package),
    /// or the file's first message when `None`.
    pub fn message(&self, name: Option<&str>) -> Result<MessageDescriptor, String> {
        let names = || {
            let all: Vec<String> = self
                .file
                .messages()
                .map(|m| m.full_name().to_string())
                .collect();
            all.join(", ")
        };
        match name {
            None => self
                .file
                .messages()
                .next()
                .ok_or_else(|| "the schema declares no message".to_string()),
            Some(n) => {
                let package = self.file.package_name();
                let full = if package.is_empty() || n.starts_with(&format!("{package}.")) {
                    n.to_string()
                } else {
                    format!("{package}.{n}")
                };
                self.file
                    .parent_pool()
                    .get_message_by_name(&full)
                    .filter(|m| m.parent_file() == self.file)
                    .ok_or_else(|| {
                        format!("the schema declares no message `{n}` (it has: {})", names())
                    })
            }
        }
    }
}

/// The messages declared inside `message`: its nested ones, without the entries protobuf
/// makes for its `map` fields.
fn declared(message: &MessageDescriptor) -> impl Iterator<Item = MessageDescriptor> + '_ {
    message.child_messages().filter(|m| !m.is_map_entry())
}

/// The indexes of `message` in its file (see [`Schema::message_at`]).
pub fn indexes_of(message: &MessageDescriptor) -> Vec<i32> {
    let mut path = Vec::new();
    let mut at = message.clone();
    loop {
        let position = match at.parent_message() {
            Some(parent) => declared(&parent).position(|m| m == at),
            None => at.parent_file().messages().position(|m| m == at),
        };
        path.push(position.and_then(|p| i32::try_from(p).ok()).unwrap_or(0));
        match at.parent_message() {
            Some(parent) => at = parent,
            None => break,
        }
    }
    path.reverse();
    path
}

/// The `.proto` file at `path` and the files it imports (but protobuf's own), found by their
/// import names under its directory or the nearest of its parents that has them, as
/// `protoc -I` would with that directory, each registered under its import name.
pub fn read_with_imports(path: &std::path::Path) -> Result<(String, Vec<Reference>), String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let dir = path.parent().unwrap_or(std::path::Path::new("."));
    let mut found: Vec<Reference> = Vec::new();
    let mut pending: Vec<String> = import_names(&text);
    while let Some(name) = pending.pop() {
        if name.starts_with("google/protobuf/") || found.iter().any(|r| r.name == name) {
            continue;
        }
        let file = dir
            .ancestors()
            .map(|d| d.join(&name))
            .find(|p| p.is_file())
            .ok_or_else(|| {
                format!(
                    "{} imports `{name}`, which is neither under {} nor its parents",
                    path.display(),
                    dir.display()
                )
            })?;
        let imported = std::fs::read_to_string(&file)
            .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
        pending.extend(import_names(&imported));
        found.push(Reference {
            subject: name.clone(),
            name,
            text: imported,
        });
    }
    Ok((text, found))
}

/// The names `text` imports (`import "a/b.proto";`, `import public ...`, `import weak ...`).
fn import_names(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|line| {
            let rest = line.trim_start().strip_prefix("import")?;
            let start = rest.find('"')? + 1;
            let len = rest[start..].find('"')?;
            Some(rest[start..start + len].to_string())
        })
        .collect()
}

/// The files a schema imports, by name.
struct Files(HashMap<String, String>);

impl FileResolver for Files {
    fn open_file(&self, name: &str) -> Result<File, protox::Error> {
        match self.0.get(name) {
            Some(text) => match serialized(text) {
                Some(mut descriptor) => {
                    descriptor.name = Some(name.to_string());
                    Ok(File::from_file_descriptor_proto(descriptor))
                }
                None => File::from_source(name, text),
            },
            None => Err(protox::Error::file_not_found(name)),
        }
    }
}

/// A schema registered in its serialized form: a `FileDescriptorProto` in base64, as
/// Confluent's Python and Go serializers register schemas (Confluent's registry turns it into
/// `.proto` text; others, such as Apicurio, keep it as given). `None` for `.proto` text.
fn serialized(text: &str) -> Option<prost_reflect::prost_types::FileDescriptorProto> {
    use base64::Engine as _;
    let text = text.trim();
    // `.proto` text has spaces or semicolons; base64 has neither.
    if text.is_empty() || text.contains([' ', ';', '\n']) {
        return None;
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .ok()?;
    prost_reflect::prost_types::FileDescriptorProto::decode(bytes.as_slice()).ok()
}

fn bad(message: String) -> CodecError {
    CodecError {
        kind: ErrorKind::BadProtobuf,
        message,
    }
}

/// The Protobuf decoder of an input.
pub struct ProtobufDecoder {
    registry: Arc<Registry>,
    /// The compiled schema of each id met, or why it has none for good.
    schemas: RwLock<HashMap<u32, Result<Arc<Schema>, CodecError>>>,
    /// Each message met, by schema id and indexes: its descriptor and its tables (`None`:
    /// read by prost-reflect).
    tables: RwLock<HashMap<(u32, Vec<i32>), Compiled>>,
}

/// A message of a schema: its descriptor, and its tables unless prost-reflect reads it.
type Compiled = (MessageDescriptor, Option<Arc<Table>>);

impl ProtobufDecoder {
    pub fn new(registry: Arc<Registry>) -> ProtobufDecoder {
        ProtobufDecoder {
            registry,
            schemas: RwLock::new(HashMap::new()),
            tables: RwLock::new(HashMap::new()),
        }
    }

    /// The message at `key`'s indexes in `schema` and its tables, looked up and compiled on
    /// first use.
    fn table(&self, schema: &Schema, key: (u32, Vec<i32>)) -> Result<Compiled, CodecError> {
        if let Some(compiled) = read(&self.tables).get(&key) {
            return Ok(compiled.clone());
        }
        let (id, indexes) = &key;
        let descriptor = schema.message_at(indexes).ok_or_else(|| {
            bad(format!(
                "schema id {id} has no message at index {indexes:?} (it declares {} top-level \
                 message(s))",
                schema.file.messages().len()
            ))
        })?;
        let table = Table::compile(&descriptor).ok().map(Arc::new);
        let compiled = (descriptor, table);
        write(&self.tables).insert(key, compiled.clone());
        Ok(compiled)
    }

    fn schema(&self, id: u32) -> Result<Arc<Schema>, CodecError> {
        if let Some(s) = read(&self.schemas).get(&id) {
            return s.clone();
        }
        // Not cached here: the registry remembers an unknown id for a while, and asks again
        // for one it could not fetch.
        let registered = self
            .registry
            .schema(id, Format::Protobuf)
            .map_err(super::avro::lookup_error)?;
        let compiled = Schema::compile(&registered.text, &registered.references)
            .map(Arc::new)
            .map_err(|e| CodecError {
                kind: ErrorKind::UnknownSchema,
                message: format!("schema id {id} is not a valid Protobuf schema: {e}"),
            });
        write(&self.schemas).insert(id, compiled.clone());
        compiled
    }
}

impl Decoder for ProtobufDecoder {
    fn decode<'a>(&self, bytes: Option<&'a [u8]>) -> Result<Value<'a>, CodecError> {
        let Some(bytes) = bytes else {
            return Ok(Value::Json(None));
        };
        let (id, rest) = wire::split_header(bytes).map_err(bad)?;
        let schema = self.schema(id)?;
        let (indexes, body) = wire::read_indexes(rest)
            .map_err(|e| bad(format!("schema id {id}: the message indexes: {e}")))?;
        let (descriptor, table) = self.table(&schema, (id, indexes))?;
        let invalid = |e: String| {
            bad(format!(
                "schema id {id}: not a valid `{}` message: {e}",
                descriptor.full_name()
            ))
        };
        if let Some(table) = table {
            return read::decode(&table, body)
                .map(|d| Value::Json(Some(d)))
                .map_err(invalid);
        }
        let message =
            DynamicMessage::decode(descriptor.clone(), body).map_err(|e| invalid(e.to_string()))?;
        doc::to_doc(&message)
            .map(|d| Value::Json(Some(d)))
            .map_err(|e| bad(format!("schema id {id}: {e}")))
    }
}

/// The Protobuf encoder of an output: its message, the id the registry gave its schema, and
/// the wire format's header for both.
pub struct ProtobufEncoder {
    message: MessageDescriptor,
    subject: String,
    id: u32,
    header: Vec<u8>,
}

impl ProtobufEncoder {
    pub fn new(id: u32, subject: String, message: MessageDescriptor) -> ProtobufEncoder {
        let header = wire::header(id, &indexes_of(&message));
        ProtobufEncoder {
            message,
            subject,
            id,
            header,
        }
    }
}

impl Encoder for ProtobufEncoder {
    fn encode(&self, value: &Value<'_>, size_hint: usize) -> Result<Option<Vec<u8>>, CodecError> {
        let Some(doc) = super::document(value, "a Protobuf")? else {
            return Ok(None);
        };
        let doc = doc.as_ref();
        let message = doc::from_doc(&self.message, doc, size_hint).map_err(|e| CodecError {
            kind: ErrorKind::SchemaMismatch,
            message: format!(
                "the record does not fit the output's message `{}` (subject `{}`, id {}): {e}",
                self.message.full_name(),
                self.subject,
                self.id
            ),
        })?;
        let mut out = Vec::with_capacity(self.header.len() + message.encoded_len());
        out.extend_from_slice(&self.header);
        // Writing to a Vec with room for the message cannot fail.
        let _ = message.encode(&mut out);
        Ok(Some(out))
    }
}

/// The output's schema as registered, and its message.
pub fn registered(
    text: String,
    imports: Vec<Reference>,
    message: Option<&str>,
) -> Result<(Registered, MessageDescriptor), String> {
    let schema = Schema::compile(&text, &imports)?;
    let descriptor = schema.message(message)?;
    Ok((
        Registered {
            format: Format::Protobuf,
            text,
            references: imports,
        },
        descriptor,
    ))
}

fn read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    // A poisoned cache still holds valid entries: each is inserted whole.
    l.read().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn write<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod props;
