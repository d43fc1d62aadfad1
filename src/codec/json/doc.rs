//! A JSON document decoded lazily: the top-level fields of an object are found (and the whole
//! document validated) in one pass without building them; a field is decoded only when a
//! processor or an expression needs it, and untouched fields are written back byte for byte.
//! Most pipelines touch a few fields of a large document, so most of it is never decoded nor
//! re-encoded. Field order is kept.

use std::borrow::Cow;

use serde_json::Value as Json;

use super::scan;

/// A field: as found in the input, an object opened lazily, or decoded (and maybe changed).
#[derive(Debug, Clone)]
pub enum Field<'a> {
    /// Valid JSON text, as it was in the input (only [`Doc::parse`] makes one: opening it
    /// relies on it being valid).
    Raw(&'a str),
    /// An object whose own fields are found but not decoded.
    Object(Doc<'a>),
    Value(Json),
}

impl<'a> Field<'a> {
    /// The field decoded.
    pub fn to_json(&self) -> Json {
        match self {
            // A string without escapes is its text between the quotes.
            Field::Raw(raw) if raw.starts_with('"') && !raw.contains('\\') && raw.len() >= 2 => {
                Json::String(raw[1..raw.len() - 1].to_string())
            }
            // A raw field was validated when the document was parsed.
            Field::Raw(raw) => serde_json::from_str(raw).unwrap_or(Json::Null),
            Field::Object(doc) => doc.to_json(),
            Field::Value(v) => v.clone(),
        }
    }

    /// Whether an expression can use the field as it is: anything decoded, a number, a
    /// bool, null, or a string without escapes (borrowed as it is).
    pub fn is_plain(&self) -> bool {
        match self {
            Field::Value(_) => true,
            Field::Object(_) => false,
            Field::Raw(text) => match text.as_bytes().first() {
                Some(b'{' | b'[') => false,
                Some(b'"') => !text.contains('\\'),
                _ => true,
            },
        }
    }

    /// Makes the field usable by an expression as a whole (decoding it unless plain).
    fn make_usable(&mut self) {
        if !self.is_plain() {
            *self = Field::Value(self.to_json());
        }
    }

    /// Opens a raw object lazily, so that a path can go inside it. False when the field is
    /// not an object.
    fn open(&mut self) -> bool {
        if let Field::Raw(raw) = self
            && raw.starts_with('{')
        {
            // A raw field was validated with the document: its fields are found without
            // validating again.
            let mut fields = scan::fields_of_valid_with(raw, |k, v| (k, Field::Raw(v)));
            dedupe(&mut fields);
            *self = Field::Object(Doc::Object(fields));
        }
        matches!(self, Field::Object(_) | Field::Value(Json::Object(_)))
    }
}

/// A decoded JSON value.
#[derive(Debug, Clone)]
pub enum Doc<'a> {
    /// An object: its fields in order.
    Object(Vec<(Cow<'a, str>, Field<'a>)>),
    /// Any other JSON value.
    Other(Json),
}

impl<'a> Doc<'a> {
    /// Parses (and validates) a document; the error says what is wrong and where.
    pub fn parse(bytes: &'a [u8]) -> Result<Doc<'a>, String> {
        // One UTF-8 check of the whole buffer, then the scanner works on text.
        let text = std::str::from_utf8(bytes)
            .map_err(|e| format!("invalid UTF-8 at byte {}", e.valid_up_to()))?;
        Doc::parse_str(text)
    }

    /// Parses (and validates) a document from text: an object is only scanned into its
    /// fields (see [`scan`]), any other value is decoded.
    pub fn parse_str(text: &'a str) -> Result<Doc<'a>, String> {
        match scan::object_fields_with(text, |k, v| (k, Field::Raw(v)))
            .map_err(|e| e.to_string())?
        {
            Some(mut fields) => {
                dedupe(&mut fields);
                Ok(Doc::Object(fields))
            }
            None => serde_json::from_str(text)
                .map(Doc::Other)
                .map_err(|e| e.to_string()),
        }
    }

    /// A field of this object.
    pub fn get(&self, key: &str) -> Option<&Field<'a>> {
        match self {
            Doc::Object(fields) => fields.iter().find(|(k, _)| k == key).map(|(_, f)| f),
            Doc::Other(_) => None,
        }
    }

    fn get_mut(&mut self, key: &str) -> Option<&mut Field<'a>> {
        match self {
            Doc::Object(fields) => fields.iter_mut().find(|(k, _)| k == key).map(|(_, f)| f),
            Doc::Other(_) => None,
        }
    }

