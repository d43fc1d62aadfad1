//! What became of one consumed record, decided from plain values: what re-running the
//! pipeline says the topology makes of it, and the traces its origin left in every checked
//! output and the dead-letter topic. Pure, with a table test of every case; the partition's
//! tally sums the verdicts and keeps the offsets of the mismatches as compact ranges.

use serde::Serialize;

use super::ranges::RangeSet;
use crate::topology::OnError;

/// What the topology makes of a record, from re-running its pipeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expected {
    /// The pipeline processed it: how many records each checked output gets (0 for an output
    /// it does not reach; several when it fans out), and whether it reaches an output
    /// reconcile cannot check (HTTP, or a topic with `lineage: false`).
    Outputs { counts: Vec<u32>, unchecked: bool },
    /// The pipeline (or a PostgreSQL output's mapping) fails on it.
    Fails,
}

/// What became of a consumed record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Every checked output holds exactly the records the topology makes of it.
    Produced,
    /// The pipeline makes no record of it (a filter, `drop_empty`, an empty route).
    Filtered,
    /// It is in the dead-letter topic, once, and nowhere else.
    DeadLettered,
    /// The pipeline fails on it and `runtime.on_error: skip` commits it without a trace.
    Skipped,
    /// It reaches only outputs reconcile cannot check.
    Unchecked,
    /// Its offset is committed, and a record the topology makes of it is not there.
    Missing,
    /// Its origin appears more often than the topology makes records of it.
    Duplicated,
}

/// Decides what became of a record: `expected` from the pipeline, `seen[i]` the records of
/// checked output `i` naming it as their origin, `letters` the dead letters naming it.
pub fn decide(expected: &Expected, seen: &[u32], letters: u32, on_error: OnError) -> Verdict {
    let written: u32 = seen.iter().sum();
    if letters > 1 || (letters == 1 && written > 0) {
        return Verdict::Duplicated;
    }
    if letters == 1 {
        // A sink's refusal or exhausted attempts dead-letter records the pipeline processes.
        return Verdict::DeadLettered;
    }
    match expected {
        Expected::Fails => {
            if written > 0 {
                Verdict::Duplicated
            } else if on_error == OnError::Skip {
                Verdict::Skipped
            } else {
                Verdict::Missing
            }
        }
        Expected::Outputs { counts, unchecked } => {
            let want = |i: usize| counts.get(i).copied().unwrap_or(0);
            if seen.iter().enumerate().any(|(i, &n)| n > want(i)) {
                return Verdict::Duplicated;
            }
            if counts.iter().all(|&n| n == 0) {
                return if *unchecked {
                    Verdict::Unchecked
                } else {
                    Verdict::Filtered
                };
            }
            let complete = counts
                .iter()
                .enumerate()
                .all(|(i, &n)| seen.get(i).copied().unwrap_or(0) == n);
            if complete {
                Verdict::Produced
            } else {
                Verdict::Missing
            }
        }
    }
}

/// What the traces of a record alone decide, for a topology that makes at most one record of
/// each input record, on its one output, a checked Kafka topic (no `route`, no `explode`):
/// `written` the records naming it there, `letters` the dead letters naming it. Its one record
/// there proves the pipeline made one of it (the pipeline is deterministic, and the run used
/// this topology), so the pipeline need only be re-run over records that left no trace, to
/// tell a filtered record from a missing one: `None` for those.
pub fn decide_by_traces(written: u32, letters: u32) -> Option<Verdict> {
    match (written, letters) {
        (0, 0) => None,
        (1, 0) => Some(Verdict::Produced),
        (0, 1) => Some(Verdict::DeadLettered),
        _ => Some(Verdict::Duplicated),
    }
}

/// What is known of a record whose PostgreSQL traces may be under another origin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Known(Verdict),
    /// The verdict depends on whether the inboxes of `streams` hold the record's event:
    /// `if_found` when every one does, [`Verdict::Missing`] otherwise.
    Ask {
        streams: Vec<usize>,
        if_found: Verdict,
    },
}

