//! The `http` output on the real broker, calling a real HTTP server started by the test: a
//! job SIGKILLed mid-run against a slow server that fails some calls (500, 429 with
//! Retry-After, dropped connections before and after applying) makes every call at least
//! once, each key's calls in order, and the server deduplicating by idempotency key holds
//! exactly the events; a record the server refuses (400) goes to the dead-letter topic; with
//! `dedup: {postgres: ...}`, keys delivered before are not called again (for endpoints that
//! ignore idempotency keys), across aborted transactions and a SIGKILL.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use rand::Rng;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

/// What the server does with one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// Apply (unless applied before) and answer 200.
    None,
    /// Answer 500 without applying.
    Error500,
    /// Answer 429 with `Retry-After: 1` without applying.
    TooMany,
    /// Close the connection without applying nor answering.
    DropBefore,
    /// Apply, then close the connection without answering: the call was made, the client
    /// does not know.
    DropAfter,
    /// Answer 400 with a long body, without applying.
    Reject,
}

type Policy = Arc<dyn Fn(u64) -> Fault + Send + Sync>;

/// What the server saw.
#[derive(Default)]
struct State {
    requests: u64,
    /// Every idempotency key received, applied or not.
    received: BTreeSet<String>,
    /// Idempotency key -> event id, for the calls applied (each key once).
    applied: BTreeMap<String, u64>,
    /// Requests for a key applied before: the repeats the endpoint absorbs.
    repeats: u64,
    /// The last sequence number applied per Kafka key.
    last_seq: HashMap<String, u64>,
    /// Calls applied out of their key's order, or malformed.
    violations: Vec<String>,
    faults: BTreeMap<String, u64>,
}

struct Server {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    _runtime: tokio::runtime::Runtime,
}

impl Server {
    /// A server on a free local port; `policy` decides by event id; answers take
    /// `delay_ms` (a random value in the range).
    fn start(policy: Policy, delay_ms: (u64, u64)) -> Server {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let state = Arc::new(Mutex::new(State::default()));
        let shared = Arc::clone(&state);
        runtime.spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (state, policy) = (Arc::clone(&shared), Arc::clone(&policy));
                tokio::spawn(serve(stream, state, policy, delay_ms));
            }
        });
        Server {
            addr,
            state,
            _runtime: runtime,
        }
    }

    fn applied(&self) -> usize {
        self.state.lock().unwrap().applied.len()
    }
}

/// One HTTP/1.1 connection: requests one after another (keep-alive).
async fn serve(
    stream: tokio::net::TcpStream,
    state: Arc<Mutex<State>>,
    policy: Policy,
    delay_ms: (u64, u64),
) {
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::new(read);
    loop {
        let mut request_line = String::new();
        if read.read_line(&mut request_line).await.unwrap_or(0) == 0 {
            return;
        }
        let path = request_line
            .split_whitespace()
            .nth(1)
            .unwrap_or_default()
            .to_string();
        let (mut length, mut key) = (0usize, None);
        loop {
            let mut line = String::new();
            if read.read_line(&mut line).await.unwrap_or(0) == 0 {
                return;
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                match name.trim().to_ascii_lowercase().as_str() {
                    "content-length" => length = value.trim().parse().unwrap_or(0),
                    "idempotency-key" => key = Some(value.trim().to_string()),
                    _ => {}
                }
            }
        }
        let mut body = vec![0; length];
        if read.read_exact(&mut body).await.is_err() {
            return;
        }
        let delay = rand::rng().random_range(delay_ms.0..=delay_ms.1);
        tokio::time::sleep(Duration::from_millis(delay)).await;
        let (status, extra, text) = match handle(&state, &policy, &path, key, &body) {
            Some(answer) => answer,
            None => return, // the connection is dropped
        };
        let reason = match status {
            200 => "OK",
            400 => "Bad Request",
            429 => "Too Many Requests",
            _ => "Internal Server Error",
        };
        let response = format!(
            "HTTP/1.1 {status} {reason}\r\ncontent-length: {}\r\n{extra}\r\n{text}",
            text.len()
        );
        if write.write_all(response.as_bytes()).await.is_err() {
            return;
        }
    }
}

