//! The changes vendor/patches makes to librdkafka, each held by a test that fails without it
//! (vendor/README.md). They run on librdkafka's mock cluster, in-process, with no broker:
//! slowed responses, refused requests and the requests received are the mock's.
//!
//! The tests drive rdkafka and the mock's C API directly, not onceflow: they hold librdkafka
//! to its behaviour, whatever onceflow does with it.

mod common;

use std::time::{Duration, Instant};

use common::mock::MockCluster;
use rdkafka::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

/// A 3-broker mock cluster with topic `t` (1 partition), the transaction coordinator of
/// `transactional_id` on broker 1 and group `g`'s on broker 2; a transactional producer with
/// `settings` added, its transactions initialized; and group `g`'s metadata, for
/// `send_offsets_to_transaction`.
fn transactional(
    transactional_id: &str,
    settings: &[(&str, &str)],
) -> (
    MockCluster,
    BaseProducer,
    rdkafka::consumer::ConsumerGroupMetadata,
) {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let cluster = MockCluster::start(3).unwrap();
    cluster.create_topic("t", 1).unwrap();
    cluster.set_coordinator("transaction", transactional_id, 1);
    cluster.set_coordinator("group", "g", 2);
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", cluster.bootstrap_servers())
        .set("transactional.id", transactional_id);
    for (key, value) in settings {
        config.set(*key, *value);
    }
    let producer: BaseProducer = config.create().unwrap();
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", cluster.bootstrap_servers())
        .set("group.id", "g")
        .create()
        .unwrap();
    let metadata = consumer.group_metadata().expect("the group's metadata");
    producer.init_transactions(Duration::from_secs(10)).unwrap();
    (cluster, producer, metadata)
}

/// The idempotent (and so the transactional) producer may keep up to five requests
/// in flight per partition. Stock librdkafka 2.12 compares that limit with the
/// partition's messages in flight, so a batch of five or more records held the
/// partition to one request per round trip (vendor/patches/0002-*). With a round trip of
/// 1.5 s and batches of 10 records, one round trip then acknowledges 10 records; with
/// the fix five batches travel together.
#[test]
fn an_idempotent_producer_keeps_several_requests_in_flight_on_one_partition() {
    let cluster = MockCluster::start(1).unwrap();
    cluster.create_topic("t", 1).unwrap();
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", cluster.bootstrap_servers())
        .set("enable.idempotence", "true")
        .set("linger.ms", "200")
        .set("batch.num.messages", "10")
        .create()
        .unwrap();
    // A first record: the producer id and the partition's leader are known before the
    // round trip is slowed down.
    producer
        .send(BaseRecord::<(), _>::to("t").payload("first"))
        .unwrap();
    producer.flush(Duration::from_secs(10)).unwrap();
    let rtt = Duration::from_millis(1500);
    cluster.set_round_trip_time(1, rtt).unwrap();
    let sent = Instant::now();
    for n in 0..100 {
        let value = format!("record {n}");
        producer
            .send(BaseRecord::<(), _>::to("t").payload(&value))
            .unwrap();
    }
    // Short of two round trips: one request at a time has had one answer by then (10
    // records); five sent together, five answers (50), with 1.2 s to spare for a slow
    // machine.
    while sent.elapsed() < rtt * 9 / 5 {
        producer.poll(Duration::from_millis(5));
    }
    let acknowledged = 100 - producer.in_flight_count();
    assert!(
        acknowledged >= 30,
        "{acknowledged} records acknowledged within two round trips: one request at a time"
    );
    producer.flush(Duration::from_secs(30)).unwrap();
}

/// The broker thread's wake-ups, as librdkafka's statistics count them.
#[derive(Default)]
struct Wakeups(std::sync::Mutex<Option<u64>>);

impl rdkafka::ClientContext for Wakeups {
    fn stats(&self, statistics: rdkafka::Statistics) {
        let total = statistics
            .brokers
            .values()
            .filter(|b| b.nodeid >= 0)
            .filter_map(|b| b.wakeups)
            .sum();
        *self.0.lock().unwrap() = Some(total);
    }
}

