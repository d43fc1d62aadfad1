//! `onceflow bench`: throughput against partition count, next to the broker's ceilings and
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

mod kafka;
mod machine;
mod perf;
mod procs;
pub mod report;
pub mod stats;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use plotters::drawing::DrawingAreaErrorKind;
use rdkafka::error::KafkaError;

use crate::histogram::Histogram;
use crate::kafka::Cluster;
use crate::kafka::admin::{Admin, AdminError};
use crate::txn::CommitSteps;
use kafka::OutputReader;
pub use kafka::ProducerTuning;
/// The read-process-write ceiling client's loop, for benches/client-ceiling to run as is.
pub use kafka::read_process_write;
use procs::Proc;

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

/// What to measure and where.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// The broker to use; `None` starts one with `scripts/kafka start` (and stops it after).
    pub bootstrap_servers: Option<String>,
    /// The repository (for `scripts/kafka` and `benches/kstreams`); only needed to start a
    /// broker, to run Kafka Streams or Kafka's perf tools.
    pub repo_dir: Option<PathBuf>,
    /// The `onceflow` binary to run the pipelines and the ceiling clients with.
    pub onceflow_bin: PathBuf,
    pub partitions: Vec<i32>,
    /// Records per partition count; `None`: sized from a probe (see the module doc).
    pub records: Option<u64>,
    /// The most records a probe may size the input to.
    pub max_records: u64,
    pub record_size: usize,
    /// Seconds after a cell is ready that are not measured.
    pub warmup_secs: f64,
    /// Seconds the fastest mode should be measured for (the probe sizes the input to it; a
    /// cell measured for less is marked short).
    pub measure_secs: f64,
    /// Commit interval of the at-least-once run.
    pub alos_commit_ms: u64,
    /// Commit intervals of the exactly-once runs.
    pub eos_commit_ms: Vec<u64>,
    /// Commit intervals of exactly-once runs with overlapped commits.
    pub eos_overlap_commit_ms: Vec<u64>,
    /// Commit intervals of the Kafka Streams runs; empty: no Kafka Streams.
    pub kstreams_commit_ms: Vec<u64>,
    /// JVM options of the Kafka Streams peer.
    pub java_opts: Vec<String>,
    /// Instance counts of extra exactly-once runs (at the first EOS commit interval); 1 is
    /// always run.
    pub instances: Vec<u32>,
    pub tuning: ProducerTuning,
    /// Probe records a second, and for how long; 0 turns the latency probe off.
    pub probe_rate: u64,
    pub probe_secs: f64,
    /// When set, each pipeline's probe runs at this share of the rate the pipeline was just
    /// measured at (0.5: half load) instead of at `probe_rate`.
    pub probe_load: Option<f64>,
    /// Run Kafka's ProducerPerformance and ConsumerPerformance as a cross-check.
    pub kafka_perf: bool,
    /// Fill the page cache before the first cell ([`machine::PageCacheFill`]); in the
    /// report, whether it was filled (only a broker on this machine is filled for, and only
    /// with more than 2 GiB free).
    pub fill_page_cache: bool,
    /// Give up on a cell after this long.
    pub cell_timeout: Duration,
    /// Rounds: every mode of a partition count runs once per round, in plan order.
    pub rounds: u32,
    /// The command line, for the report.
    pub command: String,
    /// Where bench.csv, bench.md and throughput.svg go.
    pub out_dir: PathBuf,
}

impl BenchConfig {
    fn repo_dir(&self) -> Result<&Path, BenchError> {
        self.repo_dir.as_deref().ok_or_else(|| {
            BenchError::Other(
                "no repository directory given (for scripts/kafka and benches/kstreams)".into(),
            )
        })
    }
}

/// What a cell runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Producing N records (librdkafka, idempotent, the pipelines' tuning): the produce-only
    /// ceiling.
    Produce,
    /// Reading the input and writing it out, no transaction, no processing: the
    /// read-process-write ceiling of every pipeline.
    Rpw,
    /// onceflow, `guarantee: at_least_once`.
    Alos,
    /// onceflow, `guarantee: exactly_once`.
    Eos,
    /// onceflow, `guarantee: exactly_once`, `overlap_commits: true`: the loop goes on while a
    /// transaction commits.
    EosOverlap,
    /// Kafka Streams, `processing.guarantee: exactly_once_v2`.
    KStreams,
    /// Kafka's `ProducerPerformance` (the cross-check of produce-only).
    ProducerPerf,
    /// Kafka's `ConsumerPerformance` over the input (the cross-check of the read side).
    ConsumerPerf,
}

/// One measurement: a pipeline (or a ceiling) at one partition count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spec {
    pub kind: Kind,
    pub commit_ms: Option<u64>,
    pub instances: u32,
}

