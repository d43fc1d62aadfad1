//! JSON Schema in the Confluent wire format: magic byte 0, a 4-byte big-endian schema id, then
//! the value's JSON text. The value is the JSON document it is ([`crate::codec::json`]).
//!
//! * Decoding: the id must name a JSON Schema the registry knows (looked up once per id, then
//!   cached); the value is not checked against it, as Confluent's deserializers do not by
//!   default: the writer checked it.
//! * Encoding: the value is checked against the output's schema (with jsonschema, every draft
//!   from 4 to 2020-12), and a value that does not conform is a record error naming the first
//!   place it does not (`/items/0/price: -1 is less than the minimum of 0`), dead-lettered.
//!   The schema is registered (or looked up) under its subject when the job starts.

use std::sync::Arc;

use serde_json::Value as Json;

use super::json::Doc;
use super::registry::{Format, Registered, Registry, frame, split_header};
use super::{CodecError, Decoder, Encoder, Value};
use crate::record::ErrorKind;

/// The JSON Schema decoder of an input.
pub struct JsonSchemaDecoder {
    registry: Arc<Registry>,
}

impl JsonSchemaDecoder {
    pub fn new(registry: Arc<Registry>) -> JsonSchemaDecoder {
        JsonSchemaDecoder { registry }
    }
}

fn bad_json(message: String) -> CodecError {
    CodecError {
        kind: ErrorKind::BadJson,
        message,
    }
}

impl Decoder for JsonSchemaDecoder {
    fn decode<'a>(&self, bytes: Option<&'a [u8]>) -> Result<Value<'a>, CodecError> {
        let Some(bytes) = bytes else {
            return Ok(Value::Json(None));
        };
        let (id, body) = split_header(bytes).map_err(bad_json)?;
        self.registry
            .schema(id, Format::JsonSchema)
            .map_err(super::avro::lookup_error)?;
        Doc::parse(body)
            .map(|doc| Value::Json(Some(doc)))
            .map_err(|e| bad_json(format!("schema id {id}: the value is not valid JSON: {e}")))
    }
}

/// A JSON Schema given in the topology, compiled.
pub struct Compiled {
    pub registered: Registered,
    validator: jsonschema::Validator,
}

impl Compiled {
    /// Compiles `schema`; the error says what is wrong with it.
    pub fn new(schema: &Json) -> Result<Compiled, String> {
        let validator = jsonschema::validator_for(schema)
            .map_err(|e| format!("not a valid JSON Schema: {e}"))?;
        Ok(Compiled {
            registered: Registered::new(Format::JsonSchema, schema.to_string()),
            validator,
        })
    }

    /// The first place `value` does not conform, if any.
    pub fn check(&self, value: &Json) -> Result<(), String> {
        match self.validator.iter_errors(value).next() {
            None => Ok(()),
            Some(e) => {
                let at = e.instance_path().to_string();
                Err(format!("{}: {e}", if at.is_empty() { "/" } else { &at }))
            }
        }
    }
}

/// The JSON Schema encoder of an output: its schema and the id the registry gave it.
pub struct JsonSchemaEncoder {
    id: u32,
    subject: String,
    schema: Arc<Compiled>,
}

impl JsonSchemaEncoder {
    pub fn new(id: u32, subject: String, schema: Arc<Compiled>) -> JsonSchemaEncoder {
        JsonSchemaEncoder {
            id,
            subject,
            schema,
        }
    }
}

