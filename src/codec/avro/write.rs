//! Documents to Avro binary, walking a [`Compiled`] schema: the inverse of [`super::read`],
//! accepting what it produces and the plain forms a JSON input would carry (a timestamp as
//! RFC 3339 text or as a number in the type's unit, a decimal as text or a number, a date as
//! text or days). A value that does not fit is an error naming the field path and what was
//! expected, so a record that does not match the output schema is dead-lettered with it.

use base64::Engine as _;
use chrono::{DateTime, NaiveDate, NaiveDateTime, NaiveTime, Timelike};
use num_bigint::BigInt;
use serde_json::Value as Json;

use super::read::MAX_DEPTH;
use super::schema::{Compiled, Node, ROOT, Record, UuidRepr};
use crate::codec::json::{Doc, Field, type_name};

/// Appends the Avro binary of `doc` to `out`.
pub fn encode(schema: &Compiled, doc: &Doc<'_>, out: &mut Vec<u8>) -> Result<(), String> {
    let w = Writer { schema };
    match (schema.node(ROOT), doc) {
        (Node::Record(record), Doc::Object(fields)) => w
            .record(
                record,
                out,
                1,
                |name, i| {
                    // A decoded Avro record has its fields in schema order: look there first.
                    match fields.get(i) {
                        Some((k, f)) if k.as_ref() == name => Some(field_value(f)),
                        _ => fields
                            .iter()
                            .find(|(k, _)| k.as_ref() == name)
                            .map(|(_, f)| field_value(f)),
                    }
                },
                fields.iter().map(|(k, _)| k.as_ref()),
            )
            .map_err(WriteError::finish),
        (_, Doc::Other(v)) => w.value(ROOT, v, out, 0).map_err(WriteError::finish),
        (_, Doc::Object(_)) => {
            let v = doc.to_json();
            w.value(ROOT, &v, out, 0).map_err(WriteError::finish)
        }
    }
}

/// A field's value as a document value (decoding it if it is still text).
fn field_value<'f>(f: &'f Field<'_>) -> std::borrow::Cow<'f, Json> {
    match f {
        Field::Value(v) => std::borrow::Cow::Borrowed(v),
        other => std::borrow::Cow::Owned(other.to_json()),
    }
}

/// An error and the path it happened at, built from the inside out.
#[derive(Debug)]
struct WriteError {
    message: String,
    path: Vec<String>,
}

impl WriteError {
    fn new(message: impl Into<String>) -> WriteError {
        WriteError {
            message: message.into(),
            path: Vec::new(),
        }
    }

    fn inside(mut self, part: impl Into<String>) -> WriteError {
        self.path.push(part.into());
        self
    }

    fn finish(mut self) -> String {
        if self.path.is_empty() {
            return self.message;
        }
        self.path.reverse();
        let mut path = String::new();
        for p in &self.path {
            if !p.starts_with('[') && !path.is_empty() {
                path.push('.');
            }
            path.push_str(p);
        }
        format!("at `{path}`: {}", self.message)
    }
}

struct Writer<'s> {
    schema: &'s Compiled,
}

fn long(out: &mut Vec<u8>, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    loop {
        if z < 0x80 {
            out.push(z as u8);
            return;
        }
        out.push((z as u8 & 0x7f) | 0x80);
        z >>= 7;
    }
}

fn bytes(out: &mut Vec<u8>, b: &[u8]) {
    long(out, b.len() as i64);
    out.extend_from_slice(b);
}

