//! `onceflow run` as a real process on the real broker: SIGKILLed at random moments and
//! restarted, and a paused zombie fenced by its replacement. The output is checked by ids.

mod common;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::*;

const PARTITIONS: i32 = 4;

struct Setup {
    _dir: tempfile::TempDir,
    topology: PathBuf,
    input: String,
    output: String,
}

/// Empty input and output topics and a topology between them; each test feeds its own input.
fn setup(name: &str, extra_runtime: &str) -> Setup {
    let input = unique(&format!("{name}-in"));
    let output = unique(&format!("{name}-out"));
    create_topics(&[&input, &output], PARTITIONS);
    let (dir, topology) = topology_file(&topology_yaml(
        &unique(name),
        &input,
        &output,
        extra_runtime,
    ));
    Setup {
        _dir: dir,
        topology,
        input,
        output,
    }
}

/// Writes `ids` to the input at `per_second` on a thread of its own, as the tests' live input.
fn feed(
    s: &Setup,
    ids: impl IntoIterator<Item = u64> + Send + 'static,
    per_second: u64,
) -> std::thread::JoinHandle<()> {
    let input = s.input.clone();
    std::thread::spawn(move || produce_ids_paced(&input, ids, Some(per_second)))
}

fn spawn(setup: &Setup, instance: &str) -> KillOnDrop {
    spawn_job(&setup.topology, instance, &[])
}

#[test]
fn sigkilled_job_restarts_without_loss_or_duplicates() {
    sigkilled_and_restarted("crash", "");
}

/// The same with commits overlapping processing: a kill may fall while a transaction commits
/// in the background and the next records are held.
#[test]
fn sigkilled_job_with_overlapped_commits_restarts_without_loss_or_duplicates() {
    sigkilled_and_restarted("crash-ov", "  overlap_commits: true\n");
}

fn sigkilled_and_restarted(name: &str, runtime: &str) {
    let s = setup(name, &format!("  max_records_per_txn: 1000\n{runtime}"));
    let ids: BTreeSet<u64> = (0..100_000).collect();
    // Records arrive over ~50 s, so the job cannot be done before it was killed a few times,
    // even where each restart takes 10 s or more (at 4,000/s over 25 s, two slow restarts
    // on a loaded machine let the feed end before the third kill).
    let feeder = feed(&s, ids.clone(), 2_000);
    kill_mid_run(
        &|| spawn(&s, &format!("{name}-0")),
        &s.output,
        PARTITIONS,
        ids.len(),
        3,
    );
    feeder.join().expect("feeder");

    let child = spawn(&s, &format!("{name}-0"));
    let seen = wait_for_distinct(&s.output, PARTITIONS, ids.len(), Duration::from_secs(180));
    terminate(child);
    assert_eq!(
        seen,
        ids.len(),
        "not every record came through after the restarts"
    );
    let outputs = read_records(&s.output, PARTITIONS, "read_committed");
    assert_exactly_once(&ids, &ids_of(&outputs));
    // Each output names the input record it came from, whether it was sent at once or held
    // while a commit ran in the background (overlapped commits).
    assert_lineage(&s.input, PARTITIONS, &outputs);
}

/// A zombie holding an open transaction: an instance frozen in the middle of its work for
/// longer than its session timeout while a replacement with the same instance id takes over,
/// then woken. It must stop (by its stall watch or by the fences, whichever comes first), and
/// the replacement finish the work exactly once. A process frozen for less than its session
/// timeout is no zombie: under the KIP-848 protocol it keeps its membership and the replacement
/// waits for the id, so the freeze lasts past the timeout however fast the replacement is.
#[test]
fn paused_zombie_is_fenced_by_its_replacement() {
    let s = setup("zombie", "  max_records_per_txn: 500\n");
    let ids: BTreeSet<u64> = (0..30_000).collect();
    // Paced over ~15 s: the instance is mid-work, a transaction open, when it is frozen.
    let feeder = feed(&s, ids.clone(), 2_000);
    let zombie = spawn(&s, "zombie-0");
    let replacement = freeze_replace_wake(
        zombie,
        &|| spawn(&s, "zombie-0"),
        &s.output,
        PARTITIONS,
        ids.len(),
    );
    feeder.join().expect("feeder");
    terminate(replacement);
    assert_exactly_once(&ids, &read_all(&s.output, PARTITIONS, "read_committed"));
}

