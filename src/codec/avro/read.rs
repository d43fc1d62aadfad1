//! Avro binary to the documents expressions see, walking a [`Compiled`] schema. Every read is
//! bounds-checked: truncated, corrupt or hostile input is an error naming what is wrong and
//! where, never a panic, and never an allocation larger than the input can justify.
//!
//! How each Avro type is seen (docs/avro.md, "What expressions see"): records and maps as objects, arrays as arrays,
//! a union as the value of its branch (`null` for the null branch), an enum as its symbol,
//! `int`/`long`/`float`/`double` as numbers (a float that is not finite as the text `NaN`,
//! `Infinity`, `-Infinity`), `bytes`/`fixed` as base64 text, and logical types as text in
//! their ISO forms: `timestamp-*` as RFC 3339 in UTC (`2024-05-01T12:00:00.250Z`), `local-
//! timestamp-*` without the `Z`, `date` as `2024-05-01`, `time-*` as `12:00:00.250`,
//! `decimal` as its exact decimal text (`12.50`), `uuid` as its hyphenated text, `duration`
//! as `{months, days, millis}`.

use std::borrow::Cow;

use chrono::{DateTime, NaiveDate, NaiveTime};
use num_bigint::BigInt;
use serde_json::{Map, Number, Value as Json};

use super::schema::{Compiled, Node, ROOT, UuidRepr, base64};
use crate::codec::json::{Doc, Field};

/// Deeper nesting than this is refused (a recursive schema and hostile bytes could otherwise
/// recurse without end).
pub const MAX_DEPTH: usize = 128;

/// At most this many items of a zero-size type (a `null`, an empty record) in one array or
/// map: anything else takes at least a byte per item, so the input's length bounds it.
const MAX_EMPTY_ITEMS: u64 = 1 << 20;

/// Decodes one datum with `schema`; the datum must take exactly `bytes`.
pub fn decode<'a>(schema: &Compiled, bytes: &[u8]) -> Result<Doc<'a>, String> {
    let mut r = Reader {
        schema,
        input: bytes,
        len: bytes.len(),
    };
    let doc = match schema.node(ROOT) {
        Node::Record(record) => {
            let mut fields = Vec::with_capacity(record.fields.len());
            for f in &record.fields {
                let v = r.value(f.node, 1).map_err(|e| e.at(f.name))?;
                fields.push((Cow::Borrowed(f.name), Field::Value(v)));
            }
            Doc::Object(fields)
        }
        _ => Doc::Other(r.value(ROOT, 0).map_err(|e| e.message)?),
    };
    if !r.input.is_empty() {
        return Err(format!(
            "{} byte(s) left over after the record (it ends at byte {} of {})",
            r.input.len(),
            r.len - r.input.len(),
            r.len
        ));
    }
    Ok(doc)
}

/// A read error and the field path it happened at, built from the inside out.
#[derive(Debug)]
pub struct ReadError {
    message: String,
    path: Vec<String>,
}

impl ReadError {
    fn at(mut self, field: &str) -> String {
        self.path.push(field.to_string());
        self.path.reverse();
        format!("at `{}`: {}", self.path.join("."), self.message)
    }

    fn inside(mut self, part: impl Into<String>) -> ReadError {
        self.path.push(part.into());
        self
    }
}

struct Reader<'s, 'b> {
    schema: &'s Compiled,
    input: &'b [u8],
    len: usize,
}

impl Reader<'_, '_> {
    fn fail(&self, message: impl Into<String>) -> ReadError {
        ReadError {
            message: format!(
                "{} (byte {} of {})",
                message.into(),
                self.len - self.input.len(),
                self.len
            ),
            path: Vec::new(),
        }
    }

    fn take(&mut self, n: usize) -> Result<&[u8], ReadError> {
        if self.input.len() < n {
            return Err(self.fail(format!(
                "truncated: {n} byte(s) needed, {} left",
                self.input.len()
            )));
        }
        let (head, rest) = self.input.split_at(n);
        self.input = rest;
        Ok(head)
    }

