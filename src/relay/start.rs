//! Starting a relay: the database's layout read once, the pipeline compiled, the output
//! topics checked and the progress topic created when it does not exist.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};

use crate::instance::{Identity, RunOptions};
use crate::kafka::admin::Admin;
use crate::kafka::{Cluster, clients};
use crate::telemetry;
use crate::topology::{Target, Topology};
use crate::transform::Pipeline;
use crate::txn::TxnStats;

use super::conn::{database, inspect};
use super::{BACKOFF, Relay, RelayError};

impl<'t> Relay<'t> {
    /// A relay of `topology`: its outbox table's layout read, its pipeline compiled, its
    /// topics checked (the progress topic created when missing). It holds no shard yet.
    pub(super) fn new(
        topology: &'t Topology,
        identity: &'t Identity,
        options: &'t RunOptions,
    ) -> Result<Relay<'t>, RelayError> {
        let config = topology.outbox().ok_or_else(|| {
            RelayError::Config("the topology has no postgres_outbox input".into())
        })?;
        let (pg, tls, runtime) = database(
            config,
            &format!("onceflow/{}/relay/{}", topology.name, identity.instance_id),
        )?;
        let timeout = Duration::from_millis(topology.runtime.transaction_timeout_ms);
        let layout = runtime.block_on(inspect(&pg, &tls, config))??;
        let pipeline = pipeline(topology)?;
        let topics = output_topics(topology)?;
        let cluster = clients::cluster(topology, identity);
        let reader = progress_reader(&cluster, &topology.name)?;
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
            cluster: cluster.clone(),
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
        relay.started();
        Ok(relay)
    }

    /// Tells health how long a transaction and a call may take, and logs the start.
    fn started(&self) {
        let (topology, config) = (self.topology, self.config);
        self.options
            .health
            .set_bound(self.timeout + Duration::from_millis(config.poll_interval_ms));
        self.options
            .health
            .set_call_bound(crate::instance::call_bound(topology));
        telemetry::relay_started(
            &topology.name,
            &self.identity.instance_id,
            &config.table,
            config.shards,
            &self.progress_topic,
        );
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
                    .create_compacted_topic(progress, self.config.shards as i32, &[])
                    .map_err(|e| fail(e.to_string()))?;
                telemetry::progress_topic_created(progress, self.config.shards);
                Ok(())
            }
        }
    }

    /// The partition count of a topic, `None` when it does not exist.
    fn partitions(&self, topic: &str) -> Result<Option<usize>, RelayError> {
        crate::kafka::partition_count(self.reader.client(), topic, self.timeout).map_err(|error| {
            RelayError::Client {
                what: format!("cannot read metadata of {topic}"),
                error,
            }
        })
    }
}

/// The topology's pipeline, when it has outputs (without, each row goes as it is to its
/// default topic).
fn pipeline(topology: &Topology) -> Result<Option<Pipeline>, RelayError> {
    if topology.outputs.is_empty() {
        return Ok(None);
    }
    let codecs =
        crate::codec::Codecs::connect(topology).map_err(|e| RelayError::Config(e.to_string()))?;
    let pipeline = Pipeline::compile_with(topology, codecs).map_err(|issues| {
        RelayError::Config(
            issues
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; "),
        )
    })?;
    Ok(Some(pipeline))
}

/// The topic of each output, by output index: a relay writes Kafka topics only.
fn output_topics(topology: &Topology) -> Result<Vec<String>, RelayError> {
    topology
        .outputs
        .iter()
        .map(|o| match o.target() {
            Some(Target::Topic(t)) => Ok(t.to_string()),
            _ => Err(RelayError::Config(format!(
                "output `{}`: a relay writes Kafka topics only",
                o.name()
            ))),
        })
        .collect()
}

/// The consumer that reads progress records back (read_committed, nothing committed) and
/// topic metadata.
pub(super) fn progress_reader(
    cluster: &Cluster,
    topology: &str,
) -> Result<BaseConsumer, RelayError> {
    cluster
        .config()
        .set("group.id", format!("onceflow.{topology}.outbox-reader"))
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .create()
        .map_err(|error| RelayError::Client {
            what: "cannot create the progress reader".into(),
            error,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const RELAY: &str = "name: relay\ninputs:\n  - postgres_outbox: {url_env: PG}\n";

    #[test]
    fn the_outputs_of_a_relay_are_topics_in_their_order() {
        let topology = Topology::parse_unchecked(&format!(
            "{RELAY}outputs:\n  - {{name: events, topic: order-events}}\n  - {{name: deleted, topic: order-events.deleted}}\n"
        ))
        .unwrap();
        assert_eq!(
            output_topics(&topology).unwrap(),
            ["order-events", "order-events.deleted"]
        );
        let none = Topology::parse_unchecked(RELAY).unwrap();
        assert!(output_topics(&none).unwrap().is_empty());
    }

    #[test]
    fn an_output_that_is_not_a_topic_is_refused_by_name() {
        let topology = Topology::parse_unchecked(&format!(
            "{RELAY}outputs:\n  - {{name: events, topic: order-events}}\n  - name: status\n    postgres: {{url_env: PG, table: s, id_columns: [id], columns: {{id: id}}}}\n"
        ))
        .unwrap();
        let e = output_topics(&topology).unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid topology: output `status`: a relay writes Kafka topics only"
        );
    }
}
