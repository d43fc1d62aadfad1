//! `dedup: {postgres: ...}`: the idempotency keys an `http` output delivered, remembered in
//! the inbox table of the PostgreSQL outputs, for endpoints that do not honour the keys.
//!
//! Before a batch's calls, the keys already recorded for the output (consumer
//! `<topology>/<output>`) are looked up with one query and their calls are not made again;
//! right after each 2xx, its key is recorded (`INSERT ... ON CONFLICT DO NOTHING`, one row
//! per call, pipelined on the connection). What that leaves: a crash (or a database that
//! fails) between a 2xx and the write of its key repeats that call once when the record comes
//! again. A write that fails is a transient error of the batch: the Kafka transaction aborts
//! and its records come again, so no key is ever taken as delivered without its row.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use postgres_openssl::MakeTlsConnector;
use tokio_postgres::Client;

use super::HttpError;
use crate::pg::{self, Class, InboxReader, PgError};
use crate::retry::Retries;
use crate::telemetry;
use crate::topology::http::DedupPostgres;

/// How long the sink tries to reach the database at start before the job stops.
const STARTUP_RETRY: Duration = Duration::from_secs(30);
/// No statement waits longer than this for the database.
const STATEMENT_TIMEOUT: Duration = Duration::from_secs(10);
/// Expired keys are removed this many at a time, at most once per this interval.
const CLEANUP_BATCH: i32 = 1_000;
const CLEANUP_INTERVAL: Duration = Duration::from_secs(300);

/// An open connection and what it runs.
pub(super) struct Recorder {
    client: Client,
    consumer: String,
    inbox: InboxReader,
    record_sql: String,
}

impl Recorder {
    /// Records that `key` was delivered.
    pub(super) async fn record(&self, key: &str) -> Result<(), HttpError> {
        let insert = async {
            self.client
                .execute(self.record_sql.as_str(), &[&self.consumer, &key])
                .await
        };
        match tokio::time::timeout(STATEMENT_TIMEOUT, insert).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(dedup_error(PgError::Db(e))),
            Err(_) => Err(dedup_error(PgError::Timeout(STATEMENT_TIMEOUT))),
        }
    }
}

/// The inbox of one `http` output.
pub(super) struct Delivered {
    output: String,
    consumer: String,
    /// The inbox table as configured (schema-qualified or not, unquoted).
    inbox: String,
    retention_hours: i32,
    pg: tokio_postgres::Config,
    tls: Option<MakeTlsConnector>,
    conn: Option<(Arc<Recorder>, tokio::task::JoinHandle<()>)>,
    next_cleanup: Instant,
}

impl Drop for Delivered {
    fn drop(&mut self) {
        if let Some((_, task)) = self.conn.take() {
            task.abort();
        }
    }
}

/// A database error of the dedup inbox, with its severity.
fn dedup_error(e: PgError) -> HttpError {
    HttpError::Dedup {
        transient: e.class() == Class::Transient,
        message: e.to_string(),
    }
}

