//! Lineage and `onceflow reconcile` on the real broker and PostgreSQL: a clean run of a job
//! that filters, fans out (explode, two topics, a table) and dead-letters reconciles to 0
//! missing, 0 duplicated and 0 hanging with exit 0; a record produced twice under one origin,
//! input offsets committed with no trace and a transaction left open each make it fail, with
//! their counts.

mod common;

use std::collections::BTreeMap;
use std::process::{Command, Output};
use std::time::Duration;

use common::*;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde_json::Value;

const PARTITIONS: i32 = 4;
const PG_URL_ENV: &str = "ONCEFLOW_TEST_PG_URL";
const RECORDS: u64 = 2_000;

/// What the input holds: ids 0.., each a JSON object with `items` (1 to 3 of them), every
/// tenth kind `drop` (filtered), every fiftieth (from 13) not JSON (dead-lettered), and an
/// event id header `message-id: evt-<id>`.
fn is_poison(id: u64) -> bool {
    id % 50 == 13
}
fn is_dropped(id: u64) -> bool {
    id % 10 == 7
}
fn items(id: u64) -> u64 {
    id % 3 + 1
}

fn produce_input(topic: &str, ids: impl IntoIterator<Item = u64>) {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .create()
        .expect("producer");
    for id in ids {
        let value = if is_poison(id) {
            format!("not json {id}")
        } else {
            let list: Vec<String> = (0..items(id)).map(|i| i.to_string()).collect();
            let kind = if is_dropped(id) { "drop" } else { "keep" };
            format!(
                r#"{{"id":{id},"kind":"{kind}","items":[{}]}}"#,
                list.join(",")
            )
        };
        let key = id.to_string();
        let event = format!("evt-{id}");
        let headers = OwnedHeaders::new().insert(Header {
            key: "message-id",
            value: Some(&event),
        });
        let mut record = BaseRecord::<str, str>::to(topic)
            .key(&key)
            .payload(&value)
            .headers(headers);
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
    producer.flush(Duration::from_secs(60)).expect("flush");
}

struct Fixture {
    _dir: tempfile::TempDir,
    path: std::path::PathBuf,
    name: String,
    input: String,
    a: String,
    b: String,
    dlq: String,
    table: Option<String>,
}

/// A job from `in` through filter, explode and route: every item to `a` (and the table when
/// `with_postgres`), items of even ids also to `b`; poison to the dead-letter topic.
fn fixture(prefix: &str, with_postgres: bool) -> Fixture {
    fixture_shaped(prefix, with_postgres, false)
}

/// With `one_to_one`, the job only filters, to `a` (one record of each kept input record).
fn fixture_shaped(prefix: &str, with_postgres: bool, one_to_one: bool) -> Fixture {
    let name = unique(prefix);
    let input = unique(&format!("{prefix}-in"));
    let a = unique(&format!("{prefix}-a"));
    let b = unique(&format!("{prefix}-b"));
    let dlq = unique(&format!("{prefix}-dlq"));
    create_topics(&[&input, &a, &b], PARTITIONS);
    create_topics(&[&dlq], 1);
    let (table, db_output, db_route) = if with_postgres {
        let table = unique(&format!("{prefix}_t")).replace('-', "_");
        pg_exec(&format!(
            "CREATE TABLE {table} (id bigint NOT NULL, item bigint NOT NULL, PRIMARY KEY (id, item))"
        ));
        let output = format!(
            "  - name: db\n    postgres:\n      url_env: {PG_URL_ENV}\n      table: {table}\n      id_columns: [id, item]\n      columns: {{id: id, item: item}}\n"
        );
        (Some(table), output, ", db")
    } else {
        (None, String::new(), "")
    };
    let (steps, outputs) = if one_to_one {
        (String::new(), format!("  - name: a\n    topic: {a}\n"))
    } else {
        (
            format!(
                "  - explode: {{field: items, as: item}}\n  - route:\n      mode: all\n      routes:\n        - {{when: 'true', to: [a{db_route}]}}\n        - {{when: 'value.id % 2 == 0', to: [b]}}\n      default: []\n"
            ),
            format!("  - name: a\n    topic: {a}\n  - name: b\n    topic: {b}\n{db_output}"),
        )
    };
    let yaml = format!(
        "name: {name}\ninputs:\n  - topic: {input}\n    codec: json\npipeline:\n  - filter: 'value.kind != \"drop\"'\n{steps}outputs:\n{outputs}dead_letter:\n  topic: {dlq}\nruntime:\n  session_timeout_ms: 10000\n  group_protocol: {}\n",
        group_protocol()
    );
    let (dir, path) = topology_file(&yaml);
    Fixture {
        _dir: dir,
        path,
        name,
        input,
        a,
        b,
        dlq,
        table,
    }
}

fn pg_exec(sql: &str) {
    let url = std::env::var(PG_URL_ENV).expect("ONCEFLOW_TEST_PG_URL is not set");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .expect("connect");
        let task = tokio::spawn(connection);
        client
            .batch_execute(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        drop(client);
        let _ = task.await;
    });
}