impl Writer<'_> {
    /// A record's fields in schema order: `get` finds a field's value; `present` names the
    /// value's fields, each of which the schema must have.
    fn record<'v, 'n>(
        &self,
        record: &Record,
        out: &mut Vec<u8>,
        depth: usize,
        get: impl Fn(&str, usize) -> Option<std::borrow::Cow<'v, Json>>,
        mut present: impl Iterator<Item = &'n str>,
    ) -> Result<(), WriteError> {
        // A field the schema does not have would be lost: refuse it rather than drop it.
        if let Some(extra) = present.find(|n| !record.fields.iter().any(|f| f.name == *n)) {
            return Err(WriteError::new(format!(
                "not a field of {} (the output schema): it would be lost",
                record.name
            ))
            .inside(extra));
        }
        for (i, f) in record.fields.iter().enumerate() {
            let written = match get(f.name, i) {
                Some(v) => self.value(f.node, &v, out, depth),
                None => match &f.default {
                    Some(d) => self.value(f.node, d, out, depth),
                    None if self.nullable(f.node) => self.value(f.node, &Json::Null, out, depth),
                    None => Err(WriteError::new(format!(
                        "missing: {} requires it (it has no default)",
                        record.name
                    ))),
                },
            };
            written.map_err(|e| e.inside(f.name))?;
        }
        Ok(())
    }

    fn nullable(&self, node: usize) -> bool {
        matches!(self.schema.node(node), Node::Null)
            || matches!(self.schema.node(node), Node::Union { null: Some(_), .. })
    }

    fn mismatch(&self, node: usize, v: &Json) -> WriteError {
        WriteError::new(format!(
            "{} does not fit {}",
            describe_value(v),
            self.schema.describe(node)
        ))
    }

    fn value(
        &self,
        node: usize,
        v: &Json,
        out: &mut Vec<u8>,
        depth: usize,
    ) -> Result<(), WriteError> {
        if depth > MAX_DEPTH {
            return Err(WriteError::new(format!(
                "nested deeper than {MAX_DEPTH} levels"
            )));
        }
        let bad = || self.mismatch(node, v);
        match self.schema.node(node) {
            Node::Null => match v {
                Json::Null => {}
                _ => return Err(bad()),
            },
            Node::Boolean => match v {
                Json::Bool(b) => out.push(u8::from(*b)),
                _ => return Err(bad()),
            },
            Node::Int => {
                let i = integer(v).ok_or_else(bad)?;
                let i = i32::try_from(i).map_err(|_| bad())?;
                long(out, i64::from(i));
            }
            Node::Long => long(out, integer(v).ok_or_else(bad)?),
            Node::Float => {
                out.extend_from_slice(&(number(v).ok_or_else(bad)? as f32).to_le_bytes())
            }
            Node::Double => out.extend_from_slice(&number(v).ok_or_else(bad)?.to_le_bytes()),
            Node::Bytes => bytes(out, &base64_value(v).ok_or_else(bad)?),
            Node::String => match v {
                Json::String(s) => bytes(out, s.as_bytes()),
                _ => return Err(bad()),
            },
            Node::Record(r) => match v {
                Json::Object(map) => self.record(
                    r,
                    out,
                    depth + 1,
                    |name, _| map.get(name).map(std::borrow::Cow::Borrowed),
                    map.keys().map(String::as_str),
                )?,
                _ => return Err(bad()),
            },
            Node::Array(item) => {
                let Json::Array(items) = v else {
                    return Err(bad());
                };
                self.array(*item, items, out, depth)?;
            }
            Node::Map(value) => {
                let Json::Object(map) = v else {
                    return Err(bad());
                };
                self.map(*value, map, out, depth)?;
            }
            Node::Union { branches, null } => {
                return self.union(node, branches, *null, v, out, depth);
            }
            _ => self.named_or_logical(node, v, out)?,
        }
        Ok(())
    }

    fn array(
        &self,
        item: usize,
        items: &[Json],
        out: &mut Vec<u8>,
        depth: usize,
    ) -> Result<(), WriteError> {
        if !items.is_empty() {
            long(out, items.len() as i64);
            for (i, x) in items.iter().enumerate() {
                self.value(item, x, out, depth + 1)
                    .map_err(|e| e.inside(format!("[{i}]")))?;
            }
        }
        long(out, 0);
        Ok(())
    }

    fn map(
        &self,
        value: usize,
        map: &serde_json::Map<String, Json>,
        out: &mut Vec<u8>,
        depth: usize,
    ) -> Result<(), WriteError> {
        if !map.is_empty() {
            long(out, map.len() as i64);
            for (k, x) in map {
                bytes(out, k.as_bytes());
                self.value(value, x, out, depth + 1)
                    .map_err(|e| e.inside(k.clone()))?;
            }
        }
        long(out, 0);
        Ok(())
    }

    /// The branch index and the value of the first branch the value fits.
    fn union(
        &self,
        node: usize,
        branches: &[usize],
        null: Option<usize>,
        v: &Json,
        out: &mut Vec<u8>,
        depth: usize,
    ) -> Result<(), WriteError> {
        if v.is_null() {
            let Some(i) = null else {
                return Err(self.mismatch(node, v));
            };
            long(out, i as i64);
            return Ok(());
        }
        // The first branch the value fits, tried on a scratch buffer.
        let mut last = None;
        for (i, b) in branches.iter().enumerate() {
            if Some(i) == null {
                continue;
            }
            let start = out.len();
            long(out, i as i64);
            match self.value(*b, v, out, depth + 1) {
                Ok(()) => return Ok(()),
                Err(e) => {
                    out.truncate(start);
                    last = Some(e);
                }
            }
        }
        Err(match (last, branches.len() - usize::from(null.is_some())) {
            // One non-null branch: its own error says more.
            (Some(e), 1) => e,
            _ => self.mismatch(node, v),
        })
    }

    /// Fixed, enum and the logical types: values of a scalar node given a meaning.
    fn named_or_logical(&self, node: usize, v: &Json, out: &mut Vec<u8>) -> Result<(), WriteError> {
        let bad = || self.mismatch(node, v);
        match self.schema.node(node) {
            Node::Fixed { size, .. } => {
                let b = base64_value(v).ok_or_else(bad)?;
                if b.len() != *size {
                    return Err(WriteError::new(format!(
                        "{} byte(s) do not fit {}",
                        b.len(),
                        self.schema.describe(node)
                    )));
                }
                out.extend_from_slice(&b);
            }
            Node::Enum { symbols, name } => {
                let Json::String(s) = v else {
                    return Err(bad());
                };
                match symbols.iter().position(|x| x == s) {
                    Some(i) => long(out, i as i64),
                    None => {
                        return Err(WriteError::new(format!(
                            "`{s}` is not a symbol of enum {name} ({})",
                            symbols.join(", ")
                        )));
                    }
                }
            }
            Node::Decimal {
                precision,
                scale,
                fixed,
            } => self.decimal(node, *precision, *scale, *fixed, v, out)?,
            Node::BigDecimal => {
                let Some(text) = decimal_source(v) else {
                    return Err(bad());
                };
                let scale = text.split_once('.').map_or(0, |(_, f)| f.len());
                let unscaled = decimal(v, scale).ok_or_else(bad)?;
                bytes(out, &unscaled.to_signed_bytes_be());
                long(out, scale as i64);
            }
            Node::Uuid(repr) => {
                let Json::String(s) = v else {
                    return Err(bad());
                };
                let u = uuid::Uuid::parse_str(s)
                    .map_err(|e| WriteError::new(format!("`{s}` is not a uuid: {e}")))?;
                match repr {
                    UuidRepr::String => bytes(out, u.hyphenated().to_string().as_bytes()),
                    UuidRepr::Bytes => bytes(out, u.as_bytes()),
                    UuidRepr::Fixed => out.extend_from_slice(u.as_bytes()),
                }
            }
            Node::Date
            | Node::TimeMillis
            | Node::TimeMicros
            | Node::Timestamp { .. }
            | Node::Duration => self.time(node, v, out)?,
            // The nodes of `value` itself.
            _ => return Err(bad()),
        }
        Ok(())
    }

    /// Dates, times of day, timestamps and durations.
    fn time(&self, node: usize, v: &Json, out: &mut Vec<u8>) -> Result<(), WriteError> {
        let bad = || self.mismatch(node, v);
        match self.schema.node(node) {
            Node::Date => {
                let days = match v {
                    Json::String(s) => {
                        NaiveDate::parse_from_str(s, "%Y-%m-%d").ok().and_then(|d| {
                            let epoch = NaiveDate::from_ymd_opt(1970, 1, 1)?;
                            i32::try_from((d - epoch).num_days()).ok()
                        })
                    }
                    other => integer(other).and_then(|d| i32::try_from(d).ok()),
                }
                .ok_or_else(bad)?;
                long(out, i64::from(days));
            }
            // A number is written as it is (a time of day the reader could not show as text
            // comes back so); text must be a time of day.
            Node::TimeMillis => {
                let ms = integer(v)
                    .or_else(|| time_nanos(v).map(|ns| ns / 1_000_000))
                    .and_then(|ms| i32::try_from(ms).ok())
                    .ok_or_else(bad)?;
                long(out, i64::from(ms));
            }
            Node::TimeMicros => {
                let us = integer(v)
                    .or_else(|| time_nanos(v).map(|ns| ns / 1_000))
                    .ok_or_else(bad)?;
                long(out, us);
            }
            Node::Timestamp { digits, local } => {
                let units = timestamp_units(v, *digits, *local).ok_or_else(bad)?;
                long(out, units);
            }
            Node::Duration => {
                let Json::Object(map) = v else {
                    return Err(bad());
                };
                for part in ["months", "days", "millis"] {
                    let n = map
                        .get(part)
                        .and_then(Json::as_u64)
                        .and_then(|n| u32::try_from(n).ok())
                        .ok_or_else(|| {
                            WriteError::new("a duration needs months, days and millis, each a u32")
                        })?;
                    out.extend_from_slice(&n.to_le_bytes());
                }
            }
            // The other nodes, written by `value` and `named_or_logical`.
            _ => return Err(bad()),
        }
        Ok(())
    }

    /// A decimal as its unscaled two's-complement bytes, in `bytes` or a `fixed` of its size.
    fn decimal(
        &self,
        node: usize,
        precision: usize,
        scale: usize,
        fixed: Option<usize>,
        v: &Json,
        out: &mut Vec<u8>,
    ) -> Result<(), WriteError> {
        let bad = || self.mismatch(node, v);
        let unscaled = decimal(v, scale).ok_or_else(bad)?;
        if unscaled.magnitude().to_string().len() > precision {
            return Err(WriteError::new(format!(
                "{} has more digits than {}",
                describe_value(v),
                self.schema.describe(node)
            )));
        }
        let raw = unscaled.to_signed_bytes_be();
        match fixed {
            None => bytes(out, &raw),
            Some(size) => {
                if raw.len() > size {
                    return Err(bad());
                }
                let fill = if unscaled.sign() == num_bigint::Sign::Minus {
                    0xff
                } else {
                    0
                };
                out.extend(std::iter::repeat_n(fill, size - raw.len()));
                out.extend_from_slice(&raw);
            }
        }
        Ok(())
    }
}

