//! Protobuf messages as documents and back, by protobuf's JSON mapping as prost-reflect
//! implements it, with the settings an expression wants: `.proto` field names, every field
//! present, 64-bit integers as numbers (CEL's `int` and `uint`), enums by name.
//!
//! The top-level fields keep the message's field order (a serde map is sorted): they are
//! collected by [`Fields`], a serializer that takes the message's map entry by entry.

use std::borrow::Cow;

use prost_reflect::{DeserializeOptions, DynamicMessage, MessageDescriptor, SerializeOptions};
use serde::Serialize;
use serde::ser::{Impossible, SerializeMap};
use serde_json::Value as Json;

use crate::codec::json::{Doc, Field};

fn options() -> SerializeOptions {
    SerializeOptions::new()
        .stringify_64_bit_integers(false)
        .use_proto_field_name(true)
        .skip_default_fields(false)
}

/// `message` as a document.
pub fn to_doc(message: &DynamicMessage) -> Result<Doc<'static>, String> {
    match message.serialize_with_options(Fields, &options()) {
        Ok(doc) => Ok(doc),
        // A message that is not a JSON object (a well-known type at the root, such as a
        // Timestamp): its own value.
        Err(NotAnObject) => serde_json::to_value(Root(message))
            .map(Doc::Other)
            .map_err(|e| e.to_string()),
    }
}

/// `message`'s value in the mapping (a well-known type's own value, such as a timestamp's text).
pub fn value_of(message: &DynamicMessage) -> Result<Json, String> {
    serde_json::to_value(Root(message)).map_err(|e| e.to_string())
}

/// `doc` as a message of type `descriptor`; the error names the field at fault.
pub fn from_doc(
    descriptor: &MessageDescriptor,
    doc: &Doc<'_>,
    size_hint: usize,
) -> Result<DynamicMessage, String> {
    let mut text = Vec::with_capacity(size_hint + 64);
    doc.encode(&mut text).map_err(|e| e.to_string())?;
    let mut de = serde_json::Deserializer::from_slice(&text);
    let message = DynamicMessage::deserialize_with_options(
        descriptor.clone(),
        &mut de,
        &DeserializeOptions::new(),
    )
    .map_err(|e| e.to_string())?;
    de.end().map_err(|e| e.to_string())?;
    Ok(message)
}

/// The message serialized with [`options`].
struct Root<'a>(&'a DynamicMessage);

impl Serialize for Root<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize_with_options(s, &options())
    }
}

/// What [`Fields`] refuses: anything but a map at the root.
#[derive(Debug)]
struct NotAnObject;

impl std::fmt::Display for NotAnObject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("not an object")
    }
}

impl std::error::Error for NotAnObject {}

impl serde::ser::Error for NotAnObject {
    fn custom<T: std::fmt::Display>(_: T) -> Self {
        NotAnObject
    }
}

/// A serializer that takes a map into a document's fields, in order.
struct Fields;

/// The fields collected so far, and the key of the one being taken.
struct Collect {
    fields: Vec<(Cow<'static, str>, Field<'static>)>,
    key: Option<String>,
}

impl SerializeMap for Collect {
    type Ok = Doc<'static>;
    type Error = NotAnObject;

    fn serialize_key<T: ?Sized + Serialize>(&mut self, key: &T) -> Result<(), NotAnObject> {
        match serde_json::to_value(key) {
            Ok(Json::String(k)) => {
                self.key = Some(k);
                Ok(())
            }
            _ => Err(NotAnObject),
        }
    }

    fn serialize_value<T: ?Sized + Serialize>(&mut self, value: &T) -> Result<(), NotAnObject> {
        let key = self.key.take().ok_or(NotAnObject)?;
        let value = serde_json::to_value(value).map_err(|_| NotAnObject)?;
        self.fields.push((Cow::Owned(key), Field::Value(value)));
        Ok(())
    }

    fn end(self) -> Result<Doc<'static>, NotAnObject> {
        Ok(Doc::Object(self.fields))
    }
}

macro_rules! refuse {
    ($($name:ident($($t:ty),*) -> $ret:ty;)*) => {
        $(fn $name(self, $(_: $t),*) -> Result<$ret, NotAnObject> { Err(NotAnObject) })*
    };
}

impl serde::Serializer for Fields {
    type Ok = Doc<'static>;
    type Error = NotAnObject;
    type SerializeSeq = Impossible<Doc<'static>, NotAnObject>;
    type SerializeTuple = Impossible<Doc<'static>, NotAnObject>;
    type SerializeTupleStruct = Impossible<Doc<'static>, NotAnObject>;
    type SerializeTupleVariant = Impossible<Doc<'static>, NotAnObject>;
    type SerializeMap = Collect;
    type SerializeStruct = Impossible<Doc<'static>, NotAnObject>;
    type SerializeStructVariant = Impossible<Doc<'static>, NotAnObject>;

    fn serialize_map(self, len: Option<usize>) -> Result<Collect, NotAnObject> {
        Ok(Collect {
            fields: Vec::with_capacity(len.unwrap_or(16)),
            key: None,
        })
    }

    refuse! {
        serialize_bool(bool) -> Self::Ok;
        serialize_i8(i8) -> Self::Ok;
        serialize_i16(i16) -> Self::Ok;
        serialize_i32(i32) -> Self::Ok;
        serialize_i64(i64) -> Self::Ok;
        serialize_u8(u8) -> Self::Ok;
        serialize_u16(u16) -> Self::Ok;
        serialize_u32(u32) -> Self::Ok;
        serialize_u64(u64) -> Self::Ok;
        serialize_f32(f32) -> Self::Ok;
        serialize_f64(f64) -> Self::Ok;
        serialize_char(char) -> Self::Ok;
        serialize_str(&str) -> Self::Ok;
        serialize_bytes(&[u8]) -> Self::Ok;
        serialize_none() -> Self::Ok;
        serialize_unit() -> Self::Ok;
        serialize_unit_struct(&'static str) -> Self::Ok;
        serialize_unit_variant(&'static str, u32, &'static str) -> Self::Ok;
        serialize_seq(Option<usize>) -> Self::SerializeSeq;
        serialize_tuple(usize) -> Self::SerializeTuple;
        serialize_tuple_struct(&'static str, usize) -> Self::SerializeTupleStruct;
        serialize_tuple_variant(&'static str, u32, &'static str, usize) -> Self::SerializeTupleVariant;
        serialize_struct(&'static str, usize) -> Self::SerializeStruct;
        serialize_struct_variant(&'static str, u32, &'static str, usize) -> Self::SerializeStructVariant;
    }

    fn serialize_some<T: ?Sized + Serialize>(self, _: &T) -> Result<Doc<'static>, NotAnObject> {
        Err(NotAnObject)
    }

    fn serialize_newtype_struct<T: ?Sized + Serialize>(
        self,
        _: &'static str,
        _: &T,
    ) -> Result<Doc<'static>, NotAnObject> {
        Err(NotAnObject)
    }

    fn serialize_newtype_variant<T: ?Sized + Serialize>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<Doc<'static>, NotAnObject> {
        Err(NotAnObject)
    }
}
