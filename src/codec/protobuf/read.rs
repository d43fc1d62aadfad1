//! Protobuf's wire format to the documents expressions see, walking a compiled [`Table`]: the
//! same document prost-reflect's dynamic message and its JSON mapping give ([`super::doc`]),
//! without either for all but the rarer well-known types (`Any`, `Struct`, `Value`,
//! `ListValue`, `FieldMask`, `Empty`, handed to prost-reflect).
//!
//! It accepts and refuses what prost-reflect does: wire types checked per field (a packed or
//! unpacked list alike), varints of at most 10 bytes, strings valid UTF-8, unknown fields
//! skipped (groups too), nesting at most 100 messages deep, and the merge rules: the last
//! value of a scalar wins, a message given twice is merged (read as its parts one after the
//! other), a oneof member clears the others. Every read is bounds-checked.

use std::borrow::Cow;
use std::collections::BTreeMap;

use prost_reflect::prost::Message as _;
use prost_reflect::{DynamicMessage, prost_types};
use serde_json::{Map, Value as Json};

use super::doc;
use super::table::{
    END_GROUP, FIXED32, FIXED64, Field, Kind, LEN, Message, START_GROUP, Shape, Table, VARINT,
    WellKnown,
};
use crate::codec::json::{Doc, Field as DocField};

/// prost's recursion limit: messages nested deeper than this are refused.
const RECURSION_LIMIT: u32 = 100;

// The ranges prost-reflect's JSON mapping accepts.
const MAX_DURATION_SECONDS: u64 = 315_576_000_000;
const MAX_DURATION_NANOS: u32 = 999_999_999;
const MIN_TIMESTAMP_SECONDS: i64 = -62_135_596_800;
const MAX_TIMESTAMP_SECONDS: i64 = 253_402_300_799;

type R<T> = Result<T, String>;

/// `bytes`, a message of the table's root, as a document.
pub fn decode<'a>(table: &Table, bytes: &[u8]) -> R<Doc<'a>> {
    let root = &table.messages[0];
    let reader = Reader {
        table,
        render: true,
    };
    let slots = reader.fields(root, bytes, RECURSION_LIMIT)?;
    let mut fields = Vec::with_capacity(root.fields.len());
    for (f, slot) in root.fields.iter().zip(slots) {
        if let Some(v) = reader.finish(f, slot, RECURSION_LIMIT)? {
            fields.push((Cow::Borrowed(f.name), DocField::Value(v)));
        }
    }
    Ok(Doc::Object(fields))
}

/// What a field has been given so far.
enum Slot<'b> {
    Unset,
    Value(Json),
    /// A message's parts, merged by reading them one after the other.
    Parts(Vec<&'b [u8]>),
    List(Vec<Json>),
    Map(Map<String, Json>),
    /// A map of messages: each key's value as its parts, read when the message is done (a
    /// value a later entry replaces is only checked, as prost-reflect does).
    MessageMap(BTreeMap<String, Vec<&'b [u8]>>),
}

/// A map entry's value: read, or a message's parts.
enum EntryValue<'b> {
    Value(Json),
    Parts(Vec<&'b [u8]>),
}

struct Reader<'t> {
    table: &'t Table,
    /// False to only check that messages decode, as prost-reflect checks a message it then
    /// drops (a oneof member another one replaces): well-known types are not rendered (a
    /// timestamp out of the mapping's range is no error there), the result is `null`.
    render: bool,
}

/// A varint of at most 10 bytes, as prost reads one.
#[inline]
fn varint(buf: &mut &[u8]) -> R<u64> {
    let mut value: u64 = 0;
    for i in 0..10 {
        let Some((&b, rest)) = buf.split_first() else {
            return Err("invalid varint (truncated)".into());
        };
        *buf = rest;
        value |= u64::from(b & 0x7f) << (7 * i);
        if b < 0x80 {
            if i == 9 && b >= 2 {
                break;
            }
            return Ok(value);
        }
    }
    Err("invalid varint".into())
}