/// The operator's way to make a zombie: an instance frozen past its session timeout, a
/// replacement started with the same instance id, then the frozen one woken while input
/// still arrives. The woken one must end itself (status 3, from its stall watch) instead of
/// rejoining under the same `group.instance.id` and fencing its replacement, which must live
/// on and finish the work exactly once.
#[test]
fn a_zombie_woken_after_its_session_expired_ends_itself_and_its_replacement_survives() {
    let s = setup("woken", "  max_records_per_txn: 500\n");
    let first: BTreeSet<u64> = (0..5_000).collect();
    produce_ids(&s.input, first.iter().copied());
    let mut zombie = spawn(&s, "woken-0");
    assert_eq!(
        wait_for_distinct(&s.output, PARTITIONS, first.len(), Duration::from_secs(120)),
        first.len(),
        "the first instance did not start"
    );
    let all: BTreeSet<u64> = (0..25_000).collect();
    let feeder = feed(&s, 5_000..25_000, 1_000);
    std::thread::sleep(Duration::from_secs(2));
    signal(&zombie, "-STOP");
    // Past its 10 s session timeout: the group expires the frozen member.
    std::thread::sleep(Duration::from_secs(12));
    let mut replacement = spawn(&s, "woken-0");
    let frozen_at = distinct_now(&s.output, PARTITIONS, Duration::from_secs(1));
    assert!(
        wait_for_distinct(
            &s.output,
            PARTITIONS,
            frozen_at + 500,
            Duration::from_secs(90)
        ) >= frozen_at + 500,
        "the replacement did not take over"
    );

    signal(&zombie, "-CONT");
    let status = wait_exit(&mut zombie, Duration::from_secs(30));
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(3),
        "the woken zombie must end itself: {status:?}"
    );
    feeder.join().expect("feeder");
    let seen = wait_for_distinct(&s.output, PARTITIONS, all.len(), Duration::from_secs(180));
    assert!(
        replacement.try_wait().expect("try_wait").is_none(),
        "the replacement died"
    );
    terminate(replacement);
    assert_eq!(seen, all.len(), "not every record came through");
    assert_exactly_once(&all, &read_all(&s.output, PARTITIONS, "read_committed"));
}

