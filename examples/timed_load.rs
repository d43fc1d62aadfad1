//! Writes the input of `benches/window-count`: N records keyed `k<i % KEYS>`, each with a
//! value of about 100 bytes and a timestamp that moves evenly over SPAN_MS (so that tumbling
//! windows of a minute open and close as the records are read). With RATE, at RATE records a
//! second, each timestamped when it is sent (SPAN_MS is then unused): `benches/window-steady`.
//!
//! ```text
//! cargo run --release --example timed_load -- BOOTSTRAP TOPIC N KEYS SPAN_MS [RATE]
//! ```
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

type Error = Box<dyn std::error::Error>;

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (bootstrap, topic, n, keys, span_ms, rate) = match args.as_slice() {
        [b, t, n, k, s] => (b, t, n, k, s, None),
        [b, t, n, k, s, r] => (b, t, n, k, s, Some(r.parse::<f64>()?)),
        _ => return Err("usage: timed_load BOOTSTRAP TOPIC N KEYS SPAN_MS [RATE]".into()),
    };
    let (n, keys, span_ms): (u64, u64, i64) = (n.parse()?, keys.parse()?, span_ms.parse()?);
    let started = std::time::Instant::now();
    // The timestamps end an hour ago, on a whole minute: results timestamped with their
    // windows stay within the topics' retention.
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis() as i64;
    let base_ms = (now_ms - span_ms - 3_600_000) / 60_000 * 60_000;
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("linger.ms", "20")
        .set("batch.size", "262144")
        .create()?;
    let pad = "x".repeat(80);
    for i in 0..n {
        let key = format!("k{}", i % keys);
        let value = format!(r#"{{"n":{i},"pad":"{pad}"}}"#);
        let ts = match rate {
            None => base_ms + (i as i128 * span_ms as i128 / n.max(1) as i128) as i64,
            Some(rate) => {
                let due = started + Duration::from_secs_f64(i as f64 / rate);
                if let Some(wait) = due.checked_duration_since(std::time::Instant::now()) {
                    producer.poll(Duration::ZERO);
                    std::thread::sleep(wait);
                }
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)?
                    .as_millis() as i64
            }
        };
        let mut record = BaseRecord::to(topic)
            .key(&key)
            .payload(&value)
            .timestamp(ts);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((_, back)) => {
                    record = back;
                    producer.poll(Duration::from_millis(5));
                }
            }
        }
        if i % 100_000 == 0 {
            producer.poll(Duration::ZERO);
        }
    }
    producer.flush(Duration::from_secs(300))?;
    Ok(())
}