/// Decides and records one request; `None` drops the connection.
fn handle(
    state: &Mutex<State>,
    policy: &Policy,
    path: &str,
    key: Option<String>,
    body: &[u8],
) -> Option<(u16, &'static str, String)> {
    let mut s = state.lock().unwrap();
    s.requests += 1;
    let Some(key) = key else {
        s.violations.push(format!("{path}: no idempotency key"));
        return Some((400, "", "no key".into()));
    };
    let event: serde_json::Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => {
            s.violations.push(format!("{path}: body is not JSON: {e}"));
            return Some((400, "", "bad body".into()));
        }
    };
    let id = event["id"].as_u64().unwrap_or(u64::MAX);
    s.received.insert(key.clone());
    let fault = policy(id);
    *s.faults.entry(format!("{fault:?}")).or_default() += 1;
    let apply = |s: &mut State| {
        if s.applied.contains_key(&key) {
            s.repeats += 1;
            return;
        }
        // The first application of each call: its key's sequence numbers must increase.
        if let (Some(k), Some(seq)) = (event["key"].as_str(), event["seq"].as_u64()) {
            let expected = format!("/events/{k}/{id}");
            if path != expected {
                s.violations
                    .push(format!("path {path}, expected {expected}"));
            }
            if let Some(last) = s.last_seq.get(k)
                && seq <= *last
            {
                s.violations
                    .push(format!("key {k}: seq {seq} applied after {last}"));
            }
            s.last_seq.insert(k.to_string(), seq);
        }
        s.applied.insert(key.clone(), id);
    };
    match fault {
        Fault::None => {
            apply(&mut s);
            Some((200, "", "{}".into()))
        }
        Fault::Error500 => Some((500, "", "try again".into())),
        Fault::TooMany => Some((429, "retry-after: 1\r\n", "slow down".into())),
        Fault::DropBefore => None,
        Fault::DropAfter => {
            apply(&mut s);
            None
        }
        Fault::Reject => Some((
            400,
            "content-type: application/json\r\n",
            format!(
                r#"{{"error":"event {id} is not acceptable","detail":"{}"}}"#,
                "x".repeat(400)
            ),
        )),
    }
}

fn http_topology(name: &str, input: &str, http: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    topology_file(&format!(
        "name: {name}\ninputs:\n  - topic: {input}\n    codec: json\noutputs:\n  - name: notify\n    http:\n{http}runtime:\n  session_timeout_ms: 10000\n  commit_interval_ms: 200\n"
    ))
}

const PARTITIONS: i32 = 4;
const EVENTS: u64 = 20_000;
const KEYS: u64 = 100;

