use std::sync::Arc;

use apache_avro::Schema;
use apache_avro::reader::datum::GenericDatumReader;
use apache_avro::types::Value as Avro;
use apache_avro::writer::datum::GenericDatumWriter;
use rand::{Rng, SeedableRng};
use serde_json::{Value as Json, json};

use super::*;
use crate::codec::json::Json as JsonCodec;

/// Ten fields of every kind a record carries, logical types included.
pub const ORDER: &str = r#"{
  "type": "record", "name": "Order", "namespace": "shop",
  "fields": [
    {"name": "id", "type": "long"},
    {"name": "customer", "type": "string"},
    {"name": "amount", "type": "double"},
    {"name": "quantity", "type": "int"},
    {"name": "paid", "type": "boolean"},
    {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID", "SHIPPED"]}},
    {"name": "coupon", "type": ["null", "string"], "default": null},
    {"name": "tags", "type": {"type": "array", "items": "string"}},
    {"name": "attributes", "type": {"type": "map", "values": "long"}},
    {"name": "placed_at", "type": {"type": "long", "logicalType": "timestamp-millis"}}
  ]
}"#;

pub(crate) fn schema(text: &str) -> Schema {
    Schema::parse_str(text).unwrap()
}

pub(crate) fn registry_with(id: u32, text: &str) -> Arc<Registry> {
    let r = Registry::offline();
    r.add(id, schema(text)).unwrap();
    Arc::new(r)
}

pub(crate) fn reference_encode(s: &Schema, v: Avro) -> Vec<u8> {
    GenericDatumWriter::builder(s)
        .build()
        .unwrap()
        .write_value_to_vec(v)
        .unwrap()
}

fn reference_decode(s: &Schema, bytes: &[u8]) -> Option<Avro> {
    let mut cursor = std::io::Cursor::new(bytes);
    let v = GenericDatumReader::builder(s)
        .build()
        .ok()?
        .read_value(&mut cursor)
        .ok()?;
    (cursor.position() as usize == bytes.len()).then_some(v)
}

pub(crate) fn order_value(id: i64) -> Avro {
    Avro::Record(vec![
        ("id".into(), Avro::Long(id)),
        ("customer".into(), Avro::String("ada".into())),
        ("amount".into(), Avro::Double(12.5)),
        ("quantity".into(), Avro::Int(3)),
        ("paid".into(), Avro::Boolean(true)),
        ("status".into(), Avro::Enum(1, "PAID".into())),
        (
            "coupon".into(),
            Avro::Union(1, Box::new(Avro::String("SPRING".into()))),
        ),
        (
            "tags".into(),
            Avro::Array(vec![Avro::String("a".into()), Avro::String("b".into())]),
        ),
        (
            "attributes".into(),
            Avro::Map([("weight".to_string(), Avro::Long(7))].into()),
        ),
        ("placed_at".into(), Avro::TimestampMillis(1_714_564_800_250)),
    ])
}

