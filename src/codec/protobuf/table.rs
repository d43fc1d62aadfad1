//! A message compiled to flat tables once per schema, for [`mod@super::read`]: each message's
//! fields in field-number order (the order the document lists them in) with their name,
//! kind, shape (single, list, map), presence, oneof and default, a field-number index, each
//! enum's value names, and the well-known types the JSON mapping writes as their own values.
//!
//! Everything is taken from prost-reflect's descriptors, and the defaults from prost-reflect's
//! own rendering of an empty message, so that the reader writes the same document as the
//! prost-reflect path ([`super::doc::to_doc`]).

use std::collections::HashMap;

use prost_reflect::{DynamicMessage, EnumDescriptor, MessageDescriptor};
use serde_json::Value as Json;

use super::doc;
use crate::codec::json::Doc;

/// Field numbers below this are found by a direct index; the others by a binary search.
const DIRECT: u32 = 256;

/// A message and every message and enum it reaches; the root is `messages[0]`.
#[derive(Debug)]
pub struct Table {
    pub messages: Vec<Message>,
    pub enums: Vec<Enum>,
}

/// The kind of a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Double,
    Float,
    Int32,
    Int64,
    Uint32,
    Uint64,
    Sint32,
    Sint64,
    Fixed32,
    Fixed64,
    Sfixed32,
    Sfixed64,
    Bool,
    String,
    Bytes,
    /// An index into [`Table::enums`].
    Enum(usize),
    /// An index into [`Table::messages`].
    Message(usize),
}

/// The wire types.
pub const VARINT: u8 = 0;
pub const FIXED64: u8 = 1;
pub const LEN: u8 = 2;
pub const START_GROUP: u8 = 3;
pub const END_GROUP: u8 = 4;
pub const FIXED32: u8 = 5;

impl Kind {
    /// The wire type of one value of this kind.
    pub fn wire_type(self) -> u8 {
        match self {
            Kind::Double | Kind::Fixed64 | Kind::Sfixed64 => FIXED64,
            Kind::Float | Kind::Fixed32 | Kind::Sfixed32 => FIXED32,
            Kind::String | Kind::Bytes | Kind::Message(_) => LEN,
            _ => VARINT,
        }
    }

    /// Whether a repeated field of this kind may be packed.
    pub fn packable(self) -> bool {
        !matches!(self, Kind::String | Kind::Bytes | Kind::Message(_))
    }
}

/// How many values a field holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    Single,
    List,
    /// A map: its key's and its value's kinds (the field's own kind is its entry message).
    Map {
        key: Kind,
        value: Kind,
    },
}

#[derive(Debug)]
pub struct Field {
    pub number: u32,
    /// The `.proto` name, leaked once per compiled schema so that a document can borrow it
    /// whatever the lifetime of the bytes it is read from (bounded by the number of schemas
    /// met, each compiled once).
    pub name: &'static str,
    pub kind: Kind,
    pub shape: Shape,
    /// Whether an unset field is left out of the document (a message, `optional`, a oneof
    /// member, a proto2 field); one without presence is written with its default.
    pub presence: bool,
    /// The index of its oneof in [`Message::oneofs`].
    pub oneof: Option<usize>,
    /// What the document holds when the field is unset and has no presence.
    pub default: Json,
}

/// A well-known type the JSON mapping writes as a value of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WellKnown {
    Timestamp,
    Duration,
    /// `google.protobuf.*Value` wrappers: the kind of their field 1.
    Wrapper(Kind),
    /// `Any`, `Struct`, `Value`, `ListValue`, `FieldMask`, `Empty`: written by prost-reflect.
    Other,
}

#[derive(Debug)]
pub struct Message {
    pub descriptor: MessageDescriptor,
    pub well_known: Option<WellKnown>,
    /// In field-number order.
    pub fields: Vec<Field>,
    /// Field number to index in `fields` for numbers below [`DIRECT`] (`u32::MAX`: none).
    direct: Vec<u32>,
    /// The members of each oneof, as indexes in `fields`.
    pub oneofs: Vec<Vec<usize>>,
}

