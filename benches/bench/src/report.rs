//! The bench's outputs: a CSV of every cell of every round, a markdown report, and an SVG
//! plot of throughput against partition count.
//!
//! Every absolute figure is the median over the rounds with its range (min–max); every
//! ratio of two modes is taken within each round (the two cells ran minutes apart, on the
//! same input, under the same neighbours) and then summarised the same way. A figure above
//! its ceiling (a pipeline above the read-process-write ceiling of the same round, that
//! ceiling above produce-only) cannot be true: it is reported as a measurement error, never
//! as a ratio over 1.

use std::fmt::Write as _;
use std::path::Path;

use plotters::prelude::*;

use crate::plan::{BenchConfig, CellResult, Kind, NOISE_CORES, Spec};
use crate::stats::{Summary, paired};
use crate::{BenchError, machine};
use onceflow::histogram::Histogram;

fn opt(v: Option<f64>, decimals: usize) -> String {
    v.map(|v| format!("{v:.decimals$}")).unwrap_or_default()
}

fn ms(us: Option<u64>) -> Option<f64> {
    us.map(|us| us as f64 / 1000.0)
}

pub const CSV_HEADER: &str = "partitions,mode,instances,commit_ms,round,records,record_bytes,window_s,window_records,warmed_up,records_per_s,mb_per_s,commits,commit_p50_ms,commit_p99_ms,deliveries_p50_ms,offsets_p50_ms,end_p50_ms,e2e_p50_ms,e2e_p99_ms,peak_rss_mib,cpu_s,window_cpu_s,cpu_us_per_record,records_per_cpu_s,startup_s,load1,broker_cores,machine_cores,other_cores,broker_read_mib,reclaimed_mib,free_mib,noisy,short,error";

/// Writes every cell so far (rewritten after each cell, so an interrupted run keeps its rows).
pub fn write_csv(path: &Path, cfg: &BenchConfig, results: &[CellResult]) -> Result<(), BenchError> {
    let cores = machine::cores();
    let mut out = String::from(CSV_HEADER);
    out.push('\n');
    for r in results {
        let commit = r.commit.as_ref();
        let steps = r.commit_steps.as_ref();
        let e2e = r.e2e.as_ref();
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
            r.partitions,
            r.spec.label(),
            r.spec.instances,
            r.spec.commit_ms.map(|m| m.to_string()).unwrap_or_default(),
            r.round,
            r.records,
            r.record_size,
            opt(r.window_s, 3),
            r.window_records.map(|n| n.to_string()).unwrap_or_default(),
            r.warmed_up,
            opt(r.records_per_s(), 0),
            opt(r.mb_per_s(), 1),
            r.commits.map(|c| c.to_string()).unwrap_or_default(),
            opt(ms(commit.and_then(|h| h.percentile(0.5))), 2),
            opt(ms(commit.and_then(|h| h.percentile(0.99))), 2),
            opt(ms(steps.and_then(|s| s.deliveries.percentile(0.5))), 2),
            opt(ms(steps.and_then(|s| s.offsets.percentile(0.5))), 2),
            opt(ms(steps.and_then(|s| s.end.percentile(0.5))), 2),
            opt(ms(e2e.and_then(|h| h.percentile(0.5))), 1),
            opt(ms(e2e.and_then(|h| h.percentile(0.99))), 1),
            opt(r.peak_rss_mib, 1),
            opt(r.cpu_s, 2),
            opt(r.window_cpu_s, 2),
            opt(r.cpu_us_per_record(), 2),
            opt(r.records_per_cpu_s(), 0),
            opt(r.startup_s, 2),
            opt(r.load1, 2),
            opt(r.broker_cores, 2),
            opt(r.machine_cores, 2),
            opt(r.other_cores, 2),
            opt(r.broker_read_mib, 0),
            opt(r.reclaimed_mib, 0),
            opt(r.free_mib, 0),
            r.noisy(cores),
            r.short(cfg),
            r.error
                .as_deref()
                .map(|e| format!("\"{}\"", e.replace('"', "'").replace('\n', " ")))
                .unwrap_or_default(),
        );
    }
    std::fs::write(path, out).map_err(BenchError::io(path.display()))
}