fn pg_count(sql: &str) -> i64 {
    let url = std::env::var(PG_URL_ENV).expect("ONCEFLOW_TEST_PG_URL is not set");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .expect("connect");
        tokio::spawn(connection);
        client
            .query_one(sql, &[])
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
            .get(0)
    })
}

/// Runs the job as a process until every kept id is in `a`, then stops it with SIGTERM.
fn run_job(f: &Fixture) {
    let kept = (0..RECORDS)
        .filter(|id| !is_poison(*id) && !is_dropped(*id))
        .count();
    let env: Vec<(&str, String)> =
        vec![(PG_URL_ENV, std::env::var(PG_URL_ENV).unwrap_or_default())];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let job = spawn_job(&f.path, "i0", &env);
    let seen = wait_for_distinct(&f.a, PARTITIONS, kept, Duration::from_secs(120));
    assert_eq!(seen, kept, "not every kept id reached the output in time");
    terminate(job);
}

fn reconcile(f: &Fixture, extra: &[&str]) -> (Output, Value) {
    let output = Command::new(env!("CARGO_BIN_EXE_onceflow"))
        .arg("reconcile")
        .arg(&f.path)
        .args(["--bootstrap-servers", &bootstrap(), "--json"])
        .args(extra)
        .env("RUST_LOG", "warn")
        .output()
        .expect("onceflow reconcile");
    let report: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON report ({e}); stderr: {}",
            String::from_utf8_lossy(&output.stderr)
        )
    });
    (output, report)
}

/// The sum of a field over the report's partitions.
fn total(report: &Value, field: &str) -> u64 {
    report["partitions"]
        .as_array()
        .expect("partitions")
        .iter()
        .map(|p| p[field].as_u64().expect(field))
        .sum()
}

fn expected_counts() -> (u64, u64, u64) {
    let filtered = (0..RECORDS)
        .filter(|id| is_dropped(*id) && !is_poison(*id))
        .count() as u64;
    let poison = (0..RECORDS).filter(|id| is_poison(*id)).count() as u64;
    (RECORDS - filtered - poison, filtered, poison)
}