    /// Prepares `path` for an expression that uses the value there as a whole: the objects on
    /// the way are opened lazily, the value at the end is decoded unless plain.
    pub fn prepare(&mut self, path: &[String]) {
        let Some((first, rest)) = path.split_first() else {
            return;
        };
        let Some(field) = self.get_mut(first) else {
            return;
        };
        if rest.is_empty() {
            field.make_usable();
            return;
        }
        if !field.open() {
            return;
        }
        if let Field::Object(doc) = field {
            doc.prepare(rest);
        }
    }

    /// Decodes every field.
    pub fn decode_all(&mut self) {
        if let Doc::Object(fields) = self {
            for (_, field) in fields.iter_mut() {
                if !matches!(field, Field::Value(_)) {
                    *field = Field::Value(field.to_json());
                }
            }
        }
    }

    /// The whole document decoded.
    pub fn to_json(&self) -> Json {
        match self {
            Doc::Object(fields) => Json::Object(
                fields
                    .iter()
                    .map(|(k, f)| (k.to_string(), f.to_json()))
                    .collect(),
            ),
            Doc::Other(v) => v.clone(),
        }
    }

    /// Sets `path`, creating missing parent objects. Errors say what is in the way.
    pub fn set(&mut self, path: &[String], value: Json) -> Result<(), String> {
        self.set_at(path, 0, value)
    }

    fn set_at(&mut self, path: &[String], depth: usize, value: Json) -> Result<(), String> {
        let fields = self.fields_mut(path, depth)?;
        let Some(key) = path.get(depth) else {
            return Ok(());
        };
        let last = depth + 1 == path.len();
        let slot = match fields.iter().position(|(k, _)| k == key) {
            Some(i) => &mut fields[i].1,
            None => {
                let empty = if last {
                    Json::Null
                } else {
                    Json::Object(serde_json::Map::new())
                };
                fields.push((Cow::Owned(key.clone()), Field::Value(empty)));
                let n = fields.len() - 1;
                &mut fields[n].1
            }
        };
        if last {
            *slot = Field::Value(value);
            return Ok(());
        }
        slot.open();
        match slot {
            Field::Object(doc) => doc.set_at(path, depth + 1, value),
            Field::Value(Json::Object(map)) => set_in(map, path, depth + 1, value),
            _ => Err(format!(
                "cannot set `{}`: `{}` is not an object",
                path.join("."),
                path[..=depth].join(".")
            )),
        }
    }

    /// Removes `path` and returns what was there, decoded (`None` when absent).
    pub fn take(&mut self, path: &[String]) -> Result<Option<Json>, String> {
        Ok(self.remove_at(path, 0)?.map(|f| f.to_json()))
    }

    /// Removes `path` without decoding it; whether it was there.
    pub fn remove(&mut self, path: &[String]) -> Result<bool, String> {
        Ok(self.remove_at(path, 0)?.is_some())
    }

    fn remove_at(&mut self, path: &[String], depth: usize) -> Result<Option<Field<'a>>, String> {
        let fields = self.fields_mut(path, depth)?;
        let Some(key) = path.get(depth) else {
            return Ok(None);
        };
        let Some(i) = fields.iter().position(|(k, _)| k == key) else {
            return Ok(None);
        };
        if depth + 1 == path.len() {
            return Ok(Some(fields.remove(i).1));
        }
        let slot = &mut fields[i].1;
        slot.open();
        match slot {
            Field::Object(doc) => doc.remove_at(path, depth + 1),
            Field::Value(Json::Object(map)) => {
                let (last, parents) = path[depth + 1..].split_last().unwrap_or((key, &[]));
                let mut current = map;
                for part in parents {
                    current = match current.get_mut(part.as_str()) {
                        Some(Json::Object(map)) => map,
                        _ => return Ok(None),
                    };
                }
                Ok(current.remove(last.as_str()).map(Field::Value))
            }
            _ => Ok(None),
        }
    }

    fn fields_mut(
        &mut self,
        path: &[String],
        depth: usize,
    ) -> Result<&mut Vec<(Cow<'a, str>, Field<'a>)>, String> {
        match self {
            Doc::Object(fields) => Ok(fields),
            Doc::Other(v) if depth == 0 => {
                Err(format!("the value is {}, not a JSON object", type_name(v)))
            }
            Doc::Other(v) => Err(format!(
                "`{}` is {}, not an object",
                path[..depth].join("."),
                type_name(v)
            )),
        }
    }

    /// Writes the document as JSON; untouched fields are copied as they were.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), serde_json::Error> {
        match self {
            Doc::Other(v) => serde_json::to_writer(&mut *out, v),
            Doc::Object(fields) => {
                out.push(b'{');
                for (n, (key, field)) in fields.iter().enumerate() {
                    if n > 0 {
                        out.push(b',');
                    }
                    match key {
                        // A key borrowed from the input had no escapes: copy it.
                        Cow::Borrowed(k) => {
                            out.push(b'"');
                            out.extend_from_slice(k.as_bytes());
                            out.extend_from_slice(b"\":");
                        }
                        Cow::Owned(k) => {
                            serde_json::to_writer(&mut *out, k)?;
                            out.push(b':');
                        }
                    }
                    match field {
                        Field::Raw(raw) => out.extend_from_slice(raw.as_bytes()),
                        Field::Object(doc) => doc.encode(out)?,
                        Field::Value(v) => serde_json::to_writer(&mut *out, v)?,
                    }
                }
                out.push(b'}');
                Ok(())
            }
        }
    }
}

