//! The `http` output's calls against a local server that answers at once, next to the
//! ceiling: the same requests (same client library, same concurrency, same bodies and
//! idempotency keys) from a plain client loop that keeps `in_flight` requests going.
//!
//! ```sh
//! cargo bench --bench http_calls                       # 1, 16, 64 in flight, 5 rounds
//! ONCEFLOW_BENCH_IN_FLIGHT=16 ONCEFLOW_BENCH_ROUNDS=9 cargo bench --bench http_calls
//! ```
//!
//! Each round runs the sink and the plain loop one after the other, alternating which goes
//! first, each for `ONCEFLOW_BENCH_SECS` (default 4) after a warm-up of 1 s that is not
//! counted; the ratio sink / plain is computed per round (paired) and reported as the median
//! with its min-max, the absolute rates as median and min-max. The sink makes its calls in
//! batches of `ONCEFLOW_BENCH_BATCH` (default 1000, the output's default `batch_size`), as a
//! transaction's calls: a batch ends when its slowest call does. Every record has a key of its
//! own, so no call waits for another of its key. Under `cargo test` (no `--bench` argument) it
//! runs one short round as a smoke test.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use onceflow::record::{Origin, Record};
use onceflow::sink::http::HttpSink;
use onceflow::topology::HttpOutput;

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.replace('_', "").parse().ok())
        .unwrap_or(default)
}

/// A server on its own thread and runtime (one worker): answers 200 with a tiny body.
fn server() -> SocketAddr {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("server runtime");
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            tx.send(listener.local_addr().expect("addr")).expect("send");
            let app = axum::Router::new().fallback(|| async { "{}" });
            axum::serve(listener, app).await.expect("serve");
        });
    });
    rx.recv().expect("server address")
}

fn record(n: u64) -> Record {
    Record {
        key: Some(format!("k{n}").into_bytes()),
        value: Some(format!(r#"{{"id":{n},"payload":"{}"}}"#, "x".repeat(200)).into_bytes()),
        headers: Vec::new(),
        timestamp: None,
        origin: Origin {
            topic: "bench".into(),
            partition: 0,
            offset: n as i64,
        },
    }
}

/// Calls made by the sink in `secs` (after `warm` not counted): requests per second.
fn sink_rate(addr: SocketAddr, in_flight: u64, batch: u64, warm: f64, secs: f64) -> f64 {
    let yaml = format!(
        "url: http://{addr}/events/{{key}}\nmax_in_flight: {in_flight}\nbatch_size: {batch}\nheaders: {{content-type: application/json}}\n"
    );
    let config: HttpOutput = serde_saphyr::from_str(&yaml).expect("an http section");
    let mut sink = HttpSink::new("bench", "notify", &config).expect("the sink");
    let mut n = 0u64;
    let mut run = |until: Instant| {
        let mut calls = 0u64;
        while Instant::now() < until {
            for _ in 0..batch {
                sink.stage(&record(n)).expect("stage");
                n += 1;
            }
            sink.apply(Instant::now() + Duration::from_secs(30))
                .expect("the batch's calls");
            calls += batch;
        }
        calls
    };
    run(Instant::now() + Duration::from_secs_f64(warm));
    let started = Instant::now();
    let calls = run(started + Duration::from_secs_f64(secs));
    calls as f64 / started.elapsed().as_secs_f64()
}

/// The same requests from a plain loop keeping `in_flight` of them going, on a
/// current-thread runtime as the sink's.
fn plain_rate(addr: SocketAddr, in_flight: u64, warm: f64, secs: f64) -> f64 {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("client runtime");
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(in_flight as usize)
        .build()
        .expect("client");
    rt.block_on(async move {
        let client = Arc::new(client);
        let run = |until: Instant, first: u64| {
            let client = Arc::clone(&client);
            async move {
                let mut set = tokio::task::JoinSet::new();
                for lane in 0..in_flight {
                    let client = Arc::clone(&client);
                    set.spawn(async move {
                        let mut calls = 0u64;
                        let mut n = first + lane;
                        while Instant::now() < until {
                            let r = record(n);
                            let url = format!("http://{addr}/events/k{n}");
                            let answer = client
                                .post(url)
                                .header("Idempotency-Key", format!("bench/0/{n}"))
                                .header("content-type", "application/json")
                                .body(r.value.unwrap_or_default())
                                .send()
                                .await
                                .expect("a request");
                            let _ = answer.bytes().await.expect("a body");
                            calls += 1;
                            n += in_flight;
                        }
                        calls
                    });
                }
                let mut calls = 0;
                while let Some(done) = set.join_next().await {
                    calls += done.expect("a lane");
                }
                calls
            }
        };
        run(Instant::now() + Duration::from_secs_f64(warm), 0).await;
        let started = Instant::now();
        let calls = run(started + Duration::from_secs_f64(secs), 1 << 40).await;
        calls as f64 / started.elapsed().as_secs_f64()
    })
}

/// Median and min-max of `v`.
fn spread(v: &mut [f64]) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    (median, v[0], v[n - 1])
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let rounds = if full {
        env_num("ONCEFLOW_BENCH_ROUNDS", 5)
    } else {
        1
    };
    let secs = if full {
        env_num("ONCEFLOW_BENCH_SECS", 4) as f64
    } else {
        0.3
    };
    let warm = if full { 1.0 } else { 0.1 };
    let batch = env_num("ONCEFLOW_BENCH_BATCH", 1000);
    let in_flights: Vec<u64> = std::env::var("ONCEFLOW_BENCH_IN_FLIGHT")
        .ok()
        .map(|v| v.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 16, 64]);
    let addr = server();
    let load = || {
        std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|l| l.split_whitespace().next().map(str::to_string))
            .unwrap_or_default()
    };
    eprintln!(
        "http_calls: {rounds} round(s) of {secs} s per side, batches of {batch}, load average {}",
        load()
    );
    println!(
        "| in flight | http output, req/s (median, min-max) | plain client loop, req/s | output / plain, paired (median, min-max) |"
    );
    println!("|---:|---:|---:|---:|");
    for &in_flight in &in_flights {
        let (mut sink, mut plain, mut ratio) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..rounds {
            let (s, p) = if round % 2 == 0 {
                let s = sink_rate(addr, in_flight, batch, warm, secs);
                (s, plain_rate(addr, in_flight, warm, secs))
            } else {
                let p = plain_rate(addr, in_flight, warm, secs);
                (sink_rate(addr, in_flight, batch, warm, secs), p)
            };
            eprintln!(
                "  {in_flight} in flight, round {}: output {s:.0}/s, plain {p:.0}/s, ratio {:.2} (load {})",
                round + 1,
                s / p,
                load()
            );
            sink.push(s);
            plain.push(p);
            ratio.push(s / p);
        }
        let (s, s0, s1) = spread(&mut sink);
        let (p, p0, p1) = spread(&mut plain);
        let (r, r0, r1) = spread(&mut ratio);
        println!(
            "| {in_flight} | {s:.0} ({s0:.0}-{s1:.0}) | {p:.0} ({p0:.0}-{p1:.0}) | {r:.2} ({r0:.2}-{r1:.2}) |"
        );
    }
}
