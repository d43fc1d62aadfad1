//! Recovery after single faults, measured: three `onceflow run` instances of one pass-through
//! job on a 3-broker cluster, a producer writing paced ids that carry their send time, and a
//! read_committed reader recording when each id arrives on which output partition.
//!
//! For each fault kind, several faults at random moments. For each fault: the longest time
//! without any arrival on any output partition (output flowing again), the worst stall of a
//! single output partition and of a single input partition (records waiting), the longest
//! gap in the producer's acknowledgements (the broker refusing input), the end-to-end latency
//! peak, and what the instances logged. For each kind: every id exactly once (set compare,
//! duplicates counted) at the end of its phase.
//!
//! Ignored by default: it needs a 3-node cluster started by `scripts/kafka start --nodes 3`
//! and takes about 20 minutes. docs/reliability.md has the command and the figures.
//!
//! Environment (besides `ONCEFLOW_TEST_BOOTSTRAP`):
//! - `KAFKA_PORT`, `ONCEFLOW_KAFKA_DIR` (and `ONCEFLOW_CACHE`): the cluster `scripts/kafka`
//!   runs, for the broker faults (skipped without them);
//! - `ONCEFLOW_RECOVERY_FAULTS`: the fault kinds to run, comma-separated (default: all of
//!   kill-restart, kill, term-restart, pause, broker-kill, broker-restart);
//! - `ONCEFLOW_RECOVERY_RUNS`: faults per kind (5); `ONCEFLOW_RECOVERY_RATE`: ids a second (2000);
//!   `ONCEFLOW_RECOVERY_BASELINE_SECS`: a window without faults first in each phase (10);
//! - `ONCEFLOW_RECOVERY_RUNTIME`: `key=value,...` added to the topology's `runtime` (none:
//!   the defaults are measured); `ONCEFLOW_RECOVERY_PRODUCER`: the same for `kafka.producer`;
//! - `ONCEFLOW_RECOVERY_OUT`: where the report and the instances' logs go
//!   (`target/recovery/<unix time>`).

mod common;
mod harness;

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use harness::*;
use rand::Rng;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;

const INSTANCES: usize = 3;
/// A record that arrives later than this after it was sent is not flowing normally.
const NORMAL_LATENCY_US: u64 = 1_000_000;
/// How long the harness waits for the flow to be normal again after a fault.
const RECOVERY_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a phase's job may take to flow at its start.
const WARM_UP_TIMEOUT: Duration = Duration::from_secs(180);
/// How long a paused instance stays stopped.
const PAUSE: Duration = Duration::from_secs(15);
/// How long a killed broker stays down.
const BROKER_DOWN: Duration = Duration::from_secs(10);
/// Quiet time after a fault has been recovered from, before the next one.
const QUIET: Duration = Duration::from_secs(3);
/// Broker settings shown in the report: the timeouts that set the floors.
const BROKER_SETTINGS: &[&str] = &[
    "transaction.abort.timed.out.transaction.cleanup.interval.ms",
    "transaction.max.timeout.ms",
    "broker.session.timeout.ms",
    "broker.heartbeat.interval.ms",
    "group.min.session.timeout.ms",
    "group.initial.rebalance.delay.ms",
    "offsets.topic.num.partitions",
    "transaction.state.log.num.partitions",
];

// --- fault kinds ------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    KillRestart,
    Kill,
    TermRestart,
    Pause,
    BrokerKill,
    BrokerRestart,
}

impl Fault {
    const ALL: [Fault; 6] = [
        Fault::KillRestart,
        Fault::Kill,
        Fault::TermRestart,
        Fault::Pause,
        Fault::BrokerKill,
        Fault::BrokerRestart,
    ];

    fn name(self) -> &'static str {
        match self {
            Fault::KillRestart => "kill-restart",
            Fault::Kill => "kill",
            Fault::TermRestart => "term-restart",
            Fault::Pause => "pause",
            Fault::BrokerKill => "broker-kill",
            Fault::BrokerRestart => "broker-restart",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Fault::KillRestart => "SIGKILL an instance, restart it at once with the same id",
            Fault::Kill => {
                "SIGKILL an instance and leave it dead (the others take over); then `rejoin`: start it again"
            }
            Fault::TermRestart => {
                "SIGTERM an instance, restart it once it exited (a rolling restart step)"
            }
            Fault::Pause => "SIGSTOP an instance for 15 s, then SIGCONT",
            Fault::BrokerKill => "SIGKILL a broker, restart it 10 s later",
            Fault::BrokerRestart => "stop a broker cleanly (SIGTERM), start it again",
        }
    }

    fn on_broker(self) -> bool {
        matches!(self, Fault::BrokerKill | Fault::BrokerRestart)
    }

    fn parse(s: &str) -> Fault {
        Fault::ALL
            .into_iter()
            .find(|f| f.name() == s.trim())
            .unwrap_or_else(|| panic!("unknown fault kind `{s}`"))
    }
}

