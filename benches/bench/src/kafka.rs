//! The benchmark's own Kafka clients: the preload, the produce-only and read-process-write
//! ceilings (run as child processes, like the pipelines), the read_committed reader that
//! times every cell, and the paced probe that measures end-to-end latency.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rdkafka::ClientContext;
use rdkafka::consumer::BaseConsumer;
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};

use crate::BenchError;
use onceflow::histogram::Histogram;
use onceflow::kafka::{Cluster, read, send};

/// Key prefix of probe records; bulk records have plain decimal keys.
const PROBE_PREFIX: u8 = b'p';
/// Key of the probe producer's warm-up record, which the reader skips.
const WARM_UP: u8 = b'w';

/// Counts failed deliveries.
#[derive(Default)]
struct Failures {
    count: AtomicU64,
    first: OnceLock<KafkaError>,
}

impl ClientContext for Failures {}

impl ProducerContext for Failures {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((e, _)) = result {
            self.count.fetch_add(1, Ordering::Relaxed);
            let _ = self.first.set(e.clone());
        }
    }
}

/// Producer settings shared by the preload, the ceilings and the pipelines under test.
#[derive(Debug, Clone, Copy)]
pub struct ProducerTuning {
    pub linger_ms: u64,
    pub batch_size: u64,
}

fn producer(bootstrap: &str, tuning: ProducerTuning) -> Result<BaseProducer<Failures>, BenchError> {
    Cluster::new(bootstrap)
        .config()
        .set("enable.idempotence", "true")
        // As the engine's producer: only failed deliveries are reported.
        .set("delivery.report.only.error", "true")
        .set("linger.ms", tuning.linger_ms.to_string())
        .set("batch.size", tuning.batch_size.to_string())
        .create_with_context(Failures::default())
        .map_err(BenchError::kafka("producer"))
}

/// How long a send waits for room while the local queue is full (as long as a flush may take).
const QUEUE_FULL_WAIT: Duration = Duration::from_secs(300);

/// Sends `record`, making room as the engine does while the local queue is full: serve the
/// reports that are ready, then sleep up to a millisecond in `rd_kafka_flush`. rust-rdkafka's
/// `poll(1 ms)` would spin through that millisecond instead, and a ceiling client that
/// spins takes the cores the broker needs (measured: the produce-only ceiling came out
/// below the read-process-write one at every round).
fn send_all(
    producer: &BaseProducer<Failures>,
    record: BaseRecord<'_, [u8], [u8]>,
) -> Result<(), BenchError> {
    send::send(producer, record, QUEUE_FULL_WAIT, |p| {
        p.poll(Duration::ZERO);
        // SAFETY: the producer's native handle is valid while `p` lives; rd_kafka_flush is
        // thread-safe and only waits here (delivery reports are events served by poll).
        unsafe {
            rdkafka::bindings::rd_kafka_flush(p.client().native_ptr(), 1);
        }
    })
    .map_err(BenchError::kafka("produce"))
}

fn finish(producer: &BaseProducer<Failures>) -> Result<(), BenchError> {
    producer
        .flush(Duration::from_secs(300))
        .map_err(BenchError::kafka("flush"))?;
    // The first failure is kept by the same delivery report that counts it.
    match producer.context().first.get() {
        Some(first) => Err(BenchError::Undelivered {
            count: producer.context().count.load(Ordering::Relaxed),
            first: first.clone(),
        }),
        None => Ok(()),
    }
}

/// What the preloaded records look like.
#[derive(Debug, Clone, Copy)]
pub struct RecordShape {
    /// Value bytes.
    pub size: usize,
    /// Keys are the decimal ids modulo this (the count-by-key workload's distinct keys);
    /// `None`: the ids themselves.
    pub keys: Option<u64>,
}

