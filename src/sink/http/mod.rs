//! The HTTP sink: one call per record, made before the Kafka commit, each carrying an
//! idempotency key that every redelivery of the record repeats.
//!
//! HTTP has no transaction to join nor to roll back: a call made is made. The transaction
//! owner applies the sink right before the Kafka commit, so a crash in between (or an aborted
//! transaction) repeats calls, with the same keys: the endpoint must honour them for the
//! effect to happen once. Records of one Kafka key are called one after another, in order
//! (a key whose call cannot be made stops there, and its later records wait for the next
//! attempt); different keys go in parallel, at most `max_in_flight` requests at once.
//!
//! Answers: 2xx is done; 408, 429 (after its `Retry-After` seconds or date), 5xx, connection errors
//! and timeouts are retried with a capped backoff until the transaction's deadline, then the
//! batch fails as a transient error (the transaction aborts and its records come again);
//! any other status refuses the record for good, and the error names it so that the
//! transaction owner dead-letters exactly that record (kind `rejected`).
//!
//! The client is reqwest with `native-tls`, which is OpenSSL on Linux: the binary already
//! links OpenSSL (librdkafka, the PostgreSQL sink), so it keeps one TLS stack. As the
//! PostgreSQL sink does, the sink owns a current-thread tokio runtime and calls `block_on` on
//! it from the engine's thread.

mod dedup;
pub mod error;
pub mod url_template;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use reqwest::{Client, Method};

pub use error::HttpError;
use error::{Verdict, classify, excerpt, status_class};

use super::SinkError;
use crate::record::{Origin, Record};
use crate::retry::{Backoff, Retries};
use crate::telemetry;
use crate::topology::http::{Dedup, EventId, HttpOutput, UrlTemplate};
use dedup::{Delivered, Recorder};
use url_template::{self as template, RecordUrl};

/// Retries of one call: 50 ms, doubling, at most 2 s (a `Retry-After` may ask for longer).
const BACKOFF: Backoff = crate::retry::SINK;
/// No request starts with less time than this before the deadline.
const MIN_REQUEST_TIME: Duration = Duration::from_millis(50);

/// One staged call.
#[derive(Debug)]
struct Call {
    origin: Origin,
    key: Option<Vec<u8>>,
    url: reqwest::Url,
    idempotency_key: String,
    /// Shared by every attempt of the call without a copy.
    body: bytes::Bytes,
}

/// What one key's calls came to.
#[derive(Default)]
struct Outcome {
    /// Records refused for good, with why.
    refused: Vec<(Origin, HttpError)>,
    /// The call that could not be made in time, with the calls of its key left behind.
    out_of_time: Option<HttpError>,
}

/// What every call shares.
struct Shared {
    output: String,
    client: Client,
    method: Method,
    header: HeaderName,
    timeout: Duration,
    /// Requests at once, over all keys: as many workers.
    max_in_flight: usize,
}

/// One `http` output of a job.
pub struct HttpSink {
    shared: Arc<Shared>,
    template: UrlTemplate,
    event_id: Option<EventId>,
    batch_size: usize,
    staged: Vec<Arc<Call>>,
    /// The keys delivered before, with `dedup`.
    delivered: Option<Delivered>,
    runtime: tokio::runtime::Runtime,
}

