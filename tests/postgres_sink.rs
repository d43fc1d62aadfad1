//! The PostgreSQL output on a real PostgreSQL server and, for the jobs, the real broker:
//! latest version wins over duplicates and disorder, a crash between the database commit and
//! the Kafka commit changes nothing (a counter table counts each event once), a database
//! restart mid-run loses nothing, and a record the database refuses goes to the dead-letter
//! topic (or, with `on_error: fail`, stops the job naming it) with nothing of it committed
//! anywhere else.
//!
//! The tests of this file run one at a time: one of them restarts the shared server.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use onceflow::record::{Origin, Record};
use onceflow::sink::SinkErrorKind;
use onceflow::sink::postgres::PostgresSink;
use onceflow::topology::Topology;
use rand::Rng;
use rand::seq::SliceRandom;
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use serde_json::{Value, json};

/// A table name no other test uses.
fn table_name(prefix: &str) -> String {
    unique(prefix).replace('-', "_")
}

/// Writes JSON records (key, value) in order, idempotently.
fn produce_json(topic: &str, records: &[(String, Value)], per_second: Option<u64>) {
    let records = records
        .iter()
        .map(|(k, v)| (Some(k.clone()), v.to_string()));
    produce_records_paced(topic, records, per_second);
}

/// A topology file in a temporary folder.
struct Job {
    _dir: tempfile::TempDir,
    topology: PathBuf,
    name: String,
}

fn job(prefix: &str, input: &str, outputs: &str, runtime: &str) -> Job {
    let name = unique(prefix);
    let dir = tempfile::tempdir().expect("tempdir");
    let topology = dir.path().join("topology.yaml");
    // Several outputs take every record: a route says so.
    let names: Vec<&str> = outputs
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("- name: "))
        .map(str::trim)
        .collect();
    let pipeline = if names.len() > 1 {
        format!(
            "pipeline:\n  - route: {{routes: [{{when: 'true', to: [{}]}}], default: [{}]}}\n",
            names.join(", "),
            names[0]
        )
    } else {
        String::new()
    };
    let text = format!(
        "name: {name}\ninputs:\n  - topic: {input}\n{pipeline}outputs:\n{outputs}runtime:\n  session_timeout_ms: 10000\n{runtime}"
    );
    Topology::parse(&text, "test topology").expect("the test topology is valid");
    std::fs::write(&topology, text).expect("write topology");
    Job {
        _dir: dir,
        topology,
        name,
    }
}

/// A `postgres` output entry of a topology.
fn pg_output(name: &str, table: &str, body: &str) -> String {
    format!(
        "  - name: {name}\n    postgres:\n      url_env: {PG_URL_ENV}\n      table: {table}\n{body}"
    )
}

