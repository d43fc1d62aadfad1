//! Throughput of the Avro codec (src/codec/avro) on one core, on a record of ten fields of
//! every kind (the `ORDER` schema of the codec's tests: long, string, double, int, boolean,
//! enum, nullable string, array of strings, map of longs, timestamp-millis), next to
//! apache-avro's generic path, and a pipeline reading and writing Avro next to the same
//! pipeline on JSON.
//!
//! ```sh
//! cargo bench --bench avro_codec                       # 5 rounds of 2 s per variant
//! ONCEFLOW_BENCH_ROUNDS=9 ONCEFLOW_BENCH_SECS=3 cargo bench --bench avro_codec
//! ```
//!
//! Target: decode + encode of the record at 1,000,000 records/s or more on one core, after
//! warm-up. Figures are kept in docs/benchmarks.md ("Avro codec").
//!
//! Variants, each over the same 1,000 records in the Confluent wire format:
//!
//! * `decode`: [`AvroDecoder::decode`] of the framed value, the document then dropped.
//! * `decode, reader schema`: the same with a reader schema that adds a field with a default,
//!   so that every value is resolved from the writer's schema to the reader's.
//! * `encode`: [`AvroEncoder::encode`] of an already decoded value, framed.
//! * `decode + encode`: both, the value decoded and written back (framed with the output's id).
//! * `apache-avro decode`, `apache-avro decode + encode`: apache-avro's generic path, a
//!   `GenericDatumReader` (and `GenericDatumWriter`) built once, the datum read to
//!   `apache_avro::types::Value` and written back with the writer's defaults (validation on).
//! * `pipeline, Avro`: `Pipeline::process` (each record cloned first, as the engine does) with
//!   a filter, a map of two computed fields and a set_key, Avro in and Avro out.
//! * `pipeline, JSON`: the same pipeline over the same records as JSON text, JSON out.
//! * The breakdown, where the time of decode + encode goes: `read::decode` alone (no header,
//!   no schema look-up), and with `placed_at` or `status` read as their plain types (the same
//!   bytes); `read::timestamp_text` alone; `write::encode` alone, with `placed_at` as text or
//!   as its number; the framing; and resolution's two halves (apache-avro's resolving reader
//!   and writer built, which resolution does per record, and the rest with them built once).
//!
//! Each round measures every variant for `ONCEFLOW_BENCH_SECS` (default 2; the breakdown a
//! quarter of it) after a warm-up of 0.5 s (0.25 s) that is not counted, the order reversed
//! every other round; `ONCEFLOW_BENCH_ROUNDS`
//! (default 5) rounds. Rates are reported as the median and min-max over the rounds, ratios
//! computed per round (paired) as the median and min-max. Under `cargo test` (no `--bench`
//! argument) it checks every variant's output and runs one short round as a smoke test.

#[path = "support/rounds.rs"]
mod rounds;

use rounds::{env_f64, load, rate, spread};
use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

// The same allocator as the `onceflow` binary.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use apache_avro::Schema;
use apache_avro::reader::datum::GenericDatumReader;
use apache_avro::types::Value as Avro;
use apache_avro::writer::datum::GenericDatumWriter;
use onceflow::codec::avro::schema::Compiled;
use onceflow::codec::avro::{
    AvroDecoder, AvroEncoder, Given, Registry, frame, read, split_header, write,
};
use onceflow::codec::json::Doc;
use onceflow::codec::{Decoder, Encoder, Value};
use onceflow::record::{Origin, Record};
use onceflow::topology::Topology;
use onceflow::transform::Pipeline;
use serde_json::{Value as Json, json};

/// The writer's schema: the `ORDER` schema of src/codec/avro/tests.rs.
const ORDER: &str = r#"{
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

/// The schema id the input records are framed with.
const WRITER_ID: u32 = 42;

/// The same pipeline for both codecs: `{input}` and `{output}` are each codec's settings.
const PIPELINE: &str = r#"
pipeline:
  - filter: 'value.amount > 0.0 && value.customer != "test"'
  - map:
      total: 'value.amount * double(value.quantity)'
      customer_upper: 'value.customer.upperAscii()'
  - set_key: 'string(value.id)'
