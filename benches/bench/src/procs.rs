//! The pipelines under test run as child processes (`onceflow run`, or the Kafka Streams peer
//! on the JVM), so each one's memory and CPU time are its own.
//!
//! Peak RSS is the child's `VmHWM` from `/proc/<pid>/status`, read just before it is asked to
//! stop: `wait4`'s `ru_maxrss` would not do, Linux carries the high-water mark of the image
//! a child had before `exec` (a copy of the bench process) over into it.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::BenchError;

/// How a child ended.
#[derive(Debug, Clone, Copy)]
pub struct Exit {
    /// Exit status as `wait4` reports it (decoded: `Some(code)` or `None` for a signal).
    pub code: Option<i32>,
    /// CPU time it used, user and system, in seconds.
    pub cpu_s: f64,
}

/// A running child whose output is watched for a readiness line.
pub struct Proc {
    name: String,
    child: Child,
    /// When the child first printed its readiness marker.
    pub ready: Arc<OnceLock<Instant>>,
    /// The last lines it printed (stdout and stderr), for error messages and summaries.
    lines: Arc<Mutex<VecDeque<String>>>,
    pumps: Vec<JoinHandle<()>>,
    exit: Option<Exit>,
}

const KEPT_LINES: usize = 40;

fn seconds(t: libc::timeval) -> f64 {
    t.tv_sec as f64 + t.tv_usec as f64 / 1e6
}

fn pump(
    stream: impl Read + Send + 'static,
    marker: &'static str,
    ready: Arc<OnceLock<Instant>>,
    lines: Arc<Mutex<VecDeque<String>>>,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines() {
            let Ok(line) = line else { break };
            if line.contains(marker) {
                let _ = ready.set(Instant::now());
            }
            let mut kept = lines.lock().unwrap_or_else(|p| p.into_inner());
            if kept.len() == KEPT_LINES {
                kept.pop_front();
            }
            kept.push_back(line);
        }
    })
}

impl Proc {
    /// Starts `command`; `marker` is a substring of the line that says it is processing.
    pub fn spawn(
        name: &str,
        mut command: Command,
        marker: &'static str,
    ) -> Result<Proc, BenchError> {
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(BenchError::io(format!("cannot start {name}")))?;
        let ready = Arc::new(OnceLock::new());
        let lines = Arc::new(Mutex::new(VecDeque::new()));
        let mut pumps = Vec::new();
        if let Some(out) = child.stdout.take() {
            pumps.push(pump(out, marker, Arc::clone(&ready), Arc::clone(&lines)));
        }
        if let Some(err) = child.stderr.take() {
            pumps.push(pump(err, marker, Arc::clone(&ready), Arc::clone(&lines)));
        }
        Ok(Proc {
            name: name.to_string(),
            child,
            ready,
            lines,
            pumps,
            exit: None,
        })
    }

    /// The child's process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    fn pid(&self) -> libc::pid_t {
        self.child.id() as libc::pid_t
    }

    /// Reaps the child if it has exited (without blocking unless `block`).
    fn reap(&mut self, block: bool) -> Option<Exit> {
        if self.exit.is_some() {
            return self.exit;
        }
        let mut status: libc::c_int = 0;
        // SAFETY: plain FFI call with valid pointers to locals.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        let flags = if block { 0 } else { libc::WNOHANG };
        // SAFETY: wait4 on our own child's pid; status and usage point to live locals.
        let pid = unsafe { libc::wait4(self.pid(), &mut status, flags, &mut usage) };
        if pid != self.pid() {
            return None;
        }
        let code = libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
        self.exit = Some(Exit {
            code,
            cpu_s: seconds(usage.ru_utime) + seconds(usage.ru_stime),
        });
        self.exit
    }

    /// The child's peak resident set size so far (`VmHWM`), in KiB; `None` once it is gone.
    pub fn peak_rss_kib(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
    }

    /// `Some` once the child has exited.
    pub fn exited(&mut self) -> Option<Exit> {
        self.reap(false)
    }

    /// Sends SIGTERM, waits up to `grace` for the child to exit (SIGKILL after that), and
    /// returns how it ended.
    pub fn terminate(&mut self, grace: Duration) -> Exit {
        if self.reap(false).is_none() {
            // SAFETY: signalling our own child, which has not been reaped yet.
            unsafe { libc::kill(self.pid(), libc::SIGTERM) };
            let deadline = Instant::now() + grace;
            while self.reap(false).is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            if self.exit.is_none() {
                // SAFETY: as above.
                unsafe { libc::kill(self.pid(), libc::SIGKILL) };
            }
        }
        let exit = self.reap(true).unwrap_or(Exit {
            code: None,
            cpu_s: 0.0,
        });
        for pump in self.pumps.drain(..) {
            let _ = pump.join();
        }
        exit
    }

    /// The last lines the child printed.
    pub fn output(&self) -> Vec<String> {
        self.lines
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect()
    }

    /// A short description of how it failed, with its last lines.
    pub fn failure(&self, what: &str) -> BenchError {
        let tail: Vec<String> = self.output().into_iter().rev().take(12).rev().collect();
        BenchError::Child(format!(
            "{} {what}; its last output:\n  {}",
            self.name,
            tail.join("\n  ")
        ))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.exit.is_none() {
            let _ = self.terminate(Duration::from_secs(5));
        }
    }
}
