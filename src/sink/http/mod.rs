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
//! Answers: 2xx is done; 408, 429 (after its `Retry-After` seconds), 5xx, connection errors
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

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use reqwest::{Client, Method};
use tokio::sync::Semaphore;

use crate::topology::url_template::{self as template, UrlTemplate};
pub use error::HttpError;
use error::{Verdict, classify, excerpt, status_class};

use super::SinkError;
use crate::record::{Origin, Record};
use crate::retry::{Backoff, Retries};
use crate::telemetry;
use crate::topology::http::{Dedup, EventId, HttpOutput};
use dedup::{Delivered, Recorder};

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
    permits: Semaphore,
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
                permits: Semaphore::new(config.max_in_flight),
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
        let outcomes = self.runtime.block_on(async move {
            let mut set = tokio::task::JoinSet::new();
            for lane in lanes {
                set.spawn(call_lane(
                    Arc::clone(&shared),
                    recorder.clone(),
                    lane,
                    deadline,
                ));
            }
            let mut outcomes = Vec::new();
            while let Some(done) = set.join_next().await {
                // A lane's task neither panics nor is cancelled; a failure is one it could
                // not finish.
                outcomes.push(done.unwrap_or_else(|e| Outcome {
                    refused: Vec::new(),
                    out_of_time: Some(HttpError::Client(e.to_string())),
                }));
            }
            outcomes
        });
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

/// Makes the calls of one key in order. A refused call is left behind (its record will be
/// dead-lettered) and the next goes on; a call that cannot be made in time stops the lane.
/// With `recorder`, the key of each call answered 2xx is recorded at once; a key that cannot
/// be recorded stops the lane as a call out of time does.
async fn call_lane(
    shared: Arc<Shared>,
    recorder: Option<Arc<Recorder>>,
    lane: Vec<Arc<Call>>,
    deadline: Instant,
) -> Outcome {
    let mut outcome = Outcome::default();
    for (i, call) in lane.iter().enumerate() {
        match call_once_done(&shared, recorder.as_deref(), call, deadline).await {
            Ok(()) => {}
            Err(e @ HttpError::Refused { .. }) => outcome.refused.push((call.origin.clone(), e)),
            Err(HttpError::OutOfTime {
                method, url, last, ..
            }) => {
                outcome.out_of_time = Some(HttpError::OutOfTime {
                    method,
                    url,
                    calls: lane.len() - i,
                    last,
                });
                break;
            }
            Err(e) => {
                outcome.out_of_time = Some(e);
                break;
            }
        }
    }
    outcome
}

/// One call, retried until it is done, refused, or out of time. With `recorder`, a call
/// answered 2xx is done once its key is recorded; the request's permit is held until then, so
/// at most `max_in_flight` calls are ever answered and not yet recorded.
async fn call_once_done(
    shared: &Shared,
    recorder: Option<&Recorder>,
    call: &Call,
    deadline: Instant,
) -> Result<(), HttpError> {
    let mut backoff: Retries = BACKOFF.retries();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let out_of_time = |last: String| HttpError::OutOfTime {
            method: shared.method.to_string(),
            url: call.url.to_string(),
            calls: 1,
            last,
        };
        if left < MIN_REQUEST_TIME {
            return Err(out_of_time("no time left for a request".into()));
        }
        let (verdict, last) = {
            // Held for the request only, not while backing off.
            let _permit = shared
                .permits
                .acquire()
                .await
                .map_err(|_| out_of_time("the sink is closing".into()))?;
            let started = Instant::now();
            let mut request = shared
                .client
                .request(shared.method.clone(), call.url.clone())
                .header(&shared.header, call.idempotency_key.as_str())
                .body(call.body.clone());
            // The client's own timeout applies; a shorter one only when the deadline is nearer
            // (a timer per request costs on a busy endpoint).
            if left < shared.timeout {
                request = request.timeout(left);
            }
            let answer = request.send().await;
            match answer {
                Ok(response) => {
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
                        (Verdict::Done, _) => {
                            return match recorder {
                                Some(r) => r.record(&call.idempotency_key).await,
                                None => Ok(()),
                            };
                        }
                        (Verdict::Refused, body) => {
                            let body = body.map_or_else(
                                |e| format!("(body unreadable: {e})"),
                                |b| excerpt(&b),
                            );
                            return Err(HttpError::Refused {
                                method: shared.method.to_string(),
                                url: call.url.to_string(),
                                status,
                                body,
                            });
                        }
                        (verdict, body) => {
                            let body = body.map(|b| excerpt(&b)).unwrap_or_default();
                            (verdict, format!("answered {status}: {body}"))
                        }
                    }
                }
                Err(e) => {
                    telemetry::http_request(&shared.output, status_class(None), started.elapsed());
                    (Verdict::Retry { after: None }, describe(&e))
                }
            }
        };
        let after = match verdict {
            Verdict::Retry { after } => after,
            _ => None,
        };
        let Some(delay) = backoff.next_delay(deadline) else {
            return Err(out_of_time(last));
        };
        let delay = after.map_or(delay, |a| a.max(delay));
        if Instant::now() + delay >= deadline {
            return Err(out_of_time(last));
        }
        telemetry::http_retry(&shared.output, &call.origin, backoff.attempt(), &last);
        tokio::time::sleep(delay).await;
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
