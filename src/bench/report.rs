//! The bench's outputs: a CSV of every cell, a markdown summary, and an SVG plot of
//! throughput against partition count.

use std::fmt::Write as _;
use std::path::Path;

use plotters::prelude::*;

use super::{BenchConfig, BenchError, CellResult, Kind, Spec};

/// The ratios that say how exactly-once compares, for one exactly-once cell.
#[derive(Debug, Clone, Copy, Default)]
pub struct Ratios {
    /// EOS / ALOS at the same partition count (ALOS commit interval).
    pub vs_alos: Option<f64>,
    /// EOS / min(produce-only, consume-only).
    pub vs_ceiling: Option<f64>,
    /// EOS / Kafka Streams at the same commit interval.
    pub vs_kstreams: Option<f64>,
}

fn rate_of(results: &[CellResult], partitions: i32, pick: impl Fn(&Spec) -> bool) -> Option<f64> {
    results
        .iter()
        .find(|r| r.partitions == partitions && pick(&r.spec))
        .and_then(CellResult::records_per_s)
}

/// min(produce-only, consume-only) at a partition count.
pub fn ceiling(results: &[CellResult], partitions: i32) -> Option<f64> {
    let produce = rate_of(results, partitions, |s| s.kind == Kind::Produce)?;
    let consume = rate_of(results, partitions, |s| s.kind == Kind::Consume)?;
    Some(produce.min(consume))
}

pub fn ratios(results: &[CellResult], cell: &CellResult) -> Ratios {
    let Some(rate) = cell.records_per_s() else {
        return Ratios::default();
    };
    if cell.spec.kind != Kind::Eos {
        return Ratios::default();
    }
    let p = cell.partitions;
    let same_instances = cell.spec.instances;
    Ratios {
        vs_alos: rate_of(results, p, |s| s.kind == Kind::Alos).map(|a| rate / a),
        vs_ceiling: ceiling(results, p).map(|c| rate / c),
        vs_kstreams: rate_of(results, p, |s| {
            s.kind == Kind::KStreams
                && s.commit_ms == cell.spec.commit_ms
                && s.instances == same_instances
        })
        .map(|k| rate / k),
    }
}

fn opt(v: Option<f64>, decimals: usize) -> String {
    v.map(|v| format!("{v:.decimals$}")).unwrap_or_default()
}

fn ms(us: Option<u64>) -> Option<f64> {
    us.map(|us| us as f64 / 1000.0)
}

pub const CSV_HEADER: &str = "partitions,mode,instances,commit_ms,records,record_bytes,seconds,records_per_s,mb_per_s,commits,commit_p50_ms,commit_p99_ms,e2e_p50_ms,e2e_p99_ms,peak_rss_mib,cpu_s,cpu_us_per_record,startup_s,runs,eos_over_alos,eos_over_ceiling,onceflow_over_kstreams,error";

/// Writes every cell so far (rewritten after each cell, so an interrupted run keeps its rows).
pub fn write_csv(path: &Path, results: &[CellResult]) -> Result<(), BenchError> {
    let mut out = String::from(CSV_HEADER);
    out.push('\n');
    for r in results {
        let q = ratios(results, r);
        let commit = r.commit.as_ref();
        let e2e = r.e2e.as_ref();
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
            r.partitions,
            r.spec.label(),
            r.spec.instances,
            r.spec.commit_ms.map(|m| m.to_string()).unwrap_or_default(),
            r.records,
            r.record_size,
            opt(r.seconds, 3),
            opt(r.records_per_s(), 0),
            opt(r.mb_per_s(), 1),
            r.commits.map(|c| c.to_string()).unwrap_or_default(),
            opt(ms(commit.and_then(|h| h.percentile(0.5))), 2),
            opt(ms(commit.and_then(|h| h.percentile(0.99))), 2),
            opt(ms(e2e.and_then(|h| h.percentile(0.5))), 1),
            opt(ms(e2e.and_then(|h| h.percentile(0.99))), 1),
            opt(r.peak_rss_mib, 1),
            opt(r.cpu_s, 2),
            opt(r.cpu_us_per_record(), 1),
            opt(r.startup_s, 2),
            r.runs,
            opt(q.vs_alos, 3),
            opt(q.vs_ceiling, 3),
            opt(q.vs_kstreams, 3),
            r.error
                .as_deref()
                .map(|e| format!("\"{}\"", e.replace('"', "'").replace('\n', " ")))
                .unwrap_or_default(),
        );
    }
    std::fs::write(path, out).map_err(BenchError::io(path.display()))
}

fn k(v: Option<f64>) -> String {
    match v {
        Some(v) if v >= 10_000.0 => format!("{:.1}k", v / 1000.0),
        Some(v) => format!("{v:.0}"),
        None => "–".into(),
    }
}

fn x(v: Option<f64>) -> String {
    v.map(|v| format!("{v:.2}")).unwrap_or_else(|| "–".into())
}

/// The distinct cell kinds in plan order.
fn labels(results: &[CellResult]) -> Vec<Spec> {
    let mut specs: Vec<Spec> = Vec::new();
    for r in results {
        if !specs.contains(&r.spec) {
            specs.push(r.spec);
        }
    }
    specs
}

fn partition_counts(results: &[CellResult]) -> Vec<i32> {
    let mut ps: Vec<i32> = results.iter().map(|r| r.partitions).collect();
    ps.dedup();
    ps
}

/// The markdown report: a records/s table by mode and partition count with the ratios, the
/// flatness of each mode, then every cell in detail.
pub fn markdown(cfg: &BenchConfig, results: &[CellResult]) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "{} records x {} B per partition count; producer linger.ms {} / batch.size {}; \
         latency probe {} records/s for {} s.\n",
        cfg.records,
        cfg.record_size,
        cfg.tuning.linger_ms,
        cfg.tuning.batch_size,
        cfg.probe_rate,
        cfg.probe_secs
    );
    rates_table(&mut md, results);
    cells_table(&mut md, results);
    md
}