/// [`decide`], for a record some of whose checked outputs are PostgreSQL outputs keyed by
/// event id (`keyed`, by stream): such an inbox records the origin of an event's first
/// delivery only, so a later delivery of the same event (another offset) leaves no origin
/// there, and is accounted for when the inbox holds its event.
pub fn decide_keyed(
    expected: &Expected,
    seen: &[u32],
    letters: u32,
    on_error: OnError,
    keyed: &[usize],
) -> Decision {
    let verdict = decide(expected, seen, letters, on_error);
    let Expected::Outputs { counts, .. } = expected else {
        return Decision::Known(verdict);
    };
    if verdict != Verdict::Missing {
        return Decision::Known(verdict);
    }
    let want = |s: usize| counts.get(s).copied().unwrap_or(0);
    let streams: Vec<usize> = keyed
        .iter()
        .copied()
        .filter(|&s| want(s) > 0 && seen.get(s).copied().unwrap_or(0) == 0)
        .collect();
    if streams.is_empty() {
        return Decision::Known(verdict);
    }
    let mut assumed = seen.to_vec();
    for &s in &streams {
        if let Some(n) = assumed.get_mut(s) {
            *n = want(s);
        }
    }
    Decision::Ask {
        streams,
        if_found: decide(expected, &assumed, letters, on_error),
    }
}

/// The sums of one input partition.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PartitionTally {
    pub topic: String,
    pub partition: i32,
    /// The first offset read (the partition's low watermark when the run started).
    pub from: i64,
    /// The group's committed offset: reading stops before it.
    pub committed: i64,
    /// Records read in `[from, committed)` (transaction markers and aborted records are not
    /// records).
    pub consumed: u64,
    pub produced: u64,
    pub filtered: u64,
    pub dead_lettered: u64,
    pub skipped: u64,
    pub unchecked: u64,
    pub missing: u64,
    pub duplicated: u64,
    /// The first missing offsets, as ranges (`5-9` inclusive).
    pub missing_offsets: String,
    /// The first duplicated offsets, as ranges.
    pub duplicated_offsets: String,
    #[serde(skip)]
    missing_set: RangeSet,
    #[serde(skip)]
    duplicated_set: RangeSet,
}

/// How many ranges of mismatched offsets a report shows per partition.
const SHOWN_RANGES: usize = 10;

impl PartitionTally {
    pub fn new(topic: &str, partition: i32, from: i64, committed: i64) -> PartitionTally {
        PartitionTally {
            topic: topic.to_string(),
            partition,
            from,
            committed,
            ..PartitionTally::default()
        }
    }

    /// Counts the verdict of the record at `offset`.
    pub fn count(&mut self, offset: i64, verdict: Verdict) {
        self.consumed += 1;
        match verdict {
            Verdict::Produced => self.produced += 1,
            Verdict::Filtered => self.filtered += 1,
            Verdict::DeadLettered => self.dead_lettered += 1,
            Verdict::Skipped => self.skipped += 1,
            Verdict::Unchecked => self.unchecked += 1,
            Verdict::Missing => {
                self.missing += 1;
                self.missing_set.insert(offset);
            }
            Verdict::Duplicated => {
                self.duplicated += 1;
                self.duplicated_set.insert(offset);
            }
        }
    }

    /// Fills the shown ranges from the sets, once the partition is read.
    pub fn finish(&mut self) {
        self.missing_offsets = self.missing_set.describe(SHOWN_RANGES);
        self.duplicated_offsets = self.duplicated_set.describe(SHOWN_RANGES);
    }

