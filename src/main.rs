//! The onceflow command line.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};

use onceflow::embedded::EmbeddedCluster;
use onceflow::engine::{self, Identity, RunOptions, Summary};
use onceflow::telemetry::{self, health, health::Health, metrics};
use onceflow::topology::Topology;

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
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    telemetry::init_tracing(cli.log_json);
    match dispatch(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn dispatch(command: Command) -> anyhow::Result<()> {
    match command {
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
        } => {
            let topology = Topology::load(&topology)?;
            let options = RunOptions {
                health: Arc::new(Health::default()),
                statistics_every: metrics_addr.map(|_| Duration::from_secs(statistics_secs.max(1))),
                stop_after_records,
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
                    Ok(())
                }
                _ => run_embedded(topology, instance_id, records, options, metrics_addr),
            }
        }
    }
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
        tokio::spawn(async move {
            wait_for_signal().await;
            flag.store(true, Ordering::Relaxed);
        });
        let job = tokio::task::spawn_blocking(move || {
            engine::run(&topology, &identity, &options, &shutdown)
        });
        job.await
            .context("the job thread panicked")?
            .map_err(anyhow::Error::from)
    })
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
    if let Some(topic) = topology.output_topic() {
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
    let secs = s.elapsed.as_secs_f64();
    println!(
        "records in: {}  records out: {}  transactions committed: {}  aborted: {}  producer rebuilds: {}  time: {:.2}s  ({:.0} records/s)",
        s.txn.records_committed,
        s.txn.outputs_committed,
        s.txn.committed,
        s.txn.aborted,
        s.txn.producer_rebuilds,
        secs,
        s.txn.records_committed as f64 / secs.max(1e-9),
    );
}