fn interval(ms: u64) -> String {
    if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

impl Spec {
    fn of(kind: Kind) -> Spec {
        Spec {
            kind,
            commit_ms: None,
            instances: 1,
        }
    }

    /// Whether this cell runs a pipeline (the others measure the broker's ceilings).
    pub fn is_pipeline(&self) -> bool {
        matches!(
            self.kind,
            Kind::Alos | Kind::Eos | Kind::EosOverlap | Kind::KStreams
        )
    }

    /// Whether this cell is one of Kafka's perf tools (run once, not in the rounds).
    pub fn is_cross_check(&self) -> bool {
        matches!(self.kind, Kind::ProducerPerf | Kind::ConsumerPerf)
    }

    pub fn label(&self) -> String {
        let ms = self.commit_ms.map(interval).unwrap_or_default();
        let mut label = match self.kind {
            Kind::Produce => "produce-only".to_string(),
            Kind::Rpw => "rpw-ceiling".to_string(),
            Kind::Alos => format!("alos-{ms}"),
            Kind::Eos => format!("eos-{ms}"),
            Kind::EosOverlap => format!("eos-overlap-{ms}"),
            Kind::KStreams => format!("kstreams-eos-{ms}"),
            Kind::ProducerPerf => "kafka-producer-perf".to_string(),
            Kind::ConsumerPerf => "kafka-consumer-perf".to_string(),
        };
        if self.instances > 1 {
            label.push_str(&format!("-x{}", self.instances));
        }
        label
    }
}

/// The measurements of one cell in one round.
#[derive(Debug, Clone)]
pub struct CellResult {
    pub partitions: i32,
    pub spec: Spec,
    /// 0-based; the cross-checks run once, as round 0.
    pub round: u32,
    /// Records in the input (what the cell moves in all).
    pub records: u64,
    pub record_size: usize,
    /// Length of the measured window, in seconds.
    pub window_s: Option<f64>,
    /// Records that became visible in the window.
    pub window_records: Option<u64>,
    /// Whether the window starts after the warm-up (`false`: the cell drained the input
    /// before the warm-up ended, so the window is all of it).
    pub warmed_up: bool,
    /// From launching the cell's processes to the first of them being ready.
    pub startup_s: Option<f64>,
    pub commits: Option<u64>,
    pub commit: Option<Histogram>,
    /// onceflow's commits step by step (Kafka Streams reports whole commits only).
    pub commit_steps: Option<CommitSteps>,
    pub e2e: Option<Histogram>,
    /// Peak RSS of the largest process.
    pub peak_rss_mib: Option<f64>,
    /// CPU time (user + system) of the cell's processes, from launch to exit.
    pub cpu_s: Option<f64>,
    /// CPU time of the cell's processes within the window.
    pub window_cpu_s: Option<f64>,
    /// The highest 1-minute load average seen while the cell ran.
    pub load1: Option<f64>,
    /// Cores the broker used on average in the window.
    pub broker_cores: Option<f64>,
    /// Cores the whole machine used on average in the window (everything: this cell, the
    /// broker, the bench's reader, and whatever else runs here).
    pub machine_cores: Option<f64>,
    /// Cores used in the window by everything else: the machine less the cell's processes,
    /// the broker and this bench (its reader). What makes a cell noisy.
    pub other_cores: Option<f64>,
    /// MiB the broker read from storage in the window: records no longer in the page cache.
    pub broker_read_mib: Option<f64>,
    /// MiB of memory the kernel reclaimed in the window, machine-wide (docs/benchmarks.md,
    /// "The broker's slow mode is fresh memory").
    pub reclaimed_mib: Option<f64>,
    /// MiB of memory free when the window began: what the broker writes into as fresh memory
    /// before it takes pages back from the page cache.
    pub free_mib: Option<f64>,
    pub error: Option<String>,
}

impl CellResult {
    fn new(partitions: i32, spec: Spec, round: u32, records: u64, cfg: &BenchConfig) -> Self {
        CellResult {
            partitions,
            spec,
            round,
            records,
            record_size: cfg.record_size,
            window_s: None,
            window_records: None,
            warmed_up: false,
            startup_s: None,
            commits: None,
            commit: None,
            commit_steps: None,
            e2e: None,
            peak_rss_mib: None,
            cpu_s: None,
            window_cpu_s: None,
            load1: None,
            broker_cores: None,
            machine_cores: None,
            other_cores: None,
            broker_read_mib: None,
            reclaimed_mib: None,
            free_mib: None,
            error: None,
        }
    }

    pub fn records_per_s(&self) -> Option<f64> {
        if self.error.is_some() {
            return None;
        }
        let s = self.window_s.filter(|s| *s > 0.0)?;
        Some(self.window_records? as f64 / s)
    }

    /// CPU time of the cell's own processes per record, in the window, in microseconds.
    pub fn cpu_us_per_record(&self) -> Option<f64> {
        let n = self.window_records.filter(|n| *n > 0)?;
        self.error
            .is_none()
            .then_some(self.window_cpu_s? * 1e6 / n as f64)
    }

    /// Records per CPU-second of the cell's own processes, in the window.
    pub fn records_per_cpu_s(&self) -> Option<f64> {
        self.cpu_us_per_record()
            .filter(|us| *us > 0.0)
            .map(|us| 1e6 / us)
    }

    pub fn mb_per_s(&self) -> Option<f64> {
        self.records_per_s()
            .map(|r| r * self.record_size as f64 / 1e6)
    }

    /// Whether something besides the cell, the broker and this bench used more than
    /// [`NOISE_CORES`] in the window (without that reading: the load average above the
    /// cores). The load average alone cannot tell: a broker, a pipeline and the bench's
    /// reader keep it above 2 on a 2-core machine with nothing else running.
    pub fn noisy(&self, cores: usize) -> bool {
        match self.other_cores {
            Some(other) => other > NOISE_CORES,
            None => self.load1.is_some_and(|l| l > cores as f64),
        }
    }

    /// Whether the window missed the warm-up or is shorter than asked (90 % of
    /// `measure_secs`): such a cell says more about start-up than about steady state.
    pub fn short(&self, cfg: &BenchConfig) -> bool {
        !self.spec.is_cross_check()
            && self.error.is_none()
            && ((cfg.warmup_secs > 0.0 && !self.warmed_up)
                || self.window_s.is_some_and(|w| w < cfg.measure_secs * 0.9))
    }
}

/// The cells of every round, at every partition count, in order.
pub fn plan(cfg: &BenchConfig) -> Vec<Spec> {
    let mut specs = vec![
        Spec::of(Kind::Produce),
        Spec::of(Kind::Rpw),
        Spec {
            kind: Kind::Alos,
            commit_ms: Some(cfg.alos_commit_ms),
            instances: 1,
        },
    ];
    for &ms in &cfg.eos_commit_ms {
        specs.push(Spec {
            kind: Kind::Eos,
            commit_ms: Some(ms),
            instances: 1,
        });
    }
    for &ms in &cfg.eos_overlap_commit_ms {
        specs.push(Spec {
            kind: Kind::EosOverlap,
            commit_ms: Some(ms),
            instances: 1,
        });
    }
    for &ms in &cfg.kstreams_commit_ms {
        specs.push(Spec {
            kind: Kind::KStreams,
            commit_ms: Some(ms),
            instances: 1,
        });
    }
    if let Some(&ms) = cfg.eos_commit_ms.first() {
        for &n in cfg.instances.iter().filter(|n| **n > 1) {
            specs.push(Spec {
                kind: Kind::Eos,
                commit_ms: Some(ms),
                instances: n,
            });
        }
    }
    specs
}

/// Settings of the broker the bench starts: a deleted topic's log is deleted at once, not a
/// minute later (`log.segment.delete.delay.ms`, 60 s by default) and not only once the broker
/// has run 30 s (`log.initial.task.delay.ms`): its memory is freed, and filled again
/// ([`refill`]), before the next cell, not during it.
const BROKER_SETTINGS: &str = "log.segment.delete.delay.ms=0 log.initial.task.delay.ms=0";

/// A broker this bench uses, and stops when it started it (wiping its data unless a cell
/// failed: then its logs stay for a look).
struct Broker {
    bootstrap: String,
    script: Option<PathBuf>,
    keep_logs: bool,
}

impl Broker {
    fn new(cfg: &BenchConfig) -> Result<Broker, BenchError> {
        if let Some(b) = &cfg.bootstrap_servers {
            return Ok(Broker {
                bootstrap: b.clone(),
                script: None,
                keep_logs: false,
            });
        }
        let script = cfg.repo_dir()?.join("scripts/kafka");
        let running = Command::new(&script)
            .arg("status")
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        let overrides = std::env::var("KAFKA_OVERRIDES").unwrap_or_default();
        let out = Command::new(&script)
            .arg(if running { "bootstrap" } else { "start" })
            .env("KAFKA_OVERRIDES", format!("{overrides} {BROKER_SETTINGS}"))
            .stderr(std::process::Stdio::inherit())
            .output()
            .map_err(|source| BenchError::BrokerScript {
                script: script.clone(),
                source,
            })?;
        let bootstrap = String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .unwrap_or("")
            .trim()
            .to_string();
        if !out.status.success() || bootstrap.is_empty() {
            return Err(BenchError::Broker(format!(
                "{} start failed ({})",
                script.display(),
                out.status
            )));
        }
        // A broker that was already running belongs to someone else: leave it running.
        Ok(Broker {
            bootstrap,
            script: (!running).then_some(script),
            keep_logs: false,
        })
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Some(script) = &self.script {
            let args: &[&str] = if self.keep_logs {
                &["stop"]
            } else {
                &["stop", "--wipe"]
            };
            let _ = Command::new(script)
                .args(args)
                .stdout(std::process::Stdio::null())
                .status();
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

/// Memory left free when the page cache is filled. Small: what is free when a cell starts,
/// less the kernel's own reserve (its high watermarks, about 115 MiB here), the broker
/// writes into as fresh memory before the kernel reclaims anything; the processes of a cell
/// take clean page-cache pages back as readily as free ones. With 1 GiB left, each
/// 2,000,000-record run of `compare-builds` still wrote half its output into fresh memory.
const FILL_MARGIN: u64 = 256 << 20;

/// The least free memory worth a first fill.
const FILL_FIRST_MIN: u64 = 1 << 30;

/// Fills the page cache with the free memory less [`FILL_MARGIN`], in `dir`; `None` when less
/// than [`FILL_FIRST_MIN`] would be filled or the file cannot be made (said on standard
/// error: the run goes on).
fn fill_page_cache(dir: &Path) -> Option<machine::PageCacheFill> {
    let bytes = machine::mem_free_bytes()?.checked_sub(FILL_MARGIN)?;
    if bytes < FILL_FIRST_MIN {
        return None;
    }
    let gib = bytes as f64 / f64::from(1u32 << 30);
    eprintln!(
        "filling the page cache with {gib:.1} GiB (a sparse file's pages, nothing on disk), as \
         a broker's log fills it over time..."
    );
    let started = Instant::now();
    match machine::PageCacheFill::new(dir, bytes) {
        Ok(fill) => {
            eprintln!(
                "page cache filled in {:.0} s",
                started.elapsed().as_secs_f64()
            );
            Some(fill)
        }
        Err(e) => {
            eprintln!("could not fill the page cache in {}: {e}", dir.display());
            None
        }
    }
}

/// Fills the page cache again with what a topic deletion just freed, once the broker has
/// freed it (the broker the bench starts deletes a log at once: [`BROKER_SETTINGS`]), so that
/// no cell writes into fresh memory its predecessors left.
fn refill(fill: Option<&machine::PageCacheFill>) {
    if fill.is_some() {
        machine::wait_for_freed_memory(Duration::from_secs(1), Duration::from_secs(6));
    }
    top_up(fill);
}

/// Fills the page cache with what is free beyond [`FILL_MARGIN`] now, if anything.
fn top_up(fill: Option<&machine::PageCacheFill>) {
    let Some(fill) = fill else { return };
    let Some(bytes) = machine::mem_free_bytes().and_then(|f| machine::fill_bytes(f, FILL_MARGIN))
    else {
        return;
    };
    if let Err(e) = fill.add(bytes) {
        eprintln!("could not refill the page cache: {e}");
    }
}

/// Records of the broker's warm-up (or `--records`, if fewer).
const WARM_UP_RECORDS: u64 = 1_000_000;

/// Writes and reads a throwaway topic first, so the first cell does not pay for a broker that
/// has just started (class loading, JIT, the transaction and offsets topics' first loads).
fn warm_up(
    cfg: &BenchConfig,
    bootstrap: &str,
    admin: &Admin,
    run_id: u64,
) -> Result<(), BenchError> {
    let topic = format!("onceflow-bench-{run_id}-warm-up");
    let records = cfg.records.unwrap_or(WARM_UP_RECORDS).min(WARM_UP_RECORDS);
    let partitions = cfg.partitions.iter().copied().max().unwrap_or(1);
    admin.create_topic(&topic, partitions)?;
    let result = kafka::preload(
        bootstrap,
        &topic,
        0..records,
        None,
        cfg.record_size,
        cfg.tuning,
        &|_| {},
    )
    .and_then(|_| {
        let reader = OutputReader::start(bootstrap, &topic, partitions, records)?;
        let deadline = Instant::now() + cfg.cell_timeout;
        while reader.all_bulk_at.get().is_none() {
            if Instant::now() > deadline || !reader.is_running() {
                return Err(BenchError::Timeout("reading the warm-up topic back".into()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        reader.finish().map(|_| ())
    });
    admin.delete_topics(&[&topic])?;
    result
}

fn fetch_kstreams(repo: &Path) -> Result<PathBuf, BenchError> {
    let script = repo.join("benches/kstreams/fetch");
    let out = Command::new(&script)
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(BenchError::io(format!("cannot run {}", script.display())))?;
    let libs = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() || libs.is_empty() {
        return Err(BenchError::Other(format!(
            "{} failed ({})",
            script.display(),
            out.status
        )));
    }
    Ok(PathBuf::from(libs))
}

/// Cores of other work in a cell's window past which the cell counts as noisy.
pub const NOISE_CORES: f64 = 0.25;

/// The readings taken at either end of a measured window.
#[derive(Debug, Clone, Copy)]
struct Snapshot {
    at: Instant,
    /// Records visible to the reader.
    visible: u64,
    /// CPU seconds of the cell's processes so far.
    procs_cpu: Option<f64>,
    broker_cpu: Option<f64>,
    /// CPU seconds of this bench process (its reader of the output).
    bench_cpu: Option<f64>,
    machine: Option<machine::MachineCpu>,
    broker_read: Option<u64>,
    reclaimed: Option<u64>,
    /// Bytes of memory free (neither used nor cache).
    free: Option<u64>,
}

impl Snapshot {
    fn take(at: Instant, visible: u64, procs: &[Proc], broker_pid: Option<u32>) -> Snapshot {
        let procs_cpu = procs
            .iter()
            .map(|p| machine::process_cpu_s(p.id()))
            .sum::<Option<f64>>();
        Snapshot {
            at,
            visible,
            procs_cpu,
            broker_cpu: broker_pid.and_then(machine::process_cpu_s),
            bench_cpu: machine::process_cpu_s(std::process::id()),
            machine: machine::machine_cpu(),
            broker_read: broker_pid.and_then(machine::process_read_bytes),
            reclaimed: machine::reclaimed_bytes(),
            free: machine::mem_free_bytes(),
        }
    }

    /// The broker's reads from storage and the memory reclaimed from `self` to `end`, in MiB.
    fn memory_until(&self, end: &Snapshot) -> (Option<f64>, Option<f64>) {
        let mib = |a: Option<u64>, b: Option<u64>| Some(b?.saturating_sub(a?) as f64 / MIB);
        (
            mib(self.broker_read, end.broker_read),
            mib(self.reclaimed, end.reclaimed),
        )
    }
}

const MIB: f64 = 1024.0 * 1024.0;

/// The rate of a pipeline's latency probe: `probe_rate`, or the share `probe_load` of the
/// rate the pipeline was measured at (never below 1 record a second).
fn probe_rate(cfg: &BenchConfig, measured: Option<f64>) -> u64 {
    match (cfg.probe_load, measured) {
        (Some(share), Some(rate)) => ((share * rate).round() as u64).max(1),
        _ => cfg.probe_rate,
    }
}

/// How far the `probe` of a partition count is read and written back to size its input.
const SIZING_SECS: f64 = 3.0;
/// How much more than the probe's rate the input is sized for (the probe itself is noisy,
/// and the quickest mode of a shared machine's quiet minute beats it).
const SIZING_MARGIN: f64 = 1.6;
/// The records a mode running at `rate` needs for its warm-up and window, with the margin.
fn input_for(rate: f64, cfg: &BenchConfig) -> f64 {
    rate * (cfg.warmup_secs + cfg.measure_secs) * SIZING_MARGIN
}

/// The size a probe-sized input of `records` grows to after a cell ran at `rate`: `None`
/// when it holds enough already, or was fixed by `--records`.
fn top_up_to(rate: f64, records: u64, cfg: &BenchConfig) -> Option<u64> {
    if cfg.records.is_some() {
        return None;
    }
    let want = (input_for(rate, cfg) as u64).min(cfg.max_records);
    (want > records).then_some(want)
}

/// How long the probe may wait for its first record.
const SIZING_GIVE_UP: Duration = Duration::from_secs(30);

struct CellCtx<'a> {
    cfg: &'a BenchConfig,
    bootstrap: &'a str,
    admin: &'a Admin,
    input: &'a str,
    partitions: i32,
    /// Records in the input, once preloaded.
    records: u64,
    run_id: u64,
    round: u32,
    work: &'a Path,
    kstreams_libs: Option<&'a Path>,
    broker_pid: Option<u32>,
    bar: &'a ProgressBar,
    /// The page cache filled before the first cell, refilled after each topic deletion.
    fill: Option<&'a machine::PageCacheFill>,
    /// Whether to run each transactional mode once, unmeasured, before the first round.
    warm_transactions: bool,
}

impl CellCtx<'_> {
    fn progress(&self, label: &str, n: u64) {
        self.bar.set_message(format!(
            "p={} r{} {label}: {n}/{} records",
            self.partitions, self.round, self.records
        ));
    }

    /// Runs the first cell of each transactional kind (onceflow's, Kafka Streams') once, not
    /// measured: the broker's warm-up writes and reads without transactions, so its
    /// transaction code (EndTxn, the markers, TxnOffsetCommit) would otherwise be compiled by
    /// its JIT during round 0's first exactly-once cell, which then cost the broker up to
    /// twice the CPU per record of the rounds after.
    fn warm_up_transactions(&mut self, specs: &[Spec], rounds: u32) {
        let mut kinds = Vec::new();
        for spec in specs {
            if !matches!(spec.kind, Kind::Eos | Kind::KStreams) || kinds.contains(&spec.kind) {
                continue;
            }
            kinds.push(spec.kind);
            // A round of its own, past the measured ones: its topics and group are its own.
            self.round = rounds;
            let label = spec.label();
            self.bar
                .set_message(format!("p={} warm-up {label}", self.partitions));
            let mut result =
                CellResult::new(self.partitions, *spec, rounds, self.records, self.cfg);
            if let Err(e) = self.run_cell(&mut result) {
                say(self.bar, format!("warm-up {label} (not measured): {e}"));
            }
        }
        self.round = 0;
    }

    /// Sizes and preloads the input at this partition count, then runs every cell of `specs`
    /// once per round, then the cross-checks; appends each result to `results` (and rewrites
    /// bench.csv after each).
    fn run_cells(&mut self, specs: &[Spec], rounds: u32, results: &mut Vec<CellResult>) {
        let partitions = self.partitions;
        let input_ready = self
            .admin
            .create_topic(self.input, partitions)
            .map_err(BenchError::from)
            .and_then(|()| self.preload_input());
        if let Err(e) = &input_ready {
            say(self.bar, format!("p={partitions}: no input: {e}"));
        }
        let record = |ctx: &Self, result: CellResult, results: &mut Vec<CellResult>| {
            if ctx.bar.is_hidden() {
                // Without a bar, a line per cell shows the run's progress.
                let rate = result
                    .records_per_s()
                    .map_or_else(|| "no figure".to_string(), |r| format!("{r:.0} records/s"));
                eprintln!(
                    "cell {}/{}: p={} r{} {}: {rate}",
                    ctx.bar.position() + 1,
                    ctx.bar.length().unwrap_or(0),
                    result.partitions,
                    result.round,
                    result.spec.label()
                );
            }
            results.push(result);
            if let Err(e) = report::write_csv(&ctx.cfg.out_dir.join("bench.csv"), ctx.cfg, results)
            {
                say(ctx.bar, format!("{e}"));
            }
            ctx.bar.inc(1);
        };
        if self.warm_transactions && input_ready.is_ok() {
            self.warm_up_transactions(specs, rounds);
        }
        for round in 0..rounds {
            self.round = round;
            for spec in specs {
                let mut result = CellResult::new(partitions, *spec, round, self.records, self.cfg);
                self.bar
                    .set_message(format!("p={partitions} r{round} {}", spec.label()));
                let outcome = match &input_ready {
                    Err(e) => Err(BenchError::Other(format!("no input: {e}"))),
                    Ok(()) => self.run_cell(&mut result),
                };
                if let Err(e) = outcome {
                    say(
                        self.bar,
                        format!("p={partitions} r{round} {}: {e}", spec.label()),
                    );
                    result.error = Some(e.to_string());
                }
                let rate = result.records_per_s();
                record(self, result, results);
                if let Some(rate) = rate
                    && let Err(e) = self.top_up(rate)
                {
                    say(
                        self.bar,
                        format!("p={partitions}: could not top the input up: {e}"),
                    );
                }
            }
        }
        if self.cfg.kafka_perf {
            self.round = 0;
            let produce_rate = stats::Summary::of(
                results
                    .iter()
                    .filter(|r| r.partitions == partitions && r.spec.kind == Kind::Produce)
                    .filter_map(CellResult::records_per_s),
            )
            .map(|s| s.median);
            for kind in [Kind::ProducerPerf, Kind::ConsumerPerf] {
                let mut result = CellResult::new(partitions, Spec::of(kind), 0, 0, self.cfg);
                self.bar
                    .set_message(format!("p={partitions} {}", result.spec.label()));
                let outcome = match &input_ready {
                    Err(e) => Err(BenchError::Other(format!("no input: {e}"))),
                    Ok(()) => self.run_perf(&mut result, produce_rate),
                };
                if let Err(e) = outcome {
                    say(
                        self.bar,
                        format!("p={partitions} {}: {e}", result.spec.label()),
                    );
                    result.error = Some(e.to_string());
                }
                record(self, result, results);
            }
        }
    }

    /// Preloads the input: `--records` of them, or as many as the fastest mode needs for
    /// `warmup + measure` seconds by a short probe: produce for a few seconds, read that
    /// back and write it to a throwaway topic (the read-process-write ceiling, which no
    /// pipeline beats), then top the input up to that rate times the time, with a margin.
    fn preload_input(&mut self) -> Result<(), BenchError> {
        let cfg = self.cfg;
        let progress = |n| {
            self.bar
                .set_message(format!("p={} preload: {n} records", self.partitions))
        };
        if let Some(n) = cfg.records {
            kafka::preload(
                self.bootstrap,
                self.input,
                0..n,
                None,
                cfg.record_size,
                cfg.tuning,
                &progress,
            )?;
            self.records = n;
            return Ok(());
        }
        let sizing = Duration::from_secs_f64(SIZING_SECS);
        let (first, _) = kafka::preload(
            self.bootstrap,
            self.input,
            0..cfg.max_records,
            Some(Instant::now() + sizing),
            cfg.record_size,
            cfg.tuning,
            &progress,
        )?;
        let scratch = format!("{}-sizing", self.input);
        self.admin.create_topic(&scratch, self.partitions)?;
        self.bar
            .set_message(format!("p={} sizing probe", self.partitions));
        // The rate counts from the first record written: the client's start (connecting,
        // the first fetch) is no part of a steady cell either.
        let started = Instant::now();
        let first_written: std::cell::Cell<Option<Instant>> = std::cell::Cell::new(None);
        let moved = kafka::read_process_write(
            self.bootstrap,
            self.input,
            self.partitions,
            &scratch,
            cfg.tuning,
            &|n| {
                if n > 0 && first_written.get().is_none() {
                    first_written.set(Some(Instant::now()));
                }
                let probed = first_written.get().is_some_and(|t| t.elapsed() >= sizing);
                !probed && n < first && started.elapsed() < SIZING_GIVE_UP
            },
        );
        let took = first_written
            .get()
            .map_or(0.0, |t| t.elapsed().as_secs_f64());
        let _ = self.admin.delete_topics(&[&scratch]);
        let rate = moved? as f64 / took.max(1e-3);
        let want = input_for(rate, cfg) as u64;
        let want = want.clamp(first, cfg.max_records.max(first));
        say(
            self.bar,
            format!(
                "p={}: probe {:.0} records/s read-process-write: input sized to {want} records",
                self.partitions, rate
            ),
        );
        kafka::preload(
            self.bootstrap,
            self.input,
            first..want,
            None,
            cfg.record_size,
            cfg.tuning,
            &|n| progress(first + n),
        )?;
        self.records = want;
        Ok(())
    }

    /// A cell faster than the probe foresaw ran out of input before its window was long
    /// enough (it stays marked short): the input is topped up to that cell's rate, so that
    /// the cells after it are measured for as long as asked. Only a probe-sized input
    /// grows, never past `--max-records`; the new records continue the ids.
    fn top_up(&mut self, rate: f64) -> Result<(), BenchError> {
        let cfg = self.cfg;
        let Some(want) = top_up_to(rate, self.records, cfg) else {
            return Ok(());
        };
        say(
            self.bar,
            format!(
                "p={}: a cell ran at {rate:.0} records/s: input topped up from {} to {want} records",
                self.partitions, self.records
            ),
        );
        let from = self.records;
        kafka::preload(
            self.bootstrap,
            self.input,
            from..want,
            None,
            cfg.record_size,
            cfg.tuning,
            &|n| {
                self.bar
                    .set_message(format!("p={} top-up: {n} records", self.partitions))
            },
        )?;
        self.records = want;
        Ok(())
    }

    fn run_cell(&self, result: &mut CellResult) -> Result<(), BenchError> {
        let label = result.spec.label();
        // The probe records go through a topic of their own, which the pipeline reads
        // besides the input, so no cell processes an earlier cell's probes.
        let output = format!("{}-{label}-r{}", self.input, self.round);
        let probe = format!("{output}-probe");
        let mut topics = vec![output.as_str()];
        if result.spec.is_pipeline() {
            topics.push(&probe);
        }
        // What the kernel freed while the last refill read its file (kswapd reclaims gigabytes
        // beyond need on this machine: docs/benchmarks.md, "Refilled after every topic
        // deletion"), taken back before the start.
        top_up(self.fill);
        let outcome = self
            .admin
            .create_topic(&output, self.partitions)
            .and_then(|()| {
                if result.spec.is_pipeline() {
                    // A probe at a share of the load is spread as the input is; a few
                    // records a second need one partition.
                    let spread = if self.cfg.probe_load.is_some() {
                        self.partitions
                    } else {
                        1
                    };
                    self.admin.create_topic(&probe, spread)
                } else {
                    Ok(())
                }
            })
            .map_err(BenchError::from)
            .and_then(|()| self.run_timed(result, &output, &probe));
        if let Err(e) = self.admin.delete_topics(&topics) {
            say(self.bar, format!("could not delete {output}: {e}"));
        }
        refill(self.fill);
        outcome
    }

    /// Starts the cell's processes (not yet processing: they report readiness).
    fn launch(
        &self,
        spec: Spec,
        output: &str,
        probe: &str,
        dir: &Path,
    ) -> Result<Vec<Proc>, BenchError> {
        let cfg = self.cfg;
        let name = format!(
            "bench-{}-p{}-{}-r{}",
            self.run_id,
            self.partitions,
            spec.label(),
            self.round
        );
        let commit_ms = spec.commit_ms.unwrap_or(100);
        let client = |args: &[&str]| {
            let mut cmd = Command::new(&cfg.onceflow_bin);
            cmd.arg("bench")
                .args(args)
                .args(["--bootstrap-servers", self.bootstrap])
                .args(["--record-size", &cfg.record_size.to_string()])
                .args(["--linger-ms", &cfg.tuning.linger_ms.to_string()])
                .args(["--batch-size", &cfg.tuning.batch_size.to_string()]);
            Proc::spawn(&spec.label(), cmd, CLIENT_READY).map(|p| vec![p])
        };
        match spec.kind {
            Kind::Produce => {
                return client(&[
                    "--client",
                    "produce",
                    "--client-topic",
                    output,
                    "--records",
                    &self.records.to_string(),
                ]);
            }
            Kind::Rpw => {
                return client(&[
                    "--client",
                    "rpw",
                    "--client-topic",
                    self.input,
                    "--client-output",
                    output,
                    "--partitions",
                    &self.partitions.to_string(),
                ]);
            }
            Kind::ProducerPerf | Kind::ConsumerPerf => {
                return Err(BenchError::Other(
                    "a cross-check is not a timed cell".into(),
                ));
            }
            Kind::KStreams => {
                let libs = self.kstreams_libs.ok_or_else(|| {
                    BenchError::Other("Kafka Streams libraries not fetched".into())
                })?;
                let mut cmd = Command::new(java());
                cmd.args(&cfg.java_opts)
                    .arg("-Dorg.slf4j.simpleLogger.defaultLogLevel=warn")
                    .arg("-cp")
                    .arg(format!("{}/*", libs.display()))
                    .arg(cfg.repo_dir()?.join("benches/kstreams/Bench.java"))
                    .args(["--bootstrap-servers", self.bootstrap])
                    .args(["--application-id", &name])
                    .args(["--input", self.input, "--probe-input", probe])
                    .args(["--output", output])
                    .args(["--commit-interval-ms", &commit_ms.to_string()])
                    .args(["--threads", "1"])
                    .args(["--linger-ms", &cfg.tuning.linger_ms.to_string()])
                    .args(["--batch-size", &cfg.tuning.batch_size.to_string()])
                    .arg("--state-dir")
                    .arg(dir.join("state"));
                return Ok(vec![Proc::spawn(
                    "Kafka Streams",
                    cmd,
                    "onceflow-bench: running",
                )?]);
            }
            Kind::Alos | Kind::Eos | Kind::EosOverlap => {}
        }
        let guarantee = if spec.kind == Kind::Alos {
            "at_least_once"
        } else {
            "exactly_once"
        };
        let overlap = spec.kind == Kind::EosOverlap;
        // The commit interval alone decides when a transaction commits, as in Kafka Streams.
        let yaml = format!(
            "name: {name}\ninputs: [{{topic: {input}}}, {{topic: {probe}}}]\noutputs: [{{topic: {output}}}]\n\
             runtime:\n  guarantee: {guarantee}\n  commit_interval_ms: {commit_ms}\n  \
             overlap_commits: {overlap}\n  \
             max_records_per_txn: 100000000\n  max_bytes_per_txn: 100000000000\n  \
             transaction_timeout_ms: {timeout}\n  session_timeout_ms: 10000\n\
             kafka:\n  producer:\n    linger.ms: '{linger}'\n    batch.size: '{batch}'\n",
            input = self.input,
            timeout = (commit_ms * 10).max(10_000),
            linger = cfg.tuning.linger_ms,
            batch = cfg.tuning.batch_size,
        );
        let topology = dir.join("topology.yaml");
        std::fs::write(&topology, yaml).map_err(BenchError::io(topology.display()))?;
        (0..spec.instances)
            .map(|i| {
                let mut cmd = Command::new(&cfg.onceflow_bin);
                cmd.arg("run")
                    .arg(&topology)
                    .args(["--bootstrap-servers", self.bootstrap])
                    .args(["--instance-id", &format!("i{i}")])
                    .args(["--progress-secs", "0"])
                    .arg("--summary-json")
                    .arg(dir.join(format!("summary-{i}.json")))
                    .env("RUST_LOG", "onceflow=info")
                    .env("NO_COLOR", "1");
                Proc::spawn(
                    &format!("onceflow instance i{i}"),
                    cmd,
                    "partitions assigned",
                )
            })
            .collect()
    }

    /// Runs one timed cell: launch, measure the window, probe the latency (pipelines), stop.
    fn run_timed(
        &self,
        result: &mut CellResult,
        output: &str,
        probe: &str,
    ) -> Result<(), BenchError> {
        let cfg = self.cfg;
        let spec = result.spec;
        let label = spec.label();
        let dir = self
            .work
            .join(format!("p{}-{label}-r{}", self.partitions, self.round));
        std::fs::create_dir_all(&dir).map_err(BenchError::io(dir.display()))?;
        let reader = OutputReader::start(self.bootstrap, output, self.partitions, self.records)?;
        let probing = spec.is_pipeline() && cfg.probe_rate > 0 && cfg.probe_secs > 0.0;
        let prober = if probing {
            // At a share of the load the probe batches as the preload does (one request per
            // record would queue in its own producer and count as the pipeline's latency).
            let linger_ms = cfg.probe_load.map_or(0, |_| cfg.tuning.linger_ms);
            Some(kafka::Prober::new(
                self.bootstrap,
                probe,
                cfg.record_size,
                linger_ms,
            )?)
        } else {
            None
        };
        let launched = Instant::now();
        let mut procs = self.launch(spec, output, probe, &dir)?;
        self.measure(&mut procs, &reader, result, launched)?;

        if let Some(prober) = &prober {
            let rate = probe_rate(cfg, result.records_per_s());
            let probes = (rate as f64 * cfg.probe_secs).round() as u64;
            self.bar.set_message(format!(
                "p={} r{} {label}: latency probe at {rate} records/s",
                self.partitions, self.round
            ));
            prober.run(probes, rate)?;
            self.wait_for(&mut procs, &reader, "latency probe", &|| {
                reader.probes.load(Ordering::Relaxed) >= probes
            })?;
        }

        let stopped = stop(&mut procs, spec, &dir)?;
        let report = reader.finish()?;
        result.commits = stopped.commits;
        result.commit = stopped.commit;
        result.commit_steps = stopped.commit_steps;
        result.e2e = (report.e2e.count() > 0).then_some(report.e2e);
        result.peak_rss_mib = (stopped.rss_kib > 0).then(|| stopped.rss_kib as f64 / 1024.0);
        result.cpu_s = Some(stopped.cpu_s);
        Ok(())
    }

    /// Follows the reader until all the input is visible and fills in the window: it starts
    /// at the first record that becomes visible `warmup` seconds after the cell is ready
    /// (with read_committed, a commit boundary), or when it is ready if the warm-up is 0 or
    /// the cell drained the input before it ended; it ends when the last record is visible.
    fn measure(
        &self,
        procs: &mut [Proc],
        reader: &OutputReader,
        result: &mut CellResult,
        launched: Instant,
    ) -> Result<(), BenchError> {
        let cfg = self.cfg;
        let label = result.spec.label();
        let warmup = Duration::from_secs_f64(cfg.warmup_secs.max(0.0));
        let deadline = Instant::now() + cfg.cell_timeout;
        let mut ready: Option<(Instant, Snapshot)> = None;
        let mut start: Option<Snapshot> = None;
        let mut previous = 0;
        let mut load = machine::load1();
        let mut load_read = Instant::now();
        let end = loop {
            let now = Instant::now();
            let visible = reader.bulk.load(Ordering::Relaxed);
            if let Some(&at) = reader.all_bulk_at.get() {
                break Snapshot::take(at, self.records, procs, self.broker_pid);
            }
            self.check(procs, reader, now, deadline, "processing")?;
            if ready.is_none()
                && let Some(at) = procs.iter().filter_map(|p| p.ready.get().copied()).min()
            {
                // Nothing is visible before the cell is ready: the window of a cell without
                // a warm-up starts at 0 records, when it said it was ready.
                ready = Some((at, Snapshot::take(at, 0, procs, self.broker_pid)));
            }
            if let Some((at, _)) = ready
                && start.is_none()
                && now >= at + warmup
                && (warmup.is_zero() || visible > previous)
            {
                start = Some(Snapshot::take(now, visible, procs, self.broker_pid));
            }
            if now.duration_since(load_read) >= Duration::from_secs(1) {
                load = max_load(load, machine::load1());
                load_read = now;
            }
            previous = visible;
            self.progress(&label, visible);
            std::thread::sleep(Duration::from_millis(20));
        };
        load = max_load(load, machine::load1());
        let Some((ready_at, at_ready)) = ready else {
            return Err(BenchError::Other(format!(
                "{label} moved every record before it said it was ready"
            )));
        };
        result.warmed_up = start.is_some();
        let start = start.unwrap_or(at_ready);
        let window = end.at.saturating_duration_since(start.at).as_secs_f64();
        let delta = |a: Option<f64>, b: Option<f64>| Some(b? - a?);
        result.startup_s = Some(ready_at.duration_since(launched).as_secs_f64());
        result.window_s = Some(window);
        result.window_records = Some(end.visible.saturating_sub(start.visible));
        result.window_cpu_s = delta(start.procs_cpu, end.procs_cpu);
        result.load1 = load;
        (result.broker_read_mib, result.reclaimed_mib) = start.memory_until(&end);
        result.free_mib = start.free.map(|b| b as f64 / MIB);
        if window > 0.0 {
            result.broker_cores = delta(start.broker_cpu, end.broker_cpu).map(|c| c / window);
            result.machine_cores = match (start.machine, end.machine) {
                (Some(a), Some(b)) if b.total_s > a.total_s => {
                    // busy share of all cores, times the cores
                    Some((b.busy_s - a.busy_s) / (b.total_s - a.total_s) * machine::cores() as f64)
                }
                _ => None,
            };
            let cores = |a: Option<f64>, b: Option<f64>| delta(a, b).map(|c| c / window);
            result.other_cores = result.machine_cores.and_then(|machine| {
                let cell = cores(start.procs_cpu, end.procs_cpu)?;
                let bench = cores(start.bench_cpu, end.bench_cpu)?;
                Some((machine - cell - bench - result.broker_cores.unwrap_or(0.0)).max(0.0))
            });
        }
        Ok(())
    }

    /// Fails when a process has exited, the reader stopped, or the cell timed out.
    fn check(
        &self,
        procs: &mut [Proc],
        reader: &OutputReader,
        now: Instant,
        deadline: Instant,
        what: &str,
    ) -> Result<(), BenchError> {
        if now > deadline {
            return Err(BenchError::Timeout(format!(
                "{what}: {} of {} records visible after {:?}",
                reader.bulk.load(Ordering::Relaxed),
                self.records,
                self.cfg.cell_timeout
            )));
        }
        for p in procs.iter_mut() {
            if let Some(exit) = p.exited() {
                return Err(p.failure(&format!("exited early ({:?})", exit.code)));
            }
        }
        if !reader.is_running() {
            return Err(BenchError::ReaderStopped);
        }
        Ok(())
    }

    /// Waits until `done` (for at most the cell timeout), failing as soon as a process exits
    /// or the reader stops; `what` names the wait in a timeout.
    fn wait_for(
        &self,
        procs: &mut [Proc],
        reader: &OutputReader,
        what: &str,
        done: &dyn Fn() -> bool,
    ) -> Result<(), BenchError> {
        let deadline = Instant::now() + self.cfg.cell_timeout;
        while !done() {
            self.check(procs, reader, Instant::now(), deadline, what)?;
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// Runs one of Kafka's perf tools (see [`perf`]); `produce_rate` (the produce-only
    /// median) sizes ProducerPerformance's run to about `measure` seconds.
    fn run_perf(
        &self,
        result: &mut CellResult,
        produce_rate: Option<f64>,
    ) -> Result<(), BenchError> {
        let cfg = self.cfg;
        let script = cfg.repo_dir()?.join("scripts/kafka");
        let dir = self
            .work
            .join(format!("p{}-{}", self.partitions, result.spec.label()));
        std::fs::create_dir_all(&dir).map_err(BenchError::io(dir.display()))?;
        let (topic, records) = match result.spec.kind {
            Kind::ProducerPerf => {
                let topic = format!("{}-producer-perf", self.input);
                self.admin.create_topic(&topic, self.partitions)?;
                let n = produce_rate
                    .map(|r| (r * (cfg.warmup_secs + cfg.measure_secs)) as u64)
                    .unwrap_or(self.records)
                    .clamp(1, self.records.max(1));
                (topic, n)
            }
            _ => (self.input.to_string(), self.records),
        };
        result.records = records;
        let tool = perf::Tool {
            script: &script,
            bootstrap: self.bootstrap,
            topic: &topic,
            records,
            record_size: cfg.record_size,
            tuning: cfg.tuning,
            group: format!("bench-{}-p{}-consumer-perf", self.run_id, self.partitions),
            dir: &dir,
        };
        let before = Snapshot::take(Instant::now(), 0, &[], self.broker_pid);
        let outcome = tool.run(result.spec.kind, cfg.cell_timeout);
        let after = Snapshot::take(Instant::now(), 0, &[], self.broker_pid);
        if result.spec.kind == Kind::ProducerPerf {
            let _ = self.admin.delete_topics(&[&topic]);
        }
        let ran = outcome?;
        let window = after.at.duration_since(before.at).as_secs_f64();
        result.warmed_up = false;
        result.window_records = Some(ran.records);
        result.window_s = Some(ran.records as f64 / ran.records_per_s);
        // The tools' CPU time covers the JVM's start too: an upper bound.
        result.cpu_s = Some(ran.cpu_s);
        result.window_cpu_s = Some(ran.cpu_s);
        result.peak_rss_mib = ran.rss_kib.map(|k| k as f64 / 1024.0);
        result.load1 = machine::load1();
        (result.broker_read_mib, result.reclaimed_mib) = before.memory_until(&after);
        result.free_mib = before.free.map(|b| b as f64 / MIB);
        if window > 0.0 {
            result.broker_cores = before
                .broker_cpu
                .zip(after.broker_cpu)
                .map(|(a, b)| (b - a) / window);
        }
        Ok(())
    }
}

/// What a cell's processes reported once stopped.
struct Stopped {
    commits: Option<u64>,
    commit: Option<Histogram>,
    commit_steps: Option<CommitSteps>,
    /// Peak RSS of the largest process.
    rss_kib: u64,
    /// CPU time of them all.
    cpu_s: f64,
}

/// Reads the processes' peak RSS, stops them with SIGTERM, and reads the pipelines' commit
/// summaries (onceflow's `summary-<i>.json` in `dir`, the Kafka Streams peer's last summary
/// line).
fn stop(procs: &mut [Proc], spec: Spec, dir: &Path) -> Result<Stopped, BenchError> {
    let mut commits = 0;
    let mut commit = Histogram::default();
    let mut stopped = Stopped {
        commits: None,
        commit: None,
        commit_steps: None,
        rss_kib: 0,
        cpu_s: 0.0,
    };
    for p in procs.iter() {
        stopped.rss_kib = stopped.rss_kib.max(p.peak_rss_kib().unwrap_or(0));
    }
    let kind = spec.kind;
    for (i, p) in procs.iter_mut().enumerate() {
        let exit = p.terminate(Duration::from_secs(60));
        stopped.cpu_s += exit.cpu_s;
        if exit.code != Some(0) && kind != Kind::KStreams {
            return Err(p.failure(&format!("did not stop cleanly ({:?})", exit.code)));
        }
        if !spec.is_pipeline() {
            continue;
        }
        let summary = if kind == Kind::KStreams {
            p.output()
                .into_iter()
                .rev()
                .find(|l| l.starts_with("{\"commits\""))
                .ok_or_else(|| p.failure("printed no commit summary"))?
        } else {
            let path = dir.join(format!("summary-{i}.json"));
            std::fs::read_to_string(&path)
                .map_err(|e| p.failure(&format!("left no summary ({e})")))?
        };
        let (n, h) = parse_commits(&summary)
            .ok_or_else(|| BenchError::Child(format!("unreadable summary: {summary}")))?;
        commits += n;
        commit.merge(&h);
        if let Some(s) = parse_commit_steps(&summary) {
            let all = stopped
                .commit_steps
                .get_or_insert_with(CommitSteps::default);
            all.deliveries.merge(&s.deliveries);
            all.offsets.merge(&s.offsets);
            all.end.merge(&s.end);
        }
    }
    if spec.is_pipeline() {
        stopped.commits = Some(commits);
        stopped.commit = Some(commit);
    }
    Ok(stopped)
}

fn max_load(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

/// The line a ceiling client prints once it is ready to go.
const CLIENT_READY: &str = "onceflow-bench: running";

/// What a ceiling client child (`onceflow bench --client ...`) runs.
#[derive(Debug, Clone)]
pub enum Client {
    /// Write `records` records to `topic`, then wait to be stopped.
    Produce { topic: String, records: u64 },
    /// Read `input` (`partitions` partitions) and write it to `output` until stopped.
    Rpw {
        input: String,
        partitions: i32,
        output: String,
    },
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigterm(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// Runs a ceiling client in this process until SIGTERM (then returns `Ok`, exit code 0).
pub fn run_client(
    bootstrap: &str,
    client: &Client,
    record_size: usize,
    tuning: ProducerTuning,
) -> Result<(), BenchError> {
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(
            libc::SIGTERM,
            on_sigterm as extern "C" fn(libc::c_int) as libc::sighandler_t,
        )
    };
    let go_on = || !STOP.load(Ordering::Relaxed);
    let ready = || {
        use std::io::Write as _;
        let mut out = std::io::stdout();
        let _ = writeln!(out, "{CLIENT_READY}");
        let _ = out.flush();
    };
    match client {
        Client::Produce { topic, records } => {
            ready();
            kafka::preload(
                bootstrap,
                topic,
                0..*records,
                None,
                record_size,
                tuning,
                &|_| {},
            )?;
            while go_on() {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Client::Rpw {
            input,
            partitions,
            output,
        } => {
            ready();
            kafka::read_process_write(bootstrap, input, *partitions, output, tuning, &|_| go_on())?;
        }
    }
    Ok(())
}

fn java() -> PathBuf {
    match std::env::var_os("JAVA_HOME") {
        Some(home) if Path::new(&home).join("bin/java").is_file() => {
            Path::new(&home).join("bin/java")
        }
        _ => PathBuf::from("java"),
    }
}

/// Reads a commit summary: onceflow's `--summary-json` (`committed` and `commit_us` as
/// `[[µs, count], ...]`) or the Kafka Streams peer's line (`commits` and `commit_us` as a
/// list of durations).
fn parse_commits(text: &str) -> Option<(u64, Histogram)> {
    let v: serde_json::Value = serde_json::from_str(text.trim()).ok()?;
    let mut h = Histogram::default();
    for item in v.get("commit_us")?.as_array()? {
        match item {
            serde_json::Value::Array(pair) => {
                h.record_us(pair.first()?.as_u64()?, pair.get(1)?.as_u64()?)
            }
            other => h.record_us(other.as_u64()?, 1),
        }
    }
    let n = v.get("committed").or_else(|| v.get("commits"))?.as_u64()?;
    Some((n, h))
}

/// Reads onceflow's commits step by step from its `--summary-json` (`commit_steps_us`, each
/// step as `[[µs, count], ...]`); `None` for a summary without them (Kafka Streams').
fn parse_commit_steps(text: &str) -> Option<CommitSteps> {
    let v: serde_json::Value = serde_json::from_str(text.trim()).ok()?;
    let steps = v.get("commit_steps_us")?;
    let step = |name: &str| -> Option<Histogram> {
        let mut h = Histogram::default();
        for pair in steps.get(name)?.as_array()? {
            let pair = pair.as_array()?;
            h.record_us(pair.first()?.as_u64()?, pair.get(1)?.as_u64()?);
        }
        Some(h)
    };
    Some(CommitSteps {
        deliveries: step("deliveries")?,
        offsets: step("offsets")?,
        end: step("end")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_input_grows_to_a_cell_that_outran_it_and_never_when_fixed() {
        let mut cfg = report::tests::cfg();
        cfg.max_records = 6_000_000;
        // 100,000 records/s for 5 + 15 s, with the margin of 1.6.
        assert_eq!(top_up_to(100_000.0, 1_000_000, &cfg), Some(3_200_000));
        // An input that holds enough already, or more, stays as it is.
        assert_eq!(top_up_to(100_000.0, 3_200_000, &cfg), None);
        assert_eq!(top_up_to(50_000.0, 3_200_000, &cfg), None);
        // Never past --max-records.
        assert_eq!(top_up_to(1_000_000.0, 1_000_000, &cfg), Some(6_000_000));
        assert_eq!(top_up_to(1_000_000.0, 6_000_000, &cfg), None);
        // An input fixed by --records never grows.
        cfg.records = Some(1_000);
        assert_eq!(top_up_to(1_000_000.0, 1_000, &cfg), None);
    }

    #[test]
    fn a_probe_at_a_share_of_load_follows_the_measured_rate() {
        let mut cfg = report::tests::cfg();
        cfg.probe_rate = 500;
        assert_eq!(probe_rate(&cfg, Some(150_000.0)), 500, "a fixed rate");
        cfg.probe_load = Some(0.5);
        assert_eq!(probe_rate(&cfg, Some(150_000.0)), 75_000, "half load");
        assert_eq!(probe_rate(&cfg, Some(0.4)), 1, "never below 1 a second");
        assert_eq!(
            probe_rate(&cfg, None),
            500,
            "no measured rate: the fixed one"
        );
    }

    #[test]
    fn both_summary_forms_parse() {
        let (n, h) =
            parse_commits(r#"{"committed": 3, "commit_us": [[1000, 2], [20000, 1]]}"#).unwrap();
        assert_eq!((n, h.count()), (3, 3));
        let (n, h) = parse_commits(r#"{"commits":2,"commit_us":[5000,7000]}"#).unwrap();
        assert_eq!((n, h.count(), h.max_us()), (2, 2, 7000));
        assert!(parse_commits("not json").is_none());
    }

    #[test]
    fn commit_steps_parse_from_onceflow_s_summary_only() {
        let summary = r#"{"committed": 2, "commit_us": [[9000, 2]], "commit_steps_us": {"deliveries": [[4000, 2]], "offsets": [[3000, 1], [3500, 1]], "end": [[2000, 2]]}}"#;
        let steps = parse_commit_steps(summary).unwrap();
        assert_eq!(steps.deliveries.percentile(0.5), Some(4000));
        assert_eq!((steps.offsets.count(), steps.offsets.max_us()), (2, 3500));
        assert_eq!(steps.end.count(), 2);
        assert!(parse_commit_steps(r#"{"commits":2,"commit_us":[5000,7000]}"#).is_none());
    }

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

    #[test]
    fn labels_name_mode_interval_and_instances() {
        let s = |kind, ms, instances| Spec {
            kind,
            commit_ms: ms,
            instances,
        };
        assert_eq!(s(Kind::Eos, Some(100), 1).label(), "eos-100ms");
        assert_eq!(
            s(Kind::EosOverlap, Some(100), 1).label(),
            "eos-overlap-100ms"
        );
        assert_eq!(s(Kind::Eos, Some(1000), 3).label(), "eos-1s-x3");
        assert_eq!(
            s(Kind::KStreams, Some(100), 1).label(),
            "kstreams-eos-100ms"
        );
        assert_eq!(s(Kind::Produce, None, 1).label(), "produce-only");
    }
}