// --- configuration ----------------------------------------------------------------------

struct Config {
    faults: Vec<Fault>,
    runs: usize,
    rate: u64,
    /// How long each phase runs without faults after its warm-up, measured as a window.
    baseline: Duration,
    /// Lines added to the topology's `runtime` section.
    runtime: Vec<(String, String)>,
    /// Settings added to the topology's `kafka.producer`.
    producer: Vec<(String, String)>,
    out_dir: PathBuf,
    cluster: Result<Cluster, String>,
}

impl Config {
    fn from_env() -> Config {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let faults = var("ONCEFLOW_RECOVERY_FAULTS").map_or_else(
            || Fault::ALL.to_vec(),
            |v| v.split(',').map(Fault::parse).collect(),
        );
        let runs = var("ONCEFLOW_RECOVERY_RUNS").map_or(5, |v| v.parse().expect("runs"));
        let rate = var("ONCEFLOW_RECOVERY_RATE").map_or(2_000, |v| v.parse().expect("rate"));
        let baseline = Duration::from_secs(
            var("ONCEFLOW_RECOVERY_BASELINE_SECS").map_or(10, |v| v.parse().expect("seconds")),
        );
        let pairs = |name: &str| {
            var(name).map_or_else(Vec::new, |v| {
                v.split(',')
                    .map(|kv| {
                        let (k, v) = kv
                            .split_once('=')
                            .unwrap_or_else(|| panic!("{name}: `{kv}` is not key=value"));
                        (k.trim().to_string(), v.trim().to_string())
                    })
                    .collect()
            })
        };
        let runtime = pairs("ONCEFLOW_RECOVERY_RUNTIME");
        let producer = pairs("ONCEFLOW_RECOVERY_PRODUCER");
        let out_dir = var("ONCEFLOW_RECOVERY_OUT").map_or_else(
            || {
                Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("target/recovery")
                    .join((now_us() / 1_000_000).to_string())
            },
            PathBuf::from,
        );
        Config {
            faults,
            runs,
            rate,
            baseline,
            runtime,
            producer,
            out_dir,
            cluster: Cluster::from_env(),
        }
    }
}

/// The settings of broker `id` named in [`BROKER_SETTINGS`], as `name=value`.
fn broker_settings(id: i32) -> Vec<String> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .expect("admin client");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let resources = [ResourceSpecifier::Broker(id)];
    let Ok(results) = rt.block_on(admin.describe_configs(&resources, &AdminOptions::new())) else {
        return vec!["(describe_configs failed)".into()];
    };
    let Some(Ok(config)) = results.into_iter().next() else {
        return vec!["(no configuration returned)".into()];
    };
    BROKER_SETTINGS
        .iter()
        .map(|name| {
            let value = config
                .get(name)
                .and_then(|e| e.value.clone())
                .unwrap_or_else(|| "?".into());
            format!("{name}={value}")
        })
        .collect()
}

/// The feed process of [`Feed`]; does nothing unless `ONCEFLOW_RECOVERY_FEED_TOPIC` is set.
#[test]
#[ignore = "the feed process of recovery_after_single_faults"]
fn recovery_feed() {
    harness::feed_main();
}

// --- measuring a window --------------------------------------------------------------------

/// The time from one fault to the next (or to the end of the phase), and what happened in it.
struct Window {
    label: &'static str,
    run: usize,
    target: String,
    start: u64,
    end: u64,
    /// When the fault was over: the instance or broker started again, or SIGCONT.
    done: u64,
    /// When every input partition delivered again a record sent after `done` within
    /// [`NORMAL_LATENCY_US`]; `None` if not within [`RECOVERY_TIMEOUT`].
    recovered: Option<u64>,
    notes: Vec<String>,
}

