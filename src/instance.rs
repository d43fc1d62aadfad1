//! One running instance of a topology, whichever loop runs it ([`crate::engine`] or
//! [`crate::relay`]): who it is ([`Identity`]), how its run ends ([`RunOptions`]), what it
//! did ([`Summary`]), and how long one of its client calls may take ([`call_bound`]).

use std::sync::Arc;
use std::time::Duration;

pub use crate::kafka::clients::Identity;
use crate::telemetry::health::Health;
use crate::topology::Topology;
use crate::txn::TxnStats;

/// How a run ends besides a shutdown signal.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Stop once this many consumed records are committed.
    pub stop_after_records: Option<u64>,
    /// Test-only failpoint: abort every n-th transaction instead of committing it.
    pub abort_every: Option<u64>,
    /// Test-only failpoint: every n-th Kafka commit reports a failure though it committed.
    pub lose_commit_every: Option<u64>,
    /// Test-only failpoint: the pipeline fails transiently this many times (in all) first.
    pub transient_failures: u64,
    /// Test-only failpoint: abort the process right after the n-th database commit of the
    /// sinks, before the Kafka transaction commits.
    pub exit_after_db_commit: Option<u64>,
    /// Test-only failpoint (outbox relays): abort the process right after the n-th Kafka
    /// commit, before the database commit that deletes the published rows.
    pub exit_after_kafka_commit: Option<u64>,
    /// How often a progress line is logged.
    pub progress_every: Option<Duration>,
    /// Where the job reports its readiness.
    pub health: Arc<Health>,
    /// librdkafka statistics (lag, rtt, queues) this often; `None` turns them off.
    pub statistics_every: Option<Duration>,
}

/// What a run did, counting committed work only (except `skipped`).
#[derive(Debug, Clone)]
pub struct Summary {
    pub txn: TxnStats,
    /// Records the pipeline failed on and `runtime.on_error: skip` passed over. Counted when
    /// processed: a record of a transaction that was aborted and redone counts twice.
    pub skipped: u64,
    pub elapsed: Duration,
    /// Time from the first consumed record to the end: throughput without start-up.
    pub busy: Duration,
}

/// How long one transactional client call may take before the process counts as stuck.
/// Each call is given the transaction timeout as its own (the retries around it are separate
/// calls), so past that and 5 s of scheduling slack it is not coming back: stock librdkafka's
/// send_offsets_to_transaction waited forever when the group coordinator's broker died
/// (librdkafka#5456, #5511; vendor/patches/0005-0007 make it return). A call is abandoned
/// with its client 2.5 s past its timeout already (`txn::bounded`): this bound is reached
/// only by a call that could not be abandoned, and every second of it is a second of a
/// partition held.
pub fn call_bound(topology: &Topology) -> Duration {
    Duration::from_millis(
        topology
            .runtime
            .transaction_timeout_ms
            .saturating_add(5_000),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_call_counts_as_stuck_5_s_past_its_own_timeout() {
        let text = "name: t\ninputs: [{topic: in}]\noutputs: [{topic: out}]\nruntime: {transaction_timeout_ms: 10000}\n";
        let topology: Topology = serde_saphyr::from_str(text).unwrap();
        assert_eq!(call_bound(&topology), Duration::from_secs(15));
    }
}
