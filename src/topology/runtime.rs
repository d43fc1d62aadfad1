//! When a transaction commits, how long it may stay open, and what becomes of a record the
//! pipeline fails on: the `runtime` section of a topology.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What the job does with a record the pipeline cannot process (value not valid JSON, an
/// expression failing on it: missing field, wrong type).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnError {
    /// Write the record to the dead-letter topic, in the same transaction as the outputs and
    /// the offsets, with headers saying what failed, where and when.
    #[default]
    DeadLetter,
    /// Abort the open transaction, rewind, and stop with an error naming the record's origin.
    /// Nothing is lost: the record's offset is never committed.
    Fail,
    /// Commit the record's offset without output, log it with its origin and count it.
    Skip,
}

/// What happens to a record whose transient failure outlasts its attempts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnExhausted {
    /// Handle it as `on_error` says (by default: the dead-letter topic).
    #[default]
    DeadLetter,
    /// Pause its partition, keep the transaction clean, and try it again later.
    Pause,
}

/// When a transaction commits, and how long it may stay open.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Runtime {
    /// Commit the open transaction after this many milliseconds.
    #[serde(default = "default_commit_interval_ms")]
    pub commit_interval_ms: u64,
    /// ... or once it holds this many consumed records, whichever comes first.
    #[serde(default = "default_max_records_per_txn")]
    pub max_records_per_txn: u64,
    /// ... or once it holds this many produced bytes.
    #[serde(default = "default_max_bytes_per_txn")]
    pub max_bytes_per_txn: u64,
    /// `transaction.timeout.ms` of the producer: the broker aborts a transaction left open
    /// longer than this (for example by a dead instance that never comes back).
    #[serde(default = "default_transaction_timeout_ms")]
    pub transaction_timeout_ms: u64,
    /// Use static group membership (`group.instance.id` = instance id): a restarted instance
    /// gets its partitions back at once, without a rebalance of the whole group.
    #[serde(default = "default_static_membership")]
    pub static_membership: bool,
    /// Consumer `session.timeout.ms`: how long a dead instance keeps its partitions.
    #[serde(default = "default_session_timeout_ms")]
    pub session_timeout_ms: u64,
    /// What to do with a record the pipeline fails on for good: `dead_letter` (default),
    /// `fail` (stop) or `skip` (log, count, commit its offset without output).
    #[serde(default)]
    pub on_error: OnError,
    /// Attempts at a record whose failure is transient (the first included) before it is
    /// handled as `on_error` says.
    #[serde(default = "default_max_attempts")]
    pub max_attempts: u32,
    /// When the attempts at a transiently failing record run out: `dead_letter` (default, as
    /// `on_error` says) or `pause` (commit what is open, pause the record's partition for
    /// `retry_backoff_max_ms`, then try the record again; other partitions keep flowing).
    #[serde(default)]
    pub on_exhausted: OnExhausted,
    /// Delay before the second attempt; it doubles up to `retry_backoff_max_ms`, with jitter.
    #[serde(default = "default_retry_backoff_ms")]
    pub retry_backoff_ms: u64,
    /// Cap of the delay between attempts.
    #[serde(default = "default_retry_backoff_max_ms")]
    pub retry_backoff_max_ms: u64,
    /// `exactly_once` (default): outputs and offsets commit in one Kafka transaction.
    /// `at_least_once`: no transactions; offsets are committed after every output is
    /// acknowledged, so a crash may write some outputs twice. For comparison and for sinks
    /// that are idempotent anyway.
    #[serde(default)]
    pub guarantee: Guarantee,
    /// The consumer group protocol: `classic` (default; cooperative-sticky assignment,
    /// `session_timeout_ms` from here) or `consumer` (KIP-848, brokers 4.0+: the broker
    /// assigns partitions and owns the session timeout, `group.consumer.session.timeout.ms`;
    /// with static membership a second member with a live member's instance id is refused,
    /// instead of fencing the first).
    #[serde(default)]
    pub group_protocol: GroupProtocol,
    /// Go on consuming and processing while a transaction commits (exactly-once jobs whose
    /// outputs are all Kafka topics; the others commit between records anyway). What is
    /// processed meanwhile goes into the next transaction. Off by default: measured against
    /// a broker on the same machine it gained nothing (the wait for the last deliveries, which
    /// it cannot shorten, is most of a commit) and cost CPU (docs/benchmarks.md); it may pay
    /// where the round trips to the coordinators are long.
    #[serde(default = "default_overlap_commits")]
    pub overlap_commits: bool,
    /// Where stateful steps keep their committed state: `disk` (a restart restores only the
    /// changelogs' tail since the store's checkpoint) or `memory` (every start restores the
    /// changelogs in full). Default: `disk`.
    #[serde(default)]
    pub state_store: StateStore,
    /// The folder of the disk stores; each instance keeps its own below it, in
    /// `<state_dir>/<topology>/<instance id>`. Default: `onceflow-state`, relative to the
    /// working directory.
    #[serde(default = "default_state_dir")]
    pub state_dir: String,
}

/// Where stateful steps keep their committed state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum StateStore {
    #[default]
    Disk,
    Memory,
}

/// The consumer group protocol of a job.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum GroupProtocol {
    #[default]
    Classic,
    Consumer,
}

/// The delivery guarantee of a job.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Guarantee {
    #[default]
    ExactlyOnce,
    AtLeastOnce,
}

fn default_state_dir() -> String {
    "onceflow-state".into()
}
fn default_max_attempts() -> u32 {
    3
}
fn default_retry_backoff_ms() -> u64 {
    100
}
fn default_retry_backoff_max_ms() -> u64 {
    5_000
}
fn default_commit_interval_ms() -> u64 {
    100
}
fn default_max_records_per_txn() -> u64 {
    10_000
}
fn default_max_bytes_per_txn() -> u64 {
    16 * 1024 * 1024
}
fn default_transaction_timeout_ms() -> u64 {
    10_000
}
fn default_static_membership() -> bool {
    true
}
fn default_session_timeout_ms() -> u64 {
    45_000
}
fn default_overlap_commits() -> bool {
    false
}

impl Default for Runtime {
    fn default() -> Self {
        Runtime {
            commit_interval_ms: default_commit_interval_ms(),
            max_records_per_txn: default_max_records_per_txn(),
            max_bytes_per_txn: default_max_bytes_per_txn(),
            transaction_timeout_ms: default_transaction_timeout_ms(),
            static_membership: default_static_membership(),
            session_timeout_ms: default_session_timeout_ms(),
            guarantee: Guarantee::default(),
            group_protocol: GroupProtocol::default(),
            overlap_commits: default_overlap_commits(),
            state_store: StateStore::default(),
            state_dir: default_state_dir(),
            on_error: OnError::default(),
            max_attempts: default_max_attempts(),
            on_exhausted: OnExhausted::default(),
            retry_backoff_ms: default_retry_backoff_ms(),
            retry_backoff_max_ms: default_retry_backoff_max_ms(),
        }
    }
}
