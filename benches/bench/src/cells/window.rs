//! One timed cell: its processes launched, the measured window read from the output
//! reader and `/proc` at both ends, the latency probe, then the stop.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::CellCtx;
use super::stop::stop;
use crate::kafka::{self, OutputReader};
use crate::plan::{BenchConfig, CellResult};
use crate::procs::Proc;
use crate::{BenchError, machine};

/// The readings taken at either end of a measured window.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Snapshot {
    pub(crate) at: Instant,
    /// Records visible to the reader.
    pub(crate) visible: u64,
    /// CPU seconds of the cell's processes so far.
    pub(crate) procs_cpu: Option<f64>,
    pub(crate) broker_cpu: Option<f64>,
    /// CPU seconds of this bench process (its reader of the output).
    pub(crate) bench_cpu: Option<f64>,
    pub(crate) machine: Option<machine::MachineCpu>,
    pub(crate) broker_read: Option<u64>,
    pub(crate) reclaimed: Option<u64>,
    /// Bytes of memory free (neither used nor cache).
    pub(crate) free: Option<u64>,
}

impl Snapshot {
    pub(crate) fn take(
        at: Instant,
        visible: u64,
        procs: &[Proc],
        broker_pid: Option<u32>,
    ) -> Snapshot {
        let procs_cpu = procs
            .iter()
            .map(|p| machine::process_cpu_s(p.id()))
            .sum::<Option<f64>>();
        Snapshot {
            at,
            visible,
            procs_cpu,
            broker_cpu: broker_pid.and_then(machine::process_cpu_s),
            bench_cpu: machine::process_cpu_s(std::process::id()),
            machine: machine::machine_cpu(),
            broker_read: broker_pid.and_then(machine::process_read_bytes),
            reclaimed: machine::reclaimed_bytes(),
            free: machine::mem_free_bytes(),
        }
    }

    /// The broker's reads from storage and the memory reclaimed from `self` to `end`, in MiB.
    pub(crate) fn memory_until(&self, end: &Snapshot) -> (Option<f64>, Option<f64>) {
        let mib = |a: Option<u64>, b: Option<u64>| Some(b?.saturating_sub(a?) as f64 / MIB);
        (
            mib(self.broker_read, end.broker_read),
            mib(self.reclaimed, end.reclaimed),
        )
    }
}

pub(crate) const MIB: f64 = 1024.0 * 1024.0;

/// The rate of a pipeline's latency probe: `probe_rate`, or the share `probe_load` of the
/// rate the pipeline was measured at (never below 1 record a second).
fn probe_rate(cfg: &BenchConfig, measured: Option<f64>) -> u64 {
    match (cfg.probe_load, measured) {
        (Some(share), Some(rate)) => ((share * rate).round() as u64).max(1),
        _ => cfg.probe_rate,
    }
}

