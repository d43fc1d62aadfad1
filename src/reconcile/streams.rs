//! The checked streams (each Kafka topic an output with lineage writes, the dead-letter
//! topic, each PostgreSQL output's inbox) while they are read: how many records name each
//! origin offset, per input partition, and what names none that reconcile checks.

use rdkafka::message::{Headers, Message};

use super::counts::{Counts, Slots};
use super::{Ranges, StreamReport};
use crate::kafka::batch::Polled;
use crate::lineage;

/// One checked stream while it is read.
pub(super) struct Stream {
    pub(super) report: StreamReport,
    /// Counts by input (index in `inputs`) and partition.
    pub(super) counts: Slots<(usize, i32), Counts>,
    /// Reconcile markers read (not records of the stream).
    pub(super) markers_seen: u64,
}

impl Stream {
    /// Adds what another reader of the same stream read.
    pub(super) fn merge(&mut self, other: Stream) {
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
pub(super) fn stream(name: &str, kind: &'static str) -> Stream {
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
pub(super) enum Place {
    /// Input index, partition, offset: a checked offset.
    In(usize, i32, i64),
    Foreign,
    Before,
    Beyond,
}

/// Where `offset` of `topic[partition]` falls.
pub(super) fn place(
    topic: &str,
    partition: i32,
    offset: i64,
    inputs: &[&str],
    ranges: &[Ranges],
) -> Place {
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
pub(super) fn count_place(s: &mut Stream, where_: Place) {
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
pub(super) fn attribute(s: &mut Stream, msg: &Polled<'_>, inputs: &[&str], ranges: &[Ranges]) {
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
