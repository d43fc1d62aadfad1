//! An Avro schema compiled for the codec: apache-avro parses and checks the schema text; this
//! flattens it into an arena of [`Node`]s with every named reference resolved to an index (so
//! that recursive types are plain indexes), field names interned, and defaults turned into the
//! documents expressions see. Reading ([`super::read`]) and writing ([`super::write`]) walk
//! this arena.

use std::collections::HashMap;

use apache_avro::Schema;
use apache_avro::schema::{InnerDecimalSchema, UuidSchema};
use base64::Engine as _;
use serde_json::Value as Json;

/// One type of a compiled schema.
#[derive(Debug, Clone)]
pub enum Node {
    Null,
    Boolean,
    Int,
    Long,
    Float,
    Double,
    /// Bytes, seen as base64 text.
    Bytes,
    String,
    Record(Record),
    Enum {
        name: String,
        symbols: Vec<String>,
    },
    /// Items of the node at this index.
    Array(usize),
    /// Values of the node at this index; keys are strings.
    Map(usize),
    /// The branches, by index, and which of them is `null`.
    Union {
        branches: Vec<usize>,
        null: Option<usize>,
    },
    Fixed {
        name: String,
        size: usize,
    },
    /// An exact decimal, written as bytes (`fixed: None`) or as a fixed of that size.
    Decimal {
        precision: usize,
        scale: usize,
        fixed: Option<usize>,
    },
    BigDecimal,
    /// A uuid, written as a string, 16 bytes, or a fixed(16).
    Uuid(UuidRepr),
    Date,
    TimeMillis,
    TimeMicros,
    /// An instant (`local: false`, UTC) or a local date-time, in units of 10^-digits s.
    Timestamp {
        digits: u32,
        local: bool,
    },
    /// months, days, milliseconds in a fixed(12).
    Duration,
}

/// How a uuid is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UuidRepr {
    String,
    Bytes,
    Fixed,
}

/// A record's fields in order.
#[derive(Debug, Clone)]
pub struct Record {
    pub name: String,
    pub fields: Vec<Field>,
}

/// A record's field.
#[derive(Debug, Clone)]
pub struct Field {
    /// Interned: decoded documents borrow it (see [`intern`]).
    pub name: &'static str,
    pub node: usize,
    /// The field's default, as a document value.
    pub default: Option<Json>,
}

/// A compiled schema: its nodes, the root first.
#[derive(Debug, Clone)]
pub struct Compiled {
    pub nodes: Vec<Node>,
}

/// Index of the root node.
pub const ROOT: usize = 0;

impl Compiled {
    /// Compiles a parsed schema.
    pub fn new(schema: &Schema) -> Result<Compiled, String> {
        let mut c = Compiler {
            nodes: Vec::new(),
            names: HashMap::new(),
        };
        c.node(schema, None)?;
        Ok(Compiled { nodes: c.nodes })
    }

    pub fn node(&self, index: usize) -> &Node {
        &self.nodes[index]
    }

    /// A short description of a node for messages: `long`, `record Order`, `union [null, string]`.
    pub fn describe(&self, index: usize) -> String {
        match self.node(index) {
            Node::Null => "null".into(),
            Node::Boolean => "boolean".into(),
            Node::Int => "int".into(),
            Node::Long => "long".into(),
            Node::Float => "float".into(),
            Node::Double => "double".into(),
            Node::Bytes => "bytes".into(),
            Node::String => "string".into(),
            Node::Record(r) => format!("record {}", r.name),
            Node::Enum { name, .. } => format!("enum {name}"),
            Node::Array(i) => format!("array of {}", self.describe(*i)),
            Node::Map(i) => format!("map of {}", self.describe(*i)),
            Node::Union { branches, .. } => format!(
                "union [{}]",
                branches
                    .iter()
                    .map(|b| self.describe(*b))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Node::Fixed { name, size } => format!("fixed {name}({size})"),
            Node::Decimal {
                precision, scale, ..
            } => format!("decimal({precision}, {scale})"),
            Node::BigDecimal => "big-decimal".into(),
            Node::Uuid(_) => "uuid".into(),
            Node::Date => "date".into(),
            Node::TimeMillis => "time-millis".into(),
            Node::TimeMicros => "time-micros".into(),
            Node::Timestamp { digits, local } => format!(
                "{}timestamp-{}",
                if *local { "local-" } else { "" },
                match digits {
                    3 => "millis",
                    6 => "micros",
                    _ => "nanos",
                }
            ),
            Node::Duration => "duration".into(),
        }
    }
}

/// Bytes as a decoded document holds them: base64 text (read values and defaults alike).
#[inline]
pub fn base64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// A field name as `&'static str`, so that a decoded document can borrow it whatever the
/// lifetime of the consumed bytes. Names are leaked once per compiled schema; a process
/// compiles each schema it meets once (schemas are cached by id), so this is bounded by the
/// number of distinct schemas.
fn intern(name: &str) -> &'static str {
    Box::leak(name.to_string().into_boxed_str())
}

struct Compiler {
    nodes: Vec<Node>,
    /// Named types (record, enum, fixed) by full name, for references.
    names: HashMap<String, usize>,
}

