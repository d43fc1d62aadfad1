//! `onceflow bench`: throughput against partition count, next to the broker's ceiling and
//! Kafka Streams.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;

use crate::bench::{self, BenchConfig};

/// `onceflow bench` options. Lists are comma-separated.
#[derive(clap::Args)]
pub struct BenchArgs {
    /// Kafka bootstrap servers. Without it the bench starts a broker with `scripts/kafka
    /// start` (KAFKA_PORT, ONCEFLOW_KAFKA_DIR, ONCEFLOW_CACHE apply) and stops it after.
    #[arg(long, env = "ONCEFLOW_BOOTSTRAP_SERVERS")]
    bootstrap_servers: Option<String>,
    /// Partition counts to measure.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16,32,64")]
    partitions: Vec<i32>,
    /// Records preloaded per partition count.
    #[arg(long, default_value_t = 1_000_000)]
    records: u64,
    /// Value size of each record, in bytes.
    #[arg(long, default_value_t = 1024)]
    record_size: usize,
    /// Commit interval of the at-least-once run (ms).
    #[arg(long, default_value_t = 100)]
    alos_commit_ms: u64,
    /// Commit intervals of the exactly-once runs (ms).
    #[arg(long, value_delimiter = ',', default_value = "100,1000")]
    eos_commit_ms: Vec<u64>,
    /// Commit intervals of the Kafka Streams exactly_once_v2 runs (ms).
    #[arg(long, value_delimiter = ',', default_value = "100")]
    kstreams_commit_ms: Vec<u64>,
    /// Leave Kafka Streams out.
    #[arg(long)]
    no_kstreams: bool,
    /// JVM options of the Kafka Streams peer (space-separated).
    #[arg(long, default_value = "-Xmx512m")]
    java_opts: String,
    /// onceflow instance counts (one group, child processes) at the first exactly-once commit
    /// interval, e.g. 1,2,3.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    instances: Vec<u32>,
    /// Producer linger.ms, for the preload, onceflow and Kafka Streams alike.
    #[arg(long, default_value_t = 5)]
    linger_ms: u64,
    /// Producer batch.size in bytes, for the preload, onceflow and Kafka Streams alike.
    #[arg(long, default_value_t = 262_144)]
    batch_size: u64,
    /// Latency probe: records a second sent once a pipeline has drained the preload.
    #[arg(long, default_value_t = 500)]
    probe_rate: u64,
    /// Latency probe duration in seconds (0 turns the probe off).
    #[arg(long, default_value_t = 3.0)]
    probe_secs: f64,
    /// Give up on a cell after this many seconds.
    #[arg(long, default_value_t = 900)]
    cell_timeout_secs: u64,
    /// Runs of each pipeline cell, in rounds so the modes alternate; the fastest run is
    /// reported (other work on the machine only slows runs down).
    #[arg(long, default_value_t = 1)]
    repeat: u32,
    /// Where to write bench.csv, bench.md and throughput.svg.
    #[arg(long, default_value = "target/bench")]
    out: PathBuf,
    /// The onceflow repository (scripts/kafka, benches/kstreams).
    #[arg(long, default_value = env!("CARGO_MANIFEST_DIR"))]
    repo_dir: PathBuf,
}

pub fn run(args: BenchArgs) -> anyhow::Result<bool> {
    let config = BenchConfig {
        bootstrap_servers: args.bootstrap_servers,
        repo_dir: args.repo_dir,
        onceflow_bin: std::env::current_exe()
            .context("cannot find the onceflow binary to run the pipelines with")?,
        partitions: args.partitions,
        records: args.records,
        record_size: args.record_size,
        alos_commit_ms: args.alos_commit_ms,
        eos_commit_ms: args.eos_commit_ms,
        kstreams_commit_ms: if args.no_kstreams {
            Vec::new()
        } else {
            args.kstreams_commit_ms
        },
        java_opts: args
            .java_opts
            .split_whitespace()
            .map(String::from)
            .collect(),
        instances: args.instances,
        tuning: bench::ProducerTuning {
            linger_ms: args.linger_ms,
            batch_size: args.batch_size,
        },
        probe_rate: args.probe_rate,
        probe_secs: args.probe_secs,
        cell_timeout: Duration::from_secs(args.cell_timeout_secs),
        repeat: args.repeat,
        out_dir: args.out,
    };
    let results = bench::run(&config)?;
    let failed = results.iter().filter(|r| r.error.is_some()).count();
    anyhow::ensure!(failed == 0, "{failed} cell(s) failed; see bench.csv");
    Ok(true)
}
