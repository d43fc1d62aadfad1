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
//! deleted only after that transaction committed). See the README's outbox section.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tokio_postgres::{AsyncMessage, Client, Statement};

use crate::dlq::format::{Failure, dead_letter};
use crate::instance::{Identity, RunOptions, Summary};
use crate::kafka::admin::Admin;
use crate::kafka::{Cluster, clients};
use crate::pg::{PgError as PostgresError, client_config};
use crate::record::{ErrorKind, Record, RecordError, Stage};
use crate::retry::{Backoff, Retries};
use crate::source::outbox::{self, COLUMNS_SQL, Column, Layout, Progress, Row};
use crate::telemetry;
use crate::topology::{OnError, OutboxInput, Target, Topology};
use crate::transform::Pipeline;
use crate::txn::{Publisher, TxnError, TxnStats};

/// Waits between attempts when the database or Kafka fails: 100 ms doubling to 5 s.
const BACKOFF: Backoff = Backoff::capped(Duration::from_millis(100), Duration::from_secs(5));
/// How often free shards are looked for, and the age of the oldest row taken.
const HOUSEKEEPING_EVERY: Duration = Duration::from_secs(1);
/// How long a topic found missing is taken as missing before it is looked up again.
const MISSING_TOPIC_RECHECK: Duration = Duration::from_secs(10);
/// How often the rows waiting are counted: a count scans the table, and during a backlog of
/// 100,000 rows of 1 KB a count every second took a third of the relay's throughput.
const COUNT_EVERY: Duration = Duration::from_secs(10);

