//! Helpers for integration tests against the real broker that `scripts/test` starts.
//!
//! Exactly-once is checked by record ids: inputs carry unique ids, outputs are read with
//! read_committed and compared as sets, and duplicates are counted. A read ends at a marker
//! written non-transactionally to every output partition after the job stopped: the marker is
//! visible to read_committed only if no transaction is left hanging before it.

#![allow(dead_code)]

pub mod mock;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

pub const MARKER_HEADER: &str = "onceflow-test-marker";

/// The broker started by `scripts/test`.
pub fn bootstrap() -> String {
    std::env::var("ONCEFLOW_TEST_BOOTSTRAP").expect(
        "ONCEFLOW_TEST_BOOTSTRAP is not set: integration tests need the real broker; run them with scripts/test",
    )
}

/// A name no other test or run uses.
pub fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!(
        "{prefix}-{}-{nanos}-{}",
        std::process::id(),
        rand::random::<u32>()
    )
}

pub fn create_topics(names: &[&str], partitions: i32) {
    create_replicated_topics(names, partitions, 1, &[]);
}

/// Writes a record without key nor value, with header [`MARKER_HEADER`] = `marker`, to each
/// of the `partitions` of `topic`, outside any transaction: a read_committed reader sees
/// them only once no transaction is left open before them.
pub fn write_markers(topic: &str, partitions: i32, marker: &str) -> Result<(), String> {
    write_markers_keyed(topic, partitions, marker, false)
}

/// [`write_markers`], with the marker as the records' key when `keyed` (a compacted topic
/// refuses records without a key).
fn write_markers_keyed(
    topic: &str,
    partitions: i32,
    marker: &str,
    keyed: bool,
) -> Result<(), String> {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .map_err(|e| e.to_string())?;
    for p in 0..partitions {
        let headers = OwnedHeaders::new().insert(Header {
            key: MARKER_HEADER,
            value: Some(marker),
        });
        let mut record = BaseRecord::<str, str>::to(topic)
            .partition(p)
            .headers(headers);
        if keyed {
            record = record.key(marker);
        }
        producer.send(record).map_err(|(e, _)| e.to_string())?;
    }
    producer
        .flush(Duration::from_secs(30))
        .map_err(|e| e.to_string())
}

/// Creates topics with `replication` replicas each and the topic `configs` given (e.g.
/// `min.insync.replicas`), on a cluster of at least that many brokers.
pub fn create_replicated_topics(
    names: &[&str],
    partitions: i32,
    replication: i32,
    configs: &[(&str, &str)],
) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .expect("admin client");
    let topics: Vec<NewTopic<'_>> = names
        .iter()
        .map(|n| {
            configs.iter().fold(
                NewTopic::new(n, partitions, TopicReplication::Fixed(replication)),
                |topic, (key, value)| topic.set(key, value),
            )
        })
        .collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let results = rt
        .block_on(admin.create_topics(&topics, &AdminOptions::new()))
        .expect("create topics");
    for r in results {
        r.unwrap_or_else(|(t, e)| panic!("create topic {t}: {e}"));
    }
    // The controller answers once the topics exist; the broker's metadata may lag behind it
    // (a client asking at once can be told a topic does not exist): wait until it has them.
    let deadline = Instant::now() + Duration::from_secs(30);
    for name in names {
        loop {
            let seen = admin
                .inner()
                .fetch_metadata(Some(name), Duration::from_secs(5))
                .ok()
                .and_then(|m| {
                    m.topics()
                        .first()
                        .filter(|t| t.error().is_none())
                        .map(|t| t.partitions().len())
                });
            if seen == Some(partitions as usize) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "topic {name} not in the broker's metadata 30 s after its creation ({seen:?} partitions)"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Writes records with ids `ids` (key = id, value = JSON with the id), idempotently.
pub fn produce_ids(topic: &str, ids: impl IntoIterator<Item = u64>) {
    produce_ids_paced(topic, ids, None)
}

/// Like [`produce_ids`], at most `per_second` records a second when given.
pub fn produce_ids_paced(topic: &str, ids: impl IntoIterator<Item = u64>, per_second: Option<u64>) {
    let records = ids.into_iter().map(|id| {
        let value = format!(r#"{{"id":{id},"payload":"{}"}}"#, "x".repeat(64));
        (Some(id.to_string()), value)
    });
    produce_records_paced(topic, records, per_second)
}

/// Writes `(key, value)` records, idempotently.
pub fn produce_records(topic: &str, records: impl IntoIterator<Item = (Option<String>, String)>) {
    produce_records_paced(topic, records, None)
}

/// Writes `(key, value)` records in order, idempotently, at most `per_second` a second when
/// given.
pub fn produce_records_paced(
    topic: &str,
    records: impl IntoIterator<Item = (Option<String>, String)>,
    per_second: Option<u64>,
) {
    let started = Instant::now();
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .create()
        .expect("producer");
    for (n, (key, value)) in records.into_iter().enumerate() {
        if let Some(rate) = per_second {
            let due = started + Duration::from_secs_f64(n as f64 / rate as f64);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                producer.poll(Duration::ZERO);
                std::thread::sleep(wait);
            }
        }
        let mut record = BaseRecord::<str, str>::to(topic).payload(&value);
        if let Some(k) = &key {
            record = record.key(k.as_str());
        }
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((_, back)) => {
                    record = back;
                    producer.poll(Duration::from_millis(5));
                }
            }
        }
    }
    // As long as librdkafka itself gives a record (message.timeout.ms, 300 s): a broker that
    // stalls for a minute (seen on a loaded 2-core machine: a single node fenced by its own
    // controller after 47 s without a heartbeat) delays the feed, it does not fail the test.
    producer.flush(Duration::from_secs(300)).expect("flush");
}

