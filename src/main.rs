//! The onceflow command line.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};

use onceflow::bench::{self, BenchConfig};
use onceflow::dlq;
use onceflow::embedded::EmbeddedCluster;
use onceflow::engine::{self, Identity, RunOptions, Summary};
use onceflow::telemetry::{self, health, health::Health, metrics};
use onceflow::topology::Topology;
use onceflow::topology::env::Strictness;
use onceflow::{testing, validate};

// The per-record path makes many small, short-lived allocations: mimalloc handles them much
// faster than the system allocator (see docs/benchmarks.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "onceflow",
    version,
    about = "Exactly-once stream jobs for Apache Kafka"
)]
struct Cli {
    /// Log as JSON lines instead of human-readable text.
    #[arg(long, global = true, env = "ONCEFLOW_LOG_JSON")]
    log_json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a topology until SIGTERM/SIGINT. Without any broker given, runs it once on an
    /// embedded cluster over generated records.
    Run {
        /// The topology file.
        topology: PathBuf,
        /// Kafka bootstrap servers (overrides kafka.bootstrap_servers of the topology).
        #[arg(long, env = "ONCEFLOW_BOOTSTRAP_SERVERS")]
        bootstrap_servers: Option<String>,
        /// This instance's id: with the topology name it makes the transactional.id and the
        /// group.instance.id, so it must be stable across restarts and unique in the group.
        /// Default: the host name.
        #[arg(long, env = "ONCEFLOW_INSTANCE_ID")]
        instance_id: Option<String>,
        /// Run on an in-process cluster over generated records, then exit. For trying things:
        /// it does not enforce transactions.
        #[arg(long)]
        embedded: bool,
        /// With --embedded: how many records to generate.
        #[arg(long, default_value_t = 10_000)]
        records: u64,
        /// Stop once this many consumed records are committed.
        #[arg(long)]
        stop_after_records: Option<u64>,
        /// Log a progress line this often (seconds; 0 turns it off).
        #[arg(long, default_value_t = 10)]
        progress_secs: u64,
        /// Serve /metrics (Prometheus), /healthz and /readyz on this address, e.g.
        /// 0.0.0.0:9090. Without it no metric is recorded.
        #[arg(long, env = "ONCEFLOW_METRICS_ADDR")]
        metrics_addr: Option<std::net::SocketAddr>,
        /// With --metrics-addr: how often librdkafka statistics (lag, rtt, queues) refresh.
        #[arg(long, default_value_t = 5)]
        statistics_secs: u64,
        /// When the job ends, write what it did as JSON to this file: committed counts and
        /// commit durations (`commit_us`: `[[µs, count], ...]`).
        #[arg(long)]
        summary_json: Option<PathBuf>,
    },
    /// Inspect or replay a dead-letter topic.
    Dlq {
        #[command(subcommand)]
        command: DlqCommand,
    },
    /// Check topology files: environment variables, fields, expressions, wiring and the
    /// settings exactly-once depends on. Every problem is printed with its field path and
    /// line; the exit status is 0 only when every file is clean.
    Validate {
        /// Topology files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Also check against this broker: its transaction.max.timeout.ms allows the
        /// topology's transaction timeout, and the topics exist.
        #[arg(long)]
        broker: Option<String>,
        /// Do not require the environment: unset variables expand to their default or to
        /// an empty string instead of being errors.
        #[arg(long)]
        no_env: bool,
    },
    /// Run a topology's pipeline in-process over the records of a cases file (no broker) and
    /// compare every output with what the cases expect.
    Test {
        /// The topology file.
        topology: PathBuf,
        /// The cases file.
        #[arg(long)]
        cases: PathBuf,
    },
    /// Measure throughput against partition count: the broker's produce/consume ceiling,
    /// onceflow at-least-once and exactly-once, and Kafka Streams exactly_once_v2, on one
    /// broker in one run. Writes bench.csv, bench.md and throughput.svg, prints the table.
    Bench(BenchArgs),
}

