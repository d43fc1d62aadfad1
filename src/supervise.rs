//! Process supervision of a running job: signals, the grace period of a stop, the watchdog of
//! hung client calls, and the watch for a process that was stopped past its session timeout.
//!
//! The job runs on a blocking thread of its own (every Kafka call blocks). SIGTERM/SIGINT
//! ask it to commit and stop; a stop that has not finished within its grace period, or a
//! second signal, ends the process with status 1. A transactional client call that has not
//! returned long after its own timeout ends it too (librdkafka#5456, a lost group
//! coordinator never timed out, did that; vendor/patches/0005 fixes it, and the watchdog stays
//! for whatever else may hang). Exiting then is a crash like any other: nothing uncommitted
//! counts, and the next instance with the same id fences what is left open.
//!
//! A process that was frozen (SIGSTOP, a paused VM, a suspended host) past most of its
//! session timeout wakes as a zombie: the group has expired its membership and a replacement
//! may hold its instance id. Left alone, its consumer would rejoin under the same
//! `group.instance.id` (static membership lets the last joiner win) and its producer, fenced,
//! would be rebuilt and fence the replacement in turn. A thread that ticks every 100 ms sees
//! the gap the moment the process runs again, before the consumer's first heartbeat has had
//! its answer, and ends the process with [`STALLED_EXIT`]: the newer incarnation survives.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::instance::{Identity, RunOptions, Summary};
use crate::job::{self, JobError};
use crate::telemetry::{self, health, health::Health, metrics};
use crate::topology::Topology;

/// Why supervision could not run the job.
#[derive(Debug, thiserror::Error)]
pub enum SuperviseError {
    // The typed errors are kept as fields and shown in the message (not as sources, which
    // `{:#}` would print a second time).
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
    #[error("cannot install the metrics recorder: {0}")]
    Metrics(metrics_exporter_prometheus::BuildError),
    #[error("cannot listen on {addr} for metrics: {error}")]
    Listen {
        addr: SocketAddr,
        error: std::io::Error,
    },
    #[error("the job thread panicked: {0}")]
    Panicked(tokio::task::JoinError),
    #[error(transparent)]
    Job(#[from] JobError),
}

/// The exit status of a process that found itself stopped past its stall limit.
pub const STALLED_EXIT: i32 = 3;

/// How long the process may go without running before it counts as a zombie: two thirds of
/// the session timeout. The group expires a member one session timeout after its last
/// heartbeat (sent every 3 s), so a member frozen this long may have lost its membership;
/// a running process never goes this long without its ticker running.
pub fn stall_limit(topology: &Topology) -> Duration {
    Duration::from_millis(topology.runtime.session_timeout_ms.saturating_mul(2) / 3)
}

/// Whether a gap between two ticks means the process was frozen.
pub fn stalled(gap: Duration, limit: Duration) -> bool {
    gap >= limit
}

/// Starts the ticker that ends the process when it finds itself frozen past `limit`.
pub fn watch_for_stalls(limit: Duration) -> std::io::Result<()> {
    let tick = Duration::from_millis(100);
    std::thread::Builder::new()
        .name("stall-watch".into())
        .spawn(move || {
            let mut last = std::time::Instant::now();
            loop {
                std::thread::sleep(tick);
                let now = std::time::Instant::now();
                let gap = now.duration_since(last);
                if stalled(gap, limit) {
                    telemetry::stalled(gap, limit);
                    std::process::exit(STALLED_EXIT);
                }
                last = now;
            }
        })
        .map(|_| ())
}

/// How long a stop may take after SIGTERM/SIGINT before the process exits anyway: twice the
/// transaction timeout (every call of the final commit is bounded by it), at least 15 s.
pub fn stop_grace(topology: &Topology) -> Duration {
    Duration::from_millis(topology.runtime.transaction_timeout_ms.saturating_mul(2))
        .max(Duration::from_secs(15))
}

/// Waits for the first of a second signal and the end of the grace period, and says which
/// came: the reason the stop is forced.
pub async fn forced_stop(second_signal: impl Future<Output = ()>, grace: Duration) -> String {
    tokio::select! {
        () = second_signal => "a second signal came".to_string(),
        () = tokio::time::sleep(grace) => format!(
            "the job did not stop within {}s",
            grace.as_secs()
        ),
    }
}

/// What the watchdog of client calls found at one of its ticks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finding {
    /// The watchdog itself did not run for this long: the process was frozen, and a call
    /// "running" across the freeze is the zombie's, not a hung client's.
    Frozen(Duration),
    /// A client call has not returned long after its bound.
    Hung {
        call: &'static str,
        running: Duration,
    },
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Finding::Frozen(gap) => write!(f, "the process was frozen for {} s", gap.as_secs()),
            Finding::Hung { call, running } => write!(
                f,
                "the client call {call} has not returned for {} s",
                running.as_secs()
            ),
        }
    }
}

