//! The pipeline benchmark's topology and records, shared by `benches/pipeline.rs` and
//! `examples/pipeline_loop.rs` (the instruction counts of docs/benchmarks.md).

use onceflow::record::{Origin, Record};
use onceflow::topology::Topology;
use onceflow::transform::Pipeline;

pub const TOPOLOGY: &str = r#"
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

pub fn setup() -> (Pipeline, Vec<Record>) {
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