#[derive(Subcommand)]
enum DlqCommand {
    /// Print dead-letter records as a table: error kind, origin, shortened payload.
    Inspect {
        /// The dead-letter topic (default of a topology: `<name>.dlq`).
        topic: String,
        #[command(flatten)]
        filter: DlqFilter,
        #[command(flatten)]
        kafka: KafkaArgs,
        /// Show at most this many records.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// Re-produce the original records to their original topic (or --to), exactly once:
    /// running it again over the same range re-produces nothing.
    Replay {
        /// The dead-letter topic.
        topic: String,
        #[command(flatten)]
        filter: DlqFilter,
        #[command(flatten)]
        kafka: KafkaArgs,
        /// Write to this topic instead of each record's original topic.
        #[arg(long)]
        to: Option<String>,
    },
}

#[derive(clap::Args)]
struct KafkaArgs {
    /// Kafka bootstrap servers.
    #[arg(long, env = "ONCEFLOW_BOOTSTRAP_SERVERS")]
    bootstrap_servers: String,
    /// A librdkafka setting for the command's clients, `key=value`; repeat it
    /// (e.g. -X security.protocol=SSL -X ssl.ca.location=/etc/kafka/ca.pem).
    #[arg(short = 'X', value_name = "KEY=VALUE", value_parser = parse_setting)]
    kafka_setting: Vec<(String, String)>,
}

impl From<KafkaArgs> for dlq::Kafka {
    fn from(a: KafkaArgs) -> dlq::Kafka {
        dlq::Kafka {
            bootstrap: a.bootstrap_servers,
            settings: a.kafka_setting,
        }
    }
}

fn parse_setting(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.to_string())),
        _ => Err(format!("`{s}` is not key=value")),
    }
}

#[derive(clap::Args)]
struct DlqFilter {
    /// Only records of this error kind.
    #[arg(long)]
    kind: Option<String>,
    /// Only records that failed at or after this time (ms since the epoch).
    #[arg(long)]
    since_ms: Option<i64>,
    /// Only records that failed before this time (ms since the epoch).
    #[arg(long)]
    until_ms: Option<i64>,
    /// Only records from this original partition.
    #[arg(long)]
    origin_partition: Option<i32>,
}

impl From<DlqFilter> for dlq::Filter {
    fn from(f: DlqFilter) -> Self {
        dlq::Filter {
            kind: f.kind,
            since_ms: f.since_ms,
            until_ms: f.until_ms,
            origin_partition: f.origin_partition,
        }
    }
}

