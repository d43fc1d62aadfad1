//! The inputs, read up to the group's committed offsets, each record through the pipeline:
//! what the topology makes of it, next to what the streams hold of its origin.

use std::collections::BTreeMap;

use super::ReconcileError;
use super::counts::Chunk;
use super::inbox::Pending;
use super::tally::{Expected, PartitionTally};
use crate::kafka::batch::Polled;
use crate::pg::Mapping;
use crate::topology::{Processor, Target, Topology};
use crate::transform::Pipeline;

/// What one reader of an input makes of its share of the partitions.
#[derive(Default)]
pub(super) struct InputShare<'s> {
    /// Records read.
    pub(super) read: u64,
    /// Records the pipeline was re-run over.
    pub(super) reran: u64,
    /// Tallies of its partitions, made as their first record comes.
    pub(super) tallies: BTreeMap<i32, PartitionTally>,
    /// Records whose PostgreSQL trace is to be looked for by event id.
    pub(super) pending: Vec<Pending>,
    /// The pipeline's output buffer, reused from record to record.
    pub(super) produced: Vec<(usize, crate::record::Record)>,
    /// The partition of the last record, and the chunk of counts its offset falls in, of
    /// every stream: the next records of the partition are counted without a look-up.
    pub(super) at: Option<i32>,
    pub(super) chunks: Vec<Chunk<'s>>,
    /// What each stream holds of the record (the dead-letter stream's count set apart).
    pub(super) seen: Vec<u32>,
}

/// `each` as what reads an input: the share it fills holds chunks of the streams' counts,
/// so its lifetime is theirs (a closure typed in place would take any share's).
pub(super) fn input_reader<'s, F>(each: F) -> F
where
    F: Fn(&mut InputShare<'s>, &Polled<'_>) -> Result<(), ReconcileError> + Sync,
{
    each
}

/// What the topology makes of a consumed record, by stream.
pub(super) struct Expectation {
    pub(super) expected: Expected,
    /// Streams of PostgreSQL outputs keyed by event id, with the record's message id there.
    pub(super) by_event_id: Vec<(usize, String)>,
}

/// What the pipeline makes of `msg`, as the streams would hold it.
pub(super) fn expect(
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

/// Whether the traces of a record decide it wherever it left one
/// ([`tally::decide_by_traces`]): the topology makes at most one record of each input record,
/// on its one output, a Kafka topic reconcile checks (not PostgreSQL, whose inbox counts
/// messages, not records).
pub(super) fn traces_decide(topology: &Topology, stream_of: &[Option<usize>]) -> bool {
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
