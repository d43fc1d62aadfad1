//! Liveness and readiness, and the HTTP endpoint that serves them with the metrics.
//!
//! `/healthz` answers 200 while the process serves requests. `/readyz` answers 200 when the
//! job has partitions assigned and has made progress (committed, or found nothing to commit)
//! within the bound; a job stuck in a call or unable to commit turns unready. `/healthz` answers
//! 503 when a transactional client call has not returned long after its own timeout (librdkafka
//! can wait forever on a transaction coordinator it lost): the process is stuck, restart it.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::serve::Listener;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Sleep;

use crate::sync::lock;

/// What the engine reports of its progress.
#[derive(Debug)]
pub struct Health {
    assigned: AtomicU64,
    last_progress_ms: AtomicU64,
    bound_ms: AtomicU64,
    /// When the transactional client call in progress began (0: none), and its name.
    call_started_ms: AtomicU64,
    call: Mutex<&'static str>,
    call_bound_ms: AtomicU64,
    /// Why output partitions are held by a transaction open too long, when they are.
    held_outputs: Mutex<Option<String>>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Default for Health {
    fn default() -> Self {
        Health {
            assigned: AtomicU64::new(0),
            last_progress_ms: AtomicU64::new(now_ms()),
            bound_ms: AtomicU64::new(30_000),
            call_started_ms: AtomicU64::new(0),
            call: Mutex::new(""),
            call_bound_ms: AtomicU64::new(60_000),
            held_outputs: Mutex::new(None),
        }
    }
}

impl Health {
    /// How long the job may go without progress before it is unready.
    pub fn set_bound(&self, bound: Duration) {
        self.bound_ms
            .store(bound.as_millis() as u64, Ordering::Relaxed);
    }

    pub fn set_assigned(&self, partitions: usize) {
        self.assigned.store(partitions as u64, Ordering::Relaxed);
    }

    /// A commit went through, or there was nothing to commit.
    pub fn progressed(&self) {
        self.last_progress_ms.store(now_ms(), Ordering::Relaxed);
    }

    /// How long one client call may take before the process counts as stuck.
    pub fn set_call_bound(&self, bound: Duration) {
        self.call_bound_ms
            .store(bound.as_millis() as u64, Ordering::Relaxed);
    }

    /// A transactional client call begins.
    pub fn call_started(&self, name: &'static str) {
        *lock(&self.call) = name;
        self.call_started_ms
            .store(now_ms().max(1), Ordering::Relaxed);
    }

    /// The call returned.
    pub fn call_finished(&self) {
        self.call_started_ms.store(0, Ordering::Relaxed);
    }

    /// The client call that has not returned within the call bound, and for how long, if any.
    pub fn hung_call(&self) -> Option<(&'static str, Duration)> {
        let started = self.call_started_ms.load(Ordering::Relaxed);
        let running = now_ms().saturating_sub(started);
        (started != 0 && running > self.call_bound_ms.load(Ordering::Relaxed))
            .then(|| (*lock(&self.call), Duration::from_millis(running)))
    }

    /// Alive, or why not.
    pub fn liveness(&self) -> Result<(), String> {
        match self.hung_call() {
            None => Ok(()),
            Some((call, running)) => Err(format!(
                "the client call {call} has not returned for {} s",
                running.as_secs()
            )),
        }
    }

    /// Output partitions held by a transaction open too long (`None`: none is), as the
    /// brokers report them.
    pub fn set_held_outputs(&self, why: Option<String>) {
        *lock(&self.held_outputs) = why;
    }

    /// Ready, or why not.
    pub fn readiness(&self) -> Result<(), String> {
        let assigned = self.assigned.load(Ordering::Relaxed);
        let idle = now_ms().saturating_sub(self.last_progress_ms.load(Ordering::Relaxed));
        let bound = self.bound_ms.load(Ordering::Relaxed);
        if assigned == 0 {
            Err("no partition assigned".into())
        } else if idle > bound {
            Err(format!("no commit for {idle} ms (bound {bound} ms)"))
        } else if let Some(why) = lock(&self.held_outputs).clone() {
            Err(why)
        } else {
            Ok(())
        }
    }
}

/// How long a client may take to send its request, from connecting.
const REQUEST_WITHIN: Duration = Duration::from_secs(5);

/// The content type of the Prometheus text exposition format.
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4";

const NOT_FOUND: &str = "not found; try /metrics, /healthz or /readyz\n";

fn liveness(health: &Health) -> (StatusCode, String) {
    match health.liveness() {
        Ok(()) => (StatusCode::OK, "ok\n".into()),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("stuck: {why}\n")),
    }
}