/// `onceflow run` with its stderr collected (and echoed) by a thread.
struct Child {
    process: KillOnDrop,
    stderr: Arc<Mutex<String>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Child {
    fn spawn(job: &Job, envs: &[(&str, String)], args: &[&str]) -> Child {
        let mut command = Command::new(env!("CARGO_BIN_EXE_onceflow"));
        command
            .arg("run")
            .arg(&job.topology)
            .args(["--bootstrap-servers", &bootstrap()])
            .args(["--instance-id", "pg-0", "--progress-interval", "0"])
            .args(args)
            .env(
                "RUST_LOG",
                std::env::var("ONCEFLOW_TEST_CHILD_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .env_remove("ONCEFLOW_FAILPOINT_EXIT_AFTER_DB_COMMIT")
            .current_dir(job._dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in envs {
            command.env(k, v);
        }
        let mut process = KillOnDrop(command.spawn().expect("spawn onceflow"));
        let mut pipe = process.stderr.take().expect("stderr");
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = Arc::clone(&stderr);
        let reader = std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            while let Ok(n) = pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let text = String::from_utf8_lossy(&buf[..n]);
                eprint!("{text}");
                sink.lock().unwrap().push_str(&text);
            }
        });
        Child {
            process,
            stderr,
            reader: Some(reader),
        }
    }

    fn wait(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.process.try_wait().expect("try_wait") {
                if let Some(r) = self.reader.take() {
                    let _ = r.join();
                }
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "onceflow did not exit within {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn terminate(mut self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.process.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
        let status = self.wait(Duration::from_secs(60));
        assert!(
            status.success(),
            "onceflow did not exit 0 on SIGTERM: {status:?}"
        );
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }
}

/// The committed offset of the job's group on each partition of `topic`.
fn committed_offsets(group: &str, topic: &str, partitions: i32) -> Vec<i64> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", group)
        .create()
        .expect("consumer");
    let mut tpl = rdkafka::TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    let committed = consumer
        .committed_offsets(tpl, Duration::from_secs(10))
        .expect("committed offsets");
    committed
        .elements()
        .iter()
        .map(|e| match e.offset() {
            rdkafka::Offset::Offset(o) => o,
            _ => -1,
        })
        .collect()
}

/// Polls `done` every 200 ms (database errors count as "not yet") until it holds or
/// `timeout` passes; returns whether it held.
fn wait_until(timeout: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    false
}

// --- The sink through its library API (no Kafka): the semantics in detail -------------------

fn sink_config(table: &str, body: &str) -> onceflow::topology::PostgresOutput {
    let text = format!(
        "name: t\ninputs: [{{topic: in}}]\noutputs:\n{}",
        pg_output("db", table, body)
    );
    Topology::parse(&text, "t.yaml")
        .expect("valid")
        .postgres_outputs()
        .next()
        .expect("one output")
        .1
        .clone()
}

/// A sink of a topology named after `prefix` (and no other test), writing `table` as the
/// output entry's `body` says, connected.
fn connect_sink(
    prefix: &str,
    table: &str,
    body: &str,
) -> (PostgresSink, onceflow::topology::PostgresOutput, String) {
    let config = sink_config(table, body);
    let topology = unique(prefix);
    let sink = PostgresSink::connect_url(&topology, "db", &config, &pg_url()).expect("sink");
    (sink, config, topology)
}

fn rec(offset: i64, value: Value) -> Record {
    Record {
        key: None,
        value: Some(value.to_string().into_bytes()),
        headers: Vec::new(),
        timestamp: None,
        origin: Origin {
            topic: "orders".into(),
            partition: 0,
            offset,
        },
    }
}

fn far() -> Instant {
    Instant::now() + Duration::from_secs(30)
}

#[test]
fn sink_arbitrates_versions_remembers_deletions_and_absorbs_replays() {
    let (_serial, db) = serial_db();
    let table = db.create_table(
        "arbitrate",
        "id bigint PRIMARY KEY, version bigint NOT NULL, name text",
    );
    let (mut sink, config, topology) = connect_sink(
        "arbitrate",
        &table,
        "      id_columns: [id]\n      version_column: version\n      columns: {id: id, version: v, name: name}\n      delete_when: deleted\n",
    );
    let rows = |db: &Db| -> Vec<(i64, i64, String)> {
        db.query(&format!(
            "SELECT id, version, name FROM {table} ORDER BY id"
        ))
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
    };

    // One batch: several versions of one id, out of order; the newest wins.
    for (offset, v) in [(0, 2), (1, 5), (2, 3)] {
        sink.stage(&rec(
            offset,
            json!({"id": 1, "v": v, "name": format!("v{v}")}),
        ))
        .unwrap();
    }
    sink.stage(&rec(3, json!({"id": 2, "v": 1, "name": "a"})))
        .unwrap();
    assert!(sink.flush(far()).unwrap());
    assert_eq!(rows(&db), vec![(1, 5, "v5".into()), (2, 1, "a".into())]);

    // A later batch with an older version changes nothing; a newer one does.
    sink.stage(&rec(4, json!({"id": 1, "v": 4, "name": "late"})))
        .unwrap();
    sink.stage(&rec(5, json!({"id": 2, "v": 2, "name": "b"})))
        .unwrap();
    sink.flush(far()).unwrap();
    assert_eq!(rows(&db), vec![(1, 5, "v5".into()), (2, 2, "b".into())]);

    // A deletion older than the row is ignored; a newer one deletes and is remembered, so an
    // older upsert arriving later does not bring the row back, and a newer one does.
    sink.stage(&rec(6, json!({"id": 1, "v": 1, "deleted": true})))
        .unwrap();
    sink.stage(&rec(7, json!({"id": 2, "v": 7, "deleted": true})))
        .unwrap();
    sink.flush(far()).unwrap();
    assert_eq!(rows(&db), vec![(1, 5, "v5".into())]);
    sink.stage(&rec(8, json!({"id": 2, "v": 6, "name": "resurrected?"})))
        .unwrap();
    sink.stage(&rec(9, json!({"id": 3, "v": 1, "deleted": true})))
        .unwrap();
    sink.flush(far()).unwrap();
    assert_eq!(rows(&db), vec![(1, 5, "v5".into())]);
    sink.stage(&rec(10, json!({"id": 2, "v": 8, "name": "back"})))
        .unwrap();
    sink.stage(&rec(
        11,
        json!({"id": 3, "v": 1, "name": "same version as its deletion"}),
    ))
    .unwrap();
    sink.flush(far()).unwrap();
    assert_eq!(rows(&db), vec![(1, 5, "v5".into()), (2, 8, "back".into())]);

    // A replay of messages applied before (same offsets), mixed with new ones: only the new
    // ones apply, even where the replayed ones carry a newer version.
    let before = rows(&db);
    sink.stage(&rec(
        1,
        json!({"id": 1, "v": 99, "name": "replayed, never applied"}),
    ))
    .unwrap();
    sink.stage(&rec(12, json!({"id": 4, "v": 1, "name": "new"})))
        .unwrap();
    sink.flush(far()).unwrap();
    let mut expected = before;
    expected.push((4, 1, "new".into()));
    assert_eq!(rows(&db), expected);
    let inbox = db.count(&format!(
        "SELECT count(*) FROM onceflow_inbox WHERE consumer = '{topology}/db'"
    ));
    assert_eq!(inbox, 13, "one inbox row per message");

    // Staged but discarded (an aborted Kafka transaction): nothing is written.
    sink.stage(&rec(13, json!({"id": 5, "v": 1, "name": "discarded"})))
        .unwrap();
    sink.discard();
    assert!(!sink.flush(far()).unwrap());
    assert_eq!(rows(&db).len(), 3);

    // Expired inbox rows and deletion markers go, 1000 at a time, at the next check.
    db.exec(&format!(
        "UPDATE onceflow_inbox SET received_at = now() - interval '200 hours' WHERE consumer = '{topology}/db' AND message_id IN ('orders/0/0', 'orders/0/1');
         UPDATE onceflow_tombstones SET deleted_at = now() - interval '200 hours' WHERE target = 'public.{table}'"
    ));
    let fresh_sink = PostgresSink::connect_url(&topology, "db", &config, &pg_url()).expect("sink");
    drop(sink);
    let mut sink = fresh_sink;
    sink.stage(&rec(14, json!({"id": 6, "v": 1, "name": "x"})))
        .unwrap();
    sink.flush(far()).unwrap();
    assert_eq!(
        db.count(&format!(
            "SELECT count(*) FROM onceflow_inbox WHERE consumer = '{topology}/db'"
        )),
        13 - 2 + 1
    );
    assert_eq!(
        db.count(&format!(
            "SELECT count(*) FROM onceflow_tombstones WHERE target = 'public.{table}'"
        )),
        0
    );
}

#[test]
fn sink_counts_increments_once_and_names_bad_records() {
    let (_serial, db) = serial_db();
    let table = db.create_table(
        "counter",
        "key text PRIMARY KEY, n bigint NOT NULL CHECK (n < 1000), last text",
    );
    let (mut sink, _, topology) = connect_sink(
        "counter",
        &table,
        "      id_columns: [key]\n      columns: {key: k, n: one, last: tag}\n      increment_columns: [n]\n",
    );
    for offset in 0..10 {
        let k = if offset % 3 == 0 { "a" } else { "b" };
        sink.stage(&rec(
            offset,
            json!({"k": k, "one": 1, "tag": format!("t{offset}")}),
        ))
        .unwrap();
    }
    sink.flush(far()).unwrap();
    // The same ten again (a replay) plus two new ones.
    for offset in 0..12 {
        let k = if offset % 3 == 0 { "a" } else { "b" };
        sink.stage(&rec(
            offset,
            json!({"k": k, "one": 1, "tag": format!("t{offset}")}),
        ))
        .unwrap();
    }
    sink.flush(far()).unwrap();
    let counts: Vec<(String, i64, String)> = db
        .query(&format!("SELECT key, n, last FROM {table} ORDER BY key"))
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(
        counts,
        vec![("a".into(), 4, "t9".into()), ("b".into(), 8, "t11".into())]
    );

    // A value that is not an object is refused at once, naming the record.
    let err = sink
        .stage(&rec(20, json!([1, 2])))
        .expect_err("not an object");
    assert_eq!(err.kind, SinkErrorKind::Permanent);
    assert_eq!(err.origin.as_ref().map(|o| o.offset), Some(20));

    // Rows that violate a constraint fail the batch; the records are found, all in one pass,
    // and nothing of the batch is committed, inbox included.
    sink.stage(&rec(21, json!({"k": "c", "one": 1}))).unwrap();
    sink.stage(&rec(22, json!({"k": "d", "one": 5000})))
        .unwrap();
    sink.stage(&rec(23, json!({"k": "e", "one": 1}))).unwrap();
    sink.stage(&rec(24, json!({"k": "f", "one": 7000})))
        .unwrap();
    let err = sink.flush(far()).expect_err("check violation");
    assert_eq!(err.kind, SinkErrorKind::Permanent, "{err}");
    let refused: Vec<i64> = err
        .all()
        .map(|e| e.origin.as_ref().map_or(-1, |o| o.offset))
        .collect();
    assert_eq!(refused, vec![22, 24], "{err}");
    assert!(err.to_string().contains("orders[0]@22"), "{err}");
    assert!(err.to_string().contains("23514"), "{err}");
    assert_eq!(db.count(&format!("SELECT count(*) FROM {table}")), 2);
    assert_eq!(
        db.count(&format!(
            "SELECT count(*) FROM onceflow_inbox WHERE consumer = '{topology}/db'"
        )),
        12
    );
}

#[test]
fn sink_with_event_ids_applies_an_event_once_whatever_its_offsets() {
    let (_serial, db) = serial_db();
    let table = db.create_table(
        "eventid",
        "key text PRIMARY KEY, n bigint NOT NULL, tags text[]",
    );
    let (mut sink, _, _) = connect_sink(
        "eventid",
        &table,
        "      id_columns: [key]\n      columns: {key: k, n: one, tags: tags}\n      increment_columns: [n]\n      event_id: {field: eid}\n",
    );
    // Event e1 twice in one batch (two offsets), e2 once; then e1 and e2 again on new
    // offsets with e3: each event counts once.
    let event = |offset, eid: &str| {
        rec(
            offset,
            json!({"eid": eid, "k": "a", "one": 1, "tags": ["x", "y z"]}),
        )
    };
    for (offset, eid) in [(0, "e1"), (1, "e1"), (2, "e2")] {
        sink.stage(&event(offset, eid)).unwrap();
    }
    sink.flush(far()).unwrap();
    for (offset, eid) in [(3, "e1"), (4, "e2"), (5, "e3")] {
        sink.stage(&event(offset, eid)).unwrap();
    }
    sink.flush(far()).unwrap();
    let rows = db.query(&format!("SELECT n, tags FROM {table}"));
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].get::<_, i64>(0), 3);
    assert_eq!(
        rows[0].get::<_, Vec<String>>(1),
        vec!["x".to_string(), "y z".to_string()]
    );
}

