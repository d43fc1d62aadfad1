//! `onceflow-bench`: throughput against partition count, next to the broker's ceiling and
//! Kafka Streams (the method: src/lib.rs). It runs the pipelines with the `onceflow` binary
//! built beside it (`--onceflow-bin` to name another), and its own ceiling clients as child
//! processes of itself (`--client`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;

use onceflow_bench::{self as bench, BenchConfig};

// The ceiling clients run with the allocator and settings of onceflow's binary
// (onceflow's src/main.rs), so that a ceiling and a pipeline pay the same for memory.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Measure throughput against partition count: the broker's produce/consume ceiling,
/// onceflow at-least-once and exactly-once, and Kafka Streams exactly_once_v2, on one broker
/// in one run. Writes bench.csv, bench.md and throughput.svg, prints the table. Lists are
/// comma-separated.
#[derive(clap::Parser)]
#[command(name = "onceflow-bench", version)]
struct BenchArgs {
    /// The onceflow binary to run the pipelines with. Default: `onceflow` beside this
    /// program (build both with `cargo build --release -p onceflow -p onceflow-bench`).
    #[arg(long, env = "ONCEFLOW_BIN")]
    onceflow_bin: Option<PathBuf>,
    /// Kafka bootstrap servers. Without it the bench starts a broker with `scripts/kafka
    /// start` (KAFKA_PORT, ONCEFLOW_KAFKA_DIR, ONCEFLOW_CACHE apply) and stops it after.
    #[arg(long, env = "ONCEFLOW_BOOTSTRAP_SERVERS")]
    bootstrap_servers: Option<String>,
    /// Partition counts to measure.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16,32,64")]
    partitions: Vec<i32>,
    /// Records preloaded per partition count. Default: sized from a short probe so that the
    /// fastest mode runs for --warmup-secs + --measure-secs.
    #[arg(long)]
    records: Option<u64>,
    /// The most records the probe may size the input to.
    #[arg(long, default_value_t = 6_000_000)]
    max_records: u64,
    /// Seconds after a cell is ready that are not measured (start-up, first commits, the
    /// JVM's warm-up).
    #[arg(long, default_value_t = 5.0)]
    warmup_secs: f64,
    /// Seconds each cell should be measured for after its warm-up (the probe sizes the input
    /// to the fastest mode; a cell measured for less is marked short).
    #[arg(long, default_value_t = 15.0)]
    measure_secs: f64,
    /// Value size of each record, in bytes.
    #[arg(long, default_value_t = 1024)]
    record_size: usize,
    /// Commit interval of the at-least-once run (ms).
    #[arg(long, default_value_t = 100)]
    alos_commit_ms: u64,
    /// Commit intervals of the exactly-once runs (ms).
    #[arg(long, value_delimiter = ',', default_value = "100,1000")]
    eos_commit_ms: Vec<u64>,
    /// Commit intervals of exactly-once runs with `overlap_commits: true` (ms; none by
    /// default): the loop goes on while a transaction commits, beside the default that pauses.
    #[arg(long, value_delimiter = ',')]
    eos_overlap_commit_ms: Vec<u64>,
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
    /// Run each pipeline's latency probe at this share of the rate it was just measured at
    /// (0.5: half load) instead of at --probe-rate.
    #[arg(long)]
    probe_load: Option<f64>,
    /// Give up on a cell after this many seconds.
    #[arg(long, default_value_t = 900)]
    cell_timeout_secs: u64,
    /// Rounds: every mode of a partition count runs once per round, interleaved (A B C A B C
    /// ...); figures are medians with their range, ratios are taken per round.
    #[arg(long, alias = "repeat", default_value_t = 3)]
    rounds: u32,
    /// Leave out Kafka's ProducerPerformance / ConsumerPerformance cross-check.
    #[arg(long)]
    no_kafka_perf: bool,
    /// Do not fill the page cache. By default, when the broker runs on this machine, the free
    /// memory (less 256 MiB) is taken by the page cache of sparse files before the first cell
    /// and again after each topic deletion, as a broker's log takes it over time, so that no
    /// cell pays for the first touch of fresh memory (docs/benchmarks.md, "The broker's slow
    /// mode is fresh memory").
    #[arg(long)]
    no_page_cache_fill: bool,
    /// Run a ceiling client instead of the bench (what the bench starts as a child process):
    /// `produce` writes --records records to --client-topic and waits for SIGTERM; `rpw`
    /// reads --client-topic and writes it to --client-output until SIGTERM.
    #[arg(long, hide = true, value_parser = ["produce", "rpw"])]
    client: Option<String>,
    #[arg(long, hide = true)]
    client_topic: Option<String>,
    #[arg(long, hide = true)]
    client_output: Option<String>,
    /// What the pipelines do: `pass-through`, or `count-by-key` (onceflow's `aggregate`
    /// count against Kafka Streams' `groupByKey().count()`, exactly-once only, no latency
    /// probe: a stateful topology reads one topic).
    #[arg(long, value_enum, default_value = "pass-through")]
    workload: bench::plan::Workload,
    /// Distinct keys of the count-by-key input (the ids modulo this).
    #[arg(long, default_value_t = 100_000)]
    keys: u64,
    /// Where to write bench.csv, bench.md and throughput.svg.
    #[arg(long, default_value = "target/bench")]
    out: PathBuf,
    /// The onceflow repository (scripts/kafka, benches/kstreams). Default: the first directory
    /// holding both, above the current directory, then above the executable's.
    #[arg(long)]
    repo_dir: Option<PathBuf>,
}

