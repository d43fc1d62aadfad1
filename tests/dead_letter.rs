//! Poison records on the real broker: each goes to the dead-letter topic exactly once, inside
//! the transaction, while every good record reaches the output exactly once, across SIGKILLs;
//! transient failures are retried, then dead-lettered; `dlq replay` brings records back once.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::*;
use onceflow::dlq::{self, DeadLetter, Filter};
use onceflow::instance::RunOptions;
use onceflow::topology::Topology;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

const PARTITIONS: i32 = 4;
const POISON_BASE: u64 = 1_000_000;

fn topology_text(
    name: &str,
    input: &str,
    output: &str,
    dlq: &str,
    expr: &str,
    extra: &str,
) -> String {
    format!(
        "name: {name}\ninputs:\n  - {{topic: {input}, codec: json}}\npipeline:\n  - map: {{doubled: '{expr}'}}\noutputs:\n  - {{topic: {output}}}\ndead_letter: {{topic: {dlq}}}\nruntime:\n  session_timeout_ms: 10000\n  max_records_per_txn: 1000\n{extra}"
    )
}

/// The value written for `id`: good ones carry a number, poison ones are not JSON (even
/// offsets) or carry the amount as a string (odd), which `value.amount * 2` refuses.
fn value_of(id: u64) -> String {
    if id < POISON_BASE {
        format!(r#"{{"id":{id},"amount":{id}}}"#)
    } else if id.is_multiple_of(2) {
        format!("{{not json {id}")
    } else {
        format!(r#"{{"id":{id},"amount":"{}"}}"#, id % 1000)
    }
}

fn produce(topic: &str, ids: &[u64], per_second: u64) {
    let records = ids.iter().map(|id| (Some(id.to_string()), value_of(*id)));
    produce_records_paced(topic, records, Some(per_second));
}

/// Every dead-letter record of `topic` (read_committed, `expected` of them).
fn read_letters(topic: &str, expected: usize) -> Vec<DeadLetter> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", unique("letters"))
        .set("isolation.level", "read_committed")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .expect("tpl");
    }
    consumer.assign(&tpl).expect("assign");
    let mut letters = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while letters.len() < expected && Instant::now() < deadline {
        if let Some(Ok(msg)) = consumer.poll(Duration::from_millis(200))
            && msg.headers().is_some()
            && msg.key().is_some()
        {
            letters.push(DeadLetter::from_message(&msg));
        }
    }
    letters
}

fn id_of(letter: &DeadLetter) -> u64 {
    std::str::from_utf8(letter.key.as_deref().expect("key"))
        .expect("utf-8")
        .parse()
        .expect("id")
}

