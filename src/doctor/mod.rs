//! `onceflow txn doctor`: open and hanging transactions, the partitions they hold back, and
//! their cure.
//!
//! [`examine`] reads the cluster (every coordinator's transactions, and for each partition
//! examined its producers, high watermark and last stable offset); [`diagnose`](mod@diagnose) decides,
//! purely, what is open, what hangs and how each hanging transaction ends; [`cure`] carries
//! the cures out. A transaction whose id a coordinator knows is ended by fencing the id
//! there (the coordinator aborts it and writes the markers itself, so both its record and the
//! partitions are cleared); an orphaned producer, open on a partition with no coordinator
//! record of it, by writing abort markers to the partition.

pub mod diagnose;
pub mod watch;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use diagnose::{Cure, Diagnosis, Snapshot, diagnose, is_open, own_id};

use crate::kafka::transactions::{ActiveProducer, Partition, TxnAdmin, TxnAdminError};

/// What to examine: the partitions of `topics` (every topic when `None`) and those of every
/// open transaction; `topology` names the topology given, with its group.
#[derive(Debug, Clone, Default)]
pub struct Scope {
    pub topics: Option<BTreeSet<String>>,
    pub topology: Option<(String, String)>,
}

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Reads what the doctor needs from the cluster.
pub fn examine(admin: &mut TxnAdmin, scope: &Scope) -> Result<Snapshot, TxnAdminError> {
    let listed = admin.list_transactions()?;
    let open: Vec<_> = listed.into_iter().filter(|t| is_open(&t.state)).collect();
    let mut transactions = admin.describe_transactions(&open)?;
    // With a scope, only the transactions that touch it, and the topology's own.
    if let Some(topics) = &scope.topics {
        let own = scope
            .topology
            .as_ref()
            .map(|(name, _)| format!("onceflow.{name}."));
        transactions.retain(|t| {
            t.partitions.iter().any(|p| topics.contains(&p.0))
                || own
                    .as_ref()
                    .is_some_and(|o| t.transactional_id.starts_with(o))
        });
    }
    let mut partitions: BTreeSet<Partition> = admin
        .partitions(scope.topics.as_ref())
        .into_iter()
        .collect();
    for t in transactions.iter().filter(|t| is_open(&t.state)) {
        partitions.extend(
            t.partitions
                .iter()
                .filter(|p| admin.topic_exists(&p.0))
                .cloned(),
        );
    }
    let partitions: Vec<Partition> = partitions.into_iter().collect();
    let producers = admin.describe_producers(&partitions)?;
    let high_watermarks = admin.end_offsets(&partitions, false)?;
    let last_stable = admin.end_offsets(&partitions, true)?;
    let known = scope.topology.as_ref().map(|(name, _)| name.as_str());
    let topologies: BTreeSet<String> = transactions
        .iter()
        .filter(|t| is_open(&t.state))
        .filter_map(|t| own_id(&t.transactional_id, known).map(|(topology, _)| topology))
        .collect();
    let mut running = BTreeMap::new();
    for topology in topologies {
        let group = match &scope.topology {
            Some((name, group)) if *name == topology => group.clone(),
            _ => format!("onceflow.{topology}"),
        };
        match admin.group_members(&group) {
            // A member without an instance id (static membership off) could be anyone:
            // whether an id runs is then unknown.
            Ok(Some(members)) if members.iter().any(|m| m.instance_id.is_none()) => {}
            Ok(members) => {
                let ids = members
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(|m| m.instance_id)
                    .collect();
                running.insert(topology, ids);
            }
            Err(e) => tracing::warn!(group, error = %e, "cannot describe the group"),
        }
    }
    Ok(Snapshot {
        now_ms: now_ms(),
        transactions,
        producers,
        high_watermarks,
        last_stable,
        running,
        topology: known.map(str::to_string),
    })
}

/// What one cure did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Treatment {
    pub cure: Cure,
    /// `None` when it worked, else why not.
    pub error: Option<String>,
}

/// Carries out each cure; `wait` bounds how long a coordinator may take to finish an abort.
pub fn cure(admin: &mut TxnAdmin, cures: &[Cure], wait: Duration) -> Vec<Treatment> {
    cures
        .iter()
        .map(|c| {
            let result = match c {
                Cure::Fence {
                    transactional_id,
                    coordinator,
                    timeout_ms,
                } => admin.fence(*coordinator, transactional_id, *timeout_ms, wait),
                Cure::AbortMarkers {
                    topic,
                    partition,
                    producer_id,
                    producer_epoch,
                    coordinator_epoch,
                } => admin.write_abort_marker(
                    &(topic.clone(), *partition),
                    &ActiveProducer {
                        producer_id: *producer_id,
                        producer_epoch: *producer_epoch,
                        last_timestamp: -1,
                        coordinator_epoch: *coordinator_epoch,
                        txn_start_offset: -1,
                    },
                ),
            };
            Treatment {
                cure: c.clone(),
                error: result.err().map(|e| e.to_string()),
            }
        })
        .collect()
}

