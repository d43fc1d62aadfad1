//! The registry's three formats side by side on one core: the same 20-field order in Protobuf,
//! Avro, JSON Schema and plain JSON, through the same pipeline (decode, a filter, a map of two
//! computed fields and a set_key, encode), and Protobuf's codec alone.
//!
//! ```sh
//! cargo bench --bench schema_codecs                    # 5 rounds of 2 s per variant
//! ONCEFLOW_BENCH_ROUNDS=9 ONCEFLOW_BENCH_SECS=3 cargo bench --bench schema_codecs
//! ```
//!
//! Target: Protobuf decode + transform + encode at 1,000,000 records/s or more on one core.
//! Figures are kept in docs/benchmarks.md ("Protobuf and JSON Schema codecs").
//!
//! Variants, each over the same 1,000 orders (ids, strings, tags and attributes varied):
//!
//! * `pipeline, <format>`: `Pipeline::process` (each record cloned first, as the engine
//!   does), the format in and out: the output's schema is the order's with the two computed
//!   fields. JSON Schema checks every output value against its schema.
//! * `protobuf decode`, `protobuf encode`, `protobuf decode + encode`: the codec alone.
//!
//! Each round measures every variant for `ONCEFLOW_BENCH_SECS` (default 2) after a warm-up
//! of 0.5 s not counted, the order reversed every other round; `ONCEFLOW_BENCH_ROUNDS`
//! (default 5) rounds. Rates are the median and min-max over the rounds; ratios to Avro are
//! computed per round (paired). Under `cargo test` (no `--bench` argument) it checks each
//! format's output and runs one short round as a smoke test.

#[path = "support/rounds.rs"]
mod rounds;

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

// The same allocator as the `onceflow` binary.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use onceflow::codec::json::Doc;
use onceflow::codec::protobuf::{ProtobufDecoder, ProtobufEncoder, registered};
use onceflow::codec::{Codecs, Decoder, Encoder, Value};
use onceflow::record::{Origin, Record};
use onceflow::topology::Topology;
use onceflow::transform::Pipeline;
use rounds::{env_f64, load, rate, spread};
use serde_json::{Value as Json, json};

const PROTO: &str = r#"
syntax = "proto3";
package bench;
import "google/protobuf/timestamp.proto";
message Order {
  enum Status { NEW = 0; PAID = 1; SHIPPED = 2; }
  int64 id = 1; string customer = 2; double amount = 3; int32 quantity = 4; bool paid = 5;
  Status status = 6; string coupon = 7; repeated string tags = 8;
  map<string, int64> attributes = 9; google.protobuf.Timestamp placed_at = 10;
  string email = 11; string country = 12; string city = 13; string zip = 14;
  string channel = 15; double discount = 16; double shipping = 17; double tax = 18;
  int32 items = 19; int32 priority = 20;
  EXTRA
}
"#;

const AVRO: &str = r#"{"type": "record", "name": "Order", "namespace": "bench", "fields": [
  {"name": "id", "type": "long"}, {"name": "customer", "type": "string"},
  {"name": "amount", "type": "double"}, {"name": "quantity", "type": "int"},
  {"name": "paid", "type": "boolean"},
  {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID", "SHIPPED"]}},
  {"name": "coupon", "type": "string"}, {"name": "tags", "type": {"type": "array", "items": "string"}},
  {"name": "attributes", "type": {"type": "map", "values": "long"}},
  {"name": "placed_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
  {"name": "email", "type": "string"}, {"name": "country", "type": "string"},
  {"name": "city", "type": "string"}, {"name": "zip", "type": "string"},
  {"name": "channel", "type": "string"}, {"name": "discount", "type": "double"},
  {"name": "shipping", "type": "double"}, {"name": "tax", "type": "double"},
  {"name": "items", "type": "int"}, {"name": "priority", "type": "int"} EXTRA
]}"#;

const PIPELINE: &str = r#"
pipeline:
  - filter: 'value.amount > 0.0 && value.customer != "test"'
  - map:
      total: 'value.amount * double(value.quantity)'
      customer_upper: 'value.customer.upperAscii()'
  - set_key: 'string(value.id)'
"#;

fn proto(extra: bool) -> String {
    let fields = if extra {
        "double total = 21; string customer_upper = 22;"
    } else {
        ""
    };
    PROTO.replace("EXTRA", fields)
}

fn avro(extra: bool) -> String {
    let fields = if extra {
        r#", {"name": "total", "type": "double"}, {"name": "customer_upper", "type": "string"}"#
    } else {
        ""
    };
    AVRO.replace("EXTRA", fields).replace('\n', " ")
}

