//! `onceflow bench`: throughput against partition count, next to the broker's ceiling and
//! Kafka Streams, on one broker in one run.
//!
//! After a short warm-up of the broker, for every partition count the bench preloads N records of S bytes into a fresh input topic
//! (timed: the produce-only ceiling), reads them back (the consume-only ceiling), then runs
//! each pipeline over the same input, one after another, each with a fresh output topic and
//! consumer group:
//!
//! * onceflow at-least-once and exactly-once (`onceflow run` child processes, one per
//!   instance), and
//! * the Kafka Streams peer under `exactly_once_v2` (`benches/kstreams/Bench.java`) with the
//!   same commit interval, one stream thread, the same producer `linger.ms`/`batch.size`.
//!
//! A read_committed reader times each pipeline: throughput is N divided by the time from the
//! pipeline's first partition assignment to the moment the reader has seen all N outputs
//! (start-up, which differs a lot between a native binary and a JVM, is reported apart).
//! Then a paced probe of timestamped records measures end-to-end latency (input timestamp to
//! visible to the reader) while the pipeline keeps up, and the children are stopped with
//! SIGTERM. Each child's peak RSS (`VmHWM`) is read just before, its CPU time comes from
//! `wait4`, and onceflow's `--summary-json` gives its commit durations.

mod kafka;
mod procs;
pub mod report;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use plotters::drawing::DrawingAreaErrorKind;
use rdkafka::error::KafkaError;

use crate::histogram::Histogram;
use crate::kafka::Cluster;
use crate::kafka::admin::{Admin, AdminError};
use kafka::OutputReader;
pub use kafka::ProducerTuning;
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
    /// broker or to run Kafka Streams.
    pub repo_dir: Option<PathBuf>,
    /// The `onceflow` binary to run the pipelines with.
    pub onceflow_bin: PathBuf,
    pub partitions: Vec<i32>,
    pub records: u64,
    pub record_size: usize,
    /// Commit interval of the at-least-once run.
    pub alos_commit_ms: u64,
    /// Commit intervals of the exactly-once runs.
    pub eos_commit_ms: Vec<u64>,
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
    /// Give up on a cell after this long.
    pub cell_timeout: Duration,
    /// Runs of each pipeline cell (in rounds, so modes alternate); the fastest run is
    /// reported.
    pub repeat: u32,
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
    /// Producing the input (librdkafka, idempotent): the produce-only ceiling.
    Produce,
    /// Reading the input (librdkafka, read_committed): the consume-only ceiling.
    Consume,
    /// onceflow, `guarantee: at_least_once`.
    Alos,
    /// onceflow, `guarantee: exactly_once`.
    Eos,
    /// Kafka Streams, `processing.guarantee: exactly_once_v2`.
    KStreams,
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

/// The run with the best throughput among the successful ones (the last failure when every
/// run failed). Other work on the machine only ever slows a run down, so the fastest run is
/// the least disturbed one.
fn best(mut runs: Vec<CellResult>) -> Option<CellResult> {
    let total = runs.len();
    let ok = runs
        .iter()
        .filter(|r| r.error.is_none())
        .filter_map(|r| r.records_per_s().map(|v| (v, r)))
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, r)| r.clone());
    let succeeded = runs.iter().filter(|r| r.error.is_none()).count() as u32;
    match ok {
        Some(mut chosen) => {
            chosen.runs = succeeded;
            Some(chosen)
        }
        None if total > 0 => runs.pop(),
        None => None,
    }
}

impl Spec {
    /// Whether this cell runs a pipeline (the others measure the broker's ceiling).
    pub fn is_pipeline(&self) -> bool {
        matches!(self.kind, Kind::Alos | Kind::Eos | Kind::KStreams)
    }

    pub fn label(&self) -> String {
        let ms = self.commit_ms.map(interval).unwrap_or_default();
        let mut label = match self.kind {
            Kind::Produce => "produce-only".to_string(),
            Kind::Consume => "consume-only".to_string(),
            Kind::Alos => format!("alos-{ms}"),
            Kind::Eos => format!("eos-{ms}"),
            Kind::KStreams => format!("kstreams-eos-{ms}"),
        };
        if self.instances > 1 {
            label.push_str(&format!("-x{}", self.instances));
        }
        label
    }
}