pub(crate) fn decode_json(decoder: &AvroDecoder, bytes: &[u8]) -> Result<Json, CodecError> {
    match decoder.decode(Some(bytes))? {
        Value::Json(Some(doc)) => Ok(doc.to_json()),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_record_decodes_to_the_document_expressions_see_and_encodes_back_to_the_same_bytes() {
    let s = schema(ORDER);
    let datum = reference_encode(&s, order_value(42));
    let decoder = AvroDecoder::new(registry_with(7, ORDER), None);
    let doc = decode_json(&decoder, &frame(7, &datum)).unwrap();
    assert_eq!(
        doc,
        json!({
            "id": 42, "customer": "ada", "amount": 12.5, "quantity": 3, "paid": true,
            "status": "PAID", "coupon": "SPRING", "tags": ["a", "b"],
            "attributes": {"weight": 7}, "placed_at": "2024-05-01T12:00:00.250Z"
        })
    );
    let given = Arc::new(Given::parse(&serde_json::from_str(ORDER).unwrap()).unwrap());
    let encoder = AvroEncoder::new(9, "orders-value".into(), given);
    let framed = frame(7, &datum);
    let value = decoder.decode(Some(&framed)).unwrap();
    assert_eq!(encoder.encode(&value, 0).unwrap(), Some(frame(9, &datum)));
    // The same document from JSON text encodes to the same bytes.
    let text = doc.to_string();
    let from_json = JsonCodec.decode(Some(text.as_bytes())).unwrap();
    assert_eq!(
        encoder.encode(&from_json, 0).unwrap(),
        Some(frame(9, &datum))
    );
    // And Avro in, JSON out.
    let out = JsonCodec.encode(&value, 0).unwrap().unwrap();
    assert_eq!(serde_json::from_slice::<Json>(&out).unwrap(), doc);
}

#[test]
fn logical_types_map_to_their_text_and_back() {
    let text = r#"{"type":"record","name":"L","fields":[
        {"name":"ts_us","type":{"type":"long","logicalType":"timestamp-micros"}},
        {"name":"local","type":{"type":"long","logicalType":"local-timestamp-millis"}},
        {"name":"day","type":{"type":"int","logicalType":"date"}},
        {"name":"time","type":{"type":"int","logicalType":"time-millis"}},
        {"name":"price","type":{"type":"bytes","logicalType":"decimal","precision":9,"scale":2}},
        {"name":"neg","type":{"type":"fixed","name":"D","size":4,"logicalType":"decimal","precision":6,"scale":3}},
        {"name":"uid","type":{"type":"string","logicalType":"uuid"}},
        {"name":"raw","type":"bytes"},
        {"name":"nan","type":"float"}
    ]}"#;
    let s = schema(text);
    let datum = reference_encode(
        &s,
        Avro::Record(vec![
            ("ts_us".into(), Avro::TimestampMicros(1_714_564_800_000_001)),
            ("local".into(), Avro::LocalTimestampMillis(0)),
            ("day".into(), Avro::Date(19_844)),
            ("time".into(), Avro::TimeMillis(45_296_789)),
            (
                "price".into(),
                Avro::Decimal(apache_avro::Decimal::from(vec![0x04, 0xe2])), // 1250, minimal
            ),
            (
                "neg".into(),
                Avro::Decimal(apache_avro::Decimal::from((-5i32).to_be_bytes().to_vec())),
            ),
            (
                "uid".into(),
                Avro::Uuid(uuid::Uuid::parse_str("67e55044-10b1-426f-9247-bb680e5fe0c8").unwrap()),
            ),
            ("raw".into(), Avro::Bytes(vec![0, 1, 2, 255])),
            ("nan".into(), Avro::Float(f32::NAN)),
        ]),
    );
    let decoder = AvroDecoder::new(registry_with(1, text), None);
    let doc = decode_json(&decoder, &frame(1, &datum)).unwrap();
    assert_eq!(
        doc,
        json!({
            "ts_us": "2024-05-01T12:00:00.000001Z", "local": "1970-01-01T00:00:00.000",
            "day": "2024-05-01", "time": "12:34:56.789", "price": "12.50", "neg": "-0.005",
            "uid": "67e55044-10b1-426f-9247-bb680e5fe0c8", "raw": "AAEC/w==", "nan": "NaN"
        })
    );
    let given = Arc::new(Given::parse(&serde_json::from_str(text).unwrap()).unwrap());
    let encoder = AvroEncoder::new(1, "l".into(), given);
    let framed = frame(1, &datum);
    let value = decoder.decode(Some(&framed)).unwrap();
    assert_eq!(encoder.encode(&value, 0).unwrap(), Some(frame(1, &datum)));
    // The plain forms a JSON input carries are taken too: numbers in the type's unit.
    let plain = json!({
        "ts_us": 1_714_564_800_000_001i64, "local": 0, "day": 19_844, "time": 45_296_789,
        "price": 12.5, "neg": "-0.005", "uid": "67e55044-10b1-426f-9247-bb680e5fe0c8",
        "raw": "AAEC/w==", "nan": "NaN"
    })
    .to_string();
    let from_json = JsonCodec.decode(Some(plain.as_bytes())).unwrap();
    assert_eq!(
        encoder.encode(&from_json, 0).unwrap(),
        Some(frame(1, &datum))
    );
}