#[test]
fn a_table_without_a_unique_key_on_the_ids_is_refused_at_start() {
    let (_serial, db) = serial_db();
    let table = db.create_table("nokey", "id bigint, name text");
    let config = sink_config(
        &table,
        "      id_columns: [id]\n      columns: {id: id, nope: name}\n",
    );
    let err = PostgresSink::connect_url("t", "db", &config, &pg_url())
        .err()
        .expect("refused");
    assert_eq!(err.kind, SinkErrorKind::Fatal);
    let text = err.to_string();
    assert!(text.contains("has no column `nope`"), "{text}");
    assert!(text.contains("no primary key or unique index"), "{text}");
}

#[test]
fn two_outputs_naming_one_table_differently_are_refused_at_start() {
    let (_serial, db) = serial_db();
    let table = db.create_table("twice", "id bigint PRIMARY KEY");
    // `t` and `public.t` pass validation (different names) but are one table.
    let columns = "      id_columns: [id]\n      columns: {id: id}\n";
    let text = format!(
        "name: twice\ninputs: [{{topic: in}}]\npipeline:\n  - route: {{routes: [{{when: 'true', to: [a, b]}}], default: [a]}}\noutputs:\n{}{}",
        pg_output("a", &table, columns),
        pg_output("b", &format!("public.{table}"), columns)
    );
    let topology = Topology::parse(&text, "twice.yaml").expect("valid");
    let err = onceflow::sink::Sinks::from_topology(&topology)
        .err()
        .expect("refused");
    assert_eq!(err.kind, SinkErrorKind::Fatal);
    let text = err.to_string();
    assert!(
        text.contains(&format!("public.{table}` as output `a` does")),
        "{text}"
    );
}

// --- Jobs on the real broker ----------------------------------------------------------------

/// One event of the ordered-state test: version `v` of row `id`, or its deletion.
fn state_event(id: u64, v: u64, deleted: bool) -> (String, Value) {
    let value = if deleted {
        json!({"id": id, "version": v, "deleted": true})
    } else {
        let cents = id * 8 + v;
        let amount: Value =
            serde_json::from_str(&format!("{}.{:02}", cents / 100, cents % 100)).expect("amount");
        json!({
            "id": id,
            "version": v,
            "name": format!("n{id}-v{v}"),
            "amount": amount,
            "tags": {"v": v, "odd": id % 2 == 1},
        })
    };
    (id.to_string(), value)
}

#[test]
fn latest_version_wins_over_duplicates_and_disorder() {
    let (_serial, db) = serial_db();
    let table = db.create_table("latest", "id bigint PRIMARY KEY, version bigint NOT NULL, name text NOT NULL, amount numeric(12,2), tags jsonb");
    let input = unique("latest-in");
    create_topics(&[&input], 4);

    // 2,000 ids with versions 1..=8 (the 8th deletes every tenth id), plus 4,000 copies of
    // random events, all shuffled: versions arrive out of order and several times.
    let mut rng = rand::rng();
    let mut events: Vec<(String, Value)> = Vec::new();
    for id in 0..2_000u64 {
        for v in 1..=8u64 {
            events.push(state_event(id, v, v == 8 && id % 10 == 3));
        }
    }
    let copies: Vec<(String, Value)> = (0..4_000)
        .map(|_| events[rng.random_range(0..events.len())].clone())
        .collect();
    events.extend(copies);
    events.shuffle(&mut rng);
    assert_eq!(events.len(), 20_000);
    produce_json(&input, &events, None);

    let outputs = pg_output(
        "latest",
        &table,
        "      id_columns: [id]\n      version_column: version\n      columns: {id: id, version: version, name: name, amount: amount, tags: tags}\n      delete_when: deleted\n      batch_size: 700\n",
    );
    let job = job("latest", &input, &outputs, "  max_records_per_txn: 1000\n");
    let mut child = Child::spawn(&job, &[], &["--stop-after-records", "20000"]);
    let status = child.wait(Duration::from_secs(180));
    assert!(
        status.success(),
        "the job failed: {status:?}\n{}",
        child.stderr()
    );

    // The expected table: the highest version of each id, absent when that is a deletion.
    let mut newest: BTreeMap<u64, u64> = BTreeMap::new();
    for (_, e) in &events {
        let id = e["id"].as_u64().unwrap();
        let v = e["version"].as_u64().unwrap();
        let slot = newest.entry(id).or_default();
        *slot = (*slot).max(v);
    }
    let mut expected: BTreeMap<i64, (i64, String, String, Value)> = BTreeMap::new();
    for (&id, &v) in &newest {
        let (_, e) = state_event(id, v, v == 8 && id % 10 == 3);
        if e.get("deleted").is_none() {
            let cents = id * 8 + v;
            expected.insert(
                id as i64,
                (
                    v as i64,
                    e["name"].as_str().unwrap().to_string(),
                    format!("{}.{:02}", cents / 100, cents % 100),
                    e["tags"].clone(),
                ),
            );
        }
    }
    assert_eq!(expected.len(), 1_800);
    let actual: BTreeMap<i64, (i64, String, String, Value)> = db
        .query(&format!(
            "SELECT id, version, name, amount::text, tags::text FROM {table}"
        ))
        .iter()
        .map(|r| {
            let tags: String = r.get(4);
            (
                r.get(0),
                (
                    r.get(1),
                    r.get(2),
                    r.get(3),
                    serde_json::from_str(&tags).unwrap(),
                ),
            )
        })
        .collect();
    let wrong: Vec<_> = expected
        .iter()
        .filter(|(id, row)| actual.get(id) != Some(row))
        .take(10)
        .collect();
    let extra: Vec<_> = actual
        .keys()
        .filter(|id| !expected.contains_key(id))
        .take(10)
        .collect();
    assert!(
        wrong.is_empty() && extra.is_empty() && actual.len() == expected.len(),
        "{} rows, {} expected; wrong or missing (first): {wrong:?}; unexpected ids: {extra:?}",
        actual.len(),
        expected.len()
    );
    assert_eq!(
        db.count(&format!(
            "SELECT count(*) FROM onceflow_tombstones WHERE target = 'public.{table}' AND version = '8'"
        )),
        200,
        "each deletion is remembered with its version"
    );
}

