//! Kafka clients outside the job's transaction: their configuration, reading a topic to its
//! end under read_committed, admin calls, and the embedded cluster of a first run.
//!
//! The job's own consumer and transactional producer are configured in [`clients`]; the
//! transactional calls themselves live in [`crate::txn`] and nowhere else.

pub mod admin;
pub mod batch;
pub mod clients;
pub mod embedded;
pub mod read;
mod scram;
pub mod send;
pub mod transactions;
pub mod wire;

use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::client::{Client, ClientContext};
use rdkafka::error::KafkaResult;

/// Where a command's cluster is: bootstrap servers, and librdkafka settings for its clients
/// (security: `security.protocol`, `ssl.ca.location`, `sasl.*`...).
#[derive(Debug, Clone, Default)]
pub struct Cluster {
    pub bootstrap: String,
    pub settings: Vec<(String, String)>,
}

impl Cluster {
    pub fn new(bootstrap: &str) -> Cluster {
        Cluster {
            bootstrap: bootstrap.to_string(),
            settings: Vec::new(),
        }
    }

    /// A client configuration with the cluster's settings.
    pub fn config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        for (key, value) in &self.settings {
            config.set(key, value);
        }
        config.set("bootstrap.servers", &self.bootstrap);
        config
    }
}

/// The partition count of `topic` as the cluster's metadata gives it, `None` when the topic
/// does not exist (or has no partition yet).
pub fn partition_count<C: ClientContext>(
    client: &Client<C>,
    topic: &str,
    timeout: Duration,
) -> KafkaResult<Option<usize>> {
    let metadata = client.fetch_metadata(Some(topic), timeout)?;
    Ok(metadata
        .topics()
        .iter()
        .find(|t| t.name() == topic && t.error().is_none() && !t.partitions().is_empty())
        .map(|t| t.partitions().len()))
}
