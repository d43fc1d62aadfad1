//! Starting a relay: the database's layout read once, the pipeline compiled, the output
//! topics checked and the progress topic created when it does not exist.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};

use crate::instance::{Identity, RunOptions};
use crate::kafka::Cluster;
use crate::kafka::admin::Admin;
use crate::sink::postgres::client_config;
use crate::telemetry;
use crate::topology::{Target, Topology};
use crate::transform::Pipeline;
use crate::txn::TxnStats;

use super::conn::inspect;
use super::{BACKOFF, Relay, RelayError};

impl<'t> Relay<'t> {
    pub(super) fn new(
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