/// What the bench runs from the repository: the broker script and the Kafka Streams peer.
const REPO_MARKERS: [&str; 2] = ["scripts/kafka", "benches/kstreams"];

/// The first directory holding every one of [`REPO_MARKERS`], walking up from each of
/// `starts` in turn.
fn find_repo_dir(starts: &[PathBuf]) -> Option<PathBuf> {
    starts
        .iter()
        .flat_map(|start| start.ancestors())
        .find(|dir| REPO_MARKERS.iter().all(|m| dir.join(m).exists()))
        .map(Path::to_path_buf)
}

/// The repository: the one given, or the one found above the current directory or the
/// executable's. Not finding it is an error only when the run `needs` it.
fn repo_dir(given: Option<PathBuf>, needs: bool) -> anyhow::Result<Option<PathBuf>> {
    if given.is_some() {
        return Ok(given);
    }
    let starts: Vec<PathBuf> = [
        std::env::current_dir().ok(),
        std::env::current_exe()
            .ok()
            .and_then(|exe| exe.parent().map(Path::to_path_buf)),
    ]
    .into_iter()
    .flatten()
    .collect();
    let found = find_repo_dir(&starts);
    anyhow::ensure!(
        found.is_some() || !needs,
        "cannot find the onceflow repository (a directory with {}) above the current \
         directory or the executable's; pass --repo-dir (it is needed to start a broker and to \
         run Kafka Streams)",
        REPO_MARKERS.join(" and ")
    );
    Ok(found)
}

/// Runs a ceiling client (`--client`) of a bench that started this process.
fn run_client(args: BenchArgs, kind: &str) -> anyhow::Result<()> {
    let bootstrap = args
        .bootstrap_servers
        .context("--client needs --bootstrap-servers")?;
    let topic = args.client_topic.context("--client needs --client-topic")?;
    let client = if kind == "produce" {
        bench::Client::Produce {
            topic,
            records: args.records.context("--client produce needs --records")?,
        }
    } else {
        bench::Client::Rpw {
            input: topic,
            partitions: args.partitions.first().copied().unwrap_or(1),
            output: args
                .client_output
                .context("--client rpw needs --client-output")?,
        }
    };
    let tuning = bench::ProducerTuning {
        linger_ms: args.linger_ms,
        batch_size: args.batch_size,
    };
    bench::run_client(&bootstrap, &client, args.record_size, tuning)?;
    Ok(())
}

