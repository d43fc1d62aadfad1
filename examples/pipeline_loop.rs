//! The pipeline benchmark's loop without its harness, for instruction counts:
//! `valgrind --tool=callgrind target/release/examples/pipeline_loop 4000` (docs/benchmarks.md).

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
#[path = "../benches/support/orders.rs"]
mod orders;
use orders::setup;

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(4000);
    let (pipeline, records) = setup();
    let mut out = Vec::new();
    let t = std::time::Instant::now();
    for i in 0..n {
        out.clear();
        pipeline
            .process(records[i % records.len()].clone(), &mut out)
            .expect("process");
        std::hint::black_box(&out);
    }
    eprintln!(
        "{n} records in {:?}: {:.2} us/record",
        t.elapsed(),
        t.elapsed().as_secs_f64() * 1e6 / n.max(1) as f64
    );
}
