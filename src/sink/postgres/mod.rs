//! The PostgreSQL sink: upsert by id, effect-once through an inbox table, with version
//! arbitration.
//!
//! Records are staged as JSON rows ([`batch`]); a flush applies the whole batch with one
//! statement ([`sql::apply_batch`]) in one database transaction: inbox insert (`ON CONFLICT DO
//! NOTHING RETURNING`, so messages applied before are dropped), one row per id, deletions and
//! upserts guarded by versions. The transaction owner flushes right before the Kafka
//! transaction commits, so a crash in between replays a batch the inbox absorbs.
//!
//! The engine's loop is a blocking thread: the sink owns a small current-thread tokio runtime
//! and calls `block_on` on it; nothing here ever runs on another executor's worker.

mod batch;
pub mod error;
pub mod gaps;
mod sql;

use std::time::{Duration, Instant};

use postgres_openssl::MakeTlsConnector;
use tokio_postgres::{Client, Statement};

use batch::Staged;
pub use error::PostgresError;

use super::{SinkError, SinkErrorKind};
pub use crate::pg::RecordError;
use crate::pg::{self, AbortOnDrop, Mapping, client_config, ensure_origins, ensure_tables, open};
use crate::record::{Origin, Record};
use crate::retry::Retries;
use crate::telemetry;
use crate::topology::postgres::{OnSequenceGap, PostgresOutput};

/// How long the job keeps trying to reach the database when it starts.
const STARTUP_RETRY: Duration = Duration::from_secs(30);
/// Expired inbox rows are removed this many at a time.
const CLEANUP_BATCH: i32 = 1000;
/// After a batch met messages applied before, this many batches use the careful statement
/// (`ON CONFLICT DO NOTHING`) before the optimistic one is tried again: replays come in runs.
const CAREFUL_BATCHES: u32 = 16;

/// The server's own name for where a session is: its address and port (none over a local
/// socket) and the database.
const SERVER: &str = "SELECT coalesce(host(inet_server_addr()), 'local') || ':' || \
     coalesce(inet_server_port()::text, '') || '/' || current_database()";

/// How a batch's transaction begins: constraints declared deferrable are checked by each
/// statement, so that a refused row is found before COMMIT.
const BEGIN: &str = "BEGIN; SET CONSTRAINTS ALL IMMEDIATE";

/// What a committed batch did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Applied {
    /// Distinct messages in the batch.
    pub messages: u64,
    /// Messages the inbox had not seen: the others were applied before and are absorbed.
    pub fresh: u64,
    /// Rows inserted or updated (older versions are skipped).
    pub upserted: u64,
    /// Rows deleted.
    pub deleted: u64,
    /// Rows that follow missing sequences (with a sequence column).
    pub gaps: Vec<gaps::Gap>,
}

/// An open connection with its prepared batch statements.
struct Conn {
    client: Client,
    /// The careful form: the inbox insert absorbs messages applied before.
    apply: Statement,
    /// The optimistic form: fails when the batch holds a message applied before.
    optimistic: Statement,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One `postgres` output of a job.
pub struct PostgresSink {
    output: String,
    /// The inbox's consumer: `<topology>/<output>`.
    consumer: String,
    /// The target table, schema-qualified as found in the catalog.
    target: String,
    /// The server and database it is in, as the server names them (`address:port/database`).
    server: String,
    config: PostgresOutput,
    pg: tokio_postgres::Config,
    /// TLS for the connections; `None` with `sslmode=disable`.
    tls: Option<MakeTlsConnector>,
    mapping: Mapping,
    apply_sql: String,
    optimistic_sql: String,
    /// Batches left to apply with the careful statement.
    careful: u32,
    staged: Staged,
    runtime: tokio::runtime::Runtime,
    conn: Option<Conn>,
    next_cleanup: Instant,
    cleaning: bool,
    /// The staged batch is applied in a database transaction left open on `conn`, waiting
    /// for [`PostgresSink::commit`]: what it did, and when the flush began.
    applied: Option<(Applied, Instant)>,
}

impl PostgresSink {
    /// Connects with the URL from the environment variable named by `url_env`.
    pub fn connect(
        topology: &str,
        output: &str,
        config: &PostgresOutput,
    ) -> Result<PostgresSink, SinkError> {
        let url = std::env::var(&config.url_env).map_err(|_| {
            SinkError::new(
                output,
                None,
                PostgresError::MissingUrl(config.url_env.clone()),
            )
        })?;
        Self::connect_url(topology, output, config, &url)
    }