#[test]
fn a_logical_value_its_text_cannot_show_stays_a_number_both_ways() {
    let text = r#"{"type":"record","name":"T","fields":[
        {"name":"at","type":{"type":"long","logicalType":"timestamp-millis"}},
        {"name":"time","type":{"type":"int","logicalType":"time-millis"}}]}"#;
    let datum = reference_encode(
        &schema(text),
        Avro::Record(vec![
            ("at".into(), Avro::TimestampMillis(87_707_076_674_976_555)),
            ("time".into(), Avro::TimeMillis(-5)),
        ]),
    );
    let compiled = Compiled::new(&schema(text)).unwrap();
    let doc = read::decode(&compiled, &datum).unwrap();
    assert_eq!(
        doc.to_json(),
        json!({"at": 87_707_076_674_976_555i64, "time": -5})
    );
    // Both go back as the numbers they were.
    let mut back = Vec::new();
    write::encode(&compiled, &doc, &mut back).unwrap();
    assert_eq!(back, datum);
}

fn reader_schema_case(reader: &str) -> Result<Json, CodecError> {
    let v1 = r#"{"type":"record","name":"Order","fields":[
        {"name":"id","type":"int"},
        {"name":"note","type":"string"}]}"#;
    let s = schema(v1);
    let datum = reference_encode(
        &s,
        Avro::Record(vec![
            ("id".into(), Avro::Int(5)),
            ("note".into(), Avro::String("gone".into())),
        ]),
    );
    let given = Given::parse(&serde_json::from_str(reader).unwrap()).unwrap();
    let decoder = AvroDecoder::new(registry_with(3, v1), Some(Arc::new(given)));
    decode_json(&decoder, &frame(3, &datum))
}

#[test]
fn a_reader_schema_resolves_added_removed_and_promoted_fields() {
    // id promoted int -> long, note removed, currency added with its default.
    let v2 = r#"{"type":"record","name":"Order","fields":[
        {"name":"id","type":"long"},
        {"name":"currency","type":"string","default":"EUR"}]}"#;
    assert_eq!(
        reader_schema_case(v2).unwrap(),
        json!({"id": 5, "currency": "EUR"})
    );
    // int promoted to double; a string read as bytes.
    let promoted = r#"{"type":"record","name":"Order","fields":[
        {"name":"id","type":"double"},
        {"name":"note","type":"bytes"}]}"#;
    assert_eq!(
        reader_schema_case(promoted).unwrap(),
        json!({"id": 5.0, "note": "Z29uZQ=="})
    );
    // A reader field without a default that the writer lacks: the reader cannot take it.
    let bad = r#"{"type":"record","name":"Order","fields":[
        {"name":"id","type":"long"},
        {"name":"currency","type":"string"}]}"#;
    let err = reader_schema_case(bad).unwrap_err();
    assert_eq!(err.kind, ErrorKind::SchemaMismatch, "{err}");
    assert!(err.message.contains("schema id 3"), "{err}");
}

#[test]
fn an_enum_symbol_the_reader_lacks_takes_the_readers_default() {
    let writer = r#"{"type":"record","name":"R","fields":[
        {"name":"s","type":{"type":"enum","name":"S","symbols":["A","B","NEW"]}}]}"#;
    let reader = r#"{"type":"record","name":"R","fields":[
        {"name":"s","type":{"type":"enum","name":"S","symbols":["A","B","OTHER"],"default":"OTHER"}}]}"#;
    let datum = reference_encode(
        &schema(writer),
        Avro::Record(vec![("s".into(), Avro::Enum(2, "NEW".into()))]),
    );
    let given = Given::parse(&serde_json::from_str(reader).unwrap()).unwrap();
    let decoder = AvroDecoder::new(registry_with(2, writer), Some(Arc::new(given)));
    assert_eq!(
        decode_json(&decoder, &frame(2, &datum)).unwrap(),
        json!({"s": "OTHER"})
    );
}

#[test]
fn an_array_or_map_at_the_end_of_a_record_reads_whatever_its_length() {
    // Each block's count against the bytes left, not the items read so far: a record that
    // ends with a non-empty array or map has fewer bytes after it than items before it.
    for (text, datum, expected) in [
        (
            r#"{"type":"record","name":"R","fields":[{"name":"tags","type":{"type":"array","items":"string"}}]}"#,
            vec![2, 2, 97, 0],
            json!({"tags": ["a"]}),
        ),
        (
            r#"{"type":"record","name":"R","fields":[{"name":"tags","type":{"type":"array","items":"string"}},{"name":"n","type":"int"}]}"#,
            vec![4, 2, 97, 2, 98, 0, 2],
            json!({"tags": ["a", "b"], "n": 1}),
        ),
        (
            r#"{"type":"record","name":"R","fields":[{"name":"m","type":{"type":"map","values":"int"}}]}"#,
            vec![2, 2, 107, 2, 0],
            json!({"m": {"k": 1}}),
        ),
    ] {
        let compiled = Compiled::new(&schema(text)).unwrap();
        assert_eq!(
            read::decode(&compiled, &datum).unwrap().to_json(),
            expected,
            "{text}"
        );
        assert!(reference_decode(&schema(text), &datum).is_some());
    }
}