fn k(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.1}k", v / 1000.0)
    } else {
        format!("{v:.0}")
    }
}

/// `median (min–max)`, each figure formatted by `f`; a lone value without its range.
fn summary(s: Option<Summary>, f: impl Fn(f64) -> String) -> String {
    match s {
        None => "–".into(),
        Some(s) if s.n == 1 => f(s.median),
        Some(s) => format!("{} ({}–{})", f(s.median), f(s.min), f(s.max)),
    }
}

fn x2(v: f64) -> String {
    format!("{v:.2}")
}

fn x0(v: f64) -> String {
    format!("{v:.0}")
}

/// The distinct cell kinds in plan order.
fn specs(results: &[CellResult]) -> Vec<Spec> {
    let mut specs: Vec<Spec> = Vec::new();
    for r in results {
        if !specs.contains(&r.spec) {
            specs.push(r.spec);
        }
    }
    specs
}

fn partition_counts(results: &[CellResult]) -> Vec<i32> {
    let mut ps: Vec<i32> = Vec::new();
    for r in results {
        if !ps.contains(&r.partitions) {
            ps.push(r.partitions);
        }
    }
    ps
}

/// `f` of every successful round of `spec` at `partitions`, with its round.
fn rounds(
    results: &[CellResult],
    partitions: i32,
    spec: Spec,
    f: impl Fn(&CellResult) -> Option<f64>,
) -> Vec<(u32, f64)> {
    results
        .iter()
        .filter(|r| r.partitions == partitions && r.spec == spec && r.error.is_none())
        .filter_map(|r| f(r).map(|v| (r.round, v)))
        .collect()
}

fn median_of(
    results: &[CellResult],
    partitions: i32,
    spec: Spec,
    f: impl Fn(&CellResult) -> Option<f64>,
) -> Option<Summary> {
    Summary::of(
        rounds(results, partitions, spec, f)
            .into_iter()
            .map(|(_, v)| v),
    )
}

/// The ceiling a mode cannot beat: the read-process-write ceiling for a pipeline, the
/// produce-only one for the read-process-write ceiling.
fn ceiling_of(spec: Spec) -> Option<Spec> {
    if spec.is_pipeline() {
        Some(Spec::of(Kind::Rpw))
    } else if spec.kind == Kind::Rpw {
        Some(Spec::of(Kind::Produce))
    } else {
        None
    }
}

/// A ratio of two modes, paired by round.
#[derive(Debug, Clone, PartialEq)]
pub struct Paired {
    pub summary: Option<Summary>,
    /// Rounds in which the numerator beat its ceiling (only for a ratio to a ceiling).
    pub above: usize,
}

/// `a / b` at `partitions`, paired by round; `b` being `a`'s ceiling makes a ratio over 1 a
/// measurement error.
pub fn ratio(results: &[CellResult], partitions: i32, a: Spec, b: Spec) -> Paired {
    let rate = |s| rounds(results, partitions, s, CellResult::records_per_s);
    let pairs = paired(&rate(a), &rate(b));
    let is_ceiling = ceiling_of(a) == Some(b);
    Paired {
        summary: Summary::of(pairs.iter().map(|(_, v)| *v)),
        above: if is_ceiling {
            pairs.iter().filter(|(_, v)| *v > 1.0).count()
        } else {
            0
        },
    }
}

fn show(p: &Paired) -> String {
    match p.summary {
        Some(s) if p.above > 0 => format!(
            "**error**: above its ceiling in {} of {} rounds",
            p.above, s.n
        ),
        s => summary(s, x2),
    }
}

/// The pairs of modes whose ratios the report gives: every mode to its ceiling, then the
/// first single-instance exactly-once mode against at-least-once and Kafka Streams at its
/// commit interval, and the other exactly-once modes against it.
fn ratio_pairs(specs: &[Spec]) -> Vec<(Spec, Spec)> {
    let mut pairs: Vec<(Spec, Spec)> = specs
        .iter()
        .filter_map(|s| {
            ceiling_of(*s)
                .filter(|c| specs.contains(c))
                .map(|c| (*s, c))
        })
        .collect();
    let eos = specs
        .iter()
        .copied()
        .find(|s| s.kind == Kind::Eos && s.instances == 1);
    if let Some(eos) = eos {
        for s in specs {
            let against = match s.kind {
                Kind::Alos => true,
                Kind::KStreams | Kind::EosOverlap => s.commit_ms == eos.commit_ms,
                _ => false,
            };
            if against {
                pairs.push((eos, *s));
            }
        }
    }
    pairs
}