impl Encoder for JsonSchemaEncoder {
    fn encode(&self, value: &Value<'_>, size_hint: usize) -> Result<Option<Vec<u8>>, CodecError> {
        let text = match super::json::Json.encode(value, size_hint)? {
            None => return Ok(None),
            Some(text) => text,
        };
        let instance: Json = serde_json::from_slice(&text)
            .map_err(|e| bad_json(format!("the value is not valid JSON: {e}")))?;
        self.schema.check(&instance).map_err(|e| CodecError {
            kind: ErrorKind::SchemaMismatch,
            message: format!(
                "the record does not conform to the output's JSON Schema (subject `{}`, id {}): \
                 at {e}",
                self.subject, self.id
            ),
        })?;
        Ok(Some(frame(self.id, &text)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compiled() -> Arc<Compiled> {
        Arc::new(
            Compiled::new(&serde_json::json!({
                "title": "Order",
                "type": "object",
                "properties": {
                    "id": {"type": "integer"},
                    "items": {"type": "array", "items": {
                        "type": "object",
                        "properties": {"price": {"type": "number", "minimum": 0}},
                        "required": ["price"]
                    }}
                },
                "required": ["id"],
                "additionalProperties": false
            }))
            .unwrap(),
        )
    }

    #[test]
    fn a_conforming_value_is_framed_and_decodes_back() {
        let registry = Arc::new(Registry::offline());
        let schema = compiled();
        registry.add_registered(9, schema.registered.clone());
        let e = JsonSchemaEncoder::new(9, "orders-value".into(), schema);
        let text = br#"{"id":1,"items":[{"price":2.5}]}"#;
        let doc = Doc::parse(text).unwrap();
        let bytes = e.encode(&Value::Json(Some(doc)), 0).unwrap().unwrap();
        assert_eq!(&bytes[..5], &[0, 0, 0, 0, 9]);
        assert_eq!(&bytes[5..], text);
        let back = JsonSchemaDecoder::new(registry)
            .decode(Some(&bytes))
            .unwrap();
        let Value::Json(Some(doc)) = back else {
            panic!("not a document")
        };
        assert_eq!(doc.to_json(), serde_json::from_slice::<Json>(text).unwrap());
    }

    #[test]
    fn a_value_that_does_not_conform_is_a_schema_mismatch_at_its_path() {
        let e = JsonSchemaEncoder::new(9, "orders-value".into(), compiled());
        let doc = Doc::parse(br#"{"id":1,"items":[{"price":2},{"price":-1}]}"#).unwrap();
        let err = e.encode(&Value::Json(Some(doc)), 0).unwrap_err();
        assert_eq!(err.kind, ErrorKind::SchemaMismatch);
        assert!(err.message.contains("at /items/1/price: -1"), "{err}");
        let doc = Doc::parse(br#"{"id":1,"extra":true}"#).unwrap();
        let err = e.encode(&Value::Json(Some(doc)), 0).unwrap_err();
        assert!(err.message.contains("extra"), "{err}");
        let doc = Doc::parse(br#"{"items":[]}"#).unwrap();
        let err = e.encode(&Value::Json(Some(doc)), 0).unwrap_err();
        assert!(err.message.contains("at /: \"id\" is a required"), "{err}");
    }

    #[test]
    fn bad_input_is_a_record_error_of_its_kind() {
        let registry = Arc::new(Registry::offline());
        registry.add_registered(9, compiled().registered.clone());
        registry.add_registered(
            10,
            Registered::new(Format::Protobuf, "syntax = \"proto3\";"),
        );
        let d = JsonSchemaDecoder::new(registry);
        let err = |bytes: &[u8]| d.decode(Some(bytes)).unwrap_err();
        assert_eq!(err(b"{\"id\":1}").kind, ErrorKind::BadJson);
        assert!(err(b"{\"id\":1}").message.contains("magic byte"));
        assert_eq!(err(&[0, 0, 0]).kind, ErrorKind::BadJson);
        let unknown = err(&[0, 0, 0, 0, 8, b'1']);
        assert_eq!(unknown.kind, ErrorKind::UnknownSchema);
        let other = err(&[0, 0, 0, 0, 10, b'1']);
        assert_eq!(other.kind, ErrorKind::UnknownSchema);
        assert!(
            other.message.contains("PROTOBUF schema, not JSON"),
            "{other}"
        );
        let truncated = err(&[0, 0, 0, 0, 9, b'{', b'"']);
        assert_eq!(truncated.kind, ErrorKind::BadJson);
        assert!(truncated.message.contains("schema id 9"), "{truncated}");
        assert!(matches!(d.decode(None), Ok(Value::Json(None))));
    }
}