#[derive(Debug, Clone, Copy, Default)]
struct Measure {
    /// Longest time without any arrival on any output partition.
    flow_gap: u64,
    /// Longest stall of one output partition, and which.
    out_gap: (u64, i32),
    /// Longest stall of one input partition's records (by arrival of its ids), and which.
    in_gap: (u64, i32),
    /// Longest gap between acknowledgements of one input partition to the producer.
    ack_gap: (u64, i32),
    latency_peak: u64,
    /// When the last record later than [`NORMAL_LATENCY_US`] arrived, after the start.
    normal_after: u64,
    /// The machine's highest 1-minute load average in the window.
    load: f64,
}

fn measure(arrivals: &[Arrival], acks: &[Vec<u64>], w: &Window) -> Measure {
    let lo = arrivals.partition_point(|a| a.at < w.start);
    let hi = arrivals.partition_point(|a| a.at < w.end);
    let inside = &arrivals[lo..hi];
    let mut m = Measure {
        flow_gap: longest_gap(inside.iter().map(|a| a.at), w.start, w.end),
        ..Measure::default()
    };
    for p in 0..PARTITIONS {
        let out = longest_gap(
            inside.iter().filter(|a| a.partition == p).map(|a| a.at),
            w.start,
            w.end,
        );
        if out > m.out_gap.0 {
            m.out_gap = (out, p);
        }
        let input = longest_gap(
            inside
                .iter()
                .filter(|a| a.id % PARTITIONS as u64 == p as u64)
                .map(|a| a.at),
            w.start,
            w.end,
        );
        if input > m.in_gap.0 {
            m.in_gap = (input, p);
        }
        if let Some(times) = acks.get(p as usize) {
            let lo = times.partition_point(|t| *t < w.start);
            let hi = times.partition_point(|t| *t < w.end);
            let ack = longest_gap(times[lo..hi].iter().copied(), w.start, w.end);
            if ack > m.ack_gap.0 {
                m.ack_gap = (ack, p);
            }
        }
    }
    for a in inside {
        let latency = a.at.saturating_sub(a.sent);
        m.latency_peak = m.latency_peak.max(latency);
        if latency > NORMAL_LATENCY_US {
            m.normal_after = m.normal_after.max(a.at.saturating_sub(w.start));
        }
    }
    m
}

// --- one phase: one fault kind ---------------------------------------------------------------

/// Whether every id arrived exactly once.
#[derive(Default)]
struct Verdict {
    sent: u64,
    /// Ids the (not idempotent) feed wrote twice to the input.
    input_twice: u64,
    /// Records in the input.
    input_records: u64,
    failed_sends: Vec<(u64, String)>,
    distinct: u64,
    duplicated: Vec<(u64, u32)>,
    missing: Vec<u64>,
    unexpected: Vec<u64>,
    hanging: Option<String>,
    evidence: Vec<String>,
}

impl Verdict {
    /// Sends the broker refused are not expected (nor forbidden) in the output.
    fn ok(&self) -> bool {
        self.duplicated.is_empty()
            && self.missing.is_empty()
            && self.unexpected.is_empty()
            && self.hanging.is_none()
    }

    fn summary(&self) -> String {
        let mut refused = if self.failed_sends.is_empty() {
            String::new()
        } else {
            format!("; {} sends refused by the broker", self.failed_sends.len())
        };
        if self.input_twice > 0 {
            let _ = write!(
                refused,
                "; {} ids written twice to the input by the feed, expected twice",
                self.input_twice
            );
        }
        if self.ok() {
            return format!(
                "yes ({} input records, each once: 0 duplicates, 0 missing{refused})",
                self.input_records
            );
        }
        let mut s = format!(
            "NO: {} ids sent, {} distinct read, {} duplicated, {} missing, {} unexpected",
            self.sent,
            self.distinct,
            self.duplicated.len(),
            self.missing.len(),
            self.unexpected.len()
        );
        s.push_str(&refused);
        if let Some(h) = &self.hanging {
            let _ = write!(s, "; {h}");
        }
        s
    }
}