    /// A zig-zag varint of at most 10 bytes. Bits past the 64th in the tenth byte are
    /// ignored, as Avro's Java and Rust readers do.
    fn long(&mut self) -> Result<i64, ReadError> {
        let mut value: u64 = 0;
        for i in 0..10 {
            let Some((&b, rest)) = self.input.split_first() else {
                return Err(self.fail("truncated in a number"));
            };
            self.input = rest;
            value |= u64::from(b & 0x7f).wrapping_shl(7 * i);
            if b & 0x80 == 0 {
                return Ok((value >> 1) as i64 ^ -((value & 1) as i64));
            }
        }
        Err(self.fail("a number longer than 64 bits"))
    }

    fn int(&mut self) -> Result<i32, ReadError> {
        let v = self.long()?;
        i32::try_from(v).map_err(|_| self.fail(format!("{v} does not fit an int")))
    }

    /// A length or count: not negative, and at most what is left of the input.
    fn len(&mut self) -> Result<usize, ReadError> {
        let v = self.long()?;
        if v < 0 || v as u64 > self.input.len() as u64 {
            return Err(self.fail(format!(
                "a length of {v} with {} byte(s) left",
                self.input.len()
            )));
        }
        Ok(v as usize)
    }

    fn bytes(&mut self) -> Result<&[u8], ReadError> {
        let n = self.len()?;
        self.take(n)
    }