/// What a value is, for messages: `the string "abc"`, `a number 1.5`, `an object`.
fn describe_value(v: &Json) -> String {
    match v {
        Json::String(s) if s.len() <= 40 => format!("the string {s:?}"),
        Json::Number(n) => format!("the number {n}"),
        Json::Bool(b) => format!("the bool {b}"),
        Json::Null => "null".into(),
        other => format!("a value of type {}", type_name(other)),
    }
}

/// An integral number (a float only when it has no fraction).
fn integer(v: &Json) -> Option<i64> {
    match v {
        Json::Number(n) => n.as_i64().or_else(|| {
            let f = n.as_f64()?;
            (f.fract() == 0.0 && f >= i64::MIN as f64 && f <= i64::MAX as f64).then_some(f as i64)
        }),
        _ => None,
    }
}

/// A number, or the names of the floats that are not finite.
fn number(v: &Json) -> Option<f64> {
    match v {
        Json::Number(n) => n.as_f64(),
        Json::String(s) => match s.as_str() {
            "NaN" => Some(f64::NAN),
            "Infinity" => Some(f64::INFINITY),
            "-Infinity" => Some(f64::NEG_INFINITY),
            _ => None,
        },
        _ => None,
    }
}

fn base64_value(v: &Json) -> Option<Vec<u8>> {
    match v {
        Json::String(s) => base64::engine::general_purpose::STANDARD.decode(s).ok(),
        _ => None,
    }
}

