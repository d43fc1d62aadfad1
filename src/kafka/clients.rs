//! Kafka client settings of a job, built in one place. The settings exactly-once depends on
//! are set here last, so nothing from a topology can change them (validation refuses them too).

use std::collections::BTreeMap;

use rdkafka::ClientConfig;
use rdkafka::config::RDKafkaLogLevel;

use crate::topology::{GroupProtocol, Guarantee, Topology};

/// Who this process is: the same topology and instance id after a restart means the same
/// transactional.id, so the restarted producer fences its previous incarnation.
#[derive(Debug, Clone)]
pub struct Identity {
    pub bootstrap_servers: String,
    pub instance_id: String,
}

/// The stable transactional.id of one instance of a topology.
pub fn transactional_id(topology: &Topology, instance_id: &str) -> String {
    format!("onceflow.{}.{}", topology.name, instance_id)
}

/// The cluster of a job's clients outside its transaction (admin calls, the relay, a
/// state restore): its bootstrap servers and the topology's common client settings.
pub fn cluster(topology: &Topology, identity: &Identity) -> super::Cluster {
    let mut cluster = super::Cluster::new(&identity.bootstrap_servers);
    cluster.settings = topology
        .kafka
        .common
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    cluster
}

/// librdkafka's `fetch.queue.backoff.ms` of every consumer here (its default is 1000).
///
/// When a partition's prefetched records pass `queued.min.messages` (100,000) or the queue
/// passes `queued.max.messages.kbytes` (64 MiB), librdkafka postpones that partition's next
/// fetch by this long. With its default, a consumer that works through its queue faster than
/// once a second (64 MiB is 62,000 records of 1 KiB) sits idle for the rest of the second:
/// measured here over 1 KiB records, 50 ms gave an exactly-once job 1.54 times the records/s
/// of 1 s for the same CPU (5 interleaved pairs; docs/benchmarks.md). 50 ms keeps the queue
/// topped up long before it can run dry; `kafka.consumer` can still set another value.
pub const FETCH_QUEUE_BACKOFF_MS: &str = "50";

/// The longest time librdkafka keeps sending a transactional producer's records without a
/// key to one partition of a topic, in milliseconds (its `sticky.partitioning.linger.ms`).
///
/// Every partition a transaction writes to costs it an AddPartitionsToTxn registration
/// (its records wait for it; librdkafka sends one at a time) and a marker at its end, and a
/// registration made while the coordinator still writes the previous transaction's markers
/// is refused and retried 20 ms later. librdkafka's default of 10 ms spreads one 100 ms
/// transaction over about ten partitions; at the commit interval, a transaction writes
/// such records to one or two. Measured at 64 partitions, paired: 1.10 (1.01-1.19) times
/// the records/s for 0.85 (0.75-0.94) of the broker's CPU (docs/benchmarks.md). No longer
/// than 100 ms, so that one instance's writes still move between partitions, and so between
/// the brokers that lead them, several times a second. A topology may set its own.
const MAX_STICKY_PARTITIONING_MS: u64 = 100;

/// librdkafka's `sticky.partitioning.linger.ms` for a job's producer: under exactly-once,
/// the commit interval, at most [`MAX_STICKY_PARTITIONING_MS`]; librdkafka's default
/// otherwise (an idempotent producer registers nothing).
fn sticky_partitioning_ms(guarantee: Guarantee, commit_interval_ms: u64) -> Option<u64> {
    (guarantee == Guarantee::ExactlyOnce)
        .then(|| commit_interval_ms.clamp(1, MAX_STICKY_PARTITIONING_MS))
}

fn apply(config: &mut ClientConfig, settings: &BTreeMap<String, String>) {
    for (key, value) in settings {
        config.set(key, value);
    }
}