"#;

/// `ORDER` with its fields changed by `change`, as compact JSON text.
fn order_schema_with(change: impl FnOnce(&mut Json)) -> String {
    let mut schema: Json = serde_json::from_str(ORDER).expect("ORDER is JSON");
    change(&mut schema);
    schema.to_string()
}

fn add_fields(schema: &mut Json, fields: Json) {
    let list = schema["fields"].as_array_mut().expect("fields");
    list.extend(
        fields
            .as_array()
            .expect("an array of fields")
            .iter()
            .cloned(),
    );
}

/// The reader schema of the resolution variant: `ORDER` and a field with a default.
fn reader_schema() -> String {
    order_schema_with(|s| {
        add_fields(
            s,
            json!([{"name": "channel", "type": "string", "default": "web"}]),
        );
    })
}

/// The output schema of the Avro pipeline: `ORDER` and the two fields the map computes.
fn output_schema() -> String {
    order_schema_with(|s| {
        s["name"] = json!("OrderOut");
        add_fields(
            s,
            json!([
                {"name": "total", "type": "double"},
                {"name": "customer_upper", "type": "string"}
            ]),
        );
    })
}

fn avro_topology() -> String {
    // The registry is never called: the compiled pipeline's registry is offline.
    format!(
        "name: bench\nschema_registry: {{url: \"http://127.0.0.1:1\"}}\n\
         inputs: [{{topic: orders, codec: avro}}]\n{PIPELINE}\
         outputs: [{{topic: out, codec: avro, avro: {{schema: '{}'}}}}]\n",
        output_schema()
    )
}

fn json_topology() -> String {
    format!(
        "name: bench\ninputs: [{{topic: orders, codec: json}}]\n{PIPELINE}\
         outputs: [{{topic: out, codec: json}}]\n"
    )
}

/// Order `n`, varied: ids of 1 to 5 bytes, a coupon or none, 0 to 3 tags and attributes.
fn order(n: u64) -> Avro {
    let status = (n % 3) as u32;
    Avro::Record(vec![
        ("id".into(), Avro::Long((n * 7919 + n % 100) as i64)),
        (
            "customer".into(),
            Avro::String(format!("customer-{}", n % 500)),
        ),
        ("amount".into(), Avro::Double(9.99 + (n % 1000) as f64)),
        ("quantity".into(), Avro::Int(1 + (n % 9) as i32)),
        ("paid".into(), Avro::Boolean(!n.is_multiple_of(5))),
        (
            "status".into(),
            Avro::Enum(status, ["NEW", "PAID", "SHIPPED"][status as usize].into()),
        ),
        (
            "coupon".into(),
            if n.is_multiple_of(4) {
                Avro::Union(0, Box::new(Avro::Null))
            } else {
                Avro::Union(1, Box::new(Avro::String(format!("SPRING{}", n % 10))))
            },
        ),
        (
            "tags".into(),
            Avro::Array(
                (0..n % 4)
                    .map(|i| Avro::String(format!("tag-{i}")))
                    .collect(),
            ),
        ),
        (
            "attributes".into(),
            Avro::Map(
                ["weight", "size", "priority"]
                    .iter()
                    .take((n % 4) as usize)
                    .map(|k| (k.to_string(), Avro::Long((n % 1000) as i64)))
                    .collect(),
            ),
        ),
        (
            "placed_at".into(),
            Avro::TimestampMillis(1_714_564_800_000 + (n * 1_003) as i64),
        ),
    ])
}

fn record(n: usize, value: Vec<u8>) -> Record {
    Record {
        key: Some(n.to_string().into_bytes()),
        value: Some(value),
        headers: vec![("source".into(), b"web".to_vec())],
        timestamp: Some(1_700_000_000_000),
        origin: Origin {
            topic: "orders".into(),
            partition: 0,
            offset: n as i64,
        },
    }
}

