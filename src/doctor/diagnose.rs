//! The doctor's decisions, pure: from what the coordinators and partition leaders say at one
//! moment, which transactions are open, which of them hang, which partitions they hold back,
//! and how each hanging one is ended.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::kafka::transactions::{ActiveProducer, CoordinatorTransaction, Partition};

/// Coordinator states in which a transaction holds its partitions' last stable offset.
const OPEN_STATES: [&str; 4] = [
    "Ongoing",
    "PrepareCommit",
    "PrepareAbort",
    "PrepareEpochFence",
];

pub fn is_open(state: &str) -> bool {
    OPEN_STATES.contains(&state)
}

/// Everything the doctor read, at `now_ms`.
#[derive(Debug, Default)]
pub struct Snapshot {
    pub now_ms: i64,
    /// The coordinators' descriptions of every transactional id they list.
    pub transactions: Vec<CoordinatorTransaction>,
    /// Producers with state on each partition examined, from its leader.
    pub producers: BTreeMap<Partition, Vec<ActiveProducer>>,
    pub high_watermarks: BTreeMap<Partition, i64>,
    pub last_stable: BTreeMap<Partition, i64>,
    /// For each onceflow topology whose group was described: the instance ids of its
    /// running members.
    pub running: BTreeMap<String, BTreeSet<String>>,
    /// The topology the doctor was given, if any.
    pub topology: Option<String>,
}

/// A transactional id of onceflow's own: `onceflow.<topology>.<instance>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OwnId {
    pub topology: String,
    pub instance: String,
    /// Whether an instance with this id is a member of the topology's group; unknown when
    /// the group could not be described.
    pub running: Option<bool>,
}

/// Splits `onceflow.<topology>.<instance>`. Topology names may hold dots: the `known`
/// topology's name is matched whole; any other id is split at the first dot after
/// `onceflow.`.
pub fn own_id(transactional_id: &str, known: Option<&str>) -> Option<(String, String)> {
    let rest = transactional_id.strip_prefix("onceflow.")?;
    let (topology, instance) = match known.and_then(|name| {
        rest.strip_prefix(name)
            .and_then(|r| r.strip_prefix('.'))
            .map(|instance| (name, instance))
    }) {
        Some(split) => split,
        None => rest.split_once('.')?,
    };
    (!topology.is_empty() && !instance.is_empty())
        .then(|| (topology.to_string(), instance.to_string()))
}

/// An open transaction, as its coordinator sees it.
#[derive(Debug, Clone, Serialize)]
pub struct OpenTransaction {
    pub transactional_id: String,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub state: String,
    pub coordinator: i32,
    pub age_ms: i64,
    pub timeout_ms: i32,
    pub partitions: Vec<String>,
    pub onceflow: Option<OwnId>,
    pub hanging: bool,
}

/// A producer with an open transaction on a partition.
#[derive(Debug, Clone, Serialize)]
pub struct Holder {
    pub producer_id: i64,
    pub producer_epoch: i32,
    /// The transactional id whose coordinator knows this producer's open transaction.
    pub transactional_id: Option<String>,
    pub txn_start_offset: i64,
    /// How long it has been open, at least: since its coordinator started it, or (for an
    /// orphan) since the producer last wrote to the partition.
    pub age_ms: i64,
    /// No coordinator has this producer's transaction open on this partition: only abort
    /// markers written to the partition end it.
    pub orphaned: bool,
    pub hanging: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct PartitionState {
    pub topic: String,
    pub partition: i32,
    pub high_watermark: i64,
    pub last_stable_offset: i64,
    /// Records read_committed consumers cannot reach yet.
    pub gap: i64,
    pub holders: Vec<Holder>,
}

/// How a hanging transaction is ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Cure {
    /// InitProducerId with the same transactional id at its coordinator: the epoch is
    /// bumped, the coordinator aborts the open transaction and whoever held the id is fenced.
    Fence {
        transactional_id: String,
        coordinator: i32,
        timeout_ms: i32,
    },
    /// Abort markers written to the partition by its leader, for a producer no coordinator
    /// knows to be open there.
    AbortMarkers {
        topic: String,
        partition: i32,
        producer_id: i64,
        producer_epoch: i32,
        coordinator_epoch: i32,
    },
}

#[derive(Debug, Clone, Serialize)]
pub struct Diagnosis {
    pub older_than_ms: i64,
    pub transactions: Vec<OpenTransaction>,
    pub partitions: Vec<PartitionState>,
    pub cures: Vec<Cure>,
    pub healthy: bool,
}