/// A record read back from an output topic.
#[derive(Debug, Clone)]
pub struct ReadRecord {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<String>,
    pub value: Option<String>,
    /// The value's bytes as read (`value` is their lossy UTF-8 text).
    pub raw: Option<Vec<u8>>,
    pub headers: BTreeMap<String, String>,
    /// Its timestamp (milliseconds since the epoch), when it has one.
    pub timestamp: Option<i64>,
}

fn reader(isolation: &str) -> BaseConsumer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", unique("reader"))
        .set("isolation.level", isolation)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()
        .expect("reader")
}

fn assign_all(consumer: &BaseConsumer, topic: &str, partitions: i32) {
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .expect("tpl");
    }
    consumer.assign(&tpl).expect("assign");
}

fn id_of(msg: &impl Message) -> u64 {
    let key = msg.key().expect("output record without key");
    std::str::from_utf8(key)
        .ok()
        .and_then(|k| k.parse().ok())
        .unwrap_or_else(|| panic!("output key is not an id: {key:?}"))
}

/// The value of the end marker header, if the record is a marker.
fn marker_of(msg: &impl Message) -> Option<String> {
    msg.headers()?
        .iter()
        .find(|h| h.key == MARKER_HEADER)
        .map(|h| String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned())
}

/// Reads until `expected` distinct ids are visible to read_committed, or `timeout`.
/// Returns how many distinct ids were seen.
pub fn wait_for_distinct(
    topic: &str,
    partitions: i32,
    expected: usize,
    timeout: Duration,
) -> usize {
    wait_for_distinct_while(topic, partitions, expected, timeout, &|| true)
}

/// Like [`wait_for_distinct`], but gives up as soon as `alive` returns false.
pub fn wait_for_distinct_while(
    topic: &str,
    partitions: i32,
    expected: usize,
    timeout: Duration,
    alive: &dyn Fn() -> bool,
) -> usize {
    let consumer = reader("read_committed");
    assign_all(&consumer, topic, partitions);
    let mut seen = BTreeSet::new();
    let deadline = Instant::now() + timeout;
    while seen.len() < expected && Instant::now() < deadline && alive() {
        if let Some(Ok(msg)) = consumer.poll(Duration::from_millis(200))
            && marker_of(&msg).is_none()
        {
            seen.insert(id_of(&msg));
        }
    }
    seen.len()
}

/// Counts distinct ids visible to read_committed right now (reads for at most `budget`).
pub fn distinct_now(topic: &str, partitions: i32, budget: Duration) -> usize {
    wait_for_distinct(topic, partitions, usize::MAX, budget)
}

