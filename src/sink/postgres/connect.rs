//! Connecting to PostgreSQL and making the inbox's tables: the connection settings from a
//! URL (TLS as its `sslmode` says, [`super::tls`]), opening a client with its connection task,
//! and creating the inbox, deletion markers' and origins tables when missing. The sink, the
//! HTTP sink's deduplication, the outbox relay and reconcile connect through here.

use std::time::Duration;

use postgres_openssl::MakeTlsConnector;
use tokio_postgres::{Client, NoTls};

use super::error::PostgresError;
use super::sql;
use super::tls::{SslMode, Tls};

/// The connection settings of `url`, read from the variable `var`: TLS as its `sslmode`
/// says, a 5 s connect timeout and `application` as the application name unless the URL sets
/// them.
pub(crate) fn client_config(
    url: &str,
    var: &str,
    application: &str,
) -> Result<(tokio_postgres::Config, Option<MakeTlsConnector>), PostgresError> {
    // The URL may hold a password: name the variable, not the value.
    let bad_url = |message: String| PostgresError::BadUrl {
        var: var.to_string(),
        message,
    };
    let (url, tls) = Tls::split(url).map_err(bad_url)?;
    let tls = match tls.mode {
        SslMode::Disable => None,
        _ => Some(tls.connector().map_err(bad_url)?),
    };
    let mut pg: tokio_postgres::Config = url
        .parse()
        .map_err(|e: tokio_postgres::Error| bad_url(e.to_string()))?;
    if pg.get_connect_timeout().is_none() {
        pg.connect_timeout(Duration::from_secs(5));
    }
    if pg.get_application_name().is_none() {
        pg.application_name(application);
    }
    Ok((pg, tls))
}

/// Creates the inbox (and the deletion markers' table with `markers`) when missing, under
/// an advisory lock: instances starting together must not race on DDL. Only what is missing
/// is created: a user without the right to create tables can run on tables made for it.
pub(crate) async fn ensure_tables(
    client: &Client,
    inbox: &str,
    markers: bool,
) -> Result<(), PostgresError> {
    let mut needed = vec![inbox.to_string()];
    if markers {
        needed.push(sql::tombstones_table(inbox));
    }
    let mut missing = false;
    for table in &needed {
        let found: bool = client
            .query_one(sql::TABLE_EXISTS, &[&sql::qualified(table)])
            .await?
            .get(0);
        missing |= !found;
    }
    if missing {
        client
            .batch_execute(&format!(
                "BEGIN; SELECT pg_advisory_xact_lock(hashtext('onceflow.schema'));\n{}COMMIT;",
                sql::create_tables(inbox, markers)
            ))
            .await?;
    }
    Ok(())
}

/// Creates the origins table of `inbox` ([`sql::origins_table`]) when missing, under the
/// same advisory lock as [`ensure_tables`]. An inbox made before the table existed keeps its
/// rows; their messages simply have no recorded origin.
pub(crate) async fn ensure_origins(client: &Client, inbox: &str) -> Result<(), PostgresError> {
    let table = sql::origins_table(inbox);
    let found: bool = client
        .query_one(sql::TABLE_EXISTS, &[&sql::qualified(&table)])
        .await?
        .get(0);
    if !found {
        client
            .batch_execute(&format!(
                "BEGIN; SELECT pg_advisory_xact_lock(hashtext('onceflow.schema'));\n{}COMMIT;",
                sql::create_origins_table(inbox)
            ))
            .await?;
    }
    Ok(())
}

/// Connects and spawns the connection's task on the current runtime.
pub(crate) async fn open(
    pg: &tokio_postgres::Config,
    tls: &Option<MakeTlsConnector>,
) -> Result<(Client, tokio::task::JoinHandle<()>), PostgresError> {
    // Its errors surface on the client's next call.
    let (client, task) = match tls {
        None => {
            let (client, connection) = pg.connect(NoTls).await?;
            (client, tokio::spawn(async move { drop(connection.await) }))
        }
        Some(tls) => {
            let (client, connection) = pg.connect(tls.clone()).await?;
            (client, tokio::spawn(async move { drop(connection.await) }))
        }
    };
    Ok((client, task))
}

/// Aborts a task unless disarmed: a connection task must not outlive its client.
pub(super) struct AbortOnDrop(pub(super) Option<tokio::task::JoinHandle<()>>);

impl AbortOnDrop {
    pub(super) fn disarm(mut self) -> tokio::task::JoinHandle<()> {
        self.0.take().expect("armed")
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(task) = self.0.take() {
            task.abort();
        }
    }
}
