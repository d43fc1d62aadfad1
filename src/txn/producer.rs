//! The transactional producer: the only caller of librdkafka's transactional API
//! (`init_transactions`, `begin_transaction`, `send_offsets_to_transaction`,
//! `commit_transaction`, `abort_transaction`) in the whole crate.
//!
//! Every call but `begin` (local, immediate) retries retriable errors as the classifier says
//! until the operation timeout. Each attempt runs on a thread of its own ([`bounded`]): one
//! that has not returned [`bounded::ABANDON_AFTER`] past its own timeout is abandoned with
//! its client, which then counts as failed fatally, and the producer is rebuilt. Each is also
//! watched: one that could not be abandoned makes the process unhealthy and ends it. Without
//! transactions (at-least-once) the transactional calls do nothing.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rdkafka::consumer::ConsumerGroupMetadata;
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::producer::Producer as _;
use rdkafka::util::Timeout;
use rdkafka::{ClientConfig, TopicPartitionList};

use super::TxnError;
use super::bounded;
use super::classify::{TxnAction, classify, is_fencing_code, traits_of};
use super::collector::{Client, DeliveryTracker};
use crate::fence::Fences;
use crate::retry;
use crate::telemetry::{self, health::Health};

/// When a producer that failed fatally may be replaced: the decision, apart from the client.
///
/// A fatal error that is not a fence (the coordinator refusing EndTxn with INVALID_TXN_STATE
/// after it aborted a transaction that outlived its timeout while its broker failed over; a
/// commit still running in the background when an abort was asked) is cured by a new producer
/// with the same transactional.id: rebuild, as often as it takes, provided the new producer
/// proved itself by committing a transaction in between. A producer failing again before any
/// commit cannot be cured by rebuilding: the job stops. A fence (another producer took the
/// transactional.id, or the coordinator bumped the epoch itself) is rebuilt from as
/// [`Fences`] allows, [`crate::fence::PRODUCER_FENCES`] a window, committed in between or
/// not: two processes sharing an id fence each other's producers in turn until the
/// consumer's rule ([`crate::fence`]) has stopped one of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Rebuilds {
    /// The producer was rebuilt and has not committed since.
    unproven: bool,
    fences: Fences,
}

impl Default for Rebuilds {
    fn default() -> Rebuilds {
        Rebuilds {
            unproven: false,
            fences: Fences::at_most(crate::fence::PRODUCER_FENCES),
        }
    }
}

/// Why a producer that failed fatally may not be rebuilt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refused {
    /// It failed again before committing since its last rebuild.
    Unproven,
    /// It was fenced more often than the fence window allows.
    FencedAgain,
}

impl Rebuilds {
    /// Whether a producer that failed fatally (`fenced` or not) at `now` may be rebuilt; if
    /// so, counts the rebuild.
    pub fn allow(&mut self, fenced: bool, now: Instant) -> Result<(), Refused> {
        if fenced {
            if !self.fences.recover(now) {
                return Err(Refused::FencedAgain);
            }
        } else if self.unproven {
            return Err(Refused::Unproven);
        }
        self.unproven = true;
        Ok(())
    }

    /// A transaction committed: the producer works.
    pub fn committed(&mut self) {
        self.unproven = false;
    }
}

/// A producer with a stable transactional.id, rebuilt as [`Rebuilds`] allows.
pub(super) struct Producer {
    calls: Calls,
    config: ClientConfig,
    transactional: bool,
    rebuilds: Rebuilds,
}

/// The transactional calls of one client, each retried as the classifier says until the
/// operation timeout and watched; a clone is what a commit running on a thread of its own
/// takes along ([`Producer::calls`]).
#[derive(Clone)]
pub(super) struct Calls {
    client: Arc<Client>,
    /// A call of this client was abandoned ([`bounded`]): the client is unusable.
    abandoned: Arc<AtomicBool>,
    /// Upper bound of one transactional call, retries included.
    timeout: Duration,
    health: Arc<Health>,
}

impl Producer {
    /// Creates the producer and, with transactions, registers its transactional.id with the
    /// coordinator, which fences any older producer with the same id and aborts its open
    /// transaction.
    pub fn create(
        config: ClientConfig,
        timeout: Duration,
        transactional: bool,
        health: Arc<Health>,
    ) -> Result<Producer, TxnError> {
        let client = create_client(&config, timeout, transactional)?;
        Ok(Producer {
            calls: Calls {
                client: Arc::new(client),
                abandoned: Arc::default(),
                timeout,
                health,
            },
            config,
            transactional,
            rebuilds: Rebuilds::default(),
        })
    }

    pub fn client(&self) -> &Client {
        &self.calls.client
    }

