//! Kafka's own `ProducerPerformance` and `ConsumerPerformance` ([`crate::perf`]) run as cells,
//! once per partition count, as a cross-check of the ceilings.

use std::time::Instant;

use super::CellCtx;
use super::window::{MIB, Snapshot};
use crate::plan::{CellResult, Kind};
use crate::{BenchError, machine, perf};

impl CellCtx<'_> {
    /// Runs one of Kafka's perf tools (see [`perf`]); `produce_rate` (the produce-only
    /// median) sizes ProducerPerformance's run to about `measure` seconds.
    pub(super) fn run_perf(
        &self,
        result: &mut CellResult,
        produce_rate: Option<f64>,
    ) -> Result<(), BenchError> {
        let cfg = self.cfg;
        let script = cfg.repo_dir()?.join("scripts/kafka");
        let dir = self
            .work
            .join(format!("p{}-{}", self.partitions, result.spec.label()));
        std::fs::create_dir_all(&dir).map_err(BenchError::io(dir.display()))?;
        let (topic, records) = match result.spec.kind {
            Kind::ProducerPerf => {
                let topic = format!("{}-producer-perf", self.input);
                self.admin.create_topic(&topic, self.partitions)?;
                let n = produce_rate
                    .map(|r| (r * (cfg.warmup_secs + cfg.measure_secs)) as u64)
                    .unwrap_or(self.records)
                    .clamp(1, self.records.max(1));
                (topic, n)
            }
            _ => (self.input.to_string(), self.records),
        };
        result.records = records;
        let tool = perf::Tool {
            script: &script,
            bootstrap: self.bootstrap,
            topic: &topic,
            records,
            record_size: cfg.record_size,
            tuning: cfg.tuning,
            group: format!("bench-{}-p{}-consumer-perf", self.run_id, self.partitions),
            dir: &dir,
        };
        let before = Snapshot::take(Instant::now(), 0, &[], self.broker_pid);
        let outcome = tool.run(result.spec.kind, cfg.cell_timeout);
        let after = Snapshot::take(Instant::now(), 0, &[], self.broker_pid);
        if result.spec.kind == Kind::ProducerPerf {
            let _ = self.admin.delete_topics(&[&topic]);
        }
        let ran = outcome?;
        let window = after.at.duration_since(before.at).as_secs_f64();
        result.warmed_up = false;
        result.window_records = Some(ran.records);
        result.window_s = Some(ran.records as f64 / ran.records_per_s);
        // The tools' CPU time covers the JVM's start too: an upper bound.
        result.cpu_s = Some(ran.cpu_s);
        result.window_cpu_s = Some(ran.cpu_s);
        result.peak_rss_mib = ran.rss_kib.map(|k| k as f64 / 1024.0);
        result.load1 = machine::load1();
        (result.broker_read_mib, result.reclaimed_mib) = before.memory_until(&after);
        result.free_mib = before.free.map(|b| b as f64 / MIB);
        if window > 0.0 {
            result.broker_cores = before
                .broker_cpu
                .zip(after.broker_cpu)
                .map(|(a, b)| (b - a) / window);
        }
        Ok(())
    }
}