/// The CPU-normalised pairs: exactly-once against each Kafka Streams mode of its interval.
fn cpu_pairs(specs: &[Spec]) -> Vec<(Spec, Spec)> {
    specs
        .iter()
        .filter(|s| s.kind == Kind::Eos && s.instances == 1)
        .flat_map(|e| {
            specs
                .iter()
                .filter(|k| k.kind == Kind::KStreams && k.commit_ms == e.commit_ms)
                .map(|k| (*e, *k))
        })
        .collect()
}

fn cpu_ratio(results: &[CellResult], partitions: i32, a: Spec, b: Spec) -> Option<Summary> {
    let per_cpu = |s| rounds(results, partitions, s, CellResult::records_per_cpu_s);
    Summary::of(paired(&per_cpu(a), &per_cpu(b)).into_iter().map(|(_, v)| v))
}

/// The markdown report: how it was run and on what, throughput, paired ratios, CPU and
/// memory, the cross-check, what went wrong, and every cell.
pub fn markdown(cfg: &BenchConfig, results: &[CellResult]) -> String {
    let mut md = String::new();
    setup(&mut md, cfg, results);
    rates_table(&mut md, cfg, results);
    ratios_table(&mut md, results);
    cpu_tables(&mut md, results);
    commit_steps_table(&mut md, results);
    problems(&mut md, cfg, results);
    cells_table(&mut md, cfg, results);
    md
}

fn setup(md: &mut String, cfg: &BenchConfig, results: &[CellResult]) {
    let cores = machine::cores();
    let timed: Vec<&CellResult> = results.iter().filter(|r| r.error.is_none()).collect();
    let load = Summary::of(timed.iter().filter_map(|r| r.load1));
    let broker = Summary::of(timed.iter().filter_map(|r| r.broker_cores));
    let busy = Summary::of(timed.iter().filter_map(|r| r.machine_cores));
    let other = Summary::of(timed.iter().filter_map(|r| r.other_cores));
    let noisy = timed.iter().filter(|r| r.noisy(cores)).count();
    // Over the measured windows (Kafka's tools have none: their readings span their run).
    let windowed = || timed.iter().filter(|r| !r.spec.is_cross_check());
    let per_s = |v: Option<f64>, r: &&CellResult| Some(v? / r.window_s.filter(|w| *w > 0.0)?);
    let read = Summary::of(windowed().filter_map(|r| per_s(r.broker_read_mib, r)));
    let reclaimed = Summary::of(windowed().filter_map(|r| per_s(r.reclaimed_mib, r)));
    let _ = writeln!(md, "Command: `{}`\n", cfg.command);
    let _ = writeln!(md, "Machine: {}.", machine::describe());
    let _ = writeln!(
        md,
        "Load average (1 min, the highest seen in each cell): {}; machine CPU in use in the \
         windows: {} cores; the broker's share: {} cores; everything else's (besides the \
         cell, the broker and this bench): {} cores.",
        summary(load, x2),
        summary(busy, x2),
        summary(broker, x2),
        summary(other, x2),
    );
    let verdict = if noisy == 0 {
        format!(
            "**quiet**: in no cell did other work use more than {NOISE_CORES} cores of the {cores}"
        )
    } else {
        format!(
            "**noisy**: in {noisy} of {} cells other work used more than {NOISE_CORES} cores of \
             the {cores} (marked `noisy` below); read the ranges before the medians",
            timed.len()
        )
    };
    if read.is_some() || reclaimed.is_some() {
        let _ = writeln!(
            md,
            "Memory, MiB/s in the windows: the broker read {} from storage (records no longer \
             in the page cache); the kernel reclaimed {} machine-wide (once memory is full \
             of page cache, new writes take pages back).",
            summary(read, x0),
            summary(reclaimed, x0),
        );
    }
    let _ = writeln!(md, "Verdict: {verdict}.\n");
    let sizing = match cfg.records {
        Some(_) => "fixed by --records",
        None => "sized from a probe and topped up after any cell that outran it (largest size)",
    };
    let records: Vec<String> = partition_counts(results)
        .iter()
        .filter_map(|p| {
            results
                .iter()
                .filter(|r| r.partitions == *p && !r.spec.is_cross_check())
                .map(|r| r.records)
                .max()
                .map(|n| format!("{p}: {n}"))
        })
        .collect();
    let _ = writeln!(
        md,
        "Input: records of {} B, {sizing}, per partition count ({}); the first {} s after a \
         cell is ready are not measured, the quickest mode is measured for about {} s; {} rounds, the \
         modes of a partition count interleaved; producer linger.ms {} / batch.size {}, \
         idempotent; latency probe {} for {} s; {}.\n",
        cfg.record_size,
        records.join(", "),
        cfg.warmup_secs,
        cfg.measure_secs,
        cfg.rounds,
        cfg.tuning.linger_ms,
        cfg.tuning.batch_size,
        match cfg.probe_load {
            Some(share) => format!("at {share} of each pipeline's measured rate"),
            None => format!("{} records/s", cfg.probe_rate),
        },
        cfg.probe_secs,
        if cfg.fill_page_cache {
            "the page cache filled before the first cell and after each topic deletion (free \
             memory taken by a sparse file's pages, as a broker's log takes it over time)"
        } else {
            "the page cache not filled first"
        },
    );
}

