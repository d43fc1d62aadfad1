//! `onceflow run`: a job on a real broker until a signal, or once on an embedded cluster.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use crate::doctor::watch::Watch;
use crate::failpoints::Failpoints;
use crate::instance::{Identity, RunOptions, Summary};
use crate::kafka::{clients, embedded::EmbeddedCluster};
use crate::supervise::Supervisor;
use crate::telemetry::health::Health;
use crate::topology::Topology;

#[derive(clap::Args)]
pub struct RunArgs {
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
    /// Log a progress line this often, e.g. 10s, 1m (0 turns it off).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = super::duration)]
    progress_interval: Duration,
    /// The same in seconds (the former spelling).
    #[arg(
        long,
        hide = true,
        value_name = "SECS",
        conflicts_with = "progress_interval"
    )]
    progress_secs: Option<u64>,
    /// Serve /metrics (Prometheus), /healthz and /readyz on this address, e.g.
    /// 0.0.0.0:9090. Without it no metric is recorded.
    #[arg(long, env = "ONCEFLOW_METRICS_ADDR")]
    metrics_addr: Option<SocketAddr>,
    /// With --metrics-addr: how often librdkafka statistics (lag, rtt, queues) refresh, e.g.
    /// 5s (at least 1s).
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = super::duration)]
    statistics_interval: Duration,
    /// The same in seconds (the former spelling).
    #[arg(
        long,
        hide = true,
        value_name = "SECS",
        conflicts_with = "statistics_interval"
    )]
    statistics_secs: Option<u64>,
    /// When the job ends, write what it did as JSON to this file: committed counts and
    /// commit durations (`commit_us`: `[[µs, count], ...]`), and the same step by step
    /// (`commit_steps_us`: `deliveries`, `offsets`, `end`).
    #[arg(long)]
    summary_json: Option<PathBuf>,
}

pub fn run(args: RunArgs) -> anyhow::Result<bool> {
    // First: a SIGTERM from here on asks for a stop, even while the topology is loaded.
    let supervisor = Supervisor::start()?;
    let failpoints = Failpoints::from_env();
    if let Some(ms) = failpoints.start_delay_ms {
        std::thread::sleep(Duration::from_millis(ms));
    }
    let (topology, _) = super::load(&args.topology)?;
    let options = RunOptions {
        health: Arc::new(Health::default()),
        statistics_every: args.metrics_addr.map(|_| {
            let every = args
                .statistics_secs
                .map_or(args.statistics_interval, Duration::from_secs);
            every.max(Duration::from_secs(1))
        }),
        stop_after_records: args.stop_after_records,
        transient_failures: failpoints.transient_failures,
        abort_every: failpoints.abort_every,
        lose_commit_every: failpoints.lose_commit_every,
        exit_after_db_commit: failpoints.exit_after_db_commit,
        exit_after_kafka_commit: failpoints.exit_after_kafka_commit,
        progress_every: Some(
            args.progress_secs
                .map_or(args.progress_interval, Duration::from_secs),
        )
        .filter(|every| !every.is_zero()),
    };
    let bootstrap = args
        .bootstrap_servers
        .or_else(|| topology.kafka.bootstrap_servers.clone());
    let instance_id = args
        .instance_id
        .unwrap_or_else(clients::default_instance_id);
    match bootstrap {
        Some(servers) if !args.embedded => {
            let identity = Identity {
                bootstrap_servers: servers,
                instance_id,
            };
            // The job's own security settings reach the brokers the same way.
            let cluster = crate::kafka::Cluster {
                bootstrap: identity.bootstrap_servers.clone(),
                settings: topology.kafka.common.clone().into_iter().collect(),
            };
            let watch = Watch::start(&topology, cluster, options.health.clone());
            let summary =
                supervisor.run_until_signal(topology, identity, options, args.metrics_addr);
            drop(watch);
            let summary = summary?;
            print_summary(&summary);
            if let Some(path) = args.summary_json {
                write_summary_json(&path, &summary)?;
            }
        }
        _ => run_embedded(
            supervisor,
            topology,
            instance_id,
            args.records,
            options,
            args.metrics_addr,
        )?,
    }
    Ok(true)
}

fn run_embedded(
    supervisor: Supervisor,
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
    let outputs = topology.kafka_output_topics();
    for topic in topology.input_topics().into_iter().chain(outputs) {
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
    let summary = supervisor.run_until_signal(topology, identity, options, metrics_addr)?;
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

fn write_summary_json(path: &Path, s: &Summary) -> anyhow::Result<()> {
    let json = serde_json::json!({
        "records_committed": s.txn.records_committed,
        "outputs_committed": s.txn.outputs_committed,
        "committed": s.txn.committed,
        "aborted": s.txn.aborted,
        "producer_rebuilds": s.txn.producer_rebuilds,
        "elapsed_s": s.elapsed.as_secs_f64(),
        "commit_us": s.txn.commit_durations.buckets(),
        "commit_steps_us": {
            "deliveries": s.txn.commit_steps.deliveries.buckets(),
            "offsets": s.txn.commit_steps.offsets.buckets(),
            "end": s.txn.commit_steps.end.buckets(),
        },
    });
    std::fs::write(path, json.to_string())
        .with_context(|| format!("cannot write {}", path.display()))
}
