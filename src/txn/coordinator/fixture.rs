//! The coordinator's tests' fixture, on librdkafka's mock cluster: it speaks the
//! transactional protocol (so the calls succeed or fail as they would) but enforces nothing,
//! so the tests check what the owner does, never that anything is exactly-once (the
//! integration tests on a real broker do that).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use super::{Added, Consumed, Outgoing, Txn, TxnSettings};
use crate::kafka::embedded::EmbeddedCluster;
use crate::record::{ErrorKind, Origin, Record, RecordError, Stage};
use crate::telemetry::health::Health;
use crate::topology::Guarantee;
use crate::txn::{Failure, Participant, ParticipantError, Refusal, Severity};

pub(super) const TOPIC: &str = "in";

/// What a participant was asked to do, in order, shared with the test.
pub(super) type Log = Arc<Mutex<Vec<String>>>;

#[derive(Debug, thiserror::Error)]
#[error("{severity:?} failure")]
pub(super) struct StubError {
    pub(super) severity: Severity,
    pub(super) refused: Option<Origin>,
}

impl Failure for StubError {
    fn severity(&self) -> Severity {
        self.severity
    }
    fn refusals(&self) -> Vec<Refusal> {
        self.refused
            .iter()
            .map(|o| Refusal {
                origin: Some(o.clone()),
                failure: RecordError {
                    kind: ErrorKind::Rejected,
                    stage: Stage::Output {
                        index: 0,
                        name: "stub".into(),
                    },
                    message: "refused".into(),
                },
                by: "stub",
            })
            .collect()
    }
}

/// A participant that logs every call and fails its next prepare as told.
struct Stub {
    name: &'static str,
    log: Log,
    fail_prepare: Arc<Mutex<Option<StubError>>>,
    staged: usize,
    full_at: usize,
}

impl Participant for Stub {
    fn stage(&mut self, produced: &[(usize, Record)]) -> Result<(), ParticipantError> {
        self.staged += produced.len();
        Ok(())
    }
    fn discard_record(&mut self, _: &Origin) {}
    fn is_full(&self) -> bool {
        self.staged >= self.full_at
    }
    fn prepare(&mut self, _: Instant) -> Result<(), ParticipantError> {
        self.log
            .lock()
            .unwrap()
            .push(format!("{} prepare", self.name));
        match self.fail_prepare.lock().unwrap().take() {
            Some(e) => Err(Box::new(e)),
            None => Ok(()),
        }
    }
    fn commit(&mut self) -> Result<bool, ParticipantError> {
        self.log
            .lock()
            .unwrap()
            .push(format!("{} commit", self.name));
        Ok(self.staged > 0)
    }
    fn discard(&mut self) {
        self.log
            .lock()
            .unwrap()
            .push(format!("{} discard", self.name));
        self.staged = 0;
    }
}

pub(super) struct Fixture {
    pub(super) cluster: EmbeddedCluster,
    pub(super) consumer: BaseConsumer,
    pub(super) txn: Txn,
    pub(super) log: Log,
    pub(super) fail_second: Arc<Mutex<Option<StubError>>>,
}

pub(super) fn fixture(abort_every: Option<u64>) -> Fixture {
    let cluster = EmbeddedCluster::start(1).expect("mock cluster");
    cluster.create_topic(TOPIC, 2).expect("topic");
    let bootstrap = cluster.bootstrap_servers().to_string();
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", "coordinator-test")
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(TOPIC, 0, Offset::Beginning)
        .unwrap();
    tpl.add_partition_offset(TOPIC, 1, Offset::Beginning)
        .unwrap();
    consumer.assign(&tpl).expect("assign");
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &bootstrap)
        .set("transactional.id", "coordinator-test");
    let settings = TxnSettings {
        commit_interval: Duration::from_secs(3600),
        max_records: 1_000,
        max_bytes: 1 << 30,
        operation_timeout: Duration::from_secs(10),
        abort_every,
        lose_commit_every: None,
        exit_after_participant_commit: None,
        guarantee: Guarantee::ExactlyOnce,
        overlap_commits: false,
    };
    let log = Log::default();
    let fail_second = Arc::new(Mutex::new(None));
    let stub = |name, fail| {
        Box::new(Stub {
            name,
            log: Arc::clone(&log),
            fail_prepare: fail,
            staged: 0,
            full_at: 3,
        }) as Box<dyn Participant>
    };
    let txn = Txn::new(config, settings, Arc::new(Health::default()))
        .expect("init_transactions on the mock cluster")
        .with_participants(vec![
            stub("first", Arc::new(Mutex::new(None))),
            stub("second", Arc::clone(&fail_second)),
        ]);
    Fixture {
        cluster,
        consumer,
        txn,
        log,
        fail_second,
    }
}

