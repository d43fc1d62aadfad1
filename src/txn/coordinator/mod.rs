//! The owner of transaction state: when a transaction begins and is due, the commit order
//! across participants, aborts and rewinds, and the records participants refused.
//!
//! A transaction begins lazily with the first consumed record, collects the produced records
//! and the consumed offsets, and commits when it is due (time, records, bytes, or a full
//! participant). Every error goes through [`super::classify`]: retry the same call, abort and
//! rewind, or rebuild the producer once.
//!
//! The parts, by role (this file holds the transaction's state, its begin and additions, and
//! the commit's order):
//!
//! * [`participants`]: outputs outside Kafka: what each record leaves staged in them, their
//!   commit right before Kafka's, the transaction's outcome when one fails.
//! * [`refusals`]: the records a participant refused, handled as failed records when they
//!   come again after the rewind.
//! * [`kafka_commit`]: the Kafka side of a commit (deliveries awaited, offsets sent, EndTxn;
//!   under at-least-once, the consumer's offset commit), here or in the background.
//! * [`overlap`]: the commit in the background, the records held meanwhile and their release.
//! * [`rewind`]: what follows a transaction that cannot commit: the classifier's decision,
//!   the abort, the rewind to the committed offsets, the producer's rebuild.
//! * [`coalesce`]: outputs emitted once per key per commit, held until the commit.
//! * [`due`]: outputs no consumed record brings: delayed records that came due.
//! * [`stats`]: the totals since the job started ([`TxnStats`], [`CommitSteps`]).
//! * `fixture` (tests only): stub participants and the mock cluster the tests of every part
//!   run on.

mod coalesce;
mod due;
#[cfg(test)]
mod fixture;
mod kafka_commit;
mod overlap;
mod participants;
mod refusals;
mod rewind;
mod stats;

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use super::collector::Collector;
use super::offsets::TxnOffsets;
use super::producer::Producer;
use super::{AbortReason, TxnError};
use crate::lineage::Lineage;
use crate::record::{Origin, Record};
use crate::state::Stores;
use crate::telemetry::{self, health::Health, metrics::TopicCounts};
use crate::topology::Guarantee;
use overlap::{IN_FLIGHT_POLL, Keep, Overlap};
use participants::Participants;
use refusals::Refusals;

pub use due::Position;
pub use refusals::Redo;
pub use stats::{CommitSteps, TxnStats};

/// When a transaction is due, and how long client calls may take.
#[derive(Debug, Clone)]
pub struct TxnSettings {
    pub commit_interval: Duration,
    pub max_records: u64,
    pub max_bytes: u64,
    /// Upper bound of one transactional call, retries included.
    pub operation_timeout: Duration,
    /// Test-only failpoint: abort every n-th transaction instead of committing it.
    pub abort_every: Option<u64>,
    /// Test-only failpoint: every n-th Kafka commit reports a failure though it committed
    /// (its answer lost).
    pub lose_commit_every: Option<u64>,
    /// Test-only failpoint: abort the process right after the n-th commit of the
    /// participants, before the Kafka transaction commits.
    pub exit_after_participant_commit: Option<u64>,
    /// Without transactions, a "transaction" is the batch between two offset commits.
    pub guarantee: Guarantee,
    /// Whether the loop goes on consuming and processing while a transaction commits (see
    /// [`Txn::commit_in_background`]).
    pub overlap_commits: bool,
}

/// What became of a commit request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Committed {
    /// Nothing was open.
    Nothing,
    /// The transaction committed.
    Done,
    /// The transaction was aborted and the partitions rewound.
    Aborted,
}

/// Whether a record was added to the open transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Added {
    Yes,
    /// The transaction was aborted and rewound: drop the rest of what was polled.
    Aborted,
}

/// The consumed record an addition to the transaction is for.
#[derive(Debug, Clone, Copy)]
pub struct Consumed<'a> {
    pub origin: &'a Origin,
    /// Its event id (its input's `id_header`), in the lineage of its outputs.
    pub id: Option<&'a [u8]>,
    /// Its key and value bytes.
    pub bytes: usize,
}

