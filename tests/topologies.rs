//! Example topologies of `topologies/` run end to end on the real broker, in-process: their
//! outputs are checked by content, and exactly-once by ids (read_committed, set equality, no
//! duplicates). Topic names come in through the files' `${VAR:-default}` variables.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::*;
use onceflow::engine::{self, EngineError};
use onceflow::instance::{Identity, RunOptions, Summary};
use onceflow::load;
use onceflow::topology::Topology;
use onceflow::topology::env::Strictness;
use onceflow::validate;

const PARTITIONS: i32 = 3;

/// Loads `topologies/<file>` with `vars` as its whole environment, in a group of its own.
fn load(file: &str, vars: &[(&str, &str)]) -> Topology {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("topologies")
        .join(file);
    let text = std::fs::read_to_string(&path).expect("read topology");
    let vars: BTreeMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let (mut topology, _) =
        load::load_text(&text, file, &|n| vars.get(n).cloned(), Strictness::Strict)
            .into_result()
            .unwrap_or_else(|d| panic!("{d:#?}"));
    topology.group_id = Some(unique("group"));
    topology.runtime.session_timeout_ms = 10_000;
    topology
}

/// Runs the job on a thread until each `(topic, n)` of `visible` shows `n` distinct ids to
/// read_committed, then stops it as SIGTERM would. With nothing to wait for, waits for the
/// job to stop by itself.
fn run_until_visible(
    topology: &Topology,
    visible: &[(&str, usize)],
) -> Result<Summary, EngineError> {
    onceflow::telemetry::init_tracing(false);
    let shutdown = Arc::new(AtomicBool::new(false));
    let handle = {
        let topology = topology.clone();
        let shutdown = Arc::clone(&shutdown);
        let identity = Identity {
            bootstrap_servers: bootstrap(),
            instance_id: unique("i"),
        };
        std::thread::spawn(move || {
            engine::run(&topology, &identity, &RunOptions::default(), &shutdown)
        })
    };
    let timeout = Duration::from_secs(120);
    for (topic, expected) in visible {
        let seen = wait_for_distinct_while(topic, PARTITIONS, *expected, timeout, &|| {
            !handle.is_finished()
        });
        assert!(
            seen == *expected || handle.is_finished(),
            "{topic}: {seen} of {expected} ids visible in time"
        );
    }
    let deadline = std::time::Instant::now() + timeout;
    while visible.is_empty() && !handle.is_finished() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    shutdown.store(true, Ordering::Relaxed);
    handle.join().expect("job thread")
}

fn json(text: &Option<String>) -> serde_json::Value {
    serde_json::from_str(text.as_deref().expect("a value")).expect("JSON value")
}

fn ids(records: &[ReadRecord]) -> Vec<u64> {
    records
        .iter()
        .map(|r| {
            r.key
                .as_deref()
                .and_then(|k| k.parse().ok())
                .expect("numeric key")
        })
        .collect()
}

#[test]
fn orders_are_routed_by_status_and_rekeyed_exactly_once() {
    let input = unique("orders");
    let [paid, cancelled, other] =
        ["paid", "cancelled", "other"].map(|n| unique(&format!("orders-{n}")));
    create_topics(&[&input, &paid, &cancelled, &other], PARTITIONS);
    let topology = load(
        "orders.yaml",
        &[
            ("ORDERS_TOPIC", &input),
            ("PAID_TOPIC", &paid),
            ("CANCELLED_TOPIC", &cancelled),
            ("OTHER_TOPIC", &other),
        ],
    );
    let statuses = [
        "PAID",
        "cancelled",
        "Refunded",
        "created",
        "paid",
        "shipped",
    ];
    let n: u64 = 3_000;
    let mut expected: BTreeMap<&str, BTreeSet<u64>> = BTreeMap::new();
    produce_records(
        &input,
        (0..n).map(|id| {
            let status = statuses[(id % 6) as usize];
            let out = match status.to_lowercase().as_str() {
                "paid" => "paid",
                "cancelled" | "refunded" => "cancelled",
                _ => "other",
            };
            expected.entry(out).or_default().insert(id);
            // keyed by customer: the job re-keys by order id
            let value = format!(
                r#"{{"order_id":{id},"status":"{status}","items":[{{"sku":"a"}}],"internal":{{"x":1}}}}"#
            );
            (Some(format!("customer-{}", id % 17)), value)
        }),
    );

    let summary = run_until_visible(
        &topology,
        &[
            (&paid, expected["paid"].len()),
            (&cancelled, expected["cancelled"].len()),
            (&other, expected["other"].len()),
        ],
    )
    .expect("job result");
    assert_eq!(summary.txn.records_committed, n);
    assert_eq!(summary.txn.outputs_committed, n);
    assert_eq!(summary.skipped, 0);

    for (name, topic) in [
        ("paid", &paid),
        ("cancelled", &cancelled),
        ("other", &other),
    ] {
        let records = read_records(topic, PARTITIONS, "read_committed");
        assert_exactly_once(&expected[name], &ids(&records));
        for r in &records {
            let v = json(&r.value);
            let status = v["status"].as_str().expect("status");
            assert_eq!(status, status.to_lowercase(), "{v}");
            match name {
                "paid" => assert_eq!(status, "paid"),
                "cancelled" => assert!(["cancelled", "refunded"].contains(&status)),
                _ => assert!(["created", "shipped"].contains(&status)),
            }
            assert_eq!(v["item_count"], 1, "{v}");
            assert!(v.get("internal").is_none(), "{v}");
            assert_eq!(r.key.as_deref(), Some(v["order_id"].to_string().as_str()));
            assert_eq!(r.headers["event-type"], format!("order.{status}"));
        }
        // Re-keyed by order id: every event of one order in one partition.
        let mut partition_of: BTreeMap<&str, i32> = BTreeMap::new();
        for r in &records {
            let p = *partition_of
                .entry(r.key.as_deref().unwrap_or_default())
                .or_insert(r.partition);
            assert_eq!(p, r.partition);
        }
    }
}

