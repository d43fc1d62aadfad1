//! Markers: a record written outside any transaction to every partition of the checked
//! topics, which a read_committed reader sees only when no transaction hangs before it.

use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer;
use rdkafka::message::{Headers, Message};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

use super::streams::Stream;
use super::{Ranges, ReconcileError, Report, Scope};
use crate::kafka::Cluster;
use crate::kafka::read;

/// When the options say so, writes a marker to every partition of the Kafka streams (those
/// with `ranges`) and waits for each; notes in `report` how many became visible and which
/// partitions hang, and returns those.
pub(super) fn find_hanging(
    scope: &Scope<'_>,
    streams: &[Stream],
    ranges: &[Option<Ranges>],
    report: &mut Report,
) -> Result<Vec<(String, i32)>, ReconcileError> {
    let options = scope.options;
    let hanging: Vec<(String, i32)> = if options.markers {
        let topics: Vec<(&str, &Ranges)> = streams
            .iter()
            .zip(ranges)
            .filter_map(|(s, r)| Some((s.report.name.as_str(), r.as_ref()?)))
            .collect();
        let (written, hanging) = markers(scope.cluster, &topics, options.marker_timeout)?;
        report.markers = written - hanging.len() as u64;
        hanging
    } else {
        Vec::new()
    };
    report.hanging = hanging.iter().map(|(t, p)| format!("{t}[{p}]")).collect();
    Ok(hanging)
}

/// Writes a marker to every partition of `topics` (outside any transaction) and waits until
/// a read_committed reader sees each one. Returns how many were written, and the partitions
/// whose marker stayed invisible for `timeout`.
fn markers(
    cluster: &Cluster,
    topics: &[(&str, &Ranges)],
    timeout: Duration,
) -> Result<(u64, Vec<(String, i32)>), ReconcileError> {
    let token = format!(
        "{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    );
    let producer: BaseProducer = cluster
        .config()
        .set("acks", "all")
        .set("linger.ms", "0")
        .create()?;
    let headers = rdkafka::message::OwnedHeaders::new().insert(rdkafka::message::Header {
        key: crate::dlq::H_MARKER,
        value: Some(token.as_bytes()),
    });
    let mut written = 0u64;
    for (topic, ranges) in topics {
        for p in ranges.keys() {
            let record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic)
                .partition(*p)
                .payload(&[][..])
                .headers(headers.clone());
            producer.send(record).map_err(|(e, _)| e)?;
            written += 1;
        }
    }
    producer.flush(timeout)?;
    // Read from where each partition ended before the markers.
    let deadline = Instant::now() + timeout;
    let consumer = read::reader(cluster, "onceflow.reconcile")?;
    let mut left: std::collections::BTreeSet<(String, i32)> = std::collections::BTreeSet::new();
    let mut tpl = TopicPartitionList::new();
    for (topic, ranges) in topics {
        for (p, (_, end)) in ranges.iter() {
            tpl.add_partition_offset(topic, *p, Offset::Offset(*end))?;
            left.insert((topic.to_string(), *p));
        }
    }
    consumer.assign(&tpl)?;
    while !left.is_empty() && Instant::now() < deadline {
        let Some(polled) = consumer.poll(Duration::from_millis(100)) else {
            continue;
        };
        let msg = polled?;
        let ours = msg.headers().is_some_and(|hs| {
            hs.iter()
                .any(|h| h.key == crate::dlq::H_MARKER && h.value == Some(token.as_bytes()))
        });
        if ours {
            left.remove(&(msg.topic().to_string(), msg.partition()));
        }
    }
    let hanging = left.into_iter().collect();
    Ok((written, hanging))
}
