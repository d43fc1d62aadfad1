//! onceflow: exactly-once read-process-write jobs for Apache Kafka, declared in YAML.
//!
//! Data flows one way, and so do the modules:
//!
//! ```text
//! source ──> codec (decode) ──> transform ──> codec (encode) ──> Kafka outputs, dead letters
//!                                   │                       └──> sinks (PostgreSQL, HTTP)
//!                                 state (stores) ──> changelogs in Kafka
//!                       txn: the one owner of every transaction ──┘
//! ```
//!
//! * [`record`]: the [`record::Record`] that flows through it all, its
//!   [`record::Origin`], and the [`record::RecordError`] that reaches the engine.
//! * [`topology`]: the YAML model of a job and its checks (every problem at once, each with
//!   its field path), the names the model defines (the message-id header, an outbox's
//!   origin topic), and the JSON Schema of the file made from it. [`load`]: the one loader every command calls (environment, parsing,
//!   checks, the compiled pipeline).
//! * [`job`]: which loop runs a topology: the relay for an outbox table, the engine
//!   otherwise. [`instance`]: one running instance, whichever loop runs it (its identity,
//!   how its run ends, what it did, how long one client call may take).
//! * `source`: where records come from: the job's input topics under read_committed, the
//!   consumer's rebalance callback, pausing and resuming partitions.
//! * [`codec`]: bytes to the pipeline's [`codec::Value`] and back (raw, JSON, Avro with a
//!   schema registry whose schemas are fetched once per id and cached).
//! * [`transform`]: the compiled pipeline of processors and CEL expressions; pure functions
//!   of a record, no Kafka client or async type in sight. Stateless steps first, then the
//!   stateful ones: `aggregate`, its windows by event time ([`transform::window`]),
//!   `dedupe`, `join`, and `delay` ([`transform::delay`]).
//! * [`state`]: the keyed stores of the stateful steps, their changelogs in the job's
//!   transaction (commit, then apply), their restore when partitions are assigned, and the
//!   timed stores' keys in time order (windows to close, delayed records to send).
//! * [`engine`]: the read-process-write loop of one job, thin: it polls, processes, lets the
//!   pure [`engine::outcome`] decide what becomes of each record, and carries that out; with
//!   a `delay`, it also sends what came due by the wall clock.
//! * `relay`: the loop of a topology whose input is a PostgreSQL outbox table, and
//!   everything of the outbox in one folder: the table's layout and SQL, rows as records,
//!   progress records, shards, batches, the connection, and the table check of
//!   `onceflow validate --database`.
//! * [`txn`]: the transaction owner, the only caller of the transactional API (for the job,
//!   the relay and `dlq replay` alike): lazy begin, commit order across
//!   [participants](txn::Participant), commits in the background, abort and rewind,
//!   refusals, the error classifier. `fence`: when a fenced consumer joins again and a
//!   fenced producer is rebuilt.
//! * [`sink`]: outputs outside Kafka, made idempotent instead: the [`sink::Sink`] trait and
//!   [`sink::postgres`], which upserts by id through an inbox table, and [`sink::http`],
//!   which calls an endpoint per record with an idempotency key.
//! * `pg`: PostgreSQL for everything that uses it (connections and TLS, errors, the inbox
//!   and origins tables, an inbox reader, rows): the PostgreSQL sink, the HTTP sink's
//!   dedup, the relay and reconcile.
//! * [`kafka`]: Kafka clients outside the job's transaction: configurations, reading a topic
//!   to its end, sending with a full queue, admin calls, the embedded cluster of a first run.
//! * [`dlq`]: the dead-letter format, `dlq inspect` and `dlq replay`.
//! * `lineage`: the `onceflow.origin.*` headers that name the consumed record every output
//!   and dead-letter record came from; `reconcile`: `onceflow reconcile`, which reads them
//!   back and proves that what was consumed and what was written agree.
//! * `doctor`: `onceflow txn doctor`, open and hanging transactions and their cure.
//!   `deploy`: `onceflow deploy render`, the Kubernetes manifests of a topology.
//! * [`telemetry`]: every log line and metric, from one place; health and the HTTP endpoint.
//! * [`validate`] and [`testing`]: what only a broker or a registry can answer for
//!   `onceflow validate`, and `onceflow test` (a pipeline over a cases file, no broker).
//! * [`cli`] (one file per command), [`alloc`] (the allocator's settings of the binaries), `supervise` (signals, the grace period of a stop, the
//!   watchdog of hung calls), `failpoints` (every test failpoint), `retry` (the one
//!   backoff), [`histogram`] (HdrHistogram of durations, 3 significant digits).
//!
//! Modules are `pub(crate)` unless the binary, the tests or the benchmark use them; those
//! are linked above, the others named in code type.
//!
//! The benchmark (throughput against partition count next to the broker's ceiling and Kafka
//! Streams) is a crate of its own, `benches/bench` (`onceflow-bench`), built on this library.
//!
//! A job consumes with `isolation.level=read_committed` and no auto-commit, and commits its
//! outputs together with the consumed offsets (`send_offsets_to_transaction` with the
//! consumer's group metadata) in transactions of a producer whose `transactional.id` is stable
//! per topology and instance: after a crash the restarted instance fences its previous
//! incarnation and the broker aborts whatever it left open.

// The reference of the crate is read with its private items (`cargo doc
// --document-private-items`, checked in CI): links from public items to private ones are
// what a reader of the code follows.
#![allow(rustdoc::private_intra_doc_links)]

pub mod alloc;
pub mod cli;
pub mod codec;
pub(crate) mod deploy;
pub mod dlq;
pub(crate) mod doctor;
pub mod engine;
pub(crate) mod failpoints;
pub(crate) mod fence;
pub mod histogram;
pub mod instance;
pub mod job;
pub mod kafka;
pub(crate) mod lineage;
pub mod load;
pub(crate) mod pg;
pub(crate) mod reconcile;
pub mod record;
pub(crate) mod relay;
pub(crate) mod retry;
pub mod sink;
pub(crate) mod source;
pub mod state;
pub(crate) mod supervise;
mod sync;
pub mod telemetry;
pub mod testing;
pub mod topology;
pub mod transform;
pub mod txn;
pub mod validate;