/// The measurements of one cell.
#[derive(Debug, Clone)]
pub struct CellResult {
    pub partitions: i32,
    pub spec: Spec,
    pub records: u64,
    pub record_size: usize,
    /// Time to move the N records (see the module doc for where it starts).
    pub seconds: Option<f64>,
    /// From launching the pipeline to its first partition assignment.
    pub startup_s: Option<f64>,
    pub commits: Option<u64>,
    pub commit: Option<Histogram>,
    pub e2e: Option<Histogram>,
    /// Peak RSS of the largest instance.
    pub peak_rss_mib: Option<f64>,
    /// CPU time (user + system) of the pipeline's processes, from launch to exit.
    pub cpu_s: Option<f64>,
    /// How many successful runs the reported one is the best of.
    pub runs: u32,
    pub error: Option<String>,
}

impl CellResult {
    fn new(partitions: i32, spec: Spec, cfg: &BenchConfig) -> CellResult {
        CellResult {
            partitions,
            spec,
            records: cfg.records,
            record_size: cfg.record_size,
            seconds: None,
            startup_s: None,
            commits: None,
            commit: None,
            e2e: None,
            peak_rss_mib: None,
            cpu_s: None,
            runs: 1,
            error: None,
        }
    }

    pub fn records_per_s(&self) -> Option<f64> {
        self.seconds
            .filter(|s| *s > 0.0)
            .map(|s| self.records as f64 / s)
    }

    /// CPU time of the pipeline per bulk record, in microseconds (start-up, the latency probe
    /// and shutdown are in the CPU time too, so it overstates a little).
    pub fn cpu_us_per_record(&self) -> Option<f64> {
        self.cpu_s.map(|c| c * 1e6 / self.records as f64)
    }

    pub fn mb_per_s(&self) -> Option<f64> {
        self.records_per_s()
            .map(|r| r * self.record_size as f64 / 1e6)
    }
}

