//! Kafka's own `ProducerPerformance` and `ConsumerPerformance` (the classes behind
//! `kafka-producer-perf-test.sh` and `kafka-consumer-perf-test.sh`), run through
//! `scripts/kafka tool`, as a cross-check of the bench's own ceilings: other client code
//! (the Java client), the same broker, the same producer settings.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::BenchError;
use crate::kafka::ProducerTuning;
use crate::plan::Kind;
use crate::procs::Proc;

/// One run of a tool.
pub struct Tool<'a> {
    pub script: &'a Path,
    pub bootstrap: &'a str,
    pub topic: &'a str,
    pub records: u64,
    pub record_size: usize,
    pub tuning: ProducerTuning,
    /// ConsumerPerformance's consumer group.
    pub group: String,
    /// Where its config file goes.
    pub dir: &'a Path,
}

/// What a tool reported, and what it cost.
#[derive(Debug, Clone, Copy)]
pub struct Ran {
    pub records: u64,
    pub records_per_s: f64,
    /// CPU time of the JVM, start-up included.
    pub cpu_s: f64,
    pub rss_kib: Option<u64>,
}

/// A marker neither tool prints: they are not waited on for readiness.
const NO_MARKER: &str = "onceflow-bench: no such line";

impl Tool<'_> {
    pub fn run(&self, kind: Kind, timeout: Duration) -> Result<Ran, BenchError> {
        let mut cmd = Command::new(self.script);
        cmd.arg("tool");
        match kind {
            Kind::ProducerPerf => {
                cmd.arg("org.apache.kafka.tools.ProducerPerformance")
                    .args(["--topic", self.topic])
                    .args(["--num-records", &self.records.to_string()])
                    .args(["--record-size", &self.record_size.to_string()])
                    .args(["--throughput", "-1"])
                    .arg("--producer-props")
                    .arg(format!("bootstrap.servers={}", self.bootstrap))
                    .args([
                        "acks=all",
                        "enable.idempotence=true",
                        "compression.type=none",
                    ])
                    .arg(format!("linger.ms={}", self.tuning.linger_ms))
                    .arg(format!("batch.size={}", self.tuning.batch_size));
            }
            Kind::ConsumerPerf => {
                let config = self.dir.join("consumer.properties");
                std::fs::write(&config, "isolation.level=read_committed\n")
                    .map_err(BenchError::io(config.display()))?;
                cmd.arg("org.apache.kafka.tools.ConsumerPerformance")
                    .args(["--bootstrap-server", self.bootstrap])
                    .args(["--topic", self.topic])
                    .args(["--messages", &self.records.to_string()])
                    .args(["--group", &self.group])
                    .args(["--timeout", "60000"])
                    .arg("--consumer.config")
                    .arg(&config);
            }
            _ => return Err(BenchError::Other(format!("{kind:?} is not a Kafka tool"))),
        }
        let name = if kind == Kind::ProducerPerf {
            "ProducerPerformance"
        } else {
            "ConsumerPerformance"
        };
        let mut proc = Proc::spawn(name, cmd, NO_MARKER)?;
        let deadline = Instant::now() + timeout;
        let mut rss_kib = None;
        loop {
            // VmHWM only grows: the last reading before it exits is its peak.
            rss_kib = proc.peak_rss_kib().or(rss_kib);
            if proc.exited().is_some() {
                break;
            }
            if Instant::now() > deadline {
                proc.terminate(Duration::from_secs(5));
                return Err(BenchError::Timeout(format!("{name} after {timeout:?}")));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        // It has exited: this only collects its exit and its output.
        let exit = proc.terminate(Duration::from_secs(1));
        if exit.code != Some(0) {
            return Err(proc.failure(&format!("failed ({:?})", exit.code)));
        }
        let lines = proc.output();
        let parsed = if kind == Kind::ProducerPerf {
            lines.iter().rev().find_map(|l| parse_producer(l))
        } else {
            lines.iter().rev().find_map(|l| parse_consumer(l))
        };
        let (records, records_per_s) =
            parsed.ok_or_else(|| proc.failure("printed no figures the bench can read"))?;
        Ok(Ran {
            records,
            records_per_s,
            cpu_s: exit.cpu_s,
            rss_kib,
        })
    }
}

/// ProducerPerformance's last line: `N records sent, R records/sec (M MB/sec), ...`.
fn parse_producer(line: &str) -> Option<(u64, f64)> {
    let (n, rest) = line.trim().split_once(" records sent, ")?;
    let (rate, _) = rest.split_once(" records/sec")?;
    Some((n.trim().parse().ok()?, rate.trim().parse().ok()?))
}

/// ConsumerPerformance's result line: `start.time, end.time, data.consumed.in.MB, MB.sec,
/// data.consumed.in.nMsg, nMsg.sec, rebalance.time.ms, fetch.time.ms, fetch.MB.sec,
/// fetch.nMsg.sec`; the fetch rate leaves the group join out.
fn parse_consumer(line: &str) -> Option<(u64, f64)> {
    let f: Vec<&str> = line.split(',').map(str::trim).collect();
    if f.len() < 10 {
        return None;
    }
    let records: u64 = f[4].parse().ok()?;
    let rate: f64 = f[9].parse().ok()?;
    (records > 0 && rate.is_finite()).then_some((records, rate))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tools_figures_parse() {
        let p = "3000000 records sent, 151386.2 records/sec (147.84 MB/sec), 120.3 ms avg latency, 900.0 ms max latency, 100 ms 50th, 300 ms 95th, 500 ms 99th, 800 ms 99.9th.";
        assert_eq!(parse_producer(p), Some((3_000_000, 151_386.2)));
        assert_eq!(parse_producer("start.time, end.time"), None);
        let c = "2026-12-01 22:10:00:000, 2026-12-01 22:10:12:000, 2929.6875, 244.1406, 3000000, 250000.0000, 3012, 8988, 325.9549, 333778.3712";
        assert_eq!(parse_consumer(c), Some((3_000_000, 333_778.371_2)));
        let header = "start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec";
        assert_eq!(parse_consumer(header), None);
    }
}