/// The consumer: read_committed, no auto-commit, cooperative-sticky assignment (or the
/// KIP-848 protocol's, assigned by the broker).
///
/// cooperative-sticky moves only the partitions that must move on a rebalance, so the other
/// partitions keep flowing and their open transaction is committed, not thrown away.
pub fn consumer_config(topology: &Topology, id: &Identity) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("auto.offset.reset", "earliest")
        .set("fetch.queue.backoff.ms", FETCH_QUEUE_BACKOFF_MS);
    // The consumer's session timeout reaches the job only as a warning logged by librdkafka
    // (crate::fence::ConsumerEnd::FencedAfterSessionTimeout): it is asked for even when the
    // job's own logs show errors only.
    if matches!(
        c.log_level,
        RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error
    ) {
        c.set_log_level(RDKafkaLogLevel::Warning);
    }
    match topology.runtime.group_protocol {
        GroupProtocol::Classic => {
            c.set("partition.assignment.strategy", "cooperative-sticky")
                .set(
                    "session.timeout.ms",
                    topology.runtime.session_timeout_ms.to_string(),
                );
        }
        // KIP-848: assignment and session timeout are the broker's (librdkafka refuses both
        // settings); assignments change incrementally, as cooperative-sticky's do.
        GroupProtocol::Consumer => {
            c.set("group.protocol", "consumer");
        }
    }
    apply(&mut c, &topology.kafka.common);
    apply(&mut c, &topology.kafka.consumer);
    c.set("bootstrap.servers", &id.bootstrap_servers)
        .set("group.id", topology.group_id())
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "false");
    if topology.runtime.static_membership {
        c.set("group.instance.id", &id.instance_id);
    }
    c
}

/// The producer: transactional with its stable transactional.id under exactly-once,
/// idempotent only under at-least-once.
pub fn producer_config(topology: &Topology, id: &Identity) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("linger.ms", "5");
    if let Some(ms) = sticky_partitioning_ms(
        topology.runtime.guarantee,
        topology.runtime.commit_interval_ms,
    ) {
        c.set("sticky.partitioning.linger.ms", ms.to_string());
    }
    apply(&mut c, &topology.kafka.common);
    apply(&mut c, &topology.kafka.producer);
    // Only failed deliveries are reported: the transaction owner waits for the rest with
    // one flush instead of serving a report per batch (txn::collector::drain).
    c.set("bootstrap.servers", &id.bootstrap_servers)
        .set("enable.idempotence", "true")
        .set("delivery.report.only.error", "true");
    if topology.runtime.guarantee == Guarantee::ExactlyOnce {
        c.set(
            "transactional.id",
            transactional_id(topology, &id.instance_id),
        )
        .set(
            "transaction.timeout.ms",
            topology.runtime.transaction_timeout_ms.to_string(),
        );
    }
    c
}

/// The default instance id: the host name, which is stable for a StatefulSet pod or a VM.
pub fn default_instance_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "default".to_string())
}