/// The document a decoded value holds, as JSON.
fn json_of(value: &Value<'_>) -> Json {
    match value {
        Value::Json(Some(doc)) => doc.to_json(),
        other => panic!("not a document: {other:?}"),
    }
}

/// Everything the variants share.
struct Setup {
    schema: Schema,
    /// The records as framed Avro values, and as the JSON text of the same documents.
    frames: Vec<Vec<u8>>,
    texts: Vec<Vec<u8>>,
    decoder: AvroDecoder,
    /// The reader schema of `resolving`.
    reader: Arc<Given>,
    resolving: AvroDecoder,
    encoder: AvroEncoder,
    avro_pipeline: Pipeline,
    json_pipeline: Pipeline,
    avro_records: Vec<Record>,
    json_records: Vec<Record>,
}

fn setup(count: u64) -> Setup {
    let schema = Schema::parse_str(ORDER).expect("ORDER parses");
    let writer = GenericDatumWriter::builder(&schema)
        .build()
        .expect("a writer of ORDER");
    let frames: Vec<Vec<u8>> = (0..count)
        .map(|n| {
            let datum = writer.write_value_to_vec(order(n)).expect("an order datum");
            frame(WRITER_ID, &datum)
        })
        .collect();
    let registry = Arc::new(Registry::offline());
    registry
        .add(WRITER_ID, schema.clone())
        .expect("ORDER compiles");
    let decoder = AvroDecoder::new(Arc::clone(&registry), None);
    let reader = Given::parse(&serde_json::from_str(&reader_schema()).expect("reader JSON"))
        .expect("the reader schema");
    let reader = Arc::new(reader);
    let resolving = AvroDecoder::new(Arc::clone(&registry), Some(Arc::clone(&reader)));
    let given = Given::parse(&serde_json::from_str(ORDER).expect("ORDER is JSON")).expect("ORDER");
    let encoder = AvroEncoder::new(7, "orders-value".into(), Arc::new(given));
    let texts: Vec<Vec<u8>> = frames
        .iter()
        .map(|f| {
            let value = decoder.decode(Some(f)).expect("decode");
            json_of(&value).to_string().into_bytes()
        })
        .collect();

    let avro = Topology::parse(&avro_topology(), "bench").expect("the Avro topology");
    let avro_pipeline = Pipeline::compile(&avro).expect("the Avro pipeline");
    avro_pipeline
        .registry()
        .add(WRITER_ID, schema.clone())
        .expect("ORDER compiles");
    let json = Topology::parse(&json_topology(), "bench").expect("the JSON topology");
    let json_pipeline = Pipeline::compile(&json).expect("the JSON pipeline");
    let avro_records = frames
        .iter()
        .enumerate()
        .map(|(n, f)| record(n, f.clone()))
        .collect();
    let json_records = texts
        .iter()
        .enumerate()
        .map(|(n, t)| record(n, t.clone()))
        .collect();
    Setup {
        schema,
        frames,
        texts,
        decoder,
        reader,
        resolving,
        encoder,
        avro_pipeline,
        json_pipeline,
        avro_records,
        json_records,
    }
}

/// apache-avro's generic path: the datum read to a `Value` and written back, framed.
fn apache_round_trip(
    reader: &GenericDatumReader<'_>,
    writer: &GenericDatumWriter<'_>,
    framed: &[u8],
) -> Vec<u8> {
    let (id, mut datum) = split_header(framed).expect("a framed value");
    let value = reader.read_value(&mut datum).expect("apache-avro reads it");
    assert!(datum.is_empty(), "bytes left over");
    let mut out = Vec::with_capacity(framed.len());
    out.push(0);
    out.extend_from_slice(&id.to_be_bytes());
    writer
        .write_value_ref(&mut out, &value)
        .expect("apache-avro writes it");
    out
}

