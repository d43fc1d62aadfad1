//! A validating scanner of JSON text, for [`super::doc`]: it checks that a document is valid
//! JSON (RFC 8259, as strict as serde_json's parser: no trailing commas, no leading zeros, no
//! control characters or lone surrogates in strings, nesting under 128 levels, finite numbers)
//! and finds the top-level fields of an object, without building anything. Walking the document
//! through serde (`RawValue`) did the same work with more machinery and dominated the cost of a
//! record; here strings, most of a document's bytes, are skipped eight bytes at a time.
//!
//! The input is `&str`: its UTF-8 was checked once, for the whole buffer. A differential test
//! holds it to serde_json's verdict on many generated and mutated documents.

use std::borrow::Cow;

/// Nesting this deep is refused, like serde_json does (127 levels pass).
const MAX_DEPTH: usize = 128;

/// Why a document is not valid JSON.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} at byte {at}")]
pub struct ScanError {
    pub at: usize,
    pub what: &'static str,
}

fn err<T>(at: usize, what: &'static str) -> Result<T, ScanError> {
    Err(ScanError { at, what })
}

/// The fields of an object: (key, raw value text) pairs, in order.
pub type RawFields<'a> = Vec<(Cow<'a, str>, &'a str)>;

/// The top-level fields of the object `text` is, or `None` when the document is valid but
/// not an object.
pub fn object_fields(text: &str) -> Result<Option<RawFields<'_>>, ScanError> {
    object_fields_with(text, |k, v| (k, v))
}

/// [`object_fields`], each field made into a `T` by `field` as it is found (one vector, no
/// copy of it).
pub fn object_fields_with<'t, T>(
    text: &'t str,
    mut field: impl FnMut(Cow<'t, str>, &'t str) -> T,
) -> Result<Option<Vec<T>>, ScanError> {
    let b = text.as_bytes();
    let start = skip_ws(b, 0);
    if b.get(start) != Some(&b'{') {
        let end = value(b, start, 0)?;
        trailing(b, end)?;
        return Ok(None);
    }
    let mut fields = Vec::with_capacity(16);
    let mut i = skip_ws(b, start + 1);
    if b.get(i) == Some(&b'}') {
        trailing(b, i + 1)?;
        return Ok(Some(fields));
    }
    loop {
        if b.get(i) != Some(&b'"') {
            return err(i, "expected a key");
        }
        let key_end = string(b, i)?;
        let key = key_text(text, i, key_end)?;
        i = skip_ws(b, key_end);
        if b.get(i) != Some(&b':') {
            return err(i, "expected `:`");
        }
        let value_start = skip_ws(b, i + 1);
        let value_end = value(b, value_start, 1)?;
        fields.push(field(key, &text[value_start..value_end]));
        i = skip_ws(b, value_end);
        match b.get(i) {
            Some(b',') => i = skip_ws(b, i + 1),
            Some(b'}') => {
                trailing(b, i + 1)?;
                return Ok(Some(fields));
            }
            _ => return err(i, "expected `,` or `}`"),
        }
    }
}

/// The fields of an object that is already known to be valid JSON (a field of a document that
/// [`object_fields`] accepted): found without validating again, the same fields
/// [`object_fields`] gives. Opening a nested object costs a fraction of scanning it.
pub fn fields_of_valid(text: &str) -> RawFields<'_> {
    fields_of_valid_with(text, |k, v| (k, v))
}

/// [`fields_of_valid`], each field made into a `T` by `field`.
pub fn fields_of_valid_with<'t, T>(
    text: &'t str,
    mut field: impl FnMut(Cow<'t, str>, &'t str) -> T,
) -> Vec<T> {
    let b = text.as_bytes();
    let mut fields = Vec::with_capacity(8);
    // Past the `{`.
    let mut i = skip_ws(b, 0) + 1;
    loop {
        i = skip_ws(b, i);
        if b.get(i) != Some(&b'"') {
            return fields;
        }
        let key_end = string_end(b, i);
        // A valid key always unescapes.
        let key = key_text(text, i, key_end).unwrap_or_default();
        // Past the `:`.
        let value_start = skip_ws(b, skip_ws(b, key_end) + 1);
        let value_end = value_end(b, value_start);
        fields.push(field(key, &text[value_start..value_end]));
        i = skip_ws(b, value_end);
        if b.get(i) != Some(&b',') {
            return fields;
        }
        i += 1;
    }
}