#[test]
fn bad_values_are_bad_avro_or_unknown_schema_with_a_precise_reason() {
    let decoder = AvroDecoder::new(registry_with(7, ORDER), None);
    let datum = reference_encode(&schema(ORDER), order_value(1));
    let cases: Vec<(Vec<u8>, ErrorKind, &str)> = vec![
        (
            b"{\"id\":1}".to_vec(),
            ErrorKind::BadAvro,
            "not the magic byte 0",
        ),
        (
            vec![0, 0, 0],
            ErrorKind::BadAvro,
            "shorter than the 5-byte header",
        ),
        (frame(8, &datum), ErrorKind::UnknownSchema, "schema id 8"),
        (
            frame(7, &datum[..datum.len() - 3]),
            ErrorKind::BadAvro,
            "truncated",
        ),
        (
            frame(7, &[datum.as_slice(), &[1, 2]].concat()),
            ErrorKind::BadAvro,
            "2 byte(s) left over after the record",
        ),
        (
            // id (1 byte), customer (4), amount (8), quantity (1), paid (1): then `status`,
            // here index 9 (zig-zag 18) of 3 symbols.
            frame(7, &{
                let mut d = datum.clone();
                d[15] = 18;
                d
            }),
            ErrorKind::BadAvro,
            "at `status`: enum index 9 of 3 symbols",
        ),
    ];
    for (bytes, kind, reason) in cases {
        let err = decoder.decode(Some(&bytes)).unwrap_err();
        assert_eq!(err.kind, kind, "{err}");
        assert!(err.message.contains(reason), "{reason:?} not in {err}");
    }
    // A tombstone is no value, not an error.
    assert!(matches!(decoder.decode(None), Ok(Value::Json(None))));
}

#[test]
fn a_record_that_does_not_fit_the_output_schema_names_the_field_path() {
    let given = Arc::new(Given::parse(&serde_json::from_str(ORDER).unwrap()).unwrap());
    let encoder = AvroEncoder::new(1, "orders-value".into(), given);
    let base = json!({
        "id": 1, "customer": "ada", "amount": 1.0, "quantity": 1, "paid": false,
        "status": "NEW", "tags": [], "attributes": {}, "placed_at": 0
    });
    let fails = |change: &dyn Fn(&mut Json), expected: &str| {
        let mut v = base.clone();
        change(&mut v);
        let text = v.to_string();
        let value = JsonCodec.decode(Some(text.as_bytes())).unwrap();
        let err = encoder.encode(&value, 0).unwrap_err();
        assert_eq!(err.kind, ErrorKind::SchemaMismatch, "{err}");
        assert!(err.message.contains(expected), "{expected:?} not in {err}");
    };
    // The base fits (the nullable coupon may be left out).
    let text = base.to_string();
    encoder
        .encode(&JsonCodec.decode(Some(text.as_bytes())).unwrap(), 0)
        .unwrap();
    fails(
        &|v| {
            v.as_object_mut().unwrap().remove("customer");
        },
        "at `customer`: missing: shop.Order requires it",
    );
    fails(
        &|v| v["quantity"] = json!("three"),
        "at `quantity`: the string \"three\" does not fit int",
    );
    fails(
        &|v| v["quantity"] = json!(3_000_000_000i64),
        "at `quantity`: the number 3000000000 does not fit int",
    );
    fails(
        &|v| v["status"] = json!("LOST"),
        "at `status`: `LOST` is not a symbol of enum shop.Status (NEW, PAID, SHIPPED)",
    );
    fails(
        &|v| v["tags"] = json!(["a", 2]),
        "at `tags[1]`: the number 2 does not fit string",
    );
    fails(
        &|v| v["attributes"] = json!({"w": "x"}),
        "at `attributes.w`",
    );
    fails(
        &|v| v["extra"] = json!(1),
        "at `extra`: not a field of shop.Order",
    );
}

