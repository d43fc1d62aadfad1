//! Overlapped commits: a transaction's Kafka commit runs on a thread of its own while the
//! loop goes on consuming and processing. What the loop adds meanwhile is held, and goes into
//! the next transaction once the commit is settled, or back with a rewind when it failed.

use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, ConsumerContext};
use rdkafka::error::KafkaResult;

use super::kafka_commit::{StepTimes, end_transaction};
use super::{Added, Committed, Consumed, Outgoing, Txn};
use crate::record::{Origin, Record};
use crate::txn::collector;
use crate::txn::{AbortReason, TxnError};

/// The most records, and output bytes, held while a commit runs in the background; past
/// either, the loop waits for the commit (memory stays bounded whatever the commit takes).
const MAX_HELD_RECORDS: usize = 20_000;
const MAX_HELD_BYTES: usize = 32 << 20;
/// How often the loop looks whether a background commit has ended.
pub(super) const IN_FLIGHT_POLL: Duration = Duration::from_millis(1);

/// A commit running on a thread of its own: the deliveries awaited, the offsets sent and the
/// transaction ended, through a clone of the producer's calls.
struct InFlight {
    handle: JoinHandle<KafkaResult<StepTimes>>,
    started: Instant,
}

/// What becomes of the records held while a background commit ran, once it committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Keep {
    /// They go into the next transaction.
    Held,
    /// They are dropped, their partitions noted for a rewind (the caller aborts).
    Nothing,
}

/// A record consumed and processed while the transaction before it was committing: it goes
/// into the next one, once that commit is settled, or is consumed again after a rewind.
struct Held {
    origin: Origin,
    id: Option<Vec<u8>>,
    consumed_bytes: usize,
    /// Its outputs, each with its topic's index in [`Overlap::held_topics`].
    outputs: Vec<(usize, Record, bool)>,
}

/// A commit running in the background, and what the loop processed meanwhile.
#[derive(Default)]
pub(super) struct Overlap {
    /// The commit running in the background, if one is.
    in_flight: Option<InFlight>,
    /// What the loop processed meanwhile, in order.
    held: Vec<Held>,
    held_topics: Vec<String>,
    held_bytes: usize,
}

impl Overlap {
    /// Whether a commit runs in the background.
    pub(super) fn committing(&self) -> bool {
        self.in_flight.is_some()
    }

    /// Keeps a record added while the transaction commits, with copies of its outputs.
    pub(super) fn hold(&mut self, consumed: Consumed<'_>, outputs: &[Outgoing<'_>]) {
        let mut held = Vec::with_capacity(outputs.len());
        for out in outputs {
            let index = match self.held_topics.iter().position(|t| t == out.topic) {
                Some(i) => i,
                None => {
                    self.held_topics.push(out.topic.to_string());
                    self.held_topics.len() - 1
                }
            };
            self.held_bytes += collector::payload_len(&out.record);
            held.push((index, out.record.clone(), out.lineage));
        }
        self.held.push(Held {
            origin: consumed.origin.clone(),
            id: consumed.id.map(<[u8]>::to_vec),
            consumed_bytes: consumed.bytes,
            outputs: held,
        });
    }
}

impl Txn {
    /// Whether the records held while a commit runs have reached a bound: the fixed ones, or
    /// the transaction's own.
    pub(super) fn hold_is_full(&self) -> bool {
        let records = self.settings.max_records.min(MAX_HELD_RECORDS as u64);
        let bytes = self.settings.max_bytes.min(MAX_HELD_BYTES as u64);
        self.overlap.held.len() as u64 >= records || self.overlap.held_bytes as u64 >= bytes
    }

    /// Starts committing the open transaction on a thread of its own and returns at once: the
    /// loop goes on consuming and processing, and what it adds meanwhile is held for the next
    /// transaction ([`Txn::add`]), which begins once this commit is settled. [`Txn::progress`]
    /// settles the commit when it has ended; every other call that needs it settled
    /// ([`Txn::commit`], [`Txn::abort_and_rewind`], a full hold) waits for it. If it fails,
    /// the held records go back with its own: every partition either touched is rewound.
    ///
    /// Only a transactional job whose outputs are all Kafka topics commits this way (an
    /// output outside Kafka must commit a batch before it stages the next; an at-least-once
    /// offset commit is the consumer's own call); any other commits here and now.
    pub fn commit_in_background<C: ConsumerContext>(
        &mut self,
        consumer: &BaseConsumer<C>,
    ) -> Result<(), TxnError> {
        if !self.overlaps() {
            return self.commit(consumer).map(|_| ());
        }
        if self.settle(consumer, Keep::Held)? == Committed::Aborted || !self.open {
            return Ok(());
        }
        let started = Instant::now();
        let (offsets, metadata) = match self.commit_request(consumer) {
            Ok(request) => request,
            Err(err) => {
                self.attempts += 1;
                return self.fail(consumer, err, AbortReason::CommitFailed);
            }
        };
        let calls = self.producer.calls();
        let timeout = self.settings.operation_timeout;
        let span = self.span.clone();
        let spawned = std::thread::Builder::new()
            .name("onceflow-commit".into())
            .spawn(move || {
                let _entered = span.enter();
                end_transaction(&calls, &offsets, &metadata, timeout, started)
            });
        match spawned {
            Ok(handle) => {
                self.attempts += 1;
                self.overlap.in_flight = Some(InFlight { handle, started });
                Ok(())
            }
            // No thread to be had: commit here.
            Err(_) => self.commit_now(consumer).map(|_| ()),
        }
    }

