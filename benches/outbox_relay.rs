//! The outbox relay's throughput and latency on the real server and broker, next to the
//! ceiling: a plain `COPY (SELECT ...) TO STDOUT` of the same rows out of the same table.
//!
//! ```sh
//! scripts/kafka start; scripts/postgres start
//! ONCEFLOW_BENCH_PG_URL=postgres://postgres@127.0.0.1:55432/onceflow_test \
//! ONCEFLOW_BENCH_BOOTSTRAP=127.0.0.1:17092 cargo bench --bench outbox_relay
//! ```
//!
//! Throughput: rows of 1 KB (jsonb payloads) are inserted in one statement while a relay that
//! already holds its shard waits (so its start-up is not counted); the time runs from that
//! insert's commit until the table is empty, every row published in Kafka and deleted. Cells
//! (the COPY ceiling, the relay with batches of 500, with batches of 5,000) run in
//! interleaved rounds, the order rotated each round; each relay/ceiling ratio is computed per
//! round (paired) and shown as the median with its min-max.
//!
//! Latency: a writer inserts 1,000 rows a second (10 every 10 ms, each carrying its insert
//! time) for `ONCEFLOW_BENCH_LATENCY_SECS` (default 20) while the relay runs with NOTIFY; a
//! read_committed consumer of the topic takes each row's time from insert to visible. The
//! first 2 s are not counted.
//!
//! `ONCEFLOW_BENCH_ROWS` (default 100,000) and `ONCEFLOW_BENCH_ROUNDS` (default 3) change the
//! sizes. Under `cargo test` (no `--bench` argument) it runs one small round as a smoke test,
//! and is skipped without a database URL and a broker.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use onceflow::instance::{Identity, RunOptions};
use onceflow::kafka::Cluster;
use onceflow::kafka::admin::Admin;
use onceflow::topology::Topology;
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.replace('_', "").parse().ok())
        .unwrap_or(default)
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

struct Db {
    rt: tokio::runtime::Runtime,
    client: tokio_postgres::Client,
}

impl Db {
    fn connect(url: &str) -> Db {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let (client, connection) = rt
            .block_on(tokio_postgres::connect(url, tokio_postgres::NoTls))
            .expect("connect");
        rt.spawn(async move {
            let _ = connection.await;
        });
        Db { rt, client }
    }

    fn exec(&self, sql: &str) {
        self.rt
            .block_on(self.client.batch_execute(sql))
            .unwrap_or_else(|e| panic!("{sql}: {e:?}"));
    }

    fn count(&self, table: &str) -> i64 {
        self.rt
            .block_on(
                self.client
                    .query_one(&format!("SELECT count(*) FROM {table}"), &[]),
            )
            .expect("count")
            .get(0)
    }

    /// Bytes read by `COPY (SELECT ...) TO STDOUT` of every row.
    fn copy_out(&self, table: &str) -> usize {
        self.rt.block_on(async {
            let sql = format!(
                "COPY (SELECT id, aggregatetype, aggregateid, type, payload FROM {table} ORDER BY id) TO STDOUT"
            );
            let stream = self.client.copy_out(&sql).await.expect("copy out");
            let mut stream = std::pin::pin!(stream);
            let mut bytes = 0;
            while let Some(chunk) = stream.next().await {
                bytes += chunk.expect("copy chunk").len();
            }
            bytes
        })
    }
}

/// `n` rows of about 1 KB, in one statement (one commit).
fn fill(db: &Db, table: &str, n: usize) {
    db.exec(&format!(
        "INSERT INTO {table} (aggregatetype, aggregateid, type, payload)
           SELECT 'order', 'o' || (g % 1000), 'OrderChanged',
                  jsonb_build_object('n', g, 'pad', repeat('x', 1000))
           FROM generate_series(1, {n}) g"
    ));
}