impl HttpSink {
    /// Builds the client (reading `ca_file`) and, with `dedup`, connects to its inbox
    /// (creating it if missing); no call is made before the first batch.
    pub fn new(topology: &str, output: &str, config: &HttpOutput) -> Result<HttpSink, SinkError> {
        let fail = |cause| SinkError::new(output, None, cause);
        let template = UrlTemplate::parse(&config.url)
            .map_err(|message| fail(HttpError::Client(format!("url: {message}"))))?;
        let method = Method::from_bytes(config.method.as_bytes())
            .map_err(|e| fail(HttpError::Client(format!("method: {e}"))))?;
        let header = HeaderName::from_bytes(config.idempotency_header.as_bytes())
            .map_err(|e| fail(HttpError::Client(format!("idempotency_header: {e}"))))?;
        let mut headers = HeaderMap::new();
        for (name, value) in &config.headers {
            let name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|e| fail(HttpError::Client(format!("headers.{name}: {e}"))))?;
            let value = HeaderValue::from_str(value)
                .map_err(|e| fail(HttpError::Client(format!("headers.{name}: {e}"))))?;
            headers.insert(name, value);
        }
        let timeout = Duration::from_millis(config.timeout_ms);
        let mut builder = Client::builder()
            .default_headers(headers)
            .timeout(timeout)
            .connect_timeout(timeout)
            .pool_max_idle_per_host(config.max_in_flight)
            // A redirect is the endpoint's answer, classified like any other (a refusal): a
            // followed 301/302 would turn a POST into a GET, without its body or key.
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("onceflow/", env!("CARGO_PKG_VERSION")));
        if let Some(path) = &config.ca_file {
            let ca_error = |message: String| {
                fail(HttpError::CaFile {
                    path: path.clone(),
                    message,
                })
            };
            let pem = std::fs::read(path).map_err(|e| ca_error(e.to_string()))?;
            let certs =
                reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| ca_error(e.to_string()))?;
            if certs.is_empty() {
                return Err(ca_error("no certificate in it".into()));
            }
            for cert in certs {
                builder = builder.add_root_certificate(cert);
            }
        }
        let client = builder
            .build()
            .map_err(|e| fail(HttpError::Client(e.to_string())))?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| fail(HttpError::Runtime(e)))?;
        let delivered = match &config.dedup {
            Some(Dedup::Postgres(pg)) => {
                Some(Delivered::connect(topology, output, pg, &runtime).map_err(fail)?)
            }
            None => None,
        };
        telemetry::http_output_ready(output, config.method.as_str(), &config.url);
        Ok(HttpSink {
            shared: Arc::new(Shared {
                output: output.to_string(),
                client,
                method,
                header,
                timeout,
                max_in_flight: config.max_in_flight,
            }),
            template,
            event_id: config.event_id.clone(),
            batch_size: config.batch_size,
            staged: Vec::new(),
            delivered,
            runtime,
        })
    }

    /// Stages the call of a record: its URL and idempotency key are made now, so a record
    /// that cannot make its URL is refused at once, naming it.
    pub fn stage(&mut self, record: &Record) -> Result<(), SinkError> {
        let output = &self.shared.output;
        let refuse = |e: HttpError| SinkError::new(output, Some(record.origin.clone()), e);
        let needs_value =
            self.template.reads_fields() || matches!(self.event_id, Some(EventId::Field(_)));
        let value = match (&record.value, needs_value) {
            (Some(bytes), true) => match serde_json::from_slice::<serde_json::Value>(bytes) {
                Ok(v) => Some(v),
                Err(e) if self.template.reads_fields() => {
                    return Err(refuse(
                        template::TemplateError::NotJson(e.to_string()).into(),
                    ));
                }
                Err(_) => None,
            },
            _ => None,
        };
        let url = self
            .template
            .url(record, value.as_ref())
            .map_err(|e| refuse(e.into()))?;
        // The records made of one consumed record are staged one after another: count the
        // run at the end (a scan of the whole batch made staging quadratic).
        let nth = self
            .staged
            .iter()
            .rev()
            .take_while(|c| c.origin == record.origin)
            .count();
        let idempotency_key =
            template::idempotency_key(record, value.as_ref(), self.event_id.as_ref(), nth);
        self.staged.push(Arc::new(Call {
            origin: record.origin.clone(),
            key: record.key.clone(),
            url,
            idempotency_key,
            body: bytes::Bytes::from(record.value.clone().unwrap_or_default()),
        }));
        Ok(())
    }

    pub fn is_full(&self) -> bool {
        self.staged.len() >= self.batch_size
    }

    pub fn discard_record(&mut self, origin: &Origin) {
        self.staged.retain(|c| c.origin != *origin);
    }

    pub fn discard(&mut self) {
        self.staged.clear();
    }

    /// Makes every staged call, each key's in order, retrying transient failures until
    /// `deadline`. Records refused for good make one permanent error (the first, the others
    /// in its `also`); calls still failing at the deadline make a transient one. Returns
    /// whether there was anything to call.
    pub fn apply(&mut self, deadline: Instant) -> Result<bool, SinkError> {
        if self.staged.is_empty() {
            return Ok(false);
        }
        let started = Instant::now();
        let output = self.shared.output.clone();
        let recorder = match self.skip_delivered() {
            Ok(recorder) => recorder,
            Err(e) => return Err(SinkError::new(&output, None, e)),
        };
        let calls = self.staged.len();
        let lanes = lanes(&self.staged);
        let shared = Arc::clone(&self.shared);
        let outcomes = self
            .runtime
            .block_on(call_lanes(shared, recorder, lanes, deadline));
        self.staged.clear();
        let output = self.shared.output.as_str();
        let mut refused: Vec<SinkError> = Vec::new();
        let mut late = None;
        for outcome in outcomes {
            for (origin, e) in outcome.refused {
                refused.push(SinkError::new(output, Some(origin), e));
            }
            late = late.or(outcome.out_of_time);
        }
        // Refusals first: the transaction aborts either way, and the refused records are
        // then dead-lettered when they come again instead of being called.
        if !refused.is_empty() {
            let mut first = refused.remove(0);
            first.also = refused;
            return Err(first);
        }
        if let Some(e) = late {
            return Err(SinkError::new(output, None, e));
        }
        telemetry::http_batch_done(output, calls as u64, started.elapsed());
        Ok(true)
    }

    /// With `dedup`: leaves out the staged calls whose keys were delivered before, and
    /// returns the connection that records the keys of the calls made now.
    fn skip_delivered(&mut self) -> Result<Option<Arc<Recorder>>, HttpError> {
        let Some(delivered) = &mut self.delivered else {
            return Ok(None);
        };
        let keys: Vec<&str> = self
            .staged
            .iter()
            .map(|c| c.idempotency_key.as_str())
            .collect();
        let (recorder, seen) = self.runtime.block_on(delivered.seen(&keys))?;
        if !seen.is_empty() {
            let before = self.staged.len();
            self.staged.retain(|c| !seen.contains(&c.idempotency_key));
            telemetry::http_deduplicated(&self.shared.output, (before - self.staged.len()) as u64);
        }
        Ok(Some(recorder))
    }
}

