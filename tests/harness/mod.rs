//! The machinery of the fault tests on a 3-node cluster (`recovery.rs`, `chaos.rs`): the
//! cluster of `scripts/kafka` (kill, clean stop, restart of a broker), metadata (leaders,
//! coordinators, replicas in sync), a paced feed in a process of its own, a read_committed
//! reader recording when each id arrives, the `onceflow run` instances (a `Fleet`), the
//! machine's load, and the census of an input topic.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::common::*;

/// The `onceflow` binary the fleet runs: `ONCEFLOW_BIN` when set (`scripts/chaos` sets the
/// release build: what production runs, and a fifth of the CPU a debug build takes), else
/// this test build's.
pub fn onceflow_bin() -> PathBuf {
    std::env::var_os("ONCEFLOW_BIN")
        .filter(|v| !v.is_empty())
        .map_or_else(
            || PathBuf::from(env!("CARGO_BIN_EXE_onceflow")),
            PathBuf::from,
        )
}
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::{ClientConfig, ClientContext, Offset, TopicPartitionList};

pub const PARTITIONS: i32 = 6;

pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// Seconds, one decimal.
pub fn secs(us: u64) -> String {
    format!("{:.1}", us as f64 / 1e6)
}

pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

// --- the cluster of scripts/kafka ---------------------------------------------------------

/// The nodes `scripts/kafka start --nodes 3` runs: node i is broker i.
pub struct Cluster {
    pub script: PathBuf,
    pub state_dir: PathBuf,
}