fn readiness(health: &Health) -> (StatusCode, String) {
    match health.readiness() {
        Ok(()) => (StatusCode::OK, "ready\n".into()),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        ),
    }
}

fn metrics_text(metrics: Option<&PrometheusHandle>) -> (StatusCode, String) {
    match metrics {
        Some(handle) => (StatusCode::OK, handle.render()),
        None => (StatusCode::NOT_FOUND, "metrics are off\n".into()),
    }
}

/// What the routes read.
#[derive(Clone)]
struct Endpoint {
    health: Arc<Health>,
    metrics: Option<PrometheusHandle>,
}

/// `/metrics`, `/healthz` and `/readyz`, GET (and so HEAD) only; every response closes its
/// connection.
fn router(health: Arc<Health>, metrics: Option<PrometheusHandle>) -> Router {
    Router::new()
        .route(
            "/healthz",
            get(|State(e): State<Endpoint>| async move { liveness(&e.health) }),
        )
        .route(
            "/readyz",
            get(|State(e): State<Endpoint>| async move { readiness(&e.health) }),
        )
        .route(
            "/metrics",
            get(|State(e): State<Endpoint>| async move {
                match metrics_text(e.metrics.as_ref()) {
                    (StatusCode::OK, text) => {
                        ([(header::CONTENT_TYPE, PROMETHEUS_TEXT)], text).into_response()
                    }
                    other => other.into_response(),
                }
            }),
        )
        .fallback(|method: Method| async move {
            if method == Method::GET || method == Method::HEAD {
                (StatusCode::NOT_FOUND, NOT_FOUND)
            } else {
                only_get()
            }
        })
        .method_not_allowed_fallback(|| async { only_get() })
        .layer(middleware::map_response(|mut response: Response| async {
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            response
        }))
        .with_state(Endpoint { health, metrics })
}

fn only_get() -> (StatusCode, &'static str) {
    (StatusCode::METHOD_NOT_ALLOWED, "only GET is served\n")
}

/// Serves `/metrics`, `/healthz` and `/readyz` until the runtime stops. HTTP/1.1 GET (and
/// HEAD) only; one response per connection.
pub async fn serve(listener: TcpListener, health: Arc<Health>, metrics: Option<PrometheusHandle>) {
    let listener = RequestWithin {
        listener,
        within: REQUEST_WITHIN,
    };
    // Never completes: axum retries failed accepts after a pause.
    let _ = axum::serve(listener, router(health, metrics)).await;
}

/// The endpoint's listener. axum's server puts no time limit on reading a request: here a
/// connection is closed when its request has not come within `within` of connecting, so that
/// clients that connect and send nothing do not hold connections (and file descriptors) for
/// ever.
struct RequestWithin {
    listener: TcpListener,
    within: Duration,
}

impl Listener for RequestWithin {
    type Io = ReadDeadline;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (ReadDeadline, SocketAddr) {
        let (stream, addr) = Listener::accept(&mut self.listener).await;
        let deadline = Box::pin(tokio::time::sleep(self.within));
        (ReadDeadline { stream, deadline }, addr)
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }
}

/// A connection whose reads fail once its deadline has passed.
struct ReadDeadline {
    stream: TcpStream,
    deadline: Pin<Box<Sleep>>,
}

