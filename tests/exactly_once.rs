//! The engine in-process on the real broker: records pass exactly once, and aborted
//! transactions leave nothing visible to read_committed readers.

mod common;

use std::collections::BTreeSet;

use common::*;
use onceflow::engine::{RunOptions, Summary};
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

#[test]
fn aborted_transactions_leave_nothing_visible() {
    // Every second transaction is aborted after its records were produced; the engine rewinds
    // and processes them again in the next one.
    let job = job("abort", "  max_records_per_txn: 500\n");
    let ids: BTreeSet<u64> = (0..5_000).collect();
    produce_ids(&job.input, ids.iter().copied());

    let options = RunOptions {
        abort_every: Some(2),
        ..RunOptions::default()
    };
    let summary = run_until_visible(&job, options, ids.len());

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