fn main() -> ExitCode {
    onceflow::alloc::keep_freed_memory();
    onceflow::telemetry::init_tracing(false);
    match run(BenchArgs::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", onceflow::cli::chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// The onceflow binary: the one given, or `onceflow` beside this program.
fn onceflow_bin(given: Option<PathBuf>, this: &Path) -> anyhow::Result<PathBuf> {
    if let Some(bin) = given {
        return Ok(bin);
    }
    let bin = this.with_file_name("onceflow");
    anyhow::ensure!(
        bin.is_file(),
        "cannot find the onceflow binary to run the pipelines with at {}: build it beside \
         this program (`cargo build --release -p onceflow -p onceflow-bench`) or pass \
         --onceflow-bin",
        bin.display()
    );
    Ok(bin)
}

fn run(args: BenchArgs) -> anyhow::Result<()> {
    if let Some(kind) = args.client.clone() {
        return run_client(args, &kind);
    }
    anyhow::ensure!(
        args.warmup_secs >= 0.0 && args.measure_secs > 0.0,
        "--warmup-secs must be >= 0 and --measure-secs > 0"
    );
    let kstreams_commit_ms = if args.no_kstreams {
        Vec::new()
    } else {
        args.kstreams_commit_ms
    };
    if let Some(share) = args.probe_load {
        anyhow::ensure!(
            share > 0.0 && share <= 1.0,
            "--probe-load must be a share of the measured rate above 0 and at most 1, not {share}"
        );
    }
    let needs_repo =
        args.bootstrap_servers.is_none() || !kstreams_commit_ms.is_empty() || !args.no_kafka_perf;
    let this = std::env::current_exe().context("cannot find this program's own binary")?;
    let config = BenchConfig {
        repo_dir: repo_dir(args.repo_dir, needs_repo)?,
        bootstrap_servers: args.bootstrap_servers,
        onceflow_bin: onceflow_bin(args.onceflow_bin, &this)?,
        client_bin: this,
        partitions: args.partitions,
        records: args.records,
        max_records: args.max_records,
        warmup_secs: args.warmup_secs,
        measure_secs: args.measure_secs,
        record_size: args.record_size,
        alos_commit_ms: args.alos_commit_ms,
        eos_commit_ms: args.eos_commit_ms,
        eos_overlap_commit_ms: args.eos_overlap_commit_ms,
        kstreams_commit_ms,
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
        probe_rate: if args.workload == bench::plan::Workload::CountByKey {
            0
        } else {
            args.probe_rate
        },
        probe_secs: args.probe_secs,
        probe_load: args.probe_load,
        kafka_perf: !args.no_kafka_perf,
        fill_page_cache: !args.no_page_cache_fill,
        cell_timeout: Duration::from_secs(args.cell_timeout_secs),
        rounds: args.rounds,
        workload: args.workload,
        keys: args.keys,
        command: command_line(),
        out_dir: args.out,
    };
    let results = bench::run(&config)?;
    let failed = results.iter().filter(|r| r.error.is_some()).count();
    anyhow::ensure!(failed == 0, "{failed} cell(s) failed; see bench.csv");
    Ok(())
}

/// This command line as typed (the program by its file name), for the report.
fn command_line() -> String {
    std::env::args()
        .enumerate()
        .map(|(i, a)| {
            let a = if i == 0 {
                Path::new(&a)
                    .file_name()
                    .map(|f| f.to_string_lossy().into_owned())
                    .unwrap_or(a)
            } else {
                a
            };
            if a.contains(' ') { format!("'{a}'") } else { a }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tree with a repository (`repo`, its build output under `repo/target/release`), a
    /// directory with only one of the markers (`half`) and an unrelated one (`elsewhere`).
    fn tree() -> tempfile::TempDir {
        let root = tempfile::tempdir().expect("tempdir");
        for dir in [
            "repo/scripts",
            "repo/benches/kstreams",
            "repo/target/release",
            "half/scripts",
            "elsewhere/deeper",
        ] {
            std::fs::create_dir_all(root.path().join(dir)).expect("mkdir");
        }
        for file in ["repo/scripts/kafka", "half/scripts/kafka"] {
            std::fs::write(root.path().join(file), "#!/bin/sh\n").expect("write");
        }
        root
    }

    #[test]
    fn the_repository_is_found_from_itself_or_below() {
        let root = tree();
        let repo = root.path().join("repo");
        assert_eq!(
            find_repo_dir(std::slice::from_ref(&repo)),
            Some(repo.clone())
        );
        assert_eq!(
            find_repo_dir(&[repo.join("target/release")]),
            Some(repo.clone())
        );
    }

    #[test]
    fn the_next_start_is_tried_when_the_first_leads_nowhere() {
        let root = tree();
        let repo = root.path().join("repo");
        let starts = [
            root.path().join("elsewhere/deeper"),
            root.path().join("half"),
            repo.join("target/release"),
        ];
        assert_eq!(find_repo_dir(&starts), Some(repo));
    }

    #[test]
    fn a_directory_with_only_some_markers_is_not_the_repository() {
        let root = tree();
        let starts = [
            root.path().join("half/scripts"),
            root.path().join("elsewhere"),
        ];
        assert_eq!(find_repo_dir(&starts), None);
        assert_eq!(find_repo_dir(&[]), None);
    }

    #[test]
    fn a_given_repository_is_taken_as_it_is() {
        let given = PathBuf::from("/nowhere/onceflow");
        assert_eq!(
            repo_dir(Some(given.clone()), true).expect("given"),
            Some(given)
        );
    }
}