impl<'a> Consumed<'a> {
    /// A consumed record of `bytes` bytes, without an event id.
    pub fn at(origin: &'a Origin, bytes: usize) -> Consumed<'a> {
        Consumed {
            origin,
            id: None,
            bytes,
        }
    }
}

/// A record for a Kafka topic, added to the transaction.
#[derive(Debug, Clone)]
pub struct Outgoing<'t> {
    pub topic: &'t str,
    pub record: Record,
    /// Whether it is written with the lineage of the [`Consumed`] record it comes from
    /// ([`crate::lineage`]): stamped as it is sent, no header built before.
    pub lineage: bool,
}
/// The transaction owner.
pub struct Txn {
    producer: Producer,
    settings: TxnSettings,
    open: bool,
    opened_at: Instant,
    offsets: TxnOffsets,
    records: u64,
    collector: Collector,
    attempts: u64,
    stats: TxnStats,
    consumed: TopicCounts,
    filtered: u64,
    health: Arc<Health>,
    span: tracing::Span,
    /// Outputs outside Kafka, committed right before the Kafka transaction.
    participants: Participants,
    /// Records a participant refused in an aborted transaction.
    refused: Refusals,
    /// A record consumed but not added, whose partition a rewind must also take back
    /// ([`Txn::commit_before`]).
    in_hand: Option<Origin>,
    /// The commit running in the background, and what was held meanwhile.
    overlap: Overlap,
    /// The stores of the stateful steps: their changes go to the changelogs in this
    /// transaction and reach the stores once it commits.
    state: Stores,
    /// Outputs held until the commit, the latest per input key (`emit: per_commit`).
    coalesced: coalesce::Coalesced,
}

impl Txn {
    /// Creates the producer and registers its transactional.id with the coordinator, which
    /// fences any older producer with the same id and aborts its open transaction.
    pub fn new(
        config: ClientConfig,
        settings: TxnSettings,
        health: Arc<Health>,
    ) -> Result<Txn, TxnError> {
        let transactional = settings.guarantee == Guarantee::ExactlyOnce;
        let producer = Producer::create(
            config,
            settings.operation_timeout,
            transactional,
            Arc::clone(&health),
        )?;
        Ok(Txn {
            producer,
            settings,
            open: false,
            opened_at: Instant::now(),
            offsets: TxnOffsets::default(),
            records: 0,
            collector: Collector::new(),
            attempts: 0,
            stats: TxnStats::default(),
            consumed: TopicCounts::consumed(),
            filtered: 0,
            health,
            span: tracing::Span::none(),
            participants: Participants::default(),
            refused: Refusals::default(),
            in_hand: None,
            overlap: Overlap::default(),
            state: Stores::default(),
            coalesced: coalesce::Coalesced::default(),
        })
    }

    /// The stores of the job's stateful steps (none by default).
    pub fn with_state(mut self, stores: Stores) -> Txn {
        self.state = stores;
        self
    }

    /// The stores, for the pipeline to read and change while it processes a record, and for
    /// a restore.
    pub fn state(&mut self) -> &mut Stores {
        &mut self.state
    }

    pub fn stats(&self) -> &TxnStats {
        &self.stats
    }

    pub fn is_open(&self) -> bool {
        self.open
    }

    /// Age of the open transaction, if one is open.
    pub fn age(&self, now: Instant) -> Option<Duration> {
        self.open
            .then(|| now.saturating_duration_since(self.opened_at))
    }

    /// Time until the open transaction is due, or `None` when nothing is open; while a
    /// commit runs in the background, a millisecond: the loop looks for its end that often.
    pub fn due_in(&self, now: Instant) -> Option<Duration> {
        if self.overlap.committing() {
            return Some(IN_FLIGHT_POLL);
        }
        self.open.then(|| {
            (self.opened_at + self.settings.commit_interval).saturating_duration_since(now)
        })
    }

    /// Whether the open transaction should commit now (never while it commits).
    pub fn is_due(&self, now: Instant) -> bool {
        self.open
            && !self.overlap.committing()
            && (self.records >= self.settings.max_records
                || self.collector.bytes >= self.settings.max_bytes
                || now >= self.opened_at + self.settings.commit_interval
                || self.participants.any_full())
    }

    /// The consumer found nothing to read: with no transaction open there is nothing to
    /// commit, and a job that keeps up with a quiet input is making progress.
    /// A job with state that went quiet after applying changes writes its checkpoints now
    /// (when due), so that a restart after a burst replays only what came since.
    pub fn idle(&mut self) -> Result<(), TxnError> {
        if !self.open {
            self.health.progressed();
            if !self.overlap.committing() {
                self.state
                    .idle()
                    .map_err(|e| TxnError::State(e.to_string()))?;
            }
        }
        Ok(())
    }

    /// Serves delivery reports. Call it regularly.
    pub fn poll(&self) {
        self.producer.client().poll(Duration::ZERO);
    }