/// Every output id of `topic`, in order of reading, up to a marker written now to each
/// partition. Panics when a marker does not become visible: a transaction is left hanging.
pub fn read_all(topic: &str, partitions: i32, isolation: &str) -> Vec<u64> {
    ids_of(&read_records(topic, partitions, isolation))
}

/// The ids of `records`, their keys, in order.
pub fn ids_of(records: &[ReadRecord]) -> Vec<u64> {
    records
        .iter()
        .map(|r| {
            let key = r.key.as_deref().expect("output record without key");
            key.parse()
                .unwrap_or_else(|_| panic!("output key is not an id: {key:?}"))
        })
        .collect()
}

/// Asserts that every record of `outputs` names, in its `onceflow.origin` header
/// (`<topic>/<partition>/<offset>`), a record of `input` with the same key: the lineage as
/// a broker stored it, for records sent at once and for those held while a commit ran.
pub fn assert_lineage(input: &str, partitions: i32, outputs: &[ReadRecord]) {
    let keys: BTreeMap<(i32, i64), Option<String>> =
        read_records(input, partitions, "read_committed")
            .into_iter()
            .map(|r| ((r.partition, r.offset), r.key))
            .collect();
    let mut wrong = Vec::new();
    for r in outputs {
        let Some(origin) = r.headers.get("onceflow.origin") else {
            wrong.push(format!(
                "{:?} at {}@{}: no origin",
                r.key, r.partition, r.offset
            ));
            continue;
        };
        let named = match named_origin(r) {
            Some((topic, p, o)) if topic == input => keys.get(&(p, o)),
            _ => None,
        };
        if named != Some(&r.key) {
            wrong.push(format!(
                "{:?} at {}@{} names {origin}, whose key is {named:?}",
                r.key, r.partition, r.offset
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} outputs name the wrong origin, first: {:?}",
        wrong.len(),
        outputs.len(),
        &wrong[..wrong.len().min(5)]
    );
}

/// The origin a record names in its `onceflow.origin` header,
/// `<topic>/<partition>/<offset>` (a topic may itself contain `/`); `None` without a
/// readable one.
pub fn named_origin(r: &ReadRecord) -> Option<(String, i32, i64)> {
    let mut parts = r.headers.get("onceflow.origin")?.rsplitn(3, '/');
    let offset = parts.next()?.parse().ok()?;
    let partition = parts.next()?.parse().ok()?;
    Some((parts.next()?.to_string(), partition, offset))
}

/// Every record of `topic`, in order of reading, up to a marker written now to each
/// partition. Panics when a marker does not become visible: a transaction is left hanging.
pub fn read_records(topic: &str, partitions: i32, isolation: &str) -> Vec<ReadRecord> {
    try_read_records(topic, partitions, isolation).unwrap_or_else(|e| panic!("{e}"))
}

/// [`read_records`], saying what went wrong instead of panicking: a marker that did not
/// become visible within 60 s (a transaction left hanging), or a failed read.
pub fn try_read_records(
    topic: &str,
    partitions: i32,
    isolation: &str,
) -> Result<Vec<ReadRecord>, String> {
    read_to_markers(topic, partitions, isolation, false)
}

/// [`read_records`] of a compacted topic (a changelog): its end markers carry a key.
pub fn read_compacted_records(topic: &str, partitions: i32) -> Vec<ReadRecord> {
    read_to_markers(topic, partitions, "read_committed", true).unwrap_or_else(|e| panic!("{e}"))
}

fn read_to_markers(
    topic: &str,
    partitions: i32,
    isolation: &str,
    keyed: bool,
) -> Result<Vec<ReadRecord>, String> {
    // Markers of earlier reads of the same topic are passed over: only this one ends it.
    let this_read = unique("end");
    write_markers_keyed(topic, partitions, &this_read, keyed)
        .map_err(|e| format!("end markers: {e}"))?;

    let consumer = reader(isolation);
    assign_all(&consumer, topic, partitions);
    let mut records = Vec::new();
    let mut done = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let text = |b: Option<&[u8]>| b.map(|b| String::from_utf8_lossy(b).into_owned());
    while done.len() < partitions as usize {
        if Instant::now() >= deadline {
            return Err(format!(
                "markers visible on partitions {done:?} of {partitions} only: a transaction is left hanging on {topic}"
            ));
        }
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(msg)) => {
                let headers: BTreeMap<String, String> = msg
                    .headers()
                    .map(|hs| {
                        hs.iter()
                            .map(|h| (h.key.to_string(), text(h.value).unwrap_or_default()))
                            .collect()
                    })
                    .unwrap_or_default();
                if let Some(marker) = headers.get(MARKER_HEADER) {
                    // Markers of earlier reads of the same topic are passed over.
                    if *marker == this_read {
                        done.insert(msg.partition());
                    }
                } else {
                    records.push(ReadRecord {
                        partition: msg.partition(),
                        offset: msg.offset(),
                        key: text(msg.key()),
                        value: text(msg.payload()),
                        raw: msg.payload().map(<[u8]>::to_vec),
                        headers,
                        timestamp: msg.timestamp().to_millis(),
                    });
                }
            }
            Some(Err(e)) => return Err(format!("reading {topic}: {e}")),
            None => {}
        }
    }
    Ok(records)
}