/// Tables of the counting tests: one row per event (versioned upsert), and a counter per key
/// (`n = n + 1` per event) that would overcount any event applied twice.
fn counting_tables(db: &Db, prefix: &str) -> (String, String, String) {
    let events = table_name(&format!("{prefix}_events"));
    let counts = table_name(&format!("{prefix}_counts"));
    db.exec(&format!(
        "CREATE TABLE {events} (id bigint PRIMARY KEY, key text NOT NULL, version bigint NOT NULL);
         CREATE TABLE {counts} (key text PRIMARY KEY, n bigint NOT NULL)"
    ));
    let outputs = format!(
        "{}{}",
        pg_output(
            "events",
            &events,
            "      id_columns: [id]\n      version_column: version\n      columns: {id: id, key: key, version: version}\n      batch_size: 250\n",
        ),
        pg_output(
            "counts",
            &counts,
            "      id_columns: [key]\n      columns: {key: key, n: one}\n      increment_columns: [n]\n      batch_size: 250\n",
        )
    );
    (events, counts, outputs)
}

const KEYS: u64 = 40;

fn counting_events(n: u64) -> Vec<(String, Value)> {
    (0..n)
        .map(|i| {
            (
                i.to_string(),
                json!({"id": i, "key": format!("k{}", i % KEYS), "one": 1, "version": 1}),
            )
        })
        .collect()
}

/// Each event counted once, one inbox row per message and output, every offset committed.
fn assert_counted_once(
    db: &Db,
    job: &Job,
    input: &str,
    events_table: &str,
    counts_table: &str,
    n: u64,
) {
    let counts: Vec<(String, i64)> = db
        .query(&format!("SELECT key, n FROM {counts_table} ORDER BY key"))
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let wrong: Vec<&(String, i64)> = counts
        .iter()
        .filter(|(_, c)| *c as u64 != n / KEYS)
        .collect();
    assert!(
        counts.len() as u64 == KEYS && wrong.is_empty(),
        "every key must count {} events: {} keys, wrong: {wrong:?}",
        n / KEYS,
        counts.len()
    );
    assert_eq!(
        db.count(&format!("SELECT count(*) FROM {events_table}")),
        n as i64
    );
    for output in ["events", "counts"] {
        assert_eq!(
            db.count(&format!(
                "SELECT count(*) FROM onceflow_inbox WHERE consumer = '{}/{output}'",
                job.name
            )),
            n as i64,
            "one inbox row per message for {output}"
        );
    }
    let committed: i64 = committed_offsets(&format!("onceflow.{}", job.name), input, 4)
        .iter()
        .sum();
    assert_eq!(committed, n as i64, "every consumed offset is committed");
}

#[test]
fn crashes_between_the_database_commit_and_the_kafka_commit_count_each_event_once() {
    use std::os::unix::process::ExitStatusExt;
    let (_serial, db) = serial_db();
    let (events_table, counts_table, outputs) = counting_tables(&db, "crash");
    let input = unique("pgcrash-in");
    create_topics(&[&input], 4);
    const N: u64 = 12_000;
    produce_json(&input, &counting_events(N), None);
    let job = job("pgcrash", &input, &outputs, "  max_records_per_txn: 250\n");
    let mut rng = rand::rng();

    // Each run aborts right after its n-th database commit, before the Kafka transaction
    // of that batch commits: the next run consumes the batch again. Six runs commit at most
    // 18 of the 48 batches, so each surely crashes mid-run.
    for round in 0..6 {
        let n: u64 = rng.random_range(1..=7);
        let mut child = Child::spawn(
            &job,
            &[("ONCEFLOW_FAILPOINT_EXIT_AFTER_DB_COMMIT", n.to_string())],
            &[],
        );
        let status = child.wait(Duration::from_secs(90));
        assert_eq!(
            status.signal(),
            Some(6),
            "round {round}: the job should abort after database commit {n}: {status:?}"
        );
        let applied = db.count(&format!("SELECT count(*) FROM {events_table}"));
        eprintln!("round {round}: aborted after database commit {n}; {applied} events applied");
    }

    // Then SIGKILLs at random moments (the job may be done by then on a fast machine: the
    // failpoint rounds above are the ones that surely crash mid-run).
    for round in 0..2 {
        let mut child = Child::spawn(&job, &[], &[]);
        std::thread::sleep(Duration::from_millis(rng.random_range(200..1_200)));
        child.process.kill().expect("SIGKILL");
        child.wait(Duration::from_secs(10));
        let applied = db.count(&format!("SELECT count(*) FROM {events_table}"));
        eprintln!("SIGKILL round {round}: {applied} events applied");
    }
    let child = Child::spawn(&job, &[], &[]);
    let done = wait_until(Duration::from_secs(180), || {
        db.count(&format!(
            "SELECT coalesce(sum(n), 0)::bigint FROM {counts_table}"
        )) >= N as i64
            && db.count(&format!("SELECT count(*) FROM {events_table}")) == N as i64
    });
    // Let the last Kafka transaction commit, then stop.
    std::thread::sleep(Duration::from_secs(1));
    child.terminate();
    assert!(done, "not every event was applied");
    assert_counted_once(&db, &job, &input, &events_table, &counts_table, N);
}

