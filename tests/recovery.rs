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

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::*;
use rand::Rng;
use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::{ClientConfig, ClientContext, Offset, TopicPartitionList};

const PARTITIONS: i32 = 6;
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

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// Seconds, one decimal.
fn secs(us: u64) -> String {
    format!("{:.1}", us as f64 / 1e6)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

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

// --- the cluster of scripts/kafka ---------------------------------------------------------

/// The nodes `scripts/kafka start --nodes 3` runs: node i is broker i.
struct Cluster {
    script: PathBuf,
    state_dir: PathBuf,
}

impl Cluster {
    /// The cluster named by `ONCEFLOW_KAFKA_DIR` and `KAFKA_PORT`, which `scripts/kafka` reads
    /// too (this process's environment is passed on). Both must be given: the harness never
    /// acts on a cluster it was not pointed at.
    fn from_env() -> Result<Cluster, String> {
        let dir = std::env::var("ONCEFLOW_KAFKA_DIR")
            .map_err(|_| "ONCEFLOW_KAFKA_DIR is not set".to_string())?;
        let port: u16 = std::env::var("KAFKA_PORT")
            .map_err(|_| "KAFKA_PORT is not set".to_string())?
            .parse()
            .map_err(|_| "KAFKA_PORT is not a port".to_string())?;
        if !bootstrap().contains(&format!(":{port}")) {
            return Err(format!(
                "ONCEFLOW_TEST_BOOTSTRAP does not name KAFKA_PORT {port}"
            ));
        }
        let state_dir = PathBuf::from(dir);
        if !state_dir.join("cluster.env").exists() {
            return Err(format!("{} holds no cluster", state_dir.display()));
        }
        Ok(Cluster {
            script: Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/kafka"),
            state_dir,
        })
    }

    fn run(&self, args: &[&str]) -> Result<(), String> {
        let out = Command::new(&self.script)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .map_err(|e| format!("scripts/kafka {args:?}: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "scripts/kafka {args:?}: {}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }

    fn kill(&self, node: i32) -> Result<(), String> {
        self.run(&["kill", &node.to_string()])
    }

    fn restart(&self, node: i32) -> Result<(), String> {
        self.run(&["restart-node", &node.to_string()])
    }

    /// SIGTERM to the node's broker (a controlled shutdown: it hands its leaderships over
    /// first), and waits until it has exited.
    fn stop_cleanly(&self, node: i32) -> Result<(), String> {
        let pidfile = self.state_dir.join(format!("node-{node}/kafka.pid"));
        let pid: u32 = std::fs::read_to_string(&pidfile)
            .map_err(|e| format!("{}: {e}", pidfile.display()))?
            .trim()
            .parse()
            .map_err(|_| format!("{} holds no pid", pidfile.display()))?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline);
        let props = self
            .state_dir
            .join(format!("node-{node}/server.properties"));
        if !cmdline.contains("kafka.Kafka") || !cmdline.contains(&*props.to_string_lossy()) {
            return Err(format!("pid {pid} is not node {node}'s broker"));
        }
        let status = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .map_err(|e| e.to_string())?;
        if !status.success() {
            return Err(format!("kill -TERM {pid}: {status}"));
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        while Path::new(&format!("/proc/{pid}")).exists() {
            if Instant::now() > deadline {
                return Err(format!("node {node} did not stop within 60 s"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
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

// --- metadata: leaders, coordinators, replicas in sync -----------------------------------

struct Meta {
    client: BaseConsumer,
}

/// One partition of the metadata: leader, replicas, replicas in sync.
struct PartitionMeta {
    partition: i32,
    leader: i32,
    replicas: usize,
    isr: usize,
}

impl Meta {
    fn new() -> Meta {
        Meta {
            client: ClientConfig::new()
                .set("bootstrap.servers", bootstrap())
                .create()
                .expect("metadata client"),
        }
    }

    fn brokers(&self) -> Vec<i32> {
        let md = self
            .client
            .fetch_metadata(None, Duration::from_secs(10))
            .expect("metadata");
        let mut ids: Vec<i32> = md.brokers().iter().map(|b| b.id()).collect();
        ids.sort_unstable();
        ids
    }

    fn partitions(&self, topic: &str) -> Result<Vec<PartitionMeta>, String> {
        let md = self
            .client
            .fetch_metadata(Some(topic), Duration::from_secs(10))
            .map_err(|e| e.to_string())?;
        let t = md
            .topics()
            .first()
            .ok_or_else(|| format!("no metadata for {topic}"))?;
        if let Some(e) = t.error() {
            return Err(format!("{topic}: {e:?}"));
        }
        Ok(t.partitions()
            .iter()
            .map(|p| PartitionMeta {
                partition: p.id(),
                leader: p.leader(),
                replicas: p.replicas().len(),
                isr: p.isr().len(),
            })
            .collect())
    }

    /// The leader of the partition of internal topic `topic` that coordinates `key`.
    fn coordinator(&self, topic: &str, key: &str) -> Result<i32, String> {
        let partitions = self.partitions(topic)?;
        let wanted = coordinator_partition(key, partitions.len() as i32);
        partitions
            .iter()
            .find(|p| p.partition == wanted)
            .map(|p| p.leader)
            .ok_or_else(|| format!("{topic} has no partition {wanted}"))
    }

    /// Waits until every partition of `topics` has all its replicas in sync; says which do
    /// not when `timeout` passes.
    fn wait_in_sync(&self, topics: &[&str], timeout: Duration) -> Result<Duration, String> {
        let started = Instant::now();
        loop {
            let mut lagging = Vec::new();
            for topic in topics {
                match self.partitions(topic) {
                    Ok(ps) => lagging.extend(
                        ps.iter()
                            .filter(|p| p.isr < p.replicas || p.leader < 0)
                            .map(|p| format!("{topic}[{}]", p.partition)),
                    ),
                    Err(e) => lagging.push(e),
                }
            }
            if lagging.is_empty() {
                return Ok(started.elapsed());
            }
            if started.elapsed() > timeout {
                return Err(format!(
                    "{} partitions under-replicated after {} s (first: {:?})",
                    lagging.len(),
                    timeout.as_secs(),
                    &lagging[..lagging.len().min(5)]
                ));
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

/// Java's `String.hashCode`.
fn java_hash(s: &str) -> i32 {
    s.encode_utf16()
        .fold(0i32, |h, c| h.wrapping_mul(31).wrapping_add(i32::from(c)))
}

/// The partition of `__consumer_offsets` / `__transaction_state` whose leader coordinates
/// the group / transactional id `key` (Kafka's `Utils.abs(key.hashCode) % partitions`).
fn coordinator_partition(key: &str, partitions: i32) -> i32 {
    let h = java_hash(key);
    let abs = if h == i32::MIN { 0 } else { h.abs() };
    abs % partitions.max(1)
}

/// What each broker does for the job: coordinators and leaderships.
fn broker_roles(
    meta: &Meta,
    group: &str,
    txn_ids: &[(String, String)],
    input: &str,
    output: &str,
) -> BTreeMap<i32, Vec<String>> {
    let mut roles: BTreeMap<i32, Vec<String>> = BTreeMap::new();
    match meta.coordinator("__consumer_offsets", group) {
        Ok(b) => roles.entry(b).or_default().push("group coordinator".into()),
        Err(e) => eprintln!("recovery: group coordinator unknown: {e}"),
    }
    for (member, txn_id) in txn_ids {
        match meta.coordinator("__transaction_state", txn_id) {
            Ok(b) => roles
                .entry(b)
                .or_default()
                .push(format!("txn coordinator of {member}")),
            Err(e) => eprintln!("recovery: transaction coordinator of {member} unknown: {e}"),
        }
    }
    for (what, topic) in [("in", input), ("out", output)] {
        let Ok(partitions) = meta.partitions(topic) else {
            continue;
        };
        let mut by_leader: BTreeMap<i32, Vec<String>> = BTreeMap::new();
        for p in partitions {
            by_leader
                .entry(p.leader)
                .or_default()
                .push(p.partition.to_string());
        }
        for (b, ps) in by_leader {
            roles
                .entry(b)
                .or_default()
                .push(format!("leads {what} p{}", ps.join(",")));
        }
    }
    roles
}

// --- the producer of paced ids ------------------------------------------------------------

/// What the feed's producer was told of its records.
#[derive(Default)]
struct Acks {
    /// When each acknowledgement came, by input partition.
    by_partition: Vec<Vec<u64>>,
    delivered: u64,
    failed: Vec<(u64, String)>,
}

struct FeedContext {
    acks: Arc<Mutex<Acks>>,
}

impl ClientContext for FeedContext {}

impl ProducerContext for FeedContext {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        let at = now_us();
        let mut acks = lock(&self.acks);
        match result {
            Ok(msg) => {
                let p = msg.partition().max(0) as usize;
                if acks.by_partition.len() <= p {
                    acks.by_partition.resize_with(p + 1, Vec::new);
                }
                acks.by_partition[p].push(at);
                acks.delivered += 1;
            }
            Err((e, msg)) => {
                let id = key_id(msg.key()).unwrap_or(u64::MAX);
                acks.failed.push((id, e.to_string()));
            }
        }
    }
}

fn key_id(key: Option<&[u8]>) -> Option<u64> {
    std::str::from_utf8(key?).ok()?.parse().ok()
}

/// Writes ids 0, 1, 2... to `topic` at `rate` a second until `stop`: id `n` to input
/// partition `n % PARTITIONS`, key `n`, value `{"id":n,"sent_us":<when it was handed to the
/// client>}`. Returns how many ids were sent, once every one is acknowledged.
///
/// Not idempotent, and never retried: librdkafka's idempotent producer spins in its broker
/// threads while a partition has the 5 requests in flight its sequence window allows and
/// messages wait past their linger, which slow acknowledgements on a loaded machine cause;
/// the feed took a core of the two and slowed the brokers further. Without retries no input
/// is written twice; a send the broker refuses (a leader moving) is not expected in the
/// output, and counted.
fn produce_until(topic: &str, rate: u64, stop: &AtomicBool, acks: &Arc<Mutex<Acks>>) -> u64 {
    let producer: BaseProducer<FeedContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("enable.idempotence", "false")
        .set("acks", "all")
        .set("message.send.max.retries", "0")
        .set("linger.ms", "20")
        .create_with_context(FeedContext {
            acks: Arc::clone(acks),
        })
        .expect("feed producer");
    let started = Instant::now();
    let mut n: u64 = 0;
    while !stop.load(Ordering::Relaxed) {
        let due = started + Duration::from_secs_f64(n as f64 / rate as f64);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            producer.poll(Duration::ZERO);
            std::thread::sleep(wait.min(Duration::from_millis(20)));
            continue;
        }
        let key = n.to_string();
        let value = format!(r#"{{"id":{n},"sent_us":{}}}"#, now_us());
        let mut record = BaseRecord::to(topic)
            .partition((n % PARTITIONS as u64) as i32)
            .key(&key)
            .payload(&value);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((_, back)) => {
                    record = back;
                    producer.poll(Duration::from_millis(5));
                }
            }
        }
        n += 1;
    }
    producer
        .flush(Duration::from_secs(120))
        .expect("flush the feed");
    n
}

/// The feed, in a process of its own at a lower priority (`nice -n 10`), so that it takes
/// the CPU the brokers and the instances leave, and the harness's reader is not behind it.
///
/// The child is this test binary running [`recovery_feed`]; it stops when its stdin closes
/// and then writes `sent N`, `failed ID ERROR` and `ack PARTITION MICROS` lines to `out`.
struct Feed {
    child: KillOnDrop,
    out: PathBuf,
}

impl Feed {
    fn start(topic: &str, rate: u64, out: &Path) -> Feed {
        let exe = std::env::current_exe().expect("the test binary");
        let child = Command::new("nice")
            .args(["-n", "10"])
            .arg(exe)
            .args([
                "--ignored",
                "--exact",
                "recovery_feed",
                "--nocapture",
                "--quiet",
            ])
            .args(["--test-threads", "1"])
            .env("ONCEFLOW_RECOVERY_FEED_TOPIC", topic)
            .env("ONCEFLOW_RECOVERY_FEED_RATE", rate.to_string())
            .env("ONCEFLOW_RECOVERY_FEED_OUT", out)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn the feed");
        Feed {
            child: KillOnDrop(child),
            out: out.to_path_buf(),
        }
    }

    /// Stops writing, waits for every acknowledgement; returns how many ids were sent.
    fn stop(mut self) -> (u64, Acks) {
        drop(self.child.stdin.take());
        let status = self.child.wait().expect("reap the feed");
        assert!(status.success(), "the feed failed: {status}");
        let text = std::fs::read_to_string(&self.out).expect("the feed's report");
        let mut sent = 0;
        let mut acks = Acks::default();
        for line in text.lines() {
            let mut words = line.splitn(3, ' ');
            match (words.next(), words.next(), words.next()) {
                (Some("sent"), Some(n), _) => sent = n.parse().expect("sent count"),
                (Some("failed"), Some(id), error) => acks
                    .failed
                    .push((id.parse().unwrap_or(u64::MAX), error.unwrap_or("").into())),
                (Some("ack"), Some(p), Some(at)) => {
                    let p: usize = p.parse().expect("partition");
                    if acks.by_partition.len() <= p {
                        acks.by_partition.resize_with(p + 1, Vec::new);
                    }
                    acks.by_partition[p].push(at.parse().expect("ack time"));
                    acks.delivered += 1;
                }
                _ => {}
            }
        }
        (sent, acks)
    }
}

/// The feed process of [`Feed`]; does nothing unless `ONCEFLOW_RECOVERY_FEED_TOPIC` is set.
#[test]
#[ignore = "the feed process of recovery_after_single_faults"]
fn recovery_feed() {
    let Ok(topic) = std::env::var("ONCEFLOW_RECOVERY_FEED_TOPIC") else {
        return;
    };
    let rate = std::env::var("ONCEFLOW_RECOVERY_FEED_RATE")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(2_000);
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut sink = Vec::new();
            let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
            stop.store(true, Ordering::Relaxed);
        });
    }
    let acks = Arc::new(Mutex::new(Acks::default()));
    let sent = produce_until(&topic, rate, &stop, &acks);
    let acks = lock(&acks);
    let path = std::env::var("ONCEFLOW_RECOVERY_FEED_OUT").expect("ONCEFLOW_RECOVERY_FEED_OUT");
    let mut out = std::io::BufWriter::new(std::fs::File::create(path).expect("feed report"));
    let _ = writeln!(out, "sent {sent}");
    for (id, error) in &acks.failed {
        let _ = writeln!(out, "failed {id} {error}");
    }
    for (p, times) in acks.by_partition.iter().enumerate() {
        for t in times {
            let _ = writeln!(out, "ack {p} {t}");
        }
    }
    let _ = out.flush();
}

// --- the read_committed reader ------------------------------------------------------------

#[derive(Debug, Clone, Copy)]
struct Arrival {
    at: u64,
    sent: u64,
    id: u64,
    partition: i32,
}

#[derive(Default)]
struct ReaderState {
    arrivals: Vec<Arrival>,
    /// The marker that ends the read, once written, and the partitions it was seen on.
    marker: Option<String>,
    markers_seen: BTreeSet<i32>,
    errors: Vec<(u64, String)>,
}

struct Reader {
    state: Arc<Mutex<ReaderState>>,
    stop: Arc<AtomicBool>,
    handle: JoinHandle<()>,
}

impl Reader {
    fn start(topic: &str) -> Reader {
        let state = Arc::new(Mutex::new(ReaderState::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap())
            .set("group.id", unique("recovery-reader"))
            .set("isolation.level", "read_committed")
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest")
            .set("fetch.wait.max.ms", "50")
            .create()
            .expect("reader");
        let mut tpl = TopicPartitionList::new();
        for p in 0..PARTITIONS {
            tpl.add_partition_offset(topic, p, Offset::Beginning)
                .expect("tpl");
        }
        consumer.assign(&tpl).expect("assign");
        let handle = {
            let (state, stop) = (Arc::clone(&state), Arc::clone(&stop));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match consumer.poll(Duration::from_millis(100)) {
                        None => {}
                        Some(Err(e)) => lock(&state).errors.push((now_us(), e.to_string())),
                        Some(Ok(msg)) => {
                            let at = now_us();
                            let marker = msg.headers().and_then(|hs| {
                                hs.iter().find(|h| h.key == MARKER_HEADER).map(|h| {
                                    String::from_utf8_lossy(h.value.unwrap_or_default())
                                        .into_owned()
                                })
                            });
                            let mut st = lock(&state);
                            if let Some(marker) = marker {
                                if st.marker.as_deref() == Some(marker.as_str()) {
                                    st.markers_seen.insert(msg.partition());
                                }
                                continue;
                            }
                            let id = key_id(msg.key());
                            let sent = msg
                                .payload()
                                .and_then(|v| serde_json::from_slice::<serde_json::Value>(v).ok())
                                .and_then(|v| v["sent_us"].as_u64());
                            match (id, sent) {
                                (Some(id), Some(sent)) => st.arrivals.push(Arrival {
                                    at,
                                    sent,
                                    id,
                                    partition: msg.partition(),
                                }),
                                _ => st.errors.push((
                                    at,
                                    format!(
                                        "unreadable record at partition {} offset {}",
                                        msg.partition(),
                                        msg.offset()
                                    ),
                                )),
                            }
                        }
                    }
                }
            })
        };
        Reader {
            state,
            stop,
            handle,
        }
    }

    fn len(&self) -> usize {
        lock(&self.state).arrivals.len()
    }

    /// Calls `f` on every arrival from index `from` on; returns the index after the last.
    fn scan(&self, from: usize, mut f: impl FnMut(&Arrival)) -> usize {
        let st = lock(&self.state);
        for a in st.arrivals.get(from..).unwrap_or_default() {
            f(a);
        }
        st.arrivals.len()
    }

    /// Writes a marker to every partition of `topic` (non-transactionally) and waits until
    /// the reader has seen them all: read_committed shows them only if no transaction is
    /// left open before them.
    fn read_to_marker(&self, topic: &str, timeout: Duration) -> Result<(), String> {
        let marker = unique("end");
        lock(&self.state).marker = Some(marker.clone());
        write_markers(topic, PARTITIONS, &marker)?;
        let deadline = Instant::now() + timeout;
        loop {
            let seen = lock(&self.state).markers_seen.clone();
            if seen.len() == PARTITIONS as usize {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "end markers visible on partitions {seen:?} only after {} s: a transaction is left hanging",
                    timeout.as_secs()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn finish(self) -> ReaderState {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().expect("reader thread");
        std::mem::take(&mut *lock(&self.state))
    }
}

// --- the instances ------------------------------------------------------------------------

/// A line an instance logged (or the harness noted), when the harness got it.
struct Event {
    at: u64,
    who: String,
    text: String,
}

type Events = Arc<Mutex<Vec<Event>>>;

struct Member {
    id: String,
    child: Option<KillOnDrop>,
    /// Whether the member should be running: one that exits on its own is started again at
    /// once, as a StatefulSet would (without its back-off).
    wanted: bool,
}

struct Fleet {
    topology: PathBuf,
    log_dir: PathBuf,
    members: Vec<Member>,
    events: Events,
    origin: u64,
}

impl Fleet {
    fn new(topology: &Path, log_dir: &Path, ids: &[String], origin: u64) -> Fleet {
        Fleet {
            topology: topology.to_path_buf(),
            log_dir: log_dir.to_path_buf(),
            members: ids
                .iter()
                .map(|id| Member {
                    id: id.clone(),
                    child: None,
                    wanted: false,
                })
                .collect(),
            events: Arc::new(Mutex::new(Vec::new())),
            origin,
        }
    }

    fn note(&self, who: &str, text: String) {
        eprintln!(
            "recovery: +{}s {who}: {text}",
            secs(now_us().saturating_sub(self.origin))
        );
        lock(&self.events).push(Event {
            at: now_us(),
            who: who.to_string(),
            text: format!("harness: {text}"),
        });
    }

    /// Starts member `i`: `onceflow run` with JSON logs, each line stamped on arrival, kept
    /// in the events and in `<log_dir>/<id>.log`.
    fn spawn(&mut self, i: usize) {
        let id = self.members[i].id.clone();
        let mut child = Command::new(env!("CARGO_BIN_EXE_onceflow"))
            .arg("run")
            .arg(&self.topology)
            .args(["--bootstrap-servers", &bootstrap(), "--instance-id", &id])
            .args(["--progress-secs", "0", "--log-json"])
            .env(
                "RUST_LOG",
                std::env::var("ONCEFLOW_TEST_CHILD_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn onceflow");
        let stderr = child.stderr.take().expect("stderr");
        let (events, origin) = (Arc::clone(&self.events), self.origin);
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_dir.join(format!("{id}.log")))
            .expect("instance log");
        let who = id.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                let at = now_us();
                let _ = writeln!(
                    file,
                    "[+{:.3}] {line}",
                    at.saturating_sub(origin) as f64 / 1e6
                );
                lock(&events).push(Event {
                    at,
                    who: who.clone(),
                    text: line,
                });
            }
        });
        self.members[i].child = Some(KillOnDrop(child));
        self.members[i].wanted = true;
        self.note(&id, format!("started (pid {})", self.pid(i)));
    }

    fn pid(&self, i: usize) -> u32 {
        self.members[i].child.as_ref().map_or(0, |c| c.id())
    }

    fn signal(&self, i: usize, sig: &str) {
        if let Some(child) = &self.members[i].child {
            signal(child, sig);
        }
        self.note(&self.members[i].id, format!("kill {sig}"));
    }

    /// SIGKILL, reaped; the member is not wanted until started again.
    fn kill(&mut self, i: usize) {
        self.members[i].wanted = false;
        if let Some(mut child) = self.members[i].child.take() {
            child.kill().expect("SIGKILL");
            child.wait().expect("reap");
        }
        self.note(&self.members[i].id.clone(), "SIGKILLed".into());
    }

    /// SIGTERM, and the exit waited for (the others supervised meanwhile).
    fn terminate(&mut self, i: usize, timeout: Duration) -> Option<ExitStatus> {
        self.members[i].wanted = false;
        self.signal(i, "-TERM");
        let deadline = Instant::now() + timeout;
        loop {
            let status = self.members[i]
                .child
                .as_mut()
                .and_then(|c| c.try_wait().expect("try_wait"));
            if let Some(status) = status {
                self.members[i].child = None;
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            self.supervise();
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts again every wanted member that exited.
    fn supervise(&mut self) {
        for i in 0..self.members.len() {
            if !self.members[i].wanted {
                continue;
            }
            let exited = self.members[i]
                .child
                .as_mut()
                .and_then(|c| c.try_wait().expect("try_wait"));
            if let Some(status) = exited {
                self.members[i].child = None;
                let id = self.members[i].id.clone();
                self.note(
                    &id,
                    format!("exited on its own ({status}); starting it again"),
                );
                self.spawn(i);
            }
        }
    }

    fn idle(&mut self, d: Duration) {
        let until = Instant::now() + d;
        while Instant::now() < until {
            self.supervise();
            std::thread::sleep(Duration::from_millis(50).min(until - Instant::now()));
        }
    }

    /// Stops every member with SIGTERM; their exit statuses.
    fn stop_all(&mut self) -> Vec<(String, Option<ExitStatus>)> {
        for m in &mut self.members {
            m.wanted = false;
            if let Some(child) = &m.child {
                signal(child, "-TERM");
            }
        }
        let mut statuses = Vec::new();
        for i in 0..self.members.len() {
            let id = self.members[i].id.clone();
            let status = self.members[i]
                .child
                .as_mut()
                .map(|c| wait_exit(c, Duration::from_secs(60)));
            self.members[i].child = None;
            if let Some(status) = status {
                statuses.push((id, status));
            }
        }
        statuses
    }

    /// Whether every member logged an assignment since `since`.
    fn all_assigned_since(&self, since: u64) -> bool {
        let events = lock(&self.events);
        self.members.iter().all(|m| {
            events.iter().any(|e| {
                e.at >= since && e.who == m.id && e.text.contains("\"partitions assigned\"")
            })
        })
    }
}

/// Runs `f` on a thread while the fleet is supervised.
fn supervised<T: Send>(fleet: &mut Fleet, f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        let h = s.spawn(f);
        while !h.is_finished() {
            fleet.supervise();
            std::thread::sleep(Duration::from_millis(50));
        }
        h.join().expect("fault thread")
    })
}

/// An instance's log line worth showing, shortened: rebalances, aborts, retries, rebuilds,
/// fencing, exits, librdkafka's warnings.
fn describe_event(e: &Event) -> Option<String> {
    if let Some(note) = e.text.strip_prefix("harness: ") {
        return Some(note.to_string());
    }
    let v: serde_json::Value = serde_json::from_str(&e.text).ok()?;
    let level = v["level"].as_str().unwrap_or("");
    let fields = &v["fields"];
    let message = fields["message"].as_str().unwrap_or("");
    let field = |k: &str| {
        let f = &fields[k];
        f.as_str()
            .map(str::to_string)
            .or_else(|| (!f.is_null()).then(|| f.to_string()))
    };
    let short = |s: String| s.chars().take(140).collect::<String>();
    let text = match message {
        "partitions assigned" => format!("assigned {}", field("count")?),
        "partitions revoked" => format!("revoked {}", field("count")?),
        "partitions lost" => format!("LOST {}", field("count")?),
        "job started" => "job started".into(),
        m if m.starts_with("transaction aborted") => {
            format!("txn aborted ({})", field("reason").unwrap_or_default())
        }
        m if m.starts_with("retriable transaction error") => format!(
            "retry {}: {}",
            field("operation").unwrap_or_default(),
            short(field("error").unwrap_or_default())
        ),
        m if m.starts_with("fatal producer error") => {
            format!(
                "producer rebuilt: {}",
                short(field("error").unwrap_or_default())
            )
        }
        m if m.starts_with("consumer fenced") => "consumer fenced".into(),
        m if m.starts_with("fatal error") => {
            format!("FATAL: {}", short(field("error").unwrap_or_default()))
        }
        m if m.starts_with("exiting with status 1") => {
            format!("forced exit: {}", field("why").unwrap_or_default())
        }
        m if m.starts_with("consumer error") => {
            format!(
                "consumer error: {}",
                short(field("error").unwrap_or_default())
            )
        }
        m if level == "WARN" || level == "ERROR" => format!("{level} {}", short(m.to_string())),
        _ => return None,
    };
    Some(text)
}

// --- the machine's load -------------------------------------------------------------------

/// The 1-minute load average every 2 s while a phase runs: on a shared machine it says how
/// much of a stall is CPU starvation.
struct LoadSampler {
    samples: Arc<Mutex<Vec<(u64, f64)>>>,
    stop: Arc<AtomicBool>,
    handle: JoinHandle<()>,
}

fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

impl LoadSampler {
    fn start() -> LoadSampler {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let handle = {
            let (samples, stop) = (Arc::clone(&samples), Arc::clone(&stop));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    lock(&samples).push((now_us(), load_average()));
                    std::thread::sleep(Duration::from_secs(2));
                }
            })
        };
        LoadSampler {
            samples,
            stop,
            handle,
        }
    }

    fn finish(self) -> Vec<(u64, f64)> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().expect("load sampler");
        std::mem::take(&mut *lock(&self.samples))
    }
}

/// CPU seconds of this process and of its reaped children (the instances) so far.
fn cpu_times() -> (f64, f64) {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<f64> = stat
        .rsplit(')')
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0.0))
        .collect();
    let ticks = |i: usize| fields.get(i).copied().unwrap_or(0.0) / 100.0;
    // After the command: state is field 0, so utime, stime, cutime, cstime are 11 to 14.
    (ticks(11) + ticks(12), ticks(13) + ticks(14))
}