/// The staged calls in lanes: one per Kafka key, in staging order; a record without a key
/// has a lane of its own.
fn lanes(staged: &[Arc<Call>]) -> Vec<Vec<Arc<Call>>> {
    let mut lanes: Vec<Vec<Arc<Call>>> = Vec::new();
    let mut by_key: HashMap<&[u8], usize> = HashMap::new();
    for call in staged {
        match call.key.as_deref() {
            Some(key) => {
                let lane = *by_key.entry(key).or_insert_with(|| {
                    lanes.push(Vec::new());
                    lanes.len() - 1
                });
                lanes[lane].push(Arc::clone(call));
            }
            None => lanes.push(vec![Arc::clone(call)]),
        }
    }
    lanes
}

/// Makes the calls of every lane, with `max_in_flight` workers each taking the next lane
/// from a queue and calling its keys' calls in order (a task per key made the runtime juggle
/// a thousand tasks per batch, each waiting for a slot). A lane whose call must be retried
/// does not hold its worker while it waits: it is parked on a timer of its own and queued
/// again when the wait is over, and the worker takes another lane meanwhile.
async fn call_lanes(
    shared: Arc<Shared>,
    recorder: Option<Arc<Recorder>>,
    lanes: Vec<Vec<Arc<Call>>>,
    deadline: Instant,
) -> Vec<Outcome> {
    let workers = shared.max_in_flight.min(lanes.len());
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let queue = Arc::new(Queue {
        lanes: tokio::sync::Mutex::new(rx),
        requeue: std::sync::Mutex::new(Some(tx.clone())),
        open: AtomicUsize::new(lanes.len()),
    });
    for calls in lanes {
        // The receiver is alive: it is in `queue`.
        let _ = tx.send(Lane::new(calls));
    }
    drop(tx);
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..workers {
        let (shared, recorder, queue) = (Arc::clone(&shared), recorder.clone(), Arc::clone(&queue));
        set.spawn(async move {
            let mut outcomes = Vec::new();
            while let Some(mut lane) = queue.next().await {
                match advance(&shared, recorder.as_deref(), &mut lane, deadline).await {
                    Step::Finished => {
                        outcomes.push(std::mem::take(&mut lane.outcome));
                        queue.finished();
                    }
                    Step::Wait(delay) => queue.park(lane, delay),
                }
            }
            outcomes
        });
    }
    let mut outcomes = Vec::new();
    while let Some(done) = set.join_next().await {
        // A worker neither panics nor is cancelled; a failure is one it could not finish.
        match done {
            Ok(done) => outcomes.extend(done),
            Err(e) => outcomes.push(Outcome {
                refused: Vec::new(),
                out_of_time: Some(HttpError::Client(e.to_string())),
            }),
        }
    }
    outcomes
}