fn take<'b>(buf: &mut &'b [u8], n: usize) -> R<&'b [u8]> {
    if buf.len() < n {
        return Err(format!(
            "buffer underflow: {n} byte(s) needed, {} left",
            buf.len()
        ));
    }
    let (head, rest) = buf.split_at(n);
    *buf = rest;
    Ok(head)
}

/// A length-delimited value.
fn delimited<'b>(buf: &mut &'b [u8]) -> R<&'b [u8]> {
    let len = varint(buf)?;
    if len > buf.len() as u64 {
        return Err(format!(
            "buffer underflow: {len} byte(s) needed, {} left",
            buf.len()
        ));
    }
    take(buf, len as usize)
}

/// A field's number and wire type.
fn key(buf: &mut &[u8]) -> R<(u32, u8)> {
    let key = varint(buf)?;
    let key = u32::try_from(key).map_err(|_| format!("invalid key value: {key}"))?;
    let wire = (key & 7) as u8;
    if wire > 5 {
        return Err(format!("invalid wire type value: {wire}"));
    }
    let number = key >> 3;
    if number == 0 {
        return Err("invalid tag value: 0".into());
    }
    Ok((number, wire))
}

fn check(expected: u8, actual: u8) -> R<()> {
    if expected == actual {
        Ok(())
    } else {
        Err(format!("invalid wire type: {actual} (expected {expected})"))
    }
}

/// Skips an unknown field (a group with what it holds).
fn skip(number: u32, wire: u8, buf: &mut &[u8], depth: u32) -> R<()> {
    match wire {
        VARINT => varint(buf).map(|_| ()),
        FIXED64 => take(buf, 8).map(|_| ()),
        FIXED32 => take(buf, 4).map(|_| ()),
        LEN => delimited(buf).map(|_| ()),
        START_GROUP => {
            if depth == 0 {
                return Err("recursion limit reached".into());
            }
            loop {
                let (n, w) = key(buf)?;
                if w == END_GROUP {
                    if n != number {
                        return Err("unexpected end group tag".into());
                    }
                    return Ok(());
                }
                skip(n, w, buf, depth - 1)?;
            }
        }
        _ => Err("unexpected end group tag".into()),
    }
}

/// A float as the JSON mapping writes it: a number, or `NaN`, `Infinity`, `-Infinity`.
fn float(v: f64, json: Json) -> Json {
    if v.is_finite() {
        json
    } else if v.is_nan() {
        Json::String("NaN".into())
    } else if v > 0.0 {
        Json::String("Infinity".into())
    } else {
        Json::String("-Infinity".into())
    }
}

fn base64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