#[test]
fn poison_records_are_dead_lettered_exactly_once_across_sigkills_and_replayed_once() {
    let (input, output, dlq_topic) = (unique("dl-in"), unique("dl-out"), unique("dl-dlq"));
    create_topics(&[&input, &output, &dlq_topic], PARTITIONS);
    let name = unique("dl");
    let good: BTreeSet<u64> = (0..20_000).collect();
    let poison: BTreeSet<u64> = (POISON_BASE..POISON_BASE + 1_000).collect();
    // Interleaved: one poison record after every 20 good ones, over all partitions.
    let mut ids = Vec::new();
    let mut poison_iter = poison.iter();
    for id in &good {
        ids.push(*id);
        if id % 20 == 19 {
            ids.extend(poison_iter.next());
        }
    }
    ids.extend(poison_iter);
    let feeder = {
        let (input, ids) = (input.clone(), ids.clone());
        std::thread::spawn(move || produce(&input, &ids, 3_000))
    };

    let (_dir, path) = topology_file(&topology_text(
        &name,
        &input,
        &output,
        &dlq_topic,
        "value.amount * 2",
        "",
    ));
    let mut kills = 0;
    for _ in 0..8 {
        if kills >= 3 {
            break;
        }
        let mut child = spawn_job(&path, "dl-0", &[]);
        std::thread::sleep(Duration::from_millis(rand::random_range(1000..2500)));
        child.kill().expect("SIGKILL");
        child.wait().expect("reap");
        if !feeder.is_finished() {
            kills += 1;
        }
    }
    assert!(kills >= 3, "the input ended before 3 kills");
    feeder.join().expect("feeder");
    let child = spawn_job(&path, "dl-0", &[]);
    let seen_out = wait_for_distinct(&output, PARTITIONS, good.len(), Duration::from_secs(180));
    let seen_dlq = wait_for_distinct(
        &dlq_topic,
        PARTITIONS,
        poison.len(),
        Duration::from_secs(60),
    );
    terminate(child);
    assert_eq!((seen_out, seen_dlq), (good.len(), poison.len()));
    assert_exactly_once(&good, &read_all(&output, PARTITIONS, "read_committed"));
    assert_exactly_once(&poison, &read_all(&dlq_topic, PARTITIONS, "read_committed"));

    // Every dead-letter record keeps the original verbatim and says what failed and where.
    let letters = read_letters(&dlq_topic, poison.len());
    assert_eq!(letters.len(), poison.len());
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    for letter in &letters {
        let id = id_of(letter);
        assert_eq!(
            letter.value.as_deref(),
            Some(value_of(id).as_bytes()),
            "value of {id}"
        );
        let kind = letter.meta(dlq::H_KIND);
        if id.is_multiple_of(2) {
            assert_eq!(kind, "bad_json", "{id}");
        } else {
            assert_ne!(kind, "bad_json", "{id}");
        }
        *kinds.entry(kind.to_string()).or_default() += 1;
        assert_eq!(letter.meta(dlq::H_TOPIC), input);
        assert!(
            letter
                .meta(dlq::H_PARTITION)
                .parse::<i32>()
                .is_ok_and(|p| (0..PARTITIONS).contains(&p))
        );
        assert!(
            letter
                .meta(dlq::H_OFFSET)
                .parse::<i64>()
                .is_ok_and(|o| o >= 0)
        );
        assert_eq!(letter.meta(dlq::H_ATTEMPTS), "1");
        assert_eq!(letter.meta(dlq::H_TOPOLOGY), name);
        assert_eq!(letter.meta(dlq::H_INSTANCE), "dl-0");
        assert!(!letter.meta(dlq::H_MESSAGE).is_empty());
        assert!(letter.meta(dlq::H_STAGE).contains("pipeline[0]") || kind == "bad_json");
        assert!(letter.meta(dlq::H_FAILED_AT).parse::<i64>().is_ok());
    }
    eprintln!("dead-letter kinds: {kinds:?}");

    // Fix the topology (amounts may be strings), replay the records that failed on it, and
    // run the fixed job: each replayed record comes through once; a second replay adds none.
    let string_kind = letters
        .iter()
        .find(|l| id_of(l) % 2 == 1)
        .map(|l| l.meta(dlq::H_KIND).to_string())
        .expect("a string-amount letter");
    let filter = Filter {
        kind: Some(string_kind),
        ..Filter::default()
    };
    let kafka = onceflow::kafka::Cluster::new(&bootstrap());
    let replay = || dlq::replay(&kafka, &dlq_topic, &filter, None, &mut |_, _| {});
    let first = replay().expect("replay");
    assert_eq!(first.replayed, 500, "{first:?}");
    let again = replay().expect("replay");
    assert_eq!(
        again.replayed, 0,
        "a second replay re-produced records: {again:?}"
    );
    let fixed = Topology::parse(
        &topology_text(
            &name,
            &input,
            &output,
            &dlq_topic,
            "int(value.amount) * 2",
            "",
        ),
        "fixed",
    )
    .expect("fixed topology");
    let replayed: BTreeSet<u64> = poison.iter().copied().filter(|id| id % 2 == 1).collect();
    let expected: BTreeSet<u64> = good.union(&replayed).copied().collect();
    run_in_process(
        &fixed,
        RunOptions::default(),
        &output,
        PARTITIONS,
        expected.len(),
    );
    assert_exactly_once(&expected, &read_all(&output, PARTITIONS, "read_committed"));
}

#[test]
fn transient_failures_are_retried_then_dead_lettered() {
    let (input, output, dlq_topic) = (unique("tr-in"), unique("tr-out"), unique("tr-dlq"));
    create_topics(&[&input, &output, &dlq_topic], PARTITIONS);
    let ids: BTreeSet<u64> = (0..2_000).collect();
    produce_ids(&input, ids.iter().copied());
    let text = topology_text(
        &unique("tr"),
        &input,
        &output,
        &dlq_topic,
        "value.id * 2",
        "  max_attempts: 3\n  retry_backoff_ms: 50\n",
    );
    let topology = Topology::parse(&text, "t").expect("topology");
    // 4 injected failures: the first record fails 3 times (dead-lettered after its last
    // attempt), the next one fails once and succeeds on its second attempt.
    let options = RunOptions {
        transient_failures: 4,
        ..RunOptions::default()
    };
    let started = Instant::now();
    run_in_process(&topology, options, &output, PARTITIONS, ids.len() - 1);
    // Backoffs of the first record: ~50 and ~100 ms (jittered to at least half), then ~50.
    assert!(started.elapsed() >= Duration::from_millis(100));
    let letters = read_letters(&dlq_topic, 1);
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].meta(dlq::H_KIND), "unavailable");
    assert_eq!(letters[0].meta(dlq::H_ATTEMPTS), "3");
    let out = read_all(&output, PARTITIONS, "read_committed");
    let mut expected = ids.clone();
    expected.remove(&id_of(&letters[0]));
    assert_exactly_once(&expected, &out);
    assert_exactly_once(
        &BTreeSet::from([id_of(&letters[0])]),
        &read_all(&dlq_topic, PARTITIONS, "read_committed"),
    );
}