fn json_schema() -> String {
    let string = json!({"type": "string"});
    let number = json!({"type": "number"});
    let integer = json!({"type": "integer"});
    let mut properties = serde_json::Map::new();
    for (names, kind) in [
        (
            &[
                "customer",
                "coupon",
                "placed_at",
                "email",
                "country",
                "city",
                "zip",
                "channel",
                "customer_upper",
            ][..],
            &string,
        ),
        (
            &["amount", "discount", "shipping", "tax", "total"][..],
            &number,
        ),
        (&["id", "quantity", "items", "priority"][..], &integer),
    ] {
        for n in names {
            properties.insert(n.to_string(), kind.clone());
        }
    }
    properties.insert("paid".into(), json!({"type": "boolean"}));
    properties.insert("status".into(), json!({"enum": ["NEW", "PAID", "SHIPPED"]}));
    properties.insert("tags".into(), json!({"type": "array", "items": string}));
    properties.insert(
        "attributes".into(),
        json!({"type": "object", "additionalProperties": integer}),
    );
    json!({"$schema": "http://json-schema.org/draft-07/schema#", "title": "Order", "type": "object",
           "properties": properties, "required": ["id", "customer", "amount"],
           "additionalProperties": false})
    .to_string()
}

/// Order `n` as a document (protobuf's JSON mapping; Avro's timestamp as its text).
fn order(n: u64) -> Json {
    let status = ["NEW", "PAID", "SHIPPED"][(n % 3) as usize];
    let coupon = if n.is_multiple_of(4) {
        String::new()
    } else {
        format!("SPRING{}", n % 10)
    };
    let attributes: serde_json::Map<String, Json> = ["weight", "size", "priority"]
        .iter()
        .take((n % 4) as usize)
        .map(|k| (k.to_string(), json!(n % 1000)))
        .collect();
    json!({
        "id": n * 7919 + n % 100, "customer": format!("customer-{}", n % 500),
        "amount": 9.99 + (n % 1000) as f64, "quantity": 1 + n % 9, "paid": !n.is_multiple_of(5),
        "status": status,
        "coupon": coupon,
        "tags": (0..n % 4).map(|i| format!("tag-{i}")).collect::<Vec<_>>(),
        "attributes": attributes,
        "placed_at": "2026-03-01T10:00:00.250Z",
        "email": format!("customer-{}@example.com", n % 500), "country": "NL",
        "city": "Amsterdam", "zip": format!("{:04}AB", 1000 + n % 9000), "channel": "web",
        "discount": (n % 7) as f64 * 0.5, "shipping": 4.95, "tax": 0.21, "items": 1 + n % 5,
        "priority": (n % 3) as i64,
    })
}

fn topology(codec: &str) -> String {
    let (input, output) = match codec {
        "protobuf" => (
            "codec: protobuf".to_string(),
            format!(
                "codec: protobuf, protobuf: {{schema: {}}}",
                Json::from(proto(true))
            ),
        ),
        "avro" => (
            "codec: avro".to_string(),
            format!("codec: avro, avro: {{schema: {}}}", Json::from(avro(true))),
        ),
        "json_schema" => (
            "codec: json_schema".to_string(),
            format!(
                "codec: json_schema, json_schema: {{schema: {}}}",
                Json::from(json_schema())
            ),
        ),
        _ => ("codec: json".to_string(), "codec: json".to_string()),
    };
    // The registry is never called: the compiled pipeline's registry is offline.
    format!(
        "name: bench\nschema_registry: {{url: \"http://127.0.0.1:1\"}}\n\
         inputs: [{{topic: orders, {input}}}]\n{PIPELINE}outputs: [{{topic: out, {output}}}]\n"
    )
}

/// A pipeline over `codec`, and the orders framed in it (written by onceflow's own encoder of
/// the input schema, registered in the pipeline's offline registry).
fn setup(codec: &str, count: u64) -> (Pipeline, Vec<Record>) {
    let t = Topology::parse(&topology(codec), "bench").expect("the topology");
    let pipeline = Pipeline::compile(&t).expect("the pipeline");
    let input = match codec {
        "protobuf" => format!(
            "codec: protobuf, protobuf: {{schema: {}}}",
            Json::from(proto(false))
        ),
        "avro" => format!("codec: avro, avro: {{schema: {}}}", Json::from(avro(false))),
        "json_schema" => format!(
            "codec: json_schema, json_schema: {{schema: {}}}",
            Json::from(json_schema())
        ),
        _ => "codec: json".to_string(),
    };
    let writer = Topology::parse(
        &format!(
            "name: w\nschema_registry: {{url: \"http://127.0.0.1:1\"}}\ninputs: [{{topic: x, codec: json}}]\n\
             outputs: [{{topic: orders, {input}}}]\n"
        ),
        "writer",
    )
    .expect("the writer's topology");
    // The writer registers its schema in the pipeline's registry, so the pipeline knows its id.
    let encoder = Codecs::build_with(&writer, Arc::clone(pipeline.registry()))
        .expect("the writer's codecs")
        .encoders
        .remove(0);
    let records = (0..count)
        .map(|n| {
            let text = order(n).to_string();
            let doc = Doc::parse(text.as_bytes()).expect("a document");
            let value = encoder
                .encode(&Value::Json(Some(doc)), text.len())
                .expect("the order encodes")
                .expect("a value");
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
        })
        .collect();
    (pipeline, records)
}