// --- The property test: random and mutated bytes --------------------------------------------

/// `ORDER` with its map and array last (in that order): containers followed by few bytes,
/// or none.
fn order_tail() -> String {
    let mut json: Json = serde_json::from_str(ORDER).unwrap();
    let fields = json["fields"].as_array_mut().unwrap();
    for name in ["attributes", "tags"] {
        let at = fields.iter().position(|f| f["name"] == name).unwrap();
        let field = fields.remove(at);
        fields.push(field);
    }
    json.to_string()
}

/// `value` (a record of `ORDER`'s fields) with its fields in the order of [`order_tail`].
fn tail_order(value: Avro) -> Avro {
    let Avro::Record(mut fields) = value else {
        return value;
    };
    let order = [
        "id",
        "customer",
        "amount",
        "quantity",
        "paid",
        "status",
        "coupon",
        "placed_at",
        "attributes",
        "tags",
    ];
    fields.sort_by_key(|(name, _)| order.iter().position(|n| n == name));
    Avro::Record(fields)
}

/// A random value of `schema`'s shape, for the reference writer.
fn random_order(rng: &mut impl Rng) -> Avro {
    let word = |rng: &mut dyn rand::RngCore| -> String {
        let n = rng.random_range(0..12);
        (0..n)
            .map(|_| char::from_u32(rng.random_range(32..0x2FF)).unwrap_or('x'))
            .collect()
    };
    Avro::Record(vec![
        ("id".into(), Avro::Long(rng.random())),
        ("customer".into(), Avro::String(word(rng))),
        ("amount".into(), Avro::Double(rng.random_range(-1e9..1e9))),
        ("quantity".into(), Avro::Int(rng.random())),
        ("paid".into(), Avro::Boolean(rng.random())),
        ("status".into(), {
            let i = rng.random_range(0..3u32);
            Avro::Enum(i, ["NEW", "PAID", "SHIPPED"][i as usize].into())
        }),
        (
            "coupon".into(),
            if rng.random() {
                Avro::Union(0, Box::new(Avro::Null))
            } else {
                Avro::Union(1, Box::new(Avro::String(word(rng))))
            },
        ),
        (
            "tags".into(),
            Avro::Array(
                (0..rng.random_range(0..4))
                    .map(|_| Avro::String(word(rng)))
                    .collect(),
            ),
        ),
        (
            "attributes".into(),
            Avro::Map(
                (0..rng.random_range(0..4))
                    .map(|_| (word(rng), Avro::Long(rng.random())))
                    .collect(),
            ),
        ),
        (
            "placed_at".into(),
            Avro::TimestampMillis(rng.random_range(-10_000_000_000_000..10_000_000_000_000)),
        ),
    ])
}

