//! `onceflow bench` end to end on the real broker, tiny: one partition count, no Kafka
//! Streams. Checks that every cell ran and that its numbers are sane, not how fast they are.

mod common;

use std::collections::HashMap;
use std::process::Command;
use std::time::{Duration, Instant};

use common::bootstrap;

const RECORDS: u64 = 3_000;

#[test]
fn bench_writes_a_row_per_cell_with_sane_numbers() {
    let out = tempfile::tempdir().expect("temp dir");
    let started = Instant::now();
    let status = Command::new(env!("CARGO_BIN_EXE_onceflow"))
        .args(["bench", "--bootstrap-servers", &bootstrap()])
        .args(["--records", &RECORDS.to_string(), "--record-size", "512"])
        .args(["--partitions", "2", "--eos-commit-ms", "100"])
        .args(["--no-kstreams", "--probe-rate", "200", "--probe-secs", "1"])
        .args(["--cell-timeout-secs", "40"])
        .arg("--out")
        .arg(out.path())
        .status()
        .expect("run onceflow bench");
    assert!(status.success(), "onceflow bench failed: {status}");
    assert!(started.elapsed() < Duration::from_secs(60));

    let csv = std::fs::read_to_string(out.path().join("bench.csv")).expect("bench.csv");
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().expect("header").split(',').collect();
    let rows: Vec<HashMap<&str, &str>> = lines
        .map(|l| header.iter().copied().zip(l.split(',')).collect())
        .collect();
    let modes: Vec<&str> = rows.iter().map(|r| r["mode"]).collect();
    assert_eq!(
        modes,
        ["produce-only", "consume-only", "alos-100ms", "eos-100ms"]
    );
    let num = |row: &HashMap<&str, &str>, col: &str| -> f64 {
        row[col]
            .parse()
            .unwrap_or_else(|_| panic!("{col} of {} is {:?}", row["mode"], row[col]))
    };
    for row in &rows {
        assert_eq!(row["error"], "", "{} failed", row["mode"]);
        assert_eq!(row["partitions"], "2");
        assert_eq!(num(row, "records"), RECORDS as f64);
        let rate = num(row, "records_per_s");
        assert!(
            rate > 10.0 && rate < 10_000_000.0,
            "{}: {rate}",
            row["mode"]
        );
        let mbps = num(row, "mb_per_s");
        assert!((mbps - rate * 512.0 / 1e6).abs() < 0.1, "{}", row["mode"]);
    }
    for row in &rows[2..] {
        assert!(num(row, "commits") >= 1.0);
        let (p50, p99) = (num(row, "commit_p50_ms"), num(row, "commit_p99_ms"));
        assert!(
            p50 > 0.0 && p50 <= p99 && p99 < 10_000.0,
            "commit {p50} {p99}"
        );
        let (e50, e99) = (num(row, "e2e_p50_ms"), num(row, "e2e_p99_ms"));
        assert!(
            e50 >= 0.0 && e50 <= e99 && e99 < 30_000.0,
            "e2e {e50} {e99}"
        );
        let rss = num(row, "peak_rss_mib");
        assert!(rss > 1.0 && rss < 4096.0, "rss {rss}");
        let cpu = num(row, "cpu_s");
        assert!(cpu > 0.0 && cpu < 120.0, "cpu {cpu}");
        assert_eq!(num(row, "runs"), 1.0);
    }
    // The exactly-once row carries its ratios; Kafka Streams did not run.
    let eos = &rows[3];
    assert!(num(eos, "eos_over_alos") > 0.0);
    assert!(num(eos, "eos_over_ceiling") > 0.0);
    assert_eq!(eos["onceflow_over_kstreams"], "");

    let md = std::fs::read_to_string(out.path().join("bench.md")).expect("bench.md");
    assert!(md.contains("| eos-100ms |"), "{md}");
    let svg = std::fs::read_to_string(out.path().join("throughput.svg")).expect("svg");
    assert!(svg.starts_with("<svg") && svg.contains("eos-100ms"));
}
