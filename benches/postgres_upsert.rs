//! The PostgreSQL sink's batch writer (inbox + upsert in one transaction per batch) against a
//! plain `COPY` of the same rows into the same kind of table: the ceiling of what the server
//! ingests. Same server, same run, printed as a table.
//!
//! ```sh
//! scripts/postgres start
//! ONCEFLOW_BENCH_PG_URL=postgres://postgres@127.0.0.1:55432/onceflow_test \
//!   cargo bench --bench postgres_upsert
//! ```
//!
//! `ONCEFLOW_BENCH_ROWS` (default 200,000) and `ONCEFLOW_BENCH_BATCH` (default 5,000) change
//! the sizes; `ONCEFLOW_BENCH_TABLE_WITH` gives the tables storage parameters
//! (`fillfactor=80`). Under `cargo test` (no `--bench` argument) it runs once over 2,000 rows as a smoke
//! test, and is skipped without a database URL (`ONCEFLOW_BENCH_PG_URL` or
//! `ONCEFLOW_TEST_PG_URL`).

use std::time::{Duration, Instant};

use onceflow::record::{Origin, Record};
use onceflow::sink::postgres::PostgresSink;
use onceflow::topology::Topology;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.replace('_', "").parse().ok())
        .unwrap_or(default)
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

    fn count(&self, sql: &str) -> i64 {
        self.rt
            .block_on(self.client.query_one(sql, &[]))
            .expect(sql)
            .get(0)
    }

    /// `COPY table FROM STDIN` of `data` (text format), sent in 1 MiB chunks.
    fn copy_in(&self, table: &str, data: &[u8]) -> u64 {
        use futures_util::SinkExt;
        self.rt.block_on(async {
            let sink = self
                .client
                .copy_in::<_, bytes::Bytes>(&format!(
                    "COPY {table} (id, version, customer, amount, status, updated_at) FROM STDIN"
                ))
                .await
                .expect("copy in");
            let mut sink = std::pin::pin!(sink);
            for chunk in data.chunks(1 << 20) {
                sink.send(bytes::Bytes::copy_from_slice(chunk))
                    .await
                    .expect("copy data");
            }
            sink.as_mut().finish().await.expect("copy finish")
        })
    }
}

const COLUMNS: &str = "id bigint PRIMARY KEY, version bigint NOT NULL, customer text NOT NULL, \
     amount numeric(12,2) NOT NULL, status text NOT NULL, updated_at timestamptz NOT NULL";

fn value(id: usize, version: usize) -> String {
    format!(
        r#"{{"id":{id},"version":{version},"customer":"customer-{c}","amount":{a}.{b:02},"status":"{s}","updated_at":"2025-01-{d:02}T10:{m:02}:00Z"}}"#,
        c = id % 10_000,
        a = id % 1_000,
        b = id % 100,
        s = ["open", "paid", "shipped"][id % 3],
        d = 1 + version % 28,
        m = id % 60,
    )
}

fn copy_line(id: usize, version: usize, out: &mut Vec<u8>) {
    use std::io::Write;
    let _ = writeln!(
        out,
        "{id}\t{version}\tcustomer-{c}\t{a}.{b:02}\t{s}\t2025-01-{d:02}T10:{m:02}:00Z",
        c = id % 10_000,
        a = id % 1_000,
        b = id % 100,
        s = ["open", "paid", "shipped"][id % 3],
        d = 1 + version % 28,
        m = id % 60,
    );
}

/// A sink writing `table` through `url` (with `sslmode`, unless the URL names one).
fn sink_for(consumer: &str, table: &str, batch: usize, url: &str, sslmode: &str) -> PostgresSink {
    let text = format!(
        "name: bench\ninputs: [{{topic: bench}}]\noutputs:\n  - name: bench\n    postgres:\n      url_env: ONCEFLOW_BENCH_PG_URL\n      table: {table}\n      id_columns: [id]\n      version_column: version\n      columns: {{id: id, version: version, customer: customer, amount: amount, status: status, updated_at: updated_at}}\n      batch_size: {batch}\n"
    );
    let topology = Topology::parse(&text, "bench").expect("topology");
    let (_, config) = topology.postgres_outputs().next().expect("output");
    PostgresSink::connect_url(consumer, "bench", config, &with_sslmode(url, sslmode)).expect("sink")
}

/// `url` with `sslmode=mode`, unless it names one already.
fn with_sslmode(url: &str, mode: &str) -> String {
    if url.contains("sslmode=") {
        url.to_string()
    } else {
        let sep = if url.contains('?') { '&' } else { '?' };
        format!("{url}{sep}sslmode={mode}")
    }
}

fn records(n: usize, version: usize, first_offset: i64) -> Vec<Record> {
    (0..n)
        .map(|i| Record {
            key: Some(i.to_string().into_bytes()),
            value: Some(value(i, version).into_bytes()),
            headers: Vec::new(),
            timestamp: None,
            origin: Origin {
                topic: "bench".into(),
                partition: (i % 8) as i32,
                offset: first_offset + i as i64,
            },
        })
        .collect()
}