impl CellCtx<'_> {
    /// Runs one timed cell: launch, measure the window, probe the latency (pipelines), stop.
    pub(super) fn run_timed(
        &self,
        result: &mut CellResult,
        output: &str,
        probe: &str,
    ) -> Result<(), BenchError> {
        let cfg = self.cfg;
        let spec = result.spec;
        let label = spec.label();
        let dir = self
            .work
            .join(format!("p{}-{label}-r{}", self.partitions, self.round));
        std::fs::create_dir_all(&dir).map_err(BenchError::io(dir.display()))?;
        let reader = OutputReader::start(self.bootstrap, output, self.partitions, self.records)?;
        let probing = spec.is_pipeline() && cfg.probe_rate > 0 && cfg.probe_secs > 0.0;
        let prober = if probing {
            // At a share of the load the probe batches as the preload does (one request per
            // record would queue in its own producer and count as the pipeline's latency).
            let linger_ms = cfg.probe_load.map_or(0, |_| cfg.tuning.linger_ms);
            Some(kafka::Prober::new(
                self.bootstrap,
                probe,
                cfg.record_size,
                linger_ms,
            )?)
        } else {
            None
        };
        let launched = Instant::now();
        let mut procs = self.launch(spec, output, probe, &dir)?;
        self.measure(&mut procs, &reader, result, launched)?;

        if let Some(prober) = &prober {
            let rate = probe_rate(cfg, result.records_per_s());
            let probes = (rate as f64 * cfg.probe_secs).round() as u64;
            self.bar.set_message(format!(
                "p={} r{} {label}: latency probe at {rate} records/s",
                self.partitions, self.round
            ));
            prober.run(probes, rate)?;
            self.wait_for(&mut procs, &reader, "latency probe", &|| {
                reader.probes.load(Ordering::Relaxed) >= probes
            })?;
        }

        let stopped = stop(&mut procs, spec, &dir)?;
        let report = reader.finish()?;
        result.commits = stopped.commits;
        result.commit = stopped.commit;
        result.commit_steps = stopped.commit_steps;
        result.e2e = (report.e2e.count() > 0).then_some(report.e2e);
        result.peak_rss_mib = (stopped.rss_kib > 0).then(|| stopped.rss_kib as f64 / 1024.0);
        result.cpu_s = Some(stopped.cpu_s);
        Ok(())
    }

    /// Follows the reader until all the input is visible and fills in the window: it starts
    /// at the first record that becomes visible `warmup` seconds after the cell is ready
    /// (with read_committed, a commit boundary), or when it is ready if the warm-up is 0 or
    /// the cell drained the input before it ended; it ends when the last record is visible.
    fn measure(
        &self,
        procs: &mut [Proc],
        reader: &OutputReader,
        result: &mut CellResult,
        launched: Instant,
    ) -> Result<(), BenchError> {
        let cfg = self.cfg;
        let label = result.spec.label();
        let warmup = Duration::from_secs_f64(cfg.warmup_secs.max(0.0));
        let deadline = Instant::now() + cfg.cell_timeout;
        let mut ready: Option<(Instant, Snapshot)> = None;
        let mut start: Option<Snapshot> = None;
        let mut previous = 0;
        let mut load = machine::load1();
        let mut load_read = Instant::now();
        let end = loop {
            let now = Instant::now();
            let visible = reader.bulk.load(Ordering::Relaxed);
            if let Some(&at) = reader.all_bulk_at.get() {
                break Snapshot::take(at, self.records, procs, self.broker_pid);
            }
            self.check(procs, reader, now, deadline, "processing")?;
            if ready.is_none()
                && let Some(at) = procs.iter().filter_map(|p| p.ready.get().copied()).min()
            {
                // Nothing is visible before the cell is ready: the window of a cell without
                // a warm-up starts at 0 records, when it said it was ready.
                ready = Some((at, Snapshot::take(at, 0, procs, self.broker_pid)));
            }
            if let Some((at, _)) = ready
                && start.is_none()
                && now >= at + warmup
                && (warmup.is_zero() || visible > previous)
            {
                start = Some(Snapshot::take(now, visible, procs, self.broker_pid));
            }
            if now.duration_since(load_read) >= Duration::from_secs(1) {
                load = max_load(load, machine::load1());
                load_read = now;
            }
            previous = visible;
            self.progress(&label, visible);
            std::thread::sleep(Duration::from_millis(20));
        };
        load = max_load(load, machine::load1());
        let Some((ready_at, at_ready)) = ready else {
            return Err(BenchError::Other(format!(
                "{label} moved every record before it said it was ready"
            )));
        };
        result.warmed_up = start.is_some();
        let start = start.unwrap_or(at_ready);
        let window = end.at.saturating_duration_since(start.at).as_secs_f64();
        let delta = |a: Option<f64>, b: Option<f64>| Some(b? - a?);
        result.startup_s = Some(ready_at.duration_since(launched).as_secs_f64());
        result.window_s = Some(window);
        result.window_records = Some(end.visible.saturating_sub(start.visible));
        result.window_cpu_s = delta(start.procs_cpu, end.procs_cpu);
        result.load1 = load;
        (result.broker_read_mib, result.reclaimed_mib) = start.memory_until(&end);
        result.free_mib = start.free.map(|b| b as f64 / MIB);
        if window > 0.0 {
            result.broker_cores = delta(start.broker_cpu, end.broker_cpu).map(|c| c / window);
            result.machine_cores = match (start.machine, end.machine) {
                (Some(a), Some(b)) if b.total_s > a.total_s => {
                    // busy share of all cores, times the cores
                    Some((b.busy_s - a.busy_s) / (b.total_s - a.total_s) * machine::cores() as f64)
                }
                _ => None,
            };
            let cores = |a: Option<f64>, b: Option<f64>| delta(a, b).map(|c| c / window);
            result.other_cores = result.machine_cores.and_then(|machine| {
                let cell = cores(start.procs_cpu, end.procs_cpu)?;
                let bench = cores(start.bench_cpu, end.bench_cpu)?;
                Some((machine - cell - bench - result.broker_cores.unwrap_or(0.0)).max(0.0))
            });
        }
        Ok(())
    }

    /// Fails when a process has exited, the reader stopped, or the cell timed out.
    fn check(
        &self,
        procs: &mut [Proc],
        reader: &OutputReader,
        now: Instant,
        deadline: Instant,
        what: &str,
    ) -> Result<(), BenchError> {
        if now > deadline {
            return Err(BenchError::Timeout(format!(
                "{what}: {} of {} records visible after {:?}",
                reader.bulk.load(Ordering::Relaxed),
                self.records,
                self.cfg.cell_timeout
            )));
        }
        for p in procs.iter_mut() {
            if let Some(exit) = p.exited() {
                return Err(p.failure(&format!("exited early ({:?})", exit.code)));
            }
        }
        if !reader.is_running() {
            return Err(BenchError::ReaderStopped);
        }
        Ok(())
    }

    /// Waits until `done` (for at most the cell timeout), failing as soon as a process exits
    /// or the reader stops; `what` names the wait in a timeout.
    fn wait_for(
        &self,
        procs: &mut [Proc],
        reader: &OutputReader,
        what: &str,
        done: &dyn Fn() -> bool,
    ) -> Result<(), BenchError> {
        let deadline = Instant::now() + self.cfg.cell_timeout;
        while !done() {
            self.check(procs, reader, Instant::now(), deadline, what)?;
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }
}

fn max_load(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probe_at_a_share_of_load_follows_the_measured_rate() {
        let mut cfg = crate::plan::tests::cfg();
        cfg.probe_rate = 500;
        assert_eq!(probe_rate(&cfg, Some(150_000.0)), 500, "a fixed rate");
        cfg.probe_load = Some(0.5);
        assert_eq!(probe_rate(&cfg, Some(150_000.0)), 75_000, "half load");
        assert_eq!(probe_rate(&cfg, Some(0.4)), 1, "never below 1 a second");
        assert_eq!(
            probe_rate(&cfg, None),
            500,
            "no measured rate: the fixed one"
        );
    }
}