    fn string(&mut self) -> Result<String, ReadError> {
        let n = self.len()?;
        let bytes = self.take(n)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_string()),
            Err(e) => Err(self.fail(format!("a string that is not UTF-8: {e}"))),
        }
    }

    /// The item count of the next block of an array or map (0 at the end). A negative count is
    /// followed by the block's size in bytes, read and ignored. Items that
    /// take at least a byte each cannot outnumber the bytes left; items of a zero-size type
    /// are bounded in all (`items_so_far` included).
    fn block(&mut self, items_so_far: u64, empty_items: bool) -> Result<u64, ReadError> {
        let count = self.long()?;
        let count = if count < 0 {
            // The block's size in bytes: only a hint for skipping, not checked against the
            // items (Avro's Java and Rust readers ignore it too).
            self.long()?;
            count.unsigned_abs()
        } else {
            count as u64
        };
        let too_many = if empty_items {
            items_so_far.saturating_add(count) > MAX_EMPTY_ITEMS
        } else {
            count > self.input.len() as u64
        };
        if too_many {
            return Err(self.fail(format!(
                "{count} items announced with {} byte(s) left",
                self.input.len()
            )));
        }
        Ok(count)
    }

    fn value(&mut self, node: usize, depth: usize) -> Result<Json, ReadError> {
        if depth > MAX_DEPTH {
            return Err(self.fail(format!("nested deeper than {MAX_DEPTH} levels")));
        }
        let schema = self.schema;
        Ok(match schema.node(node) {
            Node::Null => Json::Null,
            Node::Boolean => match self.take(1)?[0] {
                0 => Json::Bool(false),
                1 => Json::Bool(true),
                b => return Err(self.fail(format!("a boolean byte {b}"))),
            },
            Node::Int => Json::from(self.int()?),
            Node::Long => Json::from(self.long()?),
            Node::Float => {
                let b = self.take(4)?;
                float(f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])))
            }
            Node::Double => {
                let b = self.take(8)?;
                let mut a = [0u8; 8];
                a.copy_from_slice(b);
                float(f64::from_le_bytes(a))
            }
            Node::Bytes => Json::String(base64(self.bytes()?)),
            Node::String => Json::String(self.string()?),
            Node::Fixed { size, .. } => Json::String(base64(self.take(*size)?)),
            Node::Record(r) => {
                let mut map = Map::new();
                for f in &r.fields {
                    let v = self
                        .value(f.node, depth + 1)
                        .map_err(|e| e.inside(f.name))?;
                    map.insert(f.name.to_string(), v);
                }
                Json::Object(map)
            }
            Node::Enum { symbols, .. } => {
                let i = self.long()?;
                match usize::try_from(i).ok().and_then(|i| symbols.get(i)) {
                    Some(s) => Json::String(s.clone()),
                    None => {
                        return Err(
                            self.fail(format!("enum index {i} of {} symbols", symbols.len()))
                        );
                    }
                }
            }
            Node::Array(item) => self.array(*item, depth)?,
            Node::Map(value) => self.map(*value, depth)?,
            Node::Union { branches, .. } => {
                let i = self.long()?;
                match usize::try_from(i).ok().and_then(|i| branches.get(i)) {
                    Some(b) => self.value(*b, depth + 1)?,
                    None => {
                        return Err(self.fail(format!("union branch {i} of {}", branches.len())));
                    }
                }
            }
            _ => self.logical(node)?,
        })
    }

    fn array(&mut self, item: usize, depth: usize) -> Result<Json, ReadError> {
        let empty = zero_size(self.schema, item);
        let mut items = Vec::new();
        loop {
            let n = self.block(items.len() as u64, empty)?;
            if n == 0 {
                break;
            }
            for _ in 0..n {
                let i = items.len();
                items.push(
                    self.value(item, depth + 1)
                        .map_err(|e| e.inside(format!("[{i}]")))?,
                );
            }
        }
        Ok(Json::Array(items))
    }

    fn map(&mut self, value: usize, depth: usize) -> Result<Json, ReadError> {
        let empty = false; // every entry has a key: at least one byte
        let mut map = Map::new();
        let mut count = 0u64;
        loop {
            let n = self.block(count, empty)?;
            if n == 0 {
                break;
            }
            count += n;
            for _ in 0..n {
                let k = self.string()?;
                let v = self
                    .value(value, depth + 1)
                    .map_err(|e| e.inside(k.clone()))?;
                map.insert(k, v);
            }
        }
        Ok(Json::Object(map))
    }

    /// The logical types: decimals, uuids, dates, times of day, timestamps and durations.
    fn logical(&mut self, node: usize) -> Result<Json, ReadError> {
        Ok(match self.schema.node(node) {
            Node::Decimal {
                scale, fixed: size, ..
            } => {
                let raw = match size {
                    Some(n) => self.take(*n)?,
                    None => self.bytes()?,
                };
                Json::String(decimal_text(&BigInt::from_signed_bytes_be(raw), *scale))
            }
            Node::BigDecimal => {
                // bytes: a length-prefixed unscaled value, then the scale as a long.
                let raw = self.bytes()?.to_vec();
                let scale = self.long()?;
                let scale = usize::try_from(scale)
                    .map_err(|_| self.fail(format!("a big-decimal scale of {scale}")))?;
                Json::String(decimal_text(&BigInt::from_signed_bytes_be(&raw), scale))
            }
            Node::Uuid(repr) => {
                let text = match repr {
                    UuidRepr::String => self.string()?,
                    UuidRepr::Bytes => {
                        let b = self.bytes()?;
                        uuid_text(b).ok_or_else(|| self.fail("a uuid of other than 16 bytes"))?
                    }
                    UuidRepr::Fixed => {
                        let b = self.take(16)?;
                        uuid_text(b).ok_or_else(|| self.fail("a uuid of other than 16 bytes"))?
                    }
                };
                Json::String(text)
            }
            // A value a logical type's text cannot show (a date or an instant beyond chrono's
            // +-262,000 years, a time of day outside 0-24 h) is kept as its number: a good
            // datum is never refused for it, and an output takes the number back.
            Node::Date => {
                let days = self.int()?;
                NaiveDate::from_ymd_opt(1970, 1, 1)
                    .and_then(|d| d.checked_add_signed(chrono::Duration::days(days.into())))
                    .map_or(Json::from(days), |date| {
                        Json::String(date.format("%Y-%m-%d").to_string())
                    })
            }
            Node::TimeMillis => {
                let ms = self.int()?;
                time_text(i64::from(ms) * 1_000_000).map_or(Json::from(ms), Json::String)
            }
            Node::TimeMicros => {
                let us = self.long()?;
                us.checked_mul(1000)
                    .and_then(time_text)
                    .map_or(Json::from(us), Json::String)
            }
            Node::Timestamp { digits, local } => {
                let v = self.long()?;
                timestamp_text(v, *digits, *local).map_or(Json::from(v), Json::String)
            }
            Node::Duration => {
                let b = self.take(12)?;
                let part = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
                let mut map = Map::new();
                map.insert("months".into(), Json::from(part(0)));
                map.insert("days".into(), Json::from(part(4)));
                map.insert("millis".into(), Json::from(part(8)));
                Json::Object(map)
            }
            // The other nodes, read by `value`.
            _ => return Err(self.fail("a node that is not of a logical type")),
        })
    }
}