/// Records/s by mode (columns) and partition count (rows): median (min–max) over the rounds,
/// and the flatness row (medians at the last partition count over the best one).
fn rates_table(md: &mut String, cfg: &BenchConfig, results: &[CellResult]) {
    let specs = specs(results);
    let ps = partition_counts(results);
    let _ = writeln!(
        md,
        "Records/s, median (min–max) over {} rounds; the Kafka tools ran once:\n",
        cfg.rounds
    );
    let _ = write!(md, "| partitions |");
    for s in &specs {
        let _ = write!(md, " {} |", s.label());
    }
    let _ = writeln!(md, "\n|---:|{}", "---:|".repeat(specs.len()));
    for &p in &ps {
        let _ = write!(md, "| {p} |");
        for s in &specs {
            let m = median_of(results, p, *s, CellResult::records_per_s);
            let _ = write!(md, " {} |", summary(m, k));
        }
        let _ = writeln!(md);
    }
    if ps.len() > 1
        && let Some(&last) = ps.last()
    {
        let _ = write!(md, "| {last} / best (medians) |");
        for s in &specs {
            let medians: Vec<(i32, f64)> = ps
                .iter()
                .filter_map(|p| {
                    median_of(results, *p, *s, CellResult::records_per_s).map(|m| (*p, m.median))
                })
                .collect();
            let best = medians.iter().map(|(_, v)| *v).fold(f64::NAN, f64::max);
            let at_last = medians
                .iter()
                .find(|(p, _)| *p == last)
                .map(|(_, v)| v / best);
            let _ = write!(md, " {} |", at_last.map(x2).unwrap_or_else(|| "–".into()));
        }
        let _ = writeln!(md);
    }
}

/// The paired ratios, by partition count.
fn ratios_table(md: &mut String, results: &[CellResult]) {
    let specs = specs(results);
    let pairs = ratio_pairs(&specs);
    if pairs.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "\nRatios, each taken within a round and then median (min–max) over the rounds \
         (a figure above its ceiling is a measurement error, not a ratio):\n"
    );
    let _ = write!(md, "| partitions |");
    for (a, b) in &pairs {
        let _ = write!(md, " {} / {} |", a.label(), b.label());
    }
    let _ = writeln!(md, "\n|---:|{}", "---:|".repeat(pairs.len()));
    for p in partition_counts(results) {
        let _ = write!(md, "| {p} |");
        for (a, b) in &pairs {
            let _ = write!(md, " {} |", show(&ratio(results, p, *a, *b)));
        }
        let _ = writeln!(md);
    }
}