/// Asserts that `output` holds every id of `input` exactly once and nothing else.
pub fn assert_exactly_once(input: &BTreeSet<u64>, output: &[u64]) {
    let mut counts: BTreeMap<u64, usize> = BTreeMap::new();
    for id in output {
        *counts.entry(*id).or_default() += 1;
    }
    let duplicates: Vec<(u64, usize)> = counts
        .iter()
        .filter(|(_, c)| **c > 1)
        .map(|(i, c)| (*i, *c))
        .collect();
    let seen: BTreeSet<u64> = counts.keys().copied().collect();
    let missing: Vec<u64> = input.difference(&seen).copied().take(20).collect();
    let unexpected: Vec<u64> = seen.difference(input).copied().take(20).collect();
    assert!(
        duplicates.is_empty() && missing.is_empty() && unexpected.is_empty(),
        "exactly-once violated: {} output records for {} input ids; {} duplicated ids (first: {:?}); {} missing (first: {missing:?}); unexpected: {unexpected:?}",
        output.len(),
        input.len(),
        duplicates.len(),
        duplicates.iter().take(10).collect::<Vec<_>>(),
        input.difference(&seen).count(),
    );
}

/// `yaml` written to a topology file in a temporary folder, removed with the folder.
pub fn topology_file(yaml: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("topology.yaml");
    std::fs::write(&path, yaml).expect("write topology");
    (dir, path)
}

/// The consumer group protocol the tests' jobs use: `ONCEFLOW_TEST_GROUP_PROTOCOL`
/// (`classic` by default, or `consumer`: `scripts/test` runs the exactly-once and crash tests
/// under both).
pub fn group_protocol() -> String {
    std::env::var("ONCEFLOW_TEST_GROUP_PROTOCOL").unwrap_or_else(|_| "classic".into())
}

/// A topology file for a pass-through job from `input` to `output`.
pub fn topology_yaml(name: &str, input: &str, output: &str, extra_runtime: &str) -> String {
    format!(
        "name: {name}\ninputs:\n  - topic: {input}\npipeline:\n  - set_header: {{name: processed-by, value: onceflow}}\noutputs:\n  - topic: {output}\nruntime:\n  session_timeout_ms: 10000\n  group_protocol: {}\n{extra_runtime}",
        group_protocol()
    )
}

/// A child process that is killed when dropped, so a failing test leaves no job behind.
pub struct KillOnDrop(pub std::process::Child);

