//! Reads N records of a topic from its beginning and writes each, key and value, to another
//! topic: no processing, no transaction, no commit, no header. The bare loop of a
//! read-process-write job, with one client or the other:
//!
//!   client-ceiling rdkafka|krafka|krafka-1 BOOTSTRAP INPUT PARTITIONS OUTPUT RECORDS
//!
//! `krafka` runs on Tokio's multi-threaded runtime (a worker per core), `krafka-1` on its
//! current-thread runtime. FETCH_MAX_BYTES sets both consumers' fetch limit
//! (`fetch.max.bytes`, krafka's `fetch_max_bytes`; 50 MiB by default in both).
//!
//! Prints one line: client, records, seconds, CPU seconds of this process (user + system,
//! from /proc/self/stat), records/s, CPU µs per record. Both producers are idempotent with
//! acks=all, linger 5 ms and batch.size 262144, as onceflow's bench ceiling client.
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

fn with_rdkafka(bootstrap: &str, input: &str, partitions: i32, output: &str, n: u64) -> u64 {
    use rdkafka::config::ClientConfig;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::error::{KafkaError, RDKafkaErrorCode};
    use rdkafka::message::Message;
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    use rdkafka::{Offset, TopicPartitionList};
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        .set("group.id", format!("client-ceiling-{}", std::process::id()))
        .set("enable.auto.commit", "false")
        // As onceflow's consumers: a partition whose prefetch queue was full is fetched
        // again after 50 ms, not librdkafka's 1 s.
        .set("fetch.queue.backoff.ms", "50");
    if let Some(bytes) = fetch_max_bytes() {
        config.set("fetch.max.bytes", bytes.to_string());
    }
    let consumer: BaseConsumer = config.create().expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(input, p, Offset::Beginning)
            .expect("tpl");
    }
    consumer.assign(&tpl).expect("assign");
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("delivery.report.only.error", "true")
        .set("linger.ms", "5")
        .set("batch.size", "262144")
        .create()
        .expect("producer");
    let mut written = 0u64;
    while written < n {
        match consumer.poll(Duration::from_millis(10)) {
            Some(Ok(msg)) => {
                let mut record = BaseRecord::<[u8], [u8]>::to(output);
                if let Some(k) = msg.key() {
                    record = record.key(k);
                }
                if let Some(v) = msg.payload() {
                    record = record.payload(v);
                }
                loop {
                    match producer.send(record) {
                        Ok(()) => break,
                        Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                            record = r;
                            producer.poll(Duration::ZERO);
                            // SAFETY: the handle is valid while `producer` lives; flush only waits.
                            unsafe {
                                rdkafka::bindings::rd_kafka_flush(producer.client().native_ptr(), 1)
                            };
                        }
                        Err((e, _)) => panic!("produce: {e}"),
                    }
                }
                written += 1;
                if written.is_multiple_of(256) {
                    producer.poll(Duration::ZERO);
                }
            }
            Some(Err(e)) => panic!("consume: {e}"),
            None => producer.poll(Duration::ZERO),
        }
    }
    producer.flush(Duration::from_secs(300)).expect("flush");
    written
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
