//! Admin calls: creating topics (and waiting until every partition has a leader), deleting
//! topics, and what the cluster's metadata and a broker's configuration say.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use tokio::runtime::Runtime;

use super::Cluster;

/// Why an admin call failed.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("admin client: {0}")]
    Client(#[source] KafkaError),
    /// The runtime that drives the asynchronous admin requests could not start.
    #[error("async runtime: {0}")]
    Runtime(#[source] std::io::Error),
    /// The request failed as a whole; `what` names it.
    #[error("{what}: {source}")]
    Request {
        what: &'static str,
        #[source]
        source: KafkaError,
    },
    /// The broker refused the request for one resource (a topic, a broker's configuration).
    #[error("{what} {resource}: {code}")]
    Refused {
        what: &'static str,
        resource: String,
        code: RDKafkaErrorCode,
    },
    /// The broker answered without a result for the resource asked about.
    #[error("{what}: no answer")]
    NoAnswer { what: &'static str },
    #[error("timed out: topic {0} has no leader for every partition")]
    NoLeaders(String),
}

/// What the cluster's metadata says: its brokers, and the topics that exist.
#[derive(Debug, Clone, Default)]
pub struct ClusterMetadata {
    /// Broker ids, in the order the metadata lists them.
    pub brokers: Vec<i32>,
    /// Topics the metadata lists without an error.
    pub topics: BTreeSet<String>,
    /// The partition count of each of those topics.
    pub partitions: BTreeMap<String, usize>,
}

/// An admin client of a cluster.
pub struct Admin {
    client: AdminClient<DefaultClientContext>,
    /// Drives the asynchronous requests; started by the first one.
    runtime: OnceLock<Runtime>,
}

impl Admin {
    pub fn new(cluster: &Cluster) -> Result<Admin, AdminError> {
        let client = cluster.config().create().map_err(AdminError::Client)?;
        Ok(Admin {
            client,
            runtime: OnceLock::new(),
        })
    }

    fn runtime(&self) -> Result<&Runtime, AdminError> {
        if let Some(runtime) = self.runtime.get() {
            return Ok(runtime);
        }
        let built = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(AdminError::Runtime)?;
        Ok(self.runtime.get_or_init(|| built))
    }

    /// Creates a topic and waits for its leaders. A busy broker may time out the request and
    /// create the topic anyway: the request is tried three times, and "already exists" on a
    /// later try counts as created.
    pub fn create_topic(&self, name: &str, partitions: i32) -> Result<(), AdminError> {
        self.create(NewTopic::new(name, partitions, TopicReplication::Fixed(1)))
    }

    /// Creates a compacted topic (the last record of each key is kept), replicated on up to
    /// three brokers, and waits for its leaders.
    pub fn create_compacted_topic(
        &self,
        name: &str,
        partitions: i32,
        settings: &[(&str, String)],
    ) -> Result<(), AdminError> {
        let brokers = self.metadata(Duration::from_secs(10))?.brokers.len().max(1);
        let replication = brokers.min(3) as i32;
        let min_insync = (replication - 1).max(1).to_string();
        let mut topic = NewTopic::new(name, partitions, TopicReplication::Fixed(replication))
            .set("cleanup.policy", "compact")
            .set("min.insync.replicas", &min_insync);
        for (key, value) in settings {
            topic = topic.set(key, value);
        }
        self.create(topic)
    }

    fn create(&self, topic: NewTopic<'_>) -> Result<(), AdminError> {
        let (name, partitions) = (topic.name, topic.num_partitions);
        let opts = AdminOptions::new()
            .operation_timeout(Some(Duration::from_secs(60)))
            .request_timeout(Some(Duration::from_secs(70)));
        let mut attempt = 0;
        loop {
            attempt += 1;
            let outcome = self
                .runtime()?
                .block_on(self.client.create_topics([&topic], &opts))
                .map_err(|source| AdminError::Request {
                    what: "create topic",
                    source,
                })
                .and_then(|results| {
                    for r in results {
                        match r {
                            Ok(_) => {}
                            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) if attempt > 1 => {}
                            Err((resource, code)) => {
                                return Err(AdminError::Refused {
                                    what: "create topic",
                                    resource,
                                    code,
                                });
                            }
                        }
                    }
                    Ok(())
                });
            match outcome {
                Ok(()) => return self.wait_for_leaders(name, partitions),
                Err(e) if attempt >= 3 => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_secs(2)),
            }
        }
    }

    /// Waits until the broker's metadata shows every partition of a new topic with a leader:
    /// a client that subscribes earlier does not see the topic until its next metadata
    /// refresh (five minutes by default).
    fn wait_for_leaders(&self, name: &str, partitions: i32) -> Result<(), AdminError> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready = self
                .client
                .inner()
                .fetch_metadata(Some(name), Duration::from_secs(5))
                .is_ok_and(|m| {
                    m.topics().iter().any(|t| {
                        t.name() == name
                            && t.error().is_none()
                            && t.partitions().len() == partitions as usize
                            && t.partitions()
                                .iter()
                                .all(|p| p.leader() >= 0 && p.error().is_none())
                    })
                });
            if ready {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(AdminError::NoLeaders(name.to_string()));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Deletes topics, ignoring those that do not exist.
    pub fn delete_topics(&self, names: &[&str]) -> Result<(), AdminError> {
        if names.is_empty() {
            return Ok(());
        }
        let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
        let results = self
            .runtime()?
            .block_on(self.client.delete_topics(names, &opts))
            .map_err(|source| AdminError::Request {
                what: "delete topics",
                source,
            })?;
        for r in results {
            match r {
                Ok(_) | Err((_, RDKafkaErrorCode::UnknownTopicOrPartition)) => {}
                Err((resource, code)) => {
                    return Err(AdminError::Refused {
                        what: "delete topic",
                        resource,
                        code,
                    });
                }
            }
        }
        Ok(())
    }

    /// The brokers and the topics of the cluster, in one metadata request.
    pub fn metadata(&self, timeout: Duration) -> Result<ClusterMetadata, AdminError> {
        let metadata = self
            .client
            .inner()
            .fetch_metadata(None, timeout)
            .map_err(|source| AdminError::Request {
                what: "cluster metadata",
                source,
            })?;
        let listed = || metadata.topics().iter().filter(|t| t.error().is_none());
        Ok(ClusterMetadata {
            brokers: metadata.brokers().iter().map(|b| b.id()).collect(),
            topics: listed().map(|t| t.name().to_string()).collect(),
            partitions: listed()
                .map(|t| (t.name().to_string(), t.partitions().len()))
                .collect(),
        })
    }

    /// The value of the setting `key` of broker `broker` (`None` when it does not report it).
    pub fn broker_config(
        &self,
        broker: i32,
        key: &str,
        timeout: Duration,
    ) -> Result<Option<String>, AdminError> {
        const WHAT: &str = "describe configs";
        let options = AdminOptions::new().request_timeout(Some(timeout));
        let mut results = self
            .runtime()?
            .block_on(
                self.client
                    .describe_configs(&[ResourceSpecifier::Broker(broker)], &options),
            )
            .map_err(|source| AdminError::Request { what: WHAT, source })?;
        let resource = results
            .pop()
            .ok_or(AdminError::NoAnswer { what: WHAT })?
            .map_err(|code| AdminError::Refused {
                what: WHAT,
                resource: format!("broker {broker}"),
                code,
            })?;
        Ok(resource.get(key).and_then(|entry| entry.value.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kafka::embedded::EmbeddedCluster;

    #[test]
    fn metadata_lists_the_brokers_and_the_topics_that_exist() {
        let cluster = EmbeddedCluster::start(2).expect("embedded cluster");
        cluster.create_topic("present", 2).expect("topic");
        let admin = Admin::new(&Cluster::new(cluster.bootstrap_servers())).expect("admin");
        let metadata = admin.metadata(Duration::from_secs(10)).expect("metadata");
        let mut brokers = metadata.brokers.clone();
        brokers.sort_unstable();
        assert_eq!(brokers, [1, 2]);
        assert!(metadata.topics.contains("present"), "{metadata:?}");
        assert!(!metadata.topics.contains("absent"), "{metadata:?}");
        assert_eq!(metadata.partitions.get("present"), Some(&2));
    }
}