/// The decimal text of a value: a string as it is, a number as serde_json writes it.
fn decimal_source(v: &Json) -> Option<String> {
    match v {
        Json::String(s) => Some(s.clone()),
        Json::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// The unscaled integer of a decimal value at `scale`: `"12.5"` at scale 2 is 1250. A value
/// with more fraction digits than the scale does not fit (it would be rounded).
fn decimal(v: &Json, scale: usize) -> Option<BigInt> {
    let text = decimal_source(v)?;
    if text.contains(['e', 'E']) {
        return None;
    }
    let (negative, digits) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.as_str()),
    };
    let (int, frac) = digits.split_once('.').unwrap_or((digits, ""));
    let frac = frac.trim_end_matches('0');
    if frac.len() > scale
        || int.is_empty() && frac.is_empty()
        || !int.chars().chain(frac.chars()).all(|c| c.is_ascii_digit())
    {
        return None;
    }
    let all = format!("{int}{frac}{}", "0".repeat(scale - frac.len()));
    let n: BigInt = all.parse().ok()?;
    Some(if negative { -n } else { n })
}

/// Nanoseconds after midnight of `HH:MM:SS[.f]` text.
fn time_nanos(v: &Json) -> Option<i64> {
    match v {
        Json::String(s) => {
            let t = NaiveTime::parse_from_str(s, "%H:%M:%S%.f").ok()?;
            Some(
                i64::from(t.num_seconds_from_midnight()) * 1_000_000_000
                    + i64::from(t.nanosecond()),
            )
        }
        _ => None,
    }
}

/// Units of 10^-digits s since the epoch: from RFC 3339 text (local timestamps: without an
/// offset), or a number already in that unit.
fn timestamp_units(v: &Json, digits: u32, local: bool) -> Option<i64> {
    match v {
        Json::String(s) => {
            let naive = if local {
                NaiveDateTime::parse_from_str(s, "%Y-%m-%dT%H:%M:%S%.f").ok()?
            } else {
                // RFC 3339 (fast); then the reader's own text for years before 0 or after 9999.
                DateTime::parse_from_rfc3339(s)
                    .map(|t| t.naive_utc())
                    .ok()
                    .or_else(|| {
                        let utc = s.strip_suffix('Z')?;
                        NaiveDateTime::parse_from_str(utc, "%Y-%m-%dT%H:%M:%S%.f").ok()
                    })?
            };
            let t = naive.and_utc();
            let per_sec = 10i64.pow(digits);
            let sub = i64::from(t.timestamp_subsec_nanos()) / 10i64.pow(9 - digits);
            t.timestamp().checked_mul(per_sec)?.checked_add(sub)
        }
        other => integer(other),
    }
}
