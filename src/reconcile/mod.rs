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
pub mod ranges;
pub mod tally;

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use serde::Serialize;

use crate::kafka::Cluster;
use crate::kafka::batch::Polled;
use crate::kafka::read::{self, ReadError};
use crate::lineage;
use crate::pg::{self, InboxReader, Mapping, PgError};
use crate::topology::{PostgresOutput, Processor, Target, Topology};
use crate::transform::Pipeline;
use counts::{Chunk, Counts, Slots};
use tally::{Decision, Expected, PartitionTally, Verdict};

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

/// The connection settings of a PostgreSQL output, and a runtime to run its queries on.
fn database(
    config: &PostgresOutput,
) -> Result<
    (
        tokio_postgres::Config,
        Option<postgres_openssl::MakeTlsConnector>,
        tokio::runtime::Runtime,
    ),
    PgError,
> {
    let url =
        std::env::var(&config.url_env).map_err(|_| PgError::MissingUrl(config.url_env.clone()))?;
    let (pg, tls) = pg::client_config(&url, &config.url_env, "onceflow/reconcile")?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(PgError::Runtime)?;
    Ok((pg, tls, runtime))
}

/// Progress of the reads: records read so far, and how many there are in all (an estimate
/// from the offsets, known once every range is).
pub type Progress<'a> = &'a mut dyn FnMut(u64, u64);

/// One checked stream while it is read.
struct Stream {
    report: StreamReport,
    /// Counts by input (index in `inputs`) and partition.
    counts: Slots<(usize, i32), Counts>,
    /// Reconcile markers read (not records of the stream).
    markers_seen: u64,
}

impl Stream {
    /// Adds what another reader of the same stream read.
    fn merge(&mut self, other: Stream) {
        let (r, o) = (&mut self.report, other.report);
        r.records += o.records;
        r.unattributed += o.unattributed;
        r.malformed += o.malformed;
        r.foreign += o.foreign;
        r.beyond_committed += o.beyond_committed;
        r.before_range += o.before_range;
        self.markers_seen += other.markers_seen;
        for (key, counts) in other.counts {
            self.counts
                .get_or_insert_with(key, Counts::default)
                .merge(counts);
        }
    }
}

/// What one reader of an input makes of its share of the partitions.
#[derive(Default)]
struct InputShare<'s> {
    /// Records read.
    read: u64,
    /// Records the pipeline was re-run over.
    reran: u64,
    /// Tallies of its partitions, made as their first record comes.
    tallies: BTreeMap<i32, PartitionTally>,
    /// Records whose PostgreSQL trace is to be looked for by event id.
    pending: Vec<Pending>,
    /// The pipeline's output buffer, reused from record to record.
    produced: Vec<(usize, crate::record::Record)>,
    /// The partition of the last record, and the chunk of counts its offset falls in, of
    /// every stream: the next records of the partition are counted without a look-up.
    at: Option<i32>,
    chunks: Vec<Chunk<'s>>,
    /// What each stream holds of the record (the dead-letter stream's count set apart).
    seen: Vec<u32>,
}

/// `each` as what reads an input: the share it fills holds chunks of the streams' counts,
/// so its lifetime is theirs (a closure typed in place would take any share's).
fn input_reader<'s, F>(each: F) -> F
where
    F: Fn(&mut InputShare<'s>, &Polled<'_>) -> Result<(), ReconcileError> + Sync,
{
    each
}

/// The consumer group of reconcile's readers (assigned partitions, never joined or
/// committed).
const READER_GROUP: &str = "onceflow.reconcile";

