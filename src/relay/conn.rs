//! The relay's database connection: opened with the relay's statements prepared and the
//! notify channel listened on, its notifications passed on; and the read of the outbox
//! table's columns at start.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio_postgres::{AsyncMessage, Client, Statement};

use crate::pg::{PgError, client_config, open};
use crate::telemetry;
use crate::topology::OutboxInput;

use super::table::{COLUMNS_SQL, Column, Layout, LayoutError};
use super::{Relay, RelayError};

/// The database connection and what is prepared on it.
pub(super) struct Conn {
    pub(super) client: Client,
    task: tokio::task::JoinHandle<()>,
    /// A message per `NOTIFY` on the notify channel.
    notified: tokio::sync::mpsc::UnboundedReceiver<()>,
    pub(super) claim: Statement,
    pub(super) delete: Statement,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Relay<'_> {
    /// Connects, listens on the notify channel, prepares the statements.
    pub(super) fn connect(&mut self) -> Result<(), PgError> {
        // The timer is made inside block_on: it needs the runtime's reactor.
        let conn = self.runtime.block_on(async {
            tokio::time::timeout(
                Duration::from_secs(30),
                connect(&self.pg, &self.tls, &self.layout, self.config),
            )
            .await
        });
        let conn = conn.map_err(|_| PgError::Timeout(Duration::from_secs(30)))??;
        telemetry::relay_connected(&self.config.table);
        self.conn = Some(conn);
        self.next_housekeeping = Instant::now();
        Ok(())
    }

    /// Nothing to publish: waits for a notification, the poll interval, or a stop.
    pub(super) fn wait_for_rows(&mut self, shutdown: &AtomicBool) {
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
}

/// The connection settings of the URL in `config.url_env` (the connections named
/// `application_name`), and the runtime to run them on.
pub(super) fn database(
    config: &OutboxInput,
    application_name: &str,
) -> Result<
    (
        tokio_postgres::Config,
        Option<postgres_openssl::MakeTlsConnector>,
        tokio::runtime::Runtime,
    ),
    RelayError,
> {
    let url = std::env::var(&config.url_env)
        .map_err(|_| RelayError::MissingUrl(config.url_env.clone()))?;
    let (pg, tls) = client_config(&url, &config.url_env, application_name)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(RelayError::Runtime)?;
    Ok((pg, tls, runtime))
}

/// Reads the outbox table's columns and checks them.
pub(super) async fn inspect(
    pg: &tokio_postgres::Config,
    tls: &Option<postgres_openssl::MakeTlsConnector>,
    config: &OutboxInput,
) -> Result<Result<Layout, LayoutError>, RelayError> {
    let limit = Duration::from_secs(30);
    let (client, task) = tokio::time::timeout(limit, open(pg, tls))
        .await
        .map_err(|_| PgError::Timeout(Duration::from_secs(30)))??;
    let rows = client
        .query(COLUMNS_SQL, &[&config.table])
        .await
        .map_err(PgError::from)?;
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
) -> Result<Conn, PgError> {
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