    /// Connects to `url`, checks the target table, creates the inbox if missing and prepares
    /// the batch statement. Retries for a while when the database is not reachable yet.
    pub fn connect_url(
        topology: &str,
        output: &str,
        config: &PostgresOutput,
        url: &str,
    ) -> Result<PostgresSink, SinkError> {
        let fail = |cause: PostgresError| SinkError::new(output, None, cause);
        let (pg, tls) = client_config(
            url,
            &config.url_env,
            &format!("onceflow/{topology}/{output}"),
        )
        .map_err(|e| fail(e.into()))?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| fail(PostgresError::Runtime(e)))?;
        let mut sink = PostgresSink {
            output: output.to_string(),
            consumer: format!("{topology}/{output}"),
            target: config.table.clone(),
            server: String::new(),
            config: config.clone(),
            pg,
            tls,
            mapping: Mapping::new(config),
            apply_sql: String::new(),
            optimistic_sql: String::new(),
            careful: 0,
            staged: Staged::default(),
            runtime,
            conn: None,
            next_cleanup: Instant::now(),
            cleaning: false,
            applied: None,
        };
        let deadline = Instant::now() + STARTUP_RETRY;
        let mut backoff = Retries::default();
        loop {
            match sink.prepare() {
                Ok(()) => break,
                Err(e) if e.kind() == SinkErrorKind::Transient => {
                    let Some(delay) = backoff.next_delay(deadline) else {
                        return Err(fail(e));
                    };
                    telemetry::sink_retry(output, "postgres_connect", backoff.attempt(), &e);
                    std::thread::sleep(delay);
                }
                Err(e) => return Err(fail(e)),
            }
        }
        telemetry::postgres_connected(output, &sink.target, &sink.config.inbox_table);
        Ok(sink)
    }

    /// Inspects the target table, creates the inbox and builds the batch statement.
    fn prepare(&mut self) -> Result<(), PostgresError> {
        let PostgresSink {
            runtime,
            pg,
            tls,
            config,
            ..
        } = self;
        let limit = Duration::from_secs(30);
        // The timer is made inside block_on: it needs the runtime's reactor.
        let inspected = runtime.block_on(async {
            tokio::time::timeout(limit, async {
                let (client, task) = open(pg, tls).await?;
                let _task = AbortOnDrop(Some(task));
                let (target, types) = inspect(&client, config).await?;
                let server: String = client.query_one(SERVER, &[]).await?.get(0);
                let markers = config.delete_when.is_some() && config.ordering_column().is_some();
                ensure_tables(&client, &config.inbox_table, markers).await?;
                ensure_origins(&client, &config.inbox_table).await?;
                Ok::<_, PostgresError>((target, types, server))
            })
            .await
        });
        let (target, types, server) = inspected.unwrap_or(Err(PostgresError::Timeout(limit)))?;
        self.server = server;
        self.apply_sql = sql::apply_batch(&self.config, &target, &types, false);
        self.optimistic_sql = sql::apply_batch(&self.config, &target, &types, true);
        self.mapping = Mapping::new(&self.config).with_types(&types);
        self.target = target;
        self.connection()?;
        Ok(())
    }