/// Every variant does what it should: the codec writes back the bytes it read, as
/// apache-avro does; the reader schema adds its default; both pipelines give one record per
/// input, re-keyed, with the two computed fields, the Avro one decoding to the JSON one's
/// document.
fn check(s: &Setup) {
    let reader = GenericDatumReader::builder(&s.schema)
        .build()
        .expect("a reader");
    let writer = GenericDatumWriter::builder(&s.schema)
        .build()
        .expect("a writer");
    let out_decoder = AvroDecoder::new(Arc::clone(s.avro_pipeline.registry()), None);
    let (mut avro_out, mut json_out) = (Vec::new(), Vec::new());
    for (n, framed) in s.frames.iter().enumerate() {
        // Written back by the codec and by apache-avro, each reads as the original does
        // (maps may come out in another order: apache-avro's are hash maps).
        let read = |bytes: &[u8]| {
            let (id, mut d) = split_header(bytes).expect("framed");
            let v = reader.read_value(&mut d).expect("apache-avro reads it");
            assert!(d.is_empty(), "record {n}: bytes left over");
            (id, v)
        };
        let original = read(framed).1;
        let value = s.decoder.decode(Some(framed)).expect("decode");
        let encoded = s.encoder.encode(&value, framed.len()).expect("encode");
        let encoded = encoded.expect("a value");
        assert_eq!(encoded.len(), framed.len(), "record {n} written back");
        assert_eq!(
            read(&encoded),
            (7, original.clone()),
            "record {n} written back"
        );
        let back = apache_round_trip(&reader, &writer, framed);
        assert_eq!(back.len(), framed.len(), "record {n} through apache-avro");
        assert_eq!(
            read(&back),
            (WRITER_ID, original),
            "record {n} through apache-avro"
        );

        let plain = json_of(&value);
        let mut resolved = json_of(&s.resolving.decode(Some(framed)).expect("resolve"));
        assert_eq!(
            resolved["channel"], "web",
            "record {n}: the reader's default"
        );
        resolved
            .as_object_mut()
            .expect("an object")
            .remove("channel");
        assert_eq!(resolved, plain, "record {n} resolved");

        avro_out.clear();
        json_out.clear();
        s.avro_pipeline
            .process(s.avro_records[n].clone(), &mut avro_out)
            .expect("the Avro pipeline");
        s.json_pipeline
            .process(s.json_records[n].clone(), &mut json_out)
            .expect("the JSON pipeline");
        assert_eq!((avro_out.len(), json_out.len()), (1, 1), "record {n}");
        let (a, j) = (&avro_out[0].1, &json_out[0].1);
        let id = plain["id"].to_string();
        assert_eq!(a.key.as_deref(), Some(id.as_bytes()), "record {n}: key");
        assert_eq!(j.key.as_deref(), Some(id.as_bytes()), "record {n}: key");
        let from_avro = json_of(&out_decoder.decode(a.value.as_deref()).expect("Avro out"));
        // Both compared as JSON text read back by the same parser (serde_json's default one
        // may read a float one unit in the last place away from the text's value).
        let from_json: Json =
            serde_json::from_slice(j.value.as_deref().expect("a value")).expect("JSON out");
        let avro_as_text: Json = serde_json::from_str(&from_avro.to_string()).expect("JSON text");
        assert_eq!(avro_as_text, from_json, "record {n}: Avro and JSON outputs");
        let amount = plain["amount"].as_f64().expect("amount");
        let quantity = plain["quantity"].as_f64().expect("quantity");
        assert_eq!(from_avro["total"].as_f64(), Some(amount * quantity));
        let upper = plain["customer"].as_str().expect("customer").to_uppercase();
        assert_eq!(from_avro["customer_upper"].as_str(), Some(upper.as_str()));
    }
}