/// Whether a value of `node` can take no bytes at all.
fn zero_size(schema: &Compiled, node: usize) -> bool {
    match schema.node(node) {
        Node::Null => true,
        Node::Fixed { size, .. } => *size == 0,
        Node::Record(r) => r
            .fields
            .iter()
            .all(|f| f.node != node && zero_size(schema, f.node)),
        _ => false,
    }
}

/// A float as a document number, or its name when it is not finite.
pub fn float(v: f64) -> Json {
    match Number::from_f64(v) {
        Some(n) => Json::Number(n),
        None if v.is_nan() => Json::String("NaN".into()),
        None if v > 0.0 => Json::String("Infinity".into()),
        None => Json::String("-Infinity".into()),
    }
}

/// The decimal text of `unscaled` x 10^-scale: `-12.50` for (-1250, 2).
pub fn decimal_text(unscaled: &BigInt, scale: usize) -> String {
    let digits = unscaled.magnitude().to_string();
    let sign = if unscaled.sign() == num_bigint::Sign::Minus {
        "-"
    } else {
        ""
    };
    if scale == 0 {
        return format!("{sign}{digits}");
    }
    let padded = if digits.len() <= scale {
        format!("{}{digits}", "0".repeat(scale + 1 - digits.len()))
    } else {
        digits
    };
    let (int, frac) = padded.split_at(padded.len() - scale);
    format!("{sign}{int}.{frac}")
}

fn uuid_text(b: &[u8]) -> Option<String> {
    let b: [u8; 16] = b.try_into().ok()?;
    Some(uuid::Uuid::from_bytes(b).hyphenated().to_string())
}

/// `HH:MM:SS.fff` (or `.ffffff`) of a time of day in nanoseconds.
fn time_text(nanos: i64) -> Option<String> {
    if !(0..86_400_000_000_000).contains(&nanos) {
        return None;
    }
    let secs = u32::try_from(nanos / 1_000_000_000).ok()?;
    let sub = u32::try_from(nanos % 1_000_000_000).ok()?;
    let t = NaiveTime::from_num_seconds_from_midnight_opt(secs, sub)?;
    Some(if sub % 1_000_000 == 0 {
        t.format("%H:%M:%S%.3f").to_string()
    } else {
        t.format("%H:%M:%S%.6f").to_string()
    })
}

/// RFC 3339 text of `v` units of 10^-digits s since the epoch, with as many fraction digits.
pub fn timestamp_text(v: i64, digits: u32, local: bool) -> Option<String> {
    let per_sec = 10i64.pow(digits);
    let secs = v.div_euclid(per_sec);
    let frac = v.rem_euclid(per_sec);
    let nanos = u32::try_from(frac * 10i64.pow(9 - digits)).ok()?;
    let t = DateTime::from_timestamp(secs, nanos)?;
    // chrono's RFC 3339 writer, five times faster than a format string, for the years it
    // writes in RFC 3339's four digits.
    if !local && (0..=9999).contains(&chrono::Datelike::year(&t)) {
        let precision = match digits {
            3 => chrono::SecondsFormat::Millis,
            6 => chrono::SecondsFormat::Micros,
            _ => chrono::SecondsFormat::Nanos,
        };
        return Some(t.to_rfc3339_opts(precision, true));
    }
    let fmt = match (digits, local) {
        (3, false) => "%Y-%m-%dT%H:%M:%S%.3fZ",
        (6, false) => "%Y-%m-%dT%H:%M:%S%.6fZ",
        (_, false) => "%Y-%m-%dT%H:%M:%S%.9fZ",
        (3, true) => "%Y-%m-%dT%H:%M:%S%.3f",
        (6, true) => "%Y-%m-%dT%H:%M:%S%.6f",
        (_, true) => "%Y-%m-%dT%H:%M:%S%.9f",
    };
    Some(t.naive_utc().format(fmt).to_string())
}