#[test]
fn exhausted_retries_can_pause_the_partition_instead() {
    let (input, output, dlq_topic) = (unique("pa-in"), unique("pa-out"), unique("pa-dlq"));
    create_topics(&[&input, &output, &dlq_topic], PARTITIONS);
    let ids: BTreeSet<u64> = (0..2_000).collect();
    produce_ids(&input, ids.iter().copied());
    let text = topology_text(
        &unique("pa"),
        &input,
        &output,
        &dlq_topic,
        "value.id * 2",
        "  max_attempts: 2\n  retry_backoff_ms: 20\n  retry_backoff_max_ms: 300\n  on_exhausted: pause\n",
    );
    let topology = Topology::parse(&text, "t").expect("topology");
    // 5 injected failures with 2 attempts a record: the first record's partition is paused
    // twice, then the record passes on its third try; nothing is dead-lettered.
    let options = RunOptions {
        transient_failures: 5,
        ..RunOptions::default()
    };
    let started = Instant::now();
    run_in_process(&topology, options, &output, PARTITIONS, ids.len());
    assert!(
        started.elapsed() >= Duration::from_millis(600),
        "two pauses of 300 ms"
    );
    assert_exactly_once(&ids, &read_all(&output, PARTITIONS, "read_committed"));
    assert_exactly_once(
        &BTreeSet::new(),
        &read_all(&dlq_topic, PARTITIONS, "read_committed"),
    );
}

#[test]
fn a_record_too_large_for_the_dead_letter_topic_is_replayed_from_its_origin() {
    let (input, output, dlq_topic, replayed) = (
        unique("big-in"),
        unique("big-out"),
        unique("big-dlq"),
        unique("big-re"),
    );
    create_topics(&[&input, &output, &dlq_topic, &replayed], PARTITIONS);
    // 200 small records and one of about 6,000 bytes: over the job's message.max.bytes
    // (3,000) as an output, and as a dead letter too.
    let big = format!(r#"{{"id":{POISON_BASE},"pad":"{}"}}"#, "x".repeat(6_000));
    let mut records: Vec<(Option<String>, String)> = (0..200u64)
        .map(|id| (Some(id.to_string()), format!(r#"{{"id":{id}}}"#)))
        .collect();
    records.insert(100, (Some(POISON_BASE.to_string()), big.clone()));
    produce_records(&input, records);
    let text = format!(
        "name: {}\ninputs:\n  - {{topic: {input}, codec: json}}\noutputs:\n  - {{topic: {output}}}\ndead_letter: {{topic: {dlq_topic}}}\nkafka:\n  producer:\n    message.max.bytes: \"3000\"\n",
        unique("big")
    );
    let topology = Topology::parse(&text, "t").expect("topology");
    run_in_process(&topology, RunOptions::default(), &output, PARTITIONS, 200);
    let letters = read_letters(&dlq_topic, 1);
    assert_eq!(letters.len(), 1);
    let letter = &letters[0];
    assert_eq!(id_of(letter), POISON_BASE);
    assert_eq!(letter.meta(dlq::H_KIND), "too_large");
    assert_eq!(
        letter.value, None,
        "the value does not fit the dead-letter topic"
    );
    let dropped = letter.meta(dlq::H_VALUE_DROPPED);
    assert!(
        dropped.starts_with("too large") && dropped.contains("3000"),
        "{dropped}"
    );
    let kafka = onceflow::kafka::Cluster::new(&bootstrap());
    let r = dlq::replay(
        &kafka,
        &dlq_topic,
        &Filter::default(),
        Some(&replayed),
        &mut |_, _| {},
    )
    .expect("replay");
    assert_eq!(r.replayed, 1, "{r:?}");
    let back = read_records(&replayed, PARTITIONS, "read_committed");
    assert_eq!(back.len(), 1, "{back:?}");
    assert_eq!(
        back[0].key.as_deref(),
        Some(POISON_BASE.to_string().as_str())
    );
    assert_eq!(
        back[0].value.as_deref(),
        Some(big.as_str()),
        "the original value, read back from its origin"
    );
}