/// Two live processes started with one instance id by mistake take the id from each other
/// (each rejoin and each rebuilt producer fences the other): the fence rule (crate::fence)
/// must stop one of them, with status 1, within moments rather than let them trade the id
/// forever, and the other must finish the work exactly once.
#[test]
fn of_two_live_instances_sharing_an_id_one_stops_and_the_other_finishes() {
    let s = setup("twins", "  max_records_per_txn: 500\n");
    let all: BTreeSet<u64> = (0..20_000).collect();
    let feeder = feed(&s, all.clone(), 1_000);
    let mut first = spawn(&s, "twin-0");
    assert!(
        wait_for_distinct(&s.output, PARTITIONS, 500, Duration::from_secs(120)) >= 500,
        "the first instance did not start"
    );
    let mut second = spawn(&s, "twin-0");
    let deadline = Instant::now() + Duration::from_secs(150);
    let (stopped, mut survivor) = loop {
        if let Some(status) = first.try_wait().expect("try_wait") {
            break (status, second);
        }
        if let Some(status) = second.try_wait().expect("try_wait") {
            break (status, first);
        }
        assert!(
            Instant::now() < deadline,
            "both instances with one id still run after 150 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(
        stopped.code(),
        Some(1),
        "the one that stops fails: {stopped:?}"
    );
    feeder.join().expect("feeder");
    let seen = wait_for_distinct(&s.output, PARTITIONS, all.len(), Duration::from_secs(180));
    assert!(
        survivor.try_wait().expect("try_wait").is_none(),
        "the other one must live on"
    );
    terminate(survivor);
    assert_eq!(seen, all.len(), "not every record came through");
    assert_exactly_once(&all, &read_all(&s.output, PARTITIONS, "read_committed"));
}

#[test]
fn instances_joining_and_dying_mid_run_keep_exactly_once() {
    joining_and_dying("scale", "");
}

/// The same with commits overlapping processing: a rebalance's commit waits for the one in
/// the background, then commits what was held.
#[test]
fn instances_joining_and_dying_mid_run_with_overlapped_commits_keep_exactly_once() {
    joining_and_dying("scale-ov", "  overlap_commits: true\n");
}

fn joining_and_dying(name: &str, runtime: &str) {
    let s = setup(name, &format!("  max_records_per_txn: 500\n{runtime}"));
    let ids: BTreeSet<u64> = (0..60_000).collect();
    // Records arrive over ~12 s while instances come and go.
    let feeder = feed(&s, ids.clone(), 5_000);
    let mut first = spawn(&s, &format!("{name}-a"));
    std::thread::sleep(Duration::from_secs(3));
    // A second instance joins: the first one hands partitions over in a cooperative
    // rebalance, committing its transaction in flight.
    let second = spawn(&s, &format!("{name}-b"));
    std::thread::sleep(Duration::from_secs(7));
    // Then the first one dies; after its session times out the second takes its partitions.
    first.kill().expect("SIGKILL");
    first.wait().expect("reap");
    assert!(
        !feeder.is_finished(),
        "input ended before the first instance died"
    );
    feeder.join().expect("feeder");

    let seen = wait_for_distinct(&s.output, PARTITIONS, ids.len(), Duration::from_secs(180));
    terminate(second);
    assert_eq!(seen, ids.len(), "not every record came through");
    assert_exactly_once(&ids, &read_all(&s.output, PARTITIONS, "read_committed"));
}

#[test]
fn a_stop_that_hangs_exits_after_its_grace_period() {
    use std::process::{Command, Stdio};
    // Nothing listens on port 1: the producer's registration keeps waiting (up to 30 s) and
    // the stop cannot finish; the process exits 1 after the grace period (15 s at least).
    let (_dir, topology) = topology_file(&topology_yaml(
        &unique("hang"),
        "in",
        "out",
        "  transaction_timeout_ms: 2000\n",
    ));
    let mut child = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_onceflow"))
            .arg("run")
            .arg(&topology)
            .args([
                "--bootstrap-servers",
                "127.0.0.1:1",
                "--instance-id",
                "hang-0",
            ])
            .env("RUST_LOG", "error")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn onceflow"),
    );
    std::thread::sleep(Duration::from_secs(1));
    let signalled = Instant::now();
    signal(&child, "-TERM");
    let status = wait_exit(&mut child, Duration::from_secs(40)).expect("exited");
    let took = signalled.elapsed();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut stderr)
        .expect("read stderr");
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("the job did not stop within 15s"),
        "{stderr}"
    );
    assert!(
        took >= Duration::from_secs(14) && took < Duration::from_secs(25),
        "exited {took:?} after SIGTERM"
    );
}

#[test]
fn a_sigterm_while_the_job_starts_is_a_clean_stop() {
    // The start is held for 3 s before the topology is loaded; the signal comes in it. Before
    // the signal handlers were installed first thing, it ended the process (status 143).
    let setup = setup("sigterm-start", "");
    let mut job = spawn_job(
        &setup.topology,
        "i0",
        &[("ONCEFLOW_FAILPOINT_START_DELAY_MS", "3000")],
    );
    std::thread::sleep(Duration::from_millis(500));
    signal(&job, "-TERM");
    let status = wait_exit(&mut job, Duration::from_secs(60));
    assert!(
        status.is_some_and(|s| s.success()),
        "a SIGTERM during the start should stop the job cleanly (exit 0): {status:?}"
    );
}

/// `onceflow run` of instance `instance` that writes its summary (with its aborted
/// transactions) to `summary` when it stops.
fn spawn_with_summary(s: &Setup, instance: &str, summary: &std::path::Path) -> KillOnDrop {
    spawn_with_summary_and_env(s, instance, summary, &[])
}

/// [`spawn_with_summary`], with `env` added to the process's environment.
fn spawn_with_summary_and_env(
    s: &Setup,
    instance: &str,
    summary: &std::path::Path,
    env: &[(&str, &str)],
) -> KillOnDrop {
    use std::process::{Command, Stdio};
    KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_onceflow"))
            .envs(env.iter().copied())
            .arg("run")
            .arg(&s.topology)
            .args([
                "--bootstrap-servers",
                &bootstrap(),
                "--instance-id",
                instance,
            ])
            .args(["--progress-interval", "0", "--summary-json"])
            .arg(summary)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn onceflow"),
    )
}

