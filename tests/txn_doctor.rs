//! `onceflow txn doctor` against the real broker: a foreign producer (a child process, not
//! onceflow) is SIGKILLed in the middle of a transaction whose id is never used again. Its
//! partition's last stable offset stops: a read_committed reader stalls below the high
//! watermark with no error. The doctor must find it, `--abort` must end it, the reader must
//! then reach the high watermark, and the aborted records must stay invisible.

mod common;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use serde_json::Value;

const ABORTED: std::ops::Range<u64> = 1000..1010;
const BEFORE: std::ops::Range<u64> = 0..10;
const AFTER: std::ops::Range<u64> = 2000..2010;

/// The foreign producer: opens a transaction with a long timeout, writes [`ABORTED`] to
/// partition 0, says `open` on stdout and waits to be killed.
#[test]
#[ignore = "the foreign producer of the doctor tests, run by them as a child process"]
fn foreign_producer_child() {
    let (Ok(topic), Ok(id)) = (
        std::env::var("ONCEFLOW_DOCTOR_TOPIC"),
        std::env::var("ONCEFLOW_DOCTOR_TXN_ID"),
    ) else {
        return;
    };
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("transactional.id", &id)
        .set("transaction.timeout.ms", "600000")
        .create()
        .expect("producer");
    producer
        .init_transactions(Duration::from_secs(30))
        .expect("init");
    producer.begin_transaction().expect("begin");
    for i in ABORTED {
        let key = i.to_string();
        producer
            .send(
                BaseRecord::to(&topic)
                    .partition(0)
                    .key(&key)
                    .payload("aborted"),
            )
            .expect("send");
    }
    producer.flush(Duration::from_secs(30)).expect("flush");
    println!("open");
    std::io::stdout().flush().expect("stdout");
    loop {
        producer.poll(Duration::from_millis(200));
    }
}

/// Starts the foreign producer, waits until its transaction is open, and SIGKILLs it.
fn hang_a_transaction(topic: &str, transactional_id: &str) {
    let mut child = KillOnDrop(
        Command::new(std::env::current_exe().expect("the test binary"))
            .args([
                "--ignored",
                "--exact",
                "foreign_producer_child",
                "--nocapture",
                "--quiet",
            ])
            .env("ONCEFLOW_DOCTOR_TOPIC", topic)
            .env("ONCEFLOW_DOCTOR_TXN_ID", transactional_id)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn the foreign producer"),
    );
    let stdout = child.stdout.take().expect("stdout");
    let open = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .any(|line| line.trim() == "open");
    assert!(open, "the foreign producer did not open its transaction");
    signal(&child, "-KILL");
    let status = wait_exit(&mut child, Duration::from_secs(10));
    assert!(
        status.is_some_and(|s| !s.success()),
        "the foreign producer was not killed: {status:?}"
    );
}

fn produce_committed(topic: &str, ids: std::ops::Range<u64>) {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .expect("producer");
    for i in ids {
        let key = i.to_string();
        producer
            .send(
                BaseRecord::to(topic)
                    .partition(0)
                    .key(&key)
                    .payload("committed"),
            )
            .expect("send");
    }
    producer.flush(Duration::from_secs(30)).expect("flush");
}

/// A read_committed reader of partition 0 from the beginning.
fn committed_reader(topic: &str) -> BaseConsumer {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", unique("doctor-reader"))
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .create()
        .expect("reader");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)
        .expect("tpl");
    consumer.assign(&tpl).expect("assign");
    consumer
}

/// Reads for `budget`; returns the ids read and the reader's position afterwards.
fn read_for(consumer: &BaseConsumer, topic: &str, budget: Duration) -> (Vec<u64>, i64) {
    let mut ids = Vec::new();
    let deadline = Instant::now() + budget;
    while Instant::now() < deadline {
        if let Some(Ok(msg)) = consumer.poll(Duration::from_millis(100)) {
            let key = std::str::from_utf8(msg.key().expect("key")).expect("utf-8");
            ids.push(key.parse().expect("id"));
        }
    }
    let position = consumer
        .position()
        .expect("position")
        .find_partition(topic, 0)
        .and_then(|p| p.offset().to_raw())
        .unwrap_or(-1);
    (ids, position)
}

/// Partition 0's high watermark (a read_committed client is told the last stable offset).
fn high_watermark(topic: &str) -> i64 {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("isolation.level", "read_uncommitted")
        .create()
        .expect("client");
    consumer
        .fetch_watermarks(topic, 0, Duration::from_secs(10))
        .expect("watermarks")
        .1
}