    /// Opens a connection (and prepares the batch statement) when there is none.
    fn connection(&mut self) -> Result<(), PostgresError> {
        if self.conn.as_ref().is_some_and(|c| c.client.is_closed()) {
            self.conn = None;
        }
        if self.conn.is_none() {
            let PostgresSink {
                runtime,
                pg,
                tls,
                apply_sql,
                optimistic_sql,
                ..
            } = self;
            let conn = runtime.block_on(async {
                tokio::time::timeout(Duration::from_secs(10), async {
                    let (client, task) = open(pg, tls).await?;
                    let task = AbortOnDrop(Some(task));
                    // The database commit must be durable before the Kafka commit, or a
                    // database crash in between would lose what Kafka counts as done.
                    let sync: String = client
                        .query_one("SHOW synchronous_commit", &[])
                        .await?
                        .get(0);
                    if sync == "off" {
                        client.batch_execute("SET synchronous_commit = on").await?;
                    }
                    let apply = client.prepare(apply_sql).await?;
                    let optimistic = client.prepare(optimistic_sql).await?;
                    Ok::<_, PostgresError>(Conn {
                        client,
                        apply,
                        optimistic,
                        task: task.disarm(),
                    })
                })
                .await
                .unwrap_or(Err(PostgresError::Timeout(Duration::from_secs(10))))
            })?;
            self.conn = Some(conn);
        }
        Ok(())
    }

    /// Stages a record. A record without a value writes nothing; one that cannot become a
    /// row is a permanent error naming it.
    pub fn stage(&mut self, record: &Record) -> Result<(), SinkError> {
        match self.staged.add(&self.mapping, record) {
            Ok(true) => Ok(()),
            Ok(false) => {
                telemetry::sink_record_skipped(&self.output, &record.origin);
                Ok(())
            }
            Err(e) => Err(SinkError::new(
                &self.output,
                Some(record.origin.clone()),
                PostgresError::from(e),
            )),
        }
    }

    /// The output's name in the topology.
    pub fn output(&self) -> &str {
        &self.output
    }

    /// The table written, as `address:port/database schema.table`: two outputs of a job must
    /// not write the same one.
    pub fn writes(&self) -> String {
        format!("{} {}", self.server, self.target)
    }

    /// Rows waiting for the flush.
    pub fn staged(&self) -> usize {
        self.staged.len()
    }

    pub fn is_full(&self) -> bool {
        self.staged.len() >= self.config.batch_size
    }

    /// Forgets the staged batch, rolling back its database transaction if it is open.
    pub fn discard(&mut self) {
        self.rollback();
        self.staged.clear();
    }

    pub fn discard_record(&mut self, origin: &Origin) {
        self.staged.remove(origin);
    }

    /// Applies and commits the staged batch in one database transaction ([`Self::apply`]
    /// then [`Self::commit`]). Returns whether a database transaction committed.
    pub fn flush(&mut self, deadline: Instant) -> Result<bool, SinkError> {
        self.apply(deadline)?;
        self.commit()
    }

    /// Applies the staged batch in a database transaction and leaves it open for
    /// [`Self::commit`] (or [`Self::discard`]), so that several outputs commit only once each
    /// has applied its batch. Transient errors are retried with backoff until `deadline`; a
    /// permanent one is traced to its record (row by row, nothing committed). Returns whether
    /// there was anything to apply.
    pub fn apply(&mut self, deadline: Instant) -> Result<bool, SinkError> {
        self.rollback();
        if self.staged.is_empty() {
            return Ok(false);
        }
        let started = Instant::now();
        let mut backoff = Retries::default();
        let applied = loop {
            match self.apply_once(deadline) {
                Ok(applied) => break applied,
                Err(e) => match e.kind() {
                    SinkErrorKind::Transient => {
                        let Some(delay) = backoff.next_delay(deadline) else {
                            return Err(SinkError::new(&self.output, None, e));
                        };
                        telemetry::sink_retry(
                            &self.output,
                            "postgres_flush",
                            backoff.attempt(),
                            &e,
                        );
                        std::thread::sleep(delay);
                    }
                    SinkErrorKind::Permanent => return Err(self.isolate(e)),
                    SinkErrorKind::Fatal => return Err(SinkError::new(&self.output, None, e)),
                },
            }
        };
        let policy = self.config.on_sequence_gap();
        if applied.gaps.is_empty() || policy == OnSequenceGap::Apply {
            self.applied = Some((applied, started));
            return Ok(true);
        }
        // The rows stay as they are: nothing of the batch commits.
        let gaps = applied.gaps.clone();
        self.applied = Some((applied, started));
        self.rollback();
        Err(self.refuse_gaps(gaps, policy))
    }