/// Records/s by mode (columns) and partition count (rows), with the ratios of the first
/// single-instance exactly-once mode, and the flatness row.
fn rates_table(md: &mut String, results: &[CellResult]) {
    let specs = labels(results);
    let ps = partition_counts(results);
    let eos = specs
        .iter()
        .copied()
        .find(|s| s.kind == Kind::Eos && s.instances == 1);
    let _ = write!(md, "| partitions |");
    for s in &specs {
        let _ = write!(md, " {} |", s.label());
    }
    let eos_label = eos.map(|s| s.label()).unwrap_or_default();
    let _ = writeln!(
        md,
        " {eos_label} / alos | {eos_label} / ceiling | {eos_label} / kstreams |"
    );
    let _ = writeln!(md, "|---:|{}---:|---:|---:|", "---:|".repeat(specs.len()));
    for &p in &ps {
        let _ = write!(md, "| {p} |");
        for s in &specs {
            let rate = results
                .iter()
                .find(|r| r.partitions == p && r.spec == *s)
                .and_then(CellResult::records_per_s);
            let _ = write!(md, " {} |", k(rate));
        }
        let q = eos
            .and_then(|s| results.iter().find(|r| r.partitions == p && r.spec == s))
            .map(|c| ratios(results, c))
            .unwrap_or_default();
        let _ = writeln!(
            md,
            " {} | {} | {} |",
            x(q.vs_alos),
            x(q.vs_ceiling),
            x(q.vs_kstreams)
        );
    }
    if let Some(&last) = ps.last() {
        flatness_row(md, results, &specs, last);
    }
}

/// Flatness: the throughput at the `last` partition count against the best one, per mode.
fn flatness_row(md: &mut String, results: &[CellResult], specs: &[Spec], last: i32) {
    let _ = write!(md, "| {last} / best |");
    for s in specs {
        let rates: Vec<(i32, f64)> = results
            .iter()
            .filter(|r| r.spec == *s)
            .filter_map(|r| r.records_per_s().map(|v| (r.partitions, v)))
            .collect();
        let best = rates.iter().map(|(_, v)| *v).fold(f64::NAN, f64::max);
        let at_last = rates.iter().find(|(p, _)| *p == last).map(|(_, v)| *v);
        let _ = write!(md, " {} |", x(at_last.map(|v| v / best)));
    }
    let _ = writeln!(md, " | | |");
}

/// Every cell in detail, one row each.
fn cells_table(md: &mut String, results: &[CellResult]) {
    let _ = writeln!(
        md,
        "\n| partitions | mode | records/s | MB/s | commits | commit p50 / p99 ms | e2e p50 / p99 ms | peak RSS MiB | CPU µs / record | start-up s |"
    );
    let _ = writeln!(md, "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in results {
        let c = r.commit.as_ref();
        let e = r.e2e.as_ref();
        let pair = |a: Option<f64>, b: Option<f64>, d: usize| match (a, b) {
            (Some(a), Some(b)) => format!("{a:.d$} / {b:.d$}"),
            _ => "–".into(),
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.partitions,
            r.spec.label(),
            match &r.error {
                Some(e) => format!("failed: {}", e.lines().next().unwrap_or("")),
                None => k(r.records_per_s()),
            },
            r.mb_per_s()
                .map(|v| format!("{v:.1}"))
                .unwrap_or_else(|| "–".into()),
            r.commits
                .map(|v| v.to_string())
                .unwrap_or_else(|| "–".into()),
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
            r.peak_rss_mib
                .map(|v| format!("{v:.0}"))
                .unwrap_or_else(|| "–".into()),
            r.cpu_us_per_record()
                .map(|v| format!("{v:.1}"))
                .unwrap_or_else(|| "–".into()),
            r.startup_s
                .map(|v| format!("{v:.1}"))
                .unwrap_or_else(|| "–".into()),
        );
    }
}

const COLORS: [RGBColor; 8] = [
    RGBColor(120, 120, 120),
    RGBColor(170, 170, 170),
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// Throughput (records/s) against partition count, one line per mode, as SVG (no fonts
/// needed).
pub fn plot(path: &Path, cfg: &BenchConfig, results: &[CellResult]) -> Result<(), BenchError> {
    let err = |source| BenchError::Plot {
        path: path.to_path_buf(),
        source,
    };
    let ps = partition_counts(results);
    if ps.is_empty() {
        return Ok(());
    }
    let specs = labels(results);
    let top = results
        .iter()
        .filter_map(CellResult::records_per_s)
        .fold(0.0, f64::max)
        .max(1.0)
        * 1.1;
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let caption = format!(
        "onceflow bench: {} x {} B records, throughput by partition count",
        cfg.records, cfg.record_size
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
    for (n, spec) in specs.iter().enumerate() {
        let color = COLORS[n % COLORS.len()];
        let points: Vec<(f64, f64)> = ps
            .iter()
            .enumerate()
            .filter_map(|(i, p)| {
                results
                    .iter()
                    .find(|r| r.partitions == *p && r.spec == *spec)
                    .and_then(CellResult::records_per_s)
                    .map(|v| (i as f64, v))
            })
            .collect();
        let style = ShapeStyle::from(&color).stroke_width(2);
        chart
            .draw_series(LineSeries::new(points.clone(), style))
            .map_err(err)?
            .label(spec.label())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], style));
        chart
            .draw_series(points.iter().map(|p| Circle::new(*p, 3, color.filled())))
            .map_err(err)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}