/// Why a relay stops.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("outbox: {0}")]
    Database(#[from] PostgresError),
    #[error("{0}")]
    Layout(#[from] outbox::LayoutError),
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

/// Connects with the URL of `config.url_env` and checks the outbox table: it exists and has
/// the columns the relay is told to use (what `onceflow validate --database` reports).
pub fn check_table(topology: &str, config: &OutboxInput) -> Result<(), RelayError> {
    let url = std::env::var(&config.url_env)
        .map_err(|_| RelayError::MissingUrl(config.url_env.clone()))?;
    let (pg, tls) = client_config(
        &url,
        &config.url_env,
        &format!("onceflow/{topology}/validate"),
    )?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(RelayError::Runtime)?;
    runtime.block_on(inspect(&pg, &tls, config))??;
    Ok(())
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

/// A shard this relay holds.
struct Shard {
    /// `None` until the shard is resolved (after it is taken, or after a Kafka failure).
    publisher: Option<Publisher>,
    /// Ids published and committed in Kafka whose delete has not committed yet.
    undeleted: Vec<String>,
}

/// The database connection and what is prepared on it.
struct Conn {
    client: Client,
    task: tokio::task::JoinHandle<()>,
    /// A message per `NOTIFY` on the notify channel.
    notified: tokio::sync::mpsc::UnboundedReceiver<()>,
    claim: Statement,
    delete: Statement,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

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
    /// Reads progress records and topic metadata.
    reader: BaseConsumer,
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

impl<'t> Relay<'t> {
    fn new(
        topology: &'t Topology,
        identity: &'t Identity,
        options: &'t RunOptions,
    ) -> Result<Relay<'t>, RelayError> {
        let config = topology.outbox().ok_or_else(|| {
            RelayError::Config("the topology has no postgres_outbox input".into())
        })?;
        let url = std::env::var(&config.url_env)
            .map_err(|_| RelayError::MissingUrl(config.url_env.clone()))?;
        let (pg, tls) = client_config(
            &url,
            &config.url_env,
            &format!("onceflow/{}/relay/{}", topology.name, identity.instance_id),
        )?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(RelayError::Runtime)?;
        let timeout = Duration::from_millis(topology.runtime.transaction_timeout_ms);
        let layout = runtime.block_on(inspect(&pg, &tls, config))??;
        let pipeline = if topology.outputs.is_empty() {
            None
        } else {
            let codecs = crate::codec::Codecs::connect(topology)
                .map_err(|e| RelayError::Config(e.to_string()))?;
            Some(Pipeline::compile_with(topology, codecs).map_err(|issues| {
                RelayError::Config(
                    issues
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join("; "),
                )
            })?)
        };
        let topics = topology
            .outputs
            .iter()
            .map(|o| match o.target() {
                Some(Target::Topic(t)) => Ok(t.to_string()),
                _ => Err(RelayError::Config(format!(
                    "output `{}`: a relay writes Kafka topics only",
                    o.name()
                ))),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let cluster = cluster(topology, identity);
        let reader: BaseConsumer = cluster
            .config()
            .set(
                "group.id",
                format!("onceflow.{}.outbox-reader", topology.name),
            )
            .set("isolation.level", "read_committed")
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "false")
            .create()
            .map_err(|error| RelayError::Client {
                what: "cannot create the progress reader".into(),
                error,
            })?;
        let relay = Relay {
            topology,
            identity,
            options,
            config,
            layout,
            pg,
            tls,
            runtime,
            conn: None,
            shards: BTreeMap::new(),
            pipeline,
            topics,
            progress_topic: config.progress_topic(&topology.name),
            dead_letter_topic: topology.dead_letter_topic(),
            reader,
            known_topics: HashMap::new(),
            timeout,
            stats: TxnStats::default(),
            skipped: 0,
            first_row: None,
            next_housekeeping: Instant::now(),
            next_count: Instant::now(),
            retries: BACKOFF.retries(),
        };
        relay.check_topics(&cluster)?;
        options
            .health
            .set_bound(timeout + Duration::from_millis(config.poll_interval_ms));
        options
            .health
            .set_call_bound(crate::instance::call_bound(topology));
        telemetry::relay_started(
            &topology.name,
            &identity.instance_id,
            &config.table,
            config.shards,
            &relay.progress_topic,
        );
        Ok(relay)
    }

    /// The output topics and the dead-letter topic must exist; the progress topic is created
    /// (compacted, a partition per shard) when it does not.
    fn check_topics(&self, cluster: &Cluster) -> Result<(), RelayError> {
        let mut needed: Vec<&str> = self.topics.iter().map(String::as_str).collect();
        needed.push(&self.dead_letter_topic);
        for topic in needed {
            match self.partitions(topic)? {
                Some(_) => {}
                None => {
                    return Err(RelayError::Config(format!(
                        "topic `{topic}` does not exist: create it first"
                    )));
                }
            }
        }
        let progress = &self.progress_topic;
        let fail = |message: String| RelayError::ProgressTopic {
            topic: progress.clone(),
            message,
        };
        match self.partitions(progress)? {
            Some(n) if n < self.config.shards as usize => Err(fail(format!(
                "has {n} partitions, the outbox has {} shards (one partition each): add partitions",
                self.config.shards
            ))),
            Some(_) => Ok(()),
            None => {
                let admin = Admin::new(cluster).map_err(|e| fail(e.to_string()))?;
                admin
                    .create_compacted_topic(progress, self.config.shards as i32)
                    .map_err(|e| fail(e.to_string()))?;
                telemetry::progress_topic_created(progress, self.config.shards);
                Ok(())
            }
        }
    }

    /// The partition count of a topic, `None` when it does not exist.
    fn partitions(&self, topic: &str) -> Result<Option<usize>, RelayError> {
        let metadata = self
            .reader
            .fetch_metadata(Some(topic), self.timeout)
            .map_err(|error| RelayError::Client {
                what: format!("cannot read metadata of {topic}"),
                error,
            })?;
        Ok(metadata
            .topics()
            .iter()
            .find(|t| t.name() == topic && t.error().is_none() && !t.partitions().is_empty())
            .map(|t| t.partitions().len()))
    }

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

    /// Connects, listens on the notify channel, prepares the statements.
    fn connect(&mut self) -> Result<(), PostgresError> {
        // The timer is made inside block_on: it needs the runtime's reactor.
        let conn = self.runtime.block_on(async {
            tokio::time::timeout(
                Duration::from_secs(30),
                connect(&self.pg, &self.tls, &self.layout, self.config),
            )
            .await
        });
        let conn = conn.map_err(|_| PostgresError::Timeout(Duration::from_secs(30)))??;
        telemetry::relay_connected(&self.config.table);
        self.conn = Some(conn);
        self.next_housekeeping = Instant::now();
        Ok(())
    }

    /// Takes free shards (up to `max_shards`), takes the age of the oldest row and, now and
    /// then, counts the rows waiting.
    fn housekeeping(&mut self) -> Result<(), PostgresError> {
        let Some(conn) = &self.conn else {
            return Ok(());
        };
        let client = &conn.client;
        let max = self.config.max_shards() as usize;
        let layout = &self.layout;
        let free: Vec<u32> = (0..self.config.shards)
            .filter(|s| !self.shards.contains_key(s))
            .collect();
        let mut taken = Vec::new();
        let count = Instant::now() >= self.next_count;
        if count {
            self.next_count = Instant::now() + COUNT_EVERY;
        }
        let pending = self.runtime.block_on(async {
            for shard in free {
                if self.shards.len() + taken.len() >= max {
                    break;
                }
                let (k1, k2) = layout.lock_keys(shard);
                let row = client
                    .query_one(
                        "SELECT pg_try_advisory_lock($1::int4, $2::int4)",
                        &[&k1, &k2],
                    )
                    .await?;
                if row.get::<_, bool>(0) {
                    taken.push(shard);
                }
            }
            let rows = match count {
                true => Some(client.query_one(&layout.count_sql(), &[]).await?.get(0)),
                false => None,
            };
            let oldest = match layout.oldest_sql() {
                Some(sql) => Some(
                    client
                        .query_opt(&sql, &[])
                        .await?
                        .map_or(0, |r| r.get::<_, i64>(0)),
                ),
                None => None,
            };
            Ok::<_, PostgresError>((rows, oldest))
        })?;
        for shard in taken {
            telemetry::shard_taken(&self.config.table, shard);
            self.shards.insert(
                shard,
                Shard {
                    publisher: None,
                    undeleted: Vec::new(),
                },
            );
        }
        telemetry::outbox_pending(&self.config.table, pending.0, pending.1, self.shards.len());
        Ok(())
    }

    /// One round of a shard: resolves it first when needed, then publishes a batch. Returns
    /// the rows published.
    fn round(&mut self, shard: u32) -> Result<usize, Failed> {
        let needs_resolving = self
            .shards
            .get(&shard)
            .is_some_and(|s| s.publisher.is_none());
        if needs_resolving {
            self.resolve(shard)?;
        }
        let undeleted = self
            .shards
            .get_mut(&shard)
            .map(|s| std::mem::take(&mut s.undeleted))
            .unwrap_or_default();
        if !undeleted.is_empty() {
            self.delete(shard, undeleted)?;
        }
        self.publish_batch(shard)
    }

    /// Makes the shard's producer (fencing whoever held the shard before) and deletes the
    /// rows its last committed progress record names: published, not yet deleted.
    fn resolve(&mut self, shard: u32) -> Result<(), Failed> {
        let mut config = self.producer_config();
        config.set(
            "transactional.id",
            outbox::transactional_id(&self.topology.name, &self.config.table, shard),
        );
        let publisher = Publisher::new(config, self.timeout, self.options.health.clone()).map_err(
            |e| match e {
                TxnError::CreateProducer { .. } => Failed::Fatal(e.into()),
                other => Failed::Kafka(other.to_string()),
            },
        )?;
        let published = self
            .last_progress(shard)
            .map_err(|e| Failed::Kafka(e.to_string()))?;
        if let Some(progress) = published {
            let ids = progress.ids;
            let n = self.delete(shard, ids)?;
            telemetry::outbox_resolved(&self.config.table, shard, n, &progress.relay);
        }
        if let Some(s) = self.shards.get_mut(&shard) {
            s.publisher = Some(publisher);
        }
        Ok(())
    }

    /// Deletes rows by id, in a transaction of its own; returns how many were there.
    fn delete(&mut self, shard: u32, ids: Vec<String>) -> Result<u64, Failed> {
        let Some(conn) = &self.conn else {
            return Err(Failed::Database(PostgresError::Timeout(Duration::ZERO)));
        };
        let result = self
            .runtime
            .block_on(conn.client.execute(&conn.delete, &[&ids]));
        match result {
            Ok(n) => Ok(n),
            Err(e) => {
                // Kept: the next round of the shard deletes them first.
                if let Some(s) = self.shards.get_mut(&shard) {
                    s.undeleted = ids;
                }
                Err(Failed::Database(e.into()))
            }
        }
    }

    /// The shard's last committed progress record, read with read_committed from the end of
    /// its partition backwards (a window of records, widened until one is found).
    fn last_progress(&self, shard: u32) -> Result<Option<Progress>, KafkaError> {
        let topic = &self.progress_topic;
        let partition = shard as i32;
        let (low, high) = self
            .reader
            .fetch_watermarks(topic, partition, self.timeout)?;
        let mut window = 64i64;
        let mut end = high;
        loop {
            let start = (end - window).max(low);
            if start >= end {
                return Ok(None);
            }
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition_offset(topic, partition, Offset::Offset(start))?;
            self.reader.assign(&tpl)?;
            let deadline = Instant::now() + self.timeout;
            let mut last = None;
            loop {
                // The end may be a transaction marker, never delivered: the position tells
                // when it is passed.
                let position = self.reader.position()?;
                let passed = position.elements().iter().any(|e| {
                    e.partition() == partition
                        && matches!(e.offset(), Offset::Offset(o) if o >= end)
                });
                if passed {
                    break;
                }
                match self.reader.poll(Duration::from_millis(50)) {
                    Some(Ok(msg)) => {
                        if msg.offset() >= end {
                            break;
                        }
                        if let Some(p) =
                            Progress::decode(msg.key(), msg.payload(), &self.config.table, shard)
                        {
                            last = Some(p);
                        }
                    }
                    Some(Err(e)) => return Err(e),
                    None if Instant::now() > deadline => {
                        return Err(KafkaError::Flush(
                            rdkafka::types::RDKafkaErrorCode::OperationTimedOut,
                        ));
                    }
                    None => {}
                }
            }
            self.reader.unassign()?;
            if last.is_some() || start == low {
                return Ok(last);
            }
            end = start;
            window *= 4;
        }
    }

    /// Claims a batch of the shard, publishes it in one Kafka transaction with its progress
    /// record, then deletes it in the claiming database transaction.
    fn publish_batch(&mut self, shard: u32) -> Result<usize, Failed> {
        let Relay {
            runtime,
            conn,
            shards,
            config,
            layout,
            ..
        } = self;
        let Some(conn) = conn.as_mut() else {
            return Ok(0);
        };
        let Some(publisher) = shards.get_mut(&shard).and_then(|s| s.publisher.as_mut()) else {
            return Ok(0);
        };
        let limit = config.batch_size as i64;
        let shards_n = layout.shards as i32;
        let shard_i = shard as i32;
        let claim = conn.claim.clone();
        let delete = conn.delete.clone();
        // A closure over the parts of the relay a batch needs, run inside the database
        // transaction; the Kafka calls in it block, as everywhere in the job.
        let relay_parts = RowPublisher {
            topology: self.topology,
            identity: self.identity,
            pipeline: self.pipeline.as_ref(),
            topics: &self.topics,
            reader: &self.reader,
            known_topics: &mut self.known_topics,
            dead_letter_topic: &self.dead_letter_topic,
            progress_topic: &self.progress_topic,
            timeout: self.timeout,
            skipped: &mut self.skipped,
        };
        let exit_after = self.options.exit_after_kafka_commit;
        let stats = &mut self.stats;
        let first_row = &mut self.first_row;
        let table = config.table.clone();
        let mut undeleted: Option<Vec<String>> = None;
        let left = &mut undeleted;
        let result = runtime.block_on(async move {
            let claim_started = Instant::now();
            let tx = conn.client.transaction().await.map_err(db)?;
            let rows = tx
                .query(&claim, &[&shards_n, &shard_i, &limit])
                .await
                .map_err(db)?;
            if rows.is_empty() {
                return Ok(0);
            }
            first_row.get_or_insert_with(Instant::now);
            let rows: Vec<Row> = rows
                .iter()
                .map(|r| Row {
                    id: r.get(0),
                    aggregatetype: r.get(1),
                    aggregateid: r.get(2),
                    event_type: r.get(3),
                    payload: r.get(4),
                    headers: r.get(5),
                    created_ms: r.get(6),
                })
                .collect();
            let started = Instant::now();
            let claimed = started - claim_started;
            let mut parts = relay_parts;
            let outputs = match parts.send_all(publisher, &table, shard, &rows) {
                Ok(n) => n,
                Err(e) => {
                    publisher.abort(&KafkaError::Canceled);
                    return Err(e);
                }
            };
            let sending = started.elapsed();
            let ids: Vec<String> = rows.iter().map(|r| r.id.clone()).collect();
            let progress = Progress {
                table: table.clone(),
                shard,
                ids,
                relay: parts.identity.instance_id.clone(),
                at_ms: now_ms(),
            };
            let sent = publisher
                .send_to(
                    parts.progress_topic,
                    shard as i32,
                    Progress::key(&table, shard).as_bytes(),
                    &progress.encode(),
                )
                .and_then(|()| publisher.commit());
            if let Err(e) = sent {
                publisher.abort(&e);
                return Err(Failed::Kafka(e.to_string()));
            }
            let took = started.elapsed();
            let committed_ms = now_ms();
            telemetry::txn_committed(rows.len() as u64, outputs, took);
            telemetry::outbox_published(
                &table,
                rows.len() as u64,
                rows.iter()
                    .filter_map(|r| r.created_ms)
                    .map(|c| Duration::from_millis((committed_ms - c).max(0) as u64)),
            );
            stats.committed += 1;
            stats.records_committed += rows.len() as u64;
            stats.outputs_committed += outputs;
            stats.commit_durations.record(took);
            if exit_after == Some(stats.committed) {
                telemetry::failpoint_exit_after_kafka_commit(stats.committed);
                std::process::abort();
            }
            // Published: now the rows go, with the locks the claim took.
            let result = async {
                tx.execute(&delete, &[&progress.ids]).await?;
                tx.commit().await
            }
            .await;
            match result {
                Ok(()) => {
                    telemetry::outbox_batch_timing(
                        &table,
                        shard,
                        rows.len(),
                        [claimed, sending, took - sending, started.elapsed() - took],
                    );
                    Ok(rows.len())
                }
                Err(e) => {
                    *left = Some(progress.ids);
                    Err(db(e))
                }
            }
        });
        if let (Some(ids), Some(s)) = (undeleted, shards.get_mut(&shard)) {
            // Kept: the next round of the shard deletes them first.
            s.undeleted = ids;
        }
        result
    }

    fn producer_config(&self) -> ClientConfig {
        let mut c = clients::producer_config(self.topology, self.identity);
        c.set(
            "transaction.timeout.ms",
            self.topology.runtime.transaction_timeout_ms.to_string(),
        );
        c
    }

    /// The connection failed: with it go the session's shard locks, so every shard is given
    /// up (its publisher dropped: whoever takes it next fences it and resolves it).
    fn lost_connection(&mut self, e: &PostgresError) {
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

    /// Nothing to publish: waits for a notification, the poll interval, or a stop.
    fn wait_for_rows(&mut self, shutdown: &AtomicBool) {
        let until = Instant::now() + Duration::from_millis(self.config.poll_interval_ms);
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        self.runtime.block_on(async {
            while Instant::now() < until && !shutdown.load(Ordering::Relaxed) {
                let slice = until
                    .saturating_duration_since(Instant::now())
                    .min(Duration::from_millis(100));
                if let Ok(Some(())) = tokio::time::timeout(slice, conn.notified.recv()).await {
                    while conn.notified.try_recv().is_ok() {}
                    return;
                }
            }
        });
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
    Database(PostgresError),
    /// Kafka: the shard is resolved again.
    Kafka(String),
    /// The relay cannot go on.
    Fatal(RelayError),
}

fn db(e: tokio_postgres::Error) -> Failed {
    Failed::Database(e.into())
}

/// Where a row's records go.
enum Routed {
    /// The row's record itself, to this topic.
    As(String),
    /// The records the pipeline made, in `out`.
    Produced,
}

/// What sending a batch's records needs.
struct RowPublisher<'a> {
    topology: &'a Topology,
    identity: &'a Identity,
    pipeline: Option<&'a Pipeline>,
    topics: &'a [String],
    reader: &'a BaseConsumer,
    known_topics: &'a mut HashMap<String, (bool, Instant)>,
    dead_letter_topic: &'a str,
    progress_topic: &'a str,
    timeout: Duration,
    skipped: &'a mut u64,
}

impl RowPublisher<'_> {
    /// Sends the records of every row (or its dead-letter record); returns how many records
    /// were sent.
    fn send_all(
        &mut self,
        publisher: &mut Publisher,
        table: &str,
        shard: u32,
        rows: &[Row],
    ) -> Result<u64, Failed> {
        let kafka = |e: KafkaError| Failed::Kafka(e.to_string());
        let mut sent = 0;
        let mut produced = Vec::new();
        for row in rows {
            let (record, bad_headers) = row.to_record(table, shard);
            let outcome = match bad_headers {
                Some(e) => Err(RecordError {
                    kind: ErrorKind::BadJson,
                    stage: Stage::Decode,
                    message: e.to_string(),
                }),
                None => self.route(&record, row, &mut produced).map_err(kafka)?,
            };
            match outcome {
                Ok(Routed::As(topic)) => {
                    publisher.send(&topic, &record).map_err(kafka)?;
                    sent += 1;
                }
                Ok(Routed::Produced) => {
                    for (topic, rec) in produced.drain(..) {
                        publisher.send(&topic, &rec).map_err(kafka)?;
                        sent += 1;
                    }
                }
                Err(error) => match self.topology.runtime.on_error {
                    OnError::DeadLetter => {
                        telemetry::outbox_row_failed(table, &row.id, &error);
                        let failure = Failure {
                            kind: error.kind.name().to_string(),
                            message: error.message.clone(),
                            stage: error.stage.to_string(),
                            attempts: 1,
                        };
                        let mut dead = dead_letter(
                            &record,
                            &failure,
                            &self.topology.name,
                            &self.identity.instance_id,
                            now_ms(),
                        );
                        dead.headers
                            .push((crate::dlq::H_ID.into(), row.id.clone().into_bytes()));
                        publisher
                            .send(self.dead_letter_topic, &dead)
                            .map_err(kafka)?;
                        telemetry::dead_lettered(error.kind.name());
                        sent += 1;
                    }
                    OnError::Skip => {
                        telemetry::outbox_row_failed(table, &row.id, &error);
                        *self.skipped += 1;
                    }
                    OnError::Fail => {
                        return Err(Failed::Fatal(RelayError::RowFailed {
                            id: row.id.clone(),
                            error,
                        }));
                    }
                },
            }
        }
        Ok(sent)
    }

    /// The records a row makes, with their topics: through the pipeline to the outputs, or
    /// (without outputs) the row's record as it is to `<topic_prefix><aggregatetype>`. The
    /// outer error is Kafka's (the metadata of a topic could not be read).
    fn route(
        &mut self,
        record: &Record,
        row: &Row,
        out: &mut Vec<(String, Record)>,
    ) -> Result<Result<Routed, RecordError>, KafkaError> {
        let Some(pipeline) = self.pipeline else {
            let prefix = self
                .topology
                .outbox()
                .map_or("outbox.event.", |o| o.topic_prefix.as_str());
            let topic = outbox::default_topic(prefix, &row.aggregatetype);
            if !self.topic_exists(&topic)? {
                return Ok(Err(RecordError {
                    kind: ErrorKind::Unroutable,
                    stage: Stage::Output {
                        index: 0,
                        name: topic.clone(),
                    },
                    message: format!(
                        "topic `{topic}` (topic_prefix and aggregate type `{}`) does not exist",
                        row.aggregatetype
                    ),
                }));
            }
            return Ok(Ok(Routed::As(topic)));
        };
        let mut produced = Vec::new();
        // The record stays at hand for a dead-letter copy of the original.
        if let Err(e) = pipeline.process(record.clone(), &mut produced) {
            return Ok(Err(e));
        }
        for (index, mut rec) in produced {
            if let Some(topic) = self.topics.get(index) {
                // The row is the origin: the table, the shard, the row id (its event id).
                if self.topology.outputs.get(index).is_none_or(|o| o.lineage) {
                    crate::lineage::stamp(&mut rec, &record.origin, Some(row.id.as_bytes()));
                }
                out.push((topic.clone(), rec));
            }
        }
        Ok(Ok(Routed::Produced))
    }

    /// Whether `topic` exists. A topic found is remembered; a missing one is looked up again
    /// after [`MISSING_TOPIC_RECHECK`] (it may be created meanwhile). Metadata that cannot be
    /// read is an error: the batch is tried again, no row is dead-lettered for it.
    fn topic_exists(&mut self, topic: &str) -> Result<bool, KafkaError> {
        if let Some((exists, at)) = self.known_topics.get(topic)
            && (*exists || at.elapsed() < MISSING_TOPIC_RECHECK)
        {
            return Ok(*exists);
        }
        let metadata = self.reader.fetch_metadata(Some(topic), self.timeout)?;
        let exists = match metadata.topics().iter().find(|t| t.name() == topic) {
            Some(t) => match t.error() {
                None => !t.partitions().is_empty(),
                Some(code) => match RDKafkaErrorCode::from(code) {
                    RDKafkaErrorCode::UnknownTopicOrPartition | RDKafkaErrorCode::UnknownTopic => {
                        false
                    }
                    other => return Err(KafkaError::MetadataFetch(other)),
                },
            },
            None => false,
        };
        self.known_topics
            .insert(topic.to_string(), (exists, Instant::now()));
        Ok(exists)
    }
}

/// The cluster of the relay's clients.
fn cluster(topology: &Topology, identity: &Identity) -> Cluster {
    let mut cluster = Cluster::new(&identity.bootstrap_servers);
    cluster.settings = topology
        .kafka
        .common
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    cluster
}

/// Reads the outbox table's columns and checks them.
async fn inspect(
    pg: &tokio_postgres::Config,
    tls: &Option<postgres_openssl::MakeTlsConnector>,
    config: &OutboxInput,
) -> Result<Result<Layout, outbox::LayoutError>, RelayError> {
    let limit = Duration::from_secs(30);
    let (client, task) = tokio::time::timeout(limit, crate::pg::open(pg, tls))
        .await
        .map_err(|_| PostgresError::Timeout(Duration::from_secs(30)))??;
    let rows = client
        .query(COLUMNS_SQL, &[&config.table])
        .await
        .map_err(PostgresError::from)?;
    task.abort();
    let columns: Vec<Column> = rows
        .iter()
        .map(|r| Column {
            name: r.get(0),
            type_name: r.get(1),
        })
        .collect();
    Ok(Layout::check(config, &columns))
}

/// A connection whose notifications reach `notified`, listening on the notify channel, with
/// the relay's statements prepared.
async fn connect(
    pg: &tokio_postgres::Config,
    tls: &Option<postgres_openssl::MakeTlsConnector>,
    layout: &Layout,
    config: &OutboxInput,
) -> Result<Conn, PostgresError> {
    let (tx, notified) = tokio::sync::mpsc::unbounded_channel();
    let (client, task) = match tls {
        None => {
            let (client, connection) = pg.connect(tokio_postgres::NoTls).await?;
            (client, tokio::spawn(drive(connection, tx)))
        }
        Some(tls) => {
            let (client, connection) = pg.connect(tls.clone()).await?;
            (client, tokio::spawn(drive(connection, tx)))
        }
    };
    if let Some(channel) = &config.notify_channel {
        // Validated as a plain identifier.
        client.batch_execute(&format!("LISTEN {channel}")).await?;
    }
    let claim = client.prepare(&layout.claim_sql()).await?;
    let delete = client.prepare(&layout.delete_sql()).await?;
    Ok(Conn {
        client,
        task,
        notified,
        claim,
        delete,
    })
}

/// Drives a connection, passing its notifications on.
async fn drive<S, T>(
    mut connection: tokio_postgres::Connection<S, T>,
    tx: tokio::sync::mpsc::UnboundedSender<()>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    loop {
        match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            Some(Ok(AsyncMessage::Notification(_))) => {
                let _ = tx.send(());
            }
            Some(Ok(_)) => {}
            Some(Err(_)) | None => return,
        }
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