impl std::ops::Deref for KillOnDrop {
    type Target = std::process::Child;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for KillOnDrop {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `onceflow run <topology>` as a child process on the test broker; `env` adds variables.
pub fn spawn_job(topology: &std::path::Path, instance: &str, env: &[(&str, &str)]) -> KillOnDrop {
    let child = Command::new(env!("CARGO_BIN_EXE_onceflow"))
        .arg("run")
        .arg(topology)
        .envs(env.iter().copied())
        .args([
            "--bootstrap-servers",
            &bootstrap(),
            "--instance-id",
            instance,
        ])
        .args(["--progress-interval", "0"])
        .env(
            "RUST_LOG",
            std::env::var("ONCEFLOW_TEST_CHILD_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn onceflow");
    KillOnDrop(child)
}

/// How long process `pid` has run, from /proc (its start in clock ticks since boot).
fn process_age(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')')? + 2..];
    let started: f64 = rest.split(' ').nth(19)?.parse().ok()?;
    let uptime: f64 = std::fs::read_to_string("/proc/uptime")
        .ok()?
        .split(' ')
        .next()?
        .parse()
        .ok()?;
    // USER_HZ is 100 on Linux.
    Some(Duration::from_secs_f64((uptime - started / 100.0).max(0.0)))
}

pub fn signal(child: &Child, sig: &str) {
    let status = Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill {sig} failed");
}

pub fn wait_exit(child: &mut Child, timeout: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

/// Stops a job gracefully and checks it exits 0. A process younger than a second is given
/// that second first: a signal before its `main` runs (the loader maps and relocates a
/// 90 MB debug binary in tens of milliseconds) meets the default action, as for any program.
pub fn terminate(mut child: KillOnDrop) {
    if let Some(age) = process_age(child.id()) {
        std::thread::sleep(Duration::from_secs(1).saturating_sub(age));
    }
    signal(&child, "-TERM");
    let status = wait_exit(&mut child, Duration::from_secs(60));
    if status.is_none() {
        let _ = child.kill();
    }
    assert!(
        status.is_some_and(|s| s.success()),
        "onceflow did not exit 0 on SIGTERM: {status:?}"
    );
}

/// Runs `topology` in-process on a thread until `expected` ids are visible on `topic`
/// (read_committed), then stops it with the shutdown flag, as SIGTERM would.
pub fn run_in_process(
    topology: &onceflow::topology::Topology,
    options: onceflow::instance::RunOptions,
    topic: &str,
    partitions: i32,
    expected: usize,
) -> onceflow::instance::Summary {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    onceflow::telemetry::init_tracing(false);
    let shutdown = Arc::new(AtomicBool::new(false));
    let handle = {
        let (topology, shutdown) = (topology.clone(), Arc::clone(&shutdown));
        let identity = onceflow::instance::Identity {
            bootstrap_servers: bootstrap(),
            instance_id: "i0".into(),
        };
        std::thread::spawn(move || onceflow::job::run(&topology, &identity, &options, &shutdown))
    };
    let seen = wait_for_distinct_while(
        topic,
        partitions,
        expected,
        Duration::from_secs(120),
        &|| !handle.is_finished(),
    );
    shutdown.store(true, Ordering::Relaxed);
    let summary = handle.join().expect("job thread").expect("job result");
    assert_eq!(seen, expected, "not every record came through in time");
    summary
}

/// Runs `scripts/postgres <command>` against the test server at `url` (its port).
pub fn postgres_script(url: &str, command: &str) {
    let port = url
        .rsplit_once(':')
        .and_then(|(_, rest)| rest.split('/').next())
        .expect("a port in ONCEFLOW_TEST_PG_URL")
        .to_string();
    let status = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/postgres"))
        .arg(command)
        .env("PG_PORT", port)
        .stdout(Stdio::null())
        .status()
        .expect("scripts/postgres");
    assert!(
        status.success(),
        "scripts/postgres {command} failed (the test restarts the server of scripts/postgres, with the same PG_PORT and ONCEFLOW_PG_DIR)"
    );
}

/// Runs `scripts/kafka <args>` against the test broker: the node of scripts/kafka at the port
/// of `ONCEFLOW_TEST_BOOTSTRAP` (and `ONCEFLOW_KAFKA_DIR`, if set, passed on).
pub fn kafka_script(args: &[&str]) {
    let port = bootstrap()
        .split(',')
        .next()
        .and_then(|b| b.rsplit_once(':'))
        .map(|(_, port)| port.to_string())
        .expect("a port in ONCEFLOW_TEST_BOOTSTRAP");
    let status = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/kafka"))
        .args(args)
        .env("KAFKA_PORT", port)
        .stdout(Stdio::null())
        .status()
        .expect("scripts/kafka");
    assert!(
        status.success(),
        "scripts/kafka {args:?} failed (the test restarts the broker of scripts/kafka, with the same KAFKA_PORT and ONCEFLOW_KAFKA_DIR)"
    );
}

/// A GET of a job's HTTP endpoint: its status and body.
pub fn get(addr: &str, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nhost: test\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let status = out.split_whitespace().nth(1)?.parse().ok()?;
    let body = out.split_once("\r\n\r\n")?.1.to_string();
    Some((status, body))
}

/// Sum of the samples of `name` whose labels contain every `label="value"` of `having`.
pub fn metric(body: &str, name: &str, having: &[&str]) -> Option<f64> {
    let mut found = None;
    for line in body.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let (series_name, labels) = series.split_once('{').unwrap_or((series, ""));
        if series_name == name && having.iter().all(|h| labels.contains(h)) {
            *found.get_or_insert(0.0) += value.parse::<f64>().ok()?;
        }
    }
    found
}

/// The variable naming the PostgreSQL server of `scripts/postgres`.
pub const PG_URL_ENV: &str = "ONCEFLOW_TEST_PG_URL";

/// The server started by `scripts/test` (`scripts/postgres start`).
pub fn pg_url() -> String {
    std::env::var(PG_URL_ENV).expect(
        "ONCEFLOW_TEST_PG_URL is not set: these tests need the PostgreSQL server of scripts/postgres; run them with scripts/test",
    )
}

/// One test at a time: a test that stops the server stops it for every test of the file.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// A PostgreSQL test's start: the database to itself for as long as it holds the guard
/// ([`serial`]), and its own connection.
pub fn serial_db() -> (std::sync::MutexGuard<'static, ()>, Db) {
    let guard = serial();
    (guard, Db::connect())
}

/// A test's own connection to the database.
pub struct Db {
    /// The runtime the connection's task runs on.
    pub rt: tokio::runtime::Runtime,
    /// The client, for what the helpers below do not cover.
    pub client: tokio_postgres::Client,
}

impl Db {
    /// A connection to [`pg_url`]; panics when there is none.
    pub fn connect() -> Db {
        Self::try_connect().expect("connect to the test database")
    }

