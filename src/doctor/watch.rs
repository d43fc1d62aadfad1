//! The running job's view of the transactions open on its output partitions, anyone's, as the
//! partitions' leaders report them (DescribeProducers): the age of the oldest one per
//! partition as a metric, and readiness lost while one is older than the job's own
//! transaction timeout (no transaction of this job lives that long, so another producer's is
//! hanging and holds every read_committed consumer of the partition back; `txn doctor` names
//! and ends it).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::kafka::Cluster;
use crate::kafka::transactions::{ActiveProducer, Partition, TxnAdmin};
use crate::telemetry::{self, health::Health};
use crate::topology::Topology;

/// How often the leaders are asked.
pub const EVERY: Duration = Duration::from_secs(10);

/// Ages of open transactions, carried from one look to the next: a transaction is at least
/// as old as the first look that saw it open, and at least as old as its producer's last
/// write to the partition. Both are lower bounds; the larger is kept.
#[derive(Debug, Default)]
pub struct Ages {
    first_seen: HashMap<(Partition, i64, i64), i64>,
}

impl Ages {
    /// The age (ms) of the oldest open transaction of each partition at `now_ms`, 0 when none
    /// is open.
    pub fn observe(
        &mut self,
        now_ms: i64,
        producers: &BTreeMap<Partition, Vec<ActiveProducer>>,
    ) -> BTreeMap<Partition, i64> {
        let mut seen = HashMap::new();
        let mut oldest = BTreeMap::new();
        for (partition, list) in producers {
            let mut age = 0;
            for p in list.iter().filter(|p| p.txn_start_offset >= 0) {
                let key = (partition.clone(), p.producer_id, p.txn_start_offset);
                let first = self.first_seen.get(&key).copied().unwrap_or(now_ms);
                seen.insert(key, first);
                age = age.max((now_ms - first).max(now_ms - p.last_timestamp).max(0));
            }
            oldest.insert(partition.clone(), age);
        }
        self.first_seen = seen;
        oldest
    }
}

/// The partitions held past `bound_ms`, for a readiness message; `None` when none is.
pub fn held(ages: &BTreeMap<Partition, i64>, bound_ms: i64) -> Option<String> {
    let held: Vec<String> = ages
        .iter()
        .filter(|(_, age)| **age > bound_ms)
        .map(|((topic, partition), age)| format!("{topic}-{partition} ({} s)", age / 1000))
        .collect();
    (!held.is_empty()).then(|| {
        format!(
            "output partitions held by a transaction open longer than the transaction timeout ({} s): {}; see `onceflow txn doctor`",
            bound_ms / 1000,
            held.join(", ")
        )
    })
}

/// The watch's thread; dropping it stops it.
pub struct Watch {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Watch {
    /// Watches the topology's Kafka outputs and dead-letter topic on `cluster`.
    pub fn start(topology: &Topology, cluster: Cluster, health: Arc<Health>) -> Watch {
        let mut topics: Vec<String> = topology
            .kafka_output_topics()
            .into_iter()
            .map(str::to_string)
            .collect();
        topics.push(topology.dead_letter_topic());
        let bound_ms = i64::try_from(topology.runtime.transaction_timeout_ms).unwrap_or(i64::MAX);
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("txn-watch".into())
            .spawn(move || watch(&cluster, &topics, bound_ms, &health, &flag))
            .map_err(|e| telemetry::txn_watch_failed(&e))
            .ok();
        Watch { stop, thread }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn sleep_unless_stopped(stop: &AtomicBool, total: Duration) {
    let step = Duration::from_millis(200);
    let mut slept = Duration::ZERO;
    while slept < total && !stop.load(Ordering::Relaxed) {
        std::thread::sleep(step);
        slept += step;
    }
}

fn watch(cluster: &Cluster, topics: &[String], bound_ms: i64, health: &Health, stop: &AtomicBool) {
    let mut ages = Ages::default();
    let mut admin: Option<TxnAdmin> = None;
    let mut last_error = String::new();
    while !stop.load(Ordering::Relaxed) {
        let result = (|| {
            if admin.is_none() {
                admin = Some(TxnAdmin::connect(cluster, Duration::from_secs(10))?);
            }
            let Some(a) = admin.as_mut() else {
                return Ok(BTreeMap::new());
            };
            let set = topics.iter().cloned().collect();
            let partitions = a.partitions(Some(&set));
            a.describe_producers(&partitions)
        })();
        match result {
            Ok(producers) => {
                let oldest = ages.observe(crate::doctor::now_ms(), &producers);
                for ((topic, partition), age) in &oldest {
                    telemetry::output_txn_age(topic, *partition, *age);
                }
                health.set_held_outputs(held(&oldest, bound_ms));
                last_error.clear();
                // Leaders move and topics appear: the metadata is read again each time.
                admin = None;
            }
            Err(e) => {
                let text = e.to_string();
                if text != last_error {
                    telemetry::txn_watch_failed(&text);
                    last_error = text;
                }
                admin = None;
            }
        }
        sleep_unless_stopped(stop, EVERY);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(pid: i64, start: i64, last_write: i64) -> ActiveProducer {
        ActiveProducer {
            producer_id: pid,
            producer_epoch: 0,
            last_timestamp: last_write,
            coordinator_epoch: 0,
            txn_start_offset: start,
        }
    }

    fn on(list: Vec<ActiveProducer>) -> BTreeMap<Partition, Vec<ActiveProducer>> {
        BTreeMap::from([(("out".to_string(), 0), list)])
    }

    #[test]
    fn a_busy_open_transaction_ages_from_when_it_was_first_seen() {
        let mut ages = Ages::default();
        // Written to a moment ago each time: the last write says nothing of its age.
        assert_eq!(
            ages.observe(10_000, &on(vec![open(1, 5, 9_990)]))[&("out".into(), 0)],
            10
        );
        assert_eq!(
            ages.observe(20_000, &on(vec![open(1, 5, 19_990)]))[&("out".into(), 0)],
            10_000
        );
        // Its next transaction starts at another offset: young again.
        assert_eq!(
            ages.observe(30_000, &on(vec![open(1, 80, 29_990)]))[&("out".into(), 0)],
            10
        );
    }

    #[test]
    fn a_silent_producer_is_at_least_as_old_as_its_last_write() {
        let mut ages = Ages::default();
        let oldest = ages.observe(500_000, &on(vec![open(1, 5, 200_000), open(2, 9, 499_000)]));
        assert_eq!(oldest[&("out".into(), 0)], 300_000);
    }

    #[test]
    fn no_open_transaction_is_age_zero() {
        let mut ages = Ages::default();
        assert_eq!(
            ages.observe(1_000, &on(vec![open(1, -1, 0)]))[&("out".into(), 0)],
            0
        );
        assert_eq!(ages.observe(1_000, &on(vec![]))[&("out".into(), 0)], 0);
    }

    #[test]
    fn held_names_the_partitions_past_the_bound() {
        let ages = BTreeMap::from([
            (("a".to_string(), 0), 61_000),
            (("a".to_string(), 1), 1_000),
        ]);
        let why = held(&ages, 60_000).unwrap();
        assert!(why.contains("a-0 (61 s)") && !why.contains("a-1"), "{why}");
        assert_eq!(held(&ages, 120_000), None);
    }
}