#[test]
fn a_clean_run_with_fan_out_filters_and_dead_letters_reconciles() {
    let f = fixture("rec-clean", true);
    produce_input(&f.input, 0..RECORDS);
    run_job(&f);

    // Lineage: every output record names its origin and event id.
    let records = read_records(&f.a, PARTITIONS, "read_committed");
    let per_origin = records.iter().fold(BTreeMap::new(), |mut m, r| {
        let origin = origin_of(r);
        assert!(
            !r.headers.contains_key("onceflow.origin.topic"),
            "one lineage header, not three"
        );
        *m.entry(origin.clone()).or_insert(0u64) += 1;
        let id: u64 = r
            .key
            .as_deref()
            .unwrap_or_default()
            .parse()
            .expect("id key");
        assert_eq!(r.headers["onceflow.origin.id"], format!("evt-{id}"));
        assert_eq!(origin.0, f.input);
        m
    });
    assert!(per_origin.iter().all(|((_, _, _), n)| (1..=3).contains(n)));
    let letters = read_records(&f.dlq, 1, "read_committed");
    assert_eq!(letters.len() as u64, expected_counts().2);
    assert!(
        letters
            .iter()
            .all(|l| l.headers["onceflow.origin.id"].starts_with("evt-"))
    );
    // The inbox records the origin of every message of the table.
    let table = f.table.as_deref().expect("a table");
    let consumer = format!("{}/db", f.name);
    assert_eq!(
        pg_count(&format!(
            "SELECT count(*) FROM onceflow_inbox i JOIN onceflow_inbox_origins o USING (consumer, message_id) WHERE consumer = '{consumer}' AND o.origin_topic = '{}'",
            f.input
        )),
        expected_counts().0 as i64
    );
    assert_eq!(
        pg_count(&format!("SELECT count(*) FROM {table}")),
        (0..RECORDS)
            .filter(|id| !is_poison(*id) && !is_dropped(*id))
            .map(items)
            .sum::<u64>() as i64
    );

    let (output, report) = reconcile(&f, &[]);
    let (produced, filtered, poison) = expected_counts();
    assert!(
        output.status.success(),
        "reconcile failed: {report:#}\nstderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(report["ok"], true);
    assert_eq!(total(&report, "consumed"), RECORDS);
    assert_eq!(total(&report, "produced"), produced);
    assert_eq!(total(&report, "filtered"), filtered);
    assert_eq!(total(&report, "dead_lettered"), poison);
    assert_eq!(total(&report, "missing"), 0);
    assert_eq!(total(&report, "duplicated"), 0);
    assert_eq!(report["hanging"].as_array().map(Vec::len), Some(0));
    // A marker on each partition of a, b and the dead-letter topic, all visible.
    assert_eq!(report["markers"], (2 * PARTITIONS + 1) as u64);
    let streams = report["streams"].as_array().expect("streams");
    let db = streams
        .iter()
        .find(|s| s["kind"] == "postgres")
        .expect("the table is checked");
    assert_eq!(db["records"], produced);

    // A second reconciliation passes over the first one's markers.
    let (again, report) = reconcile(&f, &[]);
    assert!(again.status.success(), "{report:#}");
    assert_eq!(total(&report, "produced"), produced);
}

/// The origin an output names in its `onceflow.origin` header.
fn origin_of(r: &ReadRecord) -> (String, i32, i64) {
    named_origin(r).unwrap_or_else(|| panic!("no readable onceflow.origin in {:?}", r.headers))
}

/// `r` with its lineage in the three `onceflow.origin.topic/partition/offset` headers that
/// records written by earlier versions carry.
fn in_three_headers(r: &ReadRecord) -> ReadRecord {
    let (topic, partition, offset) = origin_of(r);
    let mut old = r.clone();
    old.headers.remove("onceflow.origin");
    old.headers.insert("onceflow.origin.topic".into(), topic);
    old.headers
        .insert("onceflow.origin.partition".into(), partition.to_string());
    old.headers
        .insert("onceflow.origin.offset".into(), offset.to_string());
    old
}

/// Writes `record` again to `topic[partition]` with the same headers, outside any
/// transaction.
fn produce_again(topic: &str, r: &ReadRecord) {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .expect("producer");
    let mut headers = OwnedHeaders::new();
    for (k, v) in &r.headers {
        headers = headers.insert(Header {
            key: k,
            value: Some(v),
        });
    }
    let key = r.key.clone().unwrap_or_default();
    let value = r.value.clone().unwrap_or_default();
    producer
        .send(
            BaseRecord::<str, str>::to(topic)
                .partition(r.partition)
                .key(&key)
                .payload(&value)
                .headers(headers),
        )
        .map_err(|(e, _)| e)
        .expect("send");
    producer.flush(Duration::from_secs(30)).expect("flush");
}

/// Commits the job's group past the end of every input partition, as if the job had
/// consumed what is there now; returns the offsets skipped per partition.
fn commit_to_end(f: &Fixture, group: &str) -> BTreeMap<i32, (i64, i64)> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition(&f.input, p);
    }
    let committed = consumer
        .committed_offsets(tpl, Duration::from_secs(10))
        .expect("committed");
    let mut skipped = BTreeMap::new();
    let mut to = TopicPartitionList::new();
    for e in committed.elements() {
        let (_, high) = consumer
            .fetch_watermarks(&f.input, e.partition(), Duration::from_secs(10))
            .expect("watermarks");
        let from = match e.offset() {
            Offset::Offset(o) => o,
            _ => 0,
        };
        if high > from {
            skipped.insert(e.partition(), (from, high));
        }
        to.add_partition_offset(&f.input, e.partition(), Offset::Offset(high))
            .expect("tpl");
    }
    // The stopped job's static member holds the group until its session times out: until
    // then the broker refuses a commit from outside it.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        match consumer.commit(&to, rdkafka::consumer::CommitMode::Sync) {
            Ok(()) => break,
            Err(e) if std::time::Instant::now() < deadline => {
                eprintln!("commit refused for now ({e}); the old member's session is still open");
                std::thread::sleep(Duration::from_secs(1));
            }
            Err(e) => panic!("commit: {e}"),
        }
    }
    skipped
}