/// The highest load sampled in `[start, end)`.
fn peak_load(samples: &[(u64, f64)], start: u64, end: u64) -> f64 {
    samples
        .iter()
        .filter(|(t, _)| *t >= start && *t < end)
        .map(|(_, l)| *l)
        .fold(0.0, f64::max)
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

/// Longest gap between `start`, the times (ascending) and `end`.
fn longest_gap(times: impl Iterator<Item = u64>, start: u64, end: u64) -> u64 {
    let mut prev = start;
    let mut longest = 0;
    for t in times {
        longest = longest.max(t.saturating_sub(prev));
        prev = prev.max(t);
    }
    longest.max(end.saturating_sub(prev))
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

/// Waits until every input partition delivered a record sent at `since` or later within
/// [`NORMAL_LATENCY_US`]; returns when, or after `timeout` which partitions did not and the
/// latency of the last record each delivered.
fn wait_recovered(
    reader: &Reader,
    fleet: &mut Fleet,
    since: u64,
    timeout: Duration,
) -> Result<u64, String> {
    let deadline = Instant::now() + timeout;
    let mut cursor = reader.len().saturating_sub(50_000);
    let mut flowing = [false; PARTITIONS as usize];
    let mut latest = [None::<u64>; PARTITIONS as usize];
    let mut last = 0;
    loop {
        cursor = reader.scan(cursor, |a| {
            let p = (a.id % PARTITIONS as u64) as usize;
            let latency = a.at.saturating_sub(a.sent);
            latest[p] = Some(latency);
            if a.sent >= since && latency <= NORMAL_LATENCY_US && !flowing[p] {
                flowing[p] = true;
                last = a.at;
            }
        });
        if flowing.iter().all(|f| *f) {
            return Ok(last);
        }
        if Instant::now() > deadline {
            let lagging: Vec<String> = (0..PARTITIONS as usize)
                .filter(|p| !flowing[*p])
                .map(|p| {
                    format!(
                        "in p{p} ({})",
                        latest[p].map_or("nothing read".into(), |l| format!(
                            "last latency {} s",
                            secs(l)
                        ))
                    )
                })
                .collect();
            return Err(format!(
                "not flowing normally {} s after the fault was over: {}",
                timeout.as_secs(),
                lagging.join(", ")
            ));
        }
        fleet.supervise();
        std::thread::sleep(Duration::from_millis(100));
    }
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
    let feed = Feed::start(&input, cfg.rate, &dir.join("feed.txt"));

    // Warm up: every member has partitions and every input partition flows. A job that
    // never flows gets no faults; its phase still ends with the exactly-once check.
    let warm = Instant::now();
    let mut notes = Vec::new();
    let mut runs = cfg.runs;
    loop {
        if let Err(e) = wait_recovered(&reader, &mut fleet, origin, WARM_UP_TIMEOUT) {
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
        match wait_recovered(&reader, &mut fleet, w.done, RECOVERY_TIMEOUT) {
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
            match wait_recovered(&reader, &mut fleet, rejoin.done, RECOVERY_TIMEOUT) {
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

/// Arrivals second by second: how many on each output partition and the worst latency.
fn write_timeline(path: &Path, origin: u64, arrivals: &[Arrival]) {
    let mut rows: BTreeMap<u64, ([u64; PARTITIONS as usize], u64)> = BTreeMap::new();
    for a in arrivals {
        let row = rows
            .entry(a.at.saturating_sub(origin) / 1_000_000)
            .or_default();
        row.0[a.partition as usize] += 1;
        row.1 = row.1.max(a.at.saturating_sub(a.sent));
    }
    let mut text = String::from("second");
    for p in 0..PARTITIONS {
        let _ = write!(text, ",out_p{p}");
    }
    text.push_str(",max_latency_ms\n");
    let last = rows.keys().next_back().copied().unwrap_or(0);
    for second in 0..=last {
        let (counts, latency) = rows.get(&second).copied().unwrap_or_default();
        let _ = write!(text, "{second}");
        for c in counts {
            let _ = write!(text, ",{c}");
        }
        let _ = writeln!(text, ",{}", latency / 1000);
    }
    std::fs::write(path, text).expect("write timeline");
}

/// How many times each id is in the input topic (read to its end; the feed is not
/// transactional). The feed is not idempotent: a broker failing over can keep a batch whose
/// acknowledgement was lost and take its resend too, so an id can be in the input twice,
/// at two offsets; exactly once means each input record once in the output, not each id.
fn input_census(topic: &str, sent: u64) -> Vec<u32> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", unique("recovery-census"))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .create()
        .expect("census consumer");
    let mut tpl = TopicPartitionList::new();
    let mut ends = BTreeMap::new();
    for p in 0..PARTITIONS {
        let (_, high) = consumer
            .fetch_watermarks(topic, p, Duration::from_secs(30))
            .expect("input watermarks");
        ends.insert(p, high);
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .expect("tpl");
    }
    consumer.assign(&tpl).expect("assign the input");
    let mut counts = vec![0u32; sent as usize];
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut done: BTreeSet<i32> = ends
        .iter()
        .filter(|(_, h)| **h == 0)
        .map(|(p, _)| *p)
        .collect();
    while done.len() < PARTITIONS as usize && Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(msg)) => {
                if let Some(c) = key_id(msg.key()).and_then(|id| counts.get_mut(id as usize)) {
                    *c += 1;
                }
                if msg.offset() + 1 >= ends[&msg.partition()] {
                    done.insert(msg.partition());
                }
            }
            Some(Err(e)) => eprintln!("recovery: census of {topic}: {e}"),
            None => {}
        }
    }
    assert_eq!(
        done.len(),
        PARTITIONS as usize,
        "the input census of {topic} did not reach the end"
    );
    counts
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
