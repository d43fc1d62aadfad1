//! Event time on the real broker: a windowed count with final results, and `delay`.
//!
//! The windowed job's results are checked against a model of the same rules written here
//! (stream time per partition, windows, grace, late records): every (window, key) whose
//! window closed is emitted exactly once, with its exact count, read with read_committed;
//! nothing else is. The job is SIGKILLed, scaled 3 → 1 → 3, and frozen as a zombie.
//! `delay` is checked by ids and by the time the broker appended each record.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

use common::*;

const PARTITIONS: i32 = 4;
/// Keys are numbers below this; key k is written to partition k % PARTITIONS.
const KEYS: u64 = 40;
/// Where event time begins: an hour ago, on a whole second. Results are timestamped with
/// their windows' times, and a topic deletes records older than its retention (7 days): event
/// times from long ago would have the broker delete results while the test reads them.
static BASE: std::sync::LazyLock<i64> =
    std::sync::LazyLock::new(|| (now_ms() - 3_600_000) / 1000 * 1000);
const SIZE: i64 = 1_000;
const GRACE: i64 = 1_000;

struct Setup {
    _dir: tempfile::TempDir,
    _state: tempfile::TempDir,
    topology: PathBuf,
    input: String,
    output: String,
}

/// A job counting records per key in tumbling 1 s windows of `value.ts`, 1 s of grace,
/// final results only, each re-keyed by a number naming its window and key.
fn setup(name: &str) -> Setup {
    setup_window(
        name,
        "{tumbling: 1s, grace: 1s, time: value.ts}",
        &format!(
            "string((value.start - {}) / {SIZE} * 1000 + int(string(key)))",
            *BASE
        ),
    )
}

/// A counting job with `window`, its results re-keyed by `id`.
fn setup_window(name: &str, window: &str, id: &str) -> Setup {
    let input = unique(&format!("{name}-in"));
    let output = unique(&format!("{name}-out"));
    let job = unique(name);
    create_topics(&[&input, &output], PARTITIONS);
    let state = tempfile::tempdir().expect("state dir");
    let yaml = format!(
        "name: {job}\ninputs:\n  - {{topic: {input}, codec: json}}\npipeline:\n  - aggregate: {{name: clicks, op: count, as: n, emit: final, window: {window}}}\n  - set_key: {id}\noutputs:\n  - {{topic: {output}, codec: json}}\nruntime:\n  session_timeout_ms: 10000\n  max_records_per_txn: 500\n  group_protocol: {}\n  state_dir: {}\n",
        group_protocol(),
        state.path().display()
    );
    let (dir, topology) = topology_file(&yaml);
    Setup {
        _dir: dir,
        _state: state,
        topology,
        input,
        output,
    }
}

/// One input record: key, event time, partition.
#[derive(Debug, Clone, Copy)]
struct Click {
    key: u64,
    ts: i64,
}

/// `n` records: event time moves 2 ms a record, most come up to 600 ms out of order
/// (within the grace), and one in 50 comes 5 s late (beyond it, once its partition's stream
/// time has moved on). Then one record per partition far ahead, which closes every window
/// before it.
fn clicks(n: u64) -> Vec<Click> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(n);
    let mut all: Vec<Click> = (0..n)
        .map(|i| {
            let on_time = *BASE + 10_000 + 2 * i as i64;
            let ts = if i > 500 && rng.random_range(0..50) == 0 {
                on_time - 5_000
            } else {
                on_time - rng.random_range(0..600)
            };
            Click {
                key: rng.random_range(0..KEYS),
                ts,
            }
        })
        .collect();
    let end = *BASE + 2 * n as i64 + 60_000;
    all.extend((0..PARTITIONS as u64).map(|p| Click { key: p, ts: end }));
    all
}