#[test]
fn a_database_restart_mid_run_loses_nothing() {
    let (_serial, db) = serial_db();
    let (events_table, counts_table, outputs) = counting_tables(&db, "restart");
    let input = unique("pgrestart-in");
    create_topics(&[&input], 4);
    const N: u64 = 30_000; // 12 s of input at 2,500 a second: the restart is mid-run
    let feeder = {
        let input = input.clone();
        std::thread::spawn(move || produce_json(&input, &counting_events(N), Some(2_500)))
    };
    let job = job(
        "pgrestart",
        &input,
        &outputs,
        "  max_records_per_txn: 500\n",
    );
    let child = Child::spawn(&job, &[], &[]);
    assert!(
        wait_until(Duration::from_secs(60), || db
            .count(&format!("SELECT count(*) FROM {events_table}"))
            > 0),
        "the job never wrote"
    );
    let before = db.count(&format!("SELECT count(*) FROM {events_table}"));
    assert!(before < N as i64, "the job was done before the restart");
    drop(db);

    common::postgres_script(&pg_url(), "stop");
    std::thread::sleep(Duration::from_secs(4));
    common::postgres_script(&pg_url(), "start");
    eprintln!("server restarted with {before} of {N} events applied");
    feeder.join().expect("feeder");

    let done = wait_until(Duration::from_secs(180), || {
        let Ok(db) = Db::try_connect() else {
            return false;
        };
        let sum = db.try_query(&format!(
            "SELECT coalesce(sum(n), 0)::bigint FROM {counts_table}"
        ));
        matches!(sum.as_deref(), Ok([row]) if row.get::<_, i64>(0) >= N as i64)
    });
    std::thread::sleep(Duration::from_secs(1));
    let log = child.stderr();
    child.terminate();
    assert!(done, "not every event was applied after the restart");
    assert!(
        log.contains("transient database error"),
        "the job should have retried while the server was down:\n{log}"
    );
    assert_counted_once(
        &Db::connect(),
        &job,
        &input,
        &events_table,
        &counts_table,
        N,
    );
}

/// Refused records of the dead-letter tests: a negative amount the CHECK refuses, or a value
/// that is not a JSON object (no row can be made of it).
fn refused_by_check(id: u64) -> bool {
    // 150 and 151 come in one transaction: the second refusal aborts the transaction that
    // dead-letters the first, which must not be forgotten.
    id % 300 == 150 || id == 151
}

fn not_an_object(id: u64) -> bool {
    id % 500 == 99
}

fn checked_event(id: u64) -> (String, Value) {
    let value = if not_an_object(id) {
        json!(id)
    } else {
        let amount = if refused_by_check(id) { -1 } else { id as i64 };
        json!({"id": id, "version": 1, "amount": amount})
    };
    (id.to_string(), value)
}

#[test]
fn a_record_the_database_refuses_goes_to_the_dead_letter_topic_and_its_partition_flows() {
    let (_serial, db) = serial_db();
    let (plain, checked) = (table_name("plain"), table_name("checked"));
    db.exec(&format!(
        "CREATE TABLE {plain} (id bigint PRIMARY KEY, version bigint NOT NULL, amount numeric NOT NULL);
         CREATE TABLE {checked} (id bigint PRIMARY KEY, version bigint NOT NULL, amount numeric NOT NULL CHECK (amount >= 0))"
    ));
    let input = unique("pgdlq-in");
    let out = unique("pgdlq-out");
    create_topics(&[&input, &out], 2);
    // Every record goes to a topic and to two tables; only `checked` refuses negative amounts.
    let columns = "      id_columns: [id]\n      version_column: version\n      columns: {id: id, version: version, amount: amount}\n      batch_size: 200\n";
    let outputs = format!(
        "  - name: out\n    topic: {out}\n{}{}",
        pg_output("plain", &plain, columns),
        pg_output("checked", &checked, columns)
    );
    let job = job("pgdlq", &input, &outputs, "  commit_interval_ms: 200\n");
    let dlq_topic = format!("{}.dlq", job.name);
    create_topics(&[&dlq_topic], 1);

    const N: u64 = 3_000;
    let events: Vec<(String, Value)> = (0..N).map(checked_event).collect();
    let bad: BTreeSet<u64> = (0..N)
        .filter(|&id| refused_by_check(id) || not_an_object(id))
        .collect();
    let good: BTreeSet<u64> = (0..N).filter(|id| !bad.contains(id)).collect();
    assert_eq!((bad.len(), good.len()), (17, 2_983));
    let producer = std::thread::spawn({
        let input = input.clone();
        move || produce_json(&input, &events, Some(1_500))
    });

    // A SIGKILL mid-run, then a run to the end.
    let mut first = Child::spawn(&job, &[], &[]);
    let started = wait_until(Duration::from_secs(60), || {
        db.count(&format!("SELECT count(*) FROM {checked}")) >= 700
    });
    first.process.kill().expect("SIGKILL");
    first.wait(Duration::from_secs(10));
    assert!(
        started,
        "no progress before the SIGKILL:\n{}",
        first.stderr()
    );
    producer.join().expect("producer");
    let second = Child::spawn(&job, &[], &[]);
    let group = format!("onceflow.{}", job.name);
    let done = wait_until(Duration::from_secs(120), || {
        committed_offsets(&group, &input, 2).iter().sum::<i64>() == N as i64
    });
    let log = second.stderr();
    second.terminate();
    assert!(
        done,
        "the partitions did not flow past the refused records:\n{log}"
    );

    // The good records everywhere exactly once; the refused ones nowhere but the dead-letter
    // topic: a record refused by one table leaves nothing in the other, nor in the topic.
    let ids = |sql: String| -> Vec<u64> {
        db.query(&sql)
            .iter()
            .map(|r| r.get::<_, i64>(0) as u64)
            .collect()
    };
    for table in [&plain, &checked] {
        let rows = ids(format!("SELECT id FROM {table}"));
        assert_exactly_once(&good, &rows);
    }
    assert_exactly_once(&good, &read_all(&out, 2, "read_committed"));
    let letters = read_records(&dlq_topic, 1, "read_committed");
    let lettered: Vec<u64> = letters
        .iter()
        .map(|r| r.key.as_deref().expect("key").parse().expect("an id"))
        .collect();
    assert_exactly_once(&bad, &lettered);
    for (letter, id) in letters.iter().zip(&lettered) {
        let meta = |k: &str| letter.headers.get(k).map_or("", String::as_str);
        assert_eq!(
            letter.value.as_deref(),
            Some(checked_event(*id).1.to_string().as_str()),
            "the value verbatim"
        );
        assert_eq!(meta(onceflow::dlq::H_TOPIC), input);
        assert!(meta(onceflow::dlq::H_OFFSET).parse::<i64>().is_ok());
        let (kind, stage, message) = (
            meta(onceflow::dlq::H_KIND),
            meta(onceflow::dlq::H_STAGE),
            meta(onceflow::dlq::H_MESSAGE),
        );
        if refused_by_check(*id) {
            assert_eq!(
                (kind, stage),
                ("rejected", "outputs[2] (checked)"),
                "{message}"
            );
            assert!(
                message.contains("23514") && message.contains("check constraint"),
                "{message}"
            );
        } else {
            assert_eq!(
                (kind, stage),
                ("wrong_type", "outputs[1] (plain)"),
                "{message}"
            );
            assert!(message.contains("not a JSON object"), "{message}");
        }
    }
    // Each refused record cost one aborted transaction, and was dead-lettered when it came
    // again: the log says so.
    assert!(
        log.contains("the database refused a record")
            || first.stderr().contains("the database refused a record"),
        "no refusal logged:\n{log}"
    );
}

