//! `onceflow reconcile <topology>`: what a finished or paused run consumed against what it
//! wrote, per input partition; exit 0 when nothing is missing, duplicated or hanging, 1 when
//! something is, 2 when it could not look.

use std::path::PathBuf;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

use super::KafkaArgs;
use crate::reconcile::{self, Options, Report, Rerun};

#[derive(clap::Args)]
pub struct ReconcileArgs {
    /// The topology file of the run.
    topology: PathBuf,
    #[command(flatten)]
    kafka: KafkaArgs,
    /// Print the report as JSON (on stdout) instead of a table.
    #[arg(long)]
    json: bool,
    /// Do not write the markers that prove no transaction hangs on an output partition.
    #[arg(long)]
    no_markers: bool,
    /// How long a marker may take to become visible under read_committed, e.g. 30s, 2m.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = super::duration)]
    marker_timeout: Duration,
    /// The same in milliseconds (the former spelling).
    #[arg(
        long,
        hide = true,
        value_name = "MS",
        conflicts_with = "marker_timeout"
    )]
    marker_timeout_ms: Option<u64>,
    /// Re-run the pipeline over every input record. By default, where the topology makes at
    /// most one record of each on its one output (no route, no explode), a record found there
    /// or in the dead-letter topic is decided by that trace, and only records that left none
    /// are re-run (to tell filtered from missing). With this flag a record whose trace the
    /// topology as it is now would not make is reported duplicated.
    #[arg(long)]
    rerun_all: bool,
}

pub fn run(args: ReconcileArgs) -> anyhow::Result<bool> {
    let (topology, _) = super::load(&args.topology)?;
    let options = Options {
        markers: !args.no_markers,
        marker_timeout: args
            .marker_timeout_ms
            .map_or(args.marker_timeout, Duration::from_millis),
        rerun_all: args.rerun_all,
        ..Options::default()
    };
    // Drawn on stderr, and only when it is a terminal (indicatif hides it otherwise).
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} reconcile [{elapsed_precise}] {wide_bar} {human_pos}/{human_len} records ({per_sec})",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut progress = |done: u64, total: u64| {
        bar.set_length(total);
        bar.set_position(done);
    };
    let report = reconcile::run(&topology, &args.kafka.into(), &options, &mut progress)?;
    bar.finish_and_clear();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", table(&report));
    }
    Ok(report.ok)
}

/// The report as text: a row per input partition, then the streams read and the verdict.
fn table(r: &Report) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<32} {:>10} {:>10} {:>10} {:>10} {:>8} {:>8} {:>9} {:>10}",
        "input partition",
        "committed",
        "consumed",
        "produced",
        "filtered",
        "dead",
        "skipped",
        "missing",
        "duplicated"
    );
    for t in &r.partitions {
        let _ = writeln!(
            out,
            "{:<32} {:>10} {:>10} {:>10} {:>10} {:>8} {:>8} {:>9} {:>10}",
            format!("{}[{}]", t.topic, t.partition),
            t.committed,
            t.consumed,
            t.produced,
            t.filtered,
            t.dead_lettered,
            t.skipped,
            t.missing,
            t.duplicated
        );
        if !t.missing_offsets.is_empty() {
            let _ = writeln!(out, "  missing offsets: {}", t.missing_offsets);
        }
        if !t.duplicated_offsets.is_empty() {
            let _ = writeln!(out, "  duplicated offsets: {}", t.duplicated_offsets);
        }
    }
    for s in &r.streams {
        let _ = writeln!(
            out,
            "{} {}: {} read, {} without lineage, {} malformed, {} of other topics, {} past the committed offsets, {} before the input's retention",
            s.kind,
            s.name,
            s.records,
            s.unattributed,
            s.malformed,
            s.foreign,
            s.beyond_committed,
            s.before_range
        );
    }
    if !r.unchecked_outputs.is_empty() {
        let _ = writeln!(
            out,
            "not checked (no lineage): {}",
            r.unchecked_outputs.join(", ")
        );
    }
    let _ = writeln!(
        out,
        "markers: {} visible, hanging: {}",
        r.markers,
        if r.hanging.is_empty() {
            "none".to_string()
        } else {
            r.hanging.join(", ")
        }
    );
    let _ = writeln!(
        out,
        "pipeline re-run over {} input records ({})",
        r.pipeline_runs,
        match r.pipeline_rerun {
            Rerun::All => "all of them",
            Rerun::Untraced => "those without a trace",
        }
    );
    let _ = writeln!(
        out,
        "{} records read in {:.1} s ({:.0}/s); {} missing, {} duplicated: {}",
        r.records_read,
        r.seconds,
        r.records_per_second,
        r.missing,
        r.duplicated,
        if r.ok { "reconciled" } else { "MISMATCH" }
    );
    out
}