#[test]
fn a_duplicate_and_offsets_committed_without_trace_fail_the_reconciliation() {
    let f = fixture("rec-fail", false);
    produce_input(&f.input, 0..RECORDS);
    run_job(&f);
    let (clean, report) = reconcile(&f, &[]);
    assert!(
        clean.status.success(),
        "the run itself is clean: {report:#}"
    );

    // One record of b written again with its origin, in the three-header form records written
    // by earlier versions carry: one origin duplicated, read from either form.
    let b = read_records(&f.b, PARTITIONS, "read_committed");
    let stamped: Vec<&ReadRecord> = b
        .iter()
        .filter(|r| r.headers.contains_key("onceflow.origin"))
        .collect();
    let again = stamped[stamped.len() / 2];
    let (_, dup_partition, dup_offset) = origin_of(again);
    produce_again(&f.b, &in_three_headers(again));
    // Ten more good input records committed by hand, with no job to process them: missing.
    let good = (10_000..10_100).filter(|id| !is_poison(*id) && !is_dropped(*id));
    produce_input(&f.input, good.take(10));
    let group = format!("onceflow.{}", f.name);
    let skipped = commit_to_end(&f, &group);
    let skipped_count: i64 = skipped.values().map(|(a, b)| b - a).sum();
    assert_eq!(skipped_count, 10);

    let (output, report) = reconcile(&f, &[]);
    assert!(!output.status.success(), "a mismatch must fail: {report:#}");
    assert_eq!(report["ok"], false);
    assert_eq!(total(&report, "consumed"), RECORDS + 10);
    assert_eq!(total(&report, "missing"), 10, "{report:#}");
    assert_eq!(total(&report, "duplicated"), 1, "{report:#}");
    for p in report["partitions"].as_array().expect("partitions") {
        let partition = p["partition"].as_i64().expect("partition") as i32;
        let missing = match skipped.get(&partition) {
            Some((from, to)) if to - from == 1 => from.to_string(),
            Some((from, to)) => format!("{from}-{}", to - 1),
            None => String::new(),
        };
        assert_eq!(p["missing_offsets"], missing.as_str(), "{p:#}");
        if partition == dup_partition {
            assert_eq!(p["duplicated_offsets"], dup_offset.to_string().as_str());
        } else {
            assert_eq!(p["duplicated_offsets"], "");
        }
    }
    assert_eq!(report["hanging"].as_array().map(Vec::len), Some(0));
}