struct PhaseResult {
    fault: Fault,
    windows: Vec<(Window, Measure)>,
    verdict: Verdict,
    stop_statuses: Vec<String>,
    reader_errors: usize,
    took: Duration,
    /// The machine's 1-minute load average over the phase: mean and highest.
    load: (f64, f64),
    /// CPU seconds of the harness (feed, reader) and of the instances over the phase.
    cpu: (f64, f64),
    /// When the phase began.
    origin: u64,
    events: Vec<Event>,
    notes: Vec<String>,
}

fn topology_text(name: &str, input: &str, output: &str, cfg: &Config) -> String {
    let mut text =
        format!("name: {name}\ninputs:\n  - topic: {input}\noutputs:\n  - topic: {output}\n");
    if !cfg.runtime.is_empty() {
        text.push_str("runtime:\n");
        for (k, v) in &cfg.runtime {
            let _ = writeln!(text, "  {k}: {v}");
        }
    }
    if !cfg.producer.is_empty() {
        text.push_str("kafka:\n  producer:\n");
        for (k, v) in &cfg.producer {
            let _ = writeln!(text, "    {k}: '{v}'");
        }
    }
    text
}

fn run_phase(cfg: &Config, fault: Fault, rng: &mut impl Rng) -> PhaseResult {
    let started = Instant::now();
    let dir = cfg.out_dir.join(fault.name());
    std::fs::create_dir_all(&dir).expect("phase folder");
    let name = unique(&format!("recovery-{}", fault.name()));
    let (input, output) = (format!("{name}-in"), format!("{name}-out"));
    create_replicated_topics(
        &[&input, &output],
        PARTITIONS,
        3,
        &[("min.insync.replicas", "2")],
    );
    let topology_path = dir.join("topology.yaml");
    let yaml = topology_text(&name, &input, &output, cfg);
    std::fs::write(&topology_path, &yaml).expect("write topology");
    let topology = onceflow::topology::Topology::parse(&yaml, "topology.yaml").expect("topology");
    let ids: Vec<String> = (0..INSTANCES).map(|i| format!("r-{i}")).collect();
    let txn_ids: Vec<(String, String)> = ids
        .iter()
        .map(|id| (id.clone(), format!("onceflow.{name}.{id}")))
        .collect();
    let meta = Meta::new();

    let origin = now_us();
    let cpu_before = cpu_times();
    let load = LoadSampler::start();
    let reader = Reader::start(&output);
    let mut fleet = Fleet::new(&topology_path, &dir, &ids, origin);
    for i in 0..INSTANCES {
        fleet.spawn(i);
    }
    let feed = Feed::start(
        "recovery_feed",
        &input,
        cfg.rate,
        false,
        &dir.join("feed.txt"),
    );

    // Warm up: every member has partitions and every input partition flows. A job that
    // never flows gets no faults; its phase still ends with the exactly-once check.
    let warm = Instant::now();
    let mut notes = Vec::new();
    let mut runs = cfg.runs;
    loop {
        if let Err(e) = wait_recovered(
            &reader,
            &mut fleet,
            origin,
            WARM_UP_TIMEOUT,
            NORMAL_LATENCY_US,
        ) {
            notes.push(format!("warm-up: {e}; no faults injected"));
            runs = 0;
            break;
        }
        if fleet.all_assigned_since(origin) || warm.elapsed() > Duration::from_secs(60) {
            break;
        }
        fleet.idle(Duration::from_millis(500));
    }
    fleet.idle(Duration::from_secs(5));
    fleet.note(
        "harness",
        format!("warm after {} s; faults begin", warm.elapsed().as_secs()),
    );

    // A window without a fault: the gaps and latencies of normal flow.
    let mut windows: Vec<Window> = Vec::new();
    if runs > 0 && !cfg.baseline.is_zero() {
        let start = now_us();
        fleet.idle(cfg.baseline);
        windows.push(Window {
            label: "no fault",
            run: 0,
            target: "-".into(),
            start,
            end: 0,
            done: start,
            recovered: Some(start),
            notes: Vec::new(),
        });
    }
    for run in 0..runs {
        fleet.idle(Duration::from_millis(rng.random_range(500..2_500)));
        let i = rng.random_range(0..INSTANCES);
        let member = ids[i].clone();
        let mut w = Window {
            label: fault.name(),
            run,
            target: member.clone(),
            start: now_us(),
            end: 0,
            done: 0,
            recovered: None,
            notes: Vec::new(),
        };
        match fault {
            Fault::KillRestart => {
                fleet.kill(i);
                fleet.spawn(i);
            }
            Fault::Kill => fleet.kill(i),
            Fault::TermRestart => {
                let t = Instant::now();
                let status = fleet.terminate(i, Duration::from_secs(60));
                w.notes.push(format!(
                    "stopped in {:.1} s with {}",
                    t.elapsed().as_secs_f64(),
                    status.map_or("no exit within 60 s".into(), |s| s.to_string())
                ));
                if status.is_none() {
                    fleet.kill(i);
                }
                fleet.spawn(i);
            }
            Fault::Pause => {
                fleet.signal(i, "-STOP");
                fleet.idle(PAUSE);
                fleet.signal(i, "-CONT");
            }
            Fault::BrokerKill | Fault::BrokerRestart => {
                let cluster = cfg.cluster.as_ref().expect("a cluster for broker faults");
                let roles = broker_roles(&meta, &topology.group_id(), &txn_ids, &input, &output);
                let brokers = meta.brokers();
                let group_coordinator = roles
                    .iter()
                    .find(|(_, r)| r.iter().any(|r| r == "group coordinator"))
                    .map_or(brokers[0], |(b, _)| *b);
                let first = brokers
                    .iter()
                    .position(|b| *b == group_coordinator)
                    .unwrap_or(0);
                let node = brokers[(first + run) % brokers.len()];
                w.target = format!(
                    "broker {node} ({})",
                    roles.get(&node).map_or(String::new(), |r| r.join("; "))
                );
                w.start = now_us();
                fleet.note("harness", format!("fault on {}", w.target));
                if fault == Fault::BrokerKill {
                    if let Err(e) = supervised(&mut fleet, || cluster.kill(node)) {
                        w.notes.push(e);
                    }
                    fleet.idle(BROKER_DOWN);
                } else {
                    let t = Instant::now();
                    match supervised(&mut fleet, || cluster.stop_cleanly(node)) {
                        Ok(()) => w.notes.push(format!(
                            "broker stopped in {:.1} s",
                            t.elapsed().as_secs_f64()
                        )),
                        Err(e) => w.notes.push(e),
                    }
                }
                let t = Instant::now();
                match supervised(&mut fleet, || cluster.restart(node)) {
                    Ok(()) => w.notes.push(format!(
                        "broker ready {:.1} s after its start",
                        t.elapsed().as_secs_f64()
                    )),
                    Err(e) => w.notes.push(e),
                }
            }
        }
        w.done = now_us();
        match wait_recovered(
            &reader,
            &mut fleet,
            w.done,
            RECOVERY_TIMEOUT,
            NORMAL_LATENCY_US,
        ) {
            Ok(at) => w.recovered = Some(at),
            Err(e) => w.notes.push(e),
        }
        if fault.on_broker() {
            let topics = [
                input.as_str(),
                output.as_str(),
                "__consumer_offsets",
                "__transaction_state",
            ];
            match meta.wait_in_sync(&topics, Duration::from_secs(90)) {
                Ok(took) => w.notes.push(format!(
                    "replicas in sync {:.1} s after recovery",
                    took.as_secs_f64()
                )),
                Err(e) => w.notes.push(e),
            }
        }
        windows.push(w);
        if fault == Fault::Kill {
            // The others took over; the dead one comes back: a rebalance moving partitions
            // to a member that joins.
            fleet.idle(Duration::from_secs(2));
            let mut rejoin = Window {
                label: "rejoin",
                run,
                target: member.clone(),
                start: now_us(),
                end: 0,
                done: 0,
                recovered: None,
                notes: Vec::new(),
            };
            fleet.spawn(i);
            rejoin.done = now_us();
            match wait_recovered(
                &reader,
                &mut fleet,
                rejoin.done,
                RECOVERY_TIMEOUT,
                NORMAL_LATENCY_US,
            ) {
                Ok(at) => rejoin.recovered = Some(at),
                Err(e) => rejoin.notes.push(e),
            }
            windows.push(rejoin);
        }
        fleet.idle(QUIET);
    }

    // The end: input stops, everything sent must come through, the instances stop cleanly,
    // and nothing is left hanging before the end markers.
    let stopped_at = now_us();
    let (sent, acks) = feed.stop();
    for w in &mut windows {
        w.end = stopped_at;
    }
    for k in 0..windows.len().saturating_sub(1) {
        windows[k].end = windows[k + 1].start;
    }
    let mut seen = vec![0u32; sent as usize];
    let mut distinct = 0u64;
    let mut cursor = 0;
    let deadline = Instant::now() + Duration::from_secs(120);
    while distinct < acks.delivered && Instant::now() < deadline {
        cursor = reader.scan(cursor, |a| {
            if let Some(c) = seen.get_mut(a.id as usize) {
                if *c == 0 {
                    distinct += 1;
                }
                *c += 1;
            }
        });
        fleet.supervise();
        std::thread::sleep(Duration::from_millis(200));
    }
    let stop_statuses: Vec<String> = fleet
        .stop_all()
        .into_iter()
        .map(|(id, st)| {
            format!(
                "{id}: {}",
                st.map_or("no exit within 60 s".into(), |s| s.to_string())
            )
        })
        .collect();
    let hanging = reader
        .read_to_marker(&output, Duration::from_secs(60))
        .err();
    let state = reader.finish();
    let loads = load.finish();
    let cpu_after = cpu_times();
    write_timeline(&dir.join("timeline.csv"), origin, &state.arrivals);
    let census = input_census(&input, sent);
    let verdict = judge(
        &census,
        sent,
        acks.failed,
        &state.arrivals,
        hanging,
        &windows,
    );
    let events = std::mem::take(&mut *lock(&fleet.events));
    let measured = windows
        .into_iter()
        .map(|w| {
            let mut m = measure(&state.arrivals, &acks.by_partition, &w);
            m.load = peak_load(&loads, w.start, w.end);
            (w, m)
        })
        .collect();
    PhaseResult {
        fault,
        windows: measured,
        verdict,
        stop_statuses,
        reader_errors: state.errors.len(),
        took: started.elapsed(),
        load: (
            loads.iter().map(|(_, l)| l).sum::<f64>() / loads.len().max(1) as f64,
            peak_load(&loads, 0, u64::MAX),
        ),
        cpu: (cpu_after.0 - cpu_before.0, cpu_after.1 - cpu_before.1),
        origin,
        events,
        notes,
    }
}