const DECODE: usize = 0;
const APACHE_DECODE: usize = 1;
const RESOLVE: usize = 2;
const ROUND_TRIP: usize = 3;
const APACHE_ROUND_TRIP: usize = 4;
const ENCODE: usize = 5;
const AVRO_PIPELINE: usize = 6;
const JSON_PIPELINE: usize = 7;
// Where the time of decode + encode goes: the codec's parts, each alone.
const READ: usize = 8;
const READ_LONG: usize = 9;
const READ_PLAIN: usize = 10;
const TIMESTAMP_TEXT: usize = 11;
const WRITE: usize = 12;
const WRITE_NUMBER: usize = 13;
const FRAMING: usize = 14;
const RESOLVE_BUILD: usize = 15;
const RESOLVE_BUILT: usize = 16;
/// The variants from here on are the breakdown, measured for a quarter as long.
const BREAKDOWN: usize = READ;

const NAMES: [&str; 17] = [
    "decode",
    "apache-avro decode",
    "decode, reader schema (resolved)",
    "decode + encode",
    "apache-avro decode + encode",
    "encode",
    "pipeline, Avro in and out",
    "pipeline, JSON in and out",
    "`read::decode` alone (no header, no schema look-up)",
    "`read::decode`, `placed_at` read as a plain long (no timestamp text)",
    "`read::decode`, and `status` as a plain int (no enum symbol)",
    "`read::timestamp_text` alone (one timestamp-millis to text)",
    "`write::encode` alone, into a reused buffer",
    "`write::encode`, `placed_at` given as a number (no timestamp parse)",
    "framing alone (`split_header`, then `frame` of the datum)",
    "resolution: apache-avro's resolving reader and writer built (done per record now)",
    "resolution: the rest, with that reader and writer built once",
];

/// Paired ratios: (name, numerator, denominator).
const RATIOS: [(&str, usize, usize); 4] = [
    (
        "decode + encode / apache-avro decode + encode",
        ROUND_TRIP,
        APACHE_ROUND_TRIP,
    ),
    ("decode / apache-avro decode", DECODE, APACHE_DECODE),
    ("decode, reader schema / decode", RESOLVE, DECODE),
    ("pipeline: Avro / JSON", AVRO_PIPELINE, JSON_PIPELINE),
];

/// `ORDER` compiled with some fields read as their plain types (the same bytes).
fn compiled_plain(timestamp: bool, status: bool) -> Compiled {
    let text = order_schema_with(|s| {
        if timestamp {
            s["fields"][9]["type"] = json!("long");
        }
        if status {
            s["fields"][5]["type"] = json!("int");
        }
    });
    Compiled::new(&Schema::parse_str(&text).expect("a plain ORDER")).expect("compiles")
}