    /// The records behind the gaps of a batch, refused (the first in the error, the others in
    /// its `also`): one refusal per record, at its first gap.
    fn refuse_gaps(&self, gaps: Vec<gaps::Gap>, policy: OnSequenceGap) -> SinkError {
        let mut errors: Vec<SinkError> = Vec::new();
        for gap in gaps {
            let origin = self.staged.origin(gap.row);
            if !errors.iter().any(|e| e.origin.as_ref() == Some(origin)) {
                let cause = PostgresError::SequenceGap { gap, policy };
                errors.push(SinkError::new(&self.output, Some(origin.clone()), cause));
            }
        }
        let mut first = errors.remove(0);
        first.also = errors;
        first
    }

    /// Commits the batch [`Self::apply`] left open; returns whether there was one. A failure
    /// leaves the outcome unknown (the connection is dropped): the Kafka transaction must not
    /// commit, and the batch comes again, absorbed by the inbox if it did commit.
    pub fn commit(&mut self) -> Result<bool, SinkError> {
        let Some((applied, started)) = self.applied.take() else {
            return Ok(false);
        };
        let limit = Duration::from_secs(30);
        let result = match self.conn.as_ref() {
            // Not reached: a batch is applied on a connection, and only a failure drops it.
            None => Err(PostgresError::Timeout(Duration::ZERO)),
            Some(conn) => self.runtime.block_on(async {
                tokio::time::timeout(limit, conn.client.batch_execute("COMMIT"))
                    .await
                    .map_or(Err(PostgresError::Timeout(limit)), |r| {
                        r.map_err(PostgresError::from)
                    })
            }),
        };
        if let Err(e) = result {
            self.conn = None;
            return Err(SinkError::new(&self.output, None, e));
        }
        telemetry::postgres_batch_committed(&telemetry::BatchCommitted {
            output: &self.output,
            rows: self.staged.len() as u64,
            messages: applied.messages,
            fresh: applied.fresh,
            upserted: applied.upserted,
            deleted: applied.deleted,
            took: started.elapsed(),
        });
        if !applied.gaps.is_empty() {
            telemetry::sequence_gaps(
                &self.output,
                gaps::missing(&applied.gaps),
                applied.gaps.iter().map(|g| (g.id.as_str(), g.range())),
            );
        }
        self.staged.clear();
        self.clean_inbox();
        Ok(true)
    }

    /// Rolls back the batch [`Self::apply`] left open, if any (a connection that cannot is
    /// dropped, which rolls back too).
    fn rollback(&mut self) {
        if self.applied.take().is_none() {
            return;
        }
        let rolled_back = self.conn.as_ref().is_some_and(|conn| {
            self.runtime.block_on(async {
                tokio::time::timeout(
                    Duration::from_secs(5),
                    conn.client.batch_execute("ROLLBACK"),
                )
                .await
                .is_ok_and(|r| r.is_ok())
            })
        });
        if !rolled_back {
            self.conn = None;
        }
    }