fn doctor(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_onceflow"))
        .args(["txn", "doctor", "--bootstrap-servers", &bootstrap()])
        .args(args)
        .output()
        .expect("run the doctor")
}

/// `txn doctor --abort --yes --json` on `topic`, a transaction open for 1 s hanging.
fn abort_hanging(topic: &str) -> Output {
    doctor(&[
        "--topic",
        topic,
        "--older-than",
        "1s",
        "--abort",
        "--yes",
        "--json",
    ])
}

fn json(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "doctor's output is not JSON ({e}): {}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

/// The open transaction of `id` in a diagnosis, if listed.
fn transaction<'a>(diagnosis: &'a Value, id: &str) -> Option<&'a Value> {
    diagnosis["transactions"]
        .as_array()
        .expect("transactions")
        .iter()
        .find(|t| t["transactional_id"] == id)
}

fn partition<'a>(diagnosis: &'a Value, topic: &str, index: i64) -> &'a Value {
    diagnosis["partitions"]
        .as_array()
        .expect("partitions")
        .iter()
        .find(|p| p["topic"] == topic && p["partition"] == index)
        .unwrap_or_else(|| panic!("{topic}-{index} not examined: {diagnosis}"))
}

#[test]
fn a_killed_foreign_producer_hangs_its_partition_until_the_doctor_aborts_it() {
    let topic = unique("doctor");
    let foreign = unique("payments-exporter");
    create_topics(&[&topic], 2);
    produce_committed(&topic, BEFORE);
    hang_a_transaction(&topic, &foreign);
    produce_committed(&topic, AFTER);

    // The reader stalls: it gets what precedes the open transaction, then nothing, with no
    // error, while the high watermark is past everything written.
    let reader = committed_reader(&topic);
    let (seen, position) = read_for(&reader, &topic, Duration::from_secs(5));
    let hw = high_watermark(&topic);
    assert_eq!(
        seen,
        BEFORE.collect::<Vec<_>>(),
        "what a stalled reader reads"
    );
    assert_eq!(hw, count(BEFORE) + count(ABORTED) + count(AFTER));
    assert!(position < hw, "reader at {position}, high watermark {hw}");

    // Found, over plaintext and over TLS, with a non-zero exit.
    std::thread::sleep(Duration::from_millis(1500));
    let found = doctor(&["--topic", &topic, "--older-than", "1s", "--json"]);
    assert_eq!(
        found.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&found.stderr)
    );
    let diagnosis = json(&found);
    assert_eq!(diagnosis["healthy"], false);
    let open = transaction(&diagnosis, &foreign).expect("the foreign transaction listed");
    assert_eq!(open["hanging"], true);
    assert_eq!(open["state"], "Ongoing");
    assert!(
        open["onceflow"].is_null(),
        "not one of onceflow's ids: {open}"
    );
    assert_eq!(
        open["partitions"],
        serde_json::json!([format!("{topic}-0")])
    );
    let held = partition(&diagnosis, &topic, 0);
    assert_eq!(held["high_watermark"], hw);
    assert_eq!(held["last_stable_offset"], count(BEFORE));
    assert_eq!(held["gap"], hw - count(BEFORE));
    assert_eq!(held["holders"][0]["transactional_id"], foreign.as_str());
    assert_eq!(held["holders"][0]["txn_start_offset"], count(BEFORE));
    assert_eq!(partition(&diagnosis, &topic, 1)["gap"], 0);
    assert!(diagnosis["cures"].as_array().is_some_and(|c| c.len() == 1));

    let tls = Command::new(env!("CARGO_BIN_EXE_onceflow"))
        .args([
            "txn",
            "doctor",
            "--topic",
            &topic,
            "--older-than",
            "1s",
            "--json",
        ])
        .args(["--bootstrap-servers", &tls_bootstrap()])
        .args(["-X", "security.protocol=SSL"])
        .args(["-X", &format!("ssl.ca.location={}", kafka_ca())])
        .output()
        .expect("run the doctor over TLS");
    assert_eq!(
        tls.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&tls.stderr)
    );
    assert!(transaction(&json(&tls), &foreign).is_some_and(|t| t["hanging"] == true));

    // A table for people, with the same verdict.
    let table = doctor(&["--topic", &topic, "--older-than", "1s"]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert_eq!(table.status.code(), Some(1));
    assert!(
        text.contains("HANGING") && text.contains(&foreign),
        "{text}"
    );

    // Without --yes, and without a terminal to ask on, nothing is done: asked wrongly.
    let unconfirmed = doctor(&["--topic", &topic, "--older-than", "1s", "--abort"]);
    assert_eq!(unconfirmed.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&unconfirmed.stderr).contains("--yes"));

    // Cured: the doctor fences the id at its coordinator and then reports healthy.
    let cured = abort_hanging(&topic);
    assert_eq!(
        cured.status.code(),
        Some(0),
        "{}\n{}",
        String::from_utf8_lossy(&cured.stdout),
        String::from_utf8_lossy(&cured.stderr)
    );
    let report = json(&cured);
    assert_eq!(report["treatments"][0]["cure"]["action"], "fence");
    assert!(report["treatments"][0]["error"].is_null(), "{report}");
    assert_eq!(report["after"]["healthy"], true);
    assert!(
        transaction(&report["after"], &foreign).is_none(),
        "still open: {report}"
    );
    let after = partition(&report["after"], &topic, 0);
    assert_eq!(after["gap"], 0);
    assert_eq!(after["high_watermark"], after["last_stable_offset"]);

    // The stalled reader moves on to the high watermark; the aborted records stay invisible.
    let (rest, position) = read_for(&reader, &topic, Duration::from_secs(5));
    assert_eq!(
        rest,
        AFTER.collect::<Vec<_>>(),
        "what the reader reads once cured"
    );
    let hw = high_watermark(&topic);
    assert!(
        position >= hw - 1,
        "reader at {position}, high watermark {hw}"
    );
    let ids: BTreeSet<u64> = read_records(&topic, 2, "read_committed")
        .iter()
        .map(|r| r.key.as_deref().expect("key").parse().expect("id"))
        .collect();
    assert_eq!(ids, BEFORE.chain(AFTER).collect::<BTreeSet<_>>());

    // And a second look finds nothing to do.
    let again = doctor(&["--topic", &topic, "--older-than", "1s"]);
    assert_eq!(
        again.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&again.stdout)
    );
}

