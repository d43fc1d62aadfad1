//! `/metrics`, `/healthz` and `/readyz` of a real job on the real broker: the counters equal
//! what happened.

mod common;

use std::collections::BTreeSet;
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

const PARTITIONS: i32 = 4;

fn summary_field(summary: &str, field: &str) -> u64 {
    summary
        .split("  ")
        .find_map(|part| part.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in {summary:?}"))
}

#[test]
fn metrics_equal_what_happened() {
    let input = unique("obs-in");
    let output = unique("obs-out");
    create_topics(&[&input, &output], PARTITIONS);
    let ids: BTreeSet<u64> = (0..5_000).collect();
    produce_ids(&input, ids.iter().copied());
    let (_dir, topology) = topology_file(&topology_yaml(
        &unique("obs"),
        &input,
        &output,
        "  max_records_per_txn: 400\n",
    ));
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let addr = format!("127.0.0.1:{port}");
    let mut child = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_onceflow"))
            .arg("run")
            .arg(&topology)
            .args([
                "--bootstrap-servers",
                &bootstrap(),
                "--instance-id",
                "obs-0",
            ])
            .args([
                "--metrics-addr",
                &addr,
                "--statistics-interval",
                "1s",
                "--progress-interval",
                "0",
            ])
            .env("ONCEFLOW_FAILPOINT_ABORT_EVERY", "4")
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn"),
    );

    assert_eq!(
        wait_for_distinct(&output, PARTITIONS, ids.len(), Duration::from_secs(120)),
        ids.len()
    );
    assert_eq!(get(&addr, "/healthz").map(|r| r.0), Some(200));
    assert_eq!(get(&addr, "/readyz").map(|r| r.0), Some(200));

    // Lag against the last stable offset reaches 0 on every partition.
    let deadline = Instant::now() + Duration::from_secs(30);
    let body = loop {
        let (_, body) = get(&addr, "/metrics").expect("scrape");
        let lags: Vec<f64> = (0..PARTITIONS)
            .filter_map(|p| {
                let label = format!("partition=\"{p}\"");
                metric(&body, "onceflow_consumer_lag_records", &[&label])
            })
            .collect();
        if lags.len() == PARTITIONS as usize && lags.iter().all(|l| *l == 0.0) {
            break body;
        }
        assert!(Instant::now() < deadline, "lag never reached 0: {lags:?}");
        std::thread::sleep(Duration::from_millis(500));
    };

    let topic_in = format!("topic=\"{input}\"");
    let topic_out = format!("topic=\"{output}\"");
    assert_eq!(
        metric(&body, "onceflow_records_consumed_total", &[&topic_in]),
        Some(5000.0)
    );
    assert_eq!(
        metric(&body, "onceflow_records_produced_total", &[&topic_out]),
        Some(5000.0)
    );
    assert!(
        metric(&body, "onceflow_bytes_consumed_total", &[&topic_in]).unwrap_or(0.0) > 5000.0 * 64.0
    );
    assert_eq!(
        metric(&body, "onceflow_assigned_partitions", &[]),
        Some(4.0)
    );
    assert!(body.contains("topology=\""), "topology label missing");
    let committed = metric(&body, "onceflow_transactions_committed_total", &[]).expect("committed");
    let aborted = metric(
        &body,
        "onceflow_transactions_aborted_total",
        &["reason=\"failpoint\""],
    )
    .expect("a forced abort is counted");
    assert!(aborted >= 1.0);
    assert_eq!(
        metric(&body, "onceflow_commit_duration_seconds_count", &[]),
        Some(committed)
    );

    // The job's own summary (printed at exit) agrees with what was scraped.
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    let mut stdout = String::new();
    child
        .stdout
        .take()
        .expect("stdout")
        .read_to_string(&mut stdout)
        .expect("read stdout");
    assert!(child.wait().expect("wait").success());
    assert_eq!(summary_field(&stdout, "records in:"), 5000);
    assert_eq!(
        summary_field(&stdout, "transactions committed:") as f64,
        committed
    );
    assert_eq!(summary_field(&stdout, "aborted:") as f64, aborted);
    assert_exactly_once(&ids, &read_all(&output, PARTITIONS, "read_committed"));
}
