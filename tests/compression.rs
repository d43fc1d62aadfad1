//! Compressed topics on the real broker, with Kafka's own Java clients as the other side:
//! records written by Kafka's console producer with each codec Kafka has (gzip, snappy, lz4,
//! zstd) pass through a job exactly once, and the job's own output, written with the same
//! `compression.type`, is in batches of that codec as Kafka's log dump reads them.

mod common;

use std::collections::BTreeSet;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

const PARTITIONS: i32 = 3;
const RECORDS: u64 = 3_000;

/// `scripts/kafka` with the tests' broker's settings (its folder comes from the environment,
/// as `scripts/test` started it).
fn kafka_script() -> Command {
    Command::new(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/kafka"))
}

/// The log folders of `topic`'s partitions on the tests' broker (node 1 of `scripts/kafka`).
fn partition_dirs(topic: &str) -> Vec<PathBuf> {
    let state = std::env::var_os("ONCEFLOW_KAFKA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/kafka"));
    let data = state.join("node-1/data");
    let dirs: Vec<PathBuf> = (0..PARTITIONS)
        .map(|p| data.join(format!("{topic}-{p}")))
        .collect();
    assert!(
        dirs.iter().all(|d| d.is_dir()),
        "no log folders of {topic} under {}: this test reads the broker's segments, so it needs the broker `scripts/kafka start` runs (ONCEFLOW_KAFKA_DIR)",
        data.display()
    );
    dirs
}

/// The codec of every record batch of `topic` that holds data (transaction markers, control
/// batches, are never compressed), as Kafka's `DumpLogSegments` reads the segment files;
/// with `transactional`, only the batches of transactions (a job's, not the end markers the
/// tests' reader writes with a plain producer).
fn data_batch_codecs(topic: &str, transactional: bool) -> Vec<String> {
    let files: Vec<String> = partition_dirs(topic)
        .iter()
        .flat_map(|d| std::fs::read_dir(d).expect("a partition folder"))
        .map(|e| e.expect("an entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .map(|p| p.display().to_string())
        .collect();
    let out = kafka_script()
        .args(["tool", "kafka.tools.DumpLogSegments", "--files"])
        .arg(files.join(","))
        .output()
        .expect("DumpLogSegments runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "DumpLogSegments failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    text.lines()
        .filter(|l| l.contains("baseOffset:") && l.contains("isControl: false"))
        .filter(|l| !transactional || l.contains("isTransactional: true"))
        .map(|l| {
            l.split("compresscodec: ")
                .nth(1)
                .and_then(|rest| rest.split_whitespace().next())
                .unwrap_or_else(|| panic!("a batch without its codec: {l}"))
                .to_string()
        })
        .collect()
}

/// Writes `RECORDS` records (key: the id) to `topic` with Kafka's console producer and
/// `compression.type` `codec`.
fn java_produce(topic: &str, codec: &str) {
    let mut producer = kafka_script()
        .args(["console-producer", "--bootstrap-server", &bootstrap()])
        .args(["--topic", topic, "--compression-codec", codec])
        .args([
            "--property",
            "parse.key=true",
            "--property",
            "key.separator=\t",
        ])
        .args(["--producer-property", "linger.ms=20"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("the console producer starts");
    {
        let mut stdin = producer.stdin.take().expect("stdin");
        for id in 0..RECORDS {
            writeln!(
                stdin,
                "{id}\t{{\"id\":{id},\"pad\":\"{}\"}}",
                "x".repeat(200)
            )
            .expect("a line to the producer");
        }
    }
    let status = producer.wait().expect("the console producer ends");
    assert!(status.success(), "the console producer failed: {status}");
}

fn passes_exactly_once(codec: &str) {
    let input = unique(&format!("compressed-{codec}-in"));
    let output = unique(&format!("compressed-{codec}-out"));
    create_topics(&[&input, &output], PARTITIONS);
    java_produce(&input, codec);
    // The other side really compressed: every batch it wrote is in `codec`.
    let written = data_batch_codecs(&input, false);
    assert!(!written.is_empty(), "the console producer wrote no batch");
    assert!(
        written.iter().all(|c| c == codec),
        "the input's batches: {written:?}"
    );

    let yaml = topology_yaml(
        &unique(&format!("compressed-{codec}")),
        &input,
        &output,
        &format!("kafka:\n  producer:\n    compression.type: {codec}\n"),
    );
    let (_dir, topology) = topology_file(&yaml);
    let job = spawn_job(&topology, "c-0", &[]);
    let ids: BTreeSet<u64> = (0..RECORDS).collect();
    let seen = wait_for_distinct(&output, PARTITIONS, ids.len(), Duration::from_secs(90));
    terminate(job);
    assert_eq!(seen, ids.len(), "not every id came through");
    assert_exactly_once(
        &ids,
        &ids_of(&read_records(&output, PARTITIONS, "read_committed")),
    );
    // onceflow's own batches are in `codec` too, as Kafka reads them.
    let produced = data_batch_codecs(&output, true);
    assert!(!produced.is_empty(), "the job wrote no batch");
    assert!(
        produced.iter().all(|c| c == codec),
        "the output's batches: {produced:?}"
    );
}

#[test]
fn a_gzip_topic_passes_exactly_once_and_the_output_is_gzip() {
    passes_exactly_once("gzip");
}

#[test]
fn a_snappy_topic_passes_exactly_once_and_the_output_is_snappy() {
    passes_exactly_once("snappy");
}

#[test]
fn an_lz4_topic_passes_exactly_once_and_the_output_is_lz4() {
    passes_exactly_once("lz4");
}

#[test]
fn a_zstd_topic_passes_exactly_once_and_the_output_is_zstd() {
    passes_exactly_once("zstd");
}