fn seconds(ms: i64) -> String {
    format!("{:.1}s", ms as f64 / 1000.0)
}

fn describe(c: &Cure) -> String {
    match c {
        Cure::Fence {
            transactional_id,
            coordinator,
            ..
        } => format!(
            "fence transactional id {transactional_id} at its coordinator (broker {coordinator})"
        ),
        Cure::AbortMarkers {
            topic,
            partition,
            producer_id,
            producer_epoch,
            ..
        } => format!(
            "write abort markers to {topic}-{partition} for orphaned producer {producer_id} (epoch {producer_epoch})"
        ),
    }
}

/// The diagnosis as tables: open transactions, then the partitions held back (all of them
/// with `all`), then the cures.
pub fn render(d: &Diagnosis, all: bool) -> String {
    let mut out = String::new();
    render_transactions(&mut out, d);
    render_partitions(&mut out, d, all);
    if d.healthy {
        let _ = writeln!(out, "healthy: no transaction hangs");
    } else {
        let _ = writeln!(out, "NOT HEALTHY: {} cure(s):", d.cures.len());
        for c in &d.cures {
            let _ = writeln!(out, "  - {}", describe(c));
        }
    }
    out
}

/// The table of open transactions.
fn render_transactions(out: &mut String, d: &Diagnosis) {
    let _ = writeln!(
        out,
        "open transactions: {} (hanging: open longer than {})",
        d.transactions.len(),
        seconds(d.older_than_ms)
    );
    if !d.transactions.is_empty() {
        let _ = writeln!(
            out,
            "  {:<44} {:>10} {:>6} {:<14} {:>9} {:<8} {:<22} partitions",
            "transactional id", "producer", "epoch", "state", "age", "verdict", "onceflow instance"
        );
        for t in &d.transactions {
            let own = match &t.onceflow {
                None => "-".to_string(),
                Some(o) => format!(
                    "{}/{} {}",
                    o.topology,
                    o.instance,
                    match o.running {
                        Some(true) => "(running)",
                        Some(false) => "(not running)",
                        None => "(unknown)",
                    }
                ),
            };
            let _ = writeln!(
                out,
                "  {:<44} {:>10} {:>6} {:<14} {:>9} {:<8} {:<22} {}",
                t.transactional_id,
                t.producer_id,
                t.producer_epoch,
                t.state,
                seconds(t.age_ms),
                if t.hanging { "HANGING" } else { "open" },
                own,
                t.partitions.join(",")
            );
        }
    }
}

/// The table of the partitions held back (all of them with `all`).
fn render_partitions(out: &mut String, d: &Diagnosis, all: bool) {
    let shown: Vec<_> = d
        .partitions
        .iter()
        .filter(|p| all || p.gap > 0 || !p.holders.is_empty())
        .collect();
    let _ = writeln!(
        out,
        "partitions examined: {}, held back (last stable offset below the high watermark): {}",
        d.partitions.len(),
        d.partitions.iter().filter(|p| p.gap > 0).count()
    );
    if !shown.is_empty() {
        let _ = writeln!(
            out,
            "  {:<40} {:>12} {:>12} {:>8}  held by",
            "partition", "last stable", "high wm", "gap"
        );
        for p in shown {
            let holders: Vec<String> = p
                .holders
                .iter()
                .map(|h| {
                    format!(
                        "{} (producer {}, from offset {}, {}{}{})",
                        h.transactional_id.as_deref().unwrap_or("orphan"),
                        h.producer_id,
                        h.txn_start_offset,
                        seconds(h.age_ms),
                        if h.orphaned {
                            ", no coordinator record"
                        } else {
                            ""
                        },
                        if h.hanging { ", HANGING" } else { "" }
                    )
                })
                .collect();
            let _ = writeln!(
                out,
                "  {:<40} {:>12} {:>12} {:>8}  {}",
                format!("{}-{}", p.topic, p.partition),
                p.last_stable_offset,
                p.high_watermark,
                p.gap,
                if holders.is_empty() {
                    "-".to_string()
                } else {
                    holders.join("; ")
                }
            );
        }
    }
}

/// What each treatment did, one line each.
pub fn render_treatments(treatments: &[Treatment]) -> String {
    let mut out = String::new();
    for t in treatments {
        let _ = match &t.error {
            None => writeln!(out, "done: {}", describe(&t.cure)),
            Some(e) => writeln!(out, "FAILED: {}: {e}", describe(&t.cure)),
        };
    }
    out
}