/// Compares what was read with what the input holds; names each anomaly with the window it
/// fell in.
fn judge(
    input: &[u32],
    sent: u64,
    failed_sends: Vec<(u64, String)>,
    arrivals: &[Arrival],
    hanging: Option<String>,
    windows: &[Window],
) -> Verdict {
    let mut counts = vec![0u32; sent as usize];
    let mut unexpected = BTreeSet::new();
    for a in arrivals {
        match counts.get_mut(a.id as usize) {
            Some(c) => *c += 1,
            None => {
                unexpected.insert(a.id);
            }
        }
    }
    let expected = |id: usize| input.get(id).copied().unwrap_or(0);
    let window_of = |t: u64| {
        windows
            .iter()
            .rev()
            .find(|w| w.start <= t)
            .map_or("warm-up".to_string(), |w| {
                format!("{} #{} ({})", w.label, w.run, w.target)
            })
    };
    let duplicated: Vec<(u64, u32)> = counts
        .iter()
        .enumerate()
        .filter(|(id, c)| **c > expected(*id))
        .map(|(id, c)| (id as u64, *c))
        .collect();
    let missing: Vec<u64> = counts
        .iter()
        .enumerate()
        .filter(|(id, c)| **c < expected(*id))
        .map(|(id, _)| id as u64)
        .collect();
    let input_twice = input.iter().filter(|c| **c > 1).count() as u64;
    let mut evidence = Vec::new();
    for (id, n) in duplicated.iter().take(10) {
        let copies: Vec<String> = arrivals
            .iter()
            .filter(|a| a.id == *id)
            .map(|a| format!("out p{} at {} [{}]", a.partition, a.at, window_of(a.at)))
            .collect();
        evidence.push(format!(
            "id {id} (input p{}) read {n} times: {}",
            id % PARTITIONS as u64,
            copies.join("; ")
        ));
    }
    if !missing.is_empty() {
        evidence.push(format!(
            "missing ids (first 20): {:?}; input partitions {:?}",
            &missing[..missing.len().min(20)],
            missing
                .iter()
                .map(|id| id % PARTITIONS as u64)
                .collect::<BTreeSet<_>>()
        ));
    }
    Verdict {
        sent,
        input_twice,
        input_records: input.iter().map(|c| u64::from(*c)).sum(),
        distinct: counts.iter().filter(|c| **c > 0).count() as u64,
        failed_sends,
        duplicated,
        missing,
        unexpected: unexpected.into_iter().collect(),
        hanging,
        evidence,
    }
}