/// Records per CPU-second of each mode's own processes, and CPU per record and peak RSS.
fn cpu_tables(md: &mut String, results: &[CellResult]) {
    let specs = specs(results);
    let ps = partition_counts(results);
    let pairs = cpu_pairs(&specs);
    let _ = writeln!(
        md,
        "\nRecords per CPU-second of the mode's own processes (in the window; the Kafka tools: \
         over their whole run, JVM start included), median (min–max):\n"
    );
    let _ = write!(md, "| partitions |");
    for s in &specs {
        let _ = write!(md, " {} |", s.label());
    }
    for (a, b) in &pairs {
        let _ = write!(md, " {} / {} |", a.label(), b.label());
    }
    let _ = writeln!(md, "\n|---:|{}", "---:|".repeat(specs.len() + pairs.len()));
    for &p in &ps {
        let _ = write!(md, "| {p} |");
        for s in &specs {
            let m = median_of(results, p, *s, CellResult::records_per_cpu_s);
            let _ = write!(md, " {} |", summary(m, k));
        }
        for (a, b) in &pairs {
            let _ = write!(md, " {} |", summary(cpu_ratio(results, p, *a, *b), x2));
        }
        let _ = writeln!(md);
    }
    let _ = writeln!(
        md,
        "\nCPU µs per record / peak RSS MiB of the mode's processes (medians):\n"
    );
    let _ = write!(md, "| partitions |");
    for s in &specs {
        let _ = write!(md, " {} |", s.label());
    }
    let _ = writeln!(md, "\n|---:|{}", "---:|".repeat(specs.len()));
    for &p in &ps {
        let _ = write!(md, "| {p} |");
        for s in &specs {
            let cpu = median_of(results, p, *s, CellResult::cpu_us_per_record);
            let rss = median_of(results, p, *s, |r| r.peak_rss_mib);
            let cell = match (cpu, rss) {
                (None, None) => "–".to_string(),
                (c, r) => format!(
                    "{} / {}",
                    c.map(|s| format!("{:.1}", s.median))
                        .unwrap_or_else(|| "–".into()),
                    r.map(|s| format!("{:.0}", s.median))
                        .unwrap_or_else(|| "–".into())
                ),
            };
            let _ = write!(md, " {cell} |");
        }
        let _ = writeln!(md);
    }
}

/// Where a commit's pause goes: each step's p50 / p99 (medians over the rounds), for every
/// mode that commits, with the whole commit beside it (Kafka Streams: the whole only).
fn commit_steps_table(md: &mut String, results: &[CellResult]) {
    let specs: Vec<Spec> = specs(results)
        .into_iter()
        .filter(|s| s.is_pipeline())
        .collect();
    if specs.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "\nWhere a commit's time goes, ms, p50 / p99 of each cell (median over the rounds): \
         the wait for the transaction's last deliveries, sending the offsets \
         (AddOffsetsToTxn + TxnOffsetCommit; at-least-once: the offset commit), ending the \
         transaction (EndTxn), and the whole commit:\n"
    );
    let _ = writeln!(
        md,
        "| partitions | mode | deliveries | offsets | end | whole commit |\n|---:|---|---:|---:|---:|---:|"
    );
    let step = |h: Option<&Histogram>, q: f64| h.and_then(|h| h.percentile(q));
    for p in partition_counts(results) {
        for s in &specs {
            let pq = |pick: &dyn Fn(&CellResult) -> Option<&Histogram>| {
                let at =
                    |q: f64| median_of(results, p, *s, |r| ms(step(pick(r), q))).map(|m| m.median);
                match (at(0.5), at(0.99)) {
                    (Some(a), Some(b)) => format!("{a:.1} / {b:.1}"),
                    _ => "–".into(),
                }
            };
            let _ = writeln!(
                md,
                "| {p} | {} | {} | {} | {} | {} |",
                s.label(),
                pq(&|r| r.commit_steps.as_ref().map(|c| &c.deliveries)),
                pq(&|r| r.commit_steps.as_ref().map(|c| &c.offsets)),
                pq(&|r| r.commit_steps.as_ref().map(|c| &c.end)),
                pq(&|r| r.commit.as_ref()),
            );
        }
    }
}