/// The lanes waiting for a worker. It closes when the last lane is finished: the workers
/// then see no next lane and end.
struct Queue {
    lanes: tokio::sync::Mutex<tokio::sync::mpsc::UnboundedReceiver<Lane>>,
    /// Queues a parked lane again; taken (and the queue closed) when no lane is open.
    requeue: std::sync::Mutex<Option<tokio::sync::mpsc::UnboundedSender<Lane>>>,
    /// Lanes not finished: queued, being called, or parked.
    open: AtomicUsize,
}

impl Queue {
    async fn next(&self) -> Option<Lane> {
        self.lanes.lock().await.recv().await
    }

    fn finished(&self) {
        if self.open.fetch_sub(1, Ordering::AcqRel) == 1 {
            // Nothing panics while holding it, so it is never poisoned.
            if let Ok(mut requeue) = self.requeue.lock() {
                requeue.take();
            }
        }
    }

    /// Queues `lane` again after `delay`, on a timer of its own.
    fn park(&self, lane: Lane, delay: Duration) {
        let requeue = self.requeue.lock().ok().and_then(|r| r.clone());
        if let Some(requeue) = requeue {
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                // The receiver lives while this lane is open.
                let _ = requeue.send(lane);
            });
        }
    }
}

/// One key's calls, how far they got, and the retries of the call at hand.
struct Lane {
    calls: Vec<Arc<Call>>,
    next: usize,
    retries: Retries,
    outcome: Outcome,
}

impl Lane {
    fn new(calls: Vec<Arc<Call>>) -> Lane {
        Lane {
            calls,
            next: 0,
            retries: BACKOFF.retries(),
            outcome: Outcome::default(),
        }
    }

    /// The call at hand is over (done or refused): on to the next, with fresh retries.
    fn step(&mut self) {
        self.next += 1;
        self.retries = BACKOFF.retries();
    }
}

/// Where a lane stopped.
enum Step {
    /// Every call is made or refused, or the lane could not go on (out of time).
    Finished,
    /// The call at hand is to be made again after this wait.
    Wait(Duration),
}