const FORMATS: [&str; 4] = ["protobuf", "avro", "json_schema", "json"];

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
    let setups: Vec<(Pipeline, Vec<Record>)> = FORMATS.iter().map(|f| setup(f, 1000)).collect();
    // Every format's pipeline writes the same documents.
    let mut outputs = Vec::new();
    for (format, (pipeline, records)) in FORMATS.iter().zip(&setups) {
        let mut out = Vec::new();
        pipeline
            .process(records[1].clone(), &mut out)
            .expect("process");
        let value = out[0].1.value.clone().expect("a value");
        let decoded = onceflow::codec::decoder_for(
            Topology::parse(&topology(format), "b")
                .expect("t")
                .output_codec(0),
            pipeline.registry(),
        )
        .decode(Some(&value))
        .map(|v| match v {
            Value::Json(Some(d)) => d.to_json(),
            other => panic!("{format}: {other:?}"),
        })
        .expect("the output decodes");
        outputs.push((format, decoded));
    }
    for (format, doc) in &outputs[1..] {
        assert_eq!(doc["total"], outputs[0].1["total"], "{format}");
        assert_eq!(
            doc["customer_upper"], outputs[0].1["customer_upper"],
            "{format}"
        );
        assert_eq!(doc["zip"], outputs[0].1["zip"], "{format}");
    }
    let sizes: Vec<String> = FORMATS
        .iter()
        .zip(&setups)
        .map(|(f, (_, r))| {
            let bytes: usize = r.iter().map(|r| r.value.as_ref().map_or(0, Vec::len)).sum();
            format!("{f} {} B", bytes / r.len())
        })
        .collect();
    eprintln!(
        "schema_codecs: 1,000 orders of 20 fields ({}); {rounds} round(s) of {:.2} s per variant; load average {}",
        sizes.join(", "),
        secs.as_secs_f64(),
        load()
    );

    // The Protobuf codec alone, outside a pipeline.
    let (message_in, registry) = {
        let (reg, message) = registered(proto(false), Vec::new(), None).expect("the schema");
        let registry = Arc::new(onceflow::codec::Registry::offline());
        let id = registry
            .register_schema("orders-value", &reg, true)
            .expect("offline");
        (
            ProtobufEncoder::new(id, "orders-value".into(), message),
            registry,
        )
    };
    let decoder = ProtobufDecoder::new(Arc::clone(&registry));
    let frames: Vec<Vec<u8>> = (0..1000)
        .map(|n| {
            let text = order(n).to_string();
            let doc = Doc::parse(text.as_bytes()).expect("doc");
            message_in
                .encode(&Value::Json(Some(doc)), 0)
                .expect("encode")
                .expect("value")
        })
        .collect();
    let decoded: Vec<Value<'_>> = frames
        .iter()
        .map(|f| decoder.decode(Some(f)).expect("decode"))
        .collect();

    let variants: Vec<String> = FORMATS
        .iter()
        .map(|f| format!("pipeline, {f}"))
        .chain(
            [
                "protobuf decode",
                "protobuf encode",
                "protobuf decode + encode",
            ]
            .map(String::from),
        )
        .collect();
    let mut rates = vec![Vec::new(); variants.len()];
    let mut out = Vec::with_capacity(4);
    for round in 0..rounds {
        let mut order: Vec<usize> = (0..variants.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for v in order {
            let mut pass = || -> usize {
                match v {
                    0..=3 => {
                        let (pipeline, records) = &setups[v];
                        for r in records {
                            out.clear();
                            pipeline
                                .process(black_box(r.clone()), &mut out)
                                .expect("process");
                            black_box(&out);
                        }
                    }
                    4 => {
                        for f in &frames {
                            drop(black_box(
                                decoder.decode(Some(black_box(f))).expect("decode"),
                            ));
                        }
                    }
                    5 => {
                        for (d, f) in decoded.iter().zip(&frames) {
                            black_box(message_in.encode(black_box(d), f.len()).expect("encode"));
                        }
                    }
                    _ => {
                        for f in &frames {
                            let d = decoder.decode(Some(black_box(f))).expect("decode");
                            black_box(message_in.encode(&d, f.len()).expect("encode"));
                        }
                    }
                }
                frames.len()
            };
            rates[v].push(rate(&mut pass, warm, secs));
        }
    }
    println!("| variant | records/s (median) | min-max | / Avro pipeline (paired) |");
    println!("|---|---:|---:|---:|");
    for (i, name) in variants.iter().enumerate() {
        let (median, min, max) = spread(&rates[i]);
        let ratios: Vec<f64> = rates[i].iter().zip(&rates[1]).map(|(a, b)| a / b).collect();
        let (r, rmin, rmax) = spread(&ratios);
        println!("| {name} | {median:.0} | {min:.0}-{max:.0} | {r:.2} ({rmin:.2}-{rmax:.2}) |");
    }
}