#[test]
fn calls_survive_sigkills_and_faults_each_applied_once_in_key_order() {
    // Every request draws its fate: 5% 500, 3% 429 (Retry-After: 1), 2% dropped before and
    // 2% after applying; answers take 1-8 ms.
    let policy: Policy = Arc::new(|_| {
        let draw: f64 = rand::random();
        match draw {
            d if d < 0.05 => Fault::Error500,
            d if d < 0.08 => Fault::TooMany,
            d if d < 0.10 => Fault::DropBefore,
            d if d < 0.12 => Fault::DropAfter,
            _ => Fault::None,
        }
    });
    let server = Server::start(policy, (1, 8));
    let input = unique("http-in");
    let name = unique("http");
    create_topics(&[&input, &format!("{name}.dlq")], PARTITIONS);
    let http = format!(
        "      url: http://{}/events/{{key}}/{{id}}\n      headers: {{content-type: application/json}}\n      event_id: {{field: id}}\n      timeout_ms: 1000\n      max_in_flight: 8\n",
        server.addr
    );
    let (_dir, topology) = http_topology(&name, &input, &http);
    // Events of one key carry increasing sequence numbers; ids are the idempotency keys.
    let events: Vec<(Option<String>, String)> = (0..EVENTS)
        .map(|id| {
            let key = format!("k{}", id % KEYS);
            let value = format!(r#"{{"id":{id},"key":"{key}","seq":{}}}"#, id / KEYS);
            (Some(key), value)
        })
        .collect();
    let feeder = {
        let input = input.clone();
        std::thread::spawn(move || produce_records_paced(&input, events, Some(1_000)))
    };

    let mut rng = rand::rng();
    let mut kills_mid_run = 0;
    let mut applied = 0;
    for round in 0..8 {
        if kills_mid_run >= 3 {
            break;
        }
        let mut child = spawn_job(&topology, "http-0", &[]);
        let deadline = Instant::now() + Duration::from_secs(90);
        while server.applied() <= applied && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(server.applied() > applied, "round {round}: no progress");
        std::thread::sleep(Duration::from_millis(rng.random_range(0..1500)));
        child.kill().expect("SIGKILL");
        child.wait().expect("reap");
        applied = server.applied();
        eprintln!("round {round}: SIGKILL with {applied} of {EVENTS} events applied");
        if applied < EVENTS as usize {
            kills_mid_run += 1;
        }
    }
    assert!(kills_mid_run >= 3, "the job was not killed 3 times mid-run");
    feeder.join().expect("feeder");

    let child = spawn_job(&topology, "http-0", &[]);
    let deadline = Instant::now() + Duration::from_secs(180);
    while server.applied() < EVENTS as usize && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    terminate(child);

    let s = server.state.lock().unwrap();
    let expected: BTreeSet<String> = (0..EVENTS).map(|id| id.to_string()).collect();
    eprintln!(
        "{} requests for {EVENTS} events: {} repeats of applied calls absorbed; faults {:?}",
        s.requests, s.repeats, s.faults
    );
    let missing: Vec<&String> = expected.difference(&s.received).take(10).collect();
    assert!(missing.is_empty(), "never called: {missing:?}");
    let applied: BTreeSet<String> = s.applied.keys().cloned().collect();
    assert_eq!(applied, expected, "the applied calls are not the events");
    assert!(
        s.applied.iter().all(|(k, id)| *k == id.to_string()),
        "a key applied with another event's body"
    );
    assert!(
        s.violations.is_empty(),
        "{} violations: {:?}",
        s.violations.len(),
        &s.violations[..s.violations.len().min(10)]
    );
    for fault in ["Error500", "TooMany", "DropBefore", "DropAfter"] {
        assert!(
            s.faults.get(fault).copied().unwrap_or(0) > 0,
            "no {fault} injected"
        );
    }
    assert!(
        s.repeats > 0,
        "no call was repeated: the faults did not bite"
    );
}

/// The events the refusing server answers 400: every 100th.
fn is_refused(id: u64) -> bool {
    id % 100 == 7
}

/// A server refusing the events [`is_refused`] names (answers take `delay_ms`), and a job's
/// topics: its input (`partitions`), its name, its dead-letter topic.
fn refusing_job(
    prefix: &str,
    partitions: i32,
    delay_ms: (u64, u64),
) -> (Server, String, String, String) {
    let policy: Policy = Arc::new(|id| {
        if is_refused(id) {
            Fault::Reject
        } else {
            Fault::None
        }
    });
    let server = Server::start(policy, delay_ms);
    let input = unique(&format!("{prefix}-in"));
    let name = unique(prefix);
    let dlq = format!("{name}.dlq");
    create_topics(&[&input], partitions);
    create_topics(&[&dlq], 1);
    (server, input, name, dlq)
}

/// The dead-letter topic's records, read committed, after checking that each refused id is
/// among them exactly once.
fn letters_of(dlq: &str, refused: &BTreeSet<u64>) -> Vec<ReadRecord> {
    let letters = read_records(dlq, 1, "read_committed");
    let ids: Vec<u64> = letters
        .iter()
        .map(|r| r.key.as_deref().expect("key").parse().expect("an id"))
        .collect();
    assert_exactly_once(refused, &ids);
    letters
}

#[test]
fn a_call_the_endpoint_refuses_goes_to_the_dead_letter_topic() {
    const N: u64 = 1_500;
    let (server, input, name, dlq) = refusing_job("http400", 2, (0, 1));
    let http = format!("      url: http://{}/refusing/{{key}}\n", server.addr);
    let (_dir, topology) = http_topology(&name, &input, &http);
    produce_ids(&input, 0..N);
    let refused: BTreeSet<u64> = (0..N).filter(|id| is_refused(*id)).collect();
    let good = N as usize - refused.len();

    let child = spawn_job(&topology, "http400-0", &[]);
    let deadline = Instant::now() + Duration::from_secs(120);
    while server.applied() < good && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    let lettered = wait_for_distinct(&dlq, 1, refused.len(), Duration::from_secs(60));
    terminate(child);
    assert_eq!(server.applied(), good, "not every accepted call was made");
    assert_eq!(lettered, refused.len());

    let letters = letters_of(&dlq, &refused);
    for letter in &letters {
        let meta = |k: &str| letter.headers.get(k).map_or("", String::as_str);
        let message = meta(onceflow::dlq::H_MESSAGE);
        assert_eq!(meta(onceflow::dlq::H_KIND), "rejected", "{message}");
        assert_eq!(meta(onceflow::dlq::H_STAGE), "outputs[0] (notify)");
        assert!(message.contains("answered 400"), "{message}");
        assert!(message.contains("is not acceptable"), "{message}");
        assert!(message.len() < 600, "the body is cut: {message}");
    }
    // The server applied every accepted event, under its origin's idempotency key.
    let s = server.state.lock().unwrap();
    assert!(
        s.applied
            .keys()
            .all(|k| k.starts_with(&format!("{input}/")))
    );
    let applied: BTreeSet<u64> = s.applied.values().copied().collect();
    assert_eq!(applied.len(), good);
    assert!(applied.is_disjoint(&refused));
}

#[test]
fn a_refusal_costs_one_aborted_transaction_not_a_chain() {
    // Events arrive while the job runs, on three partitions; every 100th is refused. Each
    // abort does its batch again, and that batch alone: the calls made stay well under 2.5
    // times the events (1.8 in a run here; without the bound, 4.1: every redo took in new
    // events and their refusals, and each abort of the chain made all the calls since the
    // last commit again).
    const N: u64 = 3_000;
    let (server, input, name, dlq) = refusing_job("httpchain", 3, (1, 3));
    let http = format!("      url: http://{}/refusing/{{key}}\n", server.addr);
    let (_dir, topology) = http_topology(&name, &input, &http);
    let child = spawn_job(&topology, "httpchain-0", &[]);
    produce_ids_paced(&input, 0..N, Some(600));
    let refused: BTreeSet<u64> = (0..N).filter(|id| is_refused(*id)).collect();
    let good = N as usize - refused.len();
    let deadline = Instant::now() + Duration::from_secs(120);
    while server.applied() < good && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    let lettered = wait_for_distinct(&dlq, 1, refused.len(), Duration::from_secs(60));
    terminate(child);
    assert_eq!(server.applied(), good, "not every accepted call was made");
    assert_eq!(lettered, refused.len());
    letters_of(&dlq, &refused);
    let requests = server.state.lock().unwrap().requests;
    eprintln!(
        "{requests} requests for {N} events ({} refused)",
        refused.len()
    );
    assert!(
        requests < 5 * N / 2,
        "{requests} requests for {N} events ({} refused): aborts came in chains",
        refused.len()
    );
}

/// The database of `scripts/test` (`ONCEFLOW_TEST_PG_URL`), with a runtime for its client.
fn pg() -> (tokio::runtime::Runtime, tokio_postgres::Client) {
    let url = std::env::var("ONCEFLOW_TEST_PG_URL")
        .expect("ONCEFLOW_TEST_PG_URL is not set: run the tests with scripts/test");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (client, connection) = rt
        .block_on(tokio_postgres::connect(&url, tokio_postgres::NoTls))
        .expect("connect to the test database");
    rt.spawn(async move {
        let _ = connection.await;
    });
    (rt, client)
}

#[test]
fn dedup_in_postgres_calls_each_key_once_across_aborts_and_a_sigkill() {
    // The server counts a call of a key it applied before as a repeat (an endpoint ignoring
    // keys would apply it twice). Every 100th event is refused with a 400: each refusal aborts
    // its transaction, whose other calls come again; the inbox must absorb them all.
    const N: u64 = 4_000;
    const IN_FLIGHT: u64 = 4;
    let (server, input, name, dlq) = refusing_job("httpdedup", 4, (1, 3));
    let inbox = format!("inbox_{}", name.replace(['-', '.'], "_"));
    let http = format!(
        "      url: http://{}/dedup/{{key}}\n      event_id: {{field: id}}\n      max_in_flight: {IN_FLIGHT}\n      dedup: {{postgres: {{url_env: ONCEFLOW_TEST_PG_URL, inbox_table: {inbox}}}}}\n",
        server.addr
    );
    let (_dir, topology) = http_topology(&name, &input, &http);
    produce_ids(&input, 0..N);
    let refused: BTreeSet<u64> = (0..N).filter(|id| is_refused(*id)).collect();
    let good = N as usize - refused.len();

    let mut child = spawn_job(&topology, "httpdedup-0", &[]);
    let deadline = Instant::now() + Duration::from_secs(120);
    while server.applied() < good / 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().expect("SIGKILL");
    child.wait().expect("reap");
    let at_kill = server.applied();
    assert!(at_kill < good, "the job finished before it was killed");

    let child = spawn_job(&topology, "httpdedup-0", &[]);
    let deadline = Instant::now() + Duration::from_secs(120);
    while server.applied() < good && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    let lettered = wait_for_distinct(&dlq, 1, refused.len(), Duration::from_secs(60));
    terminate(child);

    let s = server.state.lock().unwrap();
    eprintln!(
        "{} requests for {N} events ({} refused), SIGKILL at {at_kill} applied: {} repeats",
        s.requests,
        refused.len(),
        s.repeats
    );
    let applied: BTreeSet<u64> = s.applied.values().copied().collect();
    assert_eq!(applied.len(), good, "not every accepted event was called");
    assert!(applied.is_disjoint(&refused));
    // Only calls answered and not yet recorded when the job was killed may come again: at
    // most one per request slot.
    assert!(
        s.repeats <= IN_FLIGHT,
        "{} calls of keys delivered before (at most {IN_FLIGHT} allowed, by the SIGKILL)",
        s.repeats
    );
    assert_eq!(lettered, refused.len());
    letters_of(&dlq, &refused);
    drop(s);

    // The inbox holds exactly the delivered keys, under the output's consumer.
    let (rt, client) = pg();
    let rows = rt
        .block_on(client.query(
            &format!("SELECT message_id FROM {inbox} WHERE consumer = $1"),
            &[&format!("{name}/notify")],
        ))
        .expect("read the inbox");
    let recorded: BTreeSet<u64> = rows
        .iter()
        .map(|r| r.get::<_, String>(0).parse().expect("an id"))
        .collect();
    assert_eq!(recorded, applied, "the inbox is not the delivered keys");
    rt.block_on(client.batch_execute(&format!("DROP TABLE {inbox}")))
        .expect("drop the inbox");
}
