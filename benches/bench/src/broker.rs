//! The broker a run uses: the one given, or one the bench starts with `scripts/kafka` (and
//! stops after), and its warm-up before the first cell.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use onceflow::kafka::admin::Admin;

use crate::BenchError;
use crate::kafka::{self, OutputReader};
use crate::plan::BenchConfig;

/// Settings of the broker the bench starts: a deleted topic's log is deleted at once, not a
/// minute later (`log.segment.delete.delay.ms`, 60 s by default) and not only once the broker
/// has run 30 s (`log.initial.task.delay.ms`): its memory is freed, and filled again
/// ([`refill`]), before the next cell, not during it.
const BROKER_SETTINGS: &str = "log.segment.delete.delay.ms=0 log.initial.task.delay.ms=0";

/// A broker this bench uses, and stops when it started it (wiping its data unless a cell
/// failed: then its logs stay for a look).
pub(crate) struct Broker {
    pub(crate) bootstrap: String,
    pub(crate) script: Option<PathBuf>,
    pub(crate) keep_logs: bool,
}

impl Broker {
    pub(crate) fn new(cfg: &BenchConfig) -> Result<Broker, BenchError> {
        if let Some(b) = &cfg.bootstrap_servers {
            return Ok(Broker {
                bootstrap: b.clone(),
                script: None,
                keep_logs: false,
            });
        }
        let script = cfg.repo_dir()?.join("scripts/kafka");
        let running = Command::new(&script)
            .arg("status")
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        let overrides = std::env::var("KAFKA_OVERRIDES").unwrap_or_default();
        let out = Command::new(&script)
            .arg(if running { "bootstrap" } else { "start" })
            .env("KAFKA_OVERRIDES", format!("{overrides} {BROKER_SETTINGS}"))
            .stderr(std::process::Stdio::inherit())
            .output()
            .map_err(|source| BenchError::BrokerScript {
                script: script.clone(),
                source,
            })?;
        let bootstrap = String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .unwrap_or("")
            .trim()
            .to_string();
        if !out.status.success() || bootstrap.is_empty() {
            return Err(BenchError::Broker(format!(
                "{} start failed ({})",
                script.display(),
                out.status
            )));
        }
        // A broker that was already running belongs to someone else: leave it running.
        Ok(Broker {
            bootstrap,
            script: (!running).then_some(script),
            keep_logs: false,
        })
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Some(script) = &self.script {
            let args: &[&str] = if self.keep_logs {
                &["stop"]
            } else {
                &["stop", "--wipe"]
            };
            let _ = Command::new(script)
                .args(args)
                .stdout(std::process::Stdio::null())
                .status();
        }
    }
}

/// Records of the broker's warm-up (or `--records`, if fewer).
const WARM_UP_RECORDS: u64 = 1_000_000;

/// Writes and reads a throwaway topic first, so the first cell does not pay for a broker that
/// has just started (class loading, JIT, the transaction and offsets topics' first loads).
pub(crate) fn warm_up(
    cfg: &BenchConfig,
    bootstrap: &str,
    admin: &Admin,
    run_id: u64,
) -> Result<(), BenchError> {
    let topic = format!("onceflow-bench-{run_id}-warm-up");
    let records = cfg.records.unwrap_or(WARM_UP_RECORDS).min(WARM_UP_RECORDS);
    let partitions = cfg.partitions.iter().copied().max().unwrap_or(1);
    admin.create_topic(&topic, partitions)?;
    let result = kafka::preload(
        bootstrap,
        &topic,
        0..records,
        None,
        cfg.shape(),
        cfg.tuning,
        &|_| {},
    )
    .and_then(|_| {
        let reader = OutputReader::start(bootstrap, &topic, partitions, records)?;
        let deadline = Instant::now() + cfg.cell_timeout;
        while reader.all_bulk_at.get().is_none() {
            if Instant::now() > deadline || !reader.is_running() {
                return Err(BenchError::Timeout("reading the warm-up topic back".into()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        reader.finish().map(|_| ())
    });
    admin.delete_topics(&[&topic])?;
    result
}