fn count(ids: std::ops::Range<u64>) -> i64 {
    (ids.end - ids.start) as i64
}

fn tls_bootstrap() -> String {
    std::env::var("ONCEFLOW_TEST_BOOTSTRAP_TLS").expect("ONCEFLOW_TEST_BOOTSTRAP_TLS")
}

fn kafka_ca() -> String {
    std::env::var("ONCEFLOW_TEST_KAFKA_CA").expect("ONCEFLOW_TEST_KAFKA_CA")
}

/// The test broker's SASL_PLAINTEXT listeners (`scripts/kafka bootstrap --sasl`), whose SCRAM
/// user is [`SCRAM_USER`] with [`SCRAM_PASSWORD`].
fn sasl_bootstrap() -> String {
    std::env::var("ONCEFLOW_TEST_BOOTSTRAP_SASL").expect("ONCEFLOW_TEST_BOOTSTRAP_SASL")
}

const SCRAM_USER: &str = "onceflow";
const SCRAM_PASSWORD: &str = "onceflow-secret";

/// The client settings of a SASL_PLAINTEXT connection with `mechanism`.
fn sasl_settings(mechanism: &str, password: &str) -> Vec<(&'static str, String)> {
    vec![
        ("security.protocol", "SASL_PLAINTEXT".to_string()),
        ("sasl.mechanism", mechanism.to_string()),
        ("sasl.username", SCRAM_USER.to_string()),
        ("sasl.password", password.to_string()),
    ]
}

/// `txn doctor` over the SASL listener with `mechanism` and `password`.
fn doctor_over_sasl(mechanism: &str, password: &str, args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_onceflow"));
    command
        .args(["txn", "doctor", "--bootstrap-servers", &sasl_bootstrap()])
        .args(args);
    for (key, value) in sasl_settings(mechanism, password) {
        command.args(["-X", &format!("{key}={value}")]);
    }
    command.output().expect("run the doctor over SASL")
}