impl AsyncRead for ReadDeadline {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.deadline.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(std::io::ErrorKind::TimedOut.into()));
        }
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for ReadDeadline {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tower::ServiceExt;

    /// The status and body of a GET of `path`, from the functions the routes call.
    fn respond(path: &str, health: &Health, metrics: Option<&PrometheusHandle>) -> (u16, String) {
        let (status, body) = match path {
            "/healthz" => liveness(health),
            "/readyz" => readiness(health),
            "/metrics" => metrics_text(metrics),
            _ => (StatusCode::NOT_FOUND, NOT_FOUND.into()),
        };
        (status.as_u16(), body)
    }

    /// Status, content type, `connection` header and body of one request to the router.
    async fn call(router: &Router, method: Method, uri: &str) -> (u16, String, String, String) {
        let request = Request::builder()
            .method(method)
            .uri(uri)
            .body(Body::empty())
            .unwrap();
        let response = router.clone().oneshot(request).await.unwrap();
        let header = |name| {
            response
                .headers()
                .get(name)
                .map(|v| v.to_str().unwrap().to_string())
                .unwrap_or_default()
        };
        let (content_type, connection) = (header(header::CONTENT_TYPE), header(header::CONNECTION));
        let status = response.status().as_u16();
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        (
            status,
            content_type,
            connection,
            String::from_utf8(body.to_vec()).unwrap(),
        )
    }

    #[test]
    fn unassigned_job_is_alive_but_not_ready() {
        let h = Health::default();
        assert_eq!(respond("/healthz", &h, None).0, 200);
        let (status, body) = respond("/readyz", &h, None);
        assert_eq!(status, 503);
        assert!(body.contains("no partition"), "{body}");
    }

    #[test]
    fn assigned_and_progressing_job_is_ready() {
        let h = Health::default();
        h.set_assigned(3);
        h.progressed();
        assert_eq!(respond("/readyz", &h, None).0, 200);
    }

    #[test]
    fn a_client_call_past_its_bound_makes_the_process_dead() {
        let h = Health::default();
        h.set_call_bound(Duration::from_millis(1_000));
        h.call_started("send_offsets_to_transaction");
        assert_eq!(h.hung_call(), None, "within its bound");
        assert_eq!(respond("/healthz", &h, None).0, 200);
        h.call_started_ms.store(now_ms() - 5_000, Ordering::Relaxed);
        let (call, running) = h.hung_call().expect("hung");
        assert_eq!(call, "send_offsets_to_transaction");
        assert!(running >= Duration::from_secs(5), "{running:?}");
        let (status, body) = respond("/healthz", &h, None);
        assert_eq!(status, 503);
        assert!(body.contains("send_offsets_to_transaction"), "{body}");
        h.call_finished();
        assert_eq!(h.hung_call(), None, "returned");
        assert_eq!(respond("/healthz", &h, None).0, 200);
    }

    #[test]
    fn stalled_job_turns_unready() {
        let h = Health::default();
        h.set_assigned(1);
        h.set_bound(Duration::from_millis(1));
        h.last_progress_ms.store(now_ms() - 1000, Ordering::Relaxed);
        let (status, body) = respond("/readyz", &h, None);
        assert_eq!(status, 503);
        assert!(body.contains("no commit"), "{body}");
    }

    #[test]
    fn unknown_paths_and_absent_metrics_are_404() {
        let h = Health::default();
        assert_eq!(respond("/nope", &h, None).0, 404);
        assert_eq!(respond("/metrics", &h, None).0, 404);
    }

    #[tokio::test]
    async fn serves_http_requests() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve(listener, Arc::new(Health::default()), None));
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        assert!(out.starts_with("HTTP/1.1 200 OK"), "{out}");
        assert!(out.ends_with("ok\n"), "{out}");
    }

    #[tokio::test]
    async fn routes_answer_as_respond_does_and_close_the_connection() {
        let health = Arc::new(Health::default());
        let router = router(Arc::clone(&health), None);
        for path in ["/healthz", "/readyz", "/metrics", "/nope", "/"] {
            let (status, content_type, connection, body) = call(&router, Method::GET, path).await;
            assert_eq!((status, body), respond(path, &health, None), "{path}");
            assert!(
                content_type.starts_with("text/plain"),
                "{path}: {content_type}"
            );
            assert_eq!(connection, "close", "{path}");
        }
        health.set_assigned(2);
        health.progressed();
        let (status, _, _, body) = call(&router, Method::GET, "/readyz?verbose=1").await;
        assert_eq!((status, body.as_str()), (200, "ready\n"));
    }

    #[tokio::test]
    async fn only_get_is_served() {
        let router = router(Arc::new(Health::default()), None);
        for path in ["/healthz", "/metrics", "/nope"] {
            let (status, _, connection, body) = call(&router, Method::POST, path).await;
            assert_eq!(
                (status, body.as_str()),
                (405, "only GET is served\n"),
                "{path}"
            );
            assert_eq!(connection, "close", "{path}");
        }
    }

    #[tokio::test]
    async fn metrics_are_prometheus_text() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            metrics::counter!("onceflow_test_total").increment(3);
        });
        let router = router(Arc::new(Health::default()), Some(handle));
        let (status, content_type, _, body) = call(&router, Method::GET, "/metrics").await;
        assert_eq!(status, 200);
        assert_eq!(content_type, "text/plain; version=0.0.4");
        assert!(body.contains("onceflow_test_total 3"), "{body}");
    }

    #[tokio::test]
    async fn a_connection_without_a_request_is_closed() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let listener = RequestWithin {
            listener,
            within: Duration::from_millis(200),
        };
        tokio::spawn(async move {
            axum::serve(listener, router(Arc::new(Health::default()), None)).await
        });
        let mut silent = TcpStream::connect(addr).await.unwrap();
        let mut partial = TcpStream::connect(addr).await.unwrap();
        partial
            .write_all(b"GET /healthz HTTP/1.1\r\n")
            .await
            .unwrap();
        for s in [&mut silent, &mut partial] {
            let mut out = Vec::new();
            let read = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
            assert!(read.is_ok(), "still open");
            assert!(!String::from_utf8_lossy(&out).contains("200 OK"));
        }
    }
}