/// A topology making one record of each input record on one output is decided by its traces:
/// the pipeline is re-run only over the records that left none (the filtered ones here), the
/// counts are those of a re-run over every record (`--rerun-all`), and a duplicate and
/// offsets committed without a trace are still found.
#[test]
fn a_one_to_one_topology_reruns_the_pipeline_only_over_records_without_a_trace() {
    let f = fixture_shaped("rec-one", false, true);
    produce_input(&f.input, 0..RECORDS);
    run_job(&f);
    let (produced, filtered, poison) = expected_counts();

    let (output, traced) = reconcile(&f, &[]);
    assert!(output.status.success(), "{traced:#}");
    assert_eq!(traced["pipeline_rerun"], "untraced");
    assert_eq!(traced["pipeline_runs"], filtered, "{traced:#}");
    let (output, all) = reconcile(&f, &["--rerun-all"]);
    assert!(output.status.success(), "{all:#}");
    assert_eq!(all["pipeline_rerun"], "all");
    assert_eq!(all["pipeline_runs"], RECORDS);
    for report in [&traced, &all] {
        assert_eq!(total(report, "consumed"), RECORDS);
        assert_eq!(total(report, "produced"), produced);
        assert_eq!(total(report, "filtered"), filtered);
        assert_eq!(total(report, "dead_lettered"), poison);
    }
    assert_eq!(traced["partitions"], all["partitions"]);

    // One record of a written again, and ten input records committed with no trace.
    let a = read_records(&f.a, PARTITIONS, "read_committed");
    produce_again(&f.a, &a[a.len() / 2]);
    let good = (10_000..10_100).filter(|id| !is_poison(*id) && !is_dropped(*id));
    produce_input(&f.input, good.take(10));
    commit_to_end(&f, &format!("onceflow.{}", f.name));
    let (output, report) = reconcile(&f, &[]);
    assert!(!output.status.success(), "a mismatch must fail: {report:#}");
    assert_eq!(total(&report, "missing"), 10, "{report:#}");
    assert_eq!(total(&report, "duplicated"), 1, "{report:#}");
    assert_eq!(report["pipeline_runs"], filtered + 10, "{report:#}");
}

#[test]
fn a_transaction_left_open_on_an_output_is_reported_hanging() {
    let f = fixture("rec-hang", false);
    produce_input(&f.input, 0..RECORDS);
    run_job(&f);

    // A transaction left open on partition 1 of a, as a dead producer would leave it.
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("transactional.id", unique("rec-hang-txn"))
        .set("transaction.timeout.ms", "60000")
        .create()
        .expect("producer");
    producer
        .init_transactions(Duration::from_secs(30))
        .expect("init");
    producer.begin_transaction().expect("begin");
    producer
        .send(
            BaseRecord::<str, str>::to(&f.a)
                .partition(1)
                .payload("open"),
        )
        .map_err(|(e, _)| e)
        .expect("send");
    producer.flush(Duration::from_secs(30)).expect("flush");

    let (output, report) = reconcile(&f, &["--marker-timeout", "3s"]);
    assert!(
        !output.status.success(),
        "a hanging transaction must fail: {report:#}"
    );
    assert_eq!(
        report["hanging"],
        serde_json::json!([format!("{}[1]", f.a)]),
        "{report:#}"
    );
    // What was committed before it still reconciles.
    assert_eq!(total(&report, "missing"), 0, "{report:#}");
    assert_eq!(total(&report, "duplicated"), 0, "{report:#}");
    // Best effort: the broker aborts it on its timeout anyway.
    let _ = producer.abort_transaction(Duration::from_secs(30));
    let _ = (&f.b, &f.dlq, &f.table);
}