// --- the report ------------------------------------------------------------------------------

fn median(values: &mut [u64]) -> u64 {
    values.sort_unstable();
    match values.len() {
        0 => 0,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2,
    }
}

fn window_line(w: &Window, m: &Measure, events: &[Event]) -> String {
    let recovered = w.recovered.map_or("never".into(), |r| {
        format!("+{}", secs(r.saturating_sub(w.start)))
    });
    let mut line = format!(
        "{} #{} {}: load ≤ {:.0} | no output {} s | worst out p{} {} s | worst in p{} {} s | acks p{} {} s | latency peak {} s | normal after {} s | fault over +{} s, flowing {}",
        w.label,
        w.run,
        w.target,
        m.load,
        secs(m.flow_gap),
        m.out_gap.1,
        secs(m.out_gap.0),
        m.in_gap.1,
        secs(m.in_gap.0),
        m.ack_gap.1,
        secs(m.ack_gap.0),
        secs(m.latency_peak),
        secs(m.normal_after),
        secs(w.done.saturating_sub(w.start)),
        recovered,
    );
    for n in &w.notes {
        let _ = write!(line, " | {n}");
    }
    let mut shown = Vec::<String>::new();
    for e in events.iter().filter(|e| e.at >= w.start && e.at < w.end) {
        if let Some(d) = describe_event(e) {
            let item = format!("+{} {} {d}", secs(e.at - w.start), e.who);
            if shown.len() < 24
                && !shown
                    .iter()
                    .any(|s| s.ends_with(&format!(" {} {d}", e.who)))
            {
                shown.push(item);
            }
        }
    }
    if !shown.is_empty() {
        let _ = write!(line, "\n    events: {}", shown.join(" · "));
    }
    line
}