/// Writes records of `shape` (keys: the decimal `ids`, or those modulo its key count) with
/// an idempotent producer, all of them or as many as fit before `until`, whichever comes
/// first, and returns how many it wrote and how long it took until every one was
/// acknowledged.
pub fn preload(
    bootstrap: &str,
    topic: &str,
    ids: std::ops::Range<u64>,
    until: Option<Instant>,
    shape: RecordShape,
    tuning: ProducerTuning,
    progress: &dyn Fn(u64),
) -> Result<(u64, Duration), BenchError> {
    let producer = producer(bootstrap, tuning)?;
    let value = value_of(shape.size);
    let started = Instant::now();
    let mut key = String::new();
    let mut written = 0u64;
    for id in ids {
        key.clear();
        key.push_str(&shape.keys.map_or(id, |k| id % k.max(1)).to_string());
        send_all(
            &producer,
            BaseRecord::to(topic)
                .key(key.as_bytes())
                .payload(&value[..]),
        )?;
        written += 1;
        if written.is_multiple_of(1024) {
            producer.poll(Duration::ZERO);
            progress(written);
            if until.is_some_and(|u| Instant::now() >= u) {
                break;
            }
        }
    }
    finish(&producer)?;
    Ok((written, started.elapsed()))
}

/// The read-process-write ceiling: reads `input` from the beginning (read_committed, one
/// `poll` per record like the engine) and writes every record, key and value unchanged, to
/// `output` with an idempotent producer tuned like the pipelines', with no transaction, no
/// offset commit and no processing, while `go_on(records written so far)` holds. Returns the records written.
pub fn read_process_write(
    bootstrap: &str,
    input: &str,
    partitions: i32,
    output: &str,
    tuning: ProducerTuning,
    go_on: &dyn Fn(u64) -> bool,
) -> Result<u64, BenchError> {
    let consumer = reader(bootstrap, input, partitions)?;
    let producer = producer(bootstrap, tuning)?;
    let mut written = 0u64;
    while go_on(written) {
        match consumer.poll(Duration::from_millis(10)) {
            Some(Ok(msg)) => {
                let mut record = BaseRecord::to(output);
                if let Some(k) = msg.key() {
                    record = record.key(k);
                }
                if let Some(v) = msg.payload() {
                    record = record.payload(v);
                }
                send_all(&producer, record)?;
                written += 1;
                if written.is_multiple_of(256) {
                    producer.poll(Duration::ZERO);
                }
            }
            Some(Err(e)) => {
                return Err(BenchError::Kafka {
                    what: "consume",
                    source: e,
                });
            }
            None => {
                producer.poll(Duration::ZERO);
            }
        }
    }
    finish(&producer)?;
    Ok(written)
}

fn value_of(size: usize) -> Vec<u8> {
    // Not compressible by accident either way: compression is off on both sides.
    (0..size).map(|i| b'a' + (i % 26) as u8).collect()
}

fn reader(bootstrap: &str, topic: &str, partitions: i32) -> Result<BaseConsumer, BenchError> {
    let group = format!("onceflow-bench-reader-{}", std::process::id());
    read::reader_from_beginning(&Cluster::new(bootstrap), &group, topic, partitions)
        .map_err(BenchError::kafka("consumer"))
}

/// What the reader of an output topic saw.
#[derive(Debug, Clone)]
pub struct ReaderReport {
    /// End-to-end latency of the probe records: input timestamp to visible here.
    pub e2e: Histogram,
}

/// Reads an output topic with read_committed in the background, counting bulk and probe
/// records and timing when the last bulk record became visible.
pub struct OutputReader {
    pub bulk: Arc<AtomicU64>,
    pub probes: Arc<AtomicU64>,
    /// When the `records`-th bulk record became visible.
    pub all_bulk_at: Arc<OnceLock<Instant>>,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<Result<ReaderReport, BenchError>>>,
}

