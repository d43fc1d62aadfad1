//! `join` on the real broker: a stream joined with a co-partitioned table and a global one,
//! the tables updated while the job runs and while it is down (SIGKILL), and the restart
//! restoring only the tables' tails from the disk store. Checked by ids read with
//! read_committed: every order once, in the output or the dead-letter topic, each with the
//! rows its phase must see.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::*;

const PARTITIONS: i32 = 4;
/// Customers c0..c49 have rows; orders name c0..c59.
const CUSTOMERS: u64 = 50;
/// Products p0..p1999 have rows; orders name p0..p2099.
const PRODUCTS: u64 = 2_000;
const PHASE: u64 = 3_000;

fn customer_of(id: u64) -> u64 {
    id % (CUSTOMERS + 10)
}

fn product_of(id: u64) -> u64 {
    (id * 7) % (PRODUCTS + 100)
}

fn orders(ids: std::ops::Range<u64>) -> Vec<(Option<String>, String)> {
    ids.map(|id| {
        (
            Some(format!("c{}", customer_of(id))),
            format!(r#"{{"id":{id},"sku":"p{}"}}"#, product_of(id)),
        )
    })
    .collect()
}

fn customers(version: u32) -> Vec<(Option<String>, String)> {
    (0..CUSTOMERS)
        .map(|c| {
            (
                Some(format!("c{c}")),
                format!(r#"{{"name":"c{c}-v{version}"}}"#),
            )
        })
        .collect()
}

fn free_addr() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    format!("127.0.0.1:{port}")
}

/// Waits until the job at `addr` has read `n` records of `table` since it restored it.
fn wait_table_read(addr: &str, table: &str, n: f64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let read = get(addr, "/metrics")
            .filter(|(status, _)| *status == 200)
            .and_then(|(_, body)| {
                metric(
                    &body,
                    "onceflow_table_records_read_total",
                    &[&format!("table=\"{table}\"")],
                )
            })
            .unwrap_or(0.0);
        if read >= n {
            return;
        }
        assert!(Instant::now() < deadline, "{table}: {read} of {n} read");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A metric of the job at `addr`, once it serves it.
fn metric_of(addr: &str, name: &str) -> f64 {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some((200, body)) = get(addr, "/metrics")
            && let Some(n) = metric(&body, name, &[])
        {
            return n;
        }
        assert!(Instant::now() < deadline, "no {name} at {addr}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn orders_join_both_tables_through_updates_and_a_sigkill() {
    let (orders_topic, customers_topic, products_topic) = (
        unique("join-in"),
        unique("join-customers"),
        unique("join-products"),
    );
    let (output, dlq) = (unique("join-out"), unique("join-dlq"));
    create_topics(
        &[&orders_topic, &customers_topic, &output, &dlq],
        PARTITIONS,
    );
    create_topics(&[&products_topic], 3);
    let state = tempfile::tempdir().expect("state dir");
    let job = unique("join");
    let yaml = format!(
        "name: {job}\ninputs:\n  - {{topic: {orders_topic}, codec: json}}\npipeline:\n  - join: {{name: customers, table: {customers_topic}, as: customer}}\n  - join: {{name: products, table: {products_topic}, global: true, key: value.sku, as: product, on_miss: dead_letter}}\n  - set_key: string(value.id)\noutputs:\n  - {{topic: {output}, codec: json}}\ndead_letter: {{topic: {dlq}}}\nruntime:\n  session_timeout_ms: 10000\n  max_records_per_txn: 500\n  group_protocol: {}\n  state_dir: {}\n",
        group_protocol(),
        state.path().display()
    );
    let (_dir, topology) = topology_file(&yaml);
    produce_records(&customers_topic, customers(1));
    produce_records(
        &products_topic,
        (0..PRODUCTS).map(|p| (Some(format!("p{p}")), format!(r#"{{"title":"t{p}"}}"#))),
    );
    let hits = |ids: std::ops::Range<u64>| ids.filter(|&i| product_of(i) < PRODUCTS).count();

    // Phase 1: the tables as they were before the job started.
    produce_records(&orders_topic, orders(0..PHASE));
    let first = free_addr();
    let mut job = spawn_job(&topology, "join-0", &[("ONCEFLOW_METRICS_ADDR", &first)]);
    wait_for_distinct(
        &output,
        PARTITIONS,
        hits(0..PHASE),
        Duration::from_secs(120),
    );
    // Phase 2: every customer updated while the job runs; the orders after it see it.
    produce_records(&customers_topic, customers(2));
    wait_table_read(&first, &customers_topic, CUSTOMERS as f64);
    produce_records(&orders_topic, orders(PHASE..2 * PHASE));
    wait_for_distinct(
        &output,
        PARTITIONS,
        hits(0..2 * PHASE),
        Duration::from_secs(120),
    );
    // Phase 3: killed, the customers updated while it is down; the restart reads the tail.
    job.kill().expect("SIGKILL");
    job.wait().expect("reap");
    produce_records(&customers_topic, customers(3));
    let second = free_addr();
    let job = spawn_job(&topology, "join-0", &[("ONCEFLOW_METRICS_ADDR", &second)]);
    produce_records(&orders_topic, orders(2 * PHASE..3 * PHASE));
    wait_for_distinct(
        &output,
        PARTITIONS,
        hits(0..3 * PHASE),
        Duration::from_secs(120),
    );
    let restored = metric_of(&second, "onceflow_state_restored_records_total");
    terminate(job);

    // Every order once: joined in the output, or dead-lettered for its unknown product.
    let all: BTreeSet<u64> = (0..3 * PHASE).collect();
    let out = read_records(&output, PARTITIONS, "read_committed");
    let dead = read_records(&dlq, PARTITIONS, "read_committed");
    let value = |r: &ReadRecord| -> serde_json::Value {
        serde_json::from_str(r.value.as_deref().expect("a value")).expect("JSON")
    };
    let mut ids: Vec<u64> = ids_of(&out);
    ids.extend(dead.iter().map(|r| value(r)["id"].as_u64().expect("an id")));
    assert_exactly_once(&all, &ids);
    let dead_ids: BTreeSet<u64> = dead
        .iter()
        .map(|r| value(r)["id"].as_u64().expect("an id"))
        .collect();
    let missing: BTreeSet<u64> = all
        .iter()
        .copied()
        .filter(|&i| product_of(i) >= PRODUCTS)
        .collect();
    assert_eq!(dead_ids, missing, "the dead-lettered orders");
    // Each joined order carries the rows of its phase.
    let mut wrong = BTreeMap::new();
    for r in &out {
        let v = value(r);
        let id = v["id"].as_u64().expect("an id");
        let c = customer_of(id);
        let version = id / PHASE + 1;
        let customer = if c < CUSTOMERS {
            serde_json::json!({"name": format!("c{c}-v{version}")})
        } else {
            serde_json::Value::Null
        };
        let product = serde_json::json!({"title": format!("t{}", product_of(id))});
        if v["customer"] != customer || v["product"] != product {
            wrong.insert(id, v);
        }
    }
    assert!(
        wrong.is_empty(),
        "{} orders with the wrong rows, first: {:?}",
        wrong.len(),
        wrong.iter().next()
    );
    // The restart read the tables' tails (50 customers), not all 2,150 records.
    eprintln!("the restart restored {restored} table records");
    assert!(
        restored < 500.0,
        "the restart read {restored} table records: not the tail"
    );
}

/// A co-partitioned table with another partition count than the input is refused by
/// `validate --bootstrap-servers` and by the job, naming both counts and the way out.
#[test]
fn a_co_partitioned_table_with_another_partition_count_is_refused() {
    let (input, table, output) = (unique("joinp-in"), unique("joinp-t"), unique("joinp-out"));
    create_topics(&[&input, &output], PARTITIONS);
    create_topics(&[&table], PARTITIONS + 2);
    let yaml = format!(
        "name: {}\ninputs:\n  - {{topic: {input}, codec: json}}\npipeline:\n  - join: {{name: t, table: {table}, as: row}}\noutputs:\n  - {{topic: {output}, codec: json}}\n",
        unique("joinp")
    );
    let (_dir, topology) = topology_file(&yaml);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_onceflow"))
        .arg("validate")
        .arg(&topology)
        .args(["--bootstrap-servers", &bootstrap()])
        .output()
        .expect("run validate");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("pipeline[0].join.table")
            && said.contains(&format!(
                "has {} partitions, the input has {PARTITIONS}",
                PARTITIONS + 2
            ))
            && said.contains("global: true"),
        "{said}"
    );
    let mut job = spawn_job(&topology, "joinp-0", &[]);
    let status = wait_exit(&mut job, Duration::from_secs(60)).expect("the job stops");
    assert!(!status.success(), "{status:?}");
}