fn name(partition: &Partition) -> String {
    format!("{}-{}", partition.0, partition.1)
}

/// Which transactions are open, which hang (open longer than `older_than_ms`), what each
/// partition examined holds back, and the cure of each hanging one.
pub fn diagnose(snapshot: &Snapshot, older_than_ms: i64) -> Diagnosis {
    let transactions = open_transactions(snapshot, older_than_ms);
    let mut cures: Vec<Cure> = transactions
        .iter()
        .filter(|t| t.hanging)
        .map(|t| Cure::Fence {
            transactional_id: t.transactional_id.clone(),
            coordinator: t.coordinator,
            timeout_ms: t.timeout_ms,
        })
        .collect();
    let mut partitions = Vec::new();
    for (partition, producers) in &snapshot.producers {
        let high_watermark = snapshot
            .high_watermarks
            .get(partition)
            .copied()
            .unwrap_or(-1);
        let last_stable_offset = snapshot
            .last_stable
            .get(partition)
            .copied()
            .unwrap_or(high_watermark);
        let mut holders = Vec::new();
        for p in producers.iter().filter(|p| p.txn_start_offset >= 0) {
            let holder = holder(snapshot, partition, p, older_than_ms);
            if holder.hanging && holder.orphaned {
                cure_orphan(snapshot, partition, p, &mut cures);
            }
            holders.push(holder);
        }
        partitions.push(PartitionState {
            topic: partition.0.clone(),
            partition: partition.1,
            high_watermark,
            last_stable_offset,
            gap: (high_watermark - last_stable_offset).max(0),
            holders,
        });
    }
    let healthy = cures.is_empty();
    Diagnosis {
        older_than_ms,
        transactions,
        partitions,
        cures,
        healthy,
    }
}

/// The transactions open at their coordinators, the oldest first; those open longer than
/// `older_than_ms` hang.
fn open_transactions(snapshot: &Snapshot, older_than_ms: i64) -> Vec<OpenTransaction> {
    let now = snapshot.now_ms;
    let mut transactions: Vec<OpenTransaction> = snapshot
        .transactions
        .iter()
        .filter(|t| is_open(&t.state))
        .map(|t| {
            let age_ms = if t.start_time_ms >= 0 {
                (now - t.start_time_ms).max(0)
            } else {
                0
            };
            let onceflow = own_id(&t.transactional_id, snapshot.topology.as_deref()).map(
                |(topology, instance)| {
                    let running = snapshot
                        .running
                        .get(&topology)
                        .map(|members| members.contains(&instance));
                    OwnId {
                        topology,
                        instance,
                        running,
                    }
                },
            );
            OpenTransaction {
                transactional_id: t.transactional_id.clone(),
                producer_id: t.producer_id,
                producer_epoch: t.producer_epoch,
                state: t.state.clone(),
                coordinator: t.coordinator,
                age_ms,
                timeout_ms: t.timeout_ms,
                partitions: t.partitions.iter().map(name).collect(),
                onceflow,
                hanging: age_ms > older_than_ms,
            }
        })
        .collect();
    transactions.sort_by_key(|t| std::cmp::Reverse(t.age_ms));
    transactions
}

/// Which open coordinator transaction covers a producer on a partition.
fn covering<'a>(
    snapshot: &'a Snapshot,
    producer_id: i64,
    partition: &Partition,
) -> Option<&'a CoordinatorTransaction> {
    snapshot.transactions.iter().find(|t| {
        is_open(&t.state) && t.producer_id == producer_id && t.partitions.contains(partition)
    })
}

/// Producer `p`, with an open transaction on `partition`: covered by its coordinator's open
/// transaction, or orphaned.
fn holder(
    snapshot: &Snapshot,
    partition: &Partition,
    p: &ActiveProducer,
    older_than_ms: i64,
) -> Holder {
    let now = snapshot.now_ms;
    match covering(snapshot, p.producer_id, partition) {
        Some(t) => {
            let age_ms = if t.start_time_ms >= 0 {
                (now - t.start_time_ms).max(0)
            } else {
                0
            };
            Holder {
                producer_id: p.producer_id,
                producer_epoch: p.producer_epoch,
                transactional_id: Some(t.transactional_id.clone()),
                txn_start_offset: p.txn_start_offset,
                age_ms,
                orphaned: false,
                hanging: age_ms > older_than_ms,
            }
        }
        None => {
            let age_ms = (now - p.last_timestamp).max(0);
            Holder {
                producer_id: p.producer_id,
                producer_epoch: p.producer_epoch,
                transactional_id: None,
                txn_start_offset: p.txn_start_offset,
                age_ms,
                orphaned: true,
                hanging: age_ms > older_than_ms,
            }
        }
    }
}