#[test]
fn the_doctor_finds_and_ends_a_hanging_transaction_over_sasl_scram() {
    let topic = unique("doctor-scram");
    let foreign = unique("scram-exporter");
    create_topics(&[&topic], 1);
    produce_committed(&topic, BEFORE);
    hang_a_transaction(&topic, &foreign);
    produce_committed(&topic, AFTER);
    std::thread::sleep(Duration::from_millis(1500));

    // Found with either hash, as over PLAINTEXT.
    let look = ["--topic", &topic, "--older-than", "1s", "--json"];
    for mechanism in ["SCRAM-SHA-256", "SCRAM-SHA-512"] {
        let found = doctor_over_sasl(mechanism, SCRAM_PASSWORD, &look);
        assert_eq!(
            found.status.code(),
            Some(1),
            "{mechanism}: {}",
            String::from_utf8_lossy(&found.stderr)
        );
        let diagnosis = json(&found);
        let open = transaction(&diagnosis, &foreign).expect("the foreign transaction listed");
        assert_eq!(open["hanging"], true, "{mechanism}: {open}");
        let held = partition(&diagnosis, &topic, 0);
        assert_eq!(held["last_stable_offset"], count(BEFORE), "{mechanism}");
        assert_eq!(held["holders"][0]["transactional_id"], foreign.as_str());
    }

    // A wrong password: the broker's refusal, and "could not look".
    let refused = doctor_over_sasl("SCRAM-SHA-256", "not-the-password", &look);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("SASL authentication failed") && stderr.contains("invalid credentials"),
        "{stderr}"
    );
    // A mechanism the listener does not enable: the ones it does are named.
    let unoffered = doctor_over_sasl("PLAIN", SCRAM_PASSWORD, &look);
    let stderr = String::from_utf8_lossy(&unoffered.stderr);
    assert_eq!(unoffered.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("does not enable PLAIN")
            && stderr.contains("SCRAM-SHA-256")
            && stderr.contains("SCRAM-SHA-512"),
        "{stderr}"
    );

    // Cured over SCRAM too: the fence goes to the coordinator through the same listener.
    let cured = doctor_over_sasl(
        "SCRAM-SHA-512",
        SCRAM_PASSWORD,
        &[
            "--topic",
            &topic,
            "--older-than",
            "1s",
            "--abort",
            "--yes",
            "--json",
        ],
    );
    assert_eq!(
        cured.status.code(),
        Some(0),
        "{}\n{}",
        String::from_utf8_lossy(&cured.stdout),
        String::from_utf8_lossy(&cured.stderr)
    );
    let report = json(&cured);
    assert_eq!(report["after"]["healthy"], true, "{report}");
    assert!(transaction(&report["after"], &foreign).is_none());
    let ids: BTreeSet<u64> = read_records(&topic, 1, "read_committed")
        .iter()
        .map(|r| r.key.as_deref().expect("key").parse().expect("id"))
        .collect();
    assert_eq!(ids, BEFORE.chain(AFTER).collect::<BTreeSet<_>>());
}

fn free_addr() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    format!("127.0.0.1:{port}")
}

/// The age the job reports for `topic`'s partition 0, and its readiness.
fn watched(addr: &str, topic: &str) -> (Option<f64>, Option<(u16, String)>) {
    let age = get(addr, "/metrics").and_then(|(_, body)| {
        metric(
            &body,
            "onceflow_output_open_transaction_age_seconds",
            &[&format!("topic=\"{topic}\""), "partition=\"0\""],
        )
    });
    (age, get(addr, "/readyz"))
}