    /// Settles a background commit that has ended, if one has; one still running runs on.
    pub fn progress<C: ConsumerContext>(
        &mut self,
        consumer: &BaseConsumer<C>,
    ) -> Result<Committed, TxnError> {
        match &self.overlap.in_flight {
            Some(f) if f.handle.is_finished() => self.settle(consumer, Keep::Held),
            _ => Ok(Committed::Nothing),
        }
    }

    /// Whether this transaction commits in the background.
    fn overlaps(&self) -> bool {
        self.settings.overlap_commits
            && self.producer.transactional()
            && self.participants.is_empty()
            && !self.state.is_stateful()
            && self.settings.abort_every.is_none()
    }

    /// Waits for the background commit, if one runs, and concludes it: committed, what was
    /// held goes into the next transaction (`Done`, or `Aborted` when that one failed at
    /// once), or with [`Keep::Nothing`] is dropped and its partitions noted for the caller's
    /// rewind; failed, the transaction is aborted and rewound with what was held (`Aborted`).
    pub(super) fn settle<C: ConsumerContext>(
        &mut self,
        consumer: &BaseConsumer<C>,
        keep: Keep,
    ) -> Result<Committed, TxnError> {
        let Some(flight) = self.overlap.in_flight.take() else {
            return Ok(Committed::Nothing);
        };
        let result = match flight.handle.join() {
            Ok(result) => result,
            // A panic on the commit thread is a defect: end the process as the loop would.
            Err(panic) => std::panic::resume_unwind(panic),
        };
        let span = self.span.clone();
        let _entered = span.enter();
        match result {
            Ok(steps) => {
                self.producer.committed();
                self.stats.commit_steps.record(steps);
                self.committed(steps.ended - flight.started)?;
                if keep == Keep::Nothing {
                    self.drop_held();
                    return Ok(Committed::Done);
                }
                match self.release_held(consumer)? {
                    Added::Yes => Ok(Committed::Done),
                    Added::Aborted => Ok(Committed::Aborted),
                }
            }
            Err(err) => {
                // The held records' partitions are rewound with the transaction's.
                self.drop_held();
                self.fail(consumer, err, AbortReason::CommitFailed)?;
                Ok(Committed::Aborted)
            }
        }
    }

    /// Drops what was held, noting each record's partition for the next rewind.
    fn drop_held(&mut self) {
        for h in std::mem::take(&mut self.overlap.held) {
            self.offsets
                .record(&h.origin.topic, h.origin.partition, h.origin.offset);
        }
        self.overlap.held_topics.clear();
        self.overlap.held_bytes = 0;
    }