/// The decision of the watchdog of client calls, apart from its clock: a process woken from
/// a freeze finds its call in flight "running" for as long as it was frozen, and must end as
/// a zombie ([`STALLED_EXIT`]), whichever of this watchdog and the stall watch runs first.
#[derive(Debug, Clone, Copy)]
pub struct Watchdog {
    last: tokio::time::Instant,
    stall_limit: Duration,
}

impl Watchdog {
    pub fn new(now: tokio::time::Instant, stall_limit: Duration) -> Watchdog {
        Watchdog {
            last: now,
            stall_limit,
        }
    }

    /// One tick at `now`, with the call that has hung past its bound, if any.
    pub fn tick(
        &mut self,
        now: tokio::time::Instant,
        hung: Option<(&'static str, Duration)>,
    ) -> Option<Finding> {
        let gap = now.saturating_duration_since(self.last);
        self.last = now;
        if stalled(gap, self.stall_limit) {
            return Some(Finding::Frozen(gap));
        }
        hung.map(|(call, running)| Finding::Hung { call, running })
    }
}

/// Returns once a client call has hung past its bound, or the process finds it was frozen.
pub async fn hung_call(health: &Health, every: Duration, stall_limit: Duration) -> Finding {
    let mut watchdog = Watchdog::new(tokio::time::Instant::now(), stall_limit);
    loop {
        tokio::time::sleep(every).await;
        if let Some(found) = watchdog.tick(tokio::time::Instant::now(), health.hung_call()) {
            return found;
        }
    }
}

/// The runtime a job is supervised on, with SIGTERM and SIGINT taken over from the start.
///
/// Made first thing in `onceflow run`, before the topology is loaded and the clients are
/// checked (a few hundred milliseconds): a signal in that time asks for a stop like any other,
/// instead of ending the process with the signal's default action.
pub struct Supervisor {
    runtime: tokio::runtime::Runtime,
    signals: Option<Signals>,
}

impl Supervisor {
    pub fn start() -> Result<Supervisor, SuperviseError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .map_err(SuperviseError::Runtime)?;
        let signals = {
            let _entered = runtime.enter();
            Signals::register()
        };
        // A signal held since the process started reaches the handlers now.
        release_stop_signals();
        Ok(Supervisor { runtime, signals })
    }

    /// Runs the job on a blocking thread until it ends; SIGTERM/SIGINT (also one that came
    /// since [`Supervisor::start`]) ask it to commit and stop. Serves `/metrics`, `/healthz`
    /// and `/readyz` on `metrics_addr` when given.
    pub fn run_until_signal(
        self,
        topology: Topology,
        identity: Identity,
        options: RunOptions,
        metrics_addr: Option<SocketAddr>,
    ) -> Result<Summary, SuperviseError> {
        let Supervisor { runtime, signals } = self;
        let shutdown = Arc::new(AtomicBool::new(false));
        runtime.block_on(async {
            if let Some(addr) = metrics_addr {
                let handle = metrics::install(&topology.name).map_err(SuperviseError::Metrics)?;
                let listener = tokio::net::TcpListener::bind(addr)
                    .await
                    .map_err(|error| SuperviseError::Listen { addr, error })?;
                tracing::info!(%addr, "serving /metrics, /healthz and /readyz");
                tokio::spawn(health::serve(
                    listener,
                    Arc::clone(&options.health),
                    Some(handle),
                ));
            }
            let flag = Arc::clone(&shutdown);
            let grace = stop_grace(&topology);
            // Without signal handlers the job still stops on its own terms (errors, limits).
            if let Some(mut signals) = signals {
                tokio::spawn(async move {
                    signals.next().await;
                    flag.store(true, Ordering::Relaxed);
                    let why = forced_stop(signals.next(), grace).await;
                    telemetry::stop_forced(&why);
                    std::process::exit(1);
                });
            }
            let limit = stall_limit(&topology);
            watch_for_stalls(limit).map_err(SuperviseError::Runtime)?;
            let health = Arc::clone(&options.health);
            tokio::spawn(async move {
                match hung_call(&health, Duration::from_secs(1), limit).await {
                    Finding::Frozen(gap) => {
                        telemetry::stalled(gap, limit);
                        std::process::exit(STALLED_EXIT);
                    }
                    hung => {
                        telemetry::stop_forced(&hung.to_string());
                        std::process::exit(1);
                    }
                }
            });
            let job = tokio::task::spawn_blocking(move || {
                job::run(&topology, &identity, &options, &shutdown)
            });
            Ok(job.await.map_err(SuperviseError::Panicked)??)
        })
    }
}

