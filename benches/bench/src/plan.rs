//! What the bench measures: its configuration, the cells of a round ([`plan`]), what each
//! cell runs and what it measured.

use std::path::{Path, PathBuf};
use std::time::Duration;

use onceflow::histogram::Histogram;
use onceflow::txn::CommitSteps;

use crate::BenchError;
use crate::kafka::ProducerTuning;

/// What to measure and where.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// The broker to use; `None` starts one with `scripts/kafka start` (and stops it after).
    pub bootstrap_servers: Option<String>,
    /// The repository (for `scripts/kafka` and `benches/kstreams`); only needed to start a
    /// broker, to run Kafka Streams or Kafka's perf tools.
    pub repo_dir: Option<PathBuf>,
    /// The `onceflow` binary to run the pipelines with.
    pub onceflow_bin: PathBuf,
    /// The bench's own binary, run with `--client` for the ceiling clients.
    pub client_bin: PathBuf,
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
    /// What the pipelines do.
    pub workload: Workload,
    /// Distinct keys of the count-by-key workload's input.
    pub keys: u64,
    /// The command line, for the report.
    pub command: String,
    /// Where bench.csv, bench.md and throughput.svg go.
    pub out_dir: PathBuf,
}

/// What the pipelines under test do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Workload {
    /// Every record mapped to the output unchanged.
    PassThrough,
    /// Records counted per key (`aggregate` count; Kafka Streams `groupByKey().count()` with
    /// its record cache off, so both emit every update), the store's changelog in the
    /// transaction.
    CountByKey,
}

impl BenchConfig {
    /// What the preloaded records look like.
    pub(crate) fn shape(&self) -> crate::kafka::RecordShape {
        crate::kafka::RecordShape {
            size: self.record_size,
            keys: (self.workload == Workload::CountByKey).then_some(self.keys),
        }
    }

    pub(crate) fn repo_dir(&self) -> Result<&Path, BenchError> {
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
    pub(crate) fn of(kind: Kind) -> Spec {
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
    pub(crate) fn new(
        partitions: i32,
        spec: Spec,
        round: u32,
        records: u64,
        cfg: &BenchConfig,
    ) -> Self {
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

/// The cells of every round, at every partition count, in order. Counting by key runs the
/// exactly-once pipelines only (state needs exactly-once; the ceilings move records, they
/// count nothing).
pub fn plan(cfg: &BenchConfig) -> Vec<Spec> {
    let mut specs = plan_all(cfg);
    if cfg.workload == Workload::CountByKey {
        specs.retain(|s| matches!(s.kind, Kind::Eos | Kind::KStreams));
    }
    specs
}

fn plan_all(cfg: &BenchConfig) -> Vec<Spec> {
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

/// Cores of other work in a cell's window past which the cell counts as noisy.
pub const NOISE_CORES: f64 = 0.25;
#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A configuration for tests: a probe-sized input, 5 s of warm-up and 15 s measured.
    pub(crate) fn cfg() -> BenchConfig {
        BenchConfig {
            bootstrap_servers: None,
            repo_dir: None,
            onceflow_bin: "onceflow".into(),
            client_bin: "onceflow-bench".into(),
            partitions: vec![1],
            records: None,
            max_records: 1,
            record_size: 1024,
            warmup_secs: 5.0,
            measure_secs: 15.0,
            alos_commit_ms: 100,
            eos_commit_ms: vec![100],
            eos_overlap_commit_ms: vec![],
            kstreams_commit_ms: vec![100],
            java_opts: vec![],
            instances: vec![1],
            tuning: crate::ProducerTuning {
                linger_ms: 5,
                batch_size: 1,
            },
            workload: Workload::PassThrough,
            keys: 1,
            probe_rate: 0,
            probe_secs: 0.0,
            probe_load: None,
            kafka_perf: false,
            fill_page_cache: true,
            cell_timeout: std::time::Duration::from_secs(1),
            rounds: 3,
            command: "onceflow-bench".into(),
            out_dir: "out".into(),
        }
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

    #[test]
    fn counting_by_key_runs_the_exactly_once_pipelines_on_keys_modulo_the_key_count() {
        let mut cfg = cfg();
        let all: Vec<String> = plan(&cfg).iter().map(Spec::label).collect();
        assert!(all.contains(&"rpw-ceiling".to_string()), "{all:?}");
        assert_eq!(cfg.shape().keys, None);
        cfg.workload = Workload::CountByKey;
        cfg.keys = 100_000;
        let counting: Vec<String> = plan(&cfg).iter().map(Spec::label).collect();
        assert_eq!(counting, ["eos-100ms", "kstreams-eos-100ms"]);
        assert_eq!(cfg.shape().keys, Some(100_000));
    }
}
