//! Bytes as they are. Expressions see the value as `bytes`.

use super::json::Doc;
use super::{CodecError, Decoder, Encoder, Value};

/// The raw codec.
#[derive(Debug, Clone, Copy, Default)]
pub struct Raw;

impl Decoder for Raw {
    fn decode<'a>(&self, bytes: Option<&'a [u8]>) -> Result<Value<'a>, CodecError> {
        Ok(Value::Raw(bytes))
    }
}

impl Encoder for Raw {
    fn encode(&self, value: &Value<'_>, size_hint: usize) -> Result<Option<Vec<u8>>, CodecError> {
        match value {
            Value::Raw(v) => Ok(v.map(<[u8]>::to_vec)),
            // A JSON string written raw is its text, without quotes.
            Value::Json(Some(Doc::Other(serde_json::Value::String(s)))) => {
                Ok(Some(s.as_bytes().to_vec()))
            }
            Value::Json(None) => Ok(None),
            Value::Json(Some(doc)) => super::json::encode_doc(doc, size_hint),
        }
    }
}

impl Raw {
    #[cfg(test)]
    fn roundtrip(bytes: &[u8]) -> Option<Vec<u8>> {
        let value = Raw.decode(Some(bytes)).ok()?;
        Raw.encode(&value, bytes.len()).ok()?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_bytes_pass_through_verbatim() {
        assert_eq!(
            Raw::roundtrip(b"\x00\xffnot json"),
            Some(b"\x00\xffnot json".to_vec())
        );
        assert_eq!(Raw.encode(&Value::Raw(None), 0), Ok(None));
    }

    #[test]
    fn json_values_written_raw_are_their_text_or_their_encoding() {
        let s = Doc::parse(br#""plain text""#).unwrap();
        assert_eq!(
            Raw.encode(&Value::Json(Some(s)), 0),
            Ok(Some(b"plain text".to_vec()))
        );
        let o = Doc::parse(br#"{"a":1}"#).unwrap();
        assert_eq!(
            Raw.encode(&Value::Json(Some(o)), 0),
            Ok(Some(br#"{"a":1}"#.to_vec()))
        );
    }
}
