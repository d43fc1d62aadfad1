//! `onceflow dlq inspect|replay`: the dead-letter topic, read back and replayed.

use clap::Subcommand;

use super::KafkaArgs;
use crate::dlq;

#[derive(Subcommand)]
pub enum DlqCommand {
    /// Print dead-letter records as a table: error kind, origin, shortened payload.
    Inspect {
        /// The dead-letter topic (default of a topology: `<name>.dlq`).
        topic: String,
        #[command(flatten)]
        filter: DlqFilter,
        #[command(flatten)]
        kafka: KafkaArgs,
        /// Show at most this many records.
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// Decode Avro payloads (the Confluent wire format) with the schemas of this registry
        /// (its Confluent-compatible API root), shown as the JSON documents expressions see.
        #[arg(long, env = "ONCEFLOW_SCHEMA_REGISTRY_URL")]
        schema_registry: Option<String>,
        /// The user name of the registry's basic authentication.
        #[arg(long, env = "ONCEFLOW_SCHEMA_REGISTRY_USER")]
        registry_user: Option<String>,
        /// The password of the registry's basic authentication (better from the environment
        /// than on the command line, where other users of the machine can see it).
        #[arg(
            long,
            env = "ONCEFLOW_SCHEMA_REGISTRY_PASSWORD",
            hide_env_values = true
        )]
        registry_password: Option<String>,
    },
    /// Re-produce the original records to their original topic (or --to), exactly once:
    /// running it again over the same range re-produces nothing.
    Replay {
        /// The dead-letter topic.
        topic: String,
        #[command(flatten)]
        filter: DlqFilter,
        #[command(flatten)]
        kafka: KafkaArgs,
        /// Write to this topic instead of each record's original topic.
        #[arg(long)]
        to: Option<String>,
    },
}

#[derive(clap::Args)]
pub struct DlqFilter {
    /// Only records of this error kind.
    #[arg(long)]
    kind: Option<String>,
    /// Only records that failed at or after this time (ms since the epoch).
    #[arg(long)]
    since_ms: Option<i64>,
    /// Only records that failed before this time (ms since the epoch).
    #[arg(long)]
    until_ms: Option<i64>,
    /// Only records from this original partition.
    #[arg(long)]
    origin_partition: Option<i32>,
}

impl From<DlqFilter> for dlq::Filter {
    fn from(f: DlqFilter) -> Self {
        dlq::Filter {
            kind: f.kind,
            since_ms: f.since_ms,
            until_ms: f.until_ms,
            origin_partition: f.origin_partition,
        }
    }
}

pub fn run(command: DlqCommand) -> anyhow::Result<bool> {
    match command {
        DlqCommand::Inspect {
            topic,
            filter,
            kafka,
            limit,
            schema_registry,
            registry_user,
            registry_password,
        } => {
            let registry = match schema_registry {
                Some(url) => Some(
                    crate::codec::Registry::connect(&crate::topology::SchemaRegistry {
                        url,
                        username: registry_user,
                        password: registry_password,
                        timeout_ms: 5_000,
                    })
                    .map_err(anyhow::Error::msg)?,
                ),
                None => None,
            };
            let shown = dlq::inspect(
                &kafka.into(),
                &topic,
                &filter.into(),
                limit,
                registry.map(std::sync::Arc::new),
                &mut std::io::stdout(),
            )?;
            eprintln!("{shown} record(s) shown");
        }
        DlqCommand::Replay {
            topic,
            filter,
            kafka,
            to,
        } => {
            let mut progress = |done: u64, total: u64| {
                eprint!("\rreplay: {done} of {total} dead-letter records read");
            };
            let r = dlq::replay(
                &kafka.into(),
                &topic,
                &filter.into(),
                to.as_deref(),
                &mut progress,
            )?;
            eprintln!();
            println!(
                "read {} dead-letter record(s), replayed {}",
                r.read, r.replayed
            );
        }
    }
    Ok(true)
}