    /// A connection to [`pg_url`].
    pub fn try_connect() -> Result<Db, tokio_postgres::Error> {
        Self::open(&pg_url())
    }

    /// A connection to `url`, its task spawned on the connection's own runtime.
    pub fn open(url: &str) -> Result<Db, tokio_postgres::Error> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let (client, connection) =
            rt.block_on(tokio_postgres::connect(url, tokio_postgres::NoTls))?;
        rt.spawn(async move {
            let _ = connection.await;
        });
        Ok(Db { rt, client })
    }

    /// Runs `sql`; panics on an error.
    pub fn exec(&self, sql: &str) {
        self.try_exec(sql)
            .unwrap_or_else(|e| panic!("{sql}: {e:?}"));
    }

    /// Runs `sql`.
    pub fn try_exec(&self, sql: &str) -> Result<(), tokio_postgres::Error> {
        self.rt.block_on(self.client.batch_execute(sql))
    }

    /// The rows of `sql`.
    pub fn try_query(&self, sql: &str) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
        self.rt.block_on(self.client.query(sql, &[]))
    }

    /// The rows of `sql`; panics on an error.
    pub fn query(&self, sql: &str) -> Vec<tokio_postgres::Row> {
        self.try_query(sql)
            .unwrap_or_else(|e| panic!("{sql}: {e:?}"))
    }

    /// Creates a table no other test uses (its name from `prefix`) with `columns`, the
    /// inside of `CREATE TABLE name (...)`; its name.
    pub fn create_table(&self, prefix: &str, columns: &str) -> String {
        let table = unique(prefix).replace('-', "_");
        self.exec(&format!("CREATE TABLE {table} ({columns})"));
        table
    }

    /// The first column of the first row of `sql`, a count.
    pub fn count(&self, sql: &str) -> i64 {
        self.query(sql)[0].get(0)
    }
}