impl Reader<'_> {
    /// One scalar (or enum) of `kind` sent with wire type `wire`.
    fn scalar(&self, kind: Kind, wire: u8, buf: &mut &[u8]) -> R<Json> {
        check(kind.wire_type(), wire)?;
        Ok(match kind {
            Kind::Int32 => Json::from(varint(buf)? as i32),
            Kind::Int64 => Json::from(varint(buf)? as i64),
            Kind::Uint32 => Json::from(varint(buf)? as u32),
            Kind::Uint64 => Json::from(varint(buf)?),
            Kind::Sint32 => {
                let v = varint(buf)? as u32;
                Json::from(((v >> 1) as i32) ^ -((v & 1) as i32))
            }
            Kind::Sint64 => {
                let v = varint(buf)?;
                Json::from(((v >> 1) as i64) ^ -((v & 1) as i64))
            }
            Kind::Bool => Json::Bool(varint(buf)? != 0),
            Kind::Enum(e) => self.enum_value(e, varint(buf)? as i32),
            Kind::Fixed32 => Json::from(u32::from_le_bytes(four(buf)?)),
            Kind::Sfixed32 => Json::from(i32::from_le_bytes(four(buf)?)),
            Kind::Float => {
                let v = f32::from_le_bytes(four(buf)?);
                float(f64::from(v), Json::from(v))
            }
            Kind::Fixed64 => Json::from(u64::from_le_bytes(eight(buf)?)),
            Kind::Sfixed64 => Json::from(i64::from_le_bytes(eight(buf)?)),
            Kind::Double => {
                let v = f64::from_le_bytes(eight(buf)?);
                float(v, Json::from(v))
            }
            Kind::String => {
                let bytes = delimited(buf)?;
                let text = std::str::from_utf8(bytes)
                    .map_err(|_| "invalid string value: data is not UTF-8 encoded")?;
                Json::String(text.to_string())
            }
            Kind::Bytes => Json::String(base64(delimited(buf)?)),
            Kind::Message(_) => return Err("a message is not a scalar".into()),
        })
    }

    fn enum_value(&self, e: usize, number: i32) -> Json {
        let e = &self.table.enums[e];
        if e.null_value {
            return Json::Null;
        }
        match e.name(number) {
            Some(name) => Json::String(name.to_string()),
            None => Json::from(number),
        }
    }

    /// The fields of message `m` in `bytes`, one slot per field of the table.
    fn fields<'b>(&self, m: &Message, mut bytes: &'b [u8], depth: u32) -> R<Vec<Slot<'b>>> {
        let mut slots: Vec<Slot<'b>> = Vec::with_capacity(m.fields.len());
        slots.resize_with(m.fields.len(), || Slot::Unset);
        let buf = &mut bytes;
        while !buf.is_empty() {
            let (number, wire) = key(buf)?;
            let Some(i) = m.field(number) else {
                skip(number, wire, buf, depth)?;
                continue;
            };
            let f = &m.fields[i];
            if let Some(o) = f.oneof {
                for &j in &m.oneofs[o] {
                    if j != i {
                        let old = std::mem::replace(&mut slots[j], Slot::Unset);
                        if let (Slot::Parts(parts), Kind::Message(sub)) = (old, m.fields[j].kind) {
                            self.check_only().message(sub, &parts, depth)?;
                        }
                    }
                }
            }
            self.field(f, wire, buf, &mut slots[i], depth)
                .map_err(|e| format!("{}: {e}", f.name))?;
        }
        Ok(slots)
    }

    /// One occurrence of field `f` into its slot.
    fn field<'b>(
        &self,
        f: &Field,
        wire: u8,
        buf: &mut &'b [u8],
        slot: &mut Slot<'b>,
        depth: u32,
    ) -> R<()> {
        match f.shape {
            Shape::Single => match f.kind {
                Kind::Message(_) => {
                    check(LEN, wire)?;
                    let part = delimited(buf)?;
                    match slot {
                        Slot::Parts(parts) => parts.push(part),
                        _ => *slot = Slot::Parts(vec![part]),
                    }
                }
                kind => *slot = Slot::Value(self.scalar(kind, wire, buf)?),
            },
            Shape::List => {
                let mut list = match std::mem::replace(slot, Slot::Unset) {
                    Slot::List(list) => list,
                    _ => Vec::new(),
                };
                match f.kind {
                    Kind::Message(m) => {
                        check(LEN, wire)?;
                        let part = delimited(buf)?;
                        list.push(self.message(m, &[part], depth)?);
                    }
                    kind if wire == LEN && kind.packable() => {
                        let mut packed = delimited(buf)?;
                        while !packed.is_empty() {
                            list.push(self.scalar(kind, kind.wire_type(), &mut packed)?);
                        }
                    }
                    kind => list.push(self.scalar(kind, wire, buf)?),
                }
                *slot = Slot::List(list);
            }
            Shape::Map { key, value } => {
                // As prost-reflect does, the entry is read as length-delimited whatever its
                // wire type.
                let entry = delimited(buf)?;
                match self.entry(key, value, entry, depth)? {
                    (k, EntryValue::Value(v)) => {
                        let mut map = match std::mem::replace(slot, Slot::Unset) {
                            Slot::Map(map) => map,
                            _ => Map::new(),
                        };
                        map.insert(k, v);
                        *slot = Slot::Map(map);
                    }
                    (k, EntryValue::Parts(parts)) => {
                        let mut map = match std::mem::replace(slot, Slot::Unset) {
                            Slot::MessageMap(map) => map,
                            _ => BTreeMap::new(),
                        };
                        map.insert(k, parts);
                        *slot = Slot::MessageMap(map);
                    }
                }
            }
        }
        Ok(())
    }

    /// A map's entry: its key as text and its value (their defaults when absent).
    fn entry<'b>(
        &self,
        key_kind: Kind,
        value_kind: Kind,
        mut bytes: &'b [u8],
        depth: u32,
    ) -> R<(String, EntryValue<'b>)> {
        let buf = &mut bytes;
        let mut k: Option<Json> = None;
        let mut v: Option<Json> = None;
        let mut parts: Vec<&'b [u8]> = Vec::new();
        while !buf.is_empty() {
            let (number, wire) = key(buf)?;
            match number {
                1 => k = Some(self.scalar(key_kind, wire, buf)?),
                2 => match value_kind {
                    Kind::Message(_) => {
                        check(LEN, wire)?;
                        parts.push(delimited(buf)?);
                    }
                    kind => v = Some(self.scalar(kind, wire, buf)?),
                },
                _ => {
                    if depth == 0 {
                        return Err("recursion limit reached".into());
                    }
                    skip(number, wire, buf, depth)?;
                }
            }
        }
        let k = match k {
            Some(Json::String(s)) => s,
            Some(Json::Bool(b)) => b.to_string(),
            Some(Json::Number(n)) => n.to_string(),
            Some(_) => return Err("a map key that is not a scalar".into()),
            None => match key_kind {
                Kind::String => String::new(),
                Kind::Bool => "false".into(),
                _ => "0".into(),
            },
        };
        let v = match (value_kind, v) {
            (Kind::Message(m), _) => {
                self.check_only().message(m, &parts, depth)?;
                return Ok((k, EntryValue::Parts(parts)));
            }
            (_, Some(v)) => v,
            (Kind::Enum(e), None) => self.enum_value(e, self.table.enums[e].first),
            (kind, None) => default_scalar(kind),
        };
        Ok((k, EntryValue::Value(v)))
    }

    fn check_only(&self) -> Reader<'_> {
        Reader {
            table: self.table,
            render: false,
        }
    }

    /// A message field's value from its parts, at `depth` (the recursion left).
    fn message(&self, m: usize, parts: &[&[u8]], depth: u32) -> R<Json> {
        if depth == 0 {
            return Err("recursion limit reached".into());
        }
        let joined;
        let bytes: &[u8] = match parts {
            [] => &[],
            [one] => one,
            _ => {
                // Each part must decode on its own (prost-reflect merges them one by one);
                // then they read as one.
                for part in parts {
                    self.check_only().message(m, &[part], depth)?;
                }
                joined = parts.concat();
                &joined
            }
        };
        let message = &self.table.messages[m];
        if let Some(wk) = message.well_known {
            return well_known(message, wk, bytes, self.render);
        }
        let slots = self.fields(message, bytes, depth - 1)?;
        if !self.render {
            for (f, slot) in message.fields.iter().zip(slots) {
                if let (Slot::Parts(parts), Kind::Message(sub)) = (slot, f.kind) {
                    self.message(sub, &parts, depth - 1)?;
                }
            }
            return Ok(Json::Null);
        }
        let mut map = Map::new();
        for (f, slot) in message.fields.iter().zip(slots) {
            if let Some(v) = self.finish(f, slot, depth - 1)? {
                map.insert(f.name.to_string(), v);
            }
        }
        Ok(Json::Object(map))
    }

    /// A field's value in the document, `None` when it is left out.
    fn finish(&self, f: &Field, slot: Slot<'_>, depth: u32) -> R<Option<Json>> {
        Ok(match slot {
            Slot::Unset if f.presence => None,
            Slot::Unset => Some(f.default.clone()),
            Slot::Value(v) => Some(v),
            Slot::Parts(parts) => match f.kind {
                Kind::Message(m) => Some(
                    self.message(m, &parts, depth)
                        .map_err(|e| format!("{}: {e}", f.name))?,
                ),
                _ => return Err(format!("{}: parts of a scalar", f.name)),
            },
            Slot::List(list) => Some(Json::Array(list)),
            Slot::Map(map) => Some(Json::Object(map)),
            Slot::MessageMap(map) => {
                let Shape::Map {
                    value: Kind::Message(m),
                    ..
                } = f.shape
                else {
                    return Err(format!("{}: a map of messages that is not one", f.name));
                };
                let mut out = Map::new();
                for (k, parts) in map {
                    let v = self
                        .message(m, &parts, depth)
                        .map_err(|e| format!("{}: {e}", f.name))?;
                    out.insert(k, v);
                }
                Some(Json::Object(out))
            }
        })
    }
}