#[test]
fn order_lines_fan_out_exactly_once() {
    let input = unique("lines-in");
    let output = unique("lines-out");
    create_topics(&[&input, &output], PARTITIONS);
    let topology = load(
        "order-lines.yaml",
        &[("ORDERS_TOPIC", &input), ("LINES_TOPIC", &output)],
    );
    let orders: u64 = 1_500;
    let mut expected = BTreeSet::new();
    let mut totals = BTreeMap::new();
    produce_records(
        &input,
        (0..orders).map(|order| {
            // 0 to 3 lines; the SKU is the line's id
            let lines: Vec<String> = (0..order % 4)
                .map(|j| {
                    let sku = order * 10 + j;
                    expected.insert(sku);
                    totals.insert(sku, (j + 1) as f64 * 2.5);
                    format!(r#"{{"sku":"{sku}","qty":{},"unit_price":2.5}}"#, j + 1)
                })
                .collect();
            (
                Some(order.to_string()),
                format!(r#"{{"order_id":{order},"items":[{}]}}"#, lines.join(",")),
            )
        }),
    );

    let summary = run_until_visible(&topology, &[(&output, expected.len())]).expect("job result");
    assert_eq!(summary.txn.records_committed, orders);
    assert_eq!(summary.txn.outputs_committed, expected.len() as u64);

    let records = read_records(&output, PARTITIONS, "read_committed");
    assert_exactly_once(&expected, &ids(&records));
    for r in &records {
        let v = json(&r.value);
        let sku: u64 = r
            .key
            .as_deref()
            .and_then(|k| k.parse().ok())
            .expect("sku key");
        assert_eq!(v["line"]["sku"], sku.to_string(), "{v}");
        assert_eq!(v["line"]["total"].as_f64(), Some(totals[&sku]), "{v}");
        assert!(v.get("items").is_none(), "{v}");
        assert_eq!(r.headers["order-id"], (sku / 10).to_string());
    }
}

#[test]
fn clicks_skip_bad_records_when_told_to() {
    // clicks.yaml sets `runtime.on_error: skip`: a record that is not JSON and one without
    // the fields the filter reads are logged, counted and committed without output.
    let input = unique("clicks-in");
    let output = unique("clicks-out");
    create_topics(&[&input, &output], PARTITIONS);
    let topology = load(
        "clicks.yaml",
        &[("CLICKS_TOPIC", &input), ("PROJECTED_TOPIC", &output)],
    );
    let n: u64 = 2_000;
    let mut expected = BTreeSet::new();
    let mut records: Vec<(Option<String>, String)> = (0..n)
        .map(|id| {
            let bot = id % 10 == 3;
            if !bot {
                expected.insert(id);
            }
            let agent = if bot { "SomeBot/1.0" } else { "Mozilla/5.0" };
            (
                None,
                format!(
                    r#"{{"click_id":{id},"type":"click","ts":"2026-03-01T10:00:00Z","user":{{"id":"{id}"}},"page":{{"url":"/p/{id}"}},"user_agent":"{agent}","ip":"192.0.2.1"}}"#
                ),
            )
        })
        .collect();
    records.insert(500, (None, "this is not JSON".into()));
    records.insert(1000, (None, r#"{"click_id":-1}"#.into()));
    produce_records(&input, records);

    let summary = run_until_visible(&topology, &[(&output, expected.len())]).expect("job result");
    assert_eq!(summary.skipped, 2);
    assert_eq!(summary.txn.records_committed, n + 2);
    let out = read_records(&output, PARTITIONS, "read_committed");
    assert_exactly_once(&expected, &ids(&out));
    for r in &out {
        let v = json(&r.value);
        assert_eq!(v["user_id"].as_str(), r.key.as_deref(), "{v}");
        assert_eq!(v["url"], format!("/p/{}", v["click_id"]), "{v}");
        assert_eq!(v["day"], "2026-03-01", "{v}");
        for gone in ["user", "page", "user_agent", "ip", "type"] {
            assert!(v.get(gone).is_none(), "{v}");
        }
    }
}

#[test]
fn a_bad_record_stops_the_job_with_its_origin_under_on_error_fail() {
    let input = unique("fail-in");
    let output = unique("fail-out");
    create_topics(&[&input], 1);
    create_topics(&[&output], PARTITIONS);
    let mut topology = load(
        "order-lines.yaml",
        &[("ORDERS_TOPIC", &input), ("LINES_TOPIC", &output)],
    );
    topology.runtime.on_error = onceflow::topology::OnError::Fail;
    let records = (0..300u64).map(|order| {
        let value = if order == 200 {
            r#"{"order_id":200,"items":"#.to_string()
        } else {
            format!(
                r#"{{"order_id":{order},"items":[{{"sku":"{order}","qty":1,"unit_price":1}}]}}"#
            )
        };
        (None, value)
    });
    produce_records(&input, records);

    let err = run_until_visible(&topology, &[]).expect_err("the job must stop on the bad record");
    match &err {
        EngineError::Transform {
            topic,
            partition,
            offset,
            message,
        } => {
            assert_eq!(
                (topic.as_str(), *partition, *offset),
                (input.as_str(), 0, 200)
            );
            assert!(message.contains("bad_json"), "{message}");
        }
        other => panic!("unexpected error: {other}"),
    }
    // Nothing of the bad record or after it was committed, and nothing twice.
    let out = ids(&read_records(&output, PARTITIONS, "read_committed"));
    let unique_out: BTreeSet<u64> = out.iter().copied().collect();
    assert_eq!(unique_out.len(), out.len(), "duplicates: {out:?}");
    assert!(out.iter().all(|id| *id < 200), "{out:?}");
}

#[test]
fn validate_with_a_broker_checks_topics_and_the_transaction_timeout_ceiling() {
    let input = unique("v-in");
    create_topics(&[&input], 1);
    let missing = unique("v-missing");
    // Above the broker's transaction.max.timeout.ms (15 minutes by default).
    let text = format!(
        "name: v\ninputs: [{{topic: {input}}}]\noutputs: [{{topic: {missing}}}]\nruntime:\n  commit_interval_ms: 100\n  transaction_timeout_ms: 1000000\n"
    );
    let checked = load::load_text(&text, "v.yaml", &|_| None, Strictness::Strict);
    assert!(checked.diagnostics.is_empty(), "{:?}", checked.diagnostics);
    let topology = checked.topology.as_ref().expect("topology");
    let found: Vec<String> = validate::check_broker(
        topology,
        &bootstrap(),
        "v.yaml",
        &checked.lines,
        Duration::from_secs(10),
    )
    .iter()
    .map(ToString::to_string)
    .collect();
    assert_eq!(found.len(), 2, "{found:#?}");
    assert!(
        found[0].starts_with("v.yaml:3: outputs[0].topic: ") && found[0].contains("does not exist"),
        "{found:#?}"
    );
    assert!(
        found[1].starts_with("v.yaml:6: runtime.transaction_timeout_ms: ")
            && found[1].contains("transaction.max.timeout.ms"),
        "{found:#?}"
    );

    // Through the command line: a clean file against the broker exits 0.
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("ok.yaml");
    let output = unique("v-out");
    create_topics(&[&output], 1);
    std::fs::write(
        &file,
        format!("name: v\ninputs: [{{topic: {input}}}]\noutputs: [{{topic: {output}}}]\n"),
    )
    .expect("write");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_onceflow"))
        .arg("validate")
        .arg(&file)
        .args(["--bootstrap-servers", &bootstrap()])
        .output()
        .expect("run validate");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
