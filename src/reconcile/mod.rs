//! `onceflow reconcile`: proof, after a run, that what the job consumed and what it wrote
//! agree, record by record, through the lineage every written record carries
//! ([`crate::lineage`]).
//!
//! For a finished or paused run it:
//!
//! 1. writes a non-transactional marker ([`crate::dlq::H_MARKER`]) to every partition of every
//!    checked Kafka output and of the dead-letter topic, and waits until a read_committed
//!    reader sees each one: a partition whose marker stays invisible is held by a hanging
//!    transaction;
//! 2. reads every checked output topic and the dead-letter topic to its end under
//!    read_committed, and the origins of every PostgreSQL output's inbox, counting per input
//!    partition how many records name each origin offset ([`counts::Counts`]: one byte per
//!    offset, by lazily allocated chunks; no set of ids);
//! 3. reads each input partition up to the group's committed offset and re-runs the pure
//!    pipeline over every record (it is deterministic), which says what the topology makes
//!    of it: how many records for each output (several when it fans out, none when it
//!    filters), or a failure;
//! 4. lets [`tally::decide`] say what became of each record (produced, filtered,
//!    dead-lettered, skipped, missing, duplicated) and sums the verdicts per partition.
//!
//! Re-running the pipeline is how filtered records are counted: a filter leaves no trace in
//! Kafka, and recording each decision (an audit record per transaction) would cost the job
//! itself a write per transaction forever, to serve a check run now and then. Re-running it
//! also gives the expected number of records per origin per output, which a fan-out needs.

pub mod counts;
mod inbox;
mod inputs;
mod markers;
mod offsets;
pub mod ranges;
mod streams;
pub mod tally;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::error::KafkaError;
use serde::Serialize;

use crate::kafka::Cluster;
use crate::kafka::read::{self, ReadError};
use crate::pg::PgError;
use crate::topology::Topology;
use crate::transform::Pipeline;
use streams::{Checked, Stream};
use tally::PartitionTally;

/// Why a reconciliation could not be made (a mismatch is a report, not an error).
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
    #[error("invalid topology: {0}")]
    Config(String),
    #[error("schema registry: {0}")]
    Registry(String),
    #[error("postgres output `{output}`: {error}")]
    Postgres { output: String, error: PgError },
    #[error("reading {topic}: no progress for {}s on partitions {pending:?}, which hold no hanging transaction", .idle.as_secs())]
    Stalled {
        topic: String,
        idle: Duration,
        pending: Vec<i32>,
    },
}

/// How a reconciliation runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// Write and look for the markers.
    pub markers: bool,
    /// How long a marker may take to become visible under read_committed.
    pub marker_timeout: Duration,
    /// How long a read may see nothing before it gives up on a partition.
    pub idle: Duration,
    /// How many readers read a topic side by side, each with its own consumer and share of
    /// the partitions (at most one per partition).
    pub threads: usize,
    /// Re-run the pipeline over every input record, also those whose traces decide them.
    pub rerun_all: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            markers: true,
            marker_timeout: Duration::from_secs(30),
            idle: Duration::from_secs(30),
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            rerun_all: false,
        }
    }
}

/// What was read of one checked stream: a Kafka output, the dead-letter topic, or a
/// PostgreSQL output's inbox.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StreamReport {
    /// The topic, or the PostgreSQL output's name.
    pub name: String,
    /// `topic`, `dead_letter` or `postgres`.
    pub kind: &'static str,
    /// Records (inbox rows) read.
    pub records: u64,
    /// Records without lineage headers (written by something else, or before lineage).
    pub unattributed: u64,
    /// Records whose lineage headers cannot be read.
    pub malformed: u64,
    /// Records naming a topic that is no input of the topology.
    pub foreign: u64,
    /// Records naming an input offset at or past the group's committed offset: written by
    /// no committed transaction of the job (a mismatch for Kafka streams).
    pub beyond_committed: u64,
    /// Records naming an input offset the topic no longer holds (retention): not checked.
    pub before_range: u64,
}

/// The report of a reconciliation.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    pub topology: String,
    pub group: String,
    pub partitions: Vec<PartitionTally>,
    pub streams: Vec<StreamReport>,
    /// Outputs that cannot be checked (HTTP, `lineage: false`).
    pub unchecked_outputs: Vec<String>,
    /// Partitions (`topic[partition]`) whose marker did not become visible: a transaction
    /// hangs there.
    pub hanging: Vec<String>,
    /// Markers written and seen.
    pub markers: u64,
    /// Records read in all (inputs, outputs, dead letters, inbox rows).
    pub records_read: u64,
    pub seconds: f64,
    pub records_per_second: f64,
    /// Bytes of the per-offset counts at their largest.
    pub count_bytes: usize,
    /// Seconds spent on the markers, on reading the outputs (and inboxes), and on reading
    /// the inputs through the pipeline.
    pub phase_seconds: Phases,
    pub missing: u64,
    pub duplicated: u64,
    /// Which input records the pipeline was re-run over.
    pub pipeline_rerun: Rerun,
    /// Input records the pipeline was re-run over.
    pub pipeline_runs: u64,
    /// No missing, duplicated or hanging, nothing beyond the committed offsets.
    pub ok: bool,
}

/// Which input records reconcile re-runs the pipeline over.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Rerun {
    /// Every one.
    #[default]
    All,
    /// Those that left no trace in the outputs or the dead-letter topic; the traces decide
    /// the others ([`tally::decide_by_traces`]).
    Untraced,
}

