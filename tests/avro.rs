//! Avro with a real schema registry (Apicurio, started by `scripts/test`) and the real broker.
//!
//! * The example `topologies/orders-avro.yaml` end to end: orders written with two versions
//!   of their schema (by apache-avro's writer, not onceflow's) and poison records, the job
//!   SIGKILLed and restarted on the way; every order id checked as a set in each output
//!   (read_committed, up to a marker per partition), every poison record dead-lettered once.
//! * The registry going away while records need a schema the job has not seen: the partition
//!   is held, nothing is dead-lettered, and everything flows once it is back.
//! * An output schema the registry refuses: the job stops at start with the registry's
//!   words, and `onceflow validate --bootstrap-servers` says so first.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use apache_avro::Schema;
use apache_avro::types::Value as Avro;
use apache_avro::writer::datum::GenericDatumWriter;
use common::*;
use onceflow::codec::avro::{AvroDecoder, Registry, frame};
use onceflow::codec::{Decoder, Value};
use onceflow::topology::SchemaRegistry;
use serde_json::Value as Json;

fn registry(url: &str) -> Registry {
    Registry::connect(&SchemaRegistry {
        url: url.to_string(),
        username: None,
        password: None,
        timeout_ms: 5_000,
    })
    .expect("registry client")
}

fn example(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("topologies")
        .join(name)
}

fn schema_file(name: &str) -> Schema {
    let text = std::fs::read_to_string(example("schemas").join(name)).expect("schema file");
    Schema::parse_str(&text).expect("schema")
}

fn datum(schema: &Schema, value: Avro) -> Vec<u8> {
    GenericDatumWriter::builder(schema)
        .build()
        .expect("writer")
        .write_value_to_vec(value)
        .expect("datum")
}

const STATUSES: [&str; 4] = ["NEW", "PAID", "SHIPPED", "CANCELLED"];

/// Order `id` as the shop writes it: v1 for odd ids, v2 for even ones. Every 25th is
/// cancelled, every 10th large (quantity 100 x 20.00).
fn order(id: u64, v1: &Schema, v2: &Schema) -> (bool, Vec<u8>) {
    let status = if id.is_multiple_of(25) {
        3
    } else {
        (id % 3) as u32
    };
    let quantity = if id.is_multiple_of(10) {
        100
    } else {
        1 + id % 5
    };
    let common = |fields: &mut Vec<(String, Avro)>| {
        fields.push(("order_id".into(), Avro::Long(id as i64)));
        fields.push(("customer".into(), Avro::String(format!("c-{}", id % 97))));
        fields.push((
            "status".into(),
            Avro::Enum(status, STATUSES[status as usize].into()),
        ));
    };
    let price = Avro::Decimal(apache_avro::Decimal::from(2000i32.to_be_bytes().to_vec()));
    let placed_at = Avro::TimestampMillis(1_772_359_200_000 + id as i64);
    let mut fields = Vec::new();
    common(&mut fields);
    if id % 2 == 1 {
        fields.push(("quantity".into(), Avro::Int(quantity as i32)));
        fields.push(("unit_price".into(), price));
        fields.push(("coupon".into(), Avro::Union(0, Box::new(Avro::Null))));
        fields.push(("placed_at".into(), placed_at));
        (true, datum(v1, Avro::Record(fields)))
    } else {
        fields.push(("quantity".into(), Avro::Long(quantity as i64)));
        fields.push(("unit_price".into(), price));
        fields.push(("placed_at".into(), placed_at));
        fields.push(("channel".into(), Avro::String("app".into())));
        (false, datum(v2, Avro::Record(fields)))
    }
}

/// The order ids of an output, decoded with `decode`, and how often each appears.
fn ids_of(records: &[ReadRecord], decode: &dyn Fn(&[u8]) -> Json) -> BTreeMap<u64, usize> {
    let mut ids = BTreeMap::new();
    for r in records {
        let value = decode(r.raw.as_deref().expect("a value"));
        let id = value["order_id"].as_u64().expect("an order_id");
        *ids.entry(id).or_default() += 1;
    }
    ids
}