    /// One attempt at the batch, optimistic first unless replays were seen lately; a batch
    /// that holds a message applied before goes again at once with the careful statement.
    fn apply_once(&mut self, deadline: Instant) -> Result<Applied, PostgresError> {
        if self.careful == 0 {
            match self.apply_with(deadline, true) {
                Err(PostgresError::Db(e)) if self.is_inbox_conflict(&e) => {
                    telemetry::postgres_replay_detected(&self.output);
                    self.careful = CAREFUL_BATCHES;
                }
                other => return other,
            }
        }
        let applied = self.apply_with(deadline, false)?;
        if applied.fresh < applied.messages {
            self.careful = CAREFUL_BATCHES;
        } else {
            self.careful = self.careful.saturating_sub(1);
        }
        Ok(applied)
    }

    /// Whether an error is the inbox's unique key (or its origins table's) refusing a
    /// message applied before.
    fn is_inbox_conflict(&self, e: &tokio_postgres::Error) -> bool {
        let inbox = self.config.inbox_table.rsplit('.').next().unwrap_or("");
        let origins = pg::origins_table(inbox);
        let table = e.as_db_error().and_then(|d| d.table());
        e.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION)
            && (table == Some(inbox) || table == Some(origins.as_str()))
    }

    /// One attempt at the batch: begin and apply, leaving the transaction open on success and
    /// rolled back on failure. A broken or silent connection is dropped.
    fn apply_with(
        &mut self,
        deadline: Instant,
        optimistic: bool,
    ) -> Result<Applied, PostgresError> {
        let limit = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_secs(1));
        let result = self.connection().and_then(|()| {
            let PostgresSink {
                runtime,
                conn,
                staged,
                consumer,
                target,
                config,
                ..
            } = &mut *self;
            let sequenced = config.sequence_column.is_some();
            let Conn {
                client,
                apply,
                optimistic: fast,
                ..
            } = conn.as_mut().expect("connected above");
            let apply = if optimistic { fast } else { apply };
            runtime.block_on(async {
                tokio::time::timeout(limit, async {
                    client.batch_execute(BEGIN).await?;
                    let row = match client
                        .query_one(&*apply, &args(apply, staged, consumer, target))
                        .await
                    {
                        Ok(row) => row,
                        Err(e) => {
                            client.batch_execute("ROLLBACK").await?;
                            return Err(e.into());
                        }
                    };
                    Ok(Applied {
                        messages: staged.messages(),
                        fresh: count(&row, 0),
                        upserted: count(&row, 1),
                        deleted: count(&row, 2),
                        gaps: if sequenced {
                            gaps::parse(&row.try_get::<_, String>(3).unwrap_or_default())
                        } else {
                            Vec::new()
                        },
                    })
                })
                .await
                .unwrap_or(Err(PostgresError::Timeout(limit)))
            })
        });
        if matches!(result, Err(PostgresError::Timeout(_))) {
            self.conn = None;
        }
        result
    }

    /// Finds the records behind a permanent error: the rows are applied one by one, each in a
    /// savepoint of a transaction that is rolled back in the end, so nothing of the batch
    /// commits. Every row that fails alone with a permanent error is refused, all found in
    /// one pass (the first in the error, the others in its `also`), so that a batch with
    /// several bad rows costs one aborted transaction, not one per row.
    fn isolate(&mut self, cause: PostgresError) -> SinkError {
        let limit = Duration::from_secs(120);
        let n = self.staged.len();
        let found = self.connection().and_then(|()| {
            let PostgresSink {
                runtime,
                conn,
                staged,
                consumer,
                target,
                ..
            } = &mut *self;
            let Conn { client, apply, .. } = conn.as_mut().expect("connected above");
            runtime.block_on(async {
                tokio::time::timeout(limit, async {
                    let mut tx = client.transaction().await?;
                    tx.batch_execute("SET CONSTRAINTS ALL IMMEDIATE").await?;
                    let mut refused = Vec::new();
                    for i in 0..n {
                        let row = staged.row(i);
                        let sp = tx.savepoint("onceflow_row").await?;
                        match sp
                            .query_one(&*apply, &args(apply, &row, consumer, target))
                            .await
                        {
                            Ok(_) => sp.commit().await?,
                            Err(e) => {
                                let e = PostgresError::Db(e);
                                if e.kind() != SinkErrorKind::Permanent {
                                    return Err(e);
                                }
                                sp.rollback().await?;
                                refused.push((i, e));
                            }
                        }
                    }
                    tx.rollback().await?;
                    Ok(refused)
                })
                .await
                .unwrap_or(Err(PostgresError::Timeout(limit)))
            })
        });
        match found {
            Ok(refused) if refused.is_empty() => SinkError::new(
                &self.output,
                None,
                PostgresError::NotIsolated(Box::new(cause)),
            ),
            Ok(refused) => {
                let mut errors: Vec<SinkError> = Vec::new();
                for (i, e) in refused {
                    let origin = self.staged.origin(i);
                    // The rows of one record (several with `explode`) make one refusal.
                    if !errors.iter().any(|x| x.origin.as_ref() == Some(origin)) {
                        errors.push(SinkError::new(&self.output, Some(origin.clone()), e));
                    }
                }
                let mut first = errors.remove(0);
                first.also = errors;
                first
            }
            Err(e) => {
                self.conn = None;
                SinkError::new(&self.output, None, e)
            }
        }
    }

    /// Removes expired inbox rows (and deletion markers), at most `CLEANUP_BATCH` of each per
    /// flush, looking for them every `inbox_cleanup_interval_secs`. Failures are logged and
    /// left for the next round: nothing depends on them.
    fn clean_inbox(&mut self) {
        let now = Instant::now();
        if !self.cleaning && now >= self.next_cleanup {
            self.cleaning = true;
            self.next_cleanup = now + Duration::from_secs(self.config.inbox_cleanup_interval_secs);
        }
        if !self.cleaning {
            return;
        }
        let hours = i32::try_from(self.config.inbox_retention_hours).unwrap_or(i32::MAX);
        let markers = self.config.delete_when.is_some() && self.config.ordering_column().is_some();
        let inbox_sql = pg::cleanup_inbox_and_origins(&self.config.inbox_table);
        let markers_sql = pg::cleanup_tombstones(&self.config.inbox_table);
        let (consumer, target) = (self.consumer.clone(), self.target.clone());
        let result = self.connection().and_then(|()| {
            let PostgresSink { runtime, conn, .. } = &mut *self;
            let client = &conn.as_ref().expect("connected above").client;
            runtime.block_on(async {
                tokio::time::timeout(Duration::from_secs(5), async {
                    let inbox = count(
                        &client
                            .query_one(&inbox_sql, &[&consumer, &hours, &CLEANUP_BATCH])
                            .await?,
                        0,
                    );
                    let tombstones = if markers {
                        client
                            .execute(&markers_sql, &[&target, &hours, &CLEANUP_BATCH])
                            .await?
                    } else {
                        0
                    };
                    Ok((inbox, tombstones))
                })
                .await
                .unwrap_or(Err(PostgresError::Timeout(Duration::from_secs(5))))
            })
        });
        match result {
            Ok((inbox, tombstones)) => {
                telemetry::inbox_cleaned(&self.output, inbox, tombstones);
                let limit = CLEANUP_BATCH as u64;
                self.cleaning = inbox >= limit || tombstones >= limit;
            }
            Err(e) => {
                telemetry::inbox_cleanup_failed(&self.output, &e);
                self.cleaning = false;
            }
        }
    }
}