/// The model: per partition, in order, stream time is the largest event time seen; a
/// record whose window closed (end + grace <= stream time) is late and dropped. The final
/// results are the windows closed at the end, by id (window number * 1000 + key), with
/// their counts; and how many records were late.
fn expected(clicks: &[Click]) -> (BTreeMap<u64, u64>, usize) {
    let mut stream_time: BTreeMap<u64, i64> = BTreeMap::new();
    let mut counts: BTreeMap<(i64, u64), u64> = BTreeMap::new();
    let mut late = 0;
    for c in clicks {
        let p = c.key % PARTITIONS as u64;
        let st = stream_time.entry(p).or_insert(i64::MIN);
        *st = (*st).max(c.ts);
        let start = c.ts.div_euclid(SIZE) * SIZE;
        if start + SIZE + GRACE <= *st {
            late += 1;
            continue;
        }
        *counts.entry((start, c.key)).or_default() += 1;
    }
    let finals = counts
        .into_iter()
        .filter(|((start, key), _)| start + SIZE + GRACE <= stream_time[&(key % PARTITIONS as u64)])
        .map(|((start, key), n)| (((start - *BASE) / SIZE) as u64 * 1000 + key, n))
        .collect();
    (finals, late)
}

/// Writes `clicks` in order, each to its key's partition, at `per_second`, on a thread.
fn feed(s: &Setup, clicks: Vec<Click>, per_second: u64) -> std::thread::JoinHandle<()> {
    let input = s.input.clone();
    std::thread::spawn(move || {
        let producer: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap())
            .set("enable.idempotence", "true")
            .set("linger.ms", "5")
            .create()
            .expect("producer");
        let started = Instant::now();
        for (n, c) in clicks.into_iter().enumerate() {
            let due = started + Duration::from_secs_f64(n as f64 / per_second as f64);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                producer.poll(Duration::ZERO);
                std::thread::sleep(wait);
            }
            let key = c.key.to_string();
            let value = format!(r#"{{"ts":{}}}"#, c.ts);
            let mut record = BaseRecord::to(&input)
                .partition((c.key % PARTITIONS as u64) as i32)
                .key(&key)
                .payload(&value);
            while let Err((_, back)) = producer.send(record) {
                record = back;
                producer.poll(Duration::from_millis(5));
            }
        }
        producer.flush(Duration::from_secs(300)).expect("flush");
    })
}

/// Every final result read with read_committed is one of the model's, once, with its
/// count, and every one of the model's is there.
fn assert_final_results(s: &Setup, expected: &BTreeMap<u64, u64>) {
    let outputs = read_records(&s.output, PARTITIONS, "read_committed");
    let mut seen: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for r in &outputs {
        let id: u64 = r.key.as_deref().expect("a key").parse().expect("an id");
        let value: serde_json::Value =
            serde_json::from_str(r.value.as_deref().expect("a value")).expect("JSON");
        seen.entry(id)
            .or_default()
            .push(value["n"].as_u64().expect("a count"));
    }
    let twice: Vec<_> = seen.iter().filter(|(_, v)| v.len() > 1).take(10).collect();
    let wrong: Vec<_> = seen
        .iter()
        .filter(|(id, v)| expected.get(id).is_some_and(|n| v[0] != *n))
        .map(|(id, v)| (id, v[0], expected[id]))
        .take(10)
        .collect();
    let unknown: Vec<_> = seen
        .keys()
        .filter(|id| !expected.contains_key(id))
        .take(10)
        .collect();
    let missing: Vec<_> = expected
        .keys()
        .filter(|id| !seen.contains_key(id))
        .take(10)
        .collect();
    assert!(
        twice.is_empty() && wrong.is_empty() && unknown.is_empty() && missing.is_empty(),
        "{} results read, {} expected; emitted more than once: {twice:?}; wrong counts (id, got, expected): {wrong:?}; not expected: {unknown:?}; missing: {missing:?}",
        outputs.len(),
        expected.len()
    );
}

const GAP: i64 = 150;
const SESSION_GRACE: i64 = 500;