/// Waits until `done` returns `None`; it returns what it saw otherwise, shown on timeout.
fn wait_until<T: std::fmt::Debug>(
    what: &str,
    timeout: Duration,
    mut done: impl FnMut() -> Option<T>,
) {
    let deadline = Instant::now() + timeout;
    while let Some(seen) = done() {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}; last seen: {seen:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// `onceflow run` of `topology` on `bootstrap` as `instance`, with its metrics on a free
/// address (returned): its transaction watch is read there.
fn watching_job(
    topology: &std::path::Path,
    bootstrap: &str,
    instance: &str,
) -> (KillOnDrop, String) {
    let addr = free_addr();
    let job = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_onceflow"))
            .arg("run")
            .arg(topology)
            .args(["--bootstrap-servers", bootstrap, "--instance-id", instance])
            .args(["--metrics-addr", &addr, "--progress-interval", "0"])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn onceflow"),
    );
    (job, addr)
}

/// Waits until the job at `addr` has looked at `output`'s open transactions (an age under
/// 10 s) and is ready.
fn wait_for_first_look(addr: &str, output: &str, what: &str) {
    wait_until(what, Duration::from_secs(30), || {
        let seen = watched(addr, output);
        (!matches!(seen, (Some(age), Some((200, _))) if age < 10.0)).then_some(seen)
    });
}

#[test]
fn a_job_reports_a_foreign_transaction_hanging_on_its_output_until_the_doctor_ends_it() {
    let input = unique("doctor-job-in");
    let output = unique("doctor-job-out");
    let foreign = unique("legacy-writer");
    create_topics(&[&input, &output], 2);
    let first: BTreeSet<u64> = (0..500).collect();
    produce_ids(&input, first.iter().copied());
    let name = unique("doctor-job");
    let (_dir, topology) = topology_file(&topology_yaml(
        &name,
        &input,
        &output,
        "  transaction_timeout_ms: 10000\n  commit_interval_ms: 100\n",
    ));
    let (job, addr) = watching_job(&topology, &bootstrap(), "doc-0");
    assert_eq!(
        wait_for_distinct(&output, 2, first.len(), Duration::from_secs(120)),
        first.len()
    );
    wait_for_first_look(&addr, &output, "the job's first look at its outputs");

    // A foreign producer dies mid-transaction on the job's output: past the job's transaction
    // timeout (10 s) the job reports the partition held and turns unready, naming it.
    hang_a_transaction(&output, &foreign);
    wait_until(
        "the job to report the held partition",
        Duration::from_secs(60),
        || {
            let seen = watched(&addr, &output);
            let held = matches!(&seen, (Some(age), Some((503, why)))
            if *age > 10.0 && why.contains(&format!("{output}-0")) && why.contains("txn doctor"));
            (!held).then_some(seen)
        },
    );
    assert_eq!(
        get(&addr, "/healthz").map(|r| r.0),
        Some(200),
        "alive all along"
    );

    // The doctor, given the topology, names the foreign transaction on the job's output and
    // ends it; the job's own transactions are left alone.
    let found = doctor(&[
        topology.to_str().expect("path"),
        "--older-than",
        "5s",
        "--json",
    ]);
    assert_eq!(found.status.code(), Some(1));
    let diagnosis = json(&found);
    assert!(transaction(&diagnosis, &foreign).is_some_and(|t| t["hanging"] == true));
    for t in diagnosis["transactions"].as_array().expect("transactions") {
        if t["transactional_id"] != foreign.as_str() {
            assert_eq!(t["transactional_id"], format!("onceflow.{name}.doc-0"));
            assert_eq!(t["onceflow"]["running"], true, "{t}");
            assert_eq!(t["hanging"], false, "{t}");
        }
    }
    let cured = doctor(&[
        topology.to_str().expect("path"),
        "--older-than",
        "5s",
        "--abort",
        "--yes",
    ]);
    assert_eq!(
        cured.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&cured.stdout)
    );

    // Back to ready, and the job went on with exactly-once output throughout.
    wait_until("the job to be ready again", Duration::from_secs(60), || {
        let seen = watched(&addr, &output);
        (!matches!(seen, (Some(age), Some((200, _))) if age < 10.0)).then_some(seen)
    });
    let second: BTreeSet<u64> = (500..1000).collect();
    produce_ids(&input, second.iter().copied());
    let all: BTreeSet<u64> = first.union(&second).copied().collect();
    assert_eq!(
        wait_for_distinct(&output, 2, all.len(), Duration::from_secs(120)),
        all.len()
    );
    terminate(job);
    let ids: Vec<u64> = read_records(&output, 2, "read_committed")
        .iter()
        .filter(|r| r.value.as_deref() != Some("aborted"))
        .map(|r| r.key.as_deref().expect("key").parse().expect("id"))
        .collect();
    assert!(
        read_records(&output, 2, "read_committed")
            .iter()
            .all(|r| r.value.as_deref() != Some("aborted")),
        "an aborted record is visible"
    );
    assert_exactly_once(&all, &ids);
}