#[test]
fn the_avro_example_runs_exactly_once_across_a_sigkill_with_poison_dead_lettered_once() {
    let url = registry_url();
    let name = unique("orders-avro");
    let (orders, summary, large, dlq) = (
        format!("{name}.orders"),
        format!("{name}.summary"),
        format!("{name}.large"),
        format!("{name}.dlq"),
    );
    create_topics(&[&orders, &summary, &large, &dlq], 3);
    let (v1, v2) = (schema_file("order-v1.avsc"), schema_file("order-v2.avsc"));
    let reg = registry(&url);
    let subject = format!("{orders}-value");
    let id1 = reg.register(&subject, &v1, true).expect("register v1");
    let id2 = reg.register(&subject, &v2, true).expect("register v2");
    assert_ne!(id1, id2);

    const N: u64 = 20_000;
    let mut values = Vec::new();
    let (mut expected_summary, mut expected_large) = (BTreeSet::new(), BTreeSet::new());
    for id in 1..=N {
        let (is_v1, d) = order(id, &v1, &v2);
        values.push((id.to_string(), frame(if is_v1 { id1 } else { id2 }, &d)));
        if id % 25 != 0 {
            expected_summary.insert(id);
            if id % 10 == 0 {
                expected_large.insert(id);
            }
        }
    }
    // Poison, each kind a few times, spread among the orders: not Avro, an id the registry
    // does not know, a truncated datum, bytes after the record.
    let good = order(2, &v1, &v2).1;
    let poison: Vec<(&str, Vec<u8>)> = vec![
        ("bad_avro", br#"{"order_id": 1}"#.to_vec()),
        ("unknown_schema", frame(987_654_321, &good)),
        ("bad_avro", frame(id2, &good[..good.len() - 4])),
        ("bad_avro", frame(id2, &[good.as_slice(), &[0, 0]].concat())),
    ];
    let mut expected_poison = BTreeMap::new();
    for round in 0..5 {
        for (i, (kind, bytes)) in poison.iter().enumerate() {
            let key = format!("poison-{round}-{i}");
            expected_poison.insert(key.clone(), *kind);
            let at = round * 4000 + i * 900 + 17;
            values.insert(at.min(values.len()), (key, bytes.clone()));
        }
    }
    produce_bytes(&orders, values);

    let env = [
        ("JOB_NAME", name.as_str()),
        ("SCHEMA_REGISTRY_URL", url.as_str()),
        ("ORDERS_TOPIC", orders.as_str()),
        ("SUMMARY_TOPIC", summary.as_str()),
        ("LARGE_TOPIC", large.as_str()),
        ("DLQ_TOPIC", dlq.as_str()),
    ];
    let topology = example("orders-avro.yaml");
    let mut job = spawn_job(&topology, "i0", &env);
    // SIGKILL once part of it is through, then start it again.
    let partway = wait_for_committed(&summary, 3, 3_000, Duration::from_secs(120));
    assert!(partway >= 3_000, "only {partway} records before the kill");
    signal(&job, "-KILL");
    wait_exit(&mut job, Duration::from_secs(10)).expect("killed");
    let job = spawn_job(&topology, "i0", &env);
    let done = wait_for_committed(
        &summary,
        3,
        expected_summary.len(),
        Duration::from_secs(240),
    );
    assert!(
        done >= expected_summary.len(),
        "{done} of {}",
        expected_summary.len()
    );
    terminate(job);

    // The summary: Avro, with the registered output schema, fetched by the id it carries.
    let decoder = AvroDecoder::new(Arc::new(registry(&url)), None);
    let decode_avro = |bytes: &[u8]| match decoder.decode(Some(bytes)) {
        Ok(Value::Json(Some(doc))) => doc.to_json(),
        other => panic!("an output record that does not decode: {other:?}"),
    };
    let summary_records = read_records(&summary, 3, "read_committed");
    assert_each_once(
        "summary",
        &expected_summary,
        &ids_of(&summary_records, &decode_avro),
    );
    let one = decode_avro(summary_records[0].raw.as_deref().expect("value"));
    let id = one["order_id"].as_u64().expect("id");
    let quantity = if id % 10 == 0 {
        100.0
    } else {
        (1 + id % 5) as f64
    };
    assert_eq!(one["total"].as_f64(), Some(quantity * 20.0), "{one}");
    assert_eq!(
        one["channel"],
        if id % 2 == 1 { "web" } else { "app" },
        "v1 orders read with v2's default: {one}"
    );
    assert_eq!(summary_records[0].key.as_deref(), one["customer"].as_str());
    // The large ones: JSON.
    let decode_json = |bytes: &[u8]| serde_json::from_slice::<Json>(bytes).expect("JSON output");
    let large_records = read_records(&large, 3, "read_committed");
    assert_each_once(
        "large",
        &expected_large,
        &ids_of(&large_records, &decode_json),
    );

    // Every poison record once in the dead-letter topic, its bytes verbatim, with its kind.
    let dead = read_records(&dlq, 3, "read_committed");
    let mut kinds = BTreeMap::new();
    for d in &dead {
        let key = d.key.clone().expect("key");
        assert!(
            kinds
                .insert(key.clone(), d.headers["onceflow.error.kind"].clone())
                .is_none(),
            "{key} dead-lettered twice"
        );
    }
    let expected_kinds: BTreeMap<String, String> = expected_poison
        .iter()
        .map(|(k, v)| (k.clone(), v.to_string()))
        .collect();
    assert_eq!(kinds, expected_kinds);
    let unknown = dead
        .iter()
        .find(|d| d.headers["onceflow.error.kind"] == "unknown_schema")
        .expect("an unknown_schema record");
    assert_eq!(unknown.raw.as_deref(), Some(poison[1].1.as_slice()));
    assert!(
        unknown.headers["onceflow.error.message"].contains("987654321"),
        "{:?}",
        unknown.headers
    );
    // `dlq inspect` with the registry shows what each payload is.
    let inspect = Command::new(env!("CARGO_BIN_EXE_onceflow"))
        .args(["dlq", "inspect", &dlq, "--bootstrap-servers", &bootstrap()])
        .args(["--schema-registry", &url])
        .output()
        .expect("dlq inspect");
    let table = String::from_utf8_lossy(&inspect.stdout);
    assert!(inspect.status.success(), "{table}");
    assert!(
        table.contains("#987654321 (schema id 987654321 is unknown"),
        "{table}"
    );
    assert!(
        table.contains(&format!("avro#{id2} (schema id {id2}: ")),
        "{table}"
    );
}

/// A TCP proxy to `upstream` that can be switched off (connections refused: closed as soon
/// as they are accepted), made to hang (connections held open and never answered, as a
/// registry stopped with SIGSTOP does), and switched on again.
struct Proxy {
    port: u16,
    state: Arc<AtomicU8>,
}

const UP: u8 = 0;
const REFUSING: u8 = 1;
const HANGING: u8 = 2;

impl Proxy {
    fn start(upstream: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let state = Arc::new(AtomicU8::new(UP));
        let flag = Arc::clone(&state);
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for conn in listener.incoming() {
                let Ok(client) = conn else { continue };
                match flag.load(Ordering::SeqCst) {
                    REFUSING => drop(client),
                    HANGING => held.push(client),
                    _ => {
                        let Ok(server) = TcpStream::connect(&upstream) else {
                            continue;
                        };
                        pipe(client, server, Arc::clone(&flag));
                    }
                }
            }
        });
        Proxy { port, state }
    }

    fn set(&self, state: u8) {
        self.state.store(state, Ordering::SeqCst);
    }

    /// The registry's URL through the proxy.
    fn url(&self, registry: &str) -> String {
        let upstream = upstream_of(registry);
        let path = registry
            .trim_start_matches("http://")
            .trim_start_matches(&upstream);
        format!("http://127.0.0.1:{}{path}", self.port)
    }
}