fn report(cfg: &Config, header: &[String], phases: &[PhaseResult], details: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# Recovery measurement\n");
    for h in header {
        let _ = writeln!(out, "- {h}");
    }
    let _ = writeln!(
        out,
        "\n| fault | runs | no output: median | no output: worst | worst output partition stall | worst input partition stall | worst producer ack gap | latency peak (worst) | back to normal (worst) | exactly once | instances that exited by themselves | load avg (mean/max) |"
    );
    let _ = writeln!(
        out,
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|"
    );
    for p in phases {
        let mut labels: Vec<&str> = Vec::new();
        for (w, _) in &p.windows {
            if !labels.contains(&w.label) {
                labels.push(w.label);
            }
        }
        for label in labels {
            let ms: Vec<&Measure> = p
                .windows
                .iter()
                .filter(|(w, _)| w.label == label)
                .map(|(_, m)| m)
                .collect();
            let mut gaps: Vec<u64> = ms.iter().map(|m| m.flow_gap).collect();
            let worst = |f: &dyn Fn(&Measure) -> u64| ms.iter().map(|m| f(m)).max().unwrap_or(0);
            let _ = writeln!(
                out,
                "| {label} | {} | {} s | {} s | {} s | {} s | {} s | {} s | {} s | {} | {} | {:.1} / {:.1} |",
                ms.len(),
                secs(median(&mut gaps)),
                secs(worst(&|m| m.flow_gap)),
                secs(worst(&|m| m.out_gap.0)),
                secs(worst(&|m| m.in_gap.0)),
                secs(worst(&|m| m.ack_gap.0)),
                secs(worst(&|m| m.latency_peak)),
                secs(worst(&|m| m.normal_after)),
                p.verdict.summary(),
                p.events
                    .iter()
                    .filter(|e| e.text.contains("exited on its own"))
                    .count(),
                p.load.0,
                p.load.1,
            );
        }
    }
    let _ = writeln!(out, "\nFault kinds:\n");
    for f in &cfg.faults {
        let _ = writeln!(out, "- `{}`: {}", f.name(), f.describe());
    }
    let _ = writeln!(out, "\n## Each fault\n\n```text\n{details}```");
    out
}

