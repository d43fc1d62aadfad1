//! `onceflow-bench`: throughput against partition count, next to the broker's ceilings and
//! Kafka Streams, on one broker in one run, by a method meant to hold on a shared machine.
//!
//! For every partition count the bench first sizes the input from a short probe (a few
//! seconds of producing, then of reading and writing it back), so that the fastest mode
//! needs at least `warmup + measure` seconds for it, and preloads that many records of S
//! bytes into a fresh input topic; a cell that runs faster than the probe foresaw (and so
//! ran out of input early: marked short) has the input topped up to its own rate before the
//! next cell. Then it runs the modes in interleaved rounds (A B C A B C ...), each cell with
//! a fresh output topic and consumer group:
//!
//! * **produce-only**: a child process writes N records to a fresh topic with an idempotent
//!   producer tuned like the pipelines' (the broker's produce ceiling);
//! * **rpw-ceiling**: a child process reads the input and writes it to the output, no
//!   transaction, no offset commit, no processing (the read-process-write ceiling);
//! * onceflow at-least-once and exactly-once (`onceflow run` child processes, one per
//!   instance), and the Kafka Streams peer under `exactly_once_v2`
//!   (`benches/kstreams/Bench.java`) with the same commit interval, one stream thread, the
//!   same producer `linger.ms`/`batch.size`.
//!
//! A read_committed reader follows each cell's output. The measured window starts at the
//! first record that becomes visible once `warmup` seconds have passed since the cell was
//! ready (start-up, the first commit, the JVM's warm-up are excluded) and ends when the reader
//! has all N; throughput is the records seen in that window over its length. The CPU time of
//! the cell's processes, of the broker and of the whole machine is read from `/proc` at both
//! ends of the window, the load average throughout. After the rounds, Kafka's own
//! `ProducerPerformance` and `ConsumerPerformance` run once as a cross-check of the ceilings.
//!
//! After a pipeline has drained the input, a paced probe of timestamped records measures
//! end-to-end latency while it keeps up, and the children are stopped with SIGTERM. Each
//! child's peak RSS (`VmHWM`) is read just before, its whole CPU time comes from `wait4`, and
//! onceflow's `--summary-json` gives its commit durations. The report (see [`report`]) gives
//! medians and ranges over the rounds, and per-round (paired) ratios.
//!
//! The crate's parts: [`plan`] (the configuration and the cells of a round), `broker` (the
//! broker started and warmed up), `fill` (the page cache filled), `cells` (each cell
//! launched, measured and stopped), `client` (the ceiling clients), `kstreams` (the Kafka
//! Streams peer), `summary` (the pipelines' commit summaries), `perf` (Kafka's perf tools),
//! `procs` and `machine` (child processes, `/proc`), [`report`] and [`stats`]. It runs the
//! `onceflow` binary built beside it; `src/main.rs` is its command line.

mod broker;
mod cells;
mod client;
mod fill;
mod kafka;
mod kstreams;
mod machine;
mod perf;
pub mod plan;
mod procs;
pub mod report;
pub mod stats;
mod summary;

use std::path::PathBuf;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use onceflow::kafka::Cluster;
use onceflow::kafka::admin::{Admin, AdminError};
use plotters::drawing::DrawingAreaErrorKind;
use rdkafka::error::KafkaError;

use broker::{Broker, warm_up};
use cells::CellCtx;
pub use client::{Client, run_client};
use fill::{fill_page_cache, refill};
pub use kafka::ProducerTuning;
/// The read-process-write ceiling client's loop, for benches/client-ceiling to run as is.
pub use kafka::read_process_write;
use kstreams::fetch_kstreams;
pub use plan::{BenchConfig, CellResult, Kind, NOISE_CORES, Spec, plan};

/// Why the bench could not go on.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A Kafka client call failed; `what` names it.
    #[error("kafka: {what}: {source}")]
    Kafka {
        what: &'static str,
        #[source]
        source: KafkaError,
    },
    #[error("kafka: {0}")]
    Admin(#[from] AdminError),
    #[error("kafka: {count} records were not delivered (first error: {first})")]
    Undelivered { count: u64, first: KafkaError },
    #[error("kafka: the output reader stopped")]
    ReaderStopped,
    /// A file, a process or a thread could not be used; `what` says which.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {source}", path.display())]
    Plot {
        path: PathBuf,
        #[source]
        source: DrawingAreaErrorKind<std::io::Error>,
    },
    #[error("{0}")]
    Other(String),
    #[error("timed out: {0}")]
    Timeout(String),
    #[error("{0}")]
    Child(String),
    #[error("broker: cannot run {}: {source}", script.display())]
    BrokerScript {
        script: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("broker: {0}")]
    Broker(String),
}

impl BenchError {
    /// The error of the Kafka client call `what`.
    fn kafka(what: &'static str) -> impl FnOnce(KafkaError) -> BenchError {
        move |source| BenchError::Kafka { what, source }
    }