/// `schema` without its logical types, as the codec's resolution gives it to apache-avro
/// (src/codec/avro/mod.rs, `physical`).
fn physical(schema: &Schema) -> Schema {
    fn strip(v: &mut Json) {
        match v {
            Json::Object(map) => {
                if map.remove("logicalType").is_some() {
                    map.remove("precision");
                    map.remove("scale");
                }
                map.values_mut().for_each(strip);
            }
            Json::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let mut json = serde_json::to_value(schema).expect("schema JSON");
    strip(&mut json);
    Schema::parse(&json).expect("a physical schema")
}

/// The codec's parts, each alone, over the same records.
struct Parts<'f> {
    datums: Vec<&'f [u8]>,
    order: Compiled,
    order_long: Compiled,
    order_plain: Compiled,
    /// Documents as decoded, and with `placed_at` as its number of milliseconds.
    docs: Vec<Doc<'f>>,
    docs_number: Vec<Doc<'f>>,
    millis: Vec<i64>,
}

fn parts(frames: &[Vec<u8>]) -> Parts<'_> {
    let datums: Vec<&[u8]> = frames
        .iter()
        .map(|f| split_header(f).expect("framed").1)
        .collect();
    let order = compiled_plain(false, false);
    let order_long = compiled_plain(true, false);
    let docs: Vec<Doc<'_>> = datums
        .iter()
        .map(|d| read::decode(&order, d).expect("read"))
        .collect();
    let docs_number: Vec<Doc<'_>> = datums
        .iter()
        .map(|d| read::decode(&order_long, d).expect("read"))
        .collect();
    let millis: Vec<i64> = docs_number
        .iter()
        .map(|d| d.to_json()["placed_at"].as_i64().expect("millis"))
        .collect();
    // The parts do what the whole does.
    for (n, (doc, number)) in docs.iter().zip(&docs_number).enumerate() {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        write::encode(&order, doc, &mut a).expect("write");
        write::encode(&order, number, &mut b).expect("write");
        assert_eq!(a, b, "record {n}: a timestamp as text or as a number");
        assert_eq!(a.len(), datums[n].len(), "record {n}");
        assert_eq!(
            read::timestamp_text(millis[n], 3, false).as_deref(),
            doc.to_json()["placed_at"].as_str(),
            "record {n}"
        );
    }
    Parts {
        datums,
        order,
        order_long,
        order_plain: compiled_plain(true, true),
        docs,
        docs_number,
        millis,
    }
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let rounds = if full {
        env_f64("ONCEFLOW_BENCH_ROUNDS", 5.0).max(1.0) as usize
    } else {
        1
    };
    let secs = Duration::from_secs_f64(if full {
        env_f64("ONCEFLOW_BENCH_SECS", 2.0)
    } else {
        0.05
    });
    let warm = Duration::from_secs_f64(if full { 0.5 } else { 0.0 });

    let s = setup(1000);
    check(&s);
    let p = parts(&s.frames);
    let avro_len: usize = s.frames.iter().map(Vec::len).sum();
    let json_len: usize = s.texts.iter().map(Vec::len).sum();
    eprintln!(
        "avro_codec: {} records, {} bytes framed Avro and {} bytes of JSON on average; \
         {rounds} round(s) of {:.2} s per variant ({:.2} s for the breakdown); load average {}",
        s.frames.len(),
        avro_len / s.frames.len(),
        json_len / s.texts.len(),
        secs.as_secs_f64(),
        secs.as_secs_f64() / 4.0,
        load()
    );

    let reader = GenericDatumReader::builder(&s.schema)
        .build()
        .expect("a reader");
    let writer = GenericDatumWriter::builder(&s.schema)
        .build()
        .expect("a writer");
    let decoded: Vec<Value<'_>> = s
        .frames
        .iter()
        .map(|f| s.decoder.decode(Some(f)).expect("decode"))
        .collect();
    // The steps of resolution (src/codec/avro/mod.rs, `resolve`: apache-avro resolves the
    // physical schemas), its reader and writer built once.
    let (physical_writer, physical_reader) = (physical(&s.schema), physical(&s.reader.schema));
    let resolver = GenericDatumReader::builder(&physical_writer)
        .reader_schema(&physical_reader)
        .build()
        .expect("a resolving reader");
    let resolved_writer = GenericDatumWriter::builder(&physical_reader)
        .build()
        .expect("a writer of the reader schema");
    let frames = &s.frames;
    let mut out = Vec::with_capacity(4);
    let mut buf = Vec::with_capacity(256);
    let mut pass = |variant: usize| -> usize {
        match variant {
            DECODE | RESOLVE => {
                let decoder = if variant == DECODE {
                    &s.decoder
                } else {
                    &s.resolving
                };
                for f in frames {
                    drop(black_box(
                        decoder.decode(Some(black_box(f))).expect("decode"),
                    ));
                }
            }
            APACHE_DECODE => {
                for f in frames {
                    let (_, mut datum) = split_header(black_box(f)).expect("framed");
                    drop(black_box(reader.read_value(&mut datum).expect("read")));
                }
            }
            ROUND_TRIP => {
                for f in frames {
                    let value = s.decoder.decode(Some(black_box(f))).expect("decode");
                    black_box(s.encoder.encode(&value, f.len()).expect("encode"));
                }
            }
            APACHE_ROUND_TRIP => {
                for f in frames {
                    black_box(apache_round_trip(&reader, &writer, black_box(f)));
                }
            }
            ENCODE => {
                for (v, f) in decoded.iter().zip(frames) {
                    black_box(s.encoder.encode(black_box(v), f.len()).expect("encode"));
                }
            }
            AVRO_PIPELINE | JSON_PIPELINE => {
                let (pipeline, records) = if variant == AVRO_PIPELINE {
                    (&s.avro_pipeline, &s.avro_records)
                } else {
                    (&s.json_pipeline, &s.json_records)
                };
                for r in records {
                    out.clear();
                    pipeline
                        .process(black_box(r.clone()), &mut out)
                        .expect("process");
                    black_box(&out);
                }
            }
            READ | READ_LONG | READ_PLAIN => {
                let schema = match variant {
                    READ => &p.order,
                    READ_LONG => &p.order_long,
                    _ => &p.order_plain,
                };
                for d in &p.datums {
                    drop(black_box(read::decode(schema, black_box(d)).expect("read")));
                }
            }
            TIMESTAMP_TEXT => {
                for &ms in &p.millis {
                    black_box(read::timestamp_text(black_box(ms), 3, false));
                }
            }
            WRITE | WRITE_NUMBER => {
                let docs = if variant == WRITE {
                    &p.docs
                } else {
                    &p.docs_number
                };
                for doc in docs {
                    buf.clear();
                    write::encode(&p.order, black_box(doc), &mut buf).expect("write");
                    black_box(&buf);
                }
            }
            FRAMING => {
                for f in frames {
                    let (id, datum) = split_header(black_box(f)).expect("framed");
                    black_box(frame(id, datum));
                }
            }
            RESOLVE_BUILD => {
                for _ in frames {
                    let r = GenericDatumReader::builder(black_box(&physical_writer))
                        .reader_schema(&physical_reader)
                        .build()
                        .expect("a resolving reader");
                    let w = GenericDatumWriter::builder(black_box(&physical_reader))
                        .build()
                        .expect("a writer of the reader schema");
                    black_box((r, w));
                }
            }
            RESOLVE_BUILT => {
                for d in &p.datums {
                    black_box(read::decode(&p.order, black_box(d)).expect("read"));
                    let mut datum = *d;
                    let v = resolver.read_value(&mut datum).expect("resolve");
                    let resolved = resolved_writer.write_value_to_vec(v).expect("write");
                    black_box(read::decode(&s.reader.compiled, &resolved).expect("read"));
                }
            }
            _ => unreachable!("variant {variant}"),
        }
        frames.len()
    };

    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); NAMES.len()];
    for round in 0..rounds {
        let mut order: Vec<usize> = (0..NAMES.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for &v in &order {
            let (w, t) = if v >= BREAKDOWN {
                (warm / 2, secs / 4)
            } else {
                (warm, secs)
            };
            let r = rate(&mut || pass(v), w, t);
            rates[v].push(r);
        }
        let line: Vec<String> = (0..BREAKDOWN)
            .map(|v| format!("{} {:.0}", NAMES[v], rates[v][round]))
            .collect();
        eprintln!(
            "  round {}: {} (load {})",
            round + 1,
            line.join(", "),
            load()
        );
    }

    let row = |v: usize| {
        let (m, lo, hi) = spread(&rates[v]);
        println!(
            "| {} | {m:.0} ({lo:.0}-{hi:.0}) | {:.0} |",
            NAMES[v],
            1e9 / m
        );
    };
    println!();
    println!("| variant | records/s (median, min-max) | ns/record (of the median) |");
    println!("|---|---:|---:|");
    (0..BREAKDOWN).for_each(row);
    println!();
    println!("| ratio, paired per round | median (min-max) |");
    println!("|---|---:|");
    for (name, a, b) in RATIOS {
        let paired: Vec<f64> = rates[a].iter().zip(&rates[b]).map(|(x, y)| x / y).collect();
        let (m, lo, hi) = spread(&paired);
        println!("| {name} | {m:.2} ({lo:.2}-{hi:.2}) |");
    }
    println!();
    println!(
        "| part of decode + encode, alone | per second (median, min-max) | ns (of the median) |"
    );
    println!("|---|---:|---:|");
    (BREAKDOWN..NAMES.len()).for_each(row);
    eprintln!("load average at the end: {}", load());
}
