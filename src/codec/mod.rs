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

pub mod json;
pub mod raw;

use crate::record::ErrorKind;
use crate::topology::Codec;
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

/// The decoder of a codec named in a topology.
pub fn decoder(codec: Codec) -> Box<dyn Decoder> {
    match codec {
        Codec::Raw => Box::new(raw::Raw),
        Codec::Json => Box::new(json::Json),
    }
}

/// The encoder of a codec named in a topology.
pub fn encoder(codec: Codec) -> Box<dyn Encoder> {
    match codec {
        Codec::Raw => Box::new(raw::Raw),
        Codec::Json => Box::new(json::Json),
    }
}