/// Like serde_json, the last of duplicated keys wins. Keys are compared by length and last
/// byte first: most documents have no duplicate and this stays cheap (and allocates nothing).
fn dedupe(fields: &mut Vec<(Cow<'_, str>, Field<'_>)>) {
    let same = |a: &str, b: &str| {
        let (a, b) = (a.as_bytes(), b.as_bytes());
        a.len() == b.len() && a.last() == b.last() && a == b
    };
    let mut i = 0;
    while i < fields.len() {
        if fields[i + 1..].iter().any(|(k, _)| same(k, &fields[i].0)) {
            fields.remove(i);
        } else {
            i += 1;
        }
    }
}

fn set_in(
    map: &mut serde_json::Map<String, Json>,
    path: &[String],
    depth: usize,
    value: Json,
) -> Result<(), String> {
    let part = &path[depth];
    if depth + 1 == path.len() {
        map.insert(part.clone(), value);
        return Ok(());
    }
    let slot = map
        .entry(part.clone())
        .or_insert_with(|| Json::Object(serde_json::Map::new()));
    match slot {
        Json::Object(inner) => set_in(inner, path, depth + 1, value),
        other => Err(format!(
            "cannot set `{}`: `{}` is {}, not an object",
            path.join("."),
            path[..=depth].join("."),
            type_name(other)
        )),
    }
}

/// "a string", "an array"... for messages.
pub fn type_name(v: &Json) -> &'static str {
    match v {
        Json::Null => "null",
        Json::Bool(_) => "a bool",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "an array",
        Json::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn path(p: &str) -> Vec<String> {
        p.split('.').map(str::to_string).collect()
    }

    fn encoded(doc: &Doc<'_>) -> String {
        let mut out = Vec::new();
        doc.encode(&mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn untouched_fields_are_written_back_as_they_were() {
        let text = br#" {"b": [1, 2.50], "a\u0041": {"x": 1}, "c": "s"} "#;
        let doc = Doc::parse(text).unwrap();
        assert_eq!(encoded(&doc), r#"{"b":[1, 2.50],"aA":{"x": 1},"c":"s"}"#);
    }

    #[test]
    fn set_and_take_nested_paths() {
        let text = br#"{"a": {"b": 1, "c": 2}, "d": 3}"#;
        let mut doc = Doc::parse(text).unwrap();
        doc.prepare(&path("a.b"));
        assert!(matches!(doc.get("a"), Some(Field::Object(_))));
        doc.set(&path("a.e.f"), json!(4)).unwrap();
        doc.set(&path("g"), json!("h")).unwrap();
        assert_eq!(doc.take(&path("a.b")).unwrap(), Some(json!(1)));
        assert_eq!(doc.take(&path("d")).unwrap(), Some(json!(3)));
        assert_eq!(doc.take(&path("nope.x")).unwrap(), None);
        assert!(!doc.remove(&path("a.zz")).unwrap());
        assert!(doc.set(&path("g.x"), json!(1)).is_err());
        assert_eq!(
            doc.to_json(),
            json!({"a": {"c": 2, "e": {"f": 4}}, "g": "h"})
        );
    }

    #[test]
    fn invalid_json_and_duplicate_keys() {
        assert!(Doc::parse(br#"{"a": 1"#).is_err());
        assert!(Doc::parse(br#"{"a": 1} x"#).is_err());
        assert!(Doc::parse(b"[1, 2").is_err());
        let doc = Doc::parse(br#"{"a": 1, "b": 2, "a": 3}"#).unwrap();
        assert_eq!(doc.to_json(), json!({"a": 3, "b": 2}));
        assert!(matches!(Doc::parse(b"[1]").unwrap(), Doc::Other(_)));
    }
}