    /// The error of using `what` (a file, a process, a thread).
    fn io(what: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> BenchError {
        move |source| BenchError::Io {
            what: what.to_string(),
            source,
        }
    }
}

/// Runs the whole matrix and writes the reports; returns every cell's result.
pub fn run(cfg: &BenchConfig) -> Result<Vec<CellResult>, BenchError> {
    std::fs::create_dir_all(&cfg.out_dir).map_err(BenchError::io(cfg.out_dir.display()))?;
    let kstreams_libs = if cfg.kstreams_commit_ms.is_empty() {
        None
    } else {
        Some(fetch_kstreams(cfg.repo_dir()?)?)
    };
    let mut broker = Broker::new(cfg)?;
    let bootstrap = broker.bootstrap.as_str();
    let admin = Admin::new(&Cluster::new(bootstrap))?;
    let broker_pid = machine::bootstrap_port(bootstrap).and_then(machine::listener_pid);
    let run_id = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let work = std::env::temp_dir().join(format!("onceflow-bench-{run_id}-{}", std::process::id()));
    std::fs::create_dir_all(&work).map_err(BenchError::io(work.display()))?;

    // Only a broker on this machine writes into this machine's memory.
    let fill = if cfg.fill_page_cache && broker_pid.is_some() {
        fill_page_cache(&work)
    } else {
        None
    };
    // From here on (the report included), whether it was filled, not whether it was asked.
    let cfg = &BenchConfig {
        fill_page_cache: fill.is_some(),
        ..cfg.clone()
    };
    warm_up(cfg, bootstrap, &admin, run_id)?;
    refill(fill.as_ref());

    let specs = plan(cfg);
    let rounds = cfg.rounds.max(1);
    let bar = progress_bar(cfg, &specs, rounds);
    if broker_pid.is_none() {
        say(
            &bar,
            "cannot find the broker's process: its CPU is not recorded",
        );
    }
    let mut results: Vec<CellResult> = Vec::new();
    for &partitions in &cfg.partitions {
        let input = format!("onceflow-bench-{run_id}-p{partitions}");
        let mut ctx = CellCtx {
            cfg,
            bootstrap,
            admin: &admin,
            input: &input,
            partitions,
            records: 0,
            run_id,
            round: 0,
            work: &work,
            kstreams_libs: kstreams_libs.as_deref(),
            broker_pid,
            bar: &bar,
            fill: fill.as_ref(),
            // At the first partition count only: the broker's JIT is warm after it.
            warm_transactions: cfg.partitions.first() == Some(&partitions),
        };
        ctx.run_cells(&specs, rounds, &mut results);
        if let Err(e) = admin.delete_topics(&[&input]) {
            say(&bar, format!("could not delete {input}: {e}"));
        }
        refill(fill.as_ref());
        // An interrupted run keeps the reports of the partition counts it finished.
        if let Err(e) = write_files(cfg, &results) {
            say(&bar, format!("{e}"));
        }
    }
    bar.finish_and_clear();
    let _ = std::fs::remove_dir_all(&work);
    broker.keep_logs = results.iter().any(|r| r.error.is_some());
    drop(broker);
    drop(fill);
    write_reports(cfg, &results)?;
    Ok(results)
}

/// Prints `line` above the progress bar, or to standard error when there is no bar to draw
/// (standard error is not a terminal, and indicatif drops the lines of a hidden bar): a bench
/// run in a pipe or in CI still says what it does.
fn say(bar: &ProgressBar, line: impl AsRef<str>) {
    if bar.is_hidden() {
        eprintln!("{}", line.as_ref());
    } else {
        bar.println(line.as_ref());
    }
}

/// A bar of every cell to run: each mode once per round, the cross-checks once, at every
/// partition count.
fn progress_bar(cfg: &BenchConfig, specs: &[Spec], rounds: u32) -> ProgressBar {
    let per_count = specs.len() * rounds as usize + if cfg.kafka_perf { 2 } else { 0 };
    let bar = ProgressBar::new((cfg.partitions.len() * per_count) as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:24} {pos}/{len} cells  {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

/// Writes bench.csv, bench.md and throughput.svg; returns the markdown.
fn write_files(cfg: &BenchConfig, results: &[CellResult]) -> Result<String, BenchError> {
    report::write_csv(&cfg.out_dir.join("bench.csv"), cfg, results)?;
    let markdown = report::markdown(cfg, results);
    std::fs::write(cfg.out_dir.join("bench.md"), &markdown).map_err(BenchError::io("bench.md"))?;
    report::plot(&cfg.out_dir.join("throughput.svg"), cfg, results)?;
    Ok(markdown)
}

/// Writes the reports and prints the markdown.
fn write_reports(cfg: &BenchConfig, results: &[CellResult]) -> Result<(), BenchError> {
    println!("{}", write_files(cfg, results)?);
    Ok(())
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_say_what_failed_then_why() {
        let io = BenchError::io("bench.md")(std::io::Error::other("disk full"));
        assert_eq!(io.to_string(), "bench.md: disk full");
        assert!(std::error::Error::source(&io).is_some());
        let kafka = BenchError::kafka("flush")(KafkaError::Canceled);
        assert_eq!(
            kafka.to_string(),
            format!("kafka: flush: {}", KafkaError::Canceled)
        );
        let undelivered = BenchError::Undelivered {
            count: 3,
            first: KafkaError::Canceled,
        };
        assert_eq!(
            undelivered.to_string(),
            format!(
                "kafka: 3 records were not delivered (first error: {})",
                KafkaError::Canceled
            )
        );
    }
}
