//! `onceflow-bench` end to end on the real broker, tiny: one partition count, two rounds, no
//! Kafka Streams. Checks that every cell of every round ran, that its numbers are sane and
//! that the report pairs the rounds, not how fast anything is.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// The broker scripts/test started.
fn bootstrap() -> String {
    std::env::var("ONCEFLOW_TEST_BOOTSTRAP").expect(
        "ONCEFLOW_TEST_BOOTSTRAP is not set: integration tests need the real broker; run them with scripts/test",
    )
}

/// Builds the `onceflow` binary the bench runs its pipelines with, beside the bench's own
/// (same profile), so that it is the current one.
fn build_onceflow() {
    let bench = Path::new(env!("CARGO_BIN_EXE_onceflow-bench"));
    let release = bench.parent().and_then(Path::file_name) == Some("release".as_ref());
    let mut cargo = Command::new(env!("CARGO"));
    cargo.args(["build", "--quiet", "-p", "onceflow", "--bin", "onceflow"]);
    if release {
        cargo.arg("--release");
    }
    let status = cargo.status().expect("run cargo build");
    assert!(status.success(), "cargo build -p onceflow: {status}");
}

const RECORDS: u64 = 3_000;

#[test]
fn bench_writes_a_row_per_cell_with_sane_numbers() {
    build_onceflow();
    let out = tempfile::tempdir().expect("temp dir");
    let started = Instant::now();
    let output = Command::new(env!("CARGO_BIN_EXE_onceflow-bench"))
        .args(["--bootstrap-servers", &bootstrap()])
        .args(["--records", &RECORDS.to_string(), "--record-size", "512"])
        .args(["--partitions", "2", "--eos-commit-ms", "100"])
        .args(["--rounds", "2", "--warmup-secs", "0", "--measure-secs", "1"])
        .args(["--no-kstreams", "--no-kafka-perf", "--no-page-cache-fill"])
        .args(["--probe-rate", "200", "--probe-secs", "1"])
        .args(["--cell-timeout-secs", "40"])
        .arg("--out")
        .arg(out.path())
        .stderr(std::process::Stdio::piped())
        .output()
        .expect("run onceflow-bench");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let status = output.status;
    assert!(
        status.success(),
        "onceflow-bench failed: {status}: {stderr}"
    );
    assert!(
        !stderr.contains("filling the page cache"),
        "--no-page-cache-fill: {stderr}"
    );
    // Not on a terminal, the progress bar is hidden: a line per cell says how far it is.
    let cells: Vec<&str> = stderr.lines().filter(|l| l.starts_with("cell ")).collect();
    assert_eq!(
        cells.len(),
        8,
        "a line per cell on standard error: {stderr}"
    );
    assert!(
        cells[0].starts_with("cell 1/8: p=2 r0 produce-only: ") && cells[0].ends_with(" records/s"),
        "{}",
        cells[0]
    );
    assert!(started.elapsed() < Duration::from_secs(60));

    let csv = std::fs::read_to_string(out.path().join("bench.csv")).expect("bench.csv");
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().expect("header").split(',').collect();
    let rows: Vec<HashMap<&str, &str>> = lines
        .map(|l| header.iter().copied().zip(l.split(',')).collect())
        .collect();
    // Interleaved rounds: every mode once per round, in plan order.
    let modes: Vec<(&str, &str)> = rows.iter().map(|r| (r["round"], r["mode"])).collect();
    let plan = ["produce-only", "rpw-ceiling", "alos-100ms", "eos-100ms"];
    let expected: Vec<(&str, &str)> = ["0", "1"]
        .iter()
        .flat_map(|r| plan.iter().map(move |m| (*r, *m)))
        .collect();
    assert_eq!(modes, expected);
    let num = |row: &HashMap<&str, &str>, col: &str| -> f64 {
        row[col]
            .parse()
            .unwrap_or_else(|_| panic!("{col} of {} is {:?}", row["mode"], row[col]))
    };
    for row in &rows {
        assert_eq!(row["error"], "", "{} failed", row["mode"]);
        assert_eq!(row["partitions"], "2");
        assert_eq!(num(row, "records"), RECORDS as f64);
        // Without a warm-up the window is the whole run: every record, after start-up.
        assert_eq!(
            num(row, "window_records"),
            RECORDS as f64,
            "{}",
            row["mode"]
        );
        let window = num(row, "window_s");
        assert!(window > 0.0 && window < 40.0, "{}: {window}", row["mode"]);
        let rate = num(row, "records_per_s");
        assert!(
            rate > 10.0 && rate < 10_000_000.0,
            "{}: {rate}",
            row["mode"]
        );
        assert!((rate - RECORDS as f64 / window).abs() / rate < 0.01);
        let mbps = num(row, "mb_per_s");
        assert!((mbps - rate * 512.0 / 1e6).abs() < 0.1, "{}", row["mode"]);
        // Every mode's own processes: memory and CPU, the ceilings' clients too.
        let rss = num(row, "peak_rss_mib");
        assert!(rss > 1.0 && rss < 4096.0, "rss {rss}");
        let cpu = num(row, "cpu_s");
        assert!(cpu > 0.0 && cpu < 120.0, "cpu {cpu}");
        let window_cpu = num(row, "window_cpu_s");
        assert!(
            window_cpu >= 0.0 && window_cpu <= cpu + 0.05,
            "{window_cpu} {cpu}"
        );
        let load = num(row, "load1");
        assert!(load >= 0.0, "load {load}");
        assert!(["true", "false"].contains(&row["noisy"]));
        assert!(num(row, "machine_cores") > 0.0);
    }
    for row in rows
        .iter()
        .filter(|r| r["mode"] != "produce-only" && r["mode"] != "rpw-ceiling")
    {
        assert!(num(row, "commits") >= 1.0);
        let (p50, p99) = (num(row, "commit_p50_ms"), num(row, "commit_p99_ms"));
        assert!(
            p50 > 0.0 && p50 <= p99 && p99 < 10_000.0,
            "commit {p50} {p99}"
        );
        // Each step of a commit is a part of it: none of their medians above the whole's
        // slowest.
        for step in ["deliveries_p50_ms", "offsets_p50_ms", "end_p50_ms"] {
            let v = num(row, step);
            assert!(v >= 0.0 && v <= p99 + 0.01, "{step} {v} of {}", row["mode"]);
        }
        let (e50, e99) = (num(row, "e2e_p50_ms"), num(row, "e2e_p99_ms"));
        assert!(
            e50 >= 0.0 && e50 <= e99 && e99 < 30_000.0,
            "e2e {e50} {e99}"
        );
    }

    let md = std::fs::read_to_string(out.path().join("bench.md")).expect("bench.md");
    assert!(md.contains("eos-100ms / alos-100ms"), "{md}");
    assert!(md.contains("eos-100ms / rpw-ceiling"), "{md}");
    assert!(md.contains("Verdict: **"), "{md}");
    assert!(md.contains("Where a commit's time goes"), "{md}");
    assert!(!md.contains("fastest of"), "{md}");
    // Medians with their range over the two rounds: `a (b–c)` in the records/s table.
    let rates = md
        .lines()
        .find(|l| l.starts_with("| 2 | "))
        .expect("a records/s row");
    assert_eq!(rates.matches('–').count(), plan.len(), "{rates}");
    let svg = std::fs::read_to_string(out.path().join("throughput.svg")).expect("svg");
    assert!(svg.starts_with("<svg") && svg.contains("eos-100ms"));
}