    #[cfg(test)]
    /// Whether anything is missing or duplicated.
    pub fn mismatched(&self) -> bool {
        self.missing > 0 || self.duplicated > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use OnError::{DeadLetter, Skip};
    use Verdict::*;

    fn outputs(counts: &[u32]) -> Expected {
        Expected::Outputs {
            counts: counts.to_vec(),
            unchecked: false,
        }
    }

    /// Where the traces alone decide, they decide as the pipeline's re-run would for every
    /// expectation the traces leave possible: any at all, but for one record on the output,
    /// which only a pipeline that made one record of it leaves.
    #[test]
    fn traces_decide_as_the_pipeline_would_wherever_they_can() {
        for written in 0..4 {
            for letters in 0..4 {
                let by_traces = decide_by_traces(written, letters);
                assert_eq!(
                    by_traces.is_none(),
                    written == 0 && letters == 0,
                    "only a record without a trace needs the pipeline ({written}, {letters})"
                );
                let Some(verdict) = by_traces else { continue };
                let possible = if (written, letters) == (1, 0) {
                    vec![outputs(&[1])]
                } else {
                    vec![outputs(&[1]), outputs(&[0]), Expected::Fails]
                };
                for expected in &possible {
                    for on_error in [DeadLetter, OnError::Fail, Skip] {
                        assert_eq!(
                            decide(expected, &[written], letters, on_error),
                            verdict,
                            "{expected:?}, {written} written, {letters} letters, {on_error:?}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn every_case_of_a_record() {
        let only_unchecked = Expected::Outputs {
            counts: vec![0, 0],
            unchecked: true,
        };
        let cases: &[(Expected, &[u32], u32, OnError, Verdict)] = &[
            // One output, one record each.
            (outputs(&[1]), &[1], 0, DeadLetter, Produced),
            (outputs(&[1]), &[0], 0, DeadLetter, Missing),
            (outputs(&[1]), &[2], 0, DeadLetter, Duplicated),
            // Fan-out: three records to the first output, one to the second.
            (outputs(&[3, 1]), &[3, 1], 0, DeadLetter, Produced),
            (outputs(&[3, 1]), &[2, 1], 0, DeadLetter, Missing),
            (outputs(&[3, 1]), &[3, 0], 0, DeadLetter, Missing),
            (outputs(&[3, 1]), &[4, 1], 0, DeadLetter, Duplicated),
            (outputs(&[3, 1]), &[2, 2], 0, DeadLetter, Duplicated),
            // Filtered: nothing expected, nothing there.
            (outputs(&[0, 0]), &[0, 0], 0, DeadLetter, Filtered),
            (outputs(&[0, 0]), &[0, 1], 0, DeadLetter, Duplicated),
            (only_unchecked, &[0, 0], 0, DeadLetter, Unchecked),
            // Dead letters: once and nowhere else, whatever the pipeline says now (a sink's
            // refusal dead-letters a record the pipeline processes).
            (Expected::Fails, &[0], 1, DeadLetter, DeadLettered),
            (outputs(&[1]), &[0], 1, DeadLetter, DeadLettered),
            (Expected::Fails, &[0], 2, DeadLetter, Duplicated),
            (outputs(&[1]), &[1], 1, DeadLetter, Duplicated),
            // A failing record without its dead letter.
            (Expected::Fails, &[0], 0, DeadLetter, Missing),
            (Expected::Fails, &[0], 0, OnError::Fail, Missing),
            (Expected::Fails, &[0], 0, Skip, Skipped),
            (Expected::Fails, &[1], 0, Skip, Duplicated),
        ];
        for (expected, seen, letters, on_error, verdict) in cases {
            assert_eq!(
                decide(expected, seen, *letters, *on_error),
                *verdict,
                "{expected:?} seen {seen:?} letters {letters} {on_error:?}"
            );
        }
    }

    #[test]
    fn an_origin_missing_from_an_inbox_keyed_by_event_id_is_asked_about() {
        // Streams: 0 a topic, 1 a table keyed by event id.
        let e = outputs(&[1, 1]);
        let known = |v| Decision::Known(v);
        assert_eq!(
            decide_keyed(&e, &[1, 1], 0, DeadLetter, &[1]),
            known(Produced)
        );
        assert_eq!(
            decide_keyed(&e, &[1, 0], 0, DeadLetter, &[1]),
            Decision::Ask {
                streams: vec![1],
                if_found: Produced
            }
        );
        // The topic's record is missing too: missing whatever the inbox holds.
        assert_eq!(
            decide_keyed(&e, &[0, 0], 0, DeadLetter, &[1]),
            Decision::Ask {
                streams: vec![1],
                if_found: Missing
            }
        );
        // Not keyed: nothing to ask.
        assert_eq!(
            decide_keyed(&e, &[1, 0], 0, DeadLetter, &[]),
            known(Missing)
        );
        assert_eq!(
            decide_keyed(&e, &[2, 0], 0, DeadLetter, &[1]),
            known(Duplicated)
        );
        assert_eq!(
            decide_keyed(&Expected::Fails, &[0, 0], 0, DeadLetter, &[1]),
            known(Missing)
        );
    }

    #[test]
    fn a_partition_sums_its_verdicts_and_shows_where_they_went_wrong() {
        let mut t = PartitionTally::new("in", 2, 0, 10);
        for (o, v) in [
            Produced,
            Produced,
            Missing,
            Missing,
            Filtered,
            DeadLettered,
            Duplicated,
            Missing,
        ]
        .into_iter()
        .enumerate()
        {
            t.count(o as i64, v);
        }
        t.finish();
        assert_eq!(
            (
                t.consumed,
                t.produced,
                t.filtered,
                t.dead_lettered,
                t.missing,
                t.duplicated
            ),
            (8, 2, 1, 1, 3, 1)
        );
        assert_eq!(t.missing_offsets, "2-3,7");
        assert_eq!(t.duplicated_offsets, "6");
        assert!(t.mismatched());
        assert!(!PartitionTally::new("in", 0, 0, 0).mismatched());
    }
}