impl Message {
    /// The index of the field numbered `number`.
    #[inline]
    pub fn field(&self, number: u32) -> Option<usize> {
        if number < DIRECT {
            match self.direct.get(number as usize) {
                Some(&i) if i != u32::MAX => Some(i as usize),
                _ => None,
            }
        } else {
            self.fields.binary_search_by_key(&number, |f| f.number).ok()
        }
    }
}

#[derive(Debug)]
pub struct Enum {
    /// The name of each number, sorted by number (the name prost-reflect gives an alias).
    pub names: Vec<(i32, String)>,
    /// `google.protobuf.NullValue`, written as `null`.
    pub null_value: bool,
    /// The number of its first value: an unset enum in a map's entry.
    pub first: i32,
}

impl Enum {
    pub fn name(&self, number: i32) -> Option<&str> {
        self.names
            .binary_search_by_key(&number, |(n, _)| *n)
            .ok()
            .map(|i| self.names[i].1.as_str())
    }
}

fn well_known(full_name: &str) -> Option<WellKnown> {
    Some(match full_name {
        "google.protobuf.Timestamp" => WellKnown::Timestamp,
        "google.protobuf.Duration" => WellKnown::Duration,
        "google.protobuf.DoubleValue" => WellKnown::Wrapper(Kind::Double),
        "google.protobuf.FloatValue" => WellKnown::Wrapper(Kind::Float),
        "google.protobuf.Int64Value" => WellKnown::Wrapper(Kind::Int64),
        "google.protobuf.UInt64Value" => WellKnown::Wrapper(Kind::Uint64),
        "google.protobuf.Int32Value" => WellKnown::Wrapper(Kind::Int32),
        "google.protobuf.UInt32Value" => WellKnown::Wrapper(Kind::Uint32),
        "google.protobuf.BoolValue" => WellKnown::Wrapper(Kind::Bool),
        "google.protobuf.StringValue" => WellKnown::Wrapper(Kind::String),
        "google.protobuf.BytesValue" => WellKnown::Wrapper(Kind::Bytes),
        "google.protobuf.Any"
        | "google.protobuf.Struct"
        | "google.protobuf.Value"
        | "google.protobuf.ListValue"
        | "google.protobuf.FieldMask"
        | "google.protobuf.Empty" => WellKnown::Other,
        _ => return None,
    })
}

impl Table {
    /// Compiles `root` and what it reaches. An error (the reason) for what the tables do not
    /// cover, read by prost-reflect instead: a well-known type at the root, groups, extensions.
    pub fn compile(root: &MessageDescriptor) -> Result<Table, String> {
        if well_known(root.full_name()).is_some() {
            return Err(format!("`{}` is a well-known type", root.full_name()));
        }
        let mut c = Compiler {
            table: Table {
                messages: Vec::new(),
                enums: Vec::new(),
            },
            messages: HashMap::new(),
            enums: HashMap::new(),
        };
        c.message(root)?;
        Ok(c.table)
    }
}

struct Compiler {
    table: Table,
    messages: HashMap<String, usize>,
    enums: HashMap<String, usize>,
}

