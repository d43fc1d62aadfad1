//! The consumer's fence rule (src/fence.rs) against fences a real broker gives only by chance,
//! pushed on librdkafka's mock cluster. The job runs in-process as `onceflow run` runs it;
//! the mock fakes transactions, so nothing here is a proof of exactly-once (crash_recovery
//! and the chaos suite are), only of which fences the job survives.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::mock::MockCluster;
use onceflow::engine::{self, EngineError};
use onceflow::instance::{Identity, RunOptions, Summary};
use onceflow::kafka::clients;
use onceflow::topology::Topology;
use rdkafka::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka_sys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_FENCED_INSTANCE_ID;

/// Kafka API keys of the requests the test waits for.
const JOIN_GROUP: i16 = 11;
const HEARTBEAT: i16 = 12;
const TXN_OFFSET_COMMIT: i16 = 28;

/// The group coordinator's broker, the transaction coordinator's, the partitions' leader.
const GROUP_COORDINATOR: i32 = 1;
const TXN_COORDINATOR: i32 = 2;
const LEADER: i32 = 3;

/// The span of the fence rule (src/fence.rs, `FENCE_WINDOW`): a second fence counted within
/// it stops the job.
const FENCE_WINDOW: Duration = Duration::from_secs(30);

/// The consumer's session timeout.
const SESSION: Duration = Duration::from_secs(6);

/// A pass-through job from `in` to `out` in group `g`, instance `a`, with its transaction
/// coordinator, group coordinator and partition leaders on brokers of their own.
fn job(cluster: &MockCluster) -> (Topology, Identity) {
    let yaml = format!(
        "name: fences\ninputs:\n  - topic: in\npipeline:\n  - set_header: {{name: processed-by, value: onceflow}}\noutputs:\n  - topic: out\nruntime:\n  session_timeout_ms: {}\n  group_protocol: classic\n  commit_interval_ms: 200\n",
        SESSION.as_millis()
    );
    let mut topology = Topology::parse(&yaml, "fences.yaml").expect("topology");
    topology.group_id = Some("g".into());
    let identity = Identity {
        bootstrap_servers: cluster.bootstrap_servers().to_string(),
        instance_id: "a".into(),
    };
    for topic in ["in", "out"] {
        cluster.create_topic(topic, 2).expect("topic");
        for p in 0..2 {
            cluster.set_leader(topic, p, LEADER);
        }
    }
    cluster.set_coordinator("group", "g", GROUP_COORDINATOR);
    let txn_id = clients::transactional_id(&topology, &identity.instance_id);
    cluster.set_coordinator("transaction", &txn_id, TXN_COORDINATOR);
    (topology, identity)
}

/// Writes a record to `in` every 5 ms until `stop`.
fn feed(bootstrap: String, stop: Arc<AtomicBool>) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let producer: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .create()
            .expect("feed producer");
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let (key, value) = (n.to_string(), format!("{{\"id\":{n}}}"));
            let _ = producer.send(BaseRecord::to("in").key(&key).payload(&value));
            producer.poll(Duration::from_millis(5));
            n += 1;
        }
        let _ = producer.flush(Duration::from_secs(5));
    })
}

/// How many requests of `api_key` the cluster received since it began tracking.
fn count(cluster: &MockCluster, api_key: i16) -> usize {
    let requests = cluster.requests().expect("requests");
    requests.iter().filter(|(key, _)| *key == api_key).count()
}

/// Waits until the job joined again (a JoinGroup after the first `joins`) and committed
/// offsets after that join; panics if the job ended or `timeout` passed first.
fn wait_for_join_and_commit(
    cluster: &MockCluster,
    joins: usize,
    job: &JoinHandle<Result<Summary, EngineError>>,
    what: &str,
    timeout: Duration,
) {
    let deadline = Instant::now() + timeout;
    loop {
        let requests = cluster.requests().expect("requests");
        let join = requests
            .iter()
            .enumerate()
            .filter(|(_, (key, _))| *key == JOIN_GROUP)
            .nth(joins)
            .map(|(i, _)| i);
        if let Some(i) = join
            && requests[i..]
                .iter()
                .any(|(key, _)| *key == TXN_OFFSET_COMMIT)
        {
            return;
        }
        assert!(!job.is_finished(), "{what}: the job ended");
        assert!(Instant::now() < deadline, "{what}: not within {timeout:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A zombie's join fences its replacement once (the replacement joins again). Seconds later
/// the group coordinator's broker fails: no heartbeat is answered for the session timeout,
/// librdkafka times the session out itself and joins again, and the new coordinator answers
/// a request of the old membership `FENCED_INSTANCE_ID`. That second fence, within 30 s of
/// the first, is of the member's own expired session, not of another process: the job joins
/// again and carries on. Counted as the rule counts a second process's fence, it would stop
/// the job with status 1 (seen in a chaos round: a zombie, then the group coordinator's
/// SIGKILL 25 s later).
#[test]
fn a_fence_of_the_members_own_expired_session_does_not_count_against_it() {
    onceflow::telemetry::init_tracing(false);
    let cluster = MockCluster::start(3).expect("mock cluster");
    let (topology, identity) = job(&cluster);
    cluster.track_requests().expect("tracking");
    let stop_feed = Arc::new(AtomicBool::new(false));
    let feeder = feed(
        cluster.bootstrap_servers().to_string(),
        Arc::clone(&stop_feed),
    );
    let shutdown = Arc::new(AtomicBool::new(false));
    let job = {
        let shutdown = Arc::clone(&shutdown);
        std::thread::spawn(move || {
            engine::run(&topology, &identity, &RunOptions::default(), &shutdown)
        })
    };
    let start = Duration::from_secs(60);
    wait_for_join_and_commit(&cluster, 0, &job, "the first join", start);

    // Fence 1: the next heartbeat is answered as a zombie's join makes it answered.
    let joins = count(&cluster, JOIN_GROUP);
    let fenced = Instant::now();
    cluster
        .push_request_errors(HEARTBEAT, &[RD_KAFKA_RESP_ERR_FENCED_INSTANCE_ID])
        .expect("heartbeat error");
    wait_for_join_and_commit(
        &cluster,
        joins,
        &job,
        "the join after the first fence",
        start,
    );

    // Fence 2: the group coordinator's broker goes down for longer than the session; the
    // member's join at the new coordinator is refused for its old membership.
    let joins = count(&cluster, JOIN_GROUP);
    cluster.set_broker_up(GROUP_COORDINATOR, false);
    cluster
        .push_request_errors(JOIN_GROUP, &[RD_KAFKA_RESP_ERR_FENCED_INSTANCE_ID])
        .expect("join error");
    std::thread::sleep(SESSION + Duration::from_secs(2));
    cluster.set_coordinator("group", "g", GROUP_COORDINATOR + 1);
    wait_for_join_and_commit(
        &cluster,
        joins + 1,
        &job,
        "the join after the coordinator's failover",
        start,
    );
    let second = fenced.elapsed();
    eprintln!("the job joined again and committed {second:?} after the first fence");
    assert!(
        second < FENCE_WINDOW,
        "the second fence came {second:?} after the first: outside the rule's window, the test \
         proves nothing"
    );

    shutdown.store(true, Ordering::Relaxed);
    let result = job.join().expect("job thread");
    stop_feed.store(true, Ordering::Relaxed);
    feeder.join().expect("feed thread");
    result.expect("the job stops cleanly, on its shutdown");
}
