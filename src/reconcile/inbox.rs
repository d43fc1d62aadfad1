//! The PostgreSQL outputs' side: the origins recorded beside each inbox, and the look-up by
//! event id of the messages of records whose origin the inbox does not show (a redelivery at
//! a new offset, absorbed by the inbox, leaves its trace under the event id only).

use std::collections::{BTreeMap, HashMap};

use super::tally::{PartitionTally, Verdict};
use crate::pg::{self, InboxReader, PgError};
use crate::topology::{PostgresOutput, Topology};

/// The connection settings of a PostgreSQL output, and a runtime to run its queries on.
fn database(
    config: &PostgresOutput,
) -> Result<
    (
        tokio_postgres::Config,
        Option<postgres_openssl::MakeTlsConnector>,
        tokio::runtime::Runtime,
    ),
    PgError,
> {
    let url =
        std::env::var(&config.url_env).map_err(|_| PgError::MissingUrl(config.url_env.clone()))?;
    let (pg, tls) = pg::client_config(&url, &config.url_env, "onceflow/reconcile")?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(PgError::Runtime)?;
    Ok((pg, tls, runtime))
}

/// Reads the origins recorded beside the inbox of a PostgreSQL output, calling `each` with
/// every one (topic, partition, offset); returns the rows read.
pub(super) fn read_inbox(
    topology: &Topology,
    output: &str,
    config: &PostgresOutput,
    each: impl FnMut(&str, i32, i64),
) -> Result<u64, PgError> {
    let (pg, tls, runtime) = database(config)?;
    let consumer = format!("{}/{output}", topology.name);
    let inbox = InboxReader::new(&config.inbox_table, &consumer);
    runtime.block_on(async {
        let (client, task) = pg::open(&pg, &tls).await?;
        let n = inbox.origins(&client, each).await?;
        task.abort();
        Ok(n)
    })
}

/// A record whose PostgreSQL trace is to be looked for by event id.
pub(super) struct Pending {
    pub(super) partition: i32,
    pub(super) offset: i64,
    /// Streams and the message id to find in their inbox.
    pub(super) ask: Vec<(usize, String)>,
    /// The verdict when the inbox holds every one of them.
    pub(super) if_absorbed: Verdict,
}

/// The records of an input whose PostgreSQL trace is looked up by event id, in batches.
#[derive(Default)]
pub(super) struct Absorbed {
    pub(super) pending: Vec<Pending>,
}

impl Absorbed {
    /// Looks up the pending records' traces and counts their verdicts in `tallies`.
    pub(super) fn resolve(
        &mut self,
        topology: &Topology,
        postgres_outputs: &[(usize, &str, &PostgresOutput)],
        tallies: &mut BTreeMap<i32, PartitionTally>,
    ) -> Result<(), (String, PgError)> {
        let pending = std::mem::take(&mut self.pending);
        if pending.is_empty() {
            return Ok(());
        }
        // Every asked message id, per stream, looked up in batches of 5,000.
        let mut found: HashMap<usize, std::collections::HashSet<String>> = HashMap::new();
        for (s, name, config) in postgres_outputs {
            let asked: Vec<&str> = pending
                .iter()
                .flat_map(|p| p.ask.iter())
                .filter(|(ps, _)| ps == s)
                .map(|(_, mid)| mid.as_str())
                .collect();
            if asked.is_empty() {
                continue;
            }
            let have = known_messages(topology, name, config, &asked)
                .map_err(|e| (name.to_string(), e))?;
            found.insert(*s, have);
        }
        for p in pending {
            let all = p
                .ask
                .iter()
                .all(|(s, mid)| found.get(s).is_some_and(|f| f.contains(mid)));
            let verdict = if all { p.if_absorbed } else { Verdict::Missing };
            if let Some(t) = tallies.get_mut(&p.partition) {
                t.count(p.offset, verdict);
            }
        }
        Ok(())
    }
}

/// Which of `mids` the inbox of a PostgreSQL output holds.
fn known_messages(
    topology: &Topology,
    output: &str,
    config: &PostgresOutput,
    mids: &[&str],
) -> Result<std::collections::HashSet<String>, PgError> {
    let (pg, tls, runtime) = database(config)?;
    let consumer = format!("{}/{output}", topology.name);
    let inbox = InboxReader::new(&config.inbox_table, &consumer);
    runtime.block_on(async {
        let (client, task) = pg::open(&pg, &tls).await?;
        let mut found = std::collections::HashSet::new();
        for chunk in mids.chunks(5_000) {
            found.extend(inbox.known(&client, chunk).await?);
        }
        task.abort();
        Ok(found)
    })
}
