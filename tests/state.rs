//! Keyed state on the real broker: an `aggregate` job SIGKILLed at random moments and
//! restarted, and instances joining and leaving while records flow. Checked by exact per-key
//! results read with read_committed: every key's updates are its counts 1..=n, each once; every
//! input id is emitted once; the changelog's last value of each key is its count.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use common::*;

const PARTITIONS: i32 = 4;
const KEYS: u64 = 200;

struct Setup {
    _dir: tempfile::TempDir,
    /// The disk stores of the job's instances.
    _state: tempfile::TempDir,
    topology: PathBuf,
    input: String,
    output: String,
    changelog: String,
}

/// An input and an output topic and a counting job between them; the job creates its
/// changelog.
fn setup(name: &str) -> Setup {
    setup_with(name, "")
}

const COUNTING: &str =
    "  - aggregate: {name: counts, op: count, as: count}\n  - set_key: string(value.id)\n";

fn setup_with(name: &str, runtime: &str) -> Setup {
    setup_pipeline(name, COUNTING, runtime)
}

/// An input, an output and a job with `pipeline` (YAML list items) between them, whose one
/// store is called `counts`.
fn setup_pipeline(name: &str, pipeline: &str, runtime: &str) -> Setup {
    let input = unique(&format!("{name}-in"));
    let output = unique(&format!("{name}-out"));
    let job = unique(name);
    create_topics(&[&input, &output], PARTITIONS);
    let state = tempfile::tempdir().expect("state dir");
    let runtime = format!("  state_dir: {}\n{runtime}", state.path().display());
    let yaml = format!(
        "name: {job}\ninputs:\n  - {{topic: {input}, codec: json}}\npipeline:\n{pipeline}outputs:\n  - {{topic: {output}, codec: json}}\nruntime:\n  session_timeout_ms: 10000\n  max_records_per_txn: 500\n  group_protocol: {}\n{runtime}",
        group_protocol()
    );
    let (dir, topology) = topology_file(&yaml);
    Setup {
        _dir: dir,
        _state: state,
        topology,
        input,
        output,
        changelog: format!("{job}.counts.changelog"),
    }
}

fn key_of(id: u64) -> String {
    format!("k{}", id % KEYS)
}