/// The librdkafka onceflow is built with: its version, and its `builtin.features` (the
/// compression codecs, SASL mechanisms and TLS its clients can use), as `onceflow --version`
/// prints them.
pub fn librdkafka() -> (String, String) {
    let (_, version) = rdkafka::util::get_rdkafka_version();
    let features = ClientConfig::new()
        .create_native_config()
        .and_then(|c| c.get("builtin.features"))
        .unwrap_or_else(|e| format!("unknown ({e})"));
    (version, features)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topology(extra: &str) -> Topology {
        let text =
            format!("name: orders\ninputs: [{{topic: in}}]\noutputs: [{{topic: out}}]\n{extra}");
        serde_saphyr::from_str(&text).unwrap()
    }

    fn id() -> Identity {
        Identity {
            bootstrap_servers: "b:9092".into(),
            instance_id: "pod-0".into(),
        }
    }

    #[test]
    fn transactional_id_is_stable_per_topology_and_instance() {
        assert_eq!(
            transactional_id(&topology(""), "pod-0"),
            "onceflow.orders.pod-0"
        );
    }

    #[test]
    fn exactly_once_settings_win_over_user_settings() {
        // Validation refuses these; even a topology that skipped it cannot change them.
        let t = topology(
            "kafka: {common: {isolation.level: read_uncommitted}, consumer: {enable.auto.commit: 'true'}, producer: {transactional.id: x, linger.ms: '20'}}\n",
        );
        let c = consumer_config(&t, &id());
        assert_eq!(c.get("isolation.level"), Some("read_committed"));
        assert_eq!(c.get("enable.auto.commit"), Some("false"));
        assert_eq!(c.get("group.id"), Some("onceflow.orders"));
        assert_eq!(c.get("group.instance.id"), Some("pod-0"));
        let p = producer_config(&t, &id());
        assert_eq!(p.get("transactional.id"), Some("onceflow.orders.pod-0"));
        assert_eq!(p.get("linger.ms"), Some("20"));
        assert_eq!(p.get("transaction.timeout.ms"), Some("10000"));
    }

    #[test]
    fn at_least_once_has_no_transactional_id() {
        let t = topology("runtime: {guarantee: at_least_once}\n");
        let p = producer_config(&t, &id());
        assert_eq!(p.get("transactional.id"), None);
        assert_eq!(p.get("enable.idempotence"), Some("true"));
        assert_eq!(
            consumer_config(&t, &id()).get("isolation.level"),
            Some("read_committed")
        );
    }

    #[test]
    fn only_failed_deliveries_are_reported() {
        let t = topology("kafka: {producer: {delivery.report.only.error: 'false'}}\n");
        let p = producer_config(&t, &id());
        assert_eq!(p.get("delivery.report.only.error"), Some("true"));
    }

    #[test]
    fn a_full_prefetch_queue_postpones_the_next_fetch_by_50_ms_not_a_second() {
        let c = consumer_config(&topology(""), &id());
        assert_eq!(c.get("fetch.queue.backoff.ms"), Some("50"));
        assert!(c.create_native_config().is_ok(), "librdkafka knows it");
        let t = topology("kafka: {consumer: {fetch.queue.backoff.ms: '200'}}\n");
        assert_eq!(
            consumer_config(&t, &id()).get("fetch.queue.backoff.ms"),
            Some("200"),
            "a topology may set its own"
        );
    }

    #[test]
    fn a_transaction_keeps_records_without_a_key_on_one_partition_up_to_100_ms() {
        use Guarantee::{AtLeastOnce, ExactlyOnce};
        assert_eq!(sticky_partitioning_ms(ExactlyOnce, 100), Some(100));
        assert_eq!(sticky_partitioning_ms(ExactlyOnce, 40), Some(40));
        assert_eq!(sticky_partitioning_ms(ExactlyOnce, 1000), Some(100));
        assert_eq!(sticky_partitioning_ms(ExactlyOnce, 0), Some(1));
        assert_eq!(sticky_partitioning_ms(AtLeastOnce, 100), None);
        let p = producer_config(&topology("runtime: {commit_interval_ms: 50}\n"), &id());
        assert_eq!(p.get("sticky.partitioning.linger.ms"), Some("50"));
        assert!(p.create_native_config().is_ok(), "librdkafka takes it");
        let t = topology("runtime: {guarantee: at_least_once}\n");
        assert_eq!(
            producer_config(&t, &id()).get("sticky.partitioning.linger.ms"),
            None,
            "librdkafka's default"
        );
        let t = topology("kafka: {producer: {sticky.partitioning.linger.ms: '10'}}\n");
        assert_eq!(
            producer_config(&t, &id()).get("sticky.partitioning.linger.ms"),
            Some("10"),
            "a topology may set its own"
        );
    }

    #[test]
    fn static_membership_can_be_turned_off() {
        let t = topology("runtime: {static_membership: false}\n");
        assert_eq!(consumer_config(&t, &id()).get("group.instance.id"), None);
    }

    #[test]
    fn the_consumer_protocol_leaves_assignment_and_session_to_the_broker() {
        let classic = consumer_config(&topology(""), &id());
        assert_eq!(
            classic.get("partition.assignment.strategy"),
            Some("cooperative-sticky")
        );
        assert_eq!(classic.get("group.protocol"), None);
        let t = topology("runtime: {group_protocol: consumer}\n");
        let c = consumer_config(&t, &id());
        assert_eq!(c.get("group.protocol"), Some("consumer"));
        // librdkafka refuses both with group.protocol=consumer.
        assert_eq!(c.get("partition.assignment.strategy"), None);
        assert_eq!(c.get("session.timeout.ms"), None);
        assert!(c.create_native_config().is_ok());
    }

    #[test]
    fn librdkafka_is_built_with_every_compression_kafka_has() {
        let (version, features) = librdkafka();
        assert!(version.starts_with("2."), "{version}");
        let features: Vec<&str> = features.split(',').collect();
        for codec in ["gzip", "snappy", "lz4", "zstd"] {
            assert!(features.contains(&codec), "no {codec} in {features:?}");
        }
    }
}