impl super::Sink for PostgresSink {
    fn stage(&mut self, record: &Record) -> Result<(), SinkError> {
        PostgresSink::stage(self, record)
    }

    fn discard_record(&mut self, origin: &Origin) {
        PostgresSink::discard_record(self, origin);
    }

    fn is_full(&self) -> bool {
        PostgresSink::is_full(self)
    }

    fn apply(&mut self, deadline: Instant) -> Result<bool, SinkError> {
        PostgresSink::apply(self, deadline)
    }

    fn commit(&mut self) -> Result<bool, SinkError> {
        PostgresSink::commit(self)
    }

    fn discard(&mut self) {
        PostgresSink::discard(self);
    }
}

/// The batch statement's parameters: message ids, deletion flags, one array per column, the
/// inbox consumer and, when the statement marks deletions, the target's name.
fn args<'a>(
    apply: &Statement,
    staged: &'a Staged,
    consumer: &'a String,
    target: &'a String,
) -> Vec<&'a (dyn tokio_postgres::types::ToSql + Sync)> {
    let mut args: Vec<&'a (dyn tokio_postgres::types::ToSql + Sync)> =
        vec![&staged.mids, &staged.deleted];
    args.extend(
        staged
            .columns
            .iter()
            .map(|c| c as &(dyn tokio_postgres::types::ToSql + Sync)),
    );
    args.push(consumer);
    // The target's name only where the statement marks deletions: the origins come next.
    let origins = apply.params().len().saturating_sub(3);
    if args.len() < origins {
        args.push(target);
    }
    args.push(&staged.origin_topics);
    args.push(&staged.origin_partitions);
    args.push(&staged.origin_offsets);
    args.truncate(apply.params().len());
    args
}