/// Holds SIGTERM and SIGINT pending on this thread (and the threads it starts) until
/// [`release_stop_signals`]: called first thing in `main`, so that a signal that comes while
/// the process starts, before `onceflow run` has its handlers, asks for a stop instead of
/// ending the process with the signal's default action. Every command releases them: `run`
/// once its handlers are installed ([`Supervisor::start`]), the others at once.
pub fn hold_stop_signals() {
    stop_signal_mask(libc::SIG_BLOCK);
}

/// Lets SIGTERM and SIGINT through again; one that came while they were held is delivered
/// now, to the handler installed meanwhile or with its default action.
pub fn release_stop_signals() {
    stop_signal_mask(libc::SIG_UNBLOCK);
}

fn stop_signal_mask(how: libc::c_int) {
    // SAFETY: the set is initialised by sigemptyset before use, and pthread_sigmask only
    // reads it; a failure (an invalid `how`, impossible here) leaves the mask as it was.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::pthread_sigmask(how, &set, std::ptr::null_mut());
    }
}

/// SIGTERM and SIGINT, each delivered to these streams from the moment they are registered.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    /// Needs a runtime entered; `None` when the handlers cannot be installed.
    fn register() -> Option<Signals> {
        use tokio::signal::unix::{SignalKind, signal};
        match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(term), Ok(int)) => Some(Signals { term, int }),
            _ => None,
        }
    }

    /// The next SIGTERM or SIGINT.
    async fn next(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topology(transaction_timeout_ms: u64) -> Topology {
        let text = "name: t\ninputs: [{topic: a}]\noutputs: [{topic: b}]\n";
        let mut t = Topology::parse(text, "test").expect("a minimal topology");
        t.runtime.transaction_timeout_ms = transaction_timeout_ms;
        t
    }

    #[test]
    fn a_process_frozen_for_two_thirds_of_its_session_timeout_is_a_zombie() {
        let mut t = topology(60_000);
        t.runtime.session_timeout_ms = 45_000;
        let limit = stall_limit(&t);
        assert_eq!(limit, Duration::from_secs(30));
        assert!(stalled(Duration::from_secs(30), limit));
        assert!(!stalled(Duration::from_millis(29_999), limit));
        // Ticks are 100 ms apart: a busy machine delays one by far less than this.
        t.runtime.session_timeout_ms = 6_000;
        assert_eq!(stall_limit(&t), Duration::from_secs(4));
    }

    #[test]
    fn a_stop_may_take_twice_the_transaction_timeout_and_at_least_15_s() {
        assert_eq!(stop_grace(&topology(60_000)), Duration::from_secs(120));
        assert_eq!(stop_grace(&topology(1_000)), Duration::from_secs(15));
        assert_eq!(
            stop_grace(&topology(u64::MAX)),
            Duration::from_millis(u64::MAX)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_stop_is_forced_by_a_second_signal_or_the_grace_period() {
        let why = forced_stop(std::future::ready(()), Duration::from_secs(15)).await;
        assert_eq!(why, "a second signal came");
        let why = forced_stop(std::future::pending(), Duration::from_secs(15)).await;
        assert_eq!(why, "the job did not stop within 15s");
    }

    #[tokio::test]
    async fn a_hung_client_call_is_reported_and_a_finished_one_is_not() {
        let health = Health::default();
        health.set_call_bound(Duration::ZERO);
        health.call_started("commit_transaction");
        health.call_finished();
        let limit = Duration::from_secs(3600);
        let quiet = tokio::time::timeout(
            Duration::from_millis(50),
            hung_call(&health, Duration::from_millis(5), limit),
        )
        .await;
        assert!(quiet.is_err(), "no call is running");
        health.call_started("commit_transaction");
        std::thread::sleep(Duration::from_millis(5));
        let why = hung_call(&health, Duration::from_millis(5), limit)
            .await
            .to_string();
        assert!(
            why.starts_with("the client call commit_transaction has not returned"),
            "{why}"
        );
    }

    #[test]
    fn a_call_running_across_a_freeze_is_the_zombie_s_not_a_hung_client_s() {
        let start = tokio::time::Instant::now();
        let limit = Duration::from_secs(6);
        let mut w = Watchdog::new(start, limit);
        assert_eq!(w.tick(start + Duration::from_secs(1), None), None);
        // Frozen for 14 s in the middle of a commit: on waking, the commit has "run" 15 s.
        let hung = Some(("commit_transaction", Duration::from_secs(15)));
        assert_eq!(
            w.tick(start + Duration::from_secs(15), hung),
            Some(Finding::Frozen(Duration::from_secs(14)))
        );
        // Ticking along, a call past its bound is a hung client.
        assert_eq!(
            w.tick(start + Duration::from_secs(16), hung),
            Some(Finding::Hung {
                call: "commit_transaction",
                running: Duration::from_secs(15)
            })
        );
    }
}
