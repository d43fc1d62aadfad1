//! A cell's processes stopped: their peak RSS and CPU time, and the pipelines' commit
//! summaries merged.

use std::path::Path;
use std::time::Duration;

use onceflow::histogram::Histogram;
use onceflow::txn::CommitSteps;

use crate::BenchError;
use crate::plan::{Kind, Spec};
use crate::procs::Proc;
use crate::summary::{parse_commit_steps, parse_commits};

/// What a cell's processes reported once stopped.
pub(crate) struct Stopped {
    pub(crate) commits: Option<u64>,
    pub(crate) commit: Option<Histogram>,
    pub(crate) commit_steps: Option<CommitSteps>,
    /// Peak RSS of the largest process.
    pub(crate) rss_kib: u64,
    /// CPU time of them all.
    pub(crate) cpu_s: f64,
}

/// Reads the processes' peak RSS, stops them with SIGTERM, and reads the pipelines' commit
/// summaries (onceflow's `summary-<i>.json` in `dir`, the Kafka Streams peer's last summary
/// line).
pub(crate) fn stop(procs: &mut [Proc], spec: Spec, dir: &Path) -> Result<Stopped, BenchError> {
    let mut commits = 0;
    let mut commit = Histogram::default();
    let mut stopped = Stopped {
        commits: None,
        commit: None,
        commit_steps: None,
        rss_kib: 0,
        cpu_s: 0.0,
    };
    for p in procs.iter() {
        stopped.rss_kib = stopped.rss_kib.max(p.peak_rss_kib().unwrap_or(0));
    }
    let kind = spec.kind;
    for (i, p) in procs.iter_mut().enumerate() {
        let exit = p.terminate(Duration::from_secs(60));
        stopped.cpu_s += exit.cpu_s;
        if exit.code != Some(0) && kind != Kind::KStreams {
            return Err(p.failure(&format!("did not stop cleanly ({:?})", exit.code)));
        }
        if !spec.is_pipeline() {
            continue;
        }
        let summary = if kind == Kind::KStreams {
            p.output()
                .into_iter()
                .rev()
                .find(|l| l.starts_with("{\"commits\""))
                .ok_or_else(|| p.failure("printed no commit summary"))?
        } else {
            let path = dir.join(format!("summary-{i}.json"));
            std::fs::read_to_string(&path)
                .map_err(|e| p.failure(&format!("left no summary ({e})")))?
        };
        let (n, h) = parse_commits(&summary)
            .ok_or_else(|| BenchError::Child(format!("unreadable summary: {summary}")))?;
        commits += n;
        commit.merge(&h);
        if let Some(s) = parse_commit_steps(&summary) {
            let all = stopped
                .commit_steps
                .get_or_insert_with(CommitSteps::default);
            all.deliveries.merge(&s.deliveries);
            all.offsets.merge(&s.offsets);
            all.end.merge(&s.end);
        }
    }
    if spec.is_pipeline() {
        stopped.commits = Some(commits);
        stopped.commit = Some(commit);
    }
    Ok(stopped)
}