/// Failed cells, figures above their ceiling, and short windows.
fn problems(md: &mut String, cfg: &BenchConfig, results: &[CellResult]) {
    let mut lines = Vec::new();
    for r in results {
        if let Some(e) = &r.error {
            lines.push(format!(
                "- p={} {} round {}: failed: {}",
                r.partitions,
                r.spec.label(),
                r.round,
                e.lines().next().unwrap_or("")
            ));
        } else if r.short(cfg) {
            lines.push(format!(
                "- p={} {} round {}: short window ({:.1} s{})",
                r.partitions,
                r.spec.label(),
                r.round,
                r.window_s.unwrap_or(0.0),
                if r.warmed_up {
                    ""
                } else {
                    ", warm-up not excluded"
                }
            ));
        }
    }
    let specs = specs(results);
    for p in partition_counts(results) {
        for s in &specs {
            let Some(c) = ceiling_of(*s) else { continue };
            let q = ratio(results, p, *s, c);
            if q.above > 0 {
                lines.push(format!(
                    "- p={p} {}: above {} in {} round(s): a measurement error",
                    s.label(),
                    c.label(),
                    q.above
                ));
            }
        }
    }
    if !lines.is_empty() {
        let _ = writeln!(md, "\nProblems:\n\n{}", lines.join("\n"));
    }
}

/// Every cell of every round, in the order they ran.
fn cells_table(md: &mut String, cfg: &BenchConfig, results: &[CellResult]) {
    let cores = machine::cores();
    let _ = writeln!(
        md,
        "\n| partitions | round | mode | records/s | window s | commits | commit p50 / p99 ms | e2e p50 / p99 ms | peak RSS MiB | CPU µs / record | start-up s | load | broker cores | machine cores | broker reads MiB | reclaimed MiB | |"
    );
    let _ = writeln!(
        md,
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
    );
    let dash = || "–".to_string();
    for r in results {
        let c = r.commit.as_ref();
        let e = r.e2e.as_ref();
        let pair = |a: Option<f64>, b: Option<f64>, d: usize| match (a, b) {
            (Some(a), Some(b)) => format!("{a:.d$} / {b:.d$}"),
            _ => dash(),
        };
        let mut flags = Vec::new();
        if r.noisy(cores) {
            flags.push("noisy");
        }
        if r.short(cfg) {
            flags.push("short");
        }
        let f = |v: Option<f64>, d: usize| v.map(|v| format!("{v:.d$}")).unwrap_or_else(dash);
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.partitions,
            r.round,
            r.spec.label(),
            match &r.error {
                Some(e) => format!("failed: {}", e.lines().next().unwrap_or("")),
                None => r.records_per_s().map(k).unwrap_or_else(dash),
            },
            f(r.window_s, 1),
            r.commits.map(|v| v.to_string()).unwrap_or_else(dash),
            pair(
                ms(c.and_then(|h| h.percentile(0.5))),
                ms(c.and_then(|h| h.percentile(0.99))),
                1
            ),
            pair(
                ms(e.and_then(|h| h.percentile(0.5))),
                ms(e.and_then(|h| h.percentile(0.99))),
                0
            ),
            f(r.peak_rss_mib, 0),
            f(r.cpu_us_per_record(), 1),
            f(r.startup_s, 1),
            f(r.load1, 1),
            f(r.broker_cores, 2),
            f(r.machine_cores, 2),
            f(r.broker_read_mib, 0),
            f(r.reclaimed_mib, 0),
            flags.join(", "),
        );
    }
}

const COLORS: [RGBColor; 9] = [
    RGBColor(90, 90, 90),
    RGBColor(160, 160, 160),
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(23, 190, 207),
];