/// `host:port` of a registry URL.
fn upstream_of(url: &str) -> String {
    url.trim_start_matches("http://")
        .split('/')
        .next()
        .expect("host:port")
        .to_string()
}

/// Copies both ways until either side closes or the proxy refuses; while it hangs, copies
/// nothing and keeps both open.
fn pipe(a: TcpStream, b: TcpStream, state: Arc<AtomicU8>) {
    for (mut from, mut to) in [
        (a.try_clone().expect("clone"), b.try_clone().expect("clone")),
        (b, a),
    ] {
        let state = Arc::clone(&state);
        std::thread::spawn(move || {
            let _ = from.set_read_timeout(Some(Duration::from_millis(200)));
            let mut buf = [0u8; 16 * 1024];
            loop {
                match state.load(Ordering::SeqCst) {
                    REFUSING => break,
                    HANGING => {
                        std::thread::sleep(Duration::from_millis(50));
                        continue;
                    }
                    _ => {}
                }
                match from.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        if to.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) => {}
                    Err(_) => break,
                }
            }
            let _ = to.shutdown(std::net::Shutdown::Both);
            let _ = from.shutdown(std::net::Shutdown::Both);
        });
    }
}

fn avro_topology(
    name: &str,
    registry: &str,
    timeout_ms: u64,
    input: &str,
    output: &str,
    dlq: &str,
) -> String {
    format!(
        r#"name: {name}
schema_registry: {{url: "{registry}", timeout_ms: {timeout_ms}}}
inputs:
  - topic: {input}
    codec: avro
pipeline:
  - set_key: 'string(value.order_id)'
outputs:
  - topic: {output}
    codec: json
dead_letter: {{topic: {dlq}}}
runtime:
  max_attempts: 3
  retry_backoff_ms: 200
  retry_backoff_max_ms: 1000
  session_timeout_ms: 10000
"#
    )
}