#[test]
fn with_on_error_fail_a_refused_record_stops_the_job_naming_it() {
    let (_serial, db) = serial_db();
    let table = db.create_table("check", "id bigint PRIMARY KEY, version bigint NOT NULL, amount numeric NOT NULL CHECK (amount >= 0)");
    let input = unique("pgcheck-in");
    create_topics(&[&input], 1);
    let event = |id: u64, amount: i64| {
        (
            id.to_string(),
            json!({"id": id, "version": 1, "amount": amount}),
        )
    };
    let outputs = pg_output(
        "checked",
        &table,
        "      id_columns: [id]\n      version_column: version\n      columns: {id: id, version: version, amount: amount}\n",
    );
    let job = job(
        "pgcheck",
        &input,
        &outputs,
        "  commit_interval_ms: 2000\n  transaction_timeout_ms: 20000\n  on_error: fail\n",
    );

    // 500 good records go through.
    let good: Vec<(String, Value)> = (0..500).map(|i| event(i, i as i64)).collect();
    produce_json(&input, &good, None);
    let mut first = Child::spawn(&job, &[], &["--stop-after-records", "500"]);
    let status = first.wait(Duration::from_secs(120));
    assert!(status.success(), "{status:?}\n{}", first.stderr());
    assert_eq!(db.count(&format!("SELECT count(*) FROM {table}")), 500);

    // The next batch holds one record the table refuses (offset 550).
    let next: Vec<(String, Value)> = (500..600)
        .map(|i| event(i, if i == 550 { -1 } else { i as i64 }))
        .collect();
    produce_json(&input, &next, None);
    let mut second = Child::spawn(&job, &[], &[]);
    let status = second.wait(Duration::from_secs(120));
    let log = second.stderr();
    assert!(
        !status.success(),
        "the job must stop on the bad record:\n{log}"
    );
    for expected in [
        format!("record {input}[0]@550 failed"),
        "outputs[0] (checked): rejected".to_string(),
        "23514".to_string(),
        "check constraint".to_string(),
    ] {
        assert!(log.contains(&expected), "missing `{expected}` in:\n{log}");
    }
    // Nothing of that batch is committed: no row, no inbox entry, no Kafka offset.
    assert_eq!(db.count(&format!("SELECT count(*) FROM {table}")), 500);
    assert_eq!(
        db.count(&format!(
            "SELECT count(*) FROM onceflow_inbox WHERE consumer = '{}/checked'",
            job.name
        )),
        500
    );
    assert_eq!(
        committed_offsets(&format!("onceflow.{}", job.name), &input, 1),
        vec![500]
    );
}

/// The CA that signed the test server's certificate (`scripts/postgres ca`).
fn pg_ca() -> String {
    std::env::var("ONCEFLOW_TEST_PG_CA").expect(
        "ONCEFLOW_TEST_PG_CA is not set: these tests need the PostgreSQL server of scripts/postgres; run them with scripts/test",
    )
}

#[test]
fn connections_are_encrypted_and_the_server_verified_as_the_url_says() {
    let (_serial, db) = serial_db();
    let table = db.create_table("tls", "id bigint PRIMARY KEY");
    let config = sink_config(&table, "      id_columns: [id]\n      columns: {id: id}\n");
    let (by_ip, ca) = (pg_url(), pg_ca());
    let by_name = by_ip.replace("127.0.0.1", "localhost");
    // Whether the server sees the sink's session of `topology` encrypted.
    let encrypted = |topology: &str| -> Vec<bool> {
        db.query(&format!(
            "SELECT DISTINCT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) WHERE a.application_name = 'onceflow/{topology}/db'"
        ))
        .iter()
        .map(|r| r.get(0))
        .collect()
    };
    for (mode, url, tls) in [
        ("prefer", by_ip.clone(), true),
        ("disable", format!("{by_ip}?sslmode=disable"), false),
        ("require", format!("{by_ip}?sslmode=require"), true),
        (
            "verify-ca",
            format!("{by_ip}?sslmode=verify-ca&sslrootcert={ca}"),
            true,
        ),
        (
            "verify-full",
            format!("{by_name}?sslmode=verify-full&sslrootcert={ca}"),
            true,
        ),
        (
            "verify-full-ip",
            format!("{by_ip}?sslmode=verify-full&sslrootcert={ca}"),
            true,
        ),
    ] {
        // Short: the server keeps 63 bytes of an application name.
        let topology = format!("tls-{mode}-{}", rand::random::<u32>());
        let mut sink = PostgresSink::connect_url(&topology, "db", &config, &url)
            .unwrap_or_else(|e| panic!("{mode}: {e}"));
        sink.stage(&rec(1, json!({"id": 1}))).expect("staged");
        assert!(sink.flush(far()).expect("flushed"), "{mode}");
        assert_eq!(encrypted(&topology), vec![tls], "{mode}: session encrypted");
    }
    assert_eq!(db.count(&format!("SELECT count(*) FROM {table}")), 1);

    // The server's CA is not among the system's roots: verify-full without sslrootcert is
    // refused at once, as a setup error (not retried as if the server were down).
    for url in [
        format!("{by_name}?sslmode=verify-full"),
        format!("{by_name}?sslmode=verify-ca"),
    ] {
        let started = Instant::now();
        let err = PostgresSink::connect_url("tls-untrusted", "db", &config, &url)
            .err()
            .expect("an untrusted server is refused");
        assert_eq!(err.kind, SinkErrorKind::Fatal, "{err}");
        assert!(
            err.to_string().contains("certificate verify failed"),
            "{err}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "retried: {err}"
        );
    }
}

