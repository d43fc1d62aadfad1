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
use onceflow::record::Record;
use onceflow::transform::Pipeline;

#[path = "support/orders.rs"]
mod orders;
use orders::setup;

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