/// The end of the valid string starting at `start` (after its closing quote).
fn string_end(b: &[u8], start: usize) -> usize {
    let mut i = start + 1;
    loop {
        i = to_special(b, i);
        match b.get(i) {
            Some(b'\\') => i += 2,
            Some(_) => return i + 1,
            None => return i,
        }
    }
}

/// The end of the valid value starting at `start`.
fn value_end(b: &[u8], start: usize) -> usize {
    match b.get(start) {
        Some(b'"') => string_end(b, start),
        Some(b'{' | b'[') => {
            let mut depth = 0usize;
            let mut i = start;
            while let Some(c) = b.get(i) {
                match c {
                    b'"' => {
                        i = string_end(b, i);
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return i + 1;
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
            i
        }
        _ => {
            let mut i = start;
            while let Some(c) = b.get(i) {
                if matches!(c, b',' | b'}' | b']' | b' ' | b'\n' | b'\r' | b'\t') {
                    break;
                }
                i += 1;
            }
            i
        }
    }
}

/// Checks that `text` is one valid JSON document.
pub fn validate(text: &str) -> Result<(), ScanError> {
    let b = text.as_bytes();
    let end = value(b, skip_ws(b, 0), 0)?;
    trailing(b, end)
}

fn trailing(b: &[u8], end: usize) -> Result<(), ScanError> {
    let i = skip_ws(b, end);
    if i == b.len() {
        Ok(())
    } else {
        err(i, "trailing characters")
    }
}

/// A key without escapes borrowed, otherwise unescaped.
fn key_text(text: &str, start: usize, end: usize) -> Result<Cow<'_, str>, ScanError> {
    let inner = &text[start + 1..end - 1];
    if !inner.contains('\\') {
        return Ok(Cow::Borrowed(inner));
    }
    serde_json::from_str::<String>(&text[start..end])
        .map(Cow::Owned)
        .or_else(|_| err(start, "invalid key"))
}

#[inline]
fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while let Some(c) = b.get(i) {
        if !matches!(c, b' ' | b'\n' | b'\r' | b'\t') {
            break;
        }
        i += 1;
    }
    i
}

/// Validates the value starting at `i`; returns where it ends.
fn value(b: &[u8], i: usize, depth: usize) -> Result<usize, ScanError> {
    match b.get(i) {
        Some(b'"') => string(b, i),
        Some(b'{') => object(b, i, depth + 1),
        Some(b'[') => array(b, i, depth + 1),
        Some(b't') => literal(b, i, b"true"),
        Some(b'f') => literal(b, i, b"false"),
        Some(b'n') => literal(b, i, b"null"),
        Some(b'-' | b'0'..=b'9') => number(b, i),
        Some(_) => err(i, "expected a value"),
        None => err(i, "unexpected end"),
    }
}

fn literal(b: &[u8], i: usize, word: &[u8]) -> Result<usize, ScanError> {
    if b.get(i..i + word.len()) == Some(word) {
        Ok(i + word.len())
    } else {
        err(i, "invalid literal")
    }
}

fn object(b: &[u8], start: usize, depth: usize) -> Result<usize, ScanError> {
    if depth >= MAX_DEPTH {
        return err(start, "nesting too deep");
    }
    let mut i = skip_ws(b, start + 1);
    if b.get(i) == Some(&b'}') {
        return Ok(i + 1);
    }
    loop {
        if b.get(i) != Some(&b'"') {
            return err(i, "expected a key");
        }
        i = skip_ws(b, string(b, i)?);
        if b.get(i) != Some(&b':') {
            return err(i, "expected `:`");
        }
        i = skip_ws(b, value(b, skip_ws(b, i + 1), depth)?);
        match b.get(i) {
            Some(b',') => i = skip_ws(b, i + 1),
            Some(b'}') => return Ok(i + 1),
            _ => return err(i, "expected `,` or `}`"),
        }
    }
}

fn array(b: &[u8], start: usize, depth: usize) -> Result<usize, ScanError> {
    if depth >= MAX_DEPTH {
        return err(start, "nesting too deep");
    }
    let mut i = skip_ws(b, start + 1);
    if b.get(i) == Some(&b']') {
        return Ok(i + 1);
    }
    loop {
        i = skip_ws(b, value(b, i, depth)?);
        match b.get(i) {
            Some(b',') => i = skip_ws(b, i + 1),
            Some(b']') => return Ok(i + 1),
            _ => return err(i, "expected `,` or `]`"),
        }
    }
}

/// Validates the string starting at `start` (its opening quote); returns the index after
/// its closing quote.
fn string(b: &[u8], start: usize) -> Result<usize, ScanError> {
    let mut i = start + 1;
    loop {
        i = to_special(b, i);
        match b.get(i) {
            Some(b'"') => return Ok(i + 1),
            Some(b'\\') => i = escape(b, i)?,
            Some(_) => return err(i, "control character in a string"),
            None => return err(i, "unterminated string"),
        }
    }
}

/// The index of the first `"`, `\` or control character at or after `i` (`b.len()` if none).
/// Sixteen bytes at a time with SSE2 (part of every x86-64 CPU), eight elsewhere: strings are
/// most of a document's bytes.
#[inline]
fn to_special(b: &[u8], mut i: usize) -> usize {
    #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
    {
        use std::arch::x86_64::{
            _mm_cmpeq_epi8, _mm_loadu_si128, _mm_min_epu8, _mm_movemask_epi8, _mm_or_si128,
            _mm_set1_epi8,
        };
        while let Some(chunk) = b.get(i..i + 16) {
            // SAFETY: SSE2 is enabled in this build (the `cfg` above), and `chunk` is 16
            // bytes long: an unaligned load of them has no other requirement.
            let mask = unsafe {
                let x = _mm_loadu_si128(chunk.as_ptr().cast());
                // A byte is flagged when it is `"`, `\`, or at most 0x1f (unsigned:
                // min(x, 0x1f) is x).
                let found = _mm_or_si128(
                    _mm_or_si128(
                        _mm_cmpeq_epi8(x, _mm_set1_epi8(b'"' as i8)),
                        _mm_cmpeq_epi8(x, _mm_set1_epi8(b'\\' as i8)),
                    ),
                    _mm_cmpeq_epi8(_mm_min_epu8(x, _mm_set1_epi8(0x1f)), x),
                );
                _mm_movemask_epi8(found) as u32
            };
            if mask != 0 {
                return i + mask.trailing_zeros() as usize;
            }
            i += 16;
        }
    }
    const ONES: u64 = u64::MAX / 255;
    const HIGH: u64 = ONES << 7;
    while let Some(chunk) = b.get(i..i + 8) {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(chunk);
        let x = u64::from_le_bytes(bytes);
        // A byte is flagged when it is below 0x20, or equal to `"` or `\` (bit 7 of the
        // byte set in the result; bytes from 0x80 never flag).
        let control = x.wrapping_sub(ONES * 0x20) & !x;
        let q = x ^ (ONES * u64::from(b'"'));
        let quote = q.wrapping_sub(ONES) & !q;
        let bs = x ^ (ONES * u64::from(b'\\'));
        let backslash = bs.wrapping_sub(ONES) & !bs;
        let found = (control | quote | backslash) & HIGH;
        if found != 0 {
            return i + (found.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while let Some(c) = b.get(i) {
        if *c == b'"' || *c == b'\\' || *c < 0x20 {
            return i;
        }
        i += 1;
    }
    i
}

/// Validates the escape at `i` (its backslash); returns the index after it.
fn escape(b: &[u8], i: usize) -> Result<usize, ScanError> {
    match b.get(i + 1) {
        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => Ok(i + 2),
        Some(b'u') => {
            let unit = hex4(b, i + 2)?;
            match unit {
                0xD800..=0xDBFF => {
                    // A high surrogate must be followed by a low one.
                    if b.get(i + 6) == Some(&b'\\') && b.get(i + 7) == Some(&b'u') {
                        let low = hex4(b, i + 8)?;
                        if (0xDC00..=0xDFFF).contains(&low) {
                            return Ok(i + 12);
                        }
                    }
                    err(i, "lone surrogate in a \\u escape")
                }
                0xDC00..=0xDFFF => err(i, "lone surrogate in a \\u escape"),
                _ => Ok(i + 6),
            }
        }
        _ => err(i, "invalid escape"),
    }
}

fn hex4(b: &[u8], i: usize) -> Result<u16, ScanError> {
    let Some(digits) = b.get(i..i + 4) else {
        return err(i, "invalid \\u escape");
    };
    let mut n: u16 = 0;
    for d in digits {
        let v = match d {
            b'0'..=b'9' => d - b'0',
            b'a'..=b'f' => d - b'a' + 10,
            b'A'..=b'F' => d - b'A' + 10,
            _ => return err(i, "invalid \\u escape"),
        };
        n = n << 4 | u16::from(v);
    }
    Ok(n)
}

fn number(b: &[u8], start: usize) -> Result<usize, ScanError> {
    let mut i = start;
    if b.get(i) == Some(&b'-') {
        i += 1;
    }
    match b.get(i) {
        Some(b'0') => i += 1,
        Some(b'1'..=b'9') => i = digits(b, i),
        _ => return err(i, "invalid number"),
    }
    let mut exponent = false;
    if b.get(i) == Some(&b'.') {
        let end = digits(b, i + 1);
        if end == i + 1 {
            return err(i, "invalid number");
        }
        i = end;
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        exponent = true;
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        let end = digits(b, i);
        if end == i {
            return err(i, "invalid number");
        }
        i = end;
    }
    // Like serde_json, a number too large for a double is refused: only an exponent or more
    // than 300 digits can make one.
    if (exponent || i - start > 300) && !finite(&b[start..i]) {
        return err(start, "number out of range");
    }
    Ok(i)
}

fn finite(text: &[u8]) -> bool {
    std::str::from_utf8(text)
        .ok()
        .and_then(|t| t.parse::<f64>().ok())
        .is_some_and(f64::is_finite)
}

fn digits(b: &[u8], mut i: usize) -> usize {
    while matches!(b.get(i), Some(b'0'..=b'9')) {
        i += 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serde_ok(text: &str) -> bool {
        serde_json::from_str::<serde_json::Value>(text).is_ok()
    }

    #[test]
    fn fields_of_an_object() {
        let fields =
            object_fields(r#" { "a" : [1, {"x": "y"}], "b\u0041": "s\n", "c": -0.5e+3 } "#)
                .unwrap()
                .unwrap();
        let got: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (k.as_ref(), *v)).collect();
        assert_eq!(
            got,
            vec![
                ("a", r#"[1, {"x": "y"}]"#),
                ("bA", r#""s\n""#),
                ("c", "-0.5e+3")
            ]
        );
        // Opened again without validating: the same fields.
        let text = r#" { "a" : [1, {"x": "y]}"}], "b\u0041": "s\n\"", "c": -0.5e+3 , "d":{} } "#;
        assert_eq!(
            Some(fields_of_valid(text)),
            object_fields(text).unwrap(),
            "{text}"
        );
        assert_eq!(fields_of_valid("{}"), vec![]);
        assert_eq!(object_fields("[1]").unwrap(), None);
        assert_eq!(object_fields("{}").unwrap(), Some(vec![]));
    }

    #[test]
    fn agrees_with_serde_json_on_edge_cases() {
        for text in [
            "{}",
            "[]",
            "0",
            "-0",
            "01",
            "1.",
            ".5",
            "1e",
            "1e+",
            "1E-2",
            "-",
            "--1",
            "1.5e308",
            "1e309",
            "-1e400",
            "123456789012345678901234567890",
            "true",
            "tru",
            "nul",
            "null ",
            " null x",
            "\"a\"",
            "\"a",
            "\"\\u12\"",
            "\"\\ud800\"",
            "\"\\udc00\"",
            "\"\\ud800\\udc00\"",
            "\"\\ud800\\u0041\"",
            "\"\\x\"",
            "\"\u{1}\"",
            "\"\t\"",
            "[1,]",
            "[,1]",
            "{\"a\":1,}",
            "{\"a\" 1}",
            "{\"a\":}",
            "{1:2}",
            "{\"a\":1 \"b\":2}",
            "[1 2]",
            "[[[]]]",
            "",
            " ",
            "{\"a\":[1,{\"b\":null}],\"c\":\"\\\"\"}",
            "\"é\"",
        ] {
            assert_eq!(validate(text).is_ok(), serde_ok(text), "{text:?}");
        }
        let deep_ok = format!("{}{}", "[".repeat(127), "]".repeat(127));
        let deep_bad = format!("{}{}", "[".repeat(128), "]".repeat(128));
        assert!(validate(&deep_ok).is_ok());
        assert_eq!(validate(&deep_ok).is_ok(), serde_ok(&deep_ok));
        assert_eq!(validate(&deep_bad).is_ok(), serde_ok(&deep_bad));
    }

    /// Generated documents and mutations of them (bytes changed, removed, cut): the scanner
    /// and serde_json accept and refuse the same texts.
    #[test]
    fn agrees_with_serde_json_on_generated_and_mutated_documents() {
        let mut seed: u64 = 0x5eed_1234_abcd_0001;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        fn generate(next: &mut dyn FnMut() -> u64, depth: u32, out: &mut String) {
            let pick = next() % if depth > 3 { 6 } else { 8 };
            match pick {
                0 => out.push_str("null"),
                1 => out.push_str(if next().is_multiple_of(2) {
                    "true"
                } else {
                    "false"
                }),
                2 => out.push_str(&format!("{}", next() as i64 % 100_000)),
                3 => out.push_str(&format!(
                    "{}.{}e{}",
                    next() % 1000,
                    next() % 100,
                    next() % 20
                )),
                4 => out.push_str("\"plain text\""),
                5 => out.push_str(r#""esc \" \\ \n \u00e9 \ud83d\ude00 é""#),
                6 => {
                    out.push('[');
                    for i in 0..next() % 4 {
                        if i > 0 {
                            out.push_str(", ");
                        }
                        generate(next, depth + 1, out);
                    }
                    out.push(']');
                }
                _ => {
                    out.push('{');
                    for i in 0..next() % 4 {
                        if i > 0 {
                            out.push(',');
                        }
                        out.push_str(&format!("\"k{i}\" : "));
                        generate(next, depth + 1, out);
                    }
                    out.push('}');
                }
            }
        }
        // A valid object, and every object in its fields, opened without validating has the
        // fields the validating scan finds.
        fn opens_alike(text: &str, opened: &mut usize) {
            if !text.starts_with('{') {
                return;
            }
            let fields = object_fields(text).unwrap().unwrap();
            assert_eq!(fields_of_valid(text), fields, "{text}");
            *opened += 1;
            for (_, raw) in fields {
                opens_alike(raw, opened);
            }
        }
        let alphabet = b"{}[],:\"\\ 0123456789-+.eEtrufalsn\t\nxu";
        let mut checked = 0;
        let mut opened = 0;
        for _ in 0..3000 {
            let mut doc = String::new();
            generate(&mut next, 0, &mut doc);
            assert_eq!(validate(&doc).is_ok(), serde_ok(&doc), "{doc}");
            opens_alike(&doc, &mut opened);
            for _ in 0..8 {
                let mut bytes = doc.clone().into_bytes();
                if bytes.is_empty() {
                    break;
                }
                let at = (next() as usize) % bytes.len();
                match next() % 3 {
                    0 => bytes[at] = alphabet[(next() as usize) % alphabet.len()],
                    1 => {
                        bytes.remove(at);
                    }
                    _ => bytes.truncate(at),
                }
                let Ok(text) = String::from_utf8(bytes) else {
                    continue;
                };
                assert_eq!(validate(&text).is_ok(), serde_ok(&text), "{text}");
                assert_eq!(object_fields(&text).is_ok(), serde_ok(&text), "{text}");
                if let Ok(Some(fields)) = object_fields(&text) {
                    // Every raw field is itself valid JSON, and a nested object opened
                    // without validating again has the fields the validating scan finds.
                    for (_, raw) in fields {
                        assert!(serde_ok(raw), "{raw} in {text}");
                        opens_alike(raw, &mut opened);
                    }
                }
                checked += 1;
            }
        }
        assert!(checked > 10_000, "{checked}");
        assert!(opened > 500, "{opened}");
    }
}