// --- Sequence gaps ----------------------------------------------------------------------------

/// A table of one sequenced row per id.
fn sequenced_table(db: &Db, prefix: &str) -> String {
    let table = table_name(prefix);
    db.exec(&format!(
        "CREATE TABLE {table} (id bigint PRIMARY KEY, seq integer NOT NULL, note text NOT NULL)"
    ));
    table
}

fn sequenced_columns(policy: &str) -> String {
    format!(
        "      id_columns: [id]\n      sequence_column: seq\n      on_sequence_gap: {policy}\n      columns: {{id: id, seq: seq, note: note}}\n      batch_size: 150\n"
    )
}

fn seq_event(id: u64, seq: u64) -> Value {
    json!({"id": id, "seq": seq, "note": format!("{id}-{seq}")})
}

/// The table's (sequence, note) per id.
fn sequenced_rows(db: &Db, table: &str) -> BTreeMap<u64, (u64, String)> {
    db.query(&format!("SELECT id, seq, note FROM {table}"))
        .iter()
        .map(|r| {
            (
                r.get::<_, i64>(0) as u64,
                (r.get::<_, i32>(1) as u64, r.get(2)),
            )
        })
        .collect()
}

#[test]
fn sink_finds_sequence_gaps_against_the_row_and_within_the_batch() {
    let (_serial, db) = serial_db();
    let table = sequenced_table(&db, "seqsink");
    let config = sink_config(&table, &sequenced_columns("dead_letter"));
    let mut sink =
        PostgresSink::connect_url(&unique("seqsink"), "db", &config, &pg_url()).expect("sink");
    let refused = |e: &onceflow::sink::SinkError| -> Vec<(i64, String)> {
        e.all()
            .map(|e| {
                let failure = e.failure();
                assert_eq!(failure.kind.name(), "sequence_gap", "{e}");
                (e.origin.as_ref().expect("origin").offset, failure.message)
            })
            .collect()
    };

    // id 1: 1, 3, 2 sorted within the batch: no gap. id 2: a first event past 1. id 3: 1, 3, 4:
    // 3 follows a hole and 4 comes after it, so both are refused; nothing is written.
    for (offset, id, seq) in [
        (0, 1, 1),
        (1, 1, 3),
        (2, 1, 2),
        (3, 2, 2),
        (4, 3, 1),
        (5, 3, 3),
        (6, 3, 4),
    ] {
        sink.stage(&rec(offset, seq_event(id, seq))).unwrap();
    }
    let e = sink.flush(far()).expect_err("gaps refused");
    assert_eq!(e.kind, SinkErrorKind::Permanent);
    assert_eq!(
        refused(&e),
        vec![
            (3, "sequence gap: id [2] has sequence 2 after 0 (missing 1) (on_sequence_gap: dead_letter)".into()),
            (5, "sequence gap: id [3] has sequence 3 after 1 (missing 2) (on_sequence_gap: dead_letter)".into()),
            (6, "sequence gap: id [3] has sequence 4 after 1 (missing 2..3) (on_sequence_gap: dead_letter)".into()),
        ]
    );
    assert!(sequenced_rows(&db, &table).is_empty());

    // Without the refused records the batch applies.
    sink.discard();
    for (offset, id, seq) in [(0, 1, 1), (1, 1, 3), (2, 1, 2), (4, 3, 1)] {
        sink.stage(&rec(offset, seq_event(id, seq))).unwrap();
    }
    assert!(sink.flush(far()).unwrap());
    let rows = sequenced_rows(&db, &table);
    assert_eq!(rows[&1], (3, "1-3".into()));
    assert_eq!(rows[&3], (1, "3-1".into()));

    // Against the stored row: an older or equal sequence is ignored, one past the next is a gap.
    sink.stage(&rec(7, seq_event(1, 2))).unwrap();
    sink.stage(&rec(8, seq_event(1, 3))).unwrap();
    sink.stage(&rec(9, seq_event(1, 5))).unwrap();
    let e = sink.flush(far()).expect_err("gap against the row");
    assert_eq!(refused(&e).iter().map(|r| r.0).collect::<Vec<_>>(), vec![9]);
    sink.discard();
    sink.stage(&rec(7, seq_event(1, 2))).unwrap();
    sink.stage(&rec(10, seq_event(1, 4))).unwrap();
    assert!(sink.flush(far()).unwrap());
    assert_eq!(sequenced_rows(&db, &table)[&1], (4, "1-4".into()));

    // The gap filled, the refused records apply (as a dead-letter replay would).
    for (offset, id, seq) in [(11, 3, 2), (5, 3, 3), (6, 3, 4), (9, 1, 5), (3, 2, 2)] {
        let offset = if offset < 11 { offset + 100 } else { offset };
        sink.stage(&rec(offset, seq_event(id, seq))).unwrap();
    }
    let e = sink.flush(far()).expect_err("id 2 still misses 1");
    assert_eq!(
        refused(&e).iter().map(|r| r.0).collect::<Vec<_>>(),
        vec![103]
    );
    sink.discard();
    for (offset, id, seq) in [(11, 3, 2), (105, 3, 3), (106, 3, 4), (109, 1, 5)] {
        sink.stage(&rec(offset, seq_event(id, seq))).unwrap();
    }
    assert!(sink.flush(far()).unwrap());
    let rows = sequenced_rows(&db, &table);
    assert_eq!((rows[&1].0, rows[&3].0, rows.get(&2)), (5, 4, None));

    // With `fail` a gap is fatal, naming the record; with `apply` it is written.
    let fail = sink_config(&table, &sequenced_columns("fail"));
    let mut sink =
        PostgresSink::connect_url(&unique("seqfail"), "db", &fail, &pg_url()).expect("sink");
    sink.stage(&rec(0, seq_event(3, 7))).unwrap();
    let e = sink.flush(far()).expect_err("fatal gap");
    assert_eq!(e.kind, SinkErrorKind::Fatal);
    assert!(
        e.to_string().contains("record orders[0]@0: sequence gap: id [3] has sequence 7 after 4 (missing 5..6) (on_sequence_gap: fail)"),
        "{e}"
    );
    sink.discard();
    let apply = sink_config(&table, &sequenced_columns("apply"));
    let mut sink =
        PostgresSink::connect_url(&unique("seqapply"), "db", &apply, &pg_url()).expect("sink");
    sink.stage(&rec(0, seq_event(3, 7))).unwrap();
    sink.stage(&rec(1, seq_event(2, 3))).unwrap();
    assert!(sink.flush(far()).unwrap());
    let rows = sequenced_rows(&db, &table);
    assert_eq!((rows[&3].0, rows[&2].0), (7, 3));
}