#[test]
#[ignore = "needs a 3-node cluster (scripts/kafka start --nodes 3) and ~20 minutes; see docs/reliability.md"]
fn recovery_after_single_faults() {
    let cfg = Config::from_env();
    std::fs::create_dir_all(&cfg.out_dir).expect("output folder");
    let brokers = Meta::new().brokers();
    assert!(
        brokers.len() >= 3,
        "the recovery measurement needs 3 brokers, the cluster has {brokers:?}"
    );
    let yaml = topology_text("t", "in", "out", &cfg);
    let rt = onceflow::topology::Topology::parse(&yaml, "topology.yaml")
        .expect("runtime overrides")
        .runtime;
    let mut header = vec![
        format!(
            "job: pass-through, {INSTANCES} `onceflow run` instances, topics of {PARTITIONS} partitions (replication factor 3, min.insync.replicas 2), {} ids/s",
            cfg.rate
        ),
        format!(
            "runtime: session_timeout_ms {}, transaction_timeout_ms {}, commit_interval_ms {}, static_membership {} ({})",
            rt.session_timeout_ms,
            rt.transaction_timeout_ms,
            rt.commit_interval_ms,
            rt.static_membership,
            if cfg.runtime.is_empty() {
                "the defaults".to_string()
            } else {
                format!("set: {:?}", cfg.runtime)
            }
        ),
        format!(
            "kafka.producer: {}",
            if cfg.producer.is_empty() {
                "onceflow's settings".to_string()
            } else {
                format!("set: {:?}", cfg.producer)
            }
        ),
        format!(
            "brokers {brokers:?}: {}",
            broker_settings(brokers[0]).join(", ")
        ),
        format!(
            "machine: {} cores, load average at start {}",
            std::thread::available_parallelism().map_or(0, |n| n.get()),
            std::fs::read_to_string("/proc/loadavg")
                .unwrap_or_default()
                .split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        ),
    ];
    let mut rng = rand::rng();
    let mut phases = Vec::new();
    let mut details = String::new();
    for &fault in &cfg.faults {
        if fault.on_broker()
            && let Err(why) = &cfg.cluster
        {
            eprintln!("recovery: {} skipped: {why}", fault.name());
            header.push(format!("{} skipped: {why}", fault.name()));
            continue;
        }
        eprintln!("recovery: phase {}: {}", fault.name(), fault.describe());
        let phase = run_phase(&cfg, fault, &mut rng);
        let from = details.len();
        let _ = writeln!(
            details,
            "## {} ({} s, load average mean {:.1}, highest {:.1}; CPU: harness {:.0} s, instances {:.0} s)",
            fault.name(),
            phase.took.as_secs(),
            phase.load.0,
            phase.load.1,
            phase.cpu.0,
            phase.cpu.1
        );
        for (w, m) in &phase.windows {
            let _ = writeln!(details, "{}", window_line(w, m, &phase.events));
        }
        for n in &phase.notes {
            let _ = writeln!(details, "note: {n}");
        }
        let _ = writeln!(details, "exactly once: {}", phase.verdict.summary());
        for e in &phase.verdict.evidence {
            let _ = writeln!(details, "  evidence: {e}");
        }
        let _ = writeln!(
            details,
            "stopped: {}; reader errors: {}",
            phase.stop_statuses.join(", "),
            phase.reader_errors
        );
        let log: Vec<String> = phase
            .events
            .iter()
            .filter_map(|e| {
                describe_event(e).map(|d| {
                    format!(
                        "+{}s {}: {d}",
                        secs(e.at.saturating_sub(phase.origin)),
                        e.who
                    )
                })
            })
            .collect();
        std::fs::write(
            cfg.out_dir.join(fault.name()).join("events.txt"),
            log.join("\n"),
        )
        .expect("write events");
        eprint!("{}", &details[from..]);
        phases.push(phase);
        let text = report(&cfg, &header, &phases, &details);
        std::fs::write(cfg.out_dir.join("report.md"), &text).expect("write report");
    }
    let text = report(&cfg, &header, &phases, &details);
    println!("{text}");
    eprintln!(
        "recovery: report in {}",
        cfg.out_dir.join("report.md").display()
    );
    let broken: Vec<String> = phases
        .iter()
        .filter(|p| !p.verdict.ok())
        .map(|p| format!("{}: {}", p.fault.name(), p.verdict.summary()))
        .collect();
    assert!(broken.is_empty(), "exactly-once violated: {broken:?}");
}