/// Starts a job with `spawn` and SIGKILLs it at a random moment after it made progress
/// visible on `output` (its `partitions`), again and again, until it was killed `kills` times
/// with ids of the `total` still missing: a job that cannot be done before it was killed that
/// often. Gives up after ten rounds.
pub fn kill_mid_run(
    spawn: &dyn Fn() -> KillOnDrop,
    output: &str,
    partitions: i32,
    total: usize,
    kills: usize,
) {
    use rand::Rng;
    let mut rng = rand::rng();
    let mut kills_mid_run = 0;
    let mut visible = 0;
    for round in 0..10 {
        if kills_mid_run >= kills {
            break;
        }
        let mut child = spawn();
        // Kill at a random moment after this incarnation committed something, however slow
        // its start is on a loaded machine.
        let progressed =
            wait_for_distinct(output, partitions, visible + 1, Duration::from_secs(90));
        assert!(
            progressed > visible,
            "round {round}: the job made no progress"
        );
        std::thread::sleep(Duration::from_millis(rng.random_range(0..1500)));
        child.kill().expect("SIGKILL"); // std's kill sends SIGKILL
        child.wait().expect("reap");
        visible = distinct_now(output, partitions, Duration::from_secs(2));
        eprintln!("round {round}: SIGKILL with {visible} of {total} ids visible");
        if visible < total {
            kills_mid_run += 1;
        }
    }
    assert!(
        kills_mid_run >= kills,
        "the job was not killed {kills} times mid-run"
    );
}