/// The model of sessions: per partition, in order, a record is late when its time plus the
/// gap and the grace is at most stream time; else it joins (and merges) its key's open
/// sessions within the gap; then every session whose end plus gap and grace stream time
/// has reached closes. The closed sessions by id (start - BASE, times 100, plus the key)
/// with their counts.
fn expected_sessions(clicks: &[Click]) -> (BTreeMap<u64, u64>, usize) {
    let close_after = GAP + SESSION_GRACE;
    let mut stream_time: BTreeMap<u64, i64> = BTreeMap::new();
    // Open sessions by key: (start, end, count).
    let mut open: BTreeMap<u64, Vec<(i64, i64, u64)>> = BTreeMap::new();
    let mut closed = BTreeMap::new();
    let mut bridged = 0;
    for c in clicks {
        let p = c.key % PARTITIONS as u64;
        let st = stream_time.entry(p).or_insert(i64::MIN);
        *st = (*st).max(c.ts);
        let st = *st;
        if c.ts + close_after > st {
            let sessions = open.entry(c.key).or_default();
            let (near, mut far): (Vec<_>, Vec<_>) = sessions
                .drain(..)
                .partition(|&(s, e, _)| s - GAP <= c.ts && c.ts <= e + GAP);
            bridged += usize::from(near.len() > 1);
            let merged = near
                .iter()
                .fold((c.ts, c.ts, 1), |(s, e, n), &(s2, e2, n2)| {
                    (s.min(s2), e.max(e2), n + n2)
                });
            far.push(merged);
            *sessions = far;
        }
        for (key, sessions) in open.iter_mut().filter(|(k, _)| *k % PARTITIONS as u64 == p) {
            sessions.retain(|&(s, e, n)| {
                let done = e + close_after <= st;
                if done {
                    closed.insert((s - *BASE) as u64 * 100 + key, n);
                }
                !done
            });
        }
    }
    (closed, bridged)
}

/// Feeds `clicks` while instance `instance` is SIGKILLed three times mid-run, then lets one
/// finish: every expected result must come out.
fn sigkilled_thrice(s: &Setup, clicks: Vec<Click>, expected: &BTreeMap<u64, u64>, instance: &str) {
    let feeder = feed(s, clicks, 2_000);
    kill_mid_run(
        &|| spawn_job(&s.topology, instance, &[]),
        &s.output,
        PARTITIONS,
        expected.len(),
        3,
    );
    feeder.join().expect("feeder");
    let child = spawn_job(&s.topology, instance, &[]);
    let seen = wait_for_distinct(
        &s.output,
        PARTITIONS,
        expected.len(),
        Duration::from_secs(180),
    );
    terminate(child);
    assert_eq!(seen, expected.len(), "not every result came out");
}

const SLIDE: i64 = 300;
const SLIDE_GRACE: i64 = 700;

/// The model of sliding windows: per partition, in order, a record is late when its time plus
/// the grace is at most stream time; else it counts in every window of its key whose end is
/// at or after it and at most SLIDE after it, a window ending at each distinct time of an
/// on-time record. The windows closed at the end (end + grace <= stream time) by id (end -
/// BASE, times 100, plus the key) with their counts.
fn expected_sliding(clicks: &[Click]) -> BTreeMap<u64, u64> {
    let mut stream_time: BTreeMap<u64, i64> = BTreeMap::new();
    let mut kept: BTreeMap<u64, Vec<i64>> = BTreeMap::new();
    for c in clicks {
        let p = c.key % PARTITIONS as u64;
        let st = stream_time.entry(p).or_insert(i64::MIN);
        *st = (*st).max(c.ts);
        if c.ts + SLIDE_GRACE > *st {
            kept.entry(c.key).or_default().push(c.ts);
        }
    }
    let mut closed = BTreeMap::new();
    for (key, times) in &kept {
        let st = stream_time[&(key % PARTITIONS as u64)];
        for &end in times {
            if end + SLIDE_GRACE <= st {
                let n = times
                    .iter()
                    .filter(|t| **t >= end - SLIDE && **t <= end)
                    .count();
                closed.insert((end - *BASE) as u64 * 100 + key, n as u64);
            }
        }
    }
    closed
}