/// What reconcile needs of an input partition: `[from, committed)`.
type Ranges = BTreeMap<i32, (i64, i64)>;

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
    // The committed offsets, read with the job's group id (assigning, never joining it).
    let committed_reader = read::reader(cluster, &group)?;
    let mut input_ranges: Vec<Ranges> = Vec::new();
    for topic in &inputs {
        input_ranges.push(committed_ranges(&committed_reader, topic)?);
    }
    drop(committed_reader);

    // The streams: each Kafka topic an output with lineage writes, the dead-letter topic,
    // each PostgreSQL output. `stream_of[i]`: the stream of output i, if checked.
    let mut streams: Vec<Stream> = Vec::new();
    let mut stream_of: Vec<Option<usize>> = Vec::new();
    let mut unchecked_outputs = Vec::new();
    let mut postgres_outputs: Vec<(usize, &str, &PostgresOutput)> = Vec::new();
    for output in &topology.outputs {
        let index = match output.target() {
            Some(Target::Topic(topic)) if output.lineage => Some(
                streams
                    .iter()
                    .position(|s| s.report.kind == "topic" && s.report.name == topic)
                    .unwrap_or_else(|| {
                        streams.push(stream(topic, "topic"));
                        streams.len() - 1
                    }),
            ),
            Some(Target::Postgres(config)) => {
                streams.push(stream(output.name(), "postgres"));
                postgres_outputs.push((streams.len() - 1, output.name(), config));
                Some(streams.len() - 1)
            }
            _ => {
                unchecked_outputs.push(output.name().to_string());
                None
            }
        };
        stream_of.push(index);
    }
    let dead_letter_topic = topology.dead_letter_topic();
    streams.push(stream(&dead_letter_topic, "dead_letter"));
    let dead_letters = streams.len() - 1;

    let mut report = Report {
        topology: topology.name.clone(),
        group,
        unchecked_outputs,
        ..Report::default()
    };

    // Ranges of every Kafka stream now, and the total for the progress bar.
    let mut stream_ranges: Vec<Option<Ranges>> = Vec::new();
    for s in &streams {
        stream_ranges.push(match s.report.kind {
            "postgres" => None,
            _ => topic_ranges(&consumer, &s.report.name)?,
        });
    }
    let mut total: u64 = input_ranges
        .iter()
        .chain(stream_ranges.iter().flatten())
        .flat_map(|r| r.values())
        .map(|(a, b)| (b - a).max(0) as u64)
        .sum();
    let mut read_so_far = 0u64;
    progress(0, total);

    // 1. Markers, first: a hanging transaction holds back what read_committed can read.
    let hanging: Vec<(String, i32)> = if options.markers {
        let topics: Vec<(&str, &Ranges)> = streams
            .iter()
            .zip(&stream_ranges)
            .filter_map(|(s, r)| Some((s.report.name.as_str(), r.as_ref()?)))
            .collect();
        let (written, hanging) = markers(cluster, &topics, options.marker_timeout)?;
        report.markers = written - hanging.len() as u64;
        hanging
    } else {
        Vec::new()
    };
    report.hanging = hanging.iter().map(|(t, p)| format!("{t}[{p}]")).collect();

    report.phase_seconds.markers = started.elapsed().as_secs_f64();
    let phase = Instant::now();
    // 2. The traces: Kafka streams, then PostgreSQL inboxes.
    for (s, ranges) in streams.iter_mut().zip(&stream_ranges) {
        let Some(ranges) = ranges else { continue };
        let topic = s.report.name.clone();
        // A partition held by a hanging transaction never reaches its end: once the others
        // have, a short silence ends the read.
        let idle = if hanging.iter().any(|(t, _)| *t == topic) {
            options.idle.min(Duration::from_secs(2))
        } else {
            options.idle
        };
        let (name, kind) = (s.report.name.clone(), s.report.kind);
        let base = read_so_far;
        let split = read::Split {
            cluster,
            group: READER_GROUP,
            topic: &topic,
            ranges,
            idle,
            threads: options.threads,
        };
        let shares = read::read_ranges_split(
            &split,
            || stream(&name, kind),
            |share: &mut Stream, msg| {
                attribute(share, msg, &inputs, &input_ranges);
                Ok::<_, ReconcileError>(())
            },
            &mut |n| progress(base + n, total),
        )?;
        let mut unfinished = BTreeMap::new();
        for (share, left) in shares {
            read_so_far += share.report.records + share.markers_seen;
            s.merge(share);
            unfinished.extend(left);
        }
        stalled(&topic, unfinished, &hanging, options.idle)?;
    }
    for (s, name, config) in &postgres_outputs {
        let rows = read_inbox(
            topology,
            name,
            config,
            &mut streams[*s],
            &inputs,
            &input_ranges,
        )
        .map_err(|error| ReconcileError::Postgres {
            output: name.to_string(),
            error,
        })?;
        read_so_far += rows;
        total += rows;
    }
    progress(read_so_far, total);
    report.count_bytes = streams
        .iter()
        .flat_map(|s| s.counts.values())
        .map(Counts::bytes)
        .sum();

    report.phase_seconds.outputs = phase.elapsed().as_secs_f64();
    let phase = Instant::now();
    // 3. The inputs, through the pipeline.
    let on_error = topology.runtime.on_error;
    let mappings: Vec<Option<(Mapping, bool)>> = topology
        .outputs
        .iter()
        .map(|o| match o.target() {
            Some(Target::Postgres(c)) => Some((Mapping::new(c), c.event_id.is_some())),
            _ => None,
        })
        .collect();
    let mut checks = Absorbed::default();
    let by_traces = !options.rerun_all && traces_decide(topology, &stream_of);
    report.pipeline_rerun = if by_traces {
        Rerun::Untraced
    } else {
        Rerun::All
    };
    for (input, topic) in inputs.iter().enumerate() {
        let ranges = &input_ranges[input];
        let mut tallies: BTreeMap<i32, PartitionTally> = ranges
            .iter()
            .map(|(&p, &(from, to))| (p, PartitionTally::new(topic, p, from, to)))
            .collect();
        let base = read_so_far;
        let streams = &streams;
        let (pipeline, stream_of, mappings) = (&pipeline, &stream_of, &mappings);
        let count = |tallies: &mut BTreeMap<i32, PartitionTally>, p, offset, verdict| {
            if let Some(&(from, to)) = ranges.get(&p) {
                tallies
                    .entry(p)
                    .or_insert_with(|| PartitionTally::new(topic, p, from, to))
                    .count(offset, verdict);
            }
        };
        let each = input_reader(|share, msg| {
            share.read += 1;
            let (p, offset) = (msg.partition(), msg.offset());
            if share.at != Some(p) || !share.chunks.first().is_some_and(|c| c.holds(offset)) {
                share.chunks.clear();
                share.chunks.extend(streams.iter().map(|s| {
                    s.counts
                        .get(&(input, p))
                        .map_or(Chunk::empty(offset), |c| c.chunk(offset))
                }));
                share.at = Some(p);
            }
            share.seen.clear();
            share
                .seen
                .extend(share.chunks.iter().map(|c| u32::from(c.get(offset))));
            let letters = std::mem::take(&mut share.seen[dead_letters]);
            let traced = by_traces
                .then(|| tally::decide_by_traces(share.seen.iter().sum(), letters))
                .flatten();
            if let Some(verdict) = traced {
                count(&mut share.tallies, p, offset, verdict);
                return Ok(());
            }
            share.reran += 1;
            let expected = expect(
                pipeline,
                msg,
                stream_of,
                mappings,
                streams.len(),
                &mut share.produced,
            );
            let outputs_seen = &share.seen;
            let keyed: Vec<usize> = expected.by_event_id.iter().map(|(s, _)| *s).collect();
            let verdict = match tally::decide_keyed(
                &expected.expected,
                outputs_seen,
                letters,
                on_error,
                &keyed,
            ) {
                Decision::Known(verdict) => verdict,
                Decision::Ask { streams, if_found } => {
                    let ask = expected
                        .by_event_id
                        .into_iter()
                        .filter(|(s, _)| streams.contains(s))
                        .collect();
                    share.pending.push(Pending {
                        partition: p,
                        offset,
                        ask,
                        if_absorbed: if_found,
                    });
                    return Ok(());
                }
            };
            count(&mut share.tallies, p, offset, verdict);
            Ok(())
        });
        let split = read::Split {
            cluster,
            group: READER_GROUP,
            topic,
            ranges,
            idle: options.idle,
            threads: options.threads,
        };
        let shares = read::read_ranges_split(&split, InputShare::default, each, &mut |n| {
            progress(base + n, total)
        })?;
        let mut unfinished = BTreeMap::new();
        for (share, left) in shares {
            read_so_far += share.read;
            report.pipeline_runs += share.reran;
            // Each reader had partitions of its own: its tallies replace the empty ones.
            tallies.extend(share.tallies);
            checks.pending.extend(share.pending);
            unfinished.extend(left);
        }
        stalled(topic, unfinished, &[], options.idle)?;
        checks
            .resolve(topology, &postgres_outputs, &mut tallies)
            .map_err(|(output, error)| ReconcileError::Postgres { output, error })?;
        for (_, mut t) in tallies {
            t.finish();
            report.partitions.push(t);
        }
    }
    progress(read_so_far, total);

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
    report.phase_seconds.inputs = phase.elapsed().as_secs_f64();
    report.records_read = read_so_far;
    report.seconds = started.elapsed().as_secs_f64();
    report.records_per_second = read_so_far as f64 / report.seconds.max(1e-9);
    Ok(report)
}

