//! onceflow: exactly-once read-process-write jobs for Apache Kafka, declared in YAML.
//!
//! Data flows one way, and so do the modules:
//!
//! * [`topology`]: the YAML model of a job and its validation (every problem at once, each
//!   with its field path).
//! * [`transform`]: the pipeline of processors; pure functions of a [`transform::Record`],
//!   no Kafka client or async type in sight.
//! * [`engine`]: the consumer/producer loop. [`engine::txn`] owns all transaction state and is
//!   the only caller of the transactional API; [`engine::classify`] is the one decision of
//!   what an error means (retry, abort and rewind, or fatal); [`engine::offsets`] holds the
//!   offset arithmetic (commit last processed + 1).
//! * [`sink`]: outputs outside Kafka, which cannot join its transactions and are made
//!   idempotent instead: [`sink::postgres`] upserts by id through an inbox table, committed
//!   right before the Kafka transaction.
//! * [`embedded`]: an in-process cluster for a first run with nothing installed. It does not
//!   enforce transactions and proves nothing about exactly-once.
//! * [`telemetry`]: every log line about the job's life, from one place.
//! * [`validate`]: every problem of a topology file at once, with field paths and lines, and
//!   the checks only a broker can answer.
//! * [`testing`]: runs a pipeline over the records of a cases file, without a broker, and
//!   compares the outputs (`onceflow test`, and the tests of `topologies/`).
//! * [`histogram`]: a duration histogram, HdrHistogram with 3 significant digits (commit
//!   durations, benchmark latencies).
//! * [`bench`]: `onceflow bench`, throughput against partition count next to the broker's
//!   ceiling and Kafka Streams.
//!
//! A job consumes with `isolation.level=read_committed` and no auto-commit, and commits its
//! outputs together with the consumed offsets (`send_offsets_to_transaction` with the
//! consumer's group metadata) in transactions of a producer whose `transactional.id` is stable
//! per topology and instance: after a crash the restarted instance fences its previous
//! incarnation and the broker aborts whatever it left open.

pub mod bench;
pub mod dlq;
pub mod embedded;
pub mod engine;
pub mod histogram;
pub mod sink;
mod sync;
pub mod telemetry;
pub mod testing;
pub mod topology;
pub mod transform;
pub mod validate;