/// `onceflow bench` options. Lists are comma-separated.
#[derive(clap::Args)]
struct BenchArgs {
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    telemetry::init_tracing(cli.log_json);
    match dispatch(cli.command) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Loads a topology for running: the environment must provide every variable, and every
/// problem of the file is reported at once.
fn load(path: &std::path::Path) -> anyhow::Result<Topology> {
    match validate::check_file(path, Strictness::Strict).into_result() {
        Ok((topology, _)) => Ok(topology),
        Err(diagnostics) => {
            let list: Vec<String> = diagnostics.iter().map(|d| format!("  {d}")).collect();
            anyhow::bail!(
                "{} has {} problem(s):\n{}",
                path.display(),
                diagnostics.len(),
                list.join("\n")
            )
        }
    }
}

/// Returns whether everything checked was fine (the exit status).
fn dispatch(command: Command) -> anyhow::Result<bool> {
    match command {
        Command::Dlq { command } => run_dlq(command).map(|()| true),
        Command::Validate {
            files,
            broker,
            no_env,
        } => {
            let strictness = if no_env {
                Strictness::Lenient
            } else {
                Strictness::Strict
            };
            let mut clean = true;
            for file in &files {
                let checked = validate::check_file(file, strictness);
                let mut diagnostics = checked.diagnostics;
                if let (Some(bootstrap), Some(topology)) = (&broker, &checked.topology) {
                    diagnostics.extend(validate::check_broker(
                        topology,
                        bootstrap,
                        &file.display().to_string(),
                        &checked.lines,
                        Duration::from_secs(10),
                    ));
                }
                if diagnostics.is_empty() {
                    println!("{}: ok", file.display());
                } else {
                    clean = false;
                    for d in &diagnostics {
                        println!("{d}");
                    }
                    println!("{}: {} problem(s)", file.display(), diagnostics.len());
                }
            }
            Ok(clean)
        }
        Command::Test { topology, cases } => {
            let (topo, pipeline) = validate::check_file(&topology, Strictness::Strict)
                .into_result()
                .map_err(|diagnostics| {
                    let list: Vec<String> = diagnostics.iter().map(|d| format!("  {d}")).collect();
                    anyhow::anyhow!(
                        "{} has {} problem(s):\n{}",
                        topology.display(),
                        diagnostics.len(),
                        list.join("\n")
                    )
                })?;
            let cases = testing::load_cases(&cases)?;
            let reports = testing::run_cases(&topo, &pipeline, &cases);
            let failed = reports.iter().filter(|r| !r.passed()).count();
            for r in &reports {
                if r.passed() {
                    println!("ok      {}", r.name);
                } else {
                    println!("MISMATCH {}", r.name);
                    for m in &r.mismatches {
                        for line in m.lines() {
                            println!("    {line}");
                        }
                    }
                }
            }
            println!(
                "cases: {} passed, {failed} mismatched",
                reports.len() - failed
            );
            Ok(failed == 0)
        }
        Command::Run {
            topology,
            bootstrap_servers,
            instance_id,
            embedded,
            records,
            stop_after_records,
            progress_secs,
            metrics_addr,
            statistics_secs,
            summary_json,
        } => {
            let topology = load(&topology)?;
            let options = RunOptions {
                health: Arc::new(Health::default()),
                statistics_every: metrics_addr.map(|_| Duration::from_secs(statistics_secs.max(1))),
                stop_after_records,
                // Test-only failpoint: the pipeline fails transiently this many times first.
                transient_failures: std::env::var("ONCEFLOW_FAILPOINT_TRANSIENT_FAILURES")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0),
                // Test-only failpoint: abort every n-th transaction instead of committing it.
                abort_every: std::env::var("ONCEFLOW_FAILPOINT_ABORT_EVERY")
                    .ok()
                    .and_then(|v| v.parse().ok()),
                progress_every: (progress_secs > 0).then(|| Duration::from_secs(progress_secs)),
            };
            let bootstrap = bootstrap_servers.or_else(|| topology.kafka.bootstrap_servers.clone());
            let instance_id = instance_id.unwrap_or_else(engine::clients::default_instance_id);
            match bootstrap {
                Some(servers) if !embedded => {
                    let identity = Identity {
                        bootstrap_servers: servers,
                        instance_id,
                    };
                    let summary = run_until_signal(topology, identity, options, metrics_addr)?;
                    print_summary(&summary);
                    if let Some(path) = summary_json {
                        write_summary_json(&path, &summary)?;
                    }
                    Ok(true)
                }
                _ => run_embedded(topology, instance_id, records, options, metrics_addr)
                    .map(|()| true),
            }
        }
        Command::Bench(args) => {
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
    }
}

fn run_dlq(command: DlqCommand) -> anyhow::Result<()> {
    match command {
        DlqCommand::Inspect {
            topic,
            filter,
            kafka,
            limit,
        } => {
            let shown = dlq::inspect(
                &kafka.into(),
                &topic,
                &filter.into(),
                limit,
                &mut std::io::stdout(),
            )?;
            eprintln!("{shown} record(s) shown");
        }
        DlqCommand::Replay {
            topic,
            filter,
            kafka,
            to,
        } => {
            let mut progress = |done: u64, total: u64| {
                eprint!("\rreplay: {done} of {total} dead-letter records read");
            };
            let r = dlq::replay(
                &kafka.into(),
                &topic,
                &filter.into(),
                to.as_deref(),
                &mut progress,
            )?;
            eprintln!();
            println!(
                "read {} dead-letter record(s), replayed {}",
                r.read, r.replayed
            );
        }
    }
    Ok(())
}

fn write_summary_json(path: &std::path::Path, s: &Summary) -> anyhow::Result<()> {
    let json = serde_json::json!({
        "records_committed": s.txn.records_committed,
        "outputs_committed": s.txn.outputs_committed,
        "committed": s.txn.committed,
        "aborted": s.txn.aborted,
        "producer_rebuilds": s.txn.producer_rebuilds,
        "elapsed_s": s.elapsed.as_secs_f64(),
        "commit_us": s.txn.commit_durations.buckets(),
    });
    std::fs::write(path, json.to_string())
        .with_context(|| format!("cannot write {}", path.display()))
}

/// Runs the engine on a blocking thread; SIGTERM/SIGINT ask it to commit and stop.
fn run_until_signal(
    topology: Topology,
    identity: Identity,
    options: RunOptions,
    metrics_addr: Option<SocketAddr>,
) -> anyhow::Result<Summary> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let shutdown = Arc::new(AtomicBool::new(false));
    runtime.block_on(async {
        if let Some(addr) = metrics_addr {
            let handle = metrics::install(&topology.name)
                .map_err(|e| anyhow::anyhow!("cannot install the metrics recorder: {e}"))?;
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on {addr} for metrics"))?;
            tracing::info!(%addr, "serving /metrics, /healthz and /readyz");
            tokio::spawn(health::serve(
                listener,
                Arc::clone(&options.health),
                Some(handle),
            ));
        }
        let flag = Arc::clone(&shutdown);
        let grace = stop_grace(&topology);
        tokio::spawn(async move {
            wait_for_signal().await;
            flag.store(true, Ordering::Relaxed);
            // A stop is a commit and a few bounded calls; one that takes longer hangs in a
            // client call. Exiting then is a crash like any other: nothing uncommitted
            // counts, and the next instance with this id fences what is left open.
            tokio::select! {
                () = wait_for_signal() => telemetry::stop_forced("a second signal came"),
                () = tokio::time::sleep(grace) => telemetry::stop_forced(&format!(
                    "the job did not stop within {}s",
                    grace.as_secs()
                )),
            }
            std::process::exit(1);
        });
        // A client call that never returns (librdkafka#5456) leaves the job's thread stuck
        // for good: exit, a crash like any other, so that the process is restarted.
        let health = Arc::clone(&options.health);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                if let Some((call, running)) = health.hung_call() {
                    telemetry::stop_forced(&format!(
                        "the client call {call} has not returned for {} s",
                        running.as_secs()
                    ));
                    std::process::exit(1);
                }
            }
        });
        let job = tokio::task::spawn_blocking(move || {
            engine::run(&topology, &identity, &options, &shutdown)
        });
        job.await
            .context("the job thread panicked")?
            .map_err(anyhow::Error::from)
    })
}

