//! The checked streams (each Kafka topic an output with lineage writes, the dead-letter
//! topic, each PostgreSQL output's inbox) while they are read: how many records name each
//! origin offset, per input partition, and what names none that reconcile checks.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::consumer::BaseConsumer;
use rdkafka::message::{Headers, Message};

use super::counts::{Counts, Slots};
use super::inbox::read_inbox;
use super::offsets::{stalled, topic_ranges};
use super::{READER_GROUP, Ranges, Reads, ReconcileError, Scope, StreamReport};
use crate::kafka::batch::Polled;
use crate::kafka::read;
use crate::lineage;
use crate::topology::{PostgresOutput, Target, Topology};

/// The streams a run checks, and which output writes to which.
pub(super) struct Checked<'t> {
    pub(super) streams: Vec<Stream>,
    /// The stream of each output (by index in the topology's outputs), if checked.
    pub(super) stream_of: Vec<Option<usize>>,
    /// Each PostgreSQL output: its stream, name and configuration.
    pub(super) postgres_outputs: Vec<(usize, &'t str, &'t PostgresOutput)>,
    /// The dead-letter topic's stream.
    pub(super) dead_letters: usize,
}

impl<'t> Checked<'t> {
    /// The streams of `topology`: each Kafka topic an output with lineage writes, each
    /// PostgreSQL output, and last the dead-letter topic; and the outputs it cannot check.
    pub(super) fn of(topology: &'t Topology) -> (Checked<'t>, Vec<String>) {
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
        let checked = Checked {
            streams,
            stream_of,
            postgres_outputs,
            dead_letters,
        };
        (checked, unchecked_outputs)
    }

    /// Of each stream, every partition from its low watermark to its end now; `None` for a
    /// PostgreSQL output, and for a topic that does not exist.
    pub(super) fn ranges(
        &self,
        consumer: &BaseConsumer,
    ) -> Result<Vec<Option<Ranges>>, ReconcileError> {
        let mut stream_ranges: Vec<Option<Ranges>> = Vec::new();
        for s in &self.streams {
            stream_ranges.push(match s.report.kind {
                "postgres" => None,
                _ => topic_ranges(consumer, &s.report.name)?,
            });
        }
        Ok(stream_ranges)
    }

    /// Reads every Kafka stream to its end (the `ranges` of each), then the origins of every
    /// PostgreSQL output's inbox, counting the origins their records name.
    pub(super) fn read(
        &mut self,
        scope: &Scope<'_>,
        ranges: &[Option<Ranges>],
        hanging: &[(String, i32)],
        reads: &mut Reads<'_>,
    ) -> Result<(), ReconcileError> {
        for (s, ranges) in self.streams.iter_mut().zip(ranges) {
            let Some(ranges) = ranges else { continue };
            read_topic(s, ranges, scope, hanging, reads)?;
        }
        let (inputs, input_ranges) = (&scope.inputs, &scope.input_ranges);
        for (s, name, config) in &self.postgres_outputs {
            let s = &mut self.streams[*s];
            let rows = read_inbox(scope.topology, name, config, |topic, partition, offset| {
                s.report.records += 1;
                count_place(s, place(topic, partition, offset, inputs, input_ranges));
            })
            .map_err(|error| ReconcileError::Postgres {
                output: name.to_string(),
                error,
            })?;
            reads.read += rows;
            reads.total += rows;
        }
        reads.show();
        Ok(())
    }

    /// Bytes of the per-offset counts of every stream.
    pub(super) fn count_bytes(&self) -> usize {
        self.streams
            .iter()
            .flat_map(|s| s.counts.values())
            .map(Counts::bytes)
            .sum()
    }
}

/// Reads the Kafka stream `s` over `ranges`, counting the origins its records name.
fn read_topic(
    s: &mut Stream,
    ranges: &Ranges,
    scope: &Scope<'_>,
    hanging: &[(String, i32)],
    reads: &mut Reads<'_>,
) -> Result<(), ReconcileError> {
    let options = scope.options;
    let topic = s.report.name.clone();
    // A partition held by a hanging transaction never reaches its end: once the others
    // have, a short silence ends the read.
    let idle = if hanging.iter().any(|(t, _)| *t == topic) {
        options.idle.min(Duration::from_secs(2))
    } else {
        options.idle
    };
    let (name, kind) = (s.report.name.clone(), s.report.kind);
    let split = read::Split {
        cluster: scope.cluster,
        group: READER_GROUP,
        topic: &topic,
        ranges,
        idle,
        threads: options.threads,
    };
    let (inputs, input_ranges) = (&scope.inputs, &scope.input_ranges);
    let shares = read::read_ranges_split(
        &split,
        || stream(&name, kind),
        |share: &mut Stream, msg| {
            attribute(share, msg, inputs, input_ranges);
            Ok::<_, ReconcileError>(())
        },
        &mut reads.of_read(),
    )?;
    let mut unfinished = BTreeMap::new();
    for (share, left) in shares {
        reads.read += share.report.records + share.markers_seen;
        s.merge(share);
        unfinished.extend(left);
    }
    stalled(&topic, unfinished, hanging, options.idle)
}

/// One checked stream while it is read.
pub(super) struct Stream {
    pub(super) report: StreamReport,
    /// Counts by input (index in `inputs`) and partition.
    pub(super) counts: Slots<(usize, i32), Counts>,
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

/// A stream not read yet.
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

/// Where an origin falls against the inputs' ranges.
enum Place {
    /// Input index, partition, offset: a checked offset.
    In(usize, i32, i64),
    Foreign,
    Before,
    Beyond,
}

/// Where `offset` of `topic[partition]` falls.
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

/// Counts an origin where it falls.
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
