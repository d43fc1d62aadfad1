//! Protobuf and JSON Schema with the real schema registry (Apicurio, started by `scripts/test`)
//! and the real broker, against the registry's reference serializers: every input value is
//! written, and every output value read, by Confluent's own Python serializers
//! (tests/reference/serdes.py, run in the virtualenv `scripts/serdes-reference` makes), never by
//! onceflow.
//!
//! * The example `topologies/orders-protobuf.yaml` end to end: orders written by
//!   `ProtobufSerializer` (their schema and its import registered by it, as a base64
//!   descriptor), poison of every kind, the job SIGKILLed and restarted on the way; each
//!   output's ids checked as a set (read_committed) and each value read back by
//!   `ProtobufDeserializer` and `JSONSchemaDeserializer` (which checks it against the schema),
//!   field by field; every poison record and every value the JSON Schema refuses dead-lettered
//!   once, with its kind.
//! * JSON Schema in: values written by `JSONSchemaSerializer` read by a job.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use onceflow::codec::Registry;
use onceflow::codec::registry::{Format, Registered, frame};
use onceflow::topology::SchemaRegistry;
use serde_json::{Value as Json, json};

fn python() -> String {
    std::env::var("ONCEFLOW_TEST_SERDES_PYTHON").expect(
        "ONCEFLOW_TEST_SERDES_PYTHON is not set: these tests need the reference serializers (scripts/serdes-reference); run them with scripts/test",
    )
}

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("topologies")
}

/// Runs tests/reference/serdes.py with `args`, `lines` on its input; its output lines.
fn serdes(args: &[&str], lines: &[String]) -> Vec<String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/reference/serdes.py");
    let mut child = Command::new(python())
        .arg(script)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the reference serializers");
    let mut stdin = child.stdin.take().expect("stdin");
    let input = lines.join("\n");
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let out = child.wait_with_output().expect("serdes.py");
    writer.join().expect("writer").expect("write");
    assert!(
        out.status.success(),
        "serdes.py {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("UTF-8")
        .lines()
        .map(str::to_string)
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex"))
        .collect()
}

/// Order `id` as the checkout service writes it (protobuf's JSON mapping). Every 25th is
/// cancelled; every 10th is large (a total of 1,000 or more); every 70th has a currency the
/// audit schema refuses.
fn order(id: u64) -> Json {
    let status = match id {
        _ if id.is_multiple_of(25) => "CANCELLED",
        _ => ["NEW", "PAID", "SHIPPED"][(id % 3) as usize],
    };
    let lines: Vec<Json> = (0..1 + id % 3)
        .map(|j| {
            json!({"sku": format!("s{id}-{j}"), "quantity": 1 + (id + j) % 4,
                   "unit_price": {"currency": "EUR", "units": 5, "nanos": 0}})
        })
        .collect();
    let units = if id.is_multiple_of(10) {
        1000 + id
    } else {
        10 + id % 50
    };
    let currency = if id.is_multiple_of(70) { "eur" } else { "EUR" };
    json!({
        "id": id,
        "customer": format!("c-{}", id % 97),
        "status": status,
        "lines": lines,
        "placed_at": format!("2026-03-01T10:00:{:02}Z", id % 60),
        "tags": {"n": (id % 7).to_string()},
        "total": {"currency": currency, "units": units, "nanos": 250_000_000},
    })
}

/// What the example writes to `totals` for order `id`.
fn expected_total(id: u64) -> Json {
    let o = order(id);
    json!({
        "id": id,
        "customer": o["customer"],
        "status": o["status"].as_str().expect("status").to_lowercase(),
        "items": o["lines"].as_array().expect("lines").len(),
        "total": o["total"]["units"].as_f64().expect("units") + 0.25,
        "currency": o["total"]["currency"],
        "placed_at": o["placed_at"],
    })
}

/// Protobuf's JSON mapping as Python's json_format writes it, made comparable: 64-bit integers
/// (written as text) as numbers.
fn numbers(mut v: Json) -> Json {
    for field in ["id"] {
        if let Some(Json::String(s)) = v.get(field) {
            v[field] = json!(s.parse::<u64>().expect("an int64"));
        }
    }
    v
}