#[test]
fn a_registry_that_goes_away_holds_the_partition_and_nothing_is_dead_lettered() {
    let url = registry_url();
    let proxy = Proxy::start(upstream_of(&url));
    let proxied = proxy.url(&url);

    let name = unique("avro-registry-down");
    let (input, output, dlq) = (
        format!("{name}.in"),
        format!("{name}.out"),
        format!("{name}.dlq"),
    );
    create_topics(&[&input, &output, &dlq], 1);
    let (v1, v2) = (schema_file("order-v1.avsc"), schema_file("order-v2.avsc"));
    let reg = registry(&url);
    let id1 = reg
        .register(&format!("{input}-value"), &v1, true)
        .expect("v1");
    // Odd order ids are written with v1, even ones with v2 (see `order`).
    let batch = |ids: std::ops::RangeInclusive<u64>, v1_ids: bool, id: u32| {
        ids.map(|n| {
            let (_, d) = order(n * 2 + u64::from(v1_ids), &v1, &v2);
            (n.to_string(), frame(id, &d))
        })
        .collect::<Vec<_>>()
    };
    // Written with v1: the job fetches v1 while the registry is there.
    produce_bytes(&input, batch(1..=100, true, id1));
    let (_dir, file) = topology_file(&avro_topology(&name, &proxied, 2000, &input, &output, &dlq));
    let job = spawn_job(&file, "i0", &[]);
    assert_eq!(
        wait_for_committed(&output, 1, 100, Duration::from_secs(60)),
        100
    );

    // The registry goes away; records written with v2, an id the job has not met, arrive.
    proxy.set(REFUSING);
    let id2 = reg
        .register(&format!("{input}-value"), &v2, true)
        .expect("v2");
    produce_bytes(&input, batch(101..=300, false, id2));
    std::thread::sleep(Duration::from_secs(8));
    assert_eq!(
        committed_count(&output, 1),
        100,
        "records flowed without their schema"
    );
    assert_eq!(
        committed_count(&dlq, 1),
        0,
        "a record was dead-lettered for the registry's absence"
    );

    // Back: everything flows, once.
    proxy.set(UP);
    assert_eq!(
        wait_for_committed(&output, 1, 300, Duration::from_secs(60)),
        300
    );
    terminate(job);
    let records = read_records(&output, 1, "read_committed");
    let ids: Vec<u64> = records
        .iter()
        .map(|r| {
            let v: Json = serde_json::from_str(r.value.as_deref().expect("value")).expect("json");
            v["order_id"].as_u64().expect("order_id")
        })
        .collect();
    let expected: BTreeSet<u64> = (1..=100)
        .map(|n| n * 2 + 1)
        .chain((101..=300).map(|n| n * 2))
        .collect();
    assert_exactly_once(&expected, &ids);
    assert_eq!(committed_count(&dlq, 1), 0);
}