/// Whether the traces of a record decide it wherever it left one
/// ([`tally::decide_by_traces`]): the topology makes at most one record of each input record,
/// on its one output, a Kafka topic reconcile checks (not PostgreSQL, whose inbox counts
/// messages, not records).
fn traces_decide(topology: &Topology, stream_of: &[Option<usize>]) -> bool {
    let one_to_one = topology
        .pipeline
        .iter()
        .all(|p| !matches!(p, Processor::Route(_) | Processor::Explode(_)));
    let checked_topic = matches!(
        topology.outputs.as_slice(),
        [output] if output.lineage && matches!(output.target(), Some(Target::Topic(_)))
    );
    one_to_one && checked_topic && matches!(stream_of, [Some(_)])
}

fn stream(name: &str, kind: &'static str) -> Stream {
    Stream {
        report: StreamReport {
            name: name.to_string(),
            kind,
            ..StreamReport::default()
        },
        counts: Slots::default(),
        markers_seen: 0,
    }
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

/// Every partition of `topic` from its low watermark to the group's committed offset (empty
/// where the group has none).
fn committed_ranges(consumer: &BaseConsumer, topic: &str) -> Result<Ranges, ReconcileError> {
    let marks = read::watermarks(consumer, topic)?;
    let mut tpl = TopicPartitionList::new();
    for p in marks.keys() {
        tpl.add_partition(topic, *p);
    }
    let committed = consumer.committed_offsets(tpl, Duration::from_secs(10))?;
    let mut ranges = Ranges::new();
    for e in committed.elements() {
        let (low, _) = marks.get(&e.partition()).copied().unwrap_or((0, 0));
        let to = match e.offset() {
            Offset::Offset(o) => o,
            _ => low,
        };
        ranges.insert(e.partition(), (low, to.max(low)));
    }
    Ok(ranges)
}

/// Every partition of `topic` from its low watermark to its end now; `None` when the topic
/// does not exist (a dead-letter topic nothing was ever sent to).
fn topic_ranges(consumer: &BaseConsumer, topic: &str) -> Result<Option<Ranges>, ReconcileError> {
    match read::watermarks(consumer, topic) {
        Ok(marks) => Ok(Some(marks)),
        Err(ReadError::NoTopic(_)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Partitions a read could not finish are an error unless a transaction hangs there (the
/// report says so already).
fn stalled(
    topic: &str,
    unfinished: BTreeMap<i32, i64>,
    hanging: &[(String, i32)],
    idle: Duration,
) -> Result<(), ReconcileError> {
    let pending: Vec<i32> = unfinished
        .keys()
        .copied()
        .filter(|p| !hanging.iter().any(|(t, hp)| t == topic && hp == p))
        .collect();
    if pending.is_empty() {
        Ok(())
    } else {
        Err(ReconcileError::Stalled {
            topic: topic.to_string(),
            idle,
            pending,
        })
    }
}

/// Where an origin falls against the inputs' ranges.
enum Place {
    /// Input index, partition, offset: a checked offset.
    In(usize, i32, i64),
    Foreign,
    Before,
    Beyond,
}

fn place(topic: &str, partition: i32, offset: i64, inputs: &[&str], ranges: &[Ranges]) -> Place {
    let Some(input) = inputs.iter().position(|t| *t == topic) else {
        return Place::Foreign;
    };
    match ranges[input].get(&partition) {
        None => Place::Foreign,
        Some(&(from, _)) if offset < from => Place::Before,
        Some(&(_, to)) if offset >= to => Place::Beyond,
        Some(_) => Place::In(input, partition, offset),
    }
}

fn count_place(s: &mut Stream, where_: Place) {
    match where_ {
        Place::In(input, partition, offset) => s
            .counts
            .get_or_insert_with((input, partition), Counts::default)
            .add(offset),
        Place::Foreign => s.report.foreign += 1,
        Place::Before => s.report.before_range += 1,
        Place::Beyond => s.report.beyond_committed += 1,
    }
}

/// Counts the origin a record of a Kafka stream names.
fn attribute(s: &mut Stream, msg: &Polled<'_>, inputs: &[&str], ranges: &[Ranges]) {
    let Some(headers) = msg.headers() else {
        s.report.records += 1;
        s.report.unattributed += 1;
        return;
    };
    // One pass over the headers: the lineage, and whether it is a marker.
    let mut marker = false;
    let stamp = lineage::read(
        headers
            .iter()
            .map(|h| (h.key, h.value.unwrap_or_default()))
            .inspect(|(k, _)| marker |= *k == crate::dlq::H_MARKER),
    );
    if marker {
        s.markers_seen += 1;
        return;
    }
    s.report.records += 1;
    match stamp {
        Ok(stamp) => {
            let where_ = place(stamp.topic, stamp.partition, stamp.offset, inputs, ranges);
            count_place(s, where_);
        }
        Err(lineage::Unstamped::Absent) => s.report.unattributed += 1,
        Err(lineage::Unstamped::Malformed) => s.report.malformed += 1,
    }
}

/// What the topology makes of a consumed record, by stream.
struct Expectation {
    expected: Expected,
    /// Streams of PostgreSQL outputs keyed by event id, with the record's message id there.
    by_event_id: Vec<(usize, String)>,
}

fn expect(
    pipeline: &Pipeline,
    msg: &Polled<'_>,
    stream_of: &[Option<usize>],
    mappings: &[Option<(Mapping, bool)>],
    streams: usize,
    produced: &mut Vec<(usize, crate::record::Record)>,
) -> Expectation {
    produced.clear();
    let fails = Expectation {
        expected: Expected::Fails,
        by_event_id: Vec::new(),
    };
    if pipeline
        .process(
            crate::source::kafka::to_record(msg, crate::source::kafka::origin_of(msg)),
            produced,
        )
        .is_err()
    {
        return fails;
    }
    let mut counts = vec![0u32; streams];
    let mut unchecked = false;
    let mut by_event_id = Vec::new();
    for (index, rec) in produced.iter() {
        let Some(s) = stream_of.get(*index).copied().flatten() else {
            unchecked = true;
            continue;
        };
        match mappings.get(*index).and_then(Option::as_ref) {
            // A PostgreSQL output: one inbox origin per message, if any row of it is
            // written (an empty value writes none).
            Some((mapping, keyed)) => match mapping.row(rec) {
                Ok(Some(row)) => {
                    if counts[s] == 0 && *keyed {
                        by_event_id.push((s, row.mid));
                    }
                    counts[s] = 1;
                }
                Ok(None) => {}
                Err(_) => return fails,
            },
            None => counts[s] += 1,
        }
    }
    Expectation {
        expected: Expected::Outputs { counts, unchecked },
        by_event_id,
    }
}

/// Reads the origins recorded beside the inbox of a PostgreSQL output; returns the rows read.
fn read_inbox(
    topology: &Topology,
    output: &str,
    config: &PostgresOutput,
    s: &mut Stream,
    inputs: &[&str],
    ranges: &[Ranges],
) -> Result<u64, PgError> {
    let (pg, tls, runtime) = database(config)?;
    let consumer = format!("{}/{output}", topology.name);
    let inbox = InboxReader::new(&config.inbox_table, &consumer);
    runtime.block_on(async {
        let (client, task) = pg::open(&pg, &tls).await?;
        let n = inbox
            .origins(&client, |topic, partition, offset| {
                s.report.records += 1;
                count_place(s, place(topic, partition, offset, inputs, ranges));
            })
            .await?;
        task.abort();
        Ok(n)
    })
}

/// A record whose PostgreSQL trace is to be looked for by event id.
struct Pending {
    partition: i32,
    offset: i64,
    /// Streams and the message id to find in their inbox.
    ask: Vec<(usize, String)>,
    /// The verdict when the inbox holds every one of them.
    if_absorbed: Verdict,
}

/// The records of an input whose PostgreSQL trace is looked up by event id, in batches.
#[derive(Default)]
struct Absorbed {
    pending: Vec<Pending>,
}

impl Absorbed {
    fn resolve(
        &mut self,
        topology: &Topology,
        postgres_outputs: &[(usize, &str, &PostgresOutput)],
        tallies: &mut BTreeMap<i32, PartitionTally>,
    ) -> Result<(), (String, PgError)> {
        let pending = std::mem::take(&mut self.pending);
        if pending.is_empty() {
            return Ok(());
        }
        // Every asked message id, per stream, looked up in batches of 5,000.
        let mut found: HashMap<usize, std::collections::HashSet<String>> = HashMap::new();
        for (s, name, config) in postgres_outputs {
            let asked: Vec<&str> = pending
                .iter()
                .flat_map(|p| p.ask.iter())
                .filter(|(ps, _)| ps == s)
                .map(|(_, mid)| mid.as_str())
                .collect();
            if asked.is_empty() {
                continue;
            }
            let have = known_messages(topology, name, config, &asked)
                .map_err(|e| (name.to_string(), e))?;
            found.insert(*s, have);
        }
        for p in pending {
            let all = p
                .ask
                .iter()
                .all(|(s, mid)| found.get(s).is_some_and(|f| f.contains(mid)));
            let verdict = if all { p.if_absorbed } else { Verdict::Missing };
            if let Some(t) = tallies.get_mut(&p.partition) {
                t.count(p.offset, verdict);
            }
        }
        Ok(())
    }
}

/// Which of `mids` the inbox of a PostgreSQL output holds.
fn known_messages(
    topology: &Topology,
    output: &str,
    config: &PostgresOutput,
    mids: &[&str],
) -> Result<std::collections::HashSet<String>, PgError> {
    let (pg, tls, runtime) = database(config)?;
    let consumer = format!("{}/{output}", topology.name);
    let inbox = InboxReader::new(&config.inbox_table, &consumer);
    runtime.block_on(async {
        let (client, task) = pg::open(&pg, &tls).await?;
        let mut found = std::collections::HashSet::new();
        for chunk in mids.chunks(5_000) {
            found.extend(inbox.known(&client, chunk).await?);
        }
        task.abort();
        Ok(found)
    })
}

/// Writes a marker to every partition of `topics` (outside any transaction) and waits until
/// a read_committed reader sees each one. Returns how many were written, and the partitions
/// whose marker stayed invisible for `timeout`.
fn markers(
    cluster: &Cluster,
    topics: &[(&str, &Ranges)],
    timeout: Duration,
) -> Result<(u64, Vec<(String, i32)>), ReconcileError> {
    let token = format!(
        "{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    );
    let producer: BaseProducer = cluster
        .config()
        .set("acks", "all")
        .set("linger.ms", "0")
        .create()?;
    let headers = rdkafka::message::OwnedHeaders::new().insert(rdkafka::message::Header {
        key: crate::dlq::H_MARKER,
        value: Some(token.as_bytes()),
    });
    let mut written = 0u64;
    for (topic, ranges) in topics {
        for p in ranges.keys() {
            let record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic)
                .partition(*p)
                .payload(&[][..])
                .headers(headers.clone());
            producer.send(record).map_err(|(e, _)| e)?;
            written += 1;
        }
    }
    producer.flush(timeout)?;
    // Read from where each partition ended before the markers.
    let deadline = Instant::now() + timeout;
    let consumer = read::reader(cluster, "onceflow.reconcile")?;
    let mut left: std::collections::BTreeSet<(String, i32)> = std::collections::BTreeSet::new();
    let mut tpl = TopicPartitionList::new();
    for (topic, ranges) in topics {
        for (p, (_, end)) in ranges.iter() {
            tpl.add_partition_offset(topic, *p, Offset::Offset(*end))?;
            left.insert((topic.to_string(), *p));
        }
    }
    consumer.assign(&tpl)?;
    while !left.is_empty() && Instant::now() < deadline {
        let Some(polled) = consumer.poll(Duration::from_millis(100)) else {
            continue;
        };
        let msg = polled?;
        let ours = msg.headers().is_some_and(|hs| {
            hs.iter()
                .any(|h| h.key == crate::dlq::H_MARKER && h.value == Some(token.as_bytes()))
        });
        if ours {
            left.remove(&(msg.topic().to_string(), msg.partition()));
        }
    }
    let hanging = left.into_iter().collect();
    Ok((written, hanging))
}