/// The events of the sequence-gap job tests: ids 0..200, sequences 1..=5 each, minus the
/// holes; copies of earlier events of an id (duplicates and late older ones) after them; the
/// ids interleaved at random, each id's first occurrences in increasing order (one partition
/// per id: its order is kept).
fn gap_events() -> (Vec<(String, Value)>, BTreeMap<u64, u64>) {
    let mut rng = rand::rng();
    let mut holes: BTreeMap<u64, u64> = BTreeMap::new();
    let mut queues: Vec<Vec<(String, Value)>> = Vec::new();
    for id in 0..200u64 {
        let hole = match (id % 10, id % 25) {
            (3, _) => Some(3),
            (_, 7) => Some(1),
            _ if id % 40 == 11 => Some(4),
            _ => None,
        };
        if let Some(h) = hole {
            holes.insert(id, h);
        }
        let mut sent: Vec<u64> = Vec::new();
        let mut queue = Vec::new();
        for seq in (1..=5u64).filter(|s| Some(*s) != hole) {
            queue.push((id.to_string(), seq_event(id, seq)));
            sent.push(seq);
            if rng.random_bool(0.3) {
                let again = sent[rng.random_range(0..sent.len())];
                queue.push((id.to_string(), seq_event(id, again)));
            }
        }
        queue.reverse();
        queues.push(queue);
    }
    let mut events = Vec::new();
    while !queues.is_empty() {
        let i = rng.random_range(0..queues.len());
        match queues[i].pop() {
            Some(e) => events.push(e),
            None => {
                queues.swap_remove(i);
            }
        }
    }
    (events, holes)
}

/// `GET` on the metrics endpoint; the sum of the samples of `name` with `label`.
fn scrape(addr: &str, name: &str, label: &str) -> Option<f64> {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET /metrics HTTP/1.1\r\nhost: test\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let mut found = None;
    for line in out.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let (series_name, labels) = series.split_once('{').unwrap_or((series, ""));
        if series_name == name && labels.contains(label) {
            *found.get_or_insert(0.0) += value.parse::<f64>().ok()?;
        }
    }
    found
}

#[test]
fn sequence_gaps_are_counted_dead_lettered_or_stop_the_job_as_on_sequence_gap_says() {
    let (_serial, db) = serial_db();
    let input = unique("gaps-in");
    create_topics(&[&input], 2);
    let (events, holes) = gap_events();
    assert_eq!(holes.len(), 20 + 8 + 5);
    produce_json(&input, &events, None);
    let n = events.len() as i64;
    let seq_of = |v: &Value| v["seq"].as_u64().expect("seq");
    let id_of = |v: &Value| v["id"].as_u64().expect("id");

    // apply: every id at its last sequence; one missing sequence counted per hole.
    let table = sequenced_table(&db, "gapsapply");
    let job_apply = job(
        "gapsapply",
        &input,
        &pg_output("seqs", &table, &sequenced_columns("apply")),
        "",
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let addr = format!("127.0.0.1:{port}");
    let child = Child::spawn(&job_apply, &[], &["--metrics-addr", &addr]);
    let group = format!("onceflow.{}", job_apply.name);
    let done = wait_until(Duration::from_secs(120), || {
        committed_offsets(&group, &input, 2).iter().sum::<i64>() == n
    });
    let counted = scrape(&addr, "onceflow_sequence_gaps_total", "output=\"seqs\"");
    let log = child.stderr();
    child.terminate();
    assert!(done, "the job did not consume everything:\n{log}");
    assert_eq!(counted, Some(holes.len() as f64), "{log}");
    assert!(log.contains("sequence gap"), "{log}");
    let expected: BTreeMap<u64, (u64, String)> =
        (0..200).map(|id| (id, (5, format!("{id}-5")))).collect();
    assert_eq!(sequenced_rows(&db, &table), expected);

    // dead_letter: every record of an id from its hole on goes to the dead-letter topic, and
    // the row stays before the hole (none for a hole at 1).
    let table = sequenced_table(&db, "gapsdlq");
    let job_dlq = job(
        "gapsdlq",
        &input,
        &pg_output("seqs", &table, &sequenced_columns("dead_letter")),
        "",
    );
    let dlq_topic = format!("{}.dlq", job_dlq.name);
    create_topics(&[&dlq_topic], 1);
    let child = Child::spawn(&job_dlq, &[], &[]);
    let group = format!("onceflow.{}", job_dlq.name);
    let done = wait_until(Duration::from_secs(120), || {
        committed_offsets(&group, &input, 2).iter().sum::<i64>() == n
    });
    let log = child.stderr();
    child.terminate();
    assert!(done, "the job did not consume everything:\n{log}");
    let mut expected_letters: Vec<(u64, u64)> = events
        .iter()
        .map(|(_, v)| (id_of(v), seq_of(v)))
        .filter(|(id, seq)| holes.get(id).is_some_and(|h| seq > h))
        .collect();
    expected_letters.sort();
    let letters = read_records(&dlq_topic, 1, "read_committed");
    let mut lettered: Vec<(u64, u64)> = letters
        .iter()
        .map(|r| {
            let v: Value = serde_json::from_str(r.value.as_deref().expect("value")).expect("json");
            (id_of(&v), seq_of(&v))
        })
        .collect();
    lettered.sort();
    assert_eq!(lettered, expected_letters);
    for letter in &letters {
        let meta = |k: &str| letter.headers.get(k).map_or("", String::as_str);
        assert_eq!(meta(onceflow::dlq::H_KIND), "sequence_gap");
        assert_eq!(meta(onceflow::dlq::H_STAGE), "outputs[0] (seqs)");
    }
    let expected: BTreeMap<u64, (u64, String)> = (0..200)
        .filter_map(|id| {
            let last = holes.get(&id).map_or(5, |h| h - 1);
            (last > 0).then(|| (id, (last, format!("{id}-{last}"))))
        })
        .collect();
    assert_eq!(sequenced_rows(&db, &table), expected);

    // fail: the job stops naming a record past a hole; nothing past a hole is written.
    let table = sequenced_table(&db, "gapsfail");
    let job_fail = job(
        "gapsfail",
        &input,
        &pg_output("seqs", &table, &sequenced_columns("fail")),
        "",
    );
    let mut child = Child::spawn(&job_fail, &[], &[]);
    let status = child.wait(Duration::from_secs(120));
    let log = child.stderr();
    assert!(!status.success(), "the job must stop on a gap:\n{log}");
    for part in [
        format!("record {input}["),
        "(on_sequence_gap: fail)".to_string(),
    ] {
        assert!(log.contains(&part), "missing `{part}` in:\n{log}");
    }
    for (id, (seq, _)) in sequenced_rows(&db, &table) {
        assert!(
            holes.get(&id).is_none_or(|h| seq < *h),
            "id {id} at {seq} past its hole"
        );
    }
}
