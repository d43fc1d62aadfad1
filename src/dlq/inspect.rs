//! `dlq inspect`: the dead-letter records of a topic as a table.

use super::{DeadLetter, DlqError, Filter};
use super::{H_FAILED_AT, H_KIND, H_MESSAGE, H_OFFSET, H_PARTITION, H_STAGE, H_TOPIC};
use std::sync::Arc;

use crate::codec::registry::{Format, Lookup};
use crate::codec::{Decoder, Registry, Value};
use crate::kafka::Cluster;
use crate::kafka::read::{read_to_end, reader};
use crate::topology::Codec;

fn shorten(bytes: Option<&[u8]>, max: usize) -> String {
    match bytes {
        None => "(null)".into(),
        Some(b) => {
            let text: String = String::from_utf8_lossy(b)
                .chars()
                .map(|c| if c.is_control() { ' ' } else { c })
                .collect();
            if text.chars().count() > max {
                format!("{}…", text.chars().take(max).collect::<String>())
            } else {
                text
            }
        }
    }
}

/// The decoders of payloads in the Confluent wire format, one per format, and the registry
/// that says which format an id is.
struct Framed {
    registry: Arc<Registry>,
    decoders: [(Format, Box<dyn Decoder>); 3],
}

impl Framed {
    fn new(registry: Arc<Registry>) -> Framed {
        let decoder = |codec| crate::codec::decoder_for(codec, &registry);
        Framed {
            decoders: [
                (Format::Avro, decoder(Codec::Avro)),
                (Format::Protobuf, decoder(Codec::Protobuf)),
                (Format::JsonSchema, decoder(Codec::JsonSchema)),
            ],
            registry,
        }
    }
}

/// A payload as shown: in the Confluent wire format, decoded with the registry when one is
/// given, as `<format>#<id> <document>` (`avro`, `protobuf`, `json`), or why it does not
/// decode; anything else as text.
fn payload(value: Option<&[u8]>, framed: Option<&Framed>, max: usize) -> String {
    let (Some(bytes), Some(framed)) = (value, framed) else {
        return shorten(value, max);
    };
    let Ok((id, _)) = crate::codec::registry::split_header(bytes) else {
        return shorten(value, max);
    };
    let format = match framed.registry.registered(id) {
        Ok(s) => s.format,
        Err(Lookup::Unknown(e) | Lookup::Unavailable(e)) => {
            return shorten(Some(format!("#{id} ({e})").as_bytes()), max);
        }
    };
    let label = match format {
        Format::Avro => "avro",
        Format::Protobuf => "protobuf",
        Format::JsonSchema => "json",
    };
    let Some((_, decoder)) = framed.decoders.iter().find(|(f, _)| *f == format) else {
        return shorten(value, max);
    };
    match decoder.decode(Some(bytes)) {
        Ok(Value::Json(Some(doc))) => shorten(
            Some(format!("{label}#{id} {}", doc.to_json()).as_bytes()),
            max,
        ),
        Ok(_) => shorten(value, max),
        Err(e) => shorten(Some(format!("{label}#{id} ({e})").as_bytes()), max),
    }
}

/// Prints the dead-letter records of `topic` as a table; with a `registry`, payloads in the
/// Confluent wire format decoded.
pub fn inspect(
    kafka: &Cluster,
    topic: &str,
    filter: &Filter,
    limit: usize,
    registry: Option<Arc<Registry>>,
    out: &mut dyn std::io::Write,
) -> Result<usize, DlqError> {
    let framed = registry.map(Framed::new);
    // A throwaway group: inspecting never moves anybody's offsets.
    let group = format!("onceflow.inspect.{}", std::process::id());
    let consumer = reader(kafka, &group)?;
    let mut shown = 0;
    writeln!(
        out,
        "{:<12} {:<24} {:<12} {:<28} {:<16} {:<40} payload",
        "at", "failed at (ms)", "kind", "origin", "stage", "message"
    )?;
    read_to_end(&consumer, topic, |msg| -> Result<(), DlqError> {
        let d = DeadLetter::from_message(msg);
        if shown < limit && filter.matches(&d) {
            shown += 1;
            writeln!(
                out,
                "{:<12} {:<24} {:<12} {:<28} {:<16} {:<40} {}",
                format!("{}@{}", d.partition, d.offset),
                d.meta(H_FAILED_AT),
                d.meta(H_KIND),
                format!(
                    "{}[{}]@{}",
                    d.meta(H_TOPIC),
                    d.meta(H_PARTITION),
                    d.meta(H_OFFSET)
                ),
                shorten(Some(d.meta(H_STAGE).as_bytes()), 16),
                shorten(Some(d.meta(H_MESSAGE).as_bytes()), 40),
                payload(d.value.as_deref(), framed.as_ref(), 60),
            )?;
        }
        Ok(())
    })?;
    Ok(shown)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_are_shortened_for_display() {
        assert_eq!(shorten(None, 5), "(null)");
        assert_eq!(shorten(Some(b"abc"), 5), "abc");
        assert_eq!(shorten(Some(b"abcdefgh"), 5), "abcde…");
        assert_eq!(shorten(Some(b"a\nb"), 5), "a b");
    }

    #[test]
    fn framed_payloads_are_shown_decoded_with_the_registry_by_their_format() {
        let registry = Registry::offline();
        let schema = apache_avro::Schema::parse_str(
            r#"{"type":"record","name":"R","fields":[{"name":"id","type":"long"}]}"#,
        )
        .unwrap();
        registry.add(4, schema).unwrap();
        registry.add_registered(
            6,
            crate::codec::registry::Registered::new(
                Format::Protobuf,
                "syntax = \"proto3\"; message M { int64 id = 1; }",
            ),
        );
        registry.add_registered(
            7,
            crate::codec::registry::Registered::new(Format::JsonSchema, "{}"),
        );
        let framed = Framed::new(Arc::new(registry));
        let frame = crate::codec::registry::frame;
        assert_eq!(
            payload(Some(&frame(4, &[0x54])), Some(&framed), 60), // id 42
            r#"avro#4 {"id":42}"#
        );
        assert_eq!(
            payload(Some(&frame(6, &[0, 0x08, 42])), Some(&framed), 60),
            r#"protobuf#6 {"id":42}"#
        );
        assert_eq!(
            payload(Some(&frame(7, br#"{"id":42}"#)), Some(&framed), 60),
            r#"json#7 {"id":42}"#
        );
        assert_eq!(
            payload(Some(&frame(5, &[0x54])), Some(&framed), 60),
            "#5 (schema id 5 is not known)"
        );
        assert_eq!(payload(Some(b"{\"a\":1}"), Some(&framed), 60), r#"{"a":1}"#);
        // Without a registry, bytes as text.
        assert_eq!(payload(Some(b"abc"), None, 60), "abc");
    }
}