#[test]
fn a_rolling_restart_aborts_at_most_the_transaction_in_flight_per_restarted_instance() {
    let s = setup("rolling", "  max_records_per_txn: 500\n");
    let ids: BTreeSet<u64> = (0..40_000).collect();
    // Records keep arriving through the whole restart (~20 s of input).
    let feeder = feed(&s, ids.clone(), 2_000);
    let summaries = tempfile::tempdir().expect("tempdir");
    let summary = |instance: usize, incarnation: usize| {
        summaries
            .path()
            .join(format!("r-{instance}.{incarnation}.json"))
    };
    let mut instances: Vec<KillOnDrop> = (0..3)
        .map(|i| spawn_with_summary(&s, &format!("r-{i}"), &summary(i, 0)))
        .collect();
    let mut seen = wait_for_distinct(&s.output, PARTITIONS, 1, Duration::from_secs(60));
    assert!(seen > 0, "nothing came through before the restart");
    // One instance after the other: SIGTERM (it commits and leaves), start it again, and go
    // on once output has moved on.
    for i in 0..3 {
        let old = instances.remove(i);
        terminate(old);
        instances.insert(i, spawn_with_summary(&s, &format!("r-{i}"), &summary(i, 1)));
        let before = seen;
        seen = wait_for_distinct(&s.output, PARTITIONS, before + 1, Duration::from_secs(60));
        assert!(seen > before, "no progress after restarting r-{i}");
        std::thread::sleep(Duration::from_secs(2));
    }
    feeder.join().expect("feeder");
    let done = wait_for_distinct(&s.output, PARTITIONS, ids.len(), Duration::from_secs(120));
    for child in instances {
        terminate(child);
    }
    assert_eq!(done, ids.len(), "not every record came through");
    assert_exactly_once(&ids, &read_all(&s.output, PARTITIONS, "read_committed"));
    let mut aborted = 0;
    let mut committed = 0;
    for entry in std::fs::read_dir(summaries.path()).expect("summaries") {
        let path = entry.expect("entry").path();
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).expect("summary")).expect("json");
        aborted += json["aborted"].as_u64().expect("aborted");
        committed += json["committed"].as_u64().expect("committed");
    }
    eprintln!(
        "rolling restart of 3 instances: {committed} transactions committed, {aborted} aborted"
    );
    assert!(committed > 0);
    assert!(
        aborted <= 3,
        "{aborted} transactions aborted over a rolling restart of 3 instances (at most the one in flight per restarted instance)"
    );
}

/// A transactional client call that never returns (a request whose answer never reaches the
/// client, as after a coordinator's broker was SIGKILLed) is abandoned with its client, 2.5 s
/// past its own timeout, and a new producer with the same transactional.id carries on in the
/// same process: no exit, and every record once. Without that, the watchdog of client calls
/// ends the process (exit 1) 5 s past the call's timeout.
#[test]
fn a_client_call_that_never_returns_is_abandoned_and_the_job_carries_on() {
    let s = setup(
        "hung-call",
        "  transaction_timeout_ms: 5000\n  max_records_per_txn: 500\n",
    );
    let ids: BTreeSet<u64> = (0..20_000).collect();
    let feeder = feed(&s, ids.clone(), 2_000);
    let dir = tempfile::tempdir().expect("tempdir");
    let summary = dir.path().join("summary.json");
    // The fifth send_offsets_to_transaction of the process does not return.
    let child = std::cell::RefCell::new(spawn_with_summary_and_env(
        &s,
        "hung-call-0",
        &summary,
        &[("ONCEFLOW_FAILPOINT_HANG_SEND_OFFSETS", "5")],
    ));
    let exited = std::cell::Cell::new(None);
    let seen = wait_for_distinct_while(
        &s.output,
        PARTITIONS,
        ids.len(),
        Duration::from_secs(180),
        &|| {
            let status = child.borrow_mut().try_wait().expect("try_wait");
            exited.set(status);
            status.is_none()
        },
    );
    feeder.join().expect("feeder");
    assert_eq!(
        exited.get(),
        None,
        "the job exited with a call hung ({seen} of {} records through)",
        ids.len()
    );
    terminate(child.into_inner());
    assert_eq!(seen, ids.len(), "not every record came through");
    assert_exactly_once(&ids, &read_all(&s.output, PARTITIONS, "read_committed"));
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&summary).expect("summary")).expect("json");
    assert!(
        json["producer_rebuilds"]
            .as_u64()
            .expect("producer_rebuilds")
            >= 1,
        "no producer was rebuilt: the hung call was not reached ({json})"
    );
}