impl OutputReader {
    pub fn start(
        bootstrap: &str,
        topic: &str,
        partitions: i32,
        records: u64,
    ) -> Result<OutputReader, BenchError> {
        let consumer = reader(bootstrap, topic, partitions)?;
        let bulk = Arc::new(AtomicU64::new(0));
        let probes = Arc::new(AtomicU64::new(0));
        let all_bulk_at = Arc::new(OnceLock::new());
        let stop = Arc::new(AtomicBool::new(false));
        let handle = {
            let (bulk, probes, all_bulk_at, stop) = (
                Arc::clone(&bulk),
                Arc::clone(&probes),
                Arc::clone(&all_bulk_at),
                Arc::clone(&stop),
            );
            std::thread::Builder::new()
                .name("bench-reader".into())
                .spawn(move || {
                    let mut e2e = Histogram::default();
                    let mut seen = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        match consumer.poll(Duration::from_millis(50)) {
                            Some(Ok(msg)) => {
                                let first = msg.key().and_then(|k| k.first()).copied();
                                if first == Some(WARM_UP) {
                                    continue;
                                }
                                if first == Some(PROBE_PREFIX) {
                                    if let Some(ts) = msg.timestamp().to_millis() {
                                        let now = SystemTime::now()
                                            .duration_since(UNIX_EPOCH)
                                            .map_or(0, |d| d.as_micros() as i64);
                                        e2e.record_us((now - ts * 1000).max(0) as u64, 1);
                                    }
                                    probes.fetch_add(1, Ordering::Relaxed);
                                } else {
                                    seen += 1;
                                    bulk.store(seen, Ordering::Relaxed);
                                    if seen == records {
                                        let _ = all_bulk_at.set(Instant::now());
                                    }
                                }
                            }
                            Some(Err(e)) => {
                                return Err(BenchError::Kafka {
                                    what: "read output",
                                    source: e,
                                });
                            }
                            None => {}
                        }
                    }
                    Ok(ReaderReport { e2e })
                })
                .map_err(BenchError::io("reader thread"))?
        };
        Ok(OutputReader {
            bulk,
            probes,
            all_bulk_at,
            stop,
            handle: Some(handle),
        })
    }

    pub fn is_running(&self) -> bool {
        self.handle.as_ref().is_some_and(|h| !h.is_finished())
    }

    pub fn finish(mut self) -> Result<ReaderReport, BenchError> {
        self.stop.store(true, Ordering::Relaxed);
        match self.handle.take() {
            Some(h) => h
                .join()
                .map_err(|_| BenchError::Other("the reader thread panicked".into()))?,
            None => Err(BenchError::Other("reader already finished".into())),
        }
    }
}

impl Drop for OutputReader {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Writes probe records (keys `p<n>`), each stamped with the time it is produced, without
/// lingering.
pub struct Prober {
    producer: BaseProducer<Failures>,
    topic: String,
    value: Vec<u8>,
}

impl Prober {
    /// Creates the producer and writes one warm-up record (key `w`, which the reader skips),
    /// so that connecting and getting a producer id do not count as latency later.
    pub fn new(
        bootstrap: &str,
        topic: &str,
        size: usize,
        linger_ms: u64,
    ) -> Result<Prober, BenchError> {
        let producer: BaseProducer<Failures> = Cluster::new(bootstrap)
            .config()
            .set("enable.idempotence", "true")
            .set("linger.ms", linger_ms.to_string())
            .create_with_context(Failures::default())
            .map_err(BenchError::kafka("probe producer"))?;
        send_all(
            &producer,
            BaseRecord::to(topic).key(&[WARM_UP][..]).payload(&[][..]),
        )?;
        finish(&producer)?;
        Ok(Prober {
            producer,
            topic: topic.to_string(),
            value: value_of(size),
        })
    }

    /// Writes `count` probe records at `rate` records a second.
    pub fn run(&self, count: u64, rate: u64) -> Result<(), BenchError> {
        let started = Instant::now();
        for n in 0..count {
            let due = started + Duration::from_secs_f64(n as f64 / rate.max(1) as f64);
            while let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait.min(Duration::from_millis(5)));
                self.producer.poll(Duration::ZERO);
            }
            let key = format!("p{n}");
            send_all(
                &self.producer,
                BaseRecord::to(&self.topic)
                    .key(key.as_bytes())
                    .payload(&self.value[..]),
            )?;
            self.producer.poll(Duration::ZERO);
        }
        finish(&self.producer)
    }
}