/// Waits until the job's group has committed `total` input records in all.
fn wait_committed(group: &str, topic: &str, total: i64) {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", group)
        .create()
        .expect("consumer");
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let mut tpl = TopicPartitionList::new();
        for p in 0..PARTITIONS {
            tpl.add_partition(topic, p);
        }
        let committed: i64 = consumer
            .committed_offsets(tpl, Duration::from_secs(10))
            .expect("committed")
            .elements()
            .iter()
            .map(|e| match e.offset() {
                Offset::Offset(o) => o,
                _ => 0,
            })
            .sum();
        if committed >= total {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "only {committed} of {total} committed"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_table_keyed_by_event_id_accounts_for_redeliveries_through_its_inbox() {
    let name = unique("rec-keyed");
    let input = unique("rec-keyed-in");
    let a = unique("rec-keyed-a");
    create_topics(&[&input, &a], PARTITIONS);
    let table = unique("rec_keyed_t").replace('-', "_");
    pg_exec(&format!("CREATE TABLE {table} (id bigint PRIMARY KEY)"));
    let yaml = format!(
        "name: {name}\ninputs:\n  - topic: {input}\n    codec: json\npipeline:\n  - filter: 'value.kind != \"drop\"'\n  - route: {{routes: [{{when: 'true', to: [a, db]}}], default: []}}\noutputs:\n  - name: a\n    topic: {a}\n  - name: db\n    postgres:\n      url_env: {PG_URL_ENV}\n      table: {table}\n      id_columns: [id]\n      columns: {{id: id}}\n      event_id: {{header: message-id}}\ndead_letter:\n  topic: {a}-unused-dlq\nruntime:\n  session_timeout_ms: 10000\n  group_protocol: {}\n",
        group_protocol()
    );
    let (_dir, path) = topology_file(&yaml);
    // 200 events, then 20 of them delivered again (same message-id, new offsets).
    let good: Vec<u64> = (0..300)
        .filter(|id| !is_poison(*id) && !is_dropped(*id))
        .take(200)
        .collect();
    produce_input(&input, good.iter().copied());
    produce_input(&input, good.iter().copied().take(20));
    let pg = std::env::var(PG_URL_ENV).unwrap_or_default();
    let job = spawn_job(&path, "i0", &[(PG_URL_ENV, pg.as_str())]);
    wait_committed(&format!("onceflow.{name}"), &input, 220);
    terminate(job);
    let f = Fixture {
        _dir,
        path,
        name: name.clone(),
        input,
        a,
        b: String::new(),
        dlq: String::new(),
        table: Some(table),
    };

    let (output, report) = reconcile(&f, &["--no-markers"]);
    assert!(output.status.success(), "{report:#}");
    assert_eq!(total(&report, "consumed"), 220);
    assert_eq!(
        total(&report, "produced"),
        220,
        "redeliveries are absorbed: {report:#}"
    );
    assert_eq!(total(&report, "missing"), 0);

    // An event's inbox entry lost (say, expired): its record is missing from the table.
    let lost = good[100];
    pg_exec(&format!(
        "DELETE FROM onceflow_inbox WHERE consumer = '{name}/db' AND message_id = 'evt-{lost}';
         DELETE FROM onceflow_inbox_origins WHERE consumer = '{name}/db' AND message_id = 'evt-{lost}'"
    ));
    let (output, report) = reconcile(&f, &["--no-markers"]);
    assert!(!output.status.success(), "{report:#}");
    assert_eq!(total(&report, "missing"), 1, "{report:#}");
    assert_eq!(total(&report, "produced"), 219);
}

#[test]
fn an_output_without_lineage_carries_no_origin_and_is_not_checked() {
    let name = unique("rec-off");
    let input = unique("rec-off-in");
    let a = unique("rec-off-a");
    create_topics(&[&input, &a], PARTITIONS);
    let yaml = format!(
        "name: {name}\ninputs:\n  - topic: {input}\n    codec: json\noutputs:\n  - topic: {a}\n    lineage: false\nruntime:\n  session_timeout_ms: 10000\n  group_protocol: {}\n",
        group_protocol()
    );
    let (_dir, path) = topology_file(&yaml);
    let ids: Vec<u64> = (0..300).filter(|id| !is_poison(*id)).take(200).collect();
    produce_input(&input, ids.iter().copied());
    let job = spawn_job(&path, "i0", &[]);
    assert_eq!(
        wait_for_distinct(&a, PARTITIONS, ids.len(), Duration::from_secs(120)),
        ids.len()
    );
    terminate(job);
    let records = read_records(&a, PARTITIONS, "read_committed");
    assert_eq!(records.len(), ids.len());
    assert!(
        records
            .iter()
            .all(|r| !r.headers.keys().any(|k| k.starts_with("onceflow.origin"))),
        "no lineage headers with lineage: false"
    );
    assert!(records.iter().all(|r| r.headers.contains_key("message-id")));

    let f = Fixture {
        _dir,
        path,
        name,
        input,
        a: a.clone(),
        b: String::new(),
        dlq: String::new(),
        table: None,
    };
    let (output, report) = reconcile(&f, &[]);
    assert!(output.status.success(), "{report:#}");
    assert_eq!(total(&report, "unchecked"), ids.len() as u64);
    assert_eq!(total(&report, "produced"), 0);
    assert_eq!(report["unchecked_outputs"], serde_json::json!([a]));
}