impl Compiler {
    /// Compiles `schema` into a new node and returns its index. `namespace`: the enclosing
    /// one, for references by short name.
    fn node(&mut self, schema: &Schema, namespace: Option<&str>) -> Result<usize, String> {
        let index = self.nodes.len();
        // A placeholder, so that a recursive reference to this node finds its index.
        self.nodes.push(Node::Null);
        let node = match schema {
            Schema::Null => Node::Null,
            Schema::Boolean => Node::Boolean,
            Schema::Int => Node::Int,
            Schema::Long => Node::Long,
            Schema::Float => Node::Float,
            Schema::Double => Node::Double,
            Schema::Bytes => Node::Bytes,
            Schema::String => Node::String,
            Schema::Array(a) => Node::Array(self.node(&a.items, namespace)?),
            Schema::Map(m) => Node::Map(self.node(&m.types, namespace)?),
            Schema::Union(u) => {
                let mut branches = Vec::new();
                let mut null = None;
                for (i, v) in u.variants().iter().enumerate() {
                    if matches!(v, Schema::Null) {
                        null = Some(i);
                    }
                    branches.push(self.node(v, namespace)?);
                }
                Node::Union { branches, null }
            }
            Schema::Record(r) => {
                let full = r.name.fullname(namespace);
                self.names.insert(full.clone(), index);
                let inner = r.name.namespace().or(namespace).map(str::to_string);
                let mut fields = Vec::new();
                for f in &r.fields {
                    let node = self.node(&f.schema, inner.as_deref())?;
                    fields.push(Field {
                        name: intern(&f.name),
                        node,
                        default: None,
                    });
                }
                // Defaults read once every field's node exists.
                for (field, f) in fields.iter_mut().zip(&r.fields) {
                    if let Some(d) = &f.default {
                        field.default = Some(self.default(field.node, d));
                    }
                }
                Node::Record(Record { name: full, fields })
            }
            Schema::Enum(e) => {
                let full = e.name.fullname(namespace);
                self.names.insert(full.clone(), index);
                Node::Enum {
                    name: full,
                    symbols: e.symbols.clone(),
                }
            }
            Schema::Fixed(f) => {
                let full = f.name.fullname(namespace);
                self.names.insert(full.clone(), index);
                Node::Fixed {
                    name: full,
                    size: f.size,
                }
            }
            Schema::Ref { name } => {
                // The reference itself is not a node: drop the placeholder.
                self.nodes.pop();
                let full = name.fullname(namespace);
                return self.names.get(&full).copied().ok_or_else(|| {
                    format!("the schema refers to `{full}`, which it does not define")
                });
            }
            other => logical(other)
                .ok_or_else(|| format!("an Avro type this reader does not know: {other:?}"))?,
        };
        self.nodes[index] = node;
        Ok(index)
    }

    /// A field default (JSON as the schema gives it, in Avro's JSON encoding) as the value
    /// a decoded document holds: bytes and fixed are ISO-8859-1 text there, base64 here.
    fn default(&self, node: usize, value: &Json) -> Json {
        match (&self.nodes[node], value) {
            (Node::Bytes | Node::Fixed { .. }, Json::String(s)) => {
                let bytes: Vec<u8> = s.chars().map(|c| c as u32 as u8).collect();
                Json::String(base64(&bytes))
            }
            // A union's default is of its first branch.
            (Node::Union { branches, .. }, v) => match branches.first() {
                Some(b) => self.default(*b, v),
                None => v.clone(),
            },
            (Node::Record(r), Json::Object(map)) => {
                let mut out = serde_json::Map::new();
                for f in &r.fields {
                    if let Some(v) = map.get(f.name) {
                        out.insert(f.name.to_string(), self.default(f.node, v));
                    }
                }
                Json::Object(out)
            }
            (_, v) => v.clone(),
        }
    }
}

/// The node of a logical type (decimal, uuid, date, times, timestamps, duration); `None` for
/// any other schema.
fn logical(schema: &Schema) -> Option<Node> {
    Some(match schema {
        Schema::Decimal(d) => Node::Decimal {
            precision: d.precision,
            scale: d.scale,
            fixed: match &d.inner {
                InnerDecimalSchema::Bytes => None,
                InnerDecimalSchema::Fixed(f) => Some(f.size),
            },
        },
        Schema::BigDecimal => Node::BigDecimal,
        Schema::Uuid(u) => Node::Uuid(match u {
            UuidSchema::String => UuidRepr::String,
            UuidSchema::Bytes => UuidRepr::Bytes,
            UuidSchema::Fixed(_) => UuidRepr::Fixed,
        }),
        Schema::Date => Node::Date,
        Schema::TimeMillis => Node::TimeMillis,
        Schema::TimeMicros => Node::TimeMicros,
        Schema::TimestampMillis => Node::Timestamp {
            digits: 3,
            local: false,
        },
        Schema::TimestampMicros => Node::Timestamp {
            digits: 6,
            local: false,
        },
        Schema::TimestampNanos => Node::Timestamp {
            digits: 9,
            local: false,
        },
        Schema::LocalTimestampMillis => Node::Timestamp {
            digits: 3,
            local: true,
        },
        Schema::LocalTimestampMicros => Node::Timestamp {
            digits: 6,
            local: true,
        },
        Schema::LocalTimestampNanos => Node::Timestamp {
            digits: 9,
            local: true,
        },
        Schema::Duration(_) => Node::Duration,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recursive_schema_compiles_to_indexes() {
        let schema = Schema::parse_str(
            r#"{"type":"record","name":"List","namespace":"n","fields":[
                {"name":"value","type":"long"},
                {"name":"next","type":["null","List"],"default":null}]}"#,
        )
        .unwrap();
        let c = Compiled::new(&schema).unwrap();
        let Node::Record(root) = c.node(ROOT) else {
            panic!("{:?}", c.nodes)
        };
        assert_eq!(root.name, "n.List");
        let Node::Union { branches, null } = c.node(root.fields[1].node) else {
            panic!("{:?}", c.nodes)
        };
        assert_eq!(*null, Some(0));
        assert_eq!(branches[1], ROOT);
        assert_eq!(root.fields[1].default, Some(Json::Null));
        assert_eq!(
            c.describe(root.fields[1].node),
            "union [null, record n.List]"
        );
    }
}