/// Two instances of `topology` on disks of their own (a zombie's and its replacement's): its
/// `state_dir` line becomes `${STATE_DIR}`, and the folders to give each as `STATE_DIR`.
pub fn disks_apart(topology: &std::path::Path) -> [tempfile::TempDir; 2] {
    let text = std::fs::read_to_string(topology).expect("topology");
    let text: String = text
        .lines()
        .map(|l| {
            if l.trim_start().starts_with("state_dir:") {
                "  state_dir: ${STATE_DIR}".to_string()
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(topology, text + "\n").expect("topology");
    [
        tempfile::tempdir().expect("disk"),
        tempfile::tempdir().expect("disk"),
    ]
}

/// [`freeze_replace_wake`] of instance `instance` of `topology`, the zombie and its
/// replacement each on a disk of its own ([`disks_apart`]).
pub fn zombie_on_its_own_disk(
    topology: &std::path::Path,
    instance: &str,
    output: &str,
    partitions: i32,
    expected: usize,
) -> (KillOnDrop, [tempfile::TempDir; 2]) {
    let disks = disks_apart(topology);
    let disk = |i: usize| disks[i].path().display().to_string();
    let zombie = spawn_job(topology, instance, &[("STATE_DIR", disk(0).as_str())]);
    let replacement = freeze_replace_wake(
        zombie,
        &|| spawn_job(topology, instance, &[("STATE_DIR", disk(1).as_str())]),
        output,
        partitions,
        expected,
    );
    (replacement, disks)
}

/// A zombie holding an open transaction: `zombie` is frozen (SIGSTOP) in the middle of its
/// work, once it has committed something to `output`; `replacement` starts and must bring
/// `expected` ids to `output`; past the zombie's 10 s session timeout it is woken (SIGCONT)
/// and must stop, non-zero, once fenced. Returns the replacement, still running.
pub fn freeze_replace_wake(
    mut zombie: KillOnDrop,
    replacement: &dyn Fn() -> KillOnDrop,
    output: &str,
    partitions: i32,
    expected: usize,
) -> KillOnDrop {
    let started = Instant::now();
    while distinct_now(output, partitions, Duration::from_millis(500)) == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the first instance never committed"
        );
    }
    // Freeze it in the middle of its work, as a long GC pause or a partitioned VM would.
    signal(&zombie, "-STOP");
    let frozen = Instant::now();
    let replacement = replacement();
    let seen = wait_for_distinct(output, partitions, expected, Duration::from_secs(180));
    assert_eq!(seen, expected, "the replacement did not finish the work");
    // Past its 10 s session timeout, whatever the replacement's pace.
    if let Some(rest) = Duration::from_secs(12).checked_sub(frozen.elapsed()) {
        std::thread::sleep(rest);
    }
    // The zombie wakes up holding an open transaction: it must be fenced and stop.
    signal(&zombie, "-CONT");
    let status = wait_exit(&mut zombie, Duration::from_secs(90));
    if status.is_none() {
        let _ = zombie.kill();
    }
    assert!(
        status.is_some_and(|st| !st.success()),
        "the zombie should exit non-zero once fenced: {status:?}"
    );
    replacement
}

/// Writes `(key, value)` records of bytes in order, idempotently.
pub fn produce_bytes(topic: &str, values: impl IntoIterator<Item = (String, Vec<u8>)>) {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .create()
        .expect("producer");
    for (key, value) in values {
        loop {
            match producer.send(BaseRecord::to(topic).key(&key).payload(&value)) {
                Ok(()) => break,
                Err((e, _)) if e.to_string().contains("Queue full") => {
                    producer.poll(Duration::from_millis(50));
                }
                Err((e, _)) => panic!("produce: {e}"),
            }
        }
        producer.poll(Duration::ZERO);
    }
    producer.flush(Duration::from_secs(60)).expect("flush");
}

/// Each id of `expected` seen once in `got` (id to how often it was seen), and nothing else.
pub fn assert_each_once(what: &str, expected: &BTreeSet<u64>, got: &BTreeMap<u64, usize>) {
    let duplicated: Vec<_> = got.iter().filter(|(_, n)| **n > 1).take(10).collect();
    let seen: BTreeSet<u64> = got.keys().copied().collect();
    let missing: Vec<_> = expected.difference(&seen).take(10).collect();
    let unexpected: Vec<_> = seen.difference(expected).take(10).collect();
    assert!(
        duplicated.is_empty() && missing.is_empty() && unexpected.is_empty(),
        "{what}: {} expected, {} seen; duplicated {duplicated:?}; missing {missing:?}; unexpected {unexpected:?}",
        expected.len(),
        seen.len()
    );
}

/// Committed records (markers left out) of `topic` once at least `expected`, or the timeout.
pub fn wait_for_committed(
    topic: &str,
    partitions: i32,
    expected: usize,
    timeout: Duration,
) -> usize {
    let deadline = Instant::now() + timeout;
    let mut seen = 0;
    while Instant::now() < deadline {
        seen = committed_count(topic, partitions);
        if seen >= expected {
            break;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    seen
}

/// How many committed records (markers left out) `topic` has.
pub fn committed_count(topic: &str, partitions: i32) -> usize {
    read_records(topic, partitions, "read_committed").len()
}

/// `validate --bootstrap-servers` fails naming `subject` as incompatible, and `run` stops at start with
/// the registry's words.
pub fn assert_refused_at_start(file: &std::path::Path, subject: &str) {
    let validate = Command::new(env!("CARGO_BIN_EXE_onceflow"))
        .args(["validate", "--bootstrap-servers", &bootstrap()])
        .arg(file)
        .output()
        .expect("validate");
    let said = String::from_utf8_lossy(&validate.stdout).to_string()
        + &String::from_utf8_lossy(&validate.stderr);
    assert!(!validate.status.success(), "validate passed: {said}");
    assert!(
        said.contains(subject) && said.contains("compatible"),
        "{said}"
    );

    let run = Command::new(env!("CARGO_BIN_EXE_onceflow"))
        .arg("run")
        .arg(file)
        .args(["--bootstrap-servers", &bootstrap(), "--instance-id", "i0"])
        .output()
        .expect("run");
    let said = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success(), "the job ran: {said}");
    assert!(
        said.contains(subject) && said.to_lowercase().contains("incompatible"),
        "{said}"
    );
}

/// The real schema registry `scripts/test` starts.
pub fn registry_url() -> String {
    std::env::var("ONCEFLOW_TEST_REGISTRY_URL").expect(
        "ONCEFLOW_TEST_REGISTRY_URL is not set: these tests need the real schema registry; run them with scripts/test",
    )
}