    /// Adds what was held, in order, to a new transaction. Every held record's offset is
    /// noted first, so that a failure part way rewinds each partition they came from.
    fn release_held<C: ConsumerContext>(
        &mut self,
        consumer: &BaseConsumer<C>,
    ) -> Result<Added, TxnError> {
        if self.overlap.held.is_empty() {
            return Ok(Added::Yes);
        }
        let held = std::mem::take(&mut self.overlap.held);
        let topics = std::mem::take(&mut self.overlap.held_topics);
        self.overlap.held_bytes = 0;
        for h in &held {
            self.offsets
                .record(&h.origin.topic, h.origin.partition, h.origin.offset);
        }
        let mut outputs: Vec<Outgoing<'_>> = Vec::new();
        for h in held {
            outputs.clear();
            outputs.extend(h.outputs.into_iter().map(|(t, record, lineage)| Outgoing {
                topic: topics.get(t).map_or("", String::as_str),
                record,
                lineage,
            }));
            let consumed = Consumed {
                origin: &h.origin,
                id: h.id.as_deref(),
                bytes: h.consumed_bytes,
            };
            if self.add_now(consumer, consumed, &outputs, !outputs.is_empty())? == Added::Aborted {
                return Ok(Added::Aborted);
            }
        }
        Ok(Added::Yes)
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::txn::AbortReason;
    use crate::txn::coordinator::fixture::*;

    /// Waits for the background commit to end, and settles it.
    fn settled(f: &mut Fixture) -> Committed {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let c = f.txn.progress(&f.consumer).expect("settled");
            if c != Committed::Nothing {
                return c;
            }
            assert!(Instant::now() < deadline, "the commit never ended");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn what_is_added_while_a_transaction_commits_goes_into_the_next_one() {
        let mut f = overlapping();
        add_out(&mut f, &origin(0, 0));
        add_out(&mut f, &origin(0, 1));
        f.txn.commit_in_background(&f.consumer).unwrap();
        let now = Instant::now();
        assert!(!f.txn.is_due(now), "never due while it commits");
        assert_eq!(f.txn.due_in(now), Some(IN_FLIGHT_POLL));
        assert!(f.txn.is_open());
        add_out(&mut f, &origin(1, 0));
        assert_eq!(f.txn.overlap.held.len(), 1, "held while the commit runs");

        assert_eq!(settled(&mut f), Committed::Done);
        let stats = f.txn.stats();
        assert_eq!((stats.committed, stats.records_committed), (1, 2));
        assert_eq!(stats.commit_steps.end.count(), 1);
        assert!(f.txn.overlap.held.is_empty());
        assert!(
            f.txn.is_open(),
            "the held record opened the next transaction"
        );
        assert_eq!(f.txn.commit(&f.consumer).unwrap(), Committed::Done);
        let stats = f.txn.stats();
        assert_eq!(
            (
                stats.committed,
                stats.records_committed,
                stats.outputs_committed
            ),
            (2, 3, 3)
        );
    }

    #[test]
    fn a_commit_or_an_abort_asked_meanwhile_waits_for_the_background_commit() {
        let mut f = overlapping();
        add_out(&mut f, &origin(0, 0));
        f.txn.commit_in_background(&f.consumer).unwrap();
        add_out(&mut f, &origin(0, 1));
        // A rebalance's commit: the background one settles, then the held record commits.
        assert_eq!(f.txn.commit(&f.consumer).unwrap(), Committed::Done);
        assert_eq!(f.txn.stats().committed, 2);
        assert!(!f.txn.is_open());

        add_out(&mut f, &origin(0, 2));
        f.txn.commit_in_background(&f.consumer).unwrap();
        add_out(&mut f, &origin(0, 3));
        // Partitions lost: what committed stays committed, what was held is dropped.
        f.txn
            .abort_and_rewind(&f.consumer, AbortReason::PartitionsLost, "")
            .unwrap();
        let stats = f.txn.stats();
        assert_eq!((stats.committed, stats.aborted), (3, 0));
        assert_eq!(stats.records_committed, 3);
        assert!(!f.txn.is_open() && f.txn.overlap.held.is_empty());
    }

    #[test]
    fn a_failed_background_commit_rewinds_the_partitions_of_what_was_held_too() {
        let mut f = overlapping();
        let (p0, p1) = fed(&f);
        // The transaction holds partition 0 only; partition 1 is read while it commits.
        for o in &p0 {
            add_out(&mut f, o);
        }
        fail_next_end_txn(&f);
        f.txn.commit_in_background(&f.consumer).unwrap();
        for o in &p1 {
            add_out(&mut f, o);
        }
        assert_eq!(settled(&mut f), Committed::Aborted);
        assert_eq!(f.txn.stats().producer_rebuilds, 1);
        assert!(!f.txn.is_open() && f.txn.overlap.held.is_empty());
        // Both partitions come again from where this transaction and the held records began.
        assert_comes_again(&f, &p0[0], &p1[0], "the held records' partition");
    }

    #[test]
    fn a_record_that_fills_the_hold_of_a_failing_commit_comes_again() {
        // Transactions of 3 records: the hold is full at 3 too.
        let mut f = kafka_only(true, 3);
        let (p0, p1) = fed(&f);
        add_out(&mut f, &p0[0]);
        fail_next_end_txn(&f);
        f.txn.commit_in_background(&f.consumer).unwrap();
        add_out(&mut f, &p1[0]);
        add_out(&mut f, &p1[1]);
        assert_eq!(f.txn.overlap.held.len(), 2);
        assert_eq!(
            try_add_out(&mut f, &p1[2]),
            Added::Aborted,
            "the third fills the hold: the loop waits for the commit, which fails"
        );
        assert!(f.txn.overlap.held.is_empty() && !f.txn.is_open());
        assert_comes_again(&f, &p0[0], &p1[0], "the held records' partition");
    }

    #[test]
    fn an_abort_asked_while_a_commit_runs_drops_what_was_held_without_sending_it() {
        let mut f = overlapping();
        let (p0, p1) = fed(&f);
        add_out(&mut f, &p0[0]);
        f.txn.commit_in_background(&f.consumer).unwrap();
        add_out(&mut f, &p1[0]);
        f.txn
            .abort_and_rewind(&f.consumer, AbortReason::PartitionsLost, "")
            .unwrap();
        let stats = f.txn.stats();
        assert_eq!(
            (stats.committed, stats.aborted),
            (1, 0),
            "nothing sent to abort"
        );
        assert_eq!(stats.records_committed, 1);
        assert!(!f.txn.is_open() && f.txn.overlap.held.is_empty());
        let first = read_again(&f);
        assert_eq!(
            first.get(&1),
            Some(&p1[0].offset),
            "the held record comes again"
        );
    }
}