#[test]
fn a_registry_that_hangs_holds_only_the_partition_waiting_on_it() {
    let url = registry_url();
    let proxy = Proxy::start(upstream_of(&url));
    let name = unique("avro-registry-hung");
    let (input, output, dlq) = (
        format!("{name}.in"),
        format!("{name}.out"),
        format!("{name}.dlq"),
    );
    create_topics(&[&input, &output, &dlq], 3);
    let (v1, v2) = (schema_file("order-v1.avsc"), schema_file("order-v2.avsc"));
    let reg = registry(&url);
    let id1 = reg
        .register(&format!("{input}-value"), &v1, true)
        .expect("v1");
    let v1_order = |n: u64| (n.to_string(), frame(id1, &order(n * 2 + 1, &v1, &v2).1));
    produce_bytes(&input, (1..=30).map(v1_order));
    // A registry call times out after 5 s: stalled behind it, the job would stop for 15 s and
    // more (three attempts).
    let (_dir, file) = topology_file(&avro_topology(
        &name,
        &proxy.url(&url),
        5000,
        &input,
        &output,
        &dlq,
    ));
    let job = spawn_job(&file, "i0", &[]);
    assert_eq!(
        wait_for_committed(&output, 3, 30, Duration::from_secs(60)),
        30
    );

    // The registry hangs (connections open, never answered); a record written with a schema id
    // the job has not met arrives on one partition, then records it knows on every partition.
    proxy.set(HANGING);
    let id2 = reg
        .register(&format!("{input}-value"), &v2, true)
        .expect("v2");
    produce_bytes(
        &input,
        [("1000".to_string(), frame(id2, &order(2000, &v1, &v2).1))],
    );
    std::thread::sleep(Duration::from_secs(1));
    produce_bytes(&input, (31..=90).map(v1_order));
    let produced = std::time::Instant::now();
    let inputs = read_records(&input, 3, "read_committed");
    let held = inputs
        .iter()
        .find(|r| r.key.as_deref() == Some("1000"))
        .expect("the v2 record")
        .partition;
    let new_elsewhere = inputs
        .iter()
        .filter(|r| r.partition != held)
        .filter(|r| {
            r.key
                .as_deref()
                .and_then(|k| k.parse::<u64>().ok())
                .is_some_and(|n| (31..=90).contains(&n))
        })
        .count();
    let flowing = 30 + new_elsewhere;
    // The other partitions' records pass while the registry hangs; the held one's wait.
    let seen = wait_for_committed(&output, 3, flowing, Duration::from_secs(5));
    assert_eq!(
        seen,
        flowing,
        "{:.1} s after the records were written, {seen} records have passed, not the {flowing} \
         (30 before, {new_elsewhere} on partitions other than {held})",
        produced.elapsed().as_secs_f64()
    );
    assert_eq!(committed_count(&dlq, 3), 0, "a record was dead-lettered");

    // Back: everything flows, once.
    proxy.set(UP);
    assert_eq!(
        wait_for_committed(&output, 3, 91, Duration::from_secs(60)),
        91
    );
    terminate(job);
    let keys: Vec<u64> = read_records(&output, 3, "read_committed")
        .iter()
        .map(|r| {
            let v: Json = serde_json::from_str(r.value.as_deref().expect("value")).expect("json");
            v["order_id"].as_u64().expect("order_id")
        })
        .collect();
    let expected: BTreeSet<u64> = (1..=90).map(|n| n * 2 + 1).chain([2000]).collect();
    assert_exactly_once(&expected, &keys);
    assert_eq!(committed_count(&dlq, 3), 0);
}

#[test]
fn an_output_schema_the_registry_refuses_stops_the_job_at_start_with_its_words() {
    let url = registry_url();
    let name = unique("avro-incompatible");
    let (input, output) = (format!("{name}.in"), format!("{name}.out"));
    create_topics(&[&input, &output], 1);
    // The output's subject holds a schema with a required string `id`.
    let existing = Schema::parse_str(
        r#"{"type":"record","name":"Out","fields":[{"name":"id","type":"string"}]}"#,
    )
    .expect("schema");
    registry(&url)
        .register(&format!("{output}-value"), &existing, true)
        .expect("register");
    // The topology writes a new required field without a default: not BACKWARD compatible.
    let yaml = format!(
        r#"name: {name}
schema_registry: {{url: "{url}"}}
inputs: [{{topic: {input}, codec: json}}]
outputs:
  - topic: {output}
    codec: avro
    avro:
      schema: {{type: record, name: Out, fields: [{{name: id, type: string}}, {{name: count, type: long}}]}}
"#
    );
    let (_dir, file) = topology_file(&yaml);
    assert_refused_at_start(&file, &format!("{output}-value"));
}
