//! The outbox relay: publishes the rows of a PostgreSQL outbox table to Kafka, each once, in
//! the order of their ids per aggregate, then deletes them.
//!
//! The table is split into shards by a hash of the aggregate id. A relay publishes a shard
//! while it holds the shard's advisory lock (a session lock: it ends with the relay's
//! connection), with the shard's own transactional id. One round of a shard:
//!
//! 1. claim its oldest rows (`SELECT ... ORDER BY id LIMIT n FOR UPDATE SKIP LOCKED`) in a
//!    database transaction;
//! 2. in one Kafka transaction, send their records, and a progress record (the rows' ids)
//!    to the shard's partition of the progress topic; commit it;
//! 3. delete the rows in the database transaction that claimed them; commit it.
//!
//! A crash between 2 and 3 leaves published rows in the table. Whoever takes the shard next
//! (this relay restarted, or another) first creates the shard's producer, which fences the
//! old one (its open transaction is aborted, and it can commit nothing more), then reads the
//! shard's last committed progress record with read_committed and deletes the rows it names
//! without publishing them again. Only then does it claim. So a row is published at most
//! once (its ids are in the same Kafka transaction as its record), and at least once (it is
//! deleted only after that transaction committed). See docs/outbox.md.
//!
//! The parts, by role (this file holds the relay's state and its loop):
//!
//! * [`start`]: a relay's start: the table's layout read, the pipeline, the topics checked.
//! * [`table`]: the table's layout and the SQL run against it, pure.
//! * [`conn`]: the database connection, its notifications, the read of the table's columns.
//! * [`shard`]: taking shards, resolving one taken, a shard's round.
//! * [`batch`]: one batch: claimed, published in one Kafka transaction, deleted.
//! * [`row`]: a row as the record published, pure.
//! * [`progress`]: the progress records (pure) and the read back of a shard's last one.
//! * [`check`]: the table check of `onceflow validate --database`.

mod batch;
mod check;
mod conn;
mod progress;
mod row;
mod shard;
mod start;
mod table;

pub use check::check_outbox_table;
pub use table::LayoutError;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rdkafka::consumer::BaseConsumer;
use rdkafka::error::KafkaError;

use crate::instance::{Identity, RunOptions, Summary};
use crate::pg::PgError;
use crate::record::RecordError;
use crate::retry::{Backoff, Retries};
use crate::telemetry;
use crate::topology::{OutboxInput, Topology};
use crate::transform::Pipeline;
use crate::txn::{TxnError, TxnStats};

use conn::Conn;
use shard::Shard;
use table::Layout;

/// Waits between attempts when the database or Kafka fails: 100 ms doubling to 5 s.
const BACKOFF: Backoff = Backoff::capped(Duration::from_millis(100), Duration::from_secs(5));
/// How often free shards are looked for, and the age of the oldest row taken.
const HOUSEKEEPING_EVERY: Duration = Duration::from_secs(1);

