//! The engine in-process on the real broker: records pass exactly once, and aborted
//! transactions leave nothing visible to read_committed readers.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::*;
use onceflow::instance::{RunOptions, Summary};
use onceflow::topology::Topology;

const PARTITIONS: i32 = 4;

struct Job {
    input: String,
    output: String,
    topology: Topology,
}

fn job(name: &str, extra_runtime: &str) -> Job {
    let input = unique(&format!("{name}-in"));
    let output = unique(&format!("{name}-out"));
    create_topics(&[&input, &output], PARTITIONS);
    let yaml = topology_yaml(&unique(name), &input, &output, extra_runtime);
    let topology = Topology::parse(&yaml, "test").expect("topology");
    Job {
        input,
        output,
        topology,
    }
}

/// Runs the job until `expected` ids are visible, then stops it as SIGTERM would.
fn run_until_visible(job: &Job, options: RunOptions, expected: usize) -> Summary {
    run_in_process(&job.topology, options, &job.output, PARTITIONS, expected)
}

#[test]
fn ten_thousand_records_pass_exactly_once() {
    let job = job("pass", "");
    let ids: BTreeSet<u64> = (0..10_000).collect();
    produce_ids(&job.input, ids.iter().copied());

    let summary = run_until_visible(&job, RunOptions::default(), ids.len());

    assert_exactly_once(&ids, &read_all(&job.output, PARTITIONS, "read_committed"));
    assert_eq!(summary.txn.records_committed, 10_000);
    assert_eq!(summary.txn.outputs_committed, 10_000);
    assert_eq!(summary.txn.aborted, 0);
    assert!(summary.txn.committed >= 1);
}

/// 5,000 ids through a job (batches of 500) whose every second batch is thrown away
/// (aborted, under exactly-once) and consumed again.
fn run_aborting_every_second_batch(name: &str, runtime: &str) -> (Job, BTreeSet<u64>, Summary) {
    let job = job(name, &format!("  max_records_per_txn: 500\n{runtime}"));
    let ids: BTreeSet<u64> = (0..5_000).collect();
    produce_ids(&job.input, ids.iter().copied());
    let options = RunOptions {
        abort_every: Some(2),
        ..RunOptions::default()
    };
    let summary = run_until_visible(&job, options, ids.len());
    (job, ids, summary)
}

#[test]
fn aborted_transactions_leave_nothing_visible() {
    // Every second transaction is aborted after its records were produced; the engine rewinds
    // and processes them again in the next one.
    let (job, ids, summary) = run_aborting_every_second_batch("abort", "");

    assert!(
        summary.txn.aborted >= 5,
        "too few aborts to prove anything: {summary:?}"
    );
    assert_exactly_once(&ids, &read_all(&job.output, PARTITIONS, "read_committed"));
    // The aborted records were written to the log: a read_uncommitted reader sees them.
    let uncommitted = read_all(&job.output, PARTITIONS, "read_uncommitted");
    assert!(
        uncommitted.len() > ids.len(),
        "aborted records should be in the log ({} records for {} ids)",
        uncommitted.len(),
        ids.len()
    );
}

#[test]
fn at_least_once_mode_delivers_every_record_without_transactions() {
    let job = job("alos", "  guarantee: at_least_once\n");
    let ids: BTreeSet<u64> = (0..5_000).collect();
    produce_ids(&job.input, ids.iter().copied());

    let summary = run_until_visible(&job, RunOptions::default(), ids.len());

    // A clean run writes each record once; only crashes may duplicate in this mode.
    assert_exactly_once(&ids, &read_all(&job.output, PARTITIONS, "read_committed"));
    assert_eq!(summary.txn.records_committed, 5_000);
}

#[test]
fn at_least_once_mode_rewinds_without_a_transaction_to_abort() {
    // Every second batch is thrown away and its records consumed again: without transactions
    // nothing is aborted (what was sent stays out), so each id arrives at least once and the
    // job keeps going (it used to call abort_transaction, fail, and stop on the second).
    let (job, ids, summary) =
        run_aborting_every_second_batch("alos-rewind", "  guarantee: at_least_once\n");

    let seen: BTreeSet<u64> = read_all(&job.output, PARTITIONS, "read_committed")
        .into_iter()
        .collect();
    assert_eq!(seen, ids, "every id at least once");
    assert!(summary.txn.aborted >= 2, "{:?}", summary.txn);
    assert_eq!(summary.txn.producer_rebuilds, 0, "{:?}", summary.txn);
}

/// The brokers' SSL listeners and the CA that signed their certificate (`scripts/kafka
/// bootstrap --tls`, `scripts/kafka ca`), exported by scripts/test.
fn kafka_tls() -> (String, String) {
    let var = |name: &str| {
        std::env::var(name).unwrap_or_else(|_| {
            panic!("{name} is not set: this test needs the broker of scripts/kafka; run it with scripts/test")
        })
    };
    (
        var("ONCEFLOW_TEST_BOOTSTRAP_TLS"),
        var("ONCEFLOW_TEST_KAFKA_CA"),
    )
}

#[test]
fn a_job_over_tls_is_exactly_once_and_dlq_commands_take_client_settings() {
    use std::process::{Command, Stdio};
    let (tls_bootstrap, ca) = kafka_tls();
    let name = unique("tls");
    let (input, output, dead) = (unique("tls-in"), unique("tls-out"), format!("{name}.dlq"));
    create_topics(&[&input, &output], PARTITIONS);
    create_topics(&[&dead], 1);
    let (_dir, topology) = topology_file(&format!(
        "name: {name}\ninputs:\n  - {{topic: {input}, codec: json}}\npipeline:\n  - filter: 'value.id >= 0'\noutputs:\n  - topic: {output}\nkafka:\n  common:\n    security.protocol: SSL\n    ssl.ca.location: {ca}\nruntime:\n  session_timeout_ms: 10000\n"
    ));
    let ids: BTreeSet<u64> = (0..3_000).collect();
    produce_ids(&input, ids.iter().copied());
    const POISON: u64 = 1_000_000;
    produce_records(
        &input,
        [(Some(POISON.to_string()), "{not json".to_string())],
    );

    // Only the SSL listeners are given: every connection of the job is TLS, its certificate
    // checked against the CA (librdkafka verifies the broker's name or IP by default).
    let child = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_onceflow"))
            .arg("run")
            .arg(&topology)
            .args(["--bootstrap-servers", &tls_bootstrap])
            .args(["--instance-id", "tls-0", "--progress-interval", "0"])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn onceflow"),
    );
    let seen = wait_for_distinct(&output, PARTITIONS, ids.len(), Duration::from_secs(120));
    let lettered = wait_for_distinct(&dead, 1, 1, Duration::from_secs(60));
    terminate(child);
    assert_eq!(seen, ids.len(), "not every record came through over TLS");
    assert_eq!(lettered, 1, "the poison record was not dead-lettered");
    assert_exactly_once(&ids, &read_all(&output, PARTITIONS, "read_committed"));

    // The dead-letter commands reach the same listeners with -X settings.
    let inspect = Command::new(env!("CARGO_BIN_EXE_onceflow"))
        .args([
            "dlq",
            "inspect",
            &dead,
            "--bootstrap-servers",
            &tls_bootstrap,
        ])
        .args(["-X", "security.protocol=SSL", "-X"])
        .arg(format!("ssl.ca.location={ca}"))
        .output()
        .expect("dlq inspect");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&inspect.stdout),
        String::from_utf8_lossy(&inspect.stderr),
    );
    assert!(inspect.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("bad_json"), "{stdout}");
    assert!(stderr.contains("1 record(s) shown"), "{stderr}");
}
