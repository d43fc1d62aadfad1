//! The cells of one partition count: its input sized and preloaded (and topped up when a
//! cell outran it), then every cell once per round and the cross-checks once. Each cell
//! launches its processes ([`launch`]), measures its window ([`window`]) and stops them
//! ([`stop`]); Kafka's perf tools run as cells of their own ([`cross_check`]).

mod cross_check;
mod launch;
mod stop;
mod window;

use std::path::Path;
use std::time::{Duration, Instant};

use indicatif::ProgressBar;
use onceflow::kafka::admin::Admin;

use crate::fill::{refill, top_up};
use crate::plan::{BenchConfig, CellResult, Kind, Spec};
use crate::{BenchError, kafka, machine, report, say, stats};

/// How far the `probe` of a partition count is read and written back to size its input.
const SIZING_SECS: f64 = 3.0;
/// How much more than the probe's rate the input is sized for (the probe itself is noisy,
/// and the quickest mode of a shared machine's quiet minute beats it).
const SIZING_MARGIN: f64 = 1.6;
/// The records a mode running at `rate` needs for its warm-up and window, with the margin.
fn input_for(rate: f64, cfg: &BenchConfig) -> f64 {
    rate * (cfg.warmup_secs + cfg.measure_secs) * SIZING_MARGIN
}

/// The size a probe-sized input of `records` grows to after a cell ran at `rate`: `None`
/// when it holds enough already, or was fixed by `--records`.
fn top_up_to(rate: f64, records: u64, cfg: &BenchConfig) -> Option<u64> {
    if cfg.records.is_some() {
        return None;
    }
    let want = (input_for(rate, cfg) as u64).min(cfg.max_records);
    (want > records).then_some(want)
}

/// How long the probe may wait for its first record.
const SIZING_GIVE_UP: Duration = Duration::from_secs(30);

/// What the cells of one partition count share: the run's settings, the broker and its
/// input topic, where they are in the rounds.
pub(crate) struct CellCtx<'a> {
    pub(crate) cfg: &'a BenchConfig,
    pub(crate) bootstrap: &'a str,
    pub(crate) admin: &'a Admin,
    pub(crate) input: &'a str,
    pub(crate) partitions: i32,
    /// Records in the input, once preloaded.
    pub(crate) records: u64,
    pub(crate) run_id: u64,
    pub(crate) round: u32,
    pub(crate) work: &'a Path,
    pub(crate) kstreams_libs: Option<&'a Path>,
    pub(crate) broker_pid: Option<u32>,
    pub(crate) bar: &'a ProgressBar,
    /// The page cache filled before the first cell, refilled after each topic deletion.
    pub(crate) fill: Option<&'a machine::PageCacheFill>,
    /// Whether to run each transactional mode once, unmeasured, before the first round.
    pub(crate) warm_transactions: bool,
}