/// Makes a lane's calls in order until they are all made or one must wait for a retry. A
/// refused call is left behind (its record will be dead-lettered) and the next goes on; a
/// call that cannot be made in time finishes the lane, naming the calls it leaves. With
/// `recorder`, the key of each call answered 2xx is recorded at once; a key that cannot be
/// recorded finishes the lane as a call out of time does.
async fn advance(
    shared: &Shared,
    recorder: Option<&Recorder>,
    lane: &mut Lane,
    deadline: Instant,
) -> Step {
    while let Some(call) = lane.calls.get(lane.next).cloned() {
        let left = lane.calls.len() - lane.next;
        let out_of_time = |last: String| HttpError::OutOfTime {
            method: shared.method.to_string(),
            url: call.url.to_string(),
            calls: left,
            last,
        };
        let time = deadline.saturating_duration_since(Instant::now());
        if time < MIN_REQUEST_TIME {
            lane.outcome.out_of_time = Some(out_of_time("no time left for a request".into()));
            return Step::Finished;
        }
        match attempt(shared, recorder, &call, time).await {
            Attempt::Done => lane.step(),
            Attempt::Refused(e) => {
                lane.outcome.refused.push((call.origin.clone(), e));
                lane.step();
            }
            Attempt::Failed(e) => {
                lane.outcome.out_of_time = Some(e);
                return Step::Finished;
            }
            Attempt::Retry { after, last } => {
                let Some(delay) = lane.retries.next_delay(deadline) else {
                    lane.outcome.out_of_time = Some(out_of_time(last));
                    return Step::Finished;
                };
                let delay = after.map_or(delay, |a| a.max(delay));
                if Instant::now() + delay >= deadline {
                    lane.outcome.out_of_time = Some(out_of_time(last));
                    return Step::Finished;
                }
                telemetry::http_retry(&shared.output, &call.origin, lane.retries.attempt(), &last);
                return Step::Wait(delay);
            }
        }
    }
    Step::Finished
}

/// What one request came to.
enum Attempt {
    /// Answered 2xx (and, with a recorder, its key recorded).
    Done,
    /// Refused for good.
    Refused(HttpError),
    /// To be made again: after at least `after` when the answer asked for it.
    Retry {
        after: Option<Duration>,
        last: String,
    },
    /// Answered 2xx but its key could not be recorded.
    Failed(HttpError),
}

/// One request, with at most `time` to answer. With `recorder`, a call answered 2xx is done
/// once its key is recorded; its worker waits for that before it takes another call, so at
/// most `max_in_flight` calls are ever answered and not yet recorded.
async fn attempt(
    shared: &Shared,
    recorder: Option<&Recorder>,
    call: &Call,
    time: Duration,
) -> Attempt {
    let started = Instant::now();
    let mut request = shared
        .client
        .request(shared.method.clone(), call.url.clone())
        .header(&shared.header, call.idempotency_key.as_str())
        .body(call.body.clone());
    // The client's own timeout applies; a shorter one only when the deadline is nearer (a
    // timer per request costs on a busy endpoint).
    if time < shared.timeout {
        request = request.timeout(time);
    }
    let response = match request.send().await {
        Ok(response) => response,
        Err(e) => {
            telemetry::http_request(&shared.output, status_class(None), started.elapsed());
            return Attempt::Retry {
                after: None,
                last: describe(&e),
            };
        }
    };
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let verdict = classify(status, retry_after.as_deref());
    // The body is read to the end so that the connection can serve again.
    let body = response.bytes().await;
    telemetry::http_request(
        &shared.output,
        status_class(Some(status)),
        started.elapsed(),
    );
    match (verdict, body) {
        (Verdict::Done, _) => match recorder {
            Some(r) => match r.record(&call.idempotency_key).await {
                Ok(()) => Attempt::Done,
                Err(e) => Attempt::Failed(e),
            },
            None => Attempt::Done,
        },
        (Verdict::Refused, body) => {
            let body = body.map_or_else(|e| format!("(body unreadable: {e})"), |b| excerpt(&b));
            Attempt::Refused(HttpError::Refused {
                method: shared.method.to_string(),
                url: call.url.to_string(),
                status,
                body,
            })
        }
        (Verdict::Retry { after }, body) => {
            let body = body.map(|b| excerpt(&b)).unwrap_or_default();
            Attempt::Retry {
                after,
                last: format!("answered {status}: {body}"),
            }
        }
    }
}