    /// The calls of the current client, for a commit on another thread. A rebuild replaces
    /// the client: take them again after one.
    pub fn calls(&self) -> Calls {
        self.calls.clone()
    }

    pub fn transactional(&self) -> bool {
        self.transactional
    }

    /// Whether the producer itself reports a fatal error, which can stand behind any other.
    pub fn is_fatal(&self) -> bool {
        self.calls.is_fatal()
    }

    pub fn begin(&self) -> KafkaResult<()> {
        if !self.transactional {
            return Ok(());
        }
        self.calls.client.begin_transaction()
    }

    /// `commit_transaction`, retried and watched (the offsets, if any, sent before).
    pub fn commit(&mut self) -> KafkaResult<()> {
        self.calls.end()?;
        self.committed();
        Ok(())
    }

    /// A transaction committed (here or through [`Producer::calls`]): the producer works.
    pub fn committed(&mut self) {
        self.rebuilds.committed();
    }

    /// Aborts the open transaction; without transactions there is nothing to abort: what was
    /// sent is out, and comes again after the rewind.
    pub fn abort(&self) -> KafkaResult<()> {
        if !self.transactional {
            return Ok(());
        }
        let timeout = self.calls.timeout;
        self.calls
            .retrying("abort_transaction", move |p| p.abort_transaction(timeout))
    }

    /// Replaces a producer that failed fatally, as [`Rebuilds`] allows: the new producer's
    /// init_transactions completes or aborts whatever the old one left open.
    pub fn rebuild(&mut self, err: KafkaError) -> Result<(), TxnError> {
        // The error in hand may be a consequence (a purged or failed delivery) of the fence
        // the client itself reports as its fatal error.
        let fenced = traits_of(&err, false).fenced
            || self
                .calls
                .client
                .client()
                .fatal_error()
                .is_some_and(|(code, _)| is_fencing_code(code));
        match self.rebuilds.allow(fenced, Instant::now()) {
            Ok(()) => {}
            Err(Refused::Unproven) => return Err(TxnError::FatalAgain { error: err }),
            Err(Refused::FencedAgain) => return Err(TxnError::FencedAgain { error: err }),
        }
        telemetry::producer_rebuilt(&err, fenced);
        if fenced {
            std::thread::sleep(crate::fence::REBUILD_AFTER_FENCE);
        }
        // A client with a call abandoned is left alone: what it holds is in the transaction
        // the new producer's initialization aborts.
        if !self.calls.abandoned.load(Ordering::Acquire) {
            self.calls
                .client
                .purge(rdkafka::producer::PurgeConfig::default().queue().inflight());
        }
        let client = create_client(&self.config, self.calls.timeout, self.transactional)?;
        self.calls.client = Arc::new(client);
        self.calls.abandoned = Arc::default();
        Ok(())
    }
}

impl Calls {
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Whether the client failed fatally: it says so itself, or a call of it was abandoned.
    pub fn is_fatal(&self) -> bool {
        self.abandoned.load(Ordering::Acquire) || self.client.client().fatal_error().is_some()
    }

    pub fn send_offsets(
        &self,
        offsets: &TopicPartitionList,
        metadata: &Arc<ConsumerGroupMetadata>,
    ) -> KafkaResult<()> {
        let timeout = self.timeout;
        let offsets = offsets.clone();
        let metadata = Arc::clone(metadata);
        self.retrying("send_offsets_to_transaction", move |p| {
            hang_if_asked();
            p.send_offsets_to_transaction(&offsets, &metadata, timeout)
        })
    }

    /// `commit_transaction`, retried and watched.
    pub fn end(&self) -> KafkaResult<()> {
        let timeout = self.timeout;
        self.retrying("commit_transaction", move |p| p.commit_transaction(timeout))
    }