pub(super) fn origin(partition: i32, offset: i64) -> Origin {
    Origin {
        topic: TOPIC.into(),
        partition,
        offset,
    }
}

pub(super) fn record(origin: &Origin) -> Record {
    Record {
        key: None,
        value: Some(b"v".to_vec()),
        headers: Vec::new(),
        timestamp: None,
        origin: origin.clone(),
    }
}

/// Stages and adds the record at `o` (its output goes to the participants only).
pub(super) fn add(f: &mut Fixture, o: &Origin) {
    f.txn.stage(&[(0, record(o))]).expect("staged");
    assert_eq!(
        f.txn.add(&f.consumer, Consumed::at(o, 1), &[]).unwrap(),
        Added::Yes
    );
}

pub(super) fn log(f: &Fixture) -> Vec<String> {
    std::mem::take(&mut *f.log.lock().unwrap())
}

/// EndTxn: the request behind commit_transaction.
pub(super) const END_TXN: i16 = 26;
/// TxnOffsetCommit: the request behind send_offsets_to_transaction, to the group
/// coordinator.
pub(super) const TXN_OFFSET_COMMIT: i16 = 28;

pub(super) const OUT: &str = "out";

/// A fixture whose transaction has Kafka outputs only and commits in the background.
pub(super) fn overlapping() -> Fixture {
    kafka_only(true, 1_000)
}

/// A fixture whose transaction has Kafka outputs only.
pub(super) fn kafka_only(overlap_commits: bool, max_records: u64) -> Fixture {
    let mut f = fixture(None);
    f.cluster.create_topic(OUT, 1).expect("output topic");
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", f.cluster.bootstrap_servers())
        .set("transactional.id", "coordinator-overlap-test");
    let settings = TxnSettings {
        commit_interval: Duration::from_secs(3600),
        max_records,
        max_bytes: 1 << 30,
        operation_timeout: Duration::from_secs(10),
        abort_every: None,
        lose_commit_every: None,
        exit_after_participant_commit: None,
        guarantee: Guarantee::ExactlyOnce,
        overlap_commits,
    };
    f.txn = Txn::new(config, settings, Arc::new(Health::default()))
        .expect("init_transactions on the mock cluster");
    f
}

/// Adds the record at `o` with one output to [`OUT`].
pub(super) fn try_add_out(f: &mut Fixture, o: &Origin) -> Added {
    f.txn
        .add(
            &f.consumer,
            Consumed::at(o, 1),
            &[Outgoing {
                topic: OUT,
                record: record(o),
                lineage: true,
            }],
        )
        .expect("added")
}

pub(super) fn add_out(f: &mut Fixture, o: &Origin) {
    assert_eq!(try_add_out(f, o), Added::Yes, "{o:?}");
}

/// Reads what the consumer has to give, up to `n` records.
pub(super) fn read(f: &Fixture, n: usize) -> Vec<Origin> {
    use rdkafka::message::Message;
    let mut read = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while read.len() < n && Instant::now() < deadline {
        if let Some(Ok(m)) = f.consumer.poll(Duration::from_millis(100)) {
            read.push(origin(m.partition(), m.offset()));
        }
    }
    read
}

/// The first offset read again from each partition.
pub(super) fn read_again(f: &Fixture) -> HashMap<i32, i64> {
    let mut first = HashMap::new();
    for o in read(f, 40) {
        first.entry(o.partition).or_insert(o.offset);
        if first.len() == 2 {
            break;
        }
    }
    first
}

/// Partitions 0 and 1 come again from `p0` and `p1`.
pub(super) fn assert_comes_again(f: &Fixture, p0: &Origin, p1: &Origin, why: &str) {
    let first = read_again(f);
    assert_eq!(first.get(&0), Some(&p0.offset), "partition 0: {why}");
    assert_eq!(first.get(&1), Some(&p1.offset), "partition 1: {why}");
}

/// The next EndTxn fails as after a coordinator failover: fatal, the producer is rebuilt.
pub(super) fn fail_next_end_txn(f: &Fixture) {
    f.cluster
        .push_request_errors(
            END_TXN,
            &[rdkafka_sys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_INVALID_TXN_STATE],
        )
        .unwrap();
}

/// Feeds both partitions and reads everything: the records of partition 0 and of 1.
pub(super) fn fed(f: &Fixture) -> (Vec<Origin>, Vec<Origin>) {
    f.cluster.feed(TOPIC, 40).expect("fed");
    let (p0, p1): (Vec<Origin>, Vec<Origin>) =
        read(f, 40).into_iter().partition(|o| o.partition == 0);
    assert!(p0.len() >= 3 && p1.len() >= 3, "both partitions fed");
    (p0, p1)
}