#[test]
fn the_model_has_late_records_and_windows_to_close() {
    let clicks = clicks(20_000);
    let (finals, late) = expected(&clicks);
    assert!(late > 200, "{late} late records");
    assert!(finals.len() > 1_000, "{} windows", finals.len());
    // Sessions merge: fewer sessions than a record's own would make, and some of many.
    let (sessions, bridged) = expected_sessions(&clicks);
    assert!(
        sessions.len() > 1_000 && sessions.len() < 15_000,
        "{} sessions",
        sessions.len()
    );
    assert!(bridged > 100, "{bridged} records bridged two sessions");
    let sliding = expected_sliding(&clicks);
    assert!(sliding.values().any(|&n| n >= 3), "no sliding window of 3");
    assert!(sessions.values().any(|&n| n >= 5), "no long session");
}

#[test]
fn every_final_result_comes_once_with_its_exact_count_across_sigkills() {
    let s = setup("win-crash");
    let clicks = clicks(40_000);
    let (expected, _) = expected(&clicks);
    sigkilled_thrice(&s, clicks, &expected, "win-0");
    assert_final_results(&s, &expected);
}

/// Every third commit's answer is lost (the transaction committed; the job is told it
/// failed): the job replaces its producer and reloads its windows from the changelog, so a
/// window whose final result that transaction emitted is not emitted again.
#[test]
fn every_final_result_comes_once_when_commit_answers_are_lost() {
    let s = setup("win-lost-commit");
    let clicks = clicks(20_000);
    let (expected, _) = expected(&clicks);
    let feeder = feed(&s, clicks, 4_000);
    let child = spawn_job(
        &s.topology,
        "win-0",
        &[("ONCEFLOW_FAILPOINT_LOSE_COMMIT_EVERY", "3")],
    );
    feeder.join().expect("feeder");
    let seen = wait_for_distinct(
        &s.output,
        PARTITIONS,
        expected.len(),
        Duration::from_secs(180),
    );
    terminate(child);
    assert_eq!(seen, expected.len(), "not every result came out");
    assert_final_results(&s, &expected);
}

/// Sessions of each key grow, merge when an out-of-order record bridges two, and close
/// after their gap, while the job is SIGKILLed: each closed session once, with its count.
#[test]
fn every_session_comes_once_with_its_exact_count_across_sigkills() {
    let s = setup_window(
        "session-crash",
        &format!("{{session: {GAP}ms, grace: {SESSION_GRACE}ms, time: value.ts}}"),
        &format!("string((value.start - {}) * 100 + int(string(key)))", *BASE),
    );
    let clicks = clicks(40_000);
    let (expected, _) = expected_sessions(&clicks);
    sigkilled_thrice(&s, clicks, &expected, "session-0");
    assert_final_results(&s, &expected);
}

/// Each record's sliding window counts its key's records of the 300 ms before it, out of
/// order ones included, while the job is SIGKILLed: each closed window once, with its count.
#[test]
fn every_sliding_window_comes_once_with_its_exact_count_across_sigkills() {
    let s = setup_window(
        "sliding-crash",
        &format!("{{sliding: {SLIDE}ms, grace: {SLIDE_GRACE}ms, time: value.ts}}"),
        &format!("string((value.end - {}) * 100 + int(string(key)))", *BASE),
    );
    let clicks = clicks(30_000);
    let expected = expected_sliding(&clicks);
    sigkilled_thrice(&s, clicks, &expected, "sliding-0");
    assert_final_results(&s, &expected);
}