/// A failed request with its causes (reqwest's own message names only the first).
fn describe(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

impl super::Sink for HttpSink {
    fn stage(&mut self, record: &Record) -> Result<(), SinkError> {
        HttpSink::stage(self, record)
    }

    fn discard_record(&mut self, origin: &Origin) {
        HttpSink::discard_record(self, origin);
    }

    fn is_full(&self) -> bool {
        HttpSink::is_full(self)
    }

    fn apply(&mut self, deadline: Instant) -> Result<bool, SinkError> {
        HttpSink::apply(self, deadline)
    }

    /// The calls were made by `apply`: nothing is left to commit.
    fn commit(&mut self) -> Result<bool, SinkError> {
        Ok(false)
    }

    fn discard(&mut self) {
        HttpSink::discard(self);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(key: Option<&str>, offset: i64) -> Arc<Call> {
        Arc::new(Call {
            origin: Origin {
                topic: "t".into(),
                partition: 0,
                offset,
            },
            key: key.map(|k| k.as_bytes().to_vec()),
            url: reqwest::Url::parse("http://h/").unwrap(),
            idempotency_key: offset.to_string(),
            body: bytes::Bytes::new(),
        })
    }

    /// A server on a thread of its own: answers 200, except the first call of key `a`, which
    /// gets a 429 asking to wait a second. Returns its address and the keys called, in order.
    fn server_asking_a_to_wait() -> (std::net::SocketAddr, Arc<std::sync::Mutex<Vec<String>>>) {
        use axum::http::StatusCode;
        use axum::response::IntoResponse;
        let called = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let log = Arc::clone(&called);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                tx.send(listener.local_addr().unwrap()).unwrap();
                let app = axum::Router::new().route(
                    "/k/{key}",
                    axum::routing::post(
                        move |axum::extract::Path(key): axum::extract::Path<String>| {
                            let log = Arc::clone(&log);
                            async move {
                                let mut log = log.lock().unwrap();
                                let first = !log.contains(&key);
                                log.push(key.clone());
                                if key == "a" && first {
                                    (StatusCode::TOO_MANY_REQUESTS, [("retry-after", "1")])
                                        .into_response()
                                } else {
                                    StatusCode::OK.into_response()
                                }
                            }
                        },
                    ),
                );
                axum::serve(listener, app).await.unwrap();
            });
        });
        (rx.recv().unwrap(), called)
    }

    #[test]
    fn a_key_waiting_out_a_retry_gives_its_slot_to_the_other_keys() {
        let (addr, called) = server_asking_a_to_wait();
        let yaml = format!("url: http://{addr}/k/{{key}}\nmax_in_flight: 1\n");
        let config: HttpOutput = serde_saphyr::from_str(&yaml).unwrap();
        let mut sink = HttpSink::new("t", "out", &config).unwrap();
        let keys = ["a", "b", "c", "d", "e", "f"];
        for (offset, key) in keys.iter().enumerate() {
            let record = Record {
                key: Some(key.as_bytes().to_vec()),
                value: Some(b"{}".to_vec()),
                headers: Vec::new(),
                timestamp: None,
                origin: Origin {
                    topic: "t".into(),
                    partition: 0,
                    offset: offset as i64,
                },
            };
            sink.stage(&record).unwrap();
        }
        assert!(
            sink.apply(Instant::now() + Duration::from_secs(30))
                .unwrap()
        );
        // With one request at a time, the other keys are called while `a` waits its second,
        // and `a` is called again last.
        assert_eq!(
            *called.lock().unwrap(),
            vec!["a", "b", "c", "d", "e", "f", "a"]
        );
    }

    #[test]
    fn one_lane_per_key_in_order_and_one_per_keyless_record() {
        let staged = vec![
            call(Some("a"), 0),
            call(Some("b"), 1),
            call(None, 2),
            call(Some("a"), 3),
            call(None, 4),
            call(Some("b"), 5),
            call(Some("a"), 6),
        ];
        let offsets: Vec<Vec<i64>> = lanes(&staged)
            .iter()
            .map(|l| l.iter().map(|c| c.origin.offset).collect())
            .collect();
        assert_eq!(offsets, vec![vec![0, 3, 6], vec![1, 5], vec![2], vec![4]]);
    }
}