impl Delivered {
    /// Connects (retrying for a while when the database is not reachable yet) and creates
    /// the inbox if missing, on `runtime`.
    pub(super) fn connect(
        topology: &str,
        output: &str,
        config: &DedupPostgres,
        runtime: &tokio::runtime::Runtime,
    ) -> Result<Delivered, HttpError> {
        let url = std::env::var(&config.url_env)
            .map_err(|_| dedup_error(PgError::MissingUrl(config.url_env.clone())))?;
        let (pg, tls) = pg::client_config(
            &url,
            &config.url_env,
            &format!("onceflow/{topology}/{output}"),
        )
        .map_err(dedup_error)?;
        let mut delivered = Delivered {
            output: output.to_string(),
            consumer: format!("{topology}/{output}"),
            retention_hours: i32::try_from(config.inbox_retention_hours).unwrap_or(i32::MAX),
            pg,
            tls,
            conn: None,
            next_cleanup: Instant::now() + CLEANUP_INTERVAL,
            inbox: config.inbox_table.clone(),
        };
        let deadline = Instant::now() + STARTUP_RETRY;
        let mut backoff = Retries::default();
        loop {
            match runtime.block_on(delivered.prepare()) {
                Ok(()) => return Ok(delivered),
                Err(HttpError::Dedup {
                    transient: true,
                    message,
                }) => {
                    let Some(delay) = backoff.next_delay(deadline) else {
                        return Err(HttpError::Dedup {
                            transient: false,
                            message,
                        });
                    };
                    telemetry::sink_retry(output, "dedup_connect", backoff.attempt(), &message);
                    std::thread::sleep(delay);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Creates the inbox if missing and opens the connection the calls use.
    async fn prepare(&mut self) -> Result<(), HttpError> {
        let recorder = self.recorder().await?;
        let created = pg::ensure_tables(&recorder.client, &self.inbox, false);
        match tokio::time::timeout(STATEMENT_TIMEOUT, created).await {
            Ok(done) => done.map_err(dedup_error),
            Err(_) => Err(dedup_error(PgError::Timeout(STATEMENT_TIMEOUT))),
        }
    }

    /// The open connection, opened again when it was lost.
    pub(super) async fn recorder(&mut self) -> Result<Arc<Recorder>, HttpError> {
        if let Some((r, _)) = &self.conn
            && !r.client.is_closed()
        {
            return Ok(Arc::clone(r));
        }
        if let Some((_, task)) = self.conn.take() {
            task.abort();
        }
        let opened = tokio::time::timeout(STATEMENT_TIMEOUT, pg::open(&self.pg, &self.tls));
        let (client, task) = match opened.await {
            Ok(opened) => opened.map_err(dedup_error)?,
            Err(_) => return Err(dedup_error(PgError::Timeout(STATEMENT_TIMEOUT))),
        };
        let recorder = Arc::new(Recorder {
            client,
            consumer: self.consumer.clone(),
            inbox: InboxReader::new(&self.inbox, &self.consumer),
            record_sql: format!(
                "INSERT INTO {} (consumer, message_id) VALUES ($1::text, $2::text) \
                 ON CONFLICT DO NOTHING",
                pg::qualified(&self.inbox)
            ),
        });
        self.conn = Some((Arc::clone(&recorder), task));
        Ok(recorder)
    }

    /// Which of `keys` were delivered before.
    pub(super) async fn seen(
        &mut self,
        keys: &[&str],
    ) -> Result<(Arc<Recorder>, HashSet<String>), HttpError> {
        let recorder = self.recorder().await?;
        let query = recorder.inbox.known(&recorder.client, keys);
        let seen = match tokio::time::timeout(STATEMENT_TIMEOUT, query).await {
            Ok(seen) => seen.map_err(dedup_error)?,
            Err(_) => return Err(dedup_error(PgError::Timeout(STATEMENT_TIMEOUT))),
        };
        self.clean().await;
        Ok((recorder, seen))
    }

    /// Removes expired keys now and then; a failure is logged and tried again later.
    async fn clean(&mut self) {
        let now = Instant::now();
        if now < self.next_cleanup {
            return;
        }
        self.next_cleanup = now + CLEANUP_INTERVAL;
        let Some((recorder, _)) = &self.conn else {
            return;
        };
        let sql = pg::cleanup_inbox(&self.inbox);
        let removed = async {
            recorder
                .client
                .execute(
                    sql.as_str(),
                    &[&recorder.consumer, &self.retention_hours, &CLEANUP_BATCH],
                )
                .await
        };
        match tokio::time::timeout(STATEMENT_TIMEOUT, removed).await {
            Ok(Ok(rows)) => telemetry::inbox_cleaned(&self.output, rows, 0),
            Ok(Err(e)) => telemetry::inbox_cleanup_failed(&self.output, &PgError::Db(e)),
            Err(_) => {
                telemetry::inbox_cleanup_failed(&self.output, &PgError::Timeout(STATEMENT_TIMEOUT))
            }
        }
    }
}