#[test]
fn abort_markers_alone_free_the_partition_but_leave_the_coordinator_open_until_fenced() {
    use onceflow::kafka::Cluster;
    use onceflow::kafka::transactions::TxnAdmin;

    let topic = unique("doctor-markers");
    let foreign = unique("batch-loader");
    create_topics(&[&topic], 1);
    produce_committed(&topic, BEFORE);
    hang_a_transaction(&topic, &foreign);
    produce_committed(&topic, AFTER);

    // What `kafka-transactions.sh abort` does: markers for the producer the partition's
    // leader describes, written to the partition.
    let mut admin =
        TxnAdmin::connect(&Cluster::new(&bootstrap()), Duration::from_secs(30)).expect("admin");
    let held = (topic.clone(), 0);
    let producers = admin
        .describe_producers(std::slice::from_ref(&held))
        .expect("describe producers");
    let open: Vec<_> = producers[&held]
        .iter()
        .filter(|p| p.txn_start_offset >= 0)
        .collect();
    assert_eq!(open.len(), 1, "{producers:?}");
    assert_eq!(open[0].txn_start_offset, count(BEFORE));
    admin
        .write_abort_marker(&held, open[0])
        .expect("abort markers");

    // The partition is free: the reader gets everything committed, nothing aborted.
    let reader = committed_reader(&topic);
    let (seen, _) = read_for(&reader, &topic, Duration::from_secs(5));
    assert_eq!(seen, BEFORE.chain(AFTER).collect::<Vec<_>>());

    // But the coordinator still has the transaction open on it: the doctor, once it is old
    // enough, still finds it (with no partition held any more) and fences the id.
    std::thread::sleep(Duration::from_millis(1500));
    let found = doctor(&["--topic", &topic, "--older-than", "1s", "--json"]);
    assert_eq!(found.status.code(), Some(1));
    let diagnosis = json(&found);
    let open = transaction(&diagnosis, &foreign).expect("still open at the coordinator");
    assert_eq!(
        (open["state"].as_str(), open["hanging"].as_bool()),
        (Some("Ongoing"), Some(true))
    );
    assert_eq!(partition(&diagnosis, &topic, 0)["gap"], 0);
    let cured = abort_hanging(&topic);
    assert_eq!(
        cured.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&cured.stdout)
    );
    assert!(transaction(&json(&cured)["after"], &foreign).is_none());
    let ids: BTreeSet<u64> = read_records(&topic, 1, "read_committed")
        .iter()
        .map(|r| r.key.as_deref().expect("key").parse().expect("id"))
        .collect();
    assert_eq!(ids, BEFORE.chain(AFTER).collect::<BTreeSet<_>>());
}

#[test]
fn a_job_watches_its_outputs_over_sasl_scram() {
    let input = unique("doctor-scram-in");
    let output = unique("doctor-scram-out");
    let foreign = unique("scram-writer");
    create_topics(&[&input, &output], 1);
    let ids: BTreeSet<u64> = (0..100).collect();
    produce_ids(&input, ids.iter().copied());
    let name = unique("doctor-scram-job");
    // Every client of the job, its transaction watch included, on the SCRAM listener.
    let mut yaml = topology_yaml(
        &name,
        &input,
        &output,
        "  transaction_timeout_ms: 10000\n  commit_interval_ms: 100\n",
    );
    yaml.push_str("kafka:\n  common:\n");
    for (key, value) in sasl_settings("SCRAM-SHA-256", SCRAM_PASSWORD) {
        yaml.push_str(&format!("    {key}: {value}\n"));
    }
    let (_dir, topology) = topology_file(&yaml);
    let (job, addr) = watching_job(&topology, &sasl_bootstrap(), "scram-0");
    assert_eq!(
        wait_for_distinct(&output, 1, ids.len(), Duration::from_secs(120)),
        ids.len()
    );
    wait_for_first_look(
        &addr,
        &output,
        "the job's first look at its outputs over SCRAM",
    );

    // A foreign transaction hangs on the output: the watch, over SCRAM, sees it.
    hang_a_transaction(&output, &foreign);
    wait_until(
        "the job to report the held partition",
        Duration::from_secs(60),
        || {
            let seen = watched(&addr, &output);
            let held = matches!(&seen, (Some(age), Some((503, why)))
                if *age > 10.0 && why.contains(&format!("{output}-0")));
            (!held).then_some(seen)
        },
    );
    let cured = doctor_over_sasl(
        "SCRAM-SHA-256",
        SCRAM_PASSWORD,
        &["--topic", &output, "--older-than", "5s", "--abort", "--yes"],
    );
    assert_eq!(
        cured.status.code(),
        Some(0),
        "{}\n{}",
        String::from_utf8_lossy(&cured.stdout),
        String::from_utf8_lossy(&cured.stderr)
    );
    wait_until("the job to be ready again", Duration::from_secs(60), || {
        let seen = watched(&addr, &output);
        (!matches!(seen, (Some(age), Some((200, _))) if age < 10.0)).then_some(seen)
    });
    terminate(job);
}