/// Each output value decoded by the reference (with the schema type of its id), by order id.
fn read_back(records: &[ReadRecord], args: &[&str]) -> BTreeMap<u64, Vec<Json>> {
    let lines: Vec<String> = records
        .iter()
        .map(|r| hex(r.raw.as_deref().expect("a value")))
        .collect();
    let mut by_id: BTreeMap<u64, Vec<Json>> = BTreeMap::new();
    for line in serdes(args, &lines) {
        let read: Json = serde_json::from_str(&line).expect("JSON");
        assert!(
            read.get("error").is_none(),
            "the reference cannot read a value: {read}"
        );
        let value = numbers(read["value"].clone());
        let id = value["id"].as_u64().expect("an id");
        by_id.entry(id).or_default().push(read);
    }
    by_id
}

#[test]
fn protobuf_from_the_reference_serializer_runs_exactly_once_and_reads_back_with_it() {
    let url = registry_url();
    let name = unique("orders-protobuf");
    let (orders, totals, audit, dlq) = (
        format!("{name}.orders"),
        format!("{name}.totals"),
        format!("{name}.audit"),
        format!("{name}.dlq"),
    );
    create_topics(&[&orders, &totals, &audit, &dlq], 3);
    let schemas = examples().join("schemas");
    let schemas = schemas.to_str().expect("path");

    const N: u64 = 6_000;
    let values: Vec<String> = (1..=N).map(|id| order(id).to_string()).collect();
    let wire = serdes(
        &[
            "encode",
            "protobuf",
            &url,
            &orders,
            schemas,
            "shop/order.proto",
            "shop.Order",
        ],
        &values,
    );
    assert_eq!(wire.len(), N as usize);
    let mut records: Vec<(String, Vec<u8>)> = wire
        .iter()
        .enumerate()
        .map(|(i, w)| ((i + 1).to_string(), unhex(w)))
        .collect();
    // The reference registered the schema with its import as a reference.
    let good = records[1].1.clone();
    let id = u32::from_be_bytes([good[1], good[2], good[3], good[4]]);
    let offline = Registry::connect(&SchemaRegistry {
        url: url.clone(),
        username: None,
        password: None,
        timeout_ms: 5_000,
    })
    .expect("registry");
    let registered = offline
        .schema(id, Format::Protobuf)
        .expect("the input's schema");
    assert_eq!(registered.references.len(), 1, "{registered:?}");
    assert_eq!(registered.references[0].name, "shop/money.proto");
    let json_id = offline
        .register_schema(
            &format!("{name}.other-value"),
            &Registered::new(
                Format::JsonSchema,
                r#"{"$schema":"http://json-schema.org/draft-07/schema#","type":"object"}"#,
            ),
            true,
        )
        .expect("a JSON Schema");

    // Poison of each kind, a few times, among the orders: not the wire format, an unknown
    // schema id, an id of a JSON Schema, a message index the schema does not have, a
    // truncated message.
    let mut unknown_index = good[..5].to_vec();
    unknown_index.extend_from_slice(&[2, 20]);
    unknown_index.extend_from_slice(&good[6..]);
    let poison: Vec<(&str, Vec<u8>)> = vec![
        ("bad_protobuf", br#"{"id": 1}"#.to_vec()),
        ("unknown_schema", frame(987_654_321, &good[5..])),
        ("unknown_schema", frame(json_id, &good[5..])),
        ("bad_protobuf", unknown_index),
        ("bad_protobuf", good[..good.len() - 3].to_vec()),
    ];
    let mut expected_dead: BTreeMap<String, String> = BTreeMap::new();
    for round in 0..3 {
        for (i, (kind, bytes)) in poison.iter().enumerate() {
            let key = format!("poison-{round}-{i}");
            expected_dead.insert(key.clone(), kind.to_string());
            records.insert(round * 1900 + i * 300 + 7, (key, bytes.clone()));
        }
    }
    produce_bytes(&orders, records);

    let (mut expected_totals, mut expected_audit) = (BTreeSet::new(), BTreeSet::new());
    for id in 1..=N {
        if id.is_multiple_of(25) {
            continue;
        }
        let large = id.is_multiple_of(10);
        if large && id.is_multiple_of(70) {
            expected_dead.insert(id.to_string(), "schema_mismatch".into());
            continue;
        }
        expected_totals.insert(id);
        if large {
            expected_audit.insert(id);
        }
    }

    let env = [
        ("JOB_NAME", name.as_str()),
        ("SCHEMA_REGISTRY_URL", url.as_str()),
        ("ORDERS_TOPIC", orders.as_str()),
        ("TOTALS_TOPIC", totals.as_str()),
        ("AUDIT_TOPIC", audit.as_str()),
        ("DLQ_TOPIC", dlq.as_str()),
    ];
    let topology = examples().join("orders-protobuf.yaml");
    let mut job = spawn_job(&topology, "i0", &env);
    let partway = wait_for_committed(&totals, 3, 1_000, Duration::from_secs(120));
    assert!(partway >= 1_000, "only {partway} records before the kill");
    signal(&job, "-KILL");
    wait_exit(&mut job, Duration::from_secs(10)).expect("killed");
    let job = spawn_job(&topology, "i0", &env);
    let done = wait_for_committed(&totals, 3, expected_totals.len(), Duration::from_secs(240));
    assert!(
        done >= expected_totals.len(),
        "{done} of {}",
        expected_totals.len()
    );
    let dead_count = wait_for_committed(&dlq, 3, expected_dead.len(), Duration::from_secs(60));
    terminate(job);

    // The totals, read by ProtobufDeserializer: each order once, each field as expected,
    // framed as the file's first message (the single index byte 0).
    let total_records = read_records(&totals, 3, "read_committed");
    assert!(
        total_records
            .iter()
            .all(|r| r.raw.as_deref().is_some_and(|v| v[5] == 0))
    );
    let read = read_back(
        &total_records,
        &[
            "decode",
            "protobuf",
            &url,
            &totals,
            schemas,
            "shop/order_total.proto",
            "shop.OrderTotal",
        ],
    );
    let counts = read.iter().map(|(id, v)| (*id, v.len())).collect();
    assert_each_once("totals", &expected_totals, &counts);
    for (id, values) in &read {
        assert_eq!(values[0]["schema_type"], "PROTOBUF");
        assert_eq!(
            numbers(values[0]["value"].clone()),
            expected_total(*id),
            "order {id}"
        );
    }
    // The audit records, read (and checked against the schema) by JSONSchemaDeserializer.
    let audit_schema = examples().join("schemas/order-audit.schema.json");
    let read = read_back(
        &read_records(&audit, 3, "read_committed"),
        &[
            "decode",
            "json_schema",
            &url,
            &audit,
            audit_schema.to_str().expect("path"),
        ],
    );
    let counts = read.iter().map(|(id, v)| (*id, v.len())).collect();
    assert_each_once("audit", &expected_audit, &counts);
    for (id, values) in &read {
        assert_eq!(values[0]["schema_type"], "JSON");
        assert_eq!(values[0]["value"], expected_total(*id), "order {id}");
    }

    // Every poison record and every refused value once in the dead-letter topic, its bytes
    // verbatim, with its kind.
    let dead = read_records(&dlq, 3, "read_committed");
    assert_eq!(dead_count, dead.len());
    let mut kinds = BTreeMap::new();
    for d in &dead {
        // A poison record's key, or a refused order's: its id (the dead letter is the record
        // as consumed).
        let key = d.key.clone().expect("key");
        assert!(
            kinds
                .insert(key.clone(), d.headers["onceflow.error.kind"].clone())
                .is_none(),
            "{key} dead-lettered twice"
        );
    }
    assert_eq!(kinds, expected_dead);
    let refused = dead
        .iter()
        .find(|d| d.headers["onceflow.error.kind"] == "schema_mismatch")
        .expect("a refused order");
    assert!(
        refused.headers["onceflow.error.message"].contains("at /currency: \"eur\""),
        "{:?}",
        refused.headers
    );
    // `dlq inspect` with the registry shows what each payload is.
    let inspect = Command::new(env!("CARGO_BIN_EXE_onceflow"))
        .args(["dlq", "inspect", &dlq, "--bootstrap-servers", &bootstrap()])
        .args(["--schema-registry", &url, "--limit", "100"])
        .output()
        .expect("dlq inspect");
    let table = String::from_utf8_lossy(&inspect.stdout);
    assert!(inspect.status.success(), "{table}");
    for shown in [
        format!("protobuf#{id} {{\"customer\":\"c-"),
        "#987654321 (schema id 987654321 is unknown".to_string(),
        format!("json#{json_id} (schema id {json_id}: the value is not valid JSON"),
        format!("protobuf#{id} (schema id {id} has no message at index [10]"),
    ] {
        assert!(table.contains(&shown), "{shown} not in\n{table}");
    }
}

#[test]
fn json_schema_from_the_reference_serializer_is_read_by_a_job() {
    let url = registry_url();
    let name = unique("json-schema-in");
    let (input, output) = (format!("{name}.in"), format!("{name}.out"));
    create_topics(&[&input, &output], 3);
    let schema = examples().join("schemas/order-audit.schema.json");
    let values: Vec<String> = (1..=500u64)
        .map(|id| {
            json!({"id": id, "customer": format!("c-{id}"), "status": "paid", "items": 1 + id % 4,
                   "total": id as f64 * 1.5, "currency": "EUR", "placed_at": null})
            .to_string()
        })
        .collect();
    let wire = serdes(
        &[
            "encode",
            "json_schema",
            &url,
            &input,
            schema.to_str().expect("path"),
        ],
        &values,
    );
    produce_bytes(
        &input,
        wire.iter()
            .enumerate()
            .map(|(i, w)| ((i + 1).to_string(), unhex(w))),
    );
    let yaml = format!(
        "name: {name}\nschema_registry: {{url: '{url}'}}\ninputs: [{{topic: {input}, codec: json_schema}}]\n\
         pipeline:\n  - map: {{double_total: 'value.total * 2.0'}}\noutputs: [{{topic: {output}}}]\n"
    );
    let (_dir, topology) = topology_file(&yaml);
    let job = spawn_job(&topology, "i0", &[]);
    let done = wait_for_committed(&output, 3, values.len(), Duration::from_secs(120));
    terminate(job);
    assert_eq!(done, values.len());
    let mut got = BTreeMap::new();
    for r in read_records(&output, 3, "read_committed") {
        let v: Json = serde_json::from_slice(r.raw.as_deref().expect("value")).expect("JSON");
        let id = v["id"].as_u64().expect("id");
        assert_eq!(v["double_total"], json!(id as f64 * 3.0), "{v}");
        assert_eq!(v["customer"], json!(format!("c-{id}")), "{v}");
        *got.entry(id).or_default() += 1;
    }
    assert_each_once("output", &(1..=500).collect(), &got);
}

#[test]
fn a_protobuf_output_the_registry_refuses_stops_the_job_at_start_with_its_words() {
    let url = registry_url();
    let name = unique("protobuf-incompatible");
    let (input, output) = (format!("{name}.in"), format!("{name}.out"));
    create_topics(&[&input, &output], 1);
    // The output's subject holds a message whose `id` is an int64.
    let registry = Registry::connect(&SchemaRegistry {
        url: url.clone(),
        username: None,
        password: None,
        timeout_ms: 5_000,
    })
    .expect("registry");
    registry
        .register_schema(
            &format!("{output}-value"),
            &Registered::new(
                Format::Protobuf,
                "syntax = \"proto3\";\nmessage Out { int64 id = 1; }\n",
            ),
            true,
        )
        .expect("register");
    // The topology writes `id` as a string: the registry refuses the change of type.
    let yaml = format!(
        "name: {name}\nschema_registry: {{url: \"{url}\"}}\ninputs: [{{topic: {input}, codec: json}}]\n\
         outputs:\n  - topic: {output}\n    codec: protobuf\n    protobuf:\n      \
         schema: \"syntax = \\\"proto3\\\";\\nmessage Out {{ string id = 1; }}\\n\"\n"
    );
    let (_dir, file) = topology_file(&yaml);
    assert_refused_at_start(&file, &format!("{output}-value"));
}
