//! JSON values: a document decoded lazily ([`Doc`]), validated in one pass by [`scan`].

pub mod doc;
pub mod scan;

pub use doc::{Doc, Field, type_name};

use super::{CodecError, Decoder, Encoder, Value};
use crate::record::ErrorKind;

/// The JSON codec.
#[derive(Debug, Clone, Copy, Default)]
pub struct Json;

impl Decoder for Json {
    fn decode<'a>(&self, bytes: Option<&'a [u8]>) -> Result<Value<'a>, CodecError> {
        match bytes {
            None => Ok(Value::Json(None)),
            Some(bytes) => Doc::parse(bytes)
                .map(|doc| Value::Json(Some(doc)))
                .map_err(|e| CodecError {
                    kind: ErrorKind::BadJson,
                    message: format!("the value is not valid JSON: {e}"),
                }),
        }
    }
}

impl Encoder for Json {
    fn encode(&self, value: &Value<'_>, size_hint: usize) -> Result<Option<Vec<u8>>, CodecError> {
        match value {
            Value::Json(None) => Ok(None),
            Value::Json(Some(doc)) => encode_doc(doc, size_hint),
            // Raw bytes written as JSON must be JSON already.
            Value::Raw(v) => {
                if let Some(bytes) = v {
                    serde_json::from_slice::<serde::de::IgnoredAny>(bytes).map_err(|e| {
                        CodecError {
                            kind: ErrorKind::BadJson,
                            message: format!("the value is not valid JSON: {e}"),
                        }
                    })?;
                }
                Ok(v.map(<[u8]>::to_vec))
            }
        }
    }
}

/// The JSON text of a document.
pub(super) fn encode_doc(doc: &Doc<'_>, size_hint: usize) -> Result<Option<Vec<u8>>, CodecError> {
    // Usually about the size it was consumed with: one allocation.
    let mut bytes = Vec::with_capacity(size_hint + 64);
    doc.encode(&mut bytes).map_err(|e| CodecError {
        kind: ErrorKind::WrongType,
        message: format!("cannot encode the value: {e}"),
    })?;
    Ok(Some(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_document_decodes_and_encodes_back() {
        let text = br#"{"id":1,"name":"a"}"#;
        let value = Json.decode(Some(text)).unwrap();
        assert_eq!(Json.encode(&value, text.len()), Ok(Some(text.to_vec())));
        assert!(matches!(Json.decode(None), Ok(Value::Json(None))));
    }

    #[test]
    fn invalid_json_is_a_bad_json_error_both_ways() {
        let err = Json.decode(Some(b"{not json")).unwrap_err();
        assert_eq!(err.kind, ErrorKind::BadJson);
        assert!(
            err.message.starts_with("the value is not valid JSON"),
            "{err}"
        );
        let err = Json.encode(&Value::Raw(Some(b"{not json")), 0).unwrap_err();
        assert_eq!(err.kind, ErrorKind::BadJson);
        assert_eq!(
            Json.encode(&Value::Raw(Some(b"[1]")), 0),
            Ok(Some(b"[1]".to_vec()))
        );
    }
}