/// Why a relay stops.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("outbox: {0}")]
    Database(#[from] PgError),
    #[error("{0}")]
    Layout(#[from] LayoutError),
    #[error("outbox: environment variable {0} (url_env) is not set")]
    MissingUrl(String),
    #[error("outbox: cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
    #[error("kafka client: {what}: {error}")]
    Client { what: String, error: KafkaError },
    #[error("outbox: progress topic {topic}: {message}")]
    ProgressTopic { topic: String, message: String },
    #[error(transparent)]
    Txn(#[from] TxnError),
    #[error("invalid topology: {0}")]
    Config(String),
    #[error("outbox row {id} failed and runtime.on_error is fail: {error}")]
    RowFailed { id: String, error: RecordError },
}

/// Runs the relay of `topology` until `shutdown` is set, `options` say stop, or a fatal error.
pub fn run(
    topology: &Topology,
    identity: &Identity,
    options: &RunOptions,
    shutdown: &AtomicBool,
) -> Result<Summary, RelayError> {
    let started = Instant::now();
    let _span = tracing::info_span!("relay", topology = %topology.name).entered();
    let mut relay = Relay::new(topology, identity, options)?;
    let result = relay.run_loop(shutdown);
    relay.release_all();
    result?;
    Ok(Summary {
        txn: relay.stats.clone(),
        skipped: relay.skipped,
        elapsed: started.elapsed(),
        busy: relay.first_row.map_or(Duration::ZERO, |t| t.elapsed()),
    })
}

/// A relay at work: what it was started with, its connection, the shards it holds, and
/// what it has done.
struct Relay<'t> {
    topology: &'t Topology,
    identity: &'t Identity,
    options: &'t RunOptions,
    config: &'t OutboxInput,
    layout: Layout,
    pg: tokio_postgres::Config,
    tls: Option<postgres_openssl::MakeTlsConnector>,
    runtime: tokio::runtime::Runtime,
    conn: Option<Conn>,
    shards: BTreeMap<u32, Shard>,
    pipeline: Option<Pipeline>,
    /// The topic of each output, by the pipeline's output index.
    topics: Vec<String>,
    progress_topic: String,
    dead_letter_topic: String,
    /// Reads progress records and topic metadata; made again after a Kafka failure.
    reader: BaseConsumer,
    /// The cluster the relay's clients connect to.
    cluster: crate::kafka::Cluster,
    /// Default routes' topics: whether each exists.
    known_topics: HashMap<String, (bool, Instant)>,
    timeout: Duration,
    stats: TxnStats,
    skipped: u64,
    first_row: Option<Instant>,
    next_housekeeping: Instant,
    next_count: Instant,
    retries: Retries,
}

impl Relay<'_> {
    fn run_loop(&mut self, shutdown: &AtomicBool) -> Result<(), RelayError> {
        loop {
            if shutdown.load(Ordering::Relaxed) {
                telemetry::shutting_down();
                return Ok(());
            }
            if self
                .options
                .stop_after_records
                .is_some_and(|n| self.stats.records_committed >= n)
            {
                return Ok(());
            }
            self.options.health.progressed();
            if self.conn.is_none()
                && let Err(e) = self.connect()
            {
                self.wait_after(&e.to_string());
                continue;
            }
            if Instant::now() >= self.next_housekeeping {
                self.next_housekeeping = Instant::now() + HOUSEKEEPING_EVERY;
                if let Err(e) = self.housekeeping() {
                    self.lost_connection(&e);
                    continue;
                }
            }
            let mut rows = 0;
            let owned: Vec<u32> = self.shards.keys().copied().collect();
            for shard in owned {
                match self.round(shard) {
                    Ok(n) => rows += n,
                    Err(Failed::Database(e)) => {
                        self.lost_connection(&e);
                        break;
                    }
                    Err(Failed::Kafka(e)) => {
                        self.kafka_failed(shard, &e);
                    }
                    Err(Failed::Fatal(e)) => return Err(e),
                }
            }
            if rows == 0 {
                self.wait_for_rows(shutdown);
            } else {
                self.retries = BACKOFF.retries();
            }
        }
    }

    /// The connection failed: with it go the session's shard locks, so every shard is given
    /// up (its publisher dropped: whoever takes it next fences it and resolves it).
    fn lost_connection(&mut self, e: &PgError) {
        telemetry::relay_connection_lost(&self.config.table, self.shards.len(), e);
        self.shards.clear();
        self.conn = None;
        self.wait_after(&e.to_string());
    }

    /// A Kafka call failed: the shard's transaction is aborted and its producer dropped; the
    /// next round resolves the shard again (a new producer, the progress read back).
    fn kafka_failed(&mut self, shard: u32, e: &str) {
        telemetry::relay_kafka_failed(&self.config.table, shard, e);
        if let Some(s) = self.shards.get_mut(&shard) {
            s.publisher = None;
        }
        // The progress reader is made again too: a client that went through an outage may
        // hold on to its errors and dead connections (a relay kept failing on
        // `AllBrokersDown` for minutes after the broker was back).
        match start::progress_reader(&self.cluster, &self.topology.name) {
            Ok(reader) => self.reader = reader,
            Err(made) => {
                telemetry::relay_kafka_failed(&self.config.table, shard, &made.to_string())
            }
        }
        self.wait_after(e);
    }

    fn wait_after(&mut self, why: &str) {
        let delay = self
            .retries
            .next_delay(Instant::now() + Duration::from_secs(3600))
            .unwrap_or(BACKOFF.max);
        telemetry::relay_retry(self.retries.attempt(), delay, why);
        std::thread::sleep(delay);
    }

    /// Gives every shard back (closing the connection ends its locks).
    fn release_all(&mut self) {
        self.shards.clear();
        self.conn = None;
    }
}

/// How a round failed.
enum Failed {
    /// The database: the connection (and its shard locks) is given up.
    Database(PgError),
    /// Kafka: the shard is resolved again.
    Kafka(String),
    /// The relay cannot go on.
    Fatal(RelayError),
}

fn db(e: tokio_postgres::Error) -> Failed {
    Failed::Database(e.into())
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
