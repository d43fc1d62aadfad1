//! Liveness and readiness, and the HTTP endpoint that serves them with the metrics.
//!
//! `/healthz` answers 200 while the process serves requests. `/readyz` answers 200 when the
//! job has partitions assigned and has made progress (committed, or found nothing to commit)
//! within the bound; a job stuck in a call or unable to commit turns unready. `/healthz` answers
//! 503 when a transactional client call has not returned long after its own timeout (librdkafka
//! can wait forever on a transaction coordinator it lost): the process is stuck, restart it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

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

    /// Ready, or why not.
    pub fn readiness(&self) -> Result<(), String> {
        let assigned = self.assigned.load(Ordering::Relaxed);
        let idle = now_ms().saturating_sub(self.last_progress_ms.load(Ordering::Relaxed));
        let bound = self.bound_ms.load(Ordering::Relaxed);
        if assigned == 0 {
            Err("no partition assigned".into())
        } else if idle > bound {
            Err(format!("no commit for {idle} ms (bound {bound} ms)"))
        } else {
            Ok(())
        }
    }
}

/// The response to one request path.
fn respond(path: &str, health: &Health, metrics: Option<&PrometheusHandle>) -> (u16, String) {
    match path {
        "/healthz" => match health.liveness() {
            Ok(()) => (200, "ok\n".into()),
            Err(why) => (503, format!("stuck: {why}\n")),
        },
        "/readyz" => match health.readiness() {
            Ok(()) => (200, "ready\n".into()),
            Err(why) => (503, format!("not ready: {why}\n")),
        },
        "/metrics" => match metrics {
            Some(handle) => (200, handle.render()),
            None => (404, "metrics are off\n".into()),
        },
        _ => (404, "not found; try /metrics, /healthz or /readyz\n".into()),
    }
}

/// Serves `/metrics`, `/healthz` and `/readyz` until the runtime stops. HTTP/1.1 GET only;
/// one response per connection.
pub async fn serve(listener: TcpListener, health: Arc<Health>, metrics: Option<PrometheusHandle>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let health = Arc::clone(&health);
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let _ = handle(stream, &health, metrics.as_ref()).await;
        });
    }
}

async fn handle(
    mut stream: TcpStream,
    health: &Health,
    metrics: Option<&PrometheusHandle>,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; 8192];
    let mut len = 0;
    // Read the request head (bounded in size and time); the body of a GET is ignored.
    let read = tokio::time::timeout(Duration::from_secs(5), async {
        while len < buf.len() {
            let n = stream.read(&mut buf[len..]).await?;
            if n == 0 {
                break;
            }
            len += n;
            if buf[..len].windows(4).any(|w| w == b"\r\n\r\n") {
                break;
            }
        }
        Ok::<_, std::io::Error>(())
    })
    .await;
    if !matches!(read, Ok(Ok(()))) {
        return Ok(());
    }
    let head = String::from_utf8_lossy(&buf[..len]);
    let mut parts = head.lines().next().unwrap_or_default().split_whitespace();
    let (status, body) = match (parts.next(), parts.next()) {
        (Some("GET"), Some(target)) => {
            respond(target.split('?').next().unwrap_or(target), health, metrics)
        }
        _ => (405, "only GET is served\n".into()),
    };
    let reason = match status {
        200 => "OK",
        404 => "Not Found",
        405 => "Method Not Allowed",
        _ => "Service Unavailable",
    };
    let content_type = if body.starts_with('#') || body.contains("onceflow_") {
        "text/plain; version=0.0.4"
    } else {
        "text/plain"
    };
    let response = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