/// A relay of `table` running in this process until the returned flag is set.
struct Relay {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Relay {
    /// With `stop_after`, the relay ends once it published (and deleted) that many rows.
    fn start(yaml: &str, bootstrap: &str, instance: &str, stop_after: Option<u64>) -> Relay {
        let topology = Topology::parse(yaml, "bench").expect("relay topology");
        let identity = Identity {
            bootstrap_servers: bootstrap.to_string(),
            instance_id: instance.to_string(),
        };
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let options = RunOptions {
                stop_after_records: stop_after,
                ..RunOptions::default()
            };
            if let Err(e) = onceflow::job::run(&topology, &identity, &options, &flag) {
                eprintln!("relay failed: {e}");
            }
        });
        Relay {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Waits until the relay, started with `stop_after`, ended; returns how long it took, or
/// `None` after `budget`. (Counting the table's rows meanwhile would scan it, and take the
/// server's time from the relay.)
fn finished(relay: &Relay, budget: Duration) -> Option<Duration> {
    let started = Instant::now();
    while started.elapsed() < budget {
        if relay.thread.as_ref().is_none_or(|t| t.is_finished()) {
            return Some(started.elapsed());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    None
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn spread(v: &[f64]) -> (f64, f64) {
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (min, max)
}

#[derive(Clone, Copy, PartialEq)]
enum Cell {
    Copy,
    Relay(usize),
}

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let url_var = ["ONCEFLOW_BENCH_PG_URL", "ONCEFLOW_TEST_PG_URL"]
        .into_iter()
        .find(|v| std::env::var(v).is_ok());
    let bootstrap = std::env::var("ONCEFLOW_BENCH_BOOTSTRAP")
        .or_else(|_| std::env::var("ONCEFLOW_TEST_BOOTSTRAP"))
        .ok();
    let (Some(url_var), Some(bootstrap)) = (url_var, bootstrap) else {
        eprintln!(
            "outbox_relay: skipped (set ONCEFLOW_BENCH_PG_URL and ONCEFLOW_BENCH_BOOTSTRAP, e.g. what scripts/postgres start and scripts/kafka start print)"
        );
        return;
    };
    let url = std::env::var(url_var).expect("url");
    let rows = if bench {
        env_usize("ONCEFLOW_BENCH_ROWS", 100_000)
    } else {
        2_000
    };
    let rounds = if bench {
        env_usize("ONCEFLOW_BENCH_ROUNDS", 3)
    } else {
        1
    };
    let latency_secs = if bench {
        env_usize("ONCEFLOW_BENCH_LATENCY_SECS", 20)
    } else {
        3
    };
    let tag = format!("{}_{}", std::process::id(), rand::random::<u32>());
    let table = format!("bench_outbox_{tag}");
    let prefix = format!("bench-outbox-{tag}.event.");
    let topic = format!("{prefix}order");
    let dlq = format!("bench-outbox-{tag}.dlq");
    let admin = Admin::new(&Cluster::new(&bootstrap)).expect("admin");
    admin.create_topic(&topic, 6).expect("topic");
    admin.create_topic(&dlq, 1).expect("dead-letter topic");
    let db = Db::connect(&url);
    db.exec(&format!(
        "CREATE TABLE {table} (id bigserial PRIMARY KEY, aggregatetype text NOT NULL, aggregateid text NOT NULL, \
         type text NOT NULL, payload jsonb, created_at timestamptz NOT NULL DEFAULT clock_timestamp());
         CREATE FUNCTION {table}_notify() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN PERFORM pg_notify('{table}', ''); RETURN NULL; END $$;
         CREATE TRIGGER {table}_notify AFTER INSERT ON {table}
           FOR EACH STATEMENT EXECUTE FUNCTION {table}_notify();"
    ));
    let yaml = |batch: usize| {
        format!(
            "name: bench-outbox-{tag}\ninputs:\n  - codec: json\n    postgres_outbox:\n      url_env: {url_var}\n      table: {table}\n      columns: {{created_at: created_at}}\n      batch_size: {batch}\n      poll_interval_ms: 1000\n      notify_channel: {table}\n      topic_prefix: '{prefix}'\ndead_letter: {{topic: {dlq}}}\n"
        )
    };

    println!("outbox relay: {rows} rows of ~1 KB per cell, {rounds} round(s)");
    let cells = [Cell::Copy, Cell::Relay(500), Cell::Relay(5000)];
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); cells.len()];
    for round in 0..rounds {
        for k in 0..cells.len() {
            let index = (k + round) % cells.len();
            let rate = match cells[index] {
                Cell::Copy => {
                    fill(&db, &table, rows);
                    let started = Instant::now();
                    let bytes = db.copy_out(&table);
                    let took = started.elapsed();
                    assert!(bytes > rows * 1000, "COPY read {bytes} bytes");
                    db.exec(&format!("TRUNCATE {table}"));
                    rows as f64 / took.as_secs_f64()
                }
                Cell::Relay(batch) => {
                    let relay = Relay::start(
                        &yaml(batch),
                        &bootstrap,
                        &format!("r{round}-{batch}"),
                        Some(rows as u64),
                    );
                    // Its shard taken and resolved (nothing to publish yet).
                    std::thread::sleep(Duration::from_secs(3));
                    fill(&db, &table, rows);
                    let took = finished(&relay, Duration::from_secs(600))
                        .expect("the relay did not publish the rows within 600 s");
                    drop(relay);
                    assert_eq!(db.count(&table), 0, "rows left after the relay ended");
                    rows as f64 / took.as_secs_f64()
                }
            };
            let name = match cells[index] {
                Cell::Copy => "COPY out (ceiling)".to_string(),
                Cell::Relay(b) => format!("relay, batches of {b}"),
            };
            println!("  round {}: {name}: {rate:.0} rows/s", round + 1);
            rates[index].push(rate);
        }
    }
    println!();
    println!("| cell | rows/s (median, min-max) | relay / COPY, paired (median, min-max) |");
    println!("|---|---:|---:|");
    for (i, cell) in cells.iter().enumerate() {
        let (min, max) = spread(&rates[i]);
        let med = median(&mut rates[i].clone());
        let name = match cell {
            Cell::Copy => "`COPY (SELECT ...) TO STDOUT` (ceiling)".to_string(),
            Cell::Relay(b) => format!("relay, `batch_size: {b}`"),
        };
        let ratio = if *cell == Cell::Copy {
            "-".to_string()
        } else {
            let mut r: Vec<f64> = rates[i].iter().zip(&rates[0]).map(|(a, c)| a / c).collect();
            let (rmin, rmax) = spread(&r);
            format!("{:.2} ({rmin:.2}-{rmax:.2})", median(&mut r))
        };
        println!("| {name} | {med:.0} ({min:.0}-{max:.0}) | {ratio} |");
    }

    // Latency at 1,000 rows/s with NOTIFY.
    let relay = Relay::start(&yaml(500), &bootstrap, "latency", None);
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", format!("bench-outbox-{tag}-reader"))
        .set("isolation.level", "read_committed")
        .set("auto.offset.reset", "latest")
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    consumer.subscribe(&[&topic]).expect("subscribe");
    // Joined: `latest` applies once the partitions are assigned.
    let joined = Instant::now();
    while consumer.assignment().map_or(0, |a| a.count()) == 0
        && joined.elapsed() < Duration::from_secs(30)
    {
        let _ = consumer.poll(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(3));
    let writing = Arc::new(AtomicBool::new(true));
    let writer = {
        let (url, table, writing) = (url.clone(), table.clone(), Arc::clone(&writing));
        std::thread::spawn(move || {
            let db = Db::connect(&url);
            let mut next = Instant::now();
            let insert = format!(
                "INSERT INTO {table} (aggregatetype, aggregateid, type, payload)
                   SELECT 'order', 'o' || g, 'T', jsonb_build_object('sent_ms', $1::int8, 'pad', repeat('x', 1000))
                   FROM generate_series(1, 10) g"
            );
            while writing.load(Ordering::Relaxed) {
                let sent = now_ms();
                db.rt
                    .block_on(db.client.execute(&insert, &[&sent]))
                    .expect("insert");
                next += Duration::from_millis(10);
                std::thread::sleep(next.saturating_duration_since(Instant::now()));
            }
        })
    };
    let started = Instant::now();
    let mut latencies: Vec<i64> = Vec::new();
    while started.elapsed() < Duration::from_secs(latency_secs as u64) {
        if let Some(Ok(msg)) = consumer.poll(Duration::from_millis(50)) {
            let value: serde_json::Value =
                serde_json::from_slice(msg.payload().unwrap_or_default()).expect("json");
            if started.elapsed() > Duration::from_secs(2) {
                latencies.push(now_ms() - value["sent_ms"].as_i64().unwrap_or(0));
            }
        }
    }
    writing.store(false, Ordering::Relaxed);
    writer.join().expect("writer");
    drop(relay);
    latencies.sort_unstable();
    let q = |p: f64| {
        latencies
            .get(((latencies.len() as f64 * p) as usize).min(latencies.len().saturating_sub(1)))
            .copied()
            .unwrap_or(-1)
    };
    println!();
    println!(
        "insert-to-visible latency at 1,000 rows/s with NOTIFY (batch_size 500, {} rows over {} s after 2 s of warm-up): p50 {} ms, p99 {} ms, max {} ms",
        latencies.len(),
        latency_secs.saturating_sub(2),
        q(0.5),
        q(0.99),
        latencies.last().copied().unwrap_or(-1)
    );
    assert!(!latencies.is_empty(), "no row became visible");
    db.exec(&format!("DROP TABLE {table}"));
}