/// Windows close while their partitions move: three instances, then one, then three.
#[test]
fn every_final_result_comes_once_while_instances_leave_and_join() {
    let s = setup("win-scale");
    let clicks = clicks(30_000);
    let (expected, _) = expected(&clicks);
    let feeder = feed(&s, clicks, 2_000);
    let spawn = |n: usize| spawn_job(&s.topology, &format!("win-scale-{n}"), &[]);
    let mut instances: Vec<_> = (0..3).map(spawn).collect();
    wait_for_distinct(&s.output, PARTITIONS, 300, Duration::from_secs(90));
    for child in instances.drain(1..) {
        terminate(child);
    }
    let visible = distinct_now(&s.output, PARTITIONS, Duration::from_secs(2));
    wait_for_distinct(
        &s.output,
        PARTITIONS,
        visible + 300,
        Duration::from_secs(90),
    );
    instances.extend((1..3).map(spawn));
    feeder.join().expect("feeder");
    let seen = wait_for_distinct(
        &s.output,
        PARTITIONS,
        expected.len(),
        Duration::from_secs(180),
    );
    for child in instances {
        terminate(child);
    }
    assert_eq!(seen, expected.len(), "not every window came out");
    assert_final_results(&s, &expected);
}

/// A frozen instance holding windows wakes after its replacement took them over: it is
/// fenced, and no window comes out twice.
#[test]
fn a_frozen_zombie_emits_no_window_twice() {
    let s = setup("win-zombie");
    let clicks = clicks(30_000);
    let (expected, _) = expected(&clicks);
    let feeder = feed(&s, clicks, 2_000);
    let (replacement, _disks) =
        zombie_on_its_own_disk(&s.topology, "win-z", &s.output, PARTITIONS, expected.len());
    feeder.join().expect("feeder");
    terminate(replacement);
    assert_final_results(&s, &expected);
}

/// A `delay` job's topics and topology (its state under `${STATE_DIR}` when `state` is
/// `None`), and `n` records due from 5 s from now over `spread_ms`, by id.
struct Delayed {
    output: String,
    topology: std::path::PathBuf,
    _dir: tempfile::TempDir,
    due: BTreeMap<u64, i64>,
}

