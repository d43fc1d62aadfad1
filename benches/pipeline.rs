//! Throughput of a 5-processor pipeline on ~1 KB JSON records, on one core:
//! decode, filter, set_key, map (two computed fields), drop_fields, set_header, encode.
//!
//!     cargo bench --bench pipeline
//!
//! Target: at least 300,000 records/s. Figures are kept in docs/benchmarks.md.

use std::hint::black_box;

// The same allocator as the `onceflow` binary.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use criterion::{Criterion, Throughput};
use onceflow::record::{Origin, Record};
use onceflow::topology::Topology;
use onceflow::transform::Pipeline;

const TOPOLOGY: &str = r#"
name: bench
inputs: [{topic: orders, codec: json}]
pipeline:
  - filter: 'value.status != "test" && value.total > 0.0'
  - set_key: 'string(value.order_id)'
  - map:
      status: 'value.status.upperAscii()'
      customer_id: 'value.customer.id'
  - drop_fields: [customer.email, internal]
  - set_header: { name: event-type, expr: '"order." + value.status' }
outputs: [{topic: out}]
"#;

/// An order event of about 1 KB.
fn value(n: u64) -> Vec<u8> {
    let items: Vec<String> = (0..4)
        .map(|i| {
            format!(
                r#"{{"sku":"SKU-{n}-{i}","qty":{},"unit_price":{}.99,"description":"a fairly long product description {i}"}}"#,
                i + 1,
                10 + i
            )
        })
        .collect();
    format!(
        r#"{{"order_id":{n},"status":"paid","total":{}.50,"currency":"EUR","created_at":"2026-03-01T10:00:00Z","customer":{{"id":"c-{}","name":"Ada Lovelace","email":"ada@example.com","address":{{"street":"12 Analytical Engine Road","city":"London","zip":"N1 9GU","country":"GB"}}}},"items":[{}],"internal":{{"score":0.93,"flags":["vip","newsletter"],"note":"nothing to see here"}},"shipping":{{"method":"express","carrier":"Parcelforce","tracking":"PF-000{n}-GB","eta":"2026-03-03T18:00:00Z","instructions":"leave with the neighbour at number 14 if nobody answers"}}}}"#,
        n % 1000 + 1,
        n % 5000,
        items.join(",")
    )
    .into_bytes()
}

fn setup() -> (Pipeline, Vec<Record>) {
    let topology = Topology::parse(TOPOLOGY, "bench").expect("topology");
    let pipeline = Pipeline::compile(&topology).expect("pipeline");
    let records: Vec<Record> = (0..1000)
        .map(|n| Record {
            key: Some(n.to_string().into_bytes()),
            value: Some(value(n)),
            headers: vec![("source".into(), b"web".to_vec())],
            timestamp: Some(1_700_000_000_000),
            origin: Origin {
                topic: "orders".into(),
                partition: 0,
                offset: n as i64,
            },
        })
        .collect();
    (pipeline, records)
}

/// Every record passes, re-keyed by order id and changed.
fn check(pipeline: &Pipeline, records: &[Record]) {
    let mut out = Vec::new();
    for (n, r) in records.iter().enumerate() {
        out.clear();
        pipeline.process(r.clone(), &mut out).expect("process");
        assert_eq!(out.len(), 1);
        let (_, rec) = &out[0];
        assert_eq!(rec.key.as_deref(), Some(n.to_string().as_bytes()));
        let v: serde_json::Value =
            serde_json::from_slice(rec.value.as_deref().expect("value")).expect("JSON");
        assert_eq!(v["status"], "PAID");
        assert_eq!(v["customer_id"], v["customer"]["id"]);
        assert!(v.get("internal").is_none() && v["customer"].get("email").is_none());
    }
}

fn bench(c: &mut Criterion, pipeline: &Pipeline, records: &[Record]) {
    let size: usize = records
        .iter()
        .map(|r| r.value.as_ref().map_or(0, Vec::len))
        .sum();
    eprintln!("average value size: {} bytes", size / records.len());
    let mut out = Vec::with_capacity(4);
    let mut group = c.benchmark_group("pipeline");
    group.throughput(Throughput::Elements(records.len() as u64));
    group.bench_function("5 processors, 1 KB JSON", |b| {
        b.iter(|| {
            for r in records {
                out.clear();
                pipeline
                    .process(black_box(r.clone()), &mut out)
                    .expect("process");
                black_box(&out);
            }
        })
    });
    group.finish();
}

fn main() {
    let (pipeline, records) = setup();
    check(&pipeline, &records);
    // `cargo bench` passes `--bench`; `cargo test --all-targets` runs this without it (and
    // with the test harness's arguments): then the check above is the whole test.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let mut c = Criterion::default().configure_from_args();
    bench(&mut c, &pipeline, &records);
    c.final_summary();
}