impl Compiler {
    fn message(&mut self, m: &MessageDescriptor) -> Result<usize, String> {
        if let Some(&i) = self.messages.get(m.full_name()) {
            return Ok(i);
        }
        let index = self.table.messages.len();
        self.messages.insert(m.full_name().to_string(), index);
        let wk = well_known(m.full_name());
        self.table.messages.push(Message {
            descriptor: m.clone(),
            well_known: wk,
            fields: Vec::new(),
            direct: Vec::new(),
            oneofs: Vec::new(),
        });
        if wk.is_some() {
            return Ok(index);
        }
        if m.extensions().len() > 0 {
            return Err(format!("`{}` has extensions", m.full_name()));
        }
        let defaults = defaults_of(m);
        let mut fields = Vec::with_capacity(m.fields().len());
        let mut oneof_names: Vec<String> = Vec::new();
        for f in m.fields() {
            if f.is_group() {
                return Err(format!("`{}` is a group", f.full_name()));
            }
            let kind = self.kind(&f.kind())?;
            let shape = if f.is_map() {
                let entry = match f.kind() {
                    prost_reflect::Kind::Message(entry) => entry,
                    _ => return Err(format!("map `{}` has no entry message", f.full_name())),
                };
                Shape::Map {
                    key: self.kind(&entry.map_entry_key_field().kind())?,
                    value: self.kind(&entry.map_entry_value_field().kind())?,
                }
            } else if f.is_list() {
                Shape::List
            } else {
                Shape::Single
            };
            let oneof = f.containing_oneof().map(|o| {
                let name = o.full_name().to_string();
                match oneof_names.iter().position(|n| *n == name) {
                    Some(i) => i,
                    None => {
                        oneof_names.push(name);
                        oneof_names.len() - 1
                    }
                }
            });
            fields.push(Field {
                number: f.number(),
                name: intern(f.name()),
                kind,
                shape,
                presence: f.supports_presence(),
                oneof,
                default: defaults.get(f.name()).cloned().unwrap_or(Json::Null),
            });
        }
        fields.sort_by_key(|f| f.number);
        let mut oneofs = vec![Vec::new(); oneof_names.len()];
        for (i, f) in fields.iter().enumerate() {
            if let Some(o) = f.oneof {
                oneofs[o].push(i);
            }
        }
        let mut direct = Vec::new();
        for (i, f) in fields.iter().enumerate() {
            if f.number < DIRECT {
                let at = f.number as usize;
                if direct.len() <= at {
                    direct.resize(at + 1, u32::MAX);
                }
                direct[at] = i as u32;
            }
        }
        let message = &mut self.table.messages[index];
        message.fields = fields;
        message.direct = direct;
        message.oneofs = oneofs;
        Ok(index)
    }

    fn kind(&mut self, kind: &prost_reflect::Kind) -> Result<Kind, String> {
        use prost_reflect::Kind as K;
        Ok(match kind {
            K::Double => Kind::Double,
            K::Float => Kind::Float,
            K::Int32 => Kind::Int32,
            K::Int64 => Kind::Int64,
            K::Uint32 => Kind::Uint32,
            K::Uint64 => Kind::Uint64,
            K::Sint32 => Kind::Sint32,
            K::Sint64 => Kind::Sint64,
            K::Fixed32 => Kind::Fixed32,
            K::Fixed64 => Kind::Fixed64,
            K::Sfixed32 => Kind::Sfixed32,
            K::Sfixed64 => Kind::Sfixed64,
            K::Bool => Kind::Bool,
            K::String => Kind::String,
            K::Bytes => Kind::Bytes,
            K::Enum(e) => Kind::Enum(self.enumeration(e)),
            K::Message(m) => Kind::Message(self.message(m)?),
        })
    }

    fn enumeration(&mut self, e: &EnumDescriptor) -> usize {
        if let Some(&i) = self.enums.get(e.full_name()) {
            return i;
        }
        let mut names: Vec<(i32, String)> = Vec::new();
        for v in e.values() {
            if names.iter().any(|(n, _)| *n == v.number()) {
                continue;
            }
            // The name prost-reflect writes for the number (the first of its aliases).
            let name = e
                .get_value(v.number())
                .map_or_else(|| v.name().to_string(), |v| v.name().to_string());
            names.push((v.number(), name));
        }
        names.sort_by_key(|(n, _)| *n);
        let index = self.table.enums.len();
        self.table.enums.push(Enum {
            names,
            null_value: e.full_name() == "google.protobuf.NullValue",
            first: e.default_value().number(),
        });
        self.enums.insert(e.full_name().to_string(), index);
        index
    }
}

/// The document prost-reflect writes for an empty `m`: the default of every field without
/// presence, by name.
fn defaults_of(m: &MessageDescriptor) -> HashMap<String, Json> {
    match doc::to_doc(&DynamicMessage::new(m.clone())) {
        Ok(Doc::Object(fields)) => fields
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_json()))
            .collect(),
        _ => HashMap::new(),
    }
}

fn intern(name: &str) -> &'static str {
    Box::leak(name.to_string().into_boxed_str())
}