    /// Adds what the pipeline made of one consumed record to the open transaction; while
    /// that commits in the background, holds it for the next one.
    pub fn add<C: ConsumerContext>(
        &mut self,
        consumer: &BaseConsumer<C>,
        consumed: Consumed<'_>,
        outputs: &[Outgoing<'_>],
    ) -> Result<Added, TxnError> {
        if self.overlap.committing() {
            self.overlap.hold(consumed, outputs);
            if !self.hold_is_full() {
                return Ok(Added::Yes);
            }
            // Full: wait for the commit. This record, held last, goes into the next
            // transaction with the others, or its partition is rewound with theirs.
            return Ok(match self.settle(consumer, Keep::Held)? {
                Committed::Aborted => Added::Aborted,
                _ => Added::Yes,
            });
        }
        self.add_now(consumer, consumed, outputs, !outputs.is_empty())
    }

    /// Adds one record here and now: its offset, `outputs` and state changes. `made_outputs`:
    /// whether the pipeline made any (those held until the commit are not in `outputs`); a
    /// record that made none was filtered out.
    fn add_now<C: ConsumerContext>(
        &mut self,
        consumer: &BaseConsumer<C>,
        consumed: Consumed<'_>,
        outputs: &[Outgoing<'_>],
        made_outputs: bool,
    ) -> Result<Added, TxnError> {
        let origin = consumed.origin;
        // Noted before anything is sent: if the transaction fails on the way, the rewind
        // must take this record's partition back too, even when it is the first record of
        // that partition in the transaction (else the record would be skipped, lost).
        self.offsets
            .record(&origin.topic, origin.partition, origin.offset);
        if self.begin_if_closed(consumer)? == Added::Aborted {
            return Ok(Added::Aborted);
        }
        let lineage = |out: &Outgoing<'_>| {
            out.lineage.then_some(Lineage {
                origin,
                id: consumed.id,
            })
        };
        if self.send_outputs(consumer, outputs, lineage)? == Added::Aborted {
            return Ok(Added::Aborted);
        }
        if self.send_changes(consumer)? == Added::Aborted {
            return Ok(Added::Aborted);
        }
        self.consumed.add(&origin.topic, consumed.bytes);
        if !made_outputs && !self.participants.take_staged() {
            self.filtered += 1;
        }
        self.records += 1;
        Ok(Added::Yes)
    }

    /// Begins a transaction unless one is open; `Aborted` when it cannot begin.
    fn begin_if_closed<C: ConsumerContext>(
        &mut self,
        consumer: &BaseConsumer<C>,
    ) -> Result<Added, TxnError> {
        if !self.open {
            if let Err(err) = self.producer.begin() {
                self.fail(consumer, err, AbortReason::BeginFailed)?;
                return Ok(Added::Aborted);
            }
            self.open = true;
            self.opened_at = Instant::now();
            self.span = tracing::info_span!("txn", seq = self.attempts + 1);
        }
        Ok(Added::Yes)
    }

    /// Sends `outputs`, each stamped with the lineage `lineage` gives it.
    fn send_outputs<'o, C: ConsumerContext>(
        &mut self,
        consumer: &BaseConsumer<C>,
        outputs: &'o [Outgoing<'_>],
        lineage: impl Fn(&'o Outgoing<'_>) -> Option<Lineage<'o>>,
    ) -> Result<Added, TxnError> {
        for out in outputs {
            let sent = self.collector.send(
                self.producer.client(),
                out.topic,
                &out.record,
                lineage(out),
                self.settings.operation_timeout,
            );
            if let Err(err) = sent {
                self.fail(consumer, err, AbortReason::ProduceFailed)?;
                return Ok(Added::Aborted);
            }
        }
        Ok(Added::Yes)
    }

    /// Sends the state changes of the record at hand to the changelogs.
    fn send_changes<C: ConsumerContext>(
        &mut self,
        consumer: &BaseConsumer<C>,
    ) -> Result<Added, TxnError> {
        for change in self.state.take_record() {
            let topic = &self.state.topics()[change.store];
            let sent = self.collector.send_change(
                self.producer.client(),
                topic,
                &change,
                self.settings.operation_timeout,
            );
            if let Err(err) = sent {
                self.fail(consumer, err, AbortReason::ProduceFailed)?;
                return Ok(Added::Aborted);
            }
        }
        Ok(Added::Yes)
    }

    /// Commits the open transaction with the consumed offsets, or aborts and rewinds it when
    /// it cannot commit. A commit running in the background is settled first, and what was
    /// held meanwhile is committed too.
    pub fn commit<C: ConsumerContext>(
        &mut self,
        consumer: &BaseConsumer<C>,
    ) -> Result<Committed, TxnError> {
        if self.settle(consumer, Keep::Held)? == Committed::Aborted {
            return Ok(Committed::Aborted);
        }
        self.commit_now(consumer)
    }

    /// Commits, as [`Txn::commit`] does, while the record at `in_hand` waits outside the
    /// transaction (consumed, not added: to be tried again, or its partition paused). When
    /// the commit aborts, that record's partition is rewound too, even if the transaction
    /// held nothing of it, so that the record comes again instead of being passed over.
    pub fn commit_before<C: ConsumerContext>(
        &mut self,
        consumer: &BaseConsumer<C>,
        in_hand: &Origin,
    ) -> Result<Committed, TxnError> {
        self.in_hand = Some(in_hand.clone());
        let result = self.commit(consumer);
        self.in_hand = None;
        result
    }

    fn commit_now<C: ConsumerContext>(
        &mut self,
        consumer: &BaseConsumer<C>,
    ) -> Result<Committed, TxnError> {
        if !self.open {
            self.health.progressed();
            return Ok(Committed::Nothing);
        }
        self.attempts += 1;
        let span = self.span.clone();
        let _entered = span.enter();
        if self
            .settings
            .abort_every
            .is_some_and(|n| n > 0 && self.attempts.is_multiple_of(n))
        {
            self.abort_and_rewind(consumer, AbortReason::Failpoint, "every n-th transaction")?;
            return Ok(Committed::Aborted);
        }
        // The outputs held until the commit (the latest per key) join the transaction.
        if let Err(err) = self.send_coalesced() {
            self.fail(consumer, err, AbortReason::ProduceFailed)?;
            return Ok(Committed::Aborted);
        }
        let started = Instant::now();
        // Outputs outside Kafka commit first: a crash before the Kafka commit replays the
        // batch, and they absorb the replay.
        if let Err(e) = self.commit_participants() {
            return self.participants_failed(consumer, e);
        }
        let result = self.try_commit(consumer, started).and_then(|steps| {
            match self.settings.lose_commit_every {
                Some(n) if n > 0 && self.attempts.is_multiple_of(n) => {
                    Err(KafkaError::Global(RDKafkaErrorCode::OperationTimedOut))
                }
                _ => Ok(steps),
            }
        });
        match result {
            Ok(steps) => {
                self.stats.commit_steps.record(steps);
                self.committed(started.elapsed())?;
                Ok(Committed::Done)
            }
            Err(err) => {
                self.fail(consumer, err, AbortReason::CommitFailed)?;
                Ok(Committed::Aborted)
            }
        }
    }

    /// Counts what the transaction committed, applies its state changes, and starts afresh.
    /// A store that cannot take the changes stops the job: the changelog has them, and the
    /// restore at the next start replays them from the store's checkpoint.
    fn committed(&mut self, took: Duration) -> Result<(), TxnError> {
        self.forget_refusals_committed();
        self.stats.commit_durations.record(took);
        self.stats.committed += 1;
        self.stats.records_committed += self.records;
        let outputs = self.collector.outputs;
        self.stats.outputs_committed += outputs;
        self.consumed.commit();
        self.collector.commit();
        telemetry::records_filtered(self.filtered);
        telemetry::txn_committed(self.records, outputs, took);
        self.health.progressed();
        let applied = self.state.commit();
        self.reset();
        applied.map_err(|e| TxnError::State(e.to_string()))
    }

    fn reset(&mut self) {
        self.coalesced.clear();
        self.participants.discard();
        self.state.abort();
        self.consumed.discard();
        self.collector.discard();
        self.filtered = 0;
        self.span = tracing::Span::none();
        self.open = false;
        self.offsets.clear();
        self.records = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::txn::coordinator::fixture::*;

    #[test]
    fn the_failpoint_aborts_every_nth_transaction() {
        let mut f = fixture(Some(2));
        let mut outcomes = Vec::new();
        for offset in 0..4 {
            add(&mut f, &origin(1, offset));
            outcomes.push(f.txn.commit(&f.consumer).unwrap());
        }
        use Committed::*;
        assert_eq!(outcomes, [Done, Aborted, Done, Aborted]);
        assert_eq!((f.txn.stats().committed, f.txn.stats().aborted), (2, 2));
    }
}
