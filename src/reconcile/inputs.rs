//! The inputs, read up to the group's committed offsets, each record through the pipeline:
//! what the topology makes of it, next to what the streams hold of its origin.

use std::collections::BTreeMap;

use rdkafka::message::Message;

use super::counts::Chunk;
use super::inbox::{Absorbed, Pending};
use super::offsets::stalled;
use super::streams::{Checked, Stream};
use super::tally::{self, Decision, Expected, PartitionTally, Verdict};
use super::{READER_GROUP, Ranges, Reads, ReconcileError, Report, Rerun, Scope};
use crate::kafka::batch::Polled;
use crate::kafka::read;
use crate::pg::Mapping;
use crate::topology::{OnError, Processor, Target, Topology};
use crate::transform::Pipeline;

/// Reads every input through the pipeline, and tallies in `report` what became of each
/// record (with the pipeline's runs, and which records it was re-run over).
pub(super) fn check(
    scope: &Scope<'_>,
    pipeline: &Pipeline,
    checked: &Checked<'_>,
    reads: &mut Reads<'_>,
    report: &mut Report,
) -> Result<(), ReconcileError> {
    let topology = scope.topology;
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
    let by_traces = !scope.options.rerun_all && traces_decide(topology, &checked.stream_of);
    report.pipeline_rerun = if by_traces {
        Rerun::Untraced
    } else {
        Rerun::All
    };
    for (input, topic) in scope.inputs.iter().enumerate() {
        let check = InputCheck {
            input,
            topic,
            ranges: &scope.input_ranges[input],
            streams: &checked.streams,
            pipeline,
            stream_of: &checked.stream_of,
            mappings: &mappings,
            dead_letters: checked.dead_letters,
            by_traces,
            on_error,
        };
        let mut tallies = check.read(scope, reads, report, &mut checks.pending)?;
        checks
            .resolve(topology, &checked.postgres_outputs, &mut tallies)
            .map_err(|(output, error)| ReconcileError::Postgres { output, error })?;
        for (_, mut t) in tallies {
            t.finish();
            report.partitions.push(t);
        }
    }
    Ok(())
}

/// What the readers of one input share.
struct InputCheck<'a> {
    /// The input's index, its topic, and the range of each of its partitions to check.
    input: usize,
    topic: &'a str,
    ranges: &'a Ranges,
    streams: &'a [Stream],
    pipeline: &'a Pipeline,
    stream_of: &'a [Option<usize>],
    mappings: &'a [Option<(Mapping, bool)>],
    dead_letters: usize,
    /// Whether the traces of a record decide it wherever it left one.
    by_traces: bool,
    on_error: OnError,
}

impl<'a> InputCheck<'a> {
    /// Reads the input, every record through [`Self::record`]; returns the tallies of its
    /// partitions, and adds the records whose PostgreSQL trace is to be looked for by event
    /// id to `pending`.
    fn read(
        &self,
        scope: &Scope<'_>,
        reads: &mut Reads<'_>,
        report: &mut Report,
        pending: &mut Vec<Pending>,
    ) -> Result<BTreeMap<i32, PartitionTally>, ReconcileError> {
        let mut tallies: BTreeMap<i32, PartitionTally> = self
            .ranges
            .iter()
            .map(|(&p, &(from, to))| (p, PartitionTally::new(self.topic, p, from, to)))
            .collect();
        let each = input_reader(|share, msg| self.record(share, msg));
        let split = read::Split {
            cluster: scope.cluster,
            group: READER_GROUP,
            topic: self.topic,
            ranges: self.ranges,
            idle: scope.options.idle,
            threads: scope.options.threads,
        };
        let shares =
            read::read_ranges_split(&split, InputShare::default, each, &mut reads.of_read())?;
        let mut unfinished = BTreeMap::new();
        for (share, left) in shares {
            reads.read += share.read;
            report.pipeline_runs += share.reran;
            // Each reader had partitions of its own: its tallies replace the empty ones.
            tallies.extend(share.tallies);
            pending.extend(share.pending);
            unfinished.extend(left);
        }
        stalled(self.topic, unfinished, &[], scope.options.idle)?;
        Ok(tallies)
    }

    /// Decides what became of one record: by its traces when they can tell, else by what
    /// the pipeline makes of it next to what the streams hold; or leaves it to the look-up
    /// of its event id in the inboxes.
    fn record(&self, share: &mut InputShare<'a>, msg: &Polled<'_>) -> Result<(), ReconcileError> {
        share.read += 1;
        let (p, offset) = (msg.partition(), msg.offset());
        if share.at != Some(p) || !share.chunks.first().is_some_and(|c| c.holds(offset)) {
            share.chunks.clear();
            share.chunks.extend(self.streams.iter().map(|s| {
                s.counts
                    .get(&(self.input, p))
                    .map_or(Chunk::empty(offset), |c| c.chunk(offset))
            }));
            share.at = Some(p);
        }
        share.seen.clear();
        share
            .seen
            .extend(share.chunks.iter().map(|c| u32::from(c.get(offset))));
        let letters = std::mem::take(&mut share.seen[self.dead_letters]);
        let traced = self
            .by_traces
            .then(|| tally::decide_by_traces(share.seen.iter().sum(), letters))
            .flatten();
        if let Some(verdict) = traced {
            self.count(&mut share.tallies, p, offset, verdict);
            return Ok(());
        }
        share.reran += 1;
        let expected = expect(
            self.pipeline,
            msg,
            self.stream_of,
            self.mappings,
            self.streams.len(),
            &mut share.produced,
        );
        let outputs_seen = &share.seen;
        let keyed: Vec<usize> = expected.by_event_id.iter().map(|(s, _)| *s).collect();
        let verdict = match tally::decide_keyed(
            &expected.expected,
            outputs_seen,
            letters,
            self.on_error,
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
        self.count(&mut share.tallies, p, offset, verdict);
        Ok(())
    }

    /// Counts a verdict in the tally of its partition, if the partition is checked.
    fn count(
        &self,
        tallies: &mut BTreeMap<i32, PartitionTally>,
        p: i32,
        offset: i64,
        verdict: Verdict,
    ) {
        if let Some(&(from, to)) = self.ranges.get(&p) {
            tallies
                .entry(p)
                .or_insert_with(|| PartitionTally::new(self.topic, p, from, to))
                .count(offset, verdict);
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

/// What the topology makes of a consumed record, by stream.
struct Expectation {
    expected: Expected,
    /// Streams of PostgreSQL outputs keyed by event id, with the record's message id there.
    by_event_id: Vec<(usize, String)>,
}

/// What the pipeline makes of `msg`, as the streams would hold it.
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
            crate::source::to_record(msg, crate::source::origin_of(msg)),
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