impl rdkafka::producer::ProducerContext for Wakeups {
    type DeliveryOpaque = ();
    fn delivery(&self, _: &rdkafka::producer::DeliveryResult<'_>, _: ()) {}
}

/// While a partition's five requests are in flight and another batch is ready, the
/// broker thread sleeps until a response comes. Stock librdkafka (and the first fix)
/// found the batch ready before looking at the window, asked to be woken at once, and
/// called `poll()` with a zero timeout in a loop for the whole round trip: tens of
/// thousands of wake-ups a second, a quarter of the exactly-once job's CPU at 8
/// partitions (vendor/patches/0002-*).
#[test]
fn a_producer_whose_window_is_full_sleeps_until_a_response_comes() {
    let cluster = MockCluster::start(1).unwrap();
    cluster.create_topic("t", 1).unwrap();
    let producer: BaseProducer<Wakeups> = ClientConfig::new()
        .set("bootstrap.servers", cluster.bootstrap_servers())
        .set("enable.idempotence", "true")
        .set("linger.ms", "0")
        .set("batch.num.messages", "10")
        .set("statistics.interval.ms", "100")
        .create_with_context(Wakeups::default())
        .unwrap();
    producer
        .send(BaseRecord::<(), _>::to("t").payload("first"))
        .unwrap();
    producer.flush(Duration::from_secs(10)).unwrap();
    let rtt = Duration::from_millis(2000);
    cluster.set_round_trip_time(1, rtt).unwrap();
    // Five requests of 10 fill the window; five more batches stay ready behind it.
    for n in 0..100 {
        let value = format!("record {n}");
        producer
            .send(BaseRecord::<(), _>::to("t").payload(&value))
            .unwrap();
    }
    let wakeups_at = |wait: Duration| {
        let until = Instant::now() + wait;
        while Instant::now() < until {
            producer.poll(Duration::from_millis(10));
        }
        producer.context().0.lock().unwrap().unwrap()
    };
    let first = wakeups_at(Duration::from_millis(500));
    let second = wakeups_at(Duration::from_millis(1000));
    assert!(
        second - first < 500,
        "{} wake-ups of the broker threads in about 1 s of a round trip: spinning",
        second - first
    );
    producer.flush(Duration::from_secs(30)).unwrap();
}

/// A fetched record without headers is marked as such as it is parsed
/// (vendor/patches/0003-*): reading its headers then costs no allocation. The
/// shortest header sections that are not empty (one header with an empty key and a null
/// value is three bytes) must still read back whole, as must records with none.
#[test]
fn headers_read_back_as_written_with_records_without_headers_among_them() {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::message::{Header, Headers, Message, OwnedHeaders};

    let cluster = MockCluster::start(1).unwrap();
    cluster.create_topic("h", 1).unwrap();
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", cluster.bootstrap_servers())
        .create()
        .unwrap();
    type Written = Vec<(&'static str, Option<&'static [u8]>)>;
    let cases: Vec<Option<Written>> = vec![
        None,
        Some(vec![("", None)]),
        None,
        Some(vec![("", Some(b""))]),
        Some(vec![
            ("k", Some(b"v")),
            ("", None),
            ("trace", Some(b"00-ab-01")),
        ]),
        None,
    ];
    for (n, case) in cases.iter().enumerate() {
        let value = format!("record {n}");
        let mut record = BaseRecord::<(), _>::to("h").payload(&value);
        if let Some(headers) = case {
            let mut owned = OwnedHeaders::new();
            for (key, value) in headers {
                owned = owned.insert(Header { key, value: *value });
            }
            record = record.headers(owned);
        }
        producer.send(record).unwrap();
    }
    producer.flush(Duration::from_secs(10)).unwrap();

    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", cluster.bootstrap_servers())
        .set("group.id", "headers")
        .set("auto.offset.reset", "earliest")
        .create()
        .unwrap();
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition_offset("h", 0, rdkafka::Offset::Beginning)
        .unwrap();
    consumer.assign(&tpl).unwrap();
    let mut read = Vec::new();
    let until = Instant::now() + Duration::from_secs(20);
    while read.len() < cases.len() && Instant::now() < until {
        let Some(msg) = consumer.poll(Duration::from_millis(100)) else {
            continue;
        };
        let msg = msg.unwrap();
        read.push(msg.headers().map(|hs| {
            hs.iter()
                .map(|h| (h.key.to_string(), h.value.map(<[u8]>::to_vec)))
                .collect::<Vec<_>>()
        }));
    }
    let expected: Vec<_> = cases
        .iter()
        .map(|case| {
            case.as_ref().map(|hs| {
                hs.iter()
                    .map(|(k, v)| (k.to_string(), v.map(<[u8]>::to_vec)))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    assert_eq!(read, expected);
}

/// A transaction's first AddPartitionsToTxn is often refused with
/// CONCURRENT_TRANSACTIONS: the coordinator is still writing the previous transaction's
/// markers, usually for a few milliseconds more. Stock librdkafka retried after a
/// constant 20 ms, and the transaction's records waited as long (vendor/patches/0004-*);
/// the retry now comes after 1 ms, doubling up to 20 ms. Five refusals in a row: six
/// requests, 1 + 2 + 4 + 8 + 16 = 31 ms of backoff between them, against at least
/// 100 ms before.
#[test]
fn a_refused_partition_registration_is_retried_sooner_and_sooner() {
    use rdkafka::producer::Producer;
    use rdkafka_sys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_CONCURRENT_TRANSACTIONS;

    const ADD_PARTITIONS_TO_TXN: i16 = 24;
    let cluster = MockCluster::start(1).unwrap();
    cluster.create_topic("t", 1).unwrap();
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", cluster.bootstrap_servers())
        .set("transactional.id", "registration-retries")
        .create()
        .unwrap();
    let timeout = Duration::from_secs(10);
    producer.init_transactions(timeout).unwrap();
    cluster
        .push_request_errors(
            ADD_PARTITIONS_TO_TXN,
            &[RD_KAFKA_RESP_ERR_CONCURRENT_TRANSACTIONS; 5],
        )
        .unwrap();
    cluster.track_requests().unwrap();
    producer.begin_transaction().unwrap();
    producer
        .send(BaseRecord::<(), _>::to("t").payload("registered at last"))
        .unwrap();
    producer.commit_transaction(timeout).unwrap();
    let at: Vec<i64> = cluster
        .requests()
        .unwrap()
        .into_iter()
        .filter(|&(key, _)| key == ADD_PARTITIONS_TO_TXN)
        .map(|(_, at)| at)
        .collect();
    assert_eq!(
        at.len(),
        6,
        "AddPartitionsToTxn requests received at {at:?}"
    );
    let gaps_ms: Vec<f64> = at.windows(2).map(|w| (w[1] - w[0]) as f64 / 1e3).collect();
    let total: f64 = gaps_ms.iter().sum();
    // 31 ms of backoff and six round trips to an in-process broker; a constant 20 ms
    // backoff cannot take less than 100.
    assert!(
        total < 85.0,
        "five retries took {total:.1} ms (gaps {gaps_ms:?}): a constant backoff"
    );
    assert!(
        gaps_ms[4] >= 16.0,
        "the fifth retry came {:.1} ms after the fourth refusal: the backoff does not double",
        gaps_ms[4]
    );
}

/// (vendor/patches/0006-*): `send_offsets_to_transaction` with the transaction coordinator's
/// broker down returns within its timeout too. Its first step, AddOffsetsToTxn, goes to the
/// transaction coordinator; stock librdkafka 2.12 bounds that request by `socket.timeout.ms`
/// (60 s) for each attempt and checks the call's own timeout only when an answer comes (as the
/// coordinator's broker was SIGKILLed: onceflow's watchdog stopped the process after 15 s).
#[test]
fn send_offsets_returns_within_its_timeout_when_the_transaction_coordinator_is_down() {
    use rdkafka::{Offset, TopicPartitionList};

    let (cluster, producer, metadata) = transactional("add-offsets-timeout", &[]);
    producer.begin_transaction().unwrap();
    producer
        .send(BaseRecord::<(), _>::to("t").payload("in the transaction"))
        .unwrap();
    cluster.set_broker_up(1, false);

    let producer = std::sync::Arc::new(producer);
    let calling = std::sync::Arc::clone(&producer);
    let (done, result) = std::sync::mpsc::channel();
    let started = Instant::now();
    std::thread::spawn(move || {
        let mut offsets = TopicPartitionList::new();
        offsets
            .add_partition_offset("t", 0, Offset::Offset(1))
            .expect("an offset");
        let r = calling.send_offsets_to_transaction(&offsets, &metadata, Duration::from_secs(2));
        done.send(r).ok();
    });
    let returned = result.recv_timeout(Duration::from_secs(30));
    let took = started.elapsed();
    eprintln!("send_offsets_to_transaction returned after {took:?}: {returned:?}");
    if returned.is_err() {
        // Let the call return, so that the process can end.
        cluster.set_broker_up(1, true);
    }
    returned
        .unwrap_or_else(|_| {
            panic!("send_offsets_to_transaction with a 2 s timeout has not returned after 30 s")
        })
        .expect_err("offsets sent while the transaction coordinator is down");
    assert!(
        took >= Duration::from_millis(1_900) && took < Duration::from_secs(6),
        "the call returned after {took:?} with a 2 s timeout"
    );
}

/// A request to a coordinator that does not come up fails at its timeout
/// (vendor/patches/0005-*): `send_offsets_to_transaction` with the group coordinator's broker
/// down returns TIMED_OUT, an error that asks for an abort, once its 2 s have passed. Stock
/// librdkafka 2.12 never checks that timeout (librdkafka#5456): the call waits until the
/// coordinator comes back, which here it does only after the test's 30 s.
#[test]
fn send_offsets_returns_within_its_timeout_when_the_group_coordinator_is_down() {
    use rdkafka::error::{KafkaError, RDKafkaErrorCode};
    use rdkafka::{Offset, TopicPartitionList};

    let (cluster, producer, metadata) = transactional("offsets-timeout", &[]);
    producer.begin_transaction().unwrap();
    producer
        .send(BaseRecord::<(), _>::to("t").payload("in the transaction"))
        .unwrap();
    cluster.set_broker_up(2, false);

    let producer = std::sync::Arc::new(producer);
    let calling = std::sync::Arc::clone(&producer);
    let (done, result) = std::sync::mpsc::channel();
    let started = Instant::now();
    std::thread::spawn(move || {
        let mut offsets = TopicPartitionList::new();
        offsets
            .add_partition_offset("t", 0, Offset::Offset(1))
            .expect("an offset");
        let r = calling.send_offsets_to_transaction(&offsets, &metadata, Duration::from_secs(2));
        done.send(r).ok();
    });
    let returned = result.recv_timeout(Duration::from_secs(30));
    let took = started.elapsed();
    eprintln!("send_offsets_to_transaction returned after {took:?}: {returned:?}");
    if returned.is_err() {
        // Let the call return, so that the process can end.
        cluster.set_broker_up(2, true);
    }
    let err = returned
        .unwrap_or_else(|_| {
            panic!("send_offsets_to_transaction with a 2 s timeout has not returned after 30 s")
        })
        .expect_err("offsets sent to a coordinator that is down");
    let KafkaError::Transaction(ref txn) = err else {
        panic!("not a transaction error: {err}");
    };
    assert_eq!(txn.code(), RDKafkaErrorCode::OperationTimedOut, "{err}");
    assert!(
        txn.txn_requires_abort(),
        "{err}: a timed-out offset commit must ask for an abort"
    );
    assert!(
        took >= Duration::from_millis(1_900) && took < Duration::from_secs(6),
        "the call returned after {took:?} with a 2 s timeout"
    );
}

/// A group coordinator that left the cluster is forgotten as one (vendor/patches/0007-*): once
/// the client has seen the broker gone from the metadata (and decommissioned it),
/// `send_offsets_to_transaction` looks the coordinator up again and succeeds. Stock librdkafka
/// 2.12 keeps the broker in its coordinator cache, and the request waits for it to come up,
/// which it never does (librdkafka#5511): with 0005 the call fails at its timeout, and every
/// later call the same way while the cache entry is used.
#[test]
fn send_offsets_finds_the_new_group_coordinator_after_the_old_one_left_the_cluster() {
    use rdkafka::{Offset, TopicPartitionList};

    let (cluster, producer, metadata) = transactional(
        "coordinator-left",
        &[
            // The metadata, which tells the client that the broker left, every 500 ms; the
            // coordinator cache keeps an entry unused for metadata.max.age.ms (three refresh
            // intervals by default), so that is set to its default, 15 minutes.
            ("topic.metadata.refresh.interval.ms", "500"),
            ("metadata.max.age.ms", "900000"),
        ],
    );
    let mut offsets = TopicPartitionList::new();
    offsets
        .add_partition_offset("t", 0, Offset::Offset(1))
        .expect("an offset");
    // A first commit puts broker 2 in the coordinator cache.
    producer.begin_transaction().unwrap();
    producer
        .send_offsets_to_transaction(&offsets, &metadata, Duration::from_secs(5))
        .unwrap();
    producer.commit_transaction(Duration::from_secs(5)).unwrap();

    cluster.decommission(2);
    // Several metadata refreshes: the client decommissions broker 2 too.
    std::thread::sleep(Duration::from_millis(2_500));
    producer.begin_transaction().unwrap();
    let started = Instant::now();
    let sent = producer.send_offsets_to_transaction(&offsets, &metadata, Duration::from_secs(5));
    let took = started.elapsed();
    eprintln!("send_offsets_to_transaction returned after {took:?}: {sent:?}");
    sent.unwrap_or_else(|e| {
        panic!("offsets not sent after the group coordinator left the cluster ({took:?}): {e}")
    });
    assert!(
        took < Duration::from_secs(3),
        "the new coordinator was found after {took:?}"
    );
    producer.commit_transaction(Duration::from_secs(5)).unwrap();
}