impl Cluster {
    /// The cluster named by `ONCEFLOW_KAFKA_DIR` and `KAFKA_PORT`, which `scripts/kafka` reads
    /// too (this process's environment is passed on). Both must be given: the harness never
    /// acts on a cluster it was not pointed at.
    pub fn from_env() -> Result<Cluster, String> {
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

    pub fn run(&self, args: &[&str]) -> Result<(), String> {
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

    pub fn kill(&self, node: i32) -> Result<(), String> {
        self.run(&["kill", &node.to_string()])
    }

    pub fn restart(&self, node: i32) -> Result<(), String> {
        self.run(&["restart-node", &node.to_string()])
    }

    /// SIGTERM to the node's broker (a controlled shutdown: it hands its leaderships over
    /// first), and waits until it has exited.
    pub fn stop_cleanly(&self, node: i32) -> Result<(), String> {
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

// --- metadata: leaders, coordinators, replicas in sync -----------------------------------

pub struct Meta {
    pub client: BaseConsumer,
}

/// One partition of the metadata: leader, replicas, replicas in sync.
pub struct PartitionMeta {
    pub partition: i32,
    pub leader: i32,
    pub replicas: usize,
    pub isr: usize,
}

impl Meta {
    pub fn new() -> Meta {
        Meta {
            client: ClientConfig::new()
                .set("bootstrap.servers", bootstrap())
                .create()
                .expect("metadata client"),
        }
    }

    pub fn brokers(&self) -> Vec<i32> {
        let md = self
            .client
            .fetch_metadata(None, Duration::from_secs(10))
            .expect("metadata");
        let mut ids: Vec<i32> = md.brokers().iter().map(|b| b.id()).collect();
        ids.sort_unstable();
        ids
    }

    pub fn partitions(&self, topic: &str) -> Result<Vec<PartitionMeta>, String> {
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
    pub fn coordinator(&self, topic: &str, key: &str) -> Result<i32, String> {
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
    pub fn wait_in_sync(&self, topics: &[&str], timeout: Duration) -> Result<Duration, String> {
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
pub fn java_hash(s: &str) -> i32 {
    s.encode_utf16()
        .fold(0i32, |h, c| h.wrapping_mul(31).wrapping_add(i32::from(c)))
}

/// The partition of `__consumer_offsets` / `__transaction_state` whose leader coordinates
/// the group / transactional id `key` (Kafka's `Utils.abs(key.hashCode) % partitions`).
pub fn coordinator_partition(key: &str, partitions: i32) -> i32 {
    let h = java_hash(key);
    let abs = if h == i32::MIN { 0 } else { h.abs() };
    abs % partitions.max(1)
}

/// What each broker does for the job: coordinators and leaderships.
pub fn broker_roles(
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
pub struct Acks {
    /// When each acknowledgement came, by input partition.
    pub by_partition: Vec<Vec<u64>>,
    pub delivered: u64,
    pub failed: Vec<(u64, String)>,
}

pub struct FeedContext {
    pub acks: Arc<Mutex<Acks>>,
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

pub fn key_id(key: Option<&[u8]>) -> Option<u64> {
    std::str::from_utf8(key?).ok()?.parse().ok()
}

/// Whether id `n` is poison in a poisoned feed: one id in a thousand.
pub fn is_poison(n: u64) -> bool {
    n % 1000 == 999
}

/// The value of id `n` handed to the client at `sent_us`: `{"id":n,"sent_us":...}`; in a
/// poisoned feed with `"one":1` too (a counter a PostgreSQL output sums), and for a poison id
/// (see [`is_poison`]) either not JSON or with `"one"` a string, which `value.one * 2`
/// refuses: a record the pipeline dead-letters at its decoding or at its `map`.
pub fn feed_value(n: u64, sent_us: u64, poisoned: bool) -> String {
    if !poisoned {
        format!(r#"{{"id":{n},"sent_us":{sent_us}}}"#)
    } else if !is_poison(n) {
        format!(r#"{{"id":{n},"sent_us":{sent_us},"one":1}}"#)
    } else if (n / 1000).is_multiple_of(2) {
        format!(r#"{{not json {n} {sent_us}"#)
    } else {
        format!(r#"{{"id":{n},"sent_us":{sent_us},"one":"x"}}"#)
    }
}

/// Writes ids 0, 1, 2... to `topic` at `rate` a second until `stop`: id `n` to input
/// partition `n % PARTITIONS`, key `n`, value [`feed_value`] (stamped when it was handed to
/// the client). Returns how many ids were sent, once every one is acknowledged.
///
/// Not idempotent, and never retried: librdkafka's idempotent producer spins in its broker
/// threads while a partition has the 5 requests in flight its sequence window allows and
/// messages wait past their linger, which slow acknowledgements on a loaded machine cause;
/// the feed took a core of the two and slowed the brokers further. Without retries no input
/// is written twice; a send the broker refuses (a leader moving) is not expected in the
/// output, and counted.
///
/// A poisoned feed (the chaos rounds') retries a send up to 10 times instead: its rounds kill
/// brokers on a loaded machine, where a feed that never retries lost two thirds of its sends
/// to request timeouts. An id can then be in the input twice, which the census counts.
pub fn produce_until(
    topic: &str,
    rate: u64,
    poisoned: bool,
    stop: &AtomicBool,
    acks: &Arc<Mutex<Acks>>,
) -> u64 {
    let producer: BaseProducer<FeedContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("enable.idempotence", "false")
        .set("acks", "all")
        .set(
            "message.send.max.retries",
            if poisoned { "10" } else { "0" },
        )
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
        let value = feed_value(n, now_us(), poisoned);
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
/// The child is this test binary running its ignored test `test` (which calls
/// [`feed_main`]); it stops when its stdin closes and then writes `sent N`, `failed ID ERROR`
/// and `ack PARTITION MICROS` lines to `out`.
pub struct Feed {
    pub child: KillOnDrop,
    pub out: PathBuf,
}

impl Feed {
    pub fn start(test: &str, topic: &str, rate: u64, poisoned: bool, out: &Path) -> Feed {
        let exe = std::env::current_exe().expect("the test binary");
        let child = Command::new("nice")
            .args(["-n", "10"])
            .arg(exe)
            .args(["--ignored", "--exact", test, "--nocapture", "--quiet"])
            .args(["--test-threads", "1"])
            .env("ONCEFLOW_RECOVERY_FEED_TOPIC", topic)
            .env("ONCEFLOW_RECOVERY_FEED_RATE", rate.to_string())
            .env("ONCEFLOW_RECOVERY_FEED_OUT", out)
            .env(
                "ONCEFLOW_RECOVERY_FEED_POISONED",
                if poisoned { "1" } else { "0" },
            )
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
    pub fn stop(mut self) -> (u64, Acks) {
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

/// The body of the feed process of [`Feed`]; does nothing unless
/// `ONCEFLOW_RECOVERY_FEED_TOPIC` is set.
pub fn feed_main() {
    let Ok(topic) = std::env::var("ONCEFLOW_RECOVERY_FEED_TOPIC") else {
        return;
    };
    let rate = std::env::var("ONCEFLOW_RECOVERY_FEED_RATE")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(2_000);
    let poisoned = std::env::var("ONCEFLOW_RECOVERY_FEED_POISONED").is_ok_and(|v| v == "1");
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
    let sent = produce_until(&topic, rate, poisoned, &stop, &acks);
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
pub struct Arrival {
    pub at: u64,
    pub sent: u64,
    pub id: u64,
    pub partition: i32,
}

#[derive(Default)]
pub struct ReaderState {
    pub arrivals: Vec<Arrival>,
    /// The marker that ends the read, once written, and the partitions it was seen on.
    pub marker: Option<String>,
    pub markers_seen: BTreeSet<i32>,
    pub errors: Vec<(u64, String)>,
}

pub struct Reader {
    pub state: Arc<Mutex<ReaderState>>,
    pub stop: Arc<AtomicBool>,
    pub handle: JoinHandle<()>,
}

impl Reader {
    pub fn start(topic: &str) -> Reader {
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

    pub fn len(&self) -> usize {
        lock(&self.state).arrivals.len()
    }

    /// Calls `f` on every arrival from index `from` on; returns the index after the last.
    pub fn scan(&self, from: usize, mut f: impl FnMut(&Arrival)) -> usize {
        let st = lock(&self.state);
        for a in st.arrivals.get(from..).unwrap_or_default() {
            f(a);
        }
        st.arrivals.len()
    }

    /// Writes a marker to every partition of `topic` (non-transactionally) and waits until
    /// the reader has seen them all: read_committed shows them only if no transaction is
    /// left open before them.
    pub fn read_to_marker(&self, topic: &str, timeout: Duration) -> Result<(), String> {
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

    pub fn finish(self) -> ReaderState {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().expect("reader thread");
        std::mem::take(&mut *lock(&self.state))
    }
}

// --- the instances ------------------------------------------------------------------------

/// A line an instance logged (or the harness noted), when the harness got it.
pub struct Event {
    pub at: u64,
    pub who: String,
    pub text: String,
}

pub type Events = Arc<Mutex<Vec<Event>>>;

pub struct Member {
    pub id: String,
    pub child: Option<KillOnDrop>,
    /// Whether the member should be running: one that exits on its own is started again at
    /// once, as a StatefulSet would (without its back-off).
    pub wanted: bool,
    /// The topology it runs, when not the fleet's (a second job beside the first).
    pub topology: Option<PathBuf>,
}

pub struct Fleet {
    pub topology: PathBuf,
    pub log_dir: PathBuf,
    pub members: Vec<Member>,
    pub events: Events,
    pub origin: u64,
    /// Variables every member is started with (a database URL).
    pub env: Vec<(String, String)>,
    /// What the harness's notes on stderr begin with.
    pub prefix: &'static str,
    /// Where the members keep their state stores, given to each as `ONCEFLOW_STATE_DIR`: a
    /// folder per id, and a new one for a member started while its detached predecessor
    /// may still live (a zombie's replacement, as a pod on a new volume).
    pub state_root: Option<PathBuf>,
    /// How many times each member was detached.
    detached: Vec<u32>,
}

impl Fleet {
    pub fn new(topology: &Path, log_dir: &Path, ids: &[String], origin: u64) -> Fleet {
        Fleet {
            topology: topology.to_path_buf(),
            log_dir: log_dir.to_path_buf(),
            members: ids
                .iter()
                .map(|id| Member {
                    id: id.clone(),
                    child: None,
                    wanted: false,
                    topology: None,
                })
                .collect(),
            events: Arc::new(Mutex::new(Vec::new())),
            origin,
            env: Vec::new(),
            prefix: "recovery",
            state_root: None,
            detached: vec![0; ids.len()],
        }
    }

    /// Adds member `id`, running `topology` instead of the fleet's; its index.
    pub fn add(&mut self, id: &str, topology: &Path) -> usize {
        self.members.push(Member {
            id: id.to_string(),
            child: None,
            wanted: false,
            topology: Some(topology.to_path_buf()),
        });
        self.detached.push(0);
        self.members.len() - 1
    }

    pub fn note(&self, who: &str, text: String) {
        eprintln!(
            "{}: +{}s {who}: {text}",
            self.prefix,
            secs(now_us().saturating_sub(self.origin))
        );
        lock(&self.events).push(Event {
            at: now_us(),
            who: who.to_string(),
            text: format!("harness: {text}"),
        });
    }

    /// Starts member `i` (the binary [`onceflow_bin`] names): `onceflow run` with JSON logs, each line stamped on arrival, kept
    /// in the events and in `<log_dir>/<id>.log`.
    pub fn spawn(&mut self, i: usize) {
        let id = self.members[i].id.clone();
        let topology = self.members[i].topology.as_ref().unwrap_or(&self.topology);
        let mut child = Command::new(onceflow_bin())
            .arg("run")
            .arg(topology)
            .args(["--bootstrap-servers", &bootstrap(), "--instance-id", &id])
            .args(["--progress-interval", "0", "--log-json"])
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .envs(self.state_root.as_ref().map(|root| {
                let dir = root.join(format!("{id}.{}", self.detached[i]));
                ("ONCEFLOW_STATE_DIR", dir)
            }))
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

    /// Takes member `i`'s process out of the fleet, running or stopped as it is (a zombie
    /// to be): the member is not wanted until started again, and its process is no longer
    /// supervised. Its log goes on to the same file and events.
    pub fn detach(&mut self, i: usize) -> Option<KillOnDrop> {
        self.members[i].wanted = false;
        self.detached[i] += 1;
        self.members[i].child.take()
    }

    pub fn pid(&self, i: usize) -> u32 {
        self.members[i].child.as_ref().map_or(0, |c| c.id())
    }

    pub fn signal(&self, i: usize, sig: &str) {
        if let Some(child) = &self.members[i].child {
            signal(child, sig);
        }
        self.note(&self.members[i].id, format!("kill {sig}"));
    }

    /// SIGKILL, reaped; the member is not wanted until started again.
    pub fn kill(&mut self, i: usize) {
        self.members[i].wanted = false;
        if let Some(mut child) = self.members[i].child.take() {
            child.kill().expect("SIGKILL");
            child.wait().expect("reap");
        }
        self.note(&self.members[i].id.clone(), "SIGKILLed".into());
    }

    /// SIGTERM, and the exit waited for (the others supervised meanwhile).
    pub fn terminate(&mut self, i: usize, timeout: Duration) -> Option<ExitStatus> {
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
    pub fn supervise(&mut self) {
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

    pub fn idle(&mut self, d: Duration) {
        let until = Instant::now() + d;
        while Instant::now() < until {
            self.supervise();
            std::thread::sleep(Duration::from_millis(50).min(until - Instant::now()));
        }
    }

    /// Stops every member with SIGTERM; their exit statuses.
    pub fn stop_all(&mut self) -> Vec<(String, Option<ExitStatus>)> {
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
    pub fn all_assigned_since(&self, since: u64) -> bool {
        let events = lock(&self.events);
        self.members.iter().all(|m| {
            events.iter().any(|e| {
                e.at >= since && e.who == m.id && e.text.contains("\"partitions assigned\"")
            })
        })
    }
}

/// Runs `f` on a thread while the fleet is supervised.
pub fn supervised<T: Send>(fleet: &mut Fleet, f: impl FnOnce() -> T + Send) -> T {
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
pub fn describe_event(e: &Event) -> Option<String> {
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
pub struct LoadSampler {
    pub samples: Arc<Mutex<Vec<(u64, f64)>>>,
    pub stop: Arc<AtomicBool>,
    pub handle: JoinHandle<()>,
}

pub fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

impl LoadSampler {
    pub fn start() -> LoadSampler {
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

    pub fn finish(self) -> Vec<(u64, f64)> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().expect("load sampler");
        std::mem::take(&mut *lock(&self.samples))
    }
}

/// CPU seconds of this process and of its reaped children (the instances) so far.
pub fn cpu_times() -> (f64, f64) {
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
pub fn peak_load(samples: &[(u64, f64)], start: u64, end: u64) -> f64 {
    samples
        .iter()
        .filter(|(t, _)| *t >= start && *t < end)
        .map(|(_, l)| *l)
        .fold(0.0, f64::max)
}

/// Longest gap between `start`, the times (ascending) and `end`.
pub fn longest_gap(times: impl Iterator<Item = u64>, start: u64, end: u64) -> u64 {
    let mut prev = start;
    let mut longest = 0;
    for t in times {
        longest = longest.max(t.saturating_sub(prev));
        prev = prev.max(t);
    }
    longest.max(end.saturating_sub(prev))
}

/// Waits until every input partition delivered a record sent at `since` or later within
/// `normal_latency_us`; returns when, or after `timeout` which partitions did not and the
/// latency of the last record each delivered.
pub fn wait_recovered(
    reader: &Reader,
    fleet: &mut Fleet,
    since: u64,
    timeout: Duration,
    normal_latency_us: u64,
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
            if a.sent >= since && latency <= normal_latency_us && !flowing[p] {
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

/// Arrivals second by second: how many on each output partition and the worst latency.
pub fn write_timeline(path: &Path, origin: u64, arrivals: &[Arrival]) {
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
pub fn input_census(topic: &str, sent: u64) -> Vec<u32> {
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