fn delayed(name: &str, state: Option<&std::path::Path>, n: u64, spread_ms: i64) -> Delayed {
    let input = unique(&format!("{name}-in"));
    let output = unique(&format!("{name}-out"));
    let job = unique(name);
    create_topics(&[&input], PARTITIONS);
    create_replicated_topics(
        &[&output],
        PARTITIONS,
        1,
        &[("message.timestamp.type", "LogAppendTime")],
    );
    let state_dir = state.map_or("${STATE_DIR}".to_string(), |p| p.display().to_string());
    let yaml = format!(
        "name: {job}\ninputs:\n  - {{topic: {input}, codec: json}}\npipeline:\n  - delay: {{name: later, until: value.due}}\n  - set_key: string(value.id)\noutputs:\n  - {{topic: {output}, codec: json}}\nruntime:\n  session_timeout_ms: 10000\n  commit_interval_ms: 100\n  group_protocol: {}\n  state_dir: {state_dir}\n",
        group_protocol(),
    );
    let (_dir, topology) = topology_file(&yaml);
    let start = now_ms() + 5_000;
    let due: BTreeMap<u64, i64> = (0..n)
        .map(|id| (id, start + (id * 7_919 % n) as i64 * spread_ms / n as i64))
        .collect();
    let records: Vec<_> = due
        .iter()
        .map(|(id, at)| {
            (
                Some(format!("k{}", id % 97)),
                format!(r#"{{"id":{id},"due":{at}}}"#),
            )
        })
        .collect();
    produce_records(&input, records);
    Delayed {
        output,
        topology,
        _dir,
        due,
    }
}

/// Each delayed record once in the output, read committed; none sent before it was due (by
/// the time the broker appended it). Returns the output records.
fn assert_delayed_once(d: &Delayed) -> Vec<ReadRecord> {
    let ids: BTreeSet<u64> = d.due.keys().copied().collect();
    let outputs = read_records(&d.output, PARTITIONS, "read_committed");
    assert_exactly_once(&ids, &ids_of(&outputs));
    let early: Vec<(u64, i64)> = outputs
        .iter()
        .filter_map(|r| {
            let id: u64 = r.key.as_deref().expect("key").parse().expect("id");
            let appended = r.timestamp.expect("an append time");
            (appended < d.due[&id]).then(|| (id, d.due[&id] - appended))
        })
        .collect();
    assert!(
        early.is_empty(),
        "sent before due (id, ms early): {:?}",
        &early[..early.len().min(10)]
    );
    outputs
}

/// `delay`: 10,000 records due over 60 s, held and sent by the wall clock while the job is
/// SIGKILLed and restarted. Every record comes out once, none before it is due (by the
/// time the broker appended it), and while the job is up, 99 % within the commit interval
/// plus 1 s of their due time.
#[test]
fn delayed_records_come_out_once_and_on_time_across_sigkills() {
    let state = tempfile::tempdir().expect("state dir");
    let d = delayed("delay", Some(state.path()), 10_000, 60_000);
    // Up, SIGKILLed, restarted, three times, at moments spread over the minute.
    let mut down: Vec<(i64, i64)> = Vec::new();
    let mut child = spawn_job(&d.topology, "delay-0", &[]);
    for pause in [9, 17, 13] {
        std::thread::sleep(Duration::from_secs(pause));
        child.kill().expect("SIGKILL");
        child.wait().expect("reap");
        // A record due just before the kill may not have committed yet: down from a second
        // before (the commit interval and the punctuation's period, with room).
        let killed = now_ms() - 1_000;
        std::thread::sleep(Duration::from_secs(2));
        child = spawn_job(&d.topology, "delay-0", &[]);
        // Down until it is back: started, restored and looking again (a few seconds).
        down.push((killed, now_ms() + 8_000));
    }
    let seen = wait_for_distinct(&d.output, PARTITIONS, d.due.len(), Duration::from_secs(120));
    terminate(child);
    assert_eq!(seen, d.due.len(), "not every delayed record came out");
    let outputs = assert_delayed_once(&d);
    let mut lateness: Vec<i64> = outputs
        .iter()
        .filter_map(|r| {
            let id: u64 = r.key.as_deref().expect("key").parse().expect("id");
            let due = d.due[&id];
            let up = !down.iter().any(|&(from, to)| due >= from && due <= to);
            up.then(|| r.timestamp.expect("an append time") - due)
        })
        .collect();
    lateness.sort_unstable();
    let p = |q: f64| lateness[((lateness.len() - 1) as f64 * q) as usize];
    eprintln!(
        "delay: {} records due while up; lateness ms p50 {} p99 {} max {}",
        lateness.len(),
        p(0.5),
        p(0.99),
        lateness[lateness.len() - 1]
    );
    assert!(
        lateness.len() > 4_000,
        "too few records due while up: {}",
        lateness.len()
    );
    assert!(p(0.99) <= 100 + 1_000, "p99 lateness {} ms", p(0.99));
}

/// `delay` with a zombie: an instance frozen (SIGSTOP) while it holds records not yet due,
/// replaced by another instance (its own transactional id, its own disk) once its session
/// times out, then woken. Its producer is not fenced by the replacement's (another
/// transactional id): only the group generation its punctuation commits with fences it. The
/// replacement sends every record; each comes out once, none early.
#[test]
fn a_frozen_zombie_sends_no_delayed_record_twice() {
    let d = delayed("delay-z", None, 5_000, 40_000);
    let disks = disks_apart(&d.topology);
    let disk = |i: usize| disks[i].path().display().to_string();
    let zombie = spawn_job(&d.topology, "delay-z0", &[("STATE_DIR", disk(0).as_str())]);
    let replacement = freeze_replace_wake(
        zombie,
        &|| spawn_job(&d.topology, "delay-z1", &[("STATE_DIR", disk(1).as_str())]),
        &d.output,
        PARTITIONS,
        d.due.len(),
    );
    terminate(replacement);
    assert_delayed_once(&d);
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