/// Where the time went, in seconds.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Phases {
    /// Compiling the pipeline, the offsets, the markers.
    pub markers: f64,
    pub outputs: f64,
    pub inputs: f64,
}

/// Progress of the reads: records read so far, and how many there are in all (an estimate
/// from the offsets, known once every range is).
pub type Progress<'a> = &'a mut dyn FnMut(u64, u64);

/// The consumer group of reconcile's readers (assigned partitions, never joined or
/// committed).
const READER_GROUP: &str = "onceflow.reconcile";

/// What reconcile needs of an input partition: `[from, committed)`.
type Ranges = BTreeMap<i32, (i64, i64)>;

/// What every part of a run reads: the job, its cluster, how it runs, and the inputs with
/// the range of each of their partitions to check.
struct Scope<'a> {
    topology: &'a Topology,
    cluster: &'a Cluster,
    options: &'a Options,
    inputs: Vec<&'a str>,
    /// By input (index in `inputs`), every partition's `[from, committed)`.
    input_ranges: Vec<Ranges>,
}

/// Records read so far, and how many there are in all, as the progress callback hears them.
struct Reads<'p> {
    read: u64,
    total: u64,
    progress: Progress<'p>,
}

impl Reads<'_> {
    /// Tells the callback where the reads are.
    fn show(&mut self) {
        (self.progress)(self.read, self.total);
    }

    /// The progress of one read, whose records come on top of those read before it.
    fn of_read(&mut self) -> impl FnMut(u64) + '_ {
        let (base, total) = (self.read, self.total);
        move |n| (self.progress)(base + n, total)
    }
}

/// Reconciles `topology` on `cluster`.
pub fn run(
    topology: &Topology,
    cluster: &Cluster,
    options: &Options,
    progress: Progress<'_>,
) -> Result<Report, ReconcileError> {
    let started = Instant::now();
    let pipeline = compile(topology)?;
    let group = topology.group_id();
    let consumer = read::reader(cluster, "onceflow.reconcile")?;
    let inputs: Vec<&str> = topology.input_topics();
    let input_ranges = offsets::committed(cluster, &group, &inputs)?;
    let scope = Scope {
        topology,
        cluster,
        options,
        inputs,
        input_ranges,
    };

    let (mut checked, unchecked_outputs) = Checked::of(topology);
    let mut report = Report {
        topology: topology.name.clone(),
        group,
        unchecked_outputs,
        ..Report::default()
    };

    // Ranges of every Kafka stream now, and the total for the progress bar.
    let stream_ranges = checked.ranges(&consumer)?;
    let all_ranges = scope
        .input_ranges
        .iter()
        .chain(stream_ranges.iter().flatten());
    let mut reads = Reads {
        read: 0,
        total: offsets::span(all_ranges),
        progress,
    };
    reads.show();

    // 1. Markers, first: a hanging transaction holds back what read_committed can read.
    let hanging = markers::find_hanging(&scope, &checked.streams, &stream_ranges, &mut report)?;
    report.phase_seconds.markers = started.elapsed().as_secs_f64();
    let phase = Instant::now();
    // 2. The traces: Kafka streams, then PostgreSQL inboxes.
    checked.read(&scope, &stream_ranges, &hanging, &mut reads)?;
    report.count_bytes = checked.count_bytes();
    report.phase_seconds.outputs = phase.elapsed().as_secs_f64();
    let phase = Instant::now();
    // 3. The inputs, through the pipeline.
    inputs::check(&scope, &pipeline, &checked, &mut reads, &mut report)?;
    reads.show();
    Ok(finish(report, checked.streams, &reads, started, phase))
}

/// Sums up the report once everything is read: the mismatches, the verdict, the times.
fn finish(
    mut report: Report,
    streams: Vec<Stream>,
    reads: &Reads<'_>,
    started: Instant,
    inputs_phase: Instant,
) -> Report {
    report.streams = streams.into_iter().map(|s| s.report).collect();
    report.missing = report.partitions.iter().map(|t| t.missing).sum();
    report.duplicated = report.partitions.iter().map(|t| t.duplicated).sum();
    let beyond: u64 = report
        .streams
        .iter()
        .filter(|s| s.kind != "postgres")
        .map(|s| s.beyond_committed)
        .sum();
    report.ok =
        report.missing == 0 && report.duplicated == 0 && report.hanging.is_empty() && beyond == 0;
    report.phase_seconds.inputs = inputs_phase.elapsed().as_secs_f64();
    report.records_read = reads.read;
    report.seconds = started.elapsed().as_secs_f64();
    report.records_per_second = reads.read as f64 / report.seconds.max(1e-9);
    report
}

/// The job's pipeline, with its schema registry when it has one.
fn compile(topology: &Topology) -> Result<Pipeline, ReconcileError> {
    let issues = |list: Vec<crate::topology::ConfigIssue>| {
        ReconcileError::Config(
            list.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; "),
        )
    };
    let codecs = match crate::codec::Codecs::connect(topology) {
        Ok(c) => c,
        Err(crate::codec::SetupError::Config(list)) => return Err(issues(list)),
        Err(crate::codec::SetupError::Registry(m)) => return Err(ReconcileError::Registry(m)),
    };
    Pipeline::compile_with(topology, codecs).map_err(issues)
}