/// Throughput (records/s) against partition count: one line per mode through the medians,
/// a bar from the lowest to the highest round at each point, as SVG (no fonts needed).
pub fn plot(path: &Path, cfg: &BenchConfig, results: &[CellResult]) -> Result<(), BenchError> {
    let err = |source| BenchError::Plot {
        path: path.to_path_buf(),
        source,
    };
    let ps = partition_counts(results);
    if ps.is_empty() {
        return Ok(());
    }
    let specs: Vec<Spec> = specs(results)
        .into_iter()
        .filter(|s| !s.is_cross_check())
        .collect();
    let top = plot_top(results);
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let caption = format!(
        "onceflow-bench: {} B records, median and range of {} rounds",
        cfg.record_size, cfg.rounds
    );
    let last = (ps.len() - 1) as f64;
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(70)
        .build_cartesian_2d(-0.3..last + 0.3, 0.0..top)
        .map_err(err)?;
    let labels_of = ps.clone();
    chart
        .configure_mesh()
        .x_labels(ps.len())
        .x_label_formatter(&|v| {
            let i = v.round();
            if (v - i).abs() < 0.05 && i >= 0.0 {
                labels_of
                    .get(i as usize)
                    .map(|p| p.to_string())
                    .unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_label_formatter(&|v| format!("{:.0}k", v / 1000.0))
        .x_desc("partitions")
        .y_desc("records/s")
        .draw()
        .map_err(err)?;
    let n = specs.len().max(1) as f64;
    for (i, spec) in specs.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        // Each mode a little to the side, so the range bars do not hide each other.
        let dx = (i as f64 - (n - 1.0) / 2.0) * 0.025;
        let points = plot_points(results, &ps, *spec, dx);
        let style = ShapeStyle::from(&color).stroke_width(2);
        chart
            .draw_series(LineSeries::new(
                points.iter().map(|(x, s)| (*x, s.median)),
                style,
            ))
            .map_err(err)?
            .label(spec.label())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], style));
        chart
            .draw_series(
                points
                    .iter()
                    .map(|(x, s)| Circle::new((*x, s.median), 3, color.filled())),
            )
            .map_err(err)?;
        let thin = ShapeStyle::from(&color).stroke_width(1);
        chart
            .draw_series(points.iter().flat_map(|(x, s)| {
                let cap = 0.012;
                [
                    PathElement::new(vec![(*x, s.min), (*x, s.max)], thin),
                    PathElement::new(vec![(*x - cap, s.min), (*x + cap, s.min)], thin),
                    PathElement::new(vec![(*x - cap, s.max), (*x + cap, s.max)], thin),
                ]
            }))
            .map_err(err)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

/// The top of the plot's y axis: a tenth above the highest rate of any timed cell.
fn plot_top(results: &[CellResult]) -> f64 {
    results
        .iter()
        .filter(|r| !r.spec.is_cross_check())
        .filter_map(CellResult::records_per_s)
        .fold(0.0, f64::max)
        .max(1.0)
        * 1.1
}

/// A mode's median and range of records/s at each partition count it ran, at x = the
/// count's index plus `dx`.
fn plot_points(results: &[CellResult], ps: &[i32], spec: Spec, dx: f64) -> Vec<(f64, Summary)> {
    ps.iter()
        .enumerate()
        .filter_map(|(x, p)| {
            median_of(results, *p, spec, CellResult::records_per_s).map(|s| (x as f64 + dx, s))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::tests::cfg;

    /// A successful cell: `rate` records/s over a 20 s window, 2 CPU-seconds in it.
    fn cell(spec: Spec, round: u32, rate: f64) -> CellResult {
        let mut r = CellResult::new(1, spec, round, 1_000_000, &cfg());
        r.window_s = Some(20.0);
        r.window_records = Some((rate * 20.0) as u64);
        r.window_cpu_s = Some(2.0);
        r.warmed_up = true;
        r.load1 = Some(1.0);
        r
    }

    fn eos() -> Spec {
        Spec {
            kind: Kind::Eos,
            commit_ms: Some(100),
            instances: 1,
        }
    }

    fn alos() -> Spec {
        Spec {
            kind: Kind::Alos,
            commit_ms: Some(100),
            instances: 1,
        }
    }

    #[test]
    fn ratios_are_paired_by_round_and_summarised_by_the_median() {
        // eos/alos per round: 0.5, 2.0, 1.0: median 1.0, whatever the medians of each mode.
        let results = vec![
            cell(alos(), 0, 200.0),
            cell(eos(), 0, 100.0),
            cell(alos(), 1, 100.0),
            cell(eos(), 1, 200.0),
            cell(alos(), 2, 150.0),
            cell(eos(), 2, 150.0),
        ];
        let q = ratio(&results, 1, eos(), alos());
        let s = q.summary.unwrap();
        assert_eq!((s.median, s.min, s.max, s.n), (1.0, 0.5, 2.0, 3));
        assert_eq!(q.above, 0, "at-least-once is no ceiling");
    }

    #[test]
    fn a_pipeline_above_its_ceiling_is_an_error_not_a_ratio() {
        let rpw = Spec::of(Kind::Rpw);
        let results = vec![
            cell(rpw, 0, 100.0),
            cell(eos(), 0, 90.0),
            cell(rpw, 1, 100.0),
            cell(eos(), 1, 120.0),
        ];
        let q = ratio(&results, 1, eos(), rpw);
        assert_eq!(q.above, 1);
        let shown = show(&q);
        assert!(
            shown.contains("error") && !shown.contains("1.05"),
            "{shown}"
        );
        let md = markdown(&cfg(), &results);
        assert!(md.contains("above rpw-ceiling in 1 round(s)"), "{md}");
        assert!(!md.contains("fastest of"), "{md}");
    }

    #[test]
    fn a_load_above_the_cores_from_the_bench_s_own_processes_is_not_noise() {
        let mut busy = cell(alos(), 0, 100.0);
        busy.load1 = Some(machine::cores() as f64 + 2.0);
        busy.other_cores = Some(0.1);
        assert!(!busy.noisy(machine::cores()));
        busy.other_cores = Some(NOISE_CORES + 0.01);
        assert!(busy.noisy(machine::cores()));
        busy.other_cores = None;
        assert!(
            busy.noisy(machine::cores()),
            "without the reading, the load decides"
        );
    }

    #[test]
    fn the_report_gives_medians_ranges_and_flags_noise_and_short_windows() {
        let mut noisy = cell(alos(), 1, 300.0);
        noisy.other_cores = Some(NOISE_CORES + 0.5);
        let mut short = cell(alos(), 2, 200.0);
        short.window_s = Some(3.0);
        short.window_records = Some(600);
        let results = vec![cell(alos(), 0, 100.0), noisy, short];
        let md = markdown(&cfg(), &results);
        assert!(md.contains("| 1 | 200 (100–300) |"), "{md}");
        assert!(md.contains("**noisy**: in 1 of 3 cells"), "{md}");
        assert!(md.contains("| noisy |"), "{md}");
        assert!(md.contains("round 2: short window (3.0 s)"), "{md}");
        // 20 s x rate records in 2 CPU-s: 1000, 3000 (and 300 for the short one).
        assert!(md.contains("| 1 | 1000 (300–3000) |"), "{md}");
        let quiet = markdown(&cfg(), &[cell(alos(), 0, 100.0)]);
        assert!(quiet.contains("**quiet**"), "{quiet}");
        assert!(
            !quiet.contains("Memory, MiB/s"),
            "no readings, no line: {quiet}"
        );
    }

    #[test]
    fn the_report_gives_the_brokers_reads_and_the_memory_reclaimed_per_second() {
        // 20 s windows: 200 and 600 MiB read, 2,000 and 6,000 MiB reclaimed.
        let mut a = cell(alos(), 0, 100.0);
        (a.broker_read_mib, a.reclaimed_mib) = (Some(200.0), Some(2000.0));
        let mut b = cell(alos(), 1, 100.0);
        (b.broker_read_mib, b.reclaimed_mib) = (Some(600.0), Some(6000.0));
        let md = markdown(&cfg(), &[a, b]);
        assert!(
            md.contains("the broker read 20 (10–30) from storage"),
            "{md}"
        );
        assert!(md.contains("the kernel reclaimed 200 (100–300)"), "{md}");
        assert!(
            md.contains("| 200 | 2000 |  |"),
            "the cell's own figures: {md}"
        );
    }
}
