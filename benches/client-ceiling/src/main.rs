//! Reads N records of a topic from its beginning and writes each, key and value, to another
//! topic: no processing, no transaction, no commit, no header. The bare loop of a
//! read-process-write job, with one client or the other:
//!
//!   client-ceiling rdkafka|krafka|krafka-1 BOOTSTRAP INPUT PARTITIONS OUTPUT RECORDS
//!
//! `rdkafka` is onceflow's own ceiling client (`onceflow_bench::read_process_write`, the
//! bench's rpw-ceiling cell, with its reader and producer settings). `krafka` runs the same
//! loop on krafka on Tokio's multi-threaded runtime (a worker per core), `krafka-1` on its
//! current-thread runtime; FETCH_MAX_BYTES sets krafka's consumer `fetch_max_bytes` (50 MiB
//! by default, as librdkafka's `fetch.max.bytes`).
//!
//! Prints one line: client, records, seconds, CPU seconds of this process (user + system,
//! from /proc/self/stat), records/s, CPU µs per record. Both producers are idempotent with
//! acks=all, linger 5 ms and batch.size 262144.
use std::time::{Duration, Instant};

fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    // Fields after the command name (which may hold spaces), from its closing parenthesis.
    let rest = &stat[stat.rfind(')').expect("stat format") + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields[i].parse::<f64>().expect("stat field");
    // utime and stime are fields 14 and 15 of the whole line, 12 and 13 after the name.
    (ticks(11) + ticks(12)) / 100.0
}

/// FETCH_MAX_BYTES, when set.
fn fetch_max_bytes() -> Option<i32> {
    std::env::var("FETCH_MAX_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
}

/// The bench's own ceiling client (`onceflow-bench`'s rpw-ceiling cell), run to `n` records.
fn with_rdkafka(bootstrap: &str, input: &str, partitions: i32, output: &str, n: u64) -> u64 {
    let tuning = onceflow_bench::ProducerTuning {
        linger_ms: 5,
        batch_size: 262_144,
    };
    onceflow_bench::read_process_write(bootstrap, input, partitions, output, tuning, &|w| w < n)
        .expect("read-process-write")
}

async fn with_krafka(bootstrap: &str, input: &str, partitions: i32, output: &str, n: u64) -> u64 {
    use krafka::consumer::AutoOffsetReset;
    use krafka::producer::Acks;
    use krafka::{Kafka, Record};
    let kafka = Kafka::builder(bootstrap).connect().await.expect("connect");
    let mut builder = kafka
        .consumer_without_group()
        .auto_offset_reset(AutoOffsetReset::Earliest);
    if let Some(bytes) = fetch_max_bytes() {
        builder = builder.fetch_max_bytes(bytes);
    }
    let consumer = builder.build().await.expect("consumer");
    consumer
        .assign(input, (0..partitions).collect())
        .await
        .expect("assign");
    let producer = kafka
        .producer()
        .acks(Acks::All)
        .idempotent(true)
        .linger(Duration::from_millis(5))
        .batch_size(262_144)
        .build()
        .await
        .expect("producer");
    let output: std::sync::Arc<str> = output.into();
    let mut written = 0u64;
    while written < n {
        for rec in consumer
            .poll(Duration::from_millis(10))
            .await
            .expect("poll")
        {
            let mut record = Record::new(&*output, rec.value.unwrap_or_default());
            if let Some(k) = rec.key {
                record = record.key(k);
            }
            // The handle resolves to the acknowledgement; the flush below waits for all.
            drop(producer.enqueue(record).await.expect("enqueue"));
            written += 1;
        }
    }
    producer.flush().await.expect("flush");
    written
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 7 {
        eprintln!(
            "usage: client-ceiling rdkafka|krafka|krafka-1 BOOTSTRAP INPUT PARTITIONS OUTPUT RECORDS"
        );
        std::process::exit(2);
    }
    let (client, bootstrap, input, output) = (&args[1], &args[2], &args[3], &args[5]);
    let partitions: i32 = args[4].parse().expect("PARTITIONS");
    let n: u64 = args[6].parse().expect("RECORDS");
    let cpu0 = cpu_seconds();
    let t0 = Instant::now();
    let written = match client.as_str() {
        "rdkafka" => with_rdkafka(bootstrap, input, partitions, output, n),
        "krafka" => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(with_krafka(bootstrap, input, partitions, output, n)),
        "krafka-1" => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(with_krafka(bootstrap, input, partitions, output, n)),
        other => panic!("unknown client {other}"),
    };
    let secs = t0.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
    println!(
        "{client} {written} {secs:.2} {cpu:.2} {:.0} {:.2}",
        written as f64 / secs,
        cpu * 1e6 / written as f64
    );
}