/// The cures of the hanging orphan `p` on `partition`, added to `cures`: abort markers, and
/// a fence at a coordinator that still knows its producer.
fn cure_orphan(
    snapshot: &Snapshot,
    partition: &Partition,
    p: &ActiveProducer,
    cures: &mut Vec<Cure>,
) {
    cures.push(Cure::AbortMarkers {
        topic: partition.0.clone(),
        partition: partition.1,
        producer_id: p.producer_id,
        producer_epoch: p.producer_epoch,
        coordinator_epoch: p.coordinator_epoch,
    });
    // A coordinator that still knows the id under this producer (in another state, or with
    // other partitions) is told as well, so its own record of the transaction ends too.
    if let Some(t) = snapshot
        .transactions
        .iter()
        .find(|t| t.producer_id == p.producer_id && is_open(&t.state))
    {
        let fence = Cure::Fence {
            transactional_id: t.transactional_id.clone(),
            coordinator: t.coordinator,
            timeout_ms: t.timeout_ms,
        };
        if !cures.contains(&fence) {
            cures.push(fence);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_000_000_000;

    fn txn(
        id: &str,
        pid: i64,
        state: &str,
        started_ago: i64,
        parts: &[Partition],
    ) -> CoordinatorTransaction {
        CoordinatorTransaction {
            transactional_id: id.into(),
            coordinator: 2,
            state: state.into(),
            producer_id: pid,
            producer_epoch: 3,
            timeout_ms: 900_000,
            start_time_ms: if started_ago < 0 {
                -1
            } else {
                NOW - started_ago
            },
            partitions: parts.to_vec(),
        }
    }

    fn open_on(pid: i64, start: i64, last_write_ago: i64) -> ActiveProducer {
        ActiveProducer {
            producer_id: pid,
            producer_epoch: 3,
            last_timestamp: NOW - last_write_ago,
            coordinator_epoch: 7,
            txn_start_offset: start,
        }
    }

    fn p(topic: &str, i: i32) -> Partition {
        (topic.to_string(), i)
    }

    fn snapshot(
        transactions: Vec<CoordinatorTransaction>,
        producers: Vec<(Partition, Vec<ActiveProducer>, i64, i64)>,
    ) -> Snapshot {
        let mut s = Snapshot {
            now_ms: NOW,
            transactions,
            ..Snapshot::default()
        };
        for (partition, list, hw, lso) in producers {
            s.high_watermarks.insert(partition.clone(), hw);
            s.last_stable.insert(partition.clone(), lso);
            s.producers.insert(partition, list);
        }
        s
    }

    #[test]
    fn an_idle_cluster_is_healthy() {
        let s = snapshot(
            vec![txn("a", 1, "CompleteCommit", -1, &[])],
            vec![(p("t", 0), vec![open_on(1, -1, 10)], 50, 50)],
        );
        let d = diagnose(&s, 60_000);
        assert!(d.healthy);
        assert!(d.transactions.is_empty() && d.cures.is_empty());
        assert_eq!(d.partitions[0].gap, 0);
        assert!(d.partitions[0].holders.is_empty());
    }

    #[test]
    fn a_young_open_transaction_is_listed_but_not_hanging() {
        let s = snapshot(
            vec![txn("a", 1, "Ongoing", 5_000, &[p("t", 0)])],
            vec![(p("t", 0), vec![open_on(1, 40, 100)], 50, 40)],
        );
        let d = diagnose(&s, 60_000);
        assert!(d.healthy);
        assert_eq!(d.transactions.len(), 1);
        assert_eq!(d.transactions[0].age_ms, 5_000);
        let part = &d.partitions[0];
        assert_eq!((part.gap, part.holders.len()), (10, 1));
        assert_eq!(part.holders[0].transactional_id.as_deref(), Some("a"));
        assert!(!part.holders[0].orphaned && !part.holders[0].hanging);
    }

    #[test]
    fn an_old_open_transaction_hangs_and_is_fenced_at_its_coordinator() {
        let s = snapshot(
            vec![txn(
                "payments-7",
                9,
                "Ongoing",
                120_000,
                &[p("t", 0), p("t", 1)],
            )],
            vec![
                (p("t", 0), vec![open_on(9, 40, 119_000)], 50, 40),
                (p("t", 1), vec![open_on(9, 3, 119_000)], 5, 3),
            ],
        );
        let d = diagnose(&s, 60_000);
        assert!(!d.healthy);
        assert!(d.transactions[0].hanging);
        assert_eq!(d.transactions[0].partitions, vec!["t-0", "t-1"]);
        // Fencing at the coordinator ends it on every partition: no markers are written.
        assert_eq!(
            d.cures,
            vec![Cure::Fence {
                transactional_id: "payments-7".into(),
                coordinator: 2,
                timeout_ms: 900_000
            }]
        );
        assert!(d.partitions.iter().all(|p| p.holders[0].hanging));
    }

    #[test]
    fn an_orphaned_producer_gets_abort_markers_on_its_partition() {
        // The coordinator finished the transaction (or never knew this partition), but the
        // partition still has it open: only markers end it.
        let s = snapshot(
            vec![txn("x", 4, "CompleteAbort", -1, &[])],
            vec![(
                p("t", 2),
                vec![open_on(4, 10, 200_000), open_on(5, -1, 1)],
                30,
                10,
            )],
        );
        let d = diagnose(&s, 60_000);
        assert!(!d.healthy);
        let holder = &d.partitions[0].holders[0];
        assert!(holder.orphaned && holder.hanging);
        assert_eq!(holder.age_ms, 200_000);
        assert_eq!(
            d.cures,
            vec![Cure::AbortMarkers {
                topic: "t".into(),
                partition: 2,
                producer_id: 4,
                producer_epoch: 3,
                coordinator_epoch: 7
            }]
        );
    }

    #[test]
    fn an_orphan_whose_id_is_still_open_elsewhere_is_also_fenced() {
        let s = snapshot(
            vec![txn("y", 4, "Ongoing", 10_000, &[p("u", 0)])],
            vec![(p("t", 0), vec![open_on(4, 10, 90_000)], 30, 10)],
        );
        let d = diagnose(&s, 60_000);
        assert_eq!(d.cures.len(), 2);
        assert!(matches!(d.cures[0], Cure::AbortMarkers { .. }));
        assert!(
            matches!(&d.cures[1], Cure::Fence { transactional_id, .. } if transactional_id == "y")
        );
    }

    #[test]
    fn a_recent_orphan_is_given_time_to_get_its_markers() {
        // Markers of a just-completed transaction may still be on their way.
        let s = snapshot(
            vec![],
            vec![(p("t", 0), vec![open_on(4, 10, 2_000)], 30, 10)],
        );
        assert!(diagnose(&s, 60_000).healthy);
    }

    #[test]
    fn onceflow_ids_are_named_with_their_membership() {
        let mut s = snapshot(
            vec![
                txn("onceflow.orders.orders-0", 1, "Ongoing", 1_000, &[]),
                txn("onceflow.orders.orders-1", 2, "Ongoing", 1_000, &[]),
                txn("onceflow.billing.b.x", 3, "Ongoing", 1_000, &[]),
                txn("other", 4, "Ongoing", 1_000, &[]),
            ],
            vec![],
        );
        s.running
            .insert("orders".into(), BTreeSet::from(["orders-0".to_string()]));
        let d = diagnose(&s, 60_000);
        let own: BTreeMap<_, _> = d
            .transactions
            .iter()
            .map(|t| (t.transactional_id.as_str(), t.onceflow.clone()))
            .collect();
        assert_eq!(
            own["onceflow.orders.orders-0"].as_ref().unwrap().running,
            Some(true)
        );
        assert_eq!(
            own["onceflow.orders.orders-1"].as_ref().unwrap().running,
            Some(false)
        );
        let billing = own["onceflow.billing.b.x"].as_ref().unwrap();
        assert_eq!((billing.instance.as_str(), billing.running), ("b.x", None));
        assert_eq!(own["other"], None);
    }

    #[test]
    fn own_ids_need_a_topology_and_an_instance() {
        assert_eq!(own_id("onceflow.a.b", None), Some(("a".into(), "b".into())));
        assert_eq!(own_id("onceflow.a", None), None);
        assert_eq!(own_id("onceflow..b", None), None);
        assert_eq!(own_id("app.a.b", None), None);
        assert_eq!(
            own_id("onceflow.eu.orders.pod-0", Some("eu.orders")),
            Some(("eu.orders".into(), "pod-0".into()))
        );
        assert_eq!(
            own_id("onceflow.eu.orders.pod-0", Some("us")),
            Some(("eu".into(), "orders.pod-0".into()))
        );
    }
}