/// The pipeline cells run at every partition count, in order.
pub fn plan(cfg: &BenchConfig) -> Vec<Spec> {
    let mut specs = vec![
        Spec {
            kind: Kind::Produce,
            commit_ms: None,
            instances: 1,
        },
        Spec {
            kind: Kind::Consume,
            commit_ms: None,
            instances: 1,
        },
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
        let out = Command::new(&script)
            .arg(if running { "bootstrap" } else { "start" })
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
    let run_id = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let work = std::env::temp_dir().join(format!("onceflow-bench-{run_id}-{}", std::process::id()));
    std::fs::create_dir_all(&work).map_err(BenchError::io(work.display()))?;

    warm_up(cfg, bootstrap, &admin, run_id)?;

    let specs = plan(cfg);
    let repeat = cfg.repeat.max(1);
    let bar = progress_bar(cfg, &specs, repeat);
    let mut results: Vec<CellResult> = Vec::new();
    for &partitions in &cfg.partitions {
        let input = format!("onceflow-bench-{run_id}-p{partitions}");
        let mut ctx = CellCtx {
            cfg,
            bootstrap,
            admin: &admin,
            input: &input,
            partitions,
            run_id,
            round: 0,
            work: &work,
            kstreams_libs: kstreams_libs.as_deref(),
            bar: &bar,
        };
        results.extend(ctx.run_cells(&specs, repeat));
        report::write_csv(&cfg.out_dir.join("bench.csv"), &results)?;
        if let Err(e) = admin.delete_topics(&[&input]) {
            bar.println(format!("could not delete {input}: {e}"));
        }
    }
    bar.finish_and_clear();
    let _ = std::fs::remove_dir_all(&work);
    broker.keep_logs = results.iter().any(|r| r.error.is_some());
    drop(broker);
    write_reports(cfg, &results)?;
    Ok(results)
}

/// A bar of every cell to run: each pipeline `repeat` times, each ceiling once, at every
/// partition count.
fn progress_bar(cfg: &BenchConfig, specs: &[Spec], repeat: u32) -> ProgressBar {
    let per_count: usize = specs
        .iter()
        .map(|s| if s.is_pipeline() { repeat as usize } else { 1 })
        .sum();
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

/// Writes bench.md and throughput.svg, and prints the markdown.
fn write_reports(cfg: &BenchConfig, results: &[CellResult]) -> Result<(), BenchError> {
    let markdown = report::markdown(cfg, results);
    std::fs::write(cfg.out_dir.join("bench.md"), &markdown).map_err(BenchError::io("bench.md"))?;
    report::plot(&cfg.out_dir.join("throughput.svg"), cfg, results)?;
    println!("{markdown}");
    Ok(())
}

/// Writes and reads a throwaway topic first, so the first cell does not pay for a broker that
/// has just started (class loading, JIT, the transaction and offsets topics' first loads).
fn warm_up(
    cfg: &BenchConfig,
    bootstrap: &str,
    admin: &Admin,
    run_id: u64,
) -> Result<(), BenchError> {
    let topic = format!("onceflow-bench-{run_id}-warm-up");
    let records = cfg.records.min(50_000);
    let partitions = cfg.partitions.iter().copied().max().unwrap_or(1);
    admin.create_topic(&topic, partitions)?;
    let result = kafka::preload(
        bootstrap,
        &topic,
        records,
        cfg.record_size,
        cfg.tuning,
        &|_| {},
    )
    .and_then(|_| {
        kafka::consume_all(
            bootstrap,
            &topic,
            partitions,
            records,
            cfg.cell_timeout,
            &|_| {},
        )
    });
    admin.delete_topics(&[&topic])?;
    result.map(|_| ())
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

struct CellCtx<'a> {
    cfg: &'a BenchConfig,
    bootstrap: &'a str,
    admin: &'a Admin,
    input: &'a str,
    partitions: i32,
    run_id: u64,
    round: u32,
    work: &'a Path,
    kstreams_libs: Option<&'a Path>,
    bar: &'a ProgressBar,
}

impl CellCtx<'_> {
    fn progress(&self, label: &str, n: u64) {
        self.bar.set_message(format!(
            "p={} {label}: {n}/{} records",
            self.partitions, self.cfg.records
        ));
    }

    /// Runs every cell of `specs` at this partition count over a fresh input topic, the
    /// pipelines `repeat` times in rounds, and keeps the best run of each.
    fn run_cells(&mut self, specs: &[Spec], repeat: u32) -> Vec<CellResult> {
        let partitions = self.partitions;
        let mut input_ready = self
            .admin
            .create_topic(self.input, partitions)
            .map_err(BenchError::from);
        let mut runs: Vec<Vec<CellResult>> = vec![Vec::new(); specs.len()];
        for round in 0..repeat {
            self.round = round;
            for (i, spec) in specs.iter().enumerate() {
                if round > 0 && !spec.is_pipeline() {
                    continue;
                }
                let mut result = CellResult::new(partitions, *spec, self.cfg);
                self.bar
                    .set_message(format!("p={partitions} {}", spec.label()));
                let outcome = match &input_ready {
                    Err(e) => Err(BenchError::Other(format!("no input: {e}"))),
                    Ok(()) => self.run_cell(&mut result),
                };
                if let Err(e) = outcome {
                    self.bar
                        .println(format!("p={partitions} {}: {e}", spec.label()));
                    if spec.kind == Kind::Produce {
                        input_ready = Err(BenchError::Other(format!("preload failed: {e}")));
                    }
                    result.error = Some(e.to_string());
                }
                runs[i].push(result);
                self.bar.inc(1);
            }
        }
        runs.into_iter().filter_map(best).collect()
    }

    fn run_cell(&self, result: &mut CellResult) -> Result<(), BenchError> {
        let label = result.spec.label();
        let cfg = self.cfg;
        match result.spec.kind {
            Kind::Produce => {
                let took = kafka::preload(
                    self.bootstrap,
                    self.input,
                    cfg.records,
                    cfg.record_size,
                    cfg.tuning,
                    &|n| self.progress(&label, n),
                )?;
                result.seconds = Some(took.as_secs_f64());
                Ok(())
            }
            Kind::Consume => {
                let took = kafka::consume_all(
                    self.bootstrap,
                    self.input,
                    self.partitions,
                    cfg.records,
                    cfg.cell_timeout,
                    &|n| self.progress(&label, n),
                )?;
                result.seconds = Some(took.as_secs_f64());
                Ok(())
            }
            Kind::Alos | Kind::Eos | Kind::KStreams => {
                // The probe records go through a topic of their own, which the pipeline
                // reads besides the input, so no cell processes an earlier cell's probes.
                let output = format!("{}-{label}-r{}", self.input, self.round);
                let probe = format!("{output}-probe");
                let outcome = self
                    .admin
                    .create_topic(&output, self.partitions)
                    .and_then(|()| self.admin.create_topic(&probe, 1))
                    .map_err(BenchError::from)
                    .and_then(|()| self.run_pipeline(result, &output, &probe));
                if let Err(e) = self.admin.delete_topics(&[&output, &probe]) {
                    self.bar.println(format!("could not delete {output}: {e}"));
                }
                outcome
            }
        }
    }

    /// Starts the pipeline's processes (not yet processing: they report readiness).
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
        if spec.kind == Kind::KStreams {
            let libs = self
                .kstreams_libs
                .ok_or_else(|| BenchError::Other("Kafka Streams libraries not fetched".into()))?;
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
        let guarantee = if spec.kind == Kind::Alos {
            "at_least_once"
        } else {
            "exactly_once"
        };
        // The commit interval alone decides when a transaction commits, as in Kafka Streams.
        let yaml = format!(
            "name: {name}\ninputs: [{{topic: {input}}}, {{topic: {probe}}}]\noutputs: [{{topic: {output}}}]\n\
             runtime:\n  guarantee: {guarantee}\n  commit_interval_ms: {commit_ms}\n  \
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

    fn run_pipeline(
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
        let reader = OutputReader::start(self.bootstrap, output, self.partitions, cfg.records)?;
        let probes = (cfg.probe_rate as f64 * cfg.probe_secs).round() as u64;
        let prober = if probes > 0 {
            Some(kafka::Prober::new(self.bootstrap, probe, cfg.record_size)?)
        } else {
            None
        };
        let launched = Instant::now();
        let mut procs = self.launch(spec, output, probe, &dir)?;

        self.wait_for(&mut procs, &reader, &label, "processing", &|| {
            reader.all_bulk_at.get().is_some()
        })?;
        let all_at = *reader.all_bulk_at.get().unwrap_or(&launched);
        let ready = procs
            .iter()
            .filter_map(|p| p.ready.get().copied())
            .min()
            .unwrap_or(launched);
        result.seconds = Some(all_at.duration_since(ready).as_secs_f64());
        result.startup_s = Some(ready.duration_since(launched).as_secs_f64());

        if let Some(prober) = &prober {
            self.bar
                .set_message(format!("p={} {label}: latency probe", self.partitions));
            prober.run(probes, cfg.probe_rate)?;
            self.wait_for(&mut procs, &reader, &label, "latency probe", &|| {
                reader.probes.load(std::sync::atomic::Ordering::Relaxed) >= probes
            })?;
        }

        let stopped = stop(&mut procs, spec.kind, &dir)?;
        let report = reader.finish()?;
        result.commits = Some(stopped.commits);
        result.commit = Some(stopped.commit);
        result.e2e = (report.e2e.count() > 0).then_some(report.e2e);
        result.peak_rss_mib = (stopped.rss_kib > 0).then(|| stopped.rss_kib as f64 / 1024.0);
        result.cpu_s = Some(stopped.cpu_s);
        Ok(())
    }

    /// Waits until `done` (for at most the cell timeout), failing as soon as a process exits
    /// or the reader stops; `what` names the wait in a timeout.
    fn wait_for(
        &self,
        procs: &mut [Proc],
        reader: &OutputReader,
        label: &str,
        what: &str,
        done: &dyn Fn() -> bool,
    ) -> Result<(), BenchError> {
        let cfg = self.cfg;
        let deadline = Instant::now() + cfg.cell_timeout;
        while !done() {
            if Instant::now() > deadline {
                return Err(BenchError::Timeout(format!(
                    "{what}: {} of {} records visible after {:?}",
                    reader.bulk.load(std::sync::atomic::Ordering::Relaxed),
                    cfg.records,
                    cfg.cell_timeout
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
            self.progress(
                label,
                reader.bulk.load(std::sync::atomic::Ordering::Relaxed),
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }
}

/// What a pipeline's processes reported once stopped.
struct Stopped {
    commits: u64,
    commit: Histogram,
    /// Peak RSS of the largest process.
    rss_kib: u64,
    /// CPU time of them all.
    cpu_s: f64,
}

/// Reads the processes' peak RSS, stops them with SIGTERM, and reads their commit summaries
/// (onceflow's `summary-<i>.json` in `dir`, the Kafka Streams peer's last summary line).
fn stop(procs: &mut [Proc], kind: Kind, dir: &Path) -> Result<Stopped, BenchError> {
    let mut stopped = Stopped {
        commits: 0,
        commit: Histogram::default(),
        rss_kib: 0,
        cpu_s: 0.0,
    };
    for p in procs.iter() {
        stopped.rss_kib = stopped.rss_kib.max(p.peak_rss_kib().unwrap_or(0));
    }
    for (i, p) in procs.iter_mut().enumerate() {
        let exit = p.terminate(Duration::from_secs(60));
        stopped.cpu_s += exit.cpu_s;
        if exit.code != Some(0) && kind != Kind::KStreams {
            return Err(p.failure(&format!("did not stop cleanly ({:?})", exit.code)));
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
        stopped.commits += n;
        stopped.commit.merge(&h);
    }
    Ok(stopped)
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

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(s(Kind::Eos, Some(1000), 3).label(), "eos-1s-x3");
        assert_eq!(
            s(Kind::KStreams, Some(100), 1).label(),
            "kstreams-eos-100ms"
        );
        assert_eq!(s(Kind::Produce, None, 1).label(), "produce-only");
    }
}