/// How long a stop may take after SIGTERM/SIGINT before the process exits anyway: twice the
/// transaction timeout (every call of the final commit is bounded by it), at least 15 s.
fn stop_grace(topology: &Topology) -> Duration {
    Duration::from_millis(topology.runtime.transaction_timeout_ms.saturating_mul(2))
        .max(Duration::from_secs(15))
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        // Without signal handlers the job still stops on its own terms (errors, limits).
        _ => std::future::pending::<()>().await,
    }
}

fn run_embedded(
    topology: Topology,
    instance_id: String,
    records: u64,
    mut options: RunOptions,
    metrics_addr: Option<SocketAddr>,
) -> anyhow::Result<()> {
    eprintln!(
        "onceflow: no broker given, running `{}` on an embedded in-process cluster over {records} generated records.\n\
         onceflow: the embedded cluster is for trying things: it does NOT enforce transactions \
         (aborted records stay visible, nothing is fenced). Pass --bootstrap-servers for a real broker.",
        topology.name
    );
    let cluster = EmbeddedCluster::start(1)?;
    for topic in topology.input_topics() {
        cluster.create_topic(topic, 3)?;
    }
    for topic in topology
        .output_topics()
        .into_iter()
        .filter(|t| !t.is_empty())
    {
        cluster.create_topic(topic, 3)?;
    }
    for topic in topology.input_topics() {
        cluster.feed(topic, records)?;
    }
    options.stop_after_records = Some(records * topology.inputs.len() as u64);
    let identity = Identity {
        bootstrap_servers: cluster.bootstrap_servers().to_string(),
        instance_id,
    };
    let summary = run_until_signal(topology, identity, options, metrics_addr)?;
    print_summary(&summary);
    Ok(())
}

fn print_summary(s: &Summary) {
    let busy = s.busy.as_secs_f64();
    println!(
        "records in: {}  records out: {}  skipped: {}  transactions committed: {}  aborted: {}  producer rebuilds: {}  time: {:.2}s  ({:.0} records/s from the first record)",
        s.txn.records_committed,
        s.txn.outputs_committed,
        s.skipped,
        s.txn.committed,
        s.txn.aborted,
        s.txn.producer_rebuilds,
        s.elapsed.as_secs_f64(),
        s.txn.records_committed as f64 / busy.max(1e-9),
    );
}
