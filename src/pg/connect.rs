//! Connecting to PostgreSQL: the connection settings from a URL (TLS as its `sslmode` says,
//! [`super::tls`]) and opening a client with its connection task. The sink, the HTTP sink's
//! deduplication, the outbox relay and reconcile connect through here.

use std::time::Duration;

use postgres_openssl::MakeTlsConnector;
use tokio_postgres::{Client, NoTls};

use super::error::PgError;
use super::tls::{SslMode, Tls};

/// The connection settings of `url`, read from the variable `var`: TLS as its `sslmode`
/// says, a 5 s connect timeout and `application` as the application name unless the URL sets
/// them.
pub(crate) fn client_config(
    url: &str,
    var: &str,
    application: &str,
) -> Result<(tokio_postgres::Config, Option<MakeTlsConnector>), PgError> {
    // The URL may hold a password: name the variable, not the value.
    let bad_url = |message: String| PgError::BadUrl {
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

/// Connects and spawns the connection's task on the current runtime.
pub(crate) async fn open(
    pg: &tokio_postgres::Config,
    tls: &Option<MakeTlsConnector>,
) -> Result<(Client, tokio::task::JoinHandle<()>), PgError> {
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
pub(crate) struct AbortOnDrop(pub(crate) Option<tokio::task::JoinHandle<()>>);

impl AbortOnDrop {
    pub(crate) fn disarm(mut self) -> tokio::task::JoinHandle<()> {
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