    /// Calls `op` again while the error is retriable, with a capped exponential backoff,
    /// until the operation timeout passes.
    fn retrying<T: Send + 'static>(
        &self,
        operation: &'static str,
        op: impl Fn(&Client) -> KafkaResult<T> + Send + Sync + 'static,
    ) -> KafkaResult<T> {
        let op = Arc::new(op);
        let deadline = Instant::now() + self.timeout;
        let mut backoff = retry::CLIENT_CALL.retries();
        loop {
            // Watched: a call that could not be abandoned ends the process.
            self.health.call_started(operation);
            let result = self.attempt(operation, &op);
            self.health.call_finished();
            let err = match result {
                Ok(v) => return Ok(v),
                Err(err) => err,
            };
            if classify(traits_of(&err, self.is_fatal())) != TxnAction::Retry {
                return Err(err);
            }
            let Some(delay) = backoff.next_delay(deadline) else {
                return Err(err);
            };
            telemetry::txn_retry(operation, backoff.attempt(), &err);
            std::thread::sleep(delay);
        }
    }

    /// One attempt of a call, on a thread of its own: abandoned, with its client, when it has
    /// not returned [`bounded::ABANDON_AFTER`] past its own timeout.
    fn attempt<T: Send + 'static>(
        &self,
        operation: &'static str,
        op: &Arc<impl Fn(&Client) -> KafkaResult<T> + Send + Sync + 'static>,
    ) -> KafkaResult<T> {
        let client = Arc::clone(&self.client);
        let op = Arc::clone(op);
        let bound = self.timeout + bounded::ABANDON_AFTER;
        match bounded::call(bound, move || op(&client)) {
            Some(result) => result,
            None => {
                self.abandoned.store(true, Ordering::Release);
                telemetry::client_call_abandoned(operation, bound, bounded::stuck());
                Err(KafkaError::Global(RDKafkaErrorCode::Fatal))
            }
        }
    }
}

/// Calls of `send_offsets_to_transaction` in this process, for the failpoint that hangs one.
static SEND_OFFSETS_CALLS: AtomicU64 = AtomicU64::new(0);

/// The failpoint [`crate::failpoints::HANG_SEND_OFFSETS`]: the n-th call of
/// `send_offsets_to_transaction` in the process does not return for an hour, as a call whose
/// answer never reaches the client.
fn hang_if_asked() {
    static HANG_AT: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    let Some(n) =
        *HANG_AT.get_or_init(|| crate::failpoints::Failpoints::from_env().hang_send_offsets)
    else {
        return;
    };
    if SEND_OFFSETS_CALLS.fetch_add(1, Ordering::AcqRel) + 1 == n {
        std::thread::sleep(Duration::from_secs(3_600));
    }
}

fn create_client(
    config: &ClientConfig,
    timeout: Duration,
    transactional: bool,
) -> Result<Client, TxnError> {
    let client: Client = config
        .create_with_context(DeliveryTracker::default())
        .map_err(|error| TxnError::CreateProducer { error })?;
    if !transactional {
        return Ok(client);
    }
    let deadline = Instant::now() + timeout.max(Duration::from_secs(30));
    loop {
        match client.init_transactions(Timeout::After(timeout)) {
            Ok(()) => return Ok(client),
            Err(KafkaError::Transaction(e)) if e.is_retriable() && Instant::now() < deadline => {
                telemetry::txn_retry("init_transactions", 0, &e);
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(error) => return Err(TxnError::Init { error }),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::{Rebuilds, Refused};
    use crate::fence::{FENCE_WINDOW, PRODUCER_FENCES};

    #[test]
    fn a_producer_is_rebuilt_again_only_after_it_committed() {
        let now = Instant::now();
        let mut r = Rebuilds::default();
        assert_eq!(r.allow(false, now), Ok(()));
        assert_eq!(
            r.allow(false, now),
            Err(Refused::Unproven),
            "failing again before any commit stops the job"
        );
        r.committed();
        assert_eq!(
            r.allow(false, now),
            Ok(()),
            "a rebuilt producer that committed may be rebuilt again"
        );
        r.committed();
        assert_eq!(r.allow(false, now), Ok(()));
    }

    #[test]
    fn fences_are_rebuilt_from_up_to_the_windows_limit_committed_in_between_or_not() {
        let start = Instant::now();
        let s = Duration::from_secs;
        let mut r = Rebuilds::default();
        for i in 0..PRODUCER_FENCES {
            assert_eq!(
                r.allow(true, start + s(i as u64)),
                Ok(()),
                "fence {i}: rebuilt without a commit in between"
            );
        }
        assert_eq!(
            r.allow(true, start + s(PRODUCER_FENCES as u64)),
            Err(Refused::FencedAgain),
            "fenced every second while the membership stands: this one stops"
        );
        assert_eq!(
            r.allow(true, start + FENCE_WINDOW + s(40)),
            Ok(()),
            "a broker failover a minute later is cured"
        );
        // A failure that is not a fence, before the producer rebuilt after a fence has
        // committed, is not cured by rebuilding again.
        assert_eq!(
            r.allow(false, start + FENCE_WINDOW + s(41)),
            Err(Refused::Unproven)
        );
        r.committed();
        assert_eq!(r.allow(false, start + FENCE_WINDOW + s(42)), Ok(()));
        // A fence, even before a producer rebuilt for another fatal error has committed.
        let mut r = Rebuilds::default();
        assert_eq!(r.allow(false, start), Ok(()));
        assert_eq!(r.allow(true, start + s(1)), Ok(()));
    }
}