fn four(buf: &mut &[u8]) -> R<[u8; 4]> {
    let b = take(buf, 4)?;
    Ok([b[0], b[1], b[2], b[3]])
}

fn eight(buf: &mut &[u8]) -> R<[u8; 8]> {
    let b = take(buf, 8)?;
    Ok([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
}

/// A scalar's default in a map's entry.
fn default_scalar(kind: Kind) -> Json {
    match kind {
        Kind::Bool => Json::Bool(false),
        Kind::String | Kind::Bytes => Json::String(String::new()),
        Kind::Float | Kind::Double => Json::from(0.0),
        _ => Json::from(0),
    }
}

/// A well-known type's value, as prost-reflect's JSON mapping writes it.
fn well_known(message: &Message, wk: WellKnown, bytes: &[u8], render: bool) -> R<Json> {
    let e = |e: prost_reflect::prost::DecodeError| e.to_string();
    if !render {
        return match wk {
            WellKnown::Timestamp => prost_types::Timestamp::decode(bytes).map(|_| Json::Null),
            WellKnown::Duration => prost_types::Duration::decode(bytes).map(|_| Json::Null),
            _ => DynamicMessage::decode(message.descriptor.clone(), bytes).map(|_| Json::Null),
        }
        .map_err(e);
    }
    Ok(match wk {
        WellKnown::Timestamp => {
            let t = prost_types::Timestamp::decode(bytes).map_err(e)?;
            if !(MIN_TIMESTAMP_SECONDS..=MAX_TIMESTAMP_SECONDS).contains(&t.seconds) {
                return Err("timestamp out of range".into());
            }
            Json::String(t.to_string())
        }
        WellKnown::Duration => {
            let d = prost_types::Duration::decode(bytes).map_err(e)?;
            if d.seconds.unsigned_abs() > MAX_DURATION_SECONDS
                || d.nanos.unsigned_abs() > MAX_DURATION_NANOS
            {
                return Err("duration out of range".into());
            }
            Json::String(d.to_string())
        }
        WellKnown::Wrapper(kind) => match kind {
            Kind::Double => Json::from(f64::decode(bytes).map_err(e)?),
            Kind::Float => Json::from(f32::decode(bytes).map_err(e)?),
            Kind::Int64 => Json::from(i64::decode(bytes).map_err(e)?),
            Kind::Uint64 => Json::from(u64::decode(bytes).map_err(e)?),
            Kind::Int32 => Json::from(i32::decode(bytes).map_err(e)?),
            Kind::Uint32 => Json::from(u32::decode(bytes).map_err(e)?),
            Kind::Bool => Json::Bool(bool::decode(bytes).map_err(e)?),
            Kind::String => Json::String(String::decode(bytes).map_err(e)?),
            _ => Json::String(base64(&Vec::<u8>::decode(bytes).map_err(e)?)),
        },
        WellKnown::Other => {
            let m = DynamicMessage::decode(message.descriptor.clone(), bytes).map_err(e)?;
            doc::value_of(&m)?
        }
    })
}