/// Writes `ids` keyed by [`key_of`] at `per_second`, on a thread of its own.
fn feed(s: &Setup, ids: Vec<u64>, per_second: u64) -> std::thread::JoinHandle<()> {
    let input = s.input.clone();
    std::thread::spawn(move || {
        let records = ids
            .into_iter()
            .map(|id| (Some(key_of(id)), format!(r#"{{"id":{id}}}"#)));
        produce_records_paced(&input, records, Some(per_second));
    })
}

/// The number of input records of each key.
fn expected_counts(ids: &BTreeSet<u64>) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for &id in ids {
        *counts.entry(key_of(id)).or_insert(0) += 1;
    }
    counts
}

/// Every check of the job's committed results against the input `ids`.
fn assert_exact(s: &Setup, ids: &BTreeSet<u64>) {
    let expected = expected_counts(ids);
    let outputs = read_records(&s.output, PARTITIONS, "read_committed");
    // Outputs are keyed by their input's id (a set_key after the aggregate).
    assert_exactly_once(ids, &ids_of(&outputs));
    // Each key's updates, in any order across its records: exactly 1..=n, each once.
    let mut updates: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for r in &outputs {
        let value: serde_json::Value =
            serde_json::from_str(r.value.as_deref().expect("a value")).expect("JSON output");
        let id = value["id"].as_u64().expect("an id");
        let count = value["count"].as_u64().expect("a count");
        updates.entry(key_of(id)).or_default().push(count);
    }
    let mut wrong = Vec::new();
    for (key, n) in &expected {
        let mut got = updates.remove(key).unwrap_or_default();
        got.sort_unstable();
        if got != (1..=*n).collect::<Vec<_>>() {
            wrong.push(format!(
                "{key}: expected counts 1..={n}, got {} updates, first {:?}",
                got.len(),
                &got[..got.len().min(12)]
            ));
        }
    }
    assert!(updates.is_empty(), "updates of unknown keys: {updates:?}");
    assert!(
        wrong.is_empty(),
        "{} keys wrong:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
    // The changelog's last value of each key is its count.
    let mut last: BTreeMap<String, u64> = BTreeMap::new();
    for r in read_compacted_records(&s.changelog, PARTITIONS) {
        let count = r
            .value
            .as_deref()
            .and_then(|v| v.parse().ok())
            .expect("a count");
        last.insert(r.key.expect("a key"), count);
    }
    assert_eq!(
        last, expected,
        "the changelog's state differs from the input's counts"
    );
}

/// Commit, then apply: every second transaction is aborted after its state changes were sent
/// and seen by the records after them; the store forgets them, the records come again, and
/// the counts stay exact.
#[test]
fn an_aborted_transaction_leaves_no_state_change() {
    let s = setup("state-abort");
    let ids: BTreeSet<u64> = (0..6_000).collect();
    feed(&s, ids.iter().copied().collect(), 1_000_000)
        .join()
        .expect("feeder");
    let text = std::fs::read_to_string(&s.topology).expect("topology file");
    let topology = onceflow::topology::Topology::parse(&text, "test").expect("topology");
    let options = onceflow::instance::RunOptions {
        abort_every: Some(2),
        ..Default::default()
    };
    let summary = run_in_process(&topology, options, &s.output, PARTITIONS, ids.len());
    assert!(
        summary.txn.aborted >= 5,
        "too few aborts to prove anything: {summary:?}"
    );
    assert_exact(&s, &ids);
}

/// A commit whose answer is lost (the coordinator's broker dies after it wrote the commit):
/// the job takes the transaction for failed, and its new producer's initialization completes
/// it. The consumer's committed offsets are past its records, so the state must hold what it
/// committed too: reloaded from the changelog, the counts stay exact.
#[test]
fn a_commit_whose_answer_is_lost_leaves_the_state_as_committed() {
    let s = setup("state-lost-commit");
    let ids: BTreeSet<u64> = (0..6_000).collect();
    feed(&s, ids.iter().copied().collect(), 1_000_000)
        .join()
        .expect("feeder");
    let text = std::fs::read_to_string(&s.topology).expect("topology file");
    let topology = onceflow::topology::Topology::parse(&text, "test").expect("topology");
    let options = onceflow::instance::RunOptions {
        lose_commit_every: Some(3),
        ..Default::default()
    };
    let summary = run_in_process(&topology, options, &s.output, PARTITIONS, ids.len());
    assert!(
        summary.txn.producer_rebuilds >= 3,
        "too few lost answers to prove anything: {summary:?}"
    );
    assert_exact(&s, &ids);
}

/// A changelog partition with a transaction open on it (its previous owner was committing
/// when the partition moved): the restore takes the partition's end only once that
/// transaction ended, and holds what it committed. Read to the last stable offset at once,
/// the state would lack it while the consumer's committed offsets skip its records.
#[test]
fn a_restore_waits_for_the_transaction_open_on_its_changelog() {
    use rdkafka::ClientConfig;
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let job = unique("restore-open-txn");
    let yaml = format!(
        "name: {job}\ninputs:\n  - {{topic: in, codec: json}}\npipeline:\n{COUNTING}outputs:\n  - {{topic: out, codec: json}}\nruntime:\n  state_store: memory\n  transaction_timeout_ms: 10000\n"
    );
    let topology = onceflow::topology::Topology::parse(&yaml, "t.yaml").expect("topology");
    let changelog = format!("{job}.counts.changelog");
    create_topics(&[&changelog], 1);
    // The previous owner: a record of its state in a transaction not yet ended.
    let owner: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("transactional.id", unique("previous-owner"))
        .create()
        .expect("producer");
    let t = Duration::from_secs(30);
    owner.init_transactions(t).expect("init");
    owner.begin_transaction().expect("begin");
    owner
        .send(
            BaseRecord::to(&changelog)
                .partition(0)
                .key("k1")
                .payload("7"),
        )
        .map_err(|(e, _)| e)
        .expect("send");
    owner.flush(t).expect("flush");
    let wait = Duration::from_secs(3);
    let committer = std::thread::spawn(move || {
        std::thread::sleep(wait);
        owner.commit_transaction(t).expect("commit");
    });
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap())
        .set("group.id", unique("restore-open-txn"));
    let mut stores = onceflow::state::open(&topology, "i-0", &config).expect("stores");
    let started = std::time::Instant::now();
    let restored = stores.restore(&[0]).expect("restore");
    let took = started.elapsed();
    committer.join().expect("committer");
    assert_eq!(
        stores.entries(0),
        vec![(b"k1".to_vec(), b"7".to_vec())],
        "the restore ended after {took:?} without the open transaction's change ({restored:?})"
    );
    assert!(took >= wait - Duration::from_millis(500), "{took:?}");
}

#[test]
fn counts_stay_exact_when_the_job_is_sigkilled_and_restarted() {
    let s = setup("state-crash");
    let ids: BTreeSet<u64> = (0..60_000).collect();
    // Over ~30 s: the job cannot be done before it was killed a few times.
    let feeder = feed(&s, ids.iter().copied().collect(), 2_000);
    kill_mid_run(
        &|| spawn_job(&s.topology, "state-0", &[]),
        &s.output,
        PARTITIONS,
        ids.len(),
        3,
    );
    feeder.join().expect("feeder");
    let child = spawn_job(&s.topology, "state-0", &[]);
    let seen = wait_for_distinct(&s.output, PARTITIONS, ids.len(), Duration::from_secs(180));
    terminate(child);
    assert_eq!(
        seen,
        ids.len(),
        "not every record came through after the restarts"
    );
    assert_exact(&s, &ids);
}

/// State moves with its partitions: three instances, then one (two stop while records flow),
/// then three again; the counts stay exact.
#[test]
fn counts_stay_exact_while_instances_leave_and_join() {
    let s = setup("state-scale");
    let ids: BTreeSet<u64> = (0..40_000).collect();
    let feeder = feed(&s, ids.iter().copied().collect(), 2_000);
    let spawn = |n: usize| spawn_job(&s.topology, &format!("scale-{n}"), &[]);
    let mut instances: Vec<_> = (0..3).map(spawn).collect();
    wait_for_distinct(&s.output, PARTITIONS, 2_000, Duration::from_secs(90));
    // Down to one: two stop cleanly, their partitions and state go to the third.
    for child in instances.drain(1..) {
        terminate(child);
    }
    let visible = distinct_now(&s.output, PARTITIONS, Duration::from_secs(2));
    wait_for_distinct(
        &s.output,
        PARTITIONS,
        visible + 2_000,
        Duration::from_secs(90),
    );
    // Up to three again: partitions and state move back while records flow.
    instances.extend((1..3).map(spawn));
    feeder.join().expect("feeder");
    let seen = wait_for_distinct(&s.output, PARTITIONS, ids.len(), Duration::from_secs(180));
    for child in instances {
        terminate(child);
    }
    assert_eq!(seen, ids.len(), "not every record came through");
    assert_exact(&s, &ids);
}

/// A changelog whose partition count is not the input's would put a partition's state where
/// another partition's is restored from: `validate --bootstrap-servers` names it, and the job refuses to
/// start.
#[test]
fn a_changelog_with_another_partition_count_is_refused() {
    let s = setup("state-parts");
    create_topics(&[&s.changelog], PARTITIONS + 1);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_onceflow"))
        .arg("validate")
        .arg(&s.topology)
        .args(["--bootstrap-servers", &bootstrap()])
        .output()
        .expect("run validate");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("pipeline[0].aggregate.name")
            && said.contains(&format!(
                "has {} partitions, the input has {PARTITIONS}",
                PARTITIONS + 1
            )),
        "{said}"
    );
    let mut job = spawn_job(&s.topology, "parts-0", &[]);
    let status = wait_exit(&mut job, Duration::from_secs(60)).expect("the job stops");
    assert!(!status.success(), "{status:?}");
}

/// The records a restore read, from the job's metrics at `addr`, once it has served them.
fn restored_records(addr: &str) -> f64 {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Some((200, body)) = get(addr, "/metrics")
            && let Some(n) = metric(&body, "onceflow_state_restored_records_total", &[])
        {
            return n;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no restore metric at {addr}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A restart after a SIGKILL (or a clean stop: `clean`) reads only the changelog's tail when
/// the disk store has a checkpoint, and the whole changelog with the memory store; the
/// counts are exact either way.
fn restart_restores(store: &str, clean: bool) -> (f64, usize) {
    let s = setup_with(
        &format!("state-tail-{store}"),
        &format!("  state_store: {store}\n"),
    );
    let first: Vec<u64> = (0..30_000).collect();
    feed(&s, first.clone(), 1_000_000).join().expect("feeder");
    let mut job = spawn_job(&s.topology, "tail-0", &[]);
    wait_for_distinct(&s.output, PARTITIONS, first.len(), Duration::from_secs(120));
    // Quiet for longer than the checkpoint interval: the idle job writes its checkpoint.
    std::thread::sleep(Duration::from_secs(12));
    if clean {
        terminate(job);
    } else {
        job.kill().expect("SIGKILL");
        job.wait().expect("reap");
    }
    let changelog = read_compacted_records(&s.changelog, PARTITIONS).len();

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let addr = format!("127.0.0.1:{port}");
    let job = spawn_job(
        &s.topology,
        "tail-0",
        &[("ONCEFLOW_METRICS_ADDR", addr.as_str())],
    );
    feed(&s, (30_000..30_100).collect(), 1_000_000)
        .join()
        .expect("feeder");
    wait_for_distinct(&s.output, PARTITIONS, 30_100, Duration::from_secs(120));
    let restored = restored_records(&addr);
    terminate(job);
    assert_exact(&s, &(0..30_100).collect());
    (restored, changelog)
}

#[test]
fn a_restart_restores_only_the_tail_from_the_disk_store() {
    let (restored, changelog) = restart_restores("disk", false);
    eprintln!("disk store: {restored} of {changelog} changelog records read by the restore");
    assert!(changelog >= 30_000, "{changelog}");
    assert!(
        restored < 1_000.0,
        "the restore read {restored} of {changelog} changelog records: not the tail"
    );
}

#[test]
fn a_restart_restores_the_whole_changelog_into_the_memory_store() {
    let (restored, changelog) = restart_restores("memory", false);
    eprintln!("memory store: {restored} of {changelog} changelog records read by the restore");
    assert!(restored >= 30_000.0, "{restored} of {changelog}");
}

/// A clean stop (SIGTERM) writes a checkpoint as its partitions are revoked: the restart
/// reads next to nothing.
#[test]
fn a_restart_after_a_clean_stop_reads_next_to_nothing() {
    let (restored, changelog) = restart_restores("disk", true);
    eprintln!("clean stop, disk store: {restored} of {changelog} changelog records read");
    assert!(restored < 200.0, "{restored} of {changelog}");
}

/// `dedupe` against an at-least-once upstream that sends every id one to three times
/// (keyed by the id, copies spread over the feed), with the job SIGKILLed and restarted:
/// each id passes exactly once.
#[test]
fn each_id_passes_dedupe_exactly_once_across_kills() {
    use rand::Rng;
    use rand::seq::SliceRandom;
    let s = setup_pipeline(
        "state-dedupe",
        "  - dedupe: {name: counts, within: 1d}\n",
        "",
    );
    let ids: BTreeSet<u64> = (0..20_000).collect();
    let mut rng = rand::rng();
    let mut sends: Vec<u64> = ids
        .iter()
        .flat_map(|&id| std::iter::repeat_n(id, rng.random_range(1..=3)))
        .collect();
    sends.shuffle(&mut rng);
    let copies = sends.len();
    let input = s.input.clone();
    let feeder = std::thread::spawn(move || {
        let records = sends
            .into_iter()
            .map(|id| (Some(id.to_string()), format!(r#"{{"id":{id}}}"#)));
        produce_records_paced(&input, records, Some(2_000));
    });
    kill_mid_run(
        &|| spawn_job(&s.topology, "dedupe-0", &[]),
        &s.output,
        PARTITIONS,
        ids.len(),
        3,
    );
    feeder.join().expect("feeder");
    dedupe_to_the_end(&s, ids.len());
    eprintln!("{copies} records sent for {} ids", ids.len());
    assert!(
        copies > ids.len() * 3 / 2,
        "too few repeats to prove anything: {copies}"
    );
    assert_exactly_once(
        &ids,
        &ids_of(&read_records(&s.output, PARTITIONS, "read_committed")),
    );
}

/// Runs the deduping job of `s` once more, undisturbed, until its output holds `ids` distinct
/// ids and it has read its input to the end (the last copies may come after the last new
/// id), then stops it.
fn dedupe_to_the_end(s: &Setup, ids: usize) {
    let job = spawn_job(&s.topology, "dedupe-0", &[]);
    let seen = wait_for_distinct(&s.output, PARTITIONS, ids, Duration::from_secs(180));
    std::thread::sleep(Duration::from_secs(3));
    terminate(job);
    assert_eq!(seen, ids, "not every id came through");
}

/// `dedupe` when the copies of an id come on other partitions: an upstream that sends every
/// id one to three times, each copy under a key of its own (so the copies of an id are spread
/// over the partitions). A stateful step on another key than the input's is refused by
/// `validate`, which says to re-key in a first topology; done so here: a stateless job re-keys
/// by the id into a topic the deduping job reads. Both are SIGKILLed while records flow; each id
/// passes exactly once.
#[test]
fn each_id_passes_dedupe_exactly_once_when_its_copies_come_on_other_partitions() {
    use rand::Rng;
    use rand::seq::SliceRandom;
    let s = setup_pipeline(
        "state-dedupe-rekeyed",
        "  - dedupe: {name: counts, within: 1d}\n",
        "",
    );
    let upstream = unique("state-dedupe-upstream");
    create_topics(&[&upstream], PARTITIONS);
    let rekey_yaml = format!(
        "name: {}\ninputs:\n  - {{topic: {upstream}, codec: json}}\npipeline:\n  - set_key: string(value.id)\noutputs:\n  - {{topic: {}, codec: json}}\nruntime:\n  session_timeout_ms: 10000\n  max_records_per_txn: 500\n  group_protocol: {}\n",
        unique("rekey"),
        s.input,
        group_protocol()
    );
    let (_rekey_dir, rekey) = topology_file(&rekey_yaml);
    let ids: BTreeSet<u64> = (0..20_000).collect();
    let mut rng = rand::rng();
    let mut sends: Vec<(u64, u32)> = ids
        .iter()
        .flat_map(|&id| (0..rng.random_range(1..=3)).map(move |copy| (id, copy)))
        .collect();
    sends.shuffle(&mut rng);
    let copies = sends.len();
    // The copies of an id under different keys: on how many partitions they landed is the
    // producer's hash; counted below from the upstream topic itself.
    let records: Vec<(Option<String>, String)> = sends
        .into_iter()
        .map(|(id, copy)| (Some(format!("{id}-{copy}")), format!(r#"{{"id":{id}}}"#)))
        .collect();
    let feed_topic = upstream.clone();
    let feeder =
        std::thread::spawn(move || produce_records_paced(&feed_topic, records, Some(2_000)));
    let rekeying = std::cell::RefCell::new(Some(spawn_job(&rekey, "rekey-0", &[])));
    kill_mid_run(
        &|| {
            // The re-keying job is SIGKILLed and restarted with each round of the deduping one.
            if let Some(mut job) = rekeying.borrow_mut().take() {
                job.kill().expect("SIGKILL");
                job.wait().expect("reap");
            }
            *rekeying.borrow_mut() = Some(spawn_job(&rekey, "rekey-0", &[]));
            spawn_job(&s.topology, "dedupe-0", &[])
        },
        &s.output,
        PARTITIONS,
        ids.len(),
        3,
    );
    feeder.join().expect("feeder");
    dedupe_to_the_end(&s, ids.len());
    if let Some(job) = rekeying.borrow_mut().take() {
        terminate(job);
    }
    // The upstream really spread copies of one id over partitions.
    let mut partitions_of: BTreeMap<u64, BTreeSet<i32>> = BTreeMap::new();
    for r in read_records(&upstream, PARTITIONS, "read_committed") {
        let value: serde_json::Value =
            serde_json::from_str(r.value.as_deref().expect("a value")).expect("JSON");
        partitions_of
            .entry(value["id"].as_u64().expect("an id"))
            .or_default()
            .insert(r.partition);
    }
    let spread = partitions_of.values().filter(|p| p.len() > 1).count();
    eprintln!(
        "{copies} records sent for {} ids; {spread} ids had copies on more than one partition",
        ids.len()
    );
    assert!(
        spread > ids.len() / 4,
        "too few ids with copies on other partitions to prove anything: {spread}"
    );
    assert_exactly_once(
        &ids,
        &ids_of(&read_records(&s.output, PARTITIONS, "read_committed")),
    );
}

/// A zombie never lands a state write: an instance frozen mid-work (SIGSTOP) past its session
/// timeout while a replacement with its instance id (on another disk, as a pod on another
/// node) takes over, then woken (SIGCONT). The zombie's open transaction holds changelog
/// writes; it must be fenced and stop, and the counts and the changelog stay exact.
#[test]
fn a_paused_zombie_never_lands_a_state_write() {
    let s = setup("state-zombie");
    let ids: BTreeSet<u64> = (0..30_000).collect();
    let feeder = feed(&s, ids.iter().copied().collect(), 2_000);
    let (replacement, _disks) =
        zombie_on_its_own_disk(&s.topology, "zombie-0", &s.output, PARTITIONS, ids.len());
    feeder.join().expect("feeder");
    terminate(replacement);
    assert_exact(&s, &ids);
}

/// `emit: per_commit`: each transaction emits a key once, with its latest count, carried by
/// the key's last record in it (re-keyed by its id afterwards). Across SIGKILLs, read with
/// read_committed: every emitted count is exactly the number of the key's records up to the
/// one that carries it, no count is emitted twice, each key ends at its number of records;
/// far fewer outputs than inputs; the changelog holds every count.
#[test]
fn per_commit_emits_each_key_once_per_transaction_with_its_latest_count() {
    let s = setup_pipeline(
        "state-per-commit",
        "  - aggregate: {name: counts, op: count, as: count, emit: per_commit}\n  - set_key: string(value.id)\n",
        "",
    );
    let ids: BTreeSet<u64> = (0..40_000).collect();
    let expected = expected_counts(&ids);
    let feeder = feed(&s, ids.iter().copied().collect(), 2_000);
    kill_mid_run(
        &|| spawn_job(&s.topology, "state-0", &[]),
        &s.output,
        PARTITIONS,
        ids.len(),
        3,
    );
    feeder.join().expect("feeder");
    let child = spawn_job(&s.topology, "state-0", &[]);
    // key -> its emitted (count, id), until every key reached its count.
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    let emitted = loop {
        let mut emitted: BTreeMap<String, Vec<(u64, u64)>> = BTreeMap::new();
        for r in read_records(&s.output, PARTITIONS, "read_committed") {
            let value: serde_json::Value =
                serde_json::from_str(r.value.as_deref().expect("a value")).expect("JSON");
            let id = value["id"].as_u64().expect("an id");
            let count = value["count"].as_u64().expect("a count");
            emitted.entry(key_of(id)).or_default().push((count, id));
        }
        let reached = |k: &String, n: &u64| {
            emitted
                .get(k)
                .is_some_and(|e| e.iter().any(|&(count, _)| count == *n))
        };
        if expected.iter().all(|(k, n)| reached(k, n)) || std::time::Instant::now() > deadline {
            break emitted;
        }
        std::thread::sleep(Duration::from_secs(2));
    };
    terminate(child);
    let outputs: usize = emitted.values().map(Vec::len).sum();
    let mut wrong = Vec::new();
    for (key, n) in &expected {
        let mut got = emitted.get(key).cloned().unwrap_or_default();
        got.sort_unstable();
        // The ids of a key are key, key + KEYS, ...: the record with id i is its key's
        // (i / KEYS + 1)-th.
        let exact = got.iter().all(|&(count, id)| count == id / KEYS + 1);
        let once = got.windows(2).all(|w| w[0].0 < w[1].0);
        if !exact || !once || got.last().map(|e| e.0) != Some(*n) {
            wrong.push(format!("{key}: {n} records, emitted (count, id) {got:?}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} keys wrong:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
    assert!(
        outputs * 4 < ids.len(),
        "{outputs} outputs for {} records: the transactions' updates were not coalesced",
        ids.len()
    );
    let mut last: BTreeMap<String, u64> = BTreeMap::new();
    for r in read_compacted_records(&s.changelog, PARTITIONS) {
        let count = r
            .value
            .as_deref()
            .and_then(|v| v.parse().ok())
            .expect("a count");
        last.insert(r.key.expect("a key"), count);
    }
    assert_eq!(
        last, expected,
        "the changelog's state differs from the input's counts"
    );
}