/// The same datum: `==`, except for floating-point numbers, which compare bit for bit (so
/// `-0.0` is not `0.0`), and a NaN, which is the same as any NaN: `==` finds a NaN unequal to
/// itself, and the decoded document holds every NaN as the text `NaN` (read.rs), so its sign
/// and payload bits do not survive a round trip.
fn same(a: &Avro, b: &Avro) -> bool {
    let float = |x: f64, y: f64| (x.is_nan() && y.is_nan()) || x.to_bits() == y.to_bits();
    match (a, b) {
        (Avro::Double(x), Avro::Double(y)) => float(*x, *y),
        (Avro::Float(x), Avro::Float(y)) => float(f64::from(*x), f64::from(*y)),
        (Avro::Record(x), Avro::Record(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|((n, v), (m, w))| n == m && same(v, w))
        }
        (Avro::Array(x), Avro::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(v, w)| same(v, w))
        }
        (Avro::Map(x), Avro::Map(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        (Avro::Union(i, v), Avro::Union(j, w)) => i == j && same(v, w),
        _ => a == b,
    }
}

/// Random bytes, or a valid datum with a few bytes changed, cut or added.
fn random_bytes(rng: &mut impl Rng, s: &Schema, tail: bool) -> Vec<u8> {
    if rng.random_range(0..4) == 0 {
        return (0..rng.random_range(0..64)).map(|_| rng.random()).collect();
    }
    let value = random_order(rng);
    let mut d = reference_encode(s, if tail { tail_order(value) } else { value });
    match rng.random_range(0..5) {
        0 => {}
        1 => {
            let cut = rng.random_range(0..=d.len());
            d.truncate(cut);
        }
        2 => d.push(rng.random()),
        _ => {
            for _ in 0..rng.random_range(1..4) {
                let i = rng.random_range(0..d.len());
                d[i] = rng.random();
            }
        }
    }
    d
}

/// Runs `cases` random inputs through the decoder: it never panics, and it agrees with
/// apache-avro's reader: it accepts exactly the datums apache-avro reads in full (and not a
/// byte more), and the value it reads, written back, is apache-avro's value.
pub fn property_run(cases: u64, seed: u64) -> (u64, u64) {
    let schemas: Vec<(Schema, Compiled, Given)> = [ORDER.to_string(), order_tail()]
        .iter()
        .map(|text| {
            let s = schema(text);
            let c = Compiled::new(&s).unwrap();
            (
                s,
                c,
                Given::parse(&serde_json::from_str(text).unwrap()).unwrap(),
            )
        })
        .collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let (mut accepted, mut refused) = (0, 0);
    for case in 0..cases {
        let tail = case % 2 == 1;
        let (s, compiled, encoder) = &schemas[usize::from(tail)];
        let (s, compiled) = (s, compiled);
        let bytes = random_bytes(&mut rng, s, tail);
        let ours = read::decode(compiled, &bytes);
        let reference = reference_decode(s, &bytes);
        match (ours, reference) {
            (Ok(doc), Some(expected)) => {
                accepted += 1;
                let mut back = Vec::new();
                write::encode(&encoder.compiled, &doc, &mut back)
                    .unwrap_or_else(|e| panic!("case {case}: {bytes:?}: cannot write back: {e}"));
                let again = reference_decode(s, &back);
                assert!(
                    again.as_ref().is_some_and(|v| same(v, &expected)),
                    "case {case}: {bytes:?}: written back as {again:?}, apache-avro read {expected:?}"
                );
            }
            (Err(_), None) => refused += 1,
            (Ok(doc), None) => panic!(
                "case {case}: {bytes:?} read as {:?}, apache-avro refuses it",
                doc.to_json()
            ),
            (Err(e), Some(v)) => {
                panic!("case {case}: {bytes:?} refused ({e}), apache-avro reads {v:?}")
            }
        }
    }
    (accepted, refused)
}

#[test]
fn a_nan_reads_as_the_text_nan_and_writes_back_as_a_nan() {
    let s = schema(ORDER);
    let c = Compiled::new(&s).unwrap();
    let given = Given::parse(&serde_json::from_str(ORDER).unwrap()).unwrap();
    // A NaN with its sign bit and a payload, as random bytes make one.
    let odd_nan = f64::from_bits(0xfff8_0000_dead_beef);
    let Avro::Record(mut fields) = order_value(1) else {
        unreachable!()
    };
    fields[2].1 = Avro::Double(odd_nan);
    let datum = reference_encode(&s, Avro::Record(fields));
    let doc = read::decode(&c, &datum).unwrap();
    assert_eq!(doc.to_json()["amount"], json!("NaN"));
    let mut back = Vec::new();
    write::encode(&given.compiled, &doc, &mut back).unwrap();
    let Some(Avro::Record(fields)) = reference_decode(&s, &back) else {
        panic!("apache-avro cannot read it written back")
    };
    assert!(matches!(fields[2].1, Avro::Double(x) if x.is_nan()));
    assert!(!same(&Avro::Double(odd_nan), &Avro::Double(1.0)));
    assert!(same(&Avro::Double(odd_nan), &Avro::Double(f64::NAN)));
    assert!(!same(&Avro::Double(-0.0), &Avro::Double(0.0)));
}

#[test]
fn random_and_mutated_bytes_never_panic_and_agree_with_apache_avro() {
    let cases = std::env::var("ONCEFLOW_AVRO_PROPERTY_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let seed = std::env::var("ONCEFLOW_AVRO_PROPERTY_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("seed {seed} (ONCEFLOW_AVRO_PROPERTY_SEED to run it again)");
    let (accepted, refused) = property_run(cases, seed);
    // Both kinds of input are met, so the test can fail either way.
    assert!(
        accepted > cases / 10 && refused > cases / 10,
        "{accepted} / {refused}"
    );
}