/// Stages and flushes `records` in batches through the sink; returns the time taken, and
/// the part of it spent staging (mapping records to rows, in the job's process).
fn write(sink: &mut PostgresSink, records: &[Record], batch: usize) -> (Duration, Duration) {
    let started = Instant::now();
    let mut staging = Duration::ZERO;
    for chunk in records.chunks(batch) {
        let t = Instant::now();
        for r in chunk {
            sink.stage(r).expect("stage");
        }
        staging += t.elapsed();
        sink.flush(Instant::now() + Duration::from_secs(60))
            .expect("flush");
    }
    (started.elapsed(), staging)
}

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let Some(url) = std::env::var("ONCEFLOW_BENCH_PG_URL")
        .or_else(|_| std::env::var("ONCEFLOW_TEST_PG_URL"))
        .ok()
    else {
        eprintln!(
            "postgres_upsert: skipped (set ONCEFLOW_BENCH_PG_URL, e.g. the URL `scripts/postgres start` prints)"
        );
        return;
    };
    let n = if bench {
        env_usize("ONCEFLOW_BENCH_ROWS", 200_000)
    } else {
        2_000
    };
    let batch = env_usize("ONCEFLOW_BENCH_BATCH", 5_000);
    let db = Db::connect(&url);
    let tag = format!("{}_{}", std::process::id(), rand::random::<u32>());
    let (upsert_table, copy_table, tls_table) = (
        format!("bench_upsert_{tag}"),
        format!("bench_copy_{tag}"),
        format!("bench_tls_{tag}"),
    );
    // Storage parameters of the three tables, e.g. `fillfactor=80` (room for updates in place).
    let with = std::env::var("ONCEFLOW_BENCH_TABLE_WITH")
        .map(|w| format!(" WITH ({w})"))
        .unwrap_or_default();
    db.exec(&format!(
        "CREATE TABLE {upsert_table} ({COLUMNS}){with}; CREATE TABLE {copy_table} ({COLUMNS}){with}; CREATE TABLE {tls_table} ({COLUMNS}){with};"
    ));

    let consumer_topology = format!("bench-{tag}");
    // The sink talks to the server as COPY does, in plaintext (unless the URL says otherwise);
    // one more sink inserts the same rows into a table of its own over TLS.
    let mut sink = sink_for(&consumer_topology, &upsert_table, batch, &url, "disable");
    let mut tls_sink = sink_for(&consumer_topology, &tls_table, batch, &url, "require");

    // COPY: the same rows, preformatted, into an empty table with the same primary key.
    let mut copy_data = Vec::with_capacity(n * 80);
    for i in 0..n {
        copy_line(i, 1, &mut copy_data);
    }
    let started = Instant::now();
    let copied = db.copy_in(&copy_table, &copy_data);
    let copy_time = (started.elapsed(), Duration::ZERO);
    assert_eq!(copied as usize, n);

    let inserts = records(n, 1, 0);
    let insert_time = write(&mut sink, &inserts, batch);
    let tls_time = write(&mut tls_sink, &records(n, 1, n as i64), batch);
    let updates = records(n, 2, 2 * n as i64);
    let update_time = write(&mut sink, &updates, batch);
    let replay_time = write(&mut sink, &updates, batch);

    assert_eq!(
        db.count(&format!(
            "SELECT count(*) FROM {upsert_table} WHERE version = 2"
        )),
        n as i64
    );
    assert_eq!(
        db.count(&format!("SELECT count(*) FROM {tls_table}")),
        n as i64
    );

    let rate = |d: Duration| n as f64 / d.as_secs_f64();
    println!(
        "\nPostgreSQL sink vs COPY: {n} rows, batches of {batch}, {}\n",
        if bench { "bench" } else { "smoke run" }
    );
    println!("| path | what it does | seconds | of which staging | rows/s |");
    println!("|---|---|---:|---:|---:|");
    for (path, what, d) in [
        (
            "COPY (ceiling)",
            "COPY FROM STDIN into an empty table with the same primary key",
            copy_time,
        ),
        (
            "sink: insert",
            "new ids: inbox + upsert, one transaction per batch",
            insert_time,
        ),
        (
            "sink: insert over TLS",
            "as insert, into a table of its own, over TLS (sslmode=require)",
            tls_time,
        ),
        (
            "sink: update",
            "same ids, newer version: inbox + upsert updates every row",
            update_time,
        ),
        (
            "sink: replay",
            "the same messages again: all absorbed by the inbox",
            replay_time,
        ),
    ] {
        println!(
            "| {path} | {what} | {:.2} | {:.2} | {:.0} |",
            d.0.as_secs_f64(),
            d.1.as_secs_f64(),
            rate(d.0)
        );
    }
    println!(
        "\nsink insert / COPY: {:.0} %",
        100.0 * copy_time.0.as_secs_f64() / insert_time.0.as_secs_f64()
    );

    drop((sink, tls_sink));
    db.exec(&format!(
        "DROP TABLE {upsert_table}; DROP TABLE {copy_table}; DROP TABLE {tls_table}; DELETE FROM onceflow_inbox WHERE consumer = '{consumer_topology}/bench';"
    ));
}