fn count(row: &tokio_postgres::Row, i: usize) -> u64 {
    row.try_get::<_, i64>(i).unwrap_or(0).max(0) as u64
}

/// Checks the target table against the configuration; returns its qualified name and the
/// types of the mapped columns.
async fn inspect(
    client: &Client,
    config: &PostgresOutput,
) -> Result<(String, Vec<(String, String)>), PostgresError> {
    let table = pg::qualified(&config.table);
    let schema_error = |m: String| PostgresError::Schema(format!("table `{}`: {m}", config.table));
    let Some(name) = client.query_opt(sql::TABLE_NAME, &[&table]).await? else {
        return Err(schema_error(
            "does not exist (onceflow never creates nor alters the tables it writes to)".into(),
        ));
    };
    let target = format!("{}.{}", name.get::<_, String>(0), name.get::<_, String>(1));
    let mut types = Vec::new();
    let mut problems = Vec::new();
    let columns = client.query(sql::TABLE_COLUMNS, &[&table]).await?;
    for column in config.columns.keys() {
        match columns.iter().find(|r| r.get::<_, String>(0) == *column) {
            None => problems.push(format!("has no column `{column}`")),
            Some(r) if r.get::<_, bool>(2) => problems.push(format!(
                "column `{column}` is generated and cannot be written"
            )),
            Some(r) => types.push((column.clone(), r.get::<_, String>(1))),
        }
    }
    if let Some(sequence) = &config.sequence_column {
        let integer = ["smallint", "integer", "bigint"];
        if let Some((_, t)) = types
            .iter()
            .find(|(c, t)| c == sequence && !integer.contains(&t.as_str()))
        {
            problems.push(format!(
                "sequence column `{sequence}` is of type {t}; it must be smallint, integer or bigint"
            ));
        }
    }
    let mut ids = config.id_columns.clone();
    ids.sort();
    let keys: Vec<Vec<String>> = client
        .query(sql::UNIQUE_KEYS, &[&table])
        .await?
        .iter()
        .map(|r| {
            let mut k: Vec<String> = r.get(0);
            k.sort();
            k
        })
        .collect();
    if !keys.contains(&ids) {
        problems.push(format!(
            "has no primary key or unique index on exactly ({}); the upsert needs one as its conflict target",
            config.id_columns.join(", ")
        ));
    }
    if problems.is_empty() {
        Ok((target, types))
    } else {
        Err(schema_error(problems.join("; ")))
    }
}