impl CellCtx<'_> {
    fn progress(&self, label: &str, n: u64) {
        self.bar.set_message(format!(
            "p={} r{} {label}: {n}/{} records",
            self.partitions, self.round, self.records
        ));
    }

    /// Runs the first cell of each transactional kind (onceflow's, Kafka Streams') once, not
    /// measured: the broker's warm-up writes and reads without transactions, so its
    /// transaction code (EndTxn, the markers, TxnOffsetCommit) would otherwise be compiled by
    /// its JIT during round 0's first exactly-once cell, which then cost the broker up to
    /// twice the CPU per record of the rounds after.
    fn warm_up_transactions(&mut self, specs: &[Spec], rounds: u32) {
        let mut kinds = Vec::new();
        for spec in specs {
            if !matches!(spec.kind, Kind::Eos | Kind::KStreams) || kinds.contains(&spec.kind) {
                continue;
            }
            kinds.push(spec.kind);
            // A round of its own, past the measured ones: its topics and group are its own.
            self.round = rounds;
            let label = spec.label();
            self.bar
                .set_message(format!("p={} warm-up {label}", self.partitions));
            let mut result =
                CellResult::new(self.partitions, *spec, rounds, self.records, self.cfg);
            if let Err(e) = self.run_cell(&mut result) {
                say(self.bar, format!("warm-up {label} (not measured): {e}"));
            }
        }
        self.round = 0;
    }

    /// Sizes and preloads the input at this partition count, then runs every cell of `specs`
    /// once per round, then the cross-checks; appends each result to `results` (and rewrites
    /// bench.csv after each).
    pub(crate) fn run_cells(&mut self, specs: &[Spec], rounds: u32, results: &mut Vec<CellResult>) {
        let partitions = self.partitions;
        let input_ready = self
            .admin
            .create_topic(self.input, partitions)
            .map_err(BenchError::from)
            .and_then(|()| self.preload_input());
        if let Err(e) = &input_ready {
            say(self.bar, format!("p={partitions}: no input: {e}"));
        }
        let record = |ctx: &Self, result: CellResult, results: &mut Vec<CellResult>| {
            if ctx.bar.is_hidden() {
                // Without a bar, a line per cell shows the run's progress.
                let rate = result
                    .records_per_s()
                    .map_or_else(|| "no figure".to_string(), |r| format!("{r:.0} records/s"));
                eprintln!(
                    "cell {}/{}: p={} r{} {}: {rate}",
                    ctx.bar.position() + 1,
                    ctx.bar.length().unwrap_or(0),
                    result.partitions,
                    result.round,
                    result.spec.label()
                );
            }
            results.push(result);
            if let Err(e) = report::write_csv(&ctx.cfg.out_dir.join("bench.csv"), ctx.cfg, results)
            {
                say(ctx.bar, format!("{e}"));
            }
            ctx.bar.inc(1);
        };
        if self.warm_transactions && input_ready.is_ok() {
            self.warm_up_transactions(specs, rounds);
        }
        for round in 0..rounds {
            self.round = round;
            for spec in specs {
                let mut result = CellResult::new(partitions, *spec, round, self.records, self.cfg);
                self.bar
                    .set_message(format!("p={partitions} r{round} {}", spec.label()));
                let outcome = match &input_ready {
                    Err(e) => Err(BenchError::Other(format!("no input: {e}"))),
                    Ok(()) => self.run_cell(&mut result),
                };
                if let Err(e) = outcome {
                    say(
                        self.bar,
                        format!("p={partitions} r{round} {}: {e}", spec.label()),
                    );
                    result.error = Some(e.to_string());
                }
                let rate = result.records_per_s();
                record(self, result, results);
                if let Some(rate) = rate
                    && let Err(e) = self.top_up(rate)
                {
                    say(
                        self.bar,
                        format!("p={partitions}: could not top the input up: {e}"),
                    );
                }
            }
        }
        if self.cfg.kafka_perf {
            self.round = 0;
            let produce_rate = stats::Summary::of(
                results
                    .iter()
                    .filter(|r| r.partitions == partitions && r.spec.kind == Kind::Produce)
                    .filter_map(CellResult::records_per_s),
            )
            .map(|s| s.median);
            for kind in [Kind::ProducerPerf, Kind::ConsumerPerf] {
                let mut result = CellResult::new(partitions, Spec::of(kind), 0, 0, self.cfg);
                self.bar
                    .set_message(format!("p={partitions} {}", result.spec.label()));
                let outcome = match &input_ready {
                    Err(e) => Err(BenchError::Other(format!("no input: {e}"))),
                    Ok(()) => self.run_perf(&mut result, produce_rate),
                };
                if let Err(e) = outcome {
                    say(
                        self.bar,
                        format!("p={partitions} {}: {e}", result.spec.label()),
                    );
                    result.error = Some(e.to_string());
                }
                record(self, result, results);
            }
        }
    }

    /// Preloads the input: `--records` of them, or as many as the fastest mode needs for
    /// `warmup + measure` seconds by a short probe: produce for a few seconds, read that
    /// back and write it to a throwaway topic (the read-process-write ceiling, which no
    /// pipeline beats), then top the input up to that rate times the time, with a margin.
    fn preload_input(&mut self) -> Result<(), BenchError> {
        let cfg = self.cfg;
        let progress = |n| {
            self.bar
                .set_message(format!("p={} preload: {n} records", self.partitions))
        };
        if let Some(n) = cfg.records {
            kafka::preload(
                self.bootstrap,
                self.input,
                0..n,
                None,
                cfg.shape(),
                cfg.tuning,
                &progress,
            )?;
            self.records = n;
            return Ok(());
        }
        let sizing = Duration::from_secs_f64(SIZING_SECS);
        let (first, _) = kafka::preload(
            self.bootstrap,
            self.input,
            0..cfg.max_records,
            Some(Instant::now() + sizing),
            cfg.shape(),
            cfg.tuning,
            &progress,
        )?;
        let scratch = format!("{}-sizing", self.input);
        self.admin.create_topic(&scratch, self.partitions)?;
        self.bar
            .set_message(format!("p={} sizing probe", self.partitions));
        // The rate counts from the first record written: the client's start (connecting,
        // the first fetch) is no part of a steady cell either.
        let started = Instant::now();
        let first_written: std::cell::Cell<Option<Instant>> = std::cell::Cell::new(None);
        let moved = kafka::read_process_write(
            self.bootstrap,
            self.input,
            self.partitions,
            &scratch,
            cfg.tuning,
            &|n| {
                if n > 0 && first_written.get().is_none() {
                    first_written.set(Some(Instant::now()));
                }
                let probed = first_written.get().is_some_and(|t| t.elapsed() >= sizing);
                !probed && n < first && started.elapsed() < SIZING_GIVE_UP
            },
        );
        let took = first_written
            .get()
            .map_or(0.0, |t| t.elapsed().as_secs_f64());
        let _ = self.admin.delete_topics(&[&scratch]);
        let rate = moved? as f64 / took.max(1e-3);
        let want = input_for(rate, cfg) as u64;
        let want = want.clamp(first, cfg.max_records.max(first));
        say(
            self.bar,
            format!(
                "p={}: probe {:.0} records/s read-process-write: input sized to {want} records",
                self.partitions, rate
            ),
        );
        kafka::preload(
            self.bootstrap,
            self.input,
            first..want,
            None,
            cfg.shape(),
            cfg.tuning,
            &|n| progress(first + n),
        )?;
        self.records = want;
        Ok(())
    }

    /// A cell faster than the probe foresaw ran out of input before its window was long
    /// enough (it stays marked short): the input is topped up to that cell's rate, so that
    /// the cells after it are measured for as long as asked. Only a probe-sized input
    /// grows, never past `--max-records`; the new records continue the ids.
    fn top_up(&mut self, rate: f64) -> Result<(), BenchError> {
        let cfg = self.cfg;
        let Some(want) = top_up_to(rate, self.records, cfg) else {
            return Ok(());
        };
        say(
            self.bar,
            format!(
                "p={}: a cell ran at {rate:.0} records/s: input topped up from {} to {want} records",
                self.partitions, self.records
            ),
        );
        let from = self.records;
        kafka::preload(
            self.bootstrap,
            self.input,
            from..want,
            None,
            cfg.shape(),
            cfg.tuning,
            &|n| {
                self.bar
                    .set_message(format!("p={} top-up: {n} records", self.partitions))
            },
        )?;
        self.records = want;
        Ok(())
    }

    fn run_cell(&self, result: &mut CellResult) -> Result<(), BenchError> {
        let label = result.spec.label();
        // The probe records go through a topic of their own, which the pipeline reads
        // besides the input, so no cell processes an earlier cell's probes.
        let output = format!("{}-{label}-r{}", self.input, self.round);
        let probe = format!("{output}-probe");
        let mut topics = vec![output.as_str()];
        if result.spec.is_pipeline() {
            topics.push(&probe);
        }
        // What the kernel freed while the last refill read its file (kswapd reclaims gigabytes
        // beyond need on this machine: docs/benchmarks.md, "Refilled after every topic
        // deletion"), taken back before the start.
        top_up(self.fill);
        let outcome = self
            .admin
            .create_topic(&output, self.partitions)
            .and_then(|()| {
                if result.spec.is_pipeline() {
                    // A probe at a share of the load is spread as the input is; a few
                    // records a second need one partition.
                    let spread = if self.cfg.probe_load.is_some() {
                        self.partitions
                    } else {
                        1
                    };
                    self.admin.create_topic(&probe, spread)
                } else {
                    Ok(())
                }
            })
            .map_err(BenchError::from)
            .and_then(|()| self.run_timed(result, &output, &probe));
        if let Err(e) = self.admin.delete_topics(&topics) {
            say(self.bar, format!("could not delete {output}: {e}"));
        }
        refill(self.fill);
        outcome
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_input_grows_to_a_cell_that_outran_it_and_never_when_fixed() {
        let mut cfg = crate::plan::tests::cfg();
        cfg.max_records = 6_000_000;
        // 100,000 records/s for 5 + 15 s, with the margin of 1.6.
        assert_eq!(top_up_to(100_000.0, 1_000_000, &cfg), Some(3_200_000));
        // An input that holds enough already, or more, stays as it is.
        assert_eq!(top_up_to(100_000.0, 3_200_000, &cfg), None);
        assert_eq!(top_up_to(50_000.0, 3_200_000, &cfg), None);
        // Never past --max-records.
        assert_eq!(top_up_to(1_000_000.0, 1_000_000, &cfg), Some(6_000_000));
        assert_eq!(top_up_to(1_000_000.0, 6_000_000, &cfg), None);
        // An input fixed by --records never grows.
        cfg.records = Some(1_000);
        assert_eq!(top_up_to(1_000_000.0, 1_000, &cfg), None);
    }
}
