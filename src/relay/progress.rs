//! The progress records of a relay: what one Kafka transaction of a shard published, written
//! in that transaction and read back by whoever takes the shard next. The record, its key
//! and its encoding are pure; [`Relay::last_progress`] reads a shard's last one.

use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};

use super::Relay;
use super::row::Row;

/// What one Kafka transaction of a shard published: the ids of its rows. Written in that
/// transaction to the shard's partition of the progress topic, keyed by table and shard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Progress {
    pub(super) table: String,
    pub(super) shard: u32,
    /// Row ids, as text, in the order they were published.
    pub(super) ids: Vec<String>,
    /// The relay instance that published them.
    pub(super) relay: String,
    /// When the transaction was committed (ms since the epoch, the relay's clock).
    pub(super) at_ms: i64,
}

impl Progress {
    /// The progress of a batch of `rows` of a shard, published by the relay instance `relay`
    /// in a transaction committed at `at_ms`: their ids, in order.
    pub(super) fn of(table: &str, shard: u32, rows: &[Row], relay: &str, at_ms: i64) -> Progress {
        Progress {
            table: table.to_string(),
            shard,
            ids: rows.iter().map(|r| r.id.clone()).collect(),
            relay: relay.to_string(),
            at_ms,
        }
    }

    /// The record key of a shard's progress.
    pub(super) fn key(table: &str, shard: u32) -> String {
        format!("{table}/{shard}")
    }

    pub(super) fn encode(&self) -> Vec<u8> {
        // A struct of strings and integers always serialises.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// The progress in a record of the progress topic, if it is one of this table's shard.
    pub(super) fn decode(
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        table: &str,
        shard: u32,
    ) -> Option<Progress> {
        if key != Some(Progress::key(table, shard).as_bytes()) {
            return None;
        }
        serde_json::from_slice::<Progress>(value?)
            .ok()
            .filter(|p| p.table == table && p.shard == shard)
    }
}

impl Relay<'_> {
    /// The shard's last committed progress record, read with read_committed from the end of
    /// its partition backwards (a window of records, widened until one is found).
    pub(super) fn last_progress(&self, shard: u32) -> Result<Option<Progress>, KafkaError> {
        let topic = &self.progress_topic;
        let partition = shard as i32;
        let (low, high) = self
            .reader
            .fetch_watermarks(topic, partition, self.timeout)?;
        for (start, end) in Windows::new(low, high) {
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition_offset(topic, partition, Offset::Offset(start))?;
            self.reader.assign(&tpl)?;
            let deadline = Instant::now() + self.timeout;
            let mut last = None;
            loop {
                // The end may be a transaction marker, never delivered: the position tells
                // when it is passed.
                let position = self.reader.position()?;
                let passed = position.elements().iter().any(|e| {
                    e.partition() == partition
                        && matches!(e.offset(), Offset::Offset(o) if o >= end)
                });
                if passed {
                    break;
                }
                match self.reader.poll(Duration::from_millis(50)) {
                    Some(Ok(msg)) => {
                        if msg.offset() >= end {
                            break;
                        }
                        if let Some(p) =
                            Progress::decode(msg.key(), msg.payload(), &self.config.table, shard)
                        {
                            last = Some(p);
                        }
                    }
                    // The client's word on its connections (all brokers down, a transport
                    // failure: an outage, perhaps over already) is no answer about the
                    // partition: it is read until the deadline.
                    Some(Err(e)) if is_connection_event(&e) => {}
                    Some(Err(e)) => return Err(e),
                    None if Instant::now() > deadline => {
                        return Err(KafkaError::Flush(
                            rdkafka::types::RDKafkaErrorCode::OperationTimedOut,
                        ));
                    }
                    None => {}
                }
            }
            self.reader.unassign()?;
            if last.is_some() || start == low {
                return Ok(last);
            }
        }
        Ok(None)
    }
}

/// Whether a consumer's error is about its connections, not about what it reads.
fn is_connection_event(e: &KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode as Code;
    matches!(
        e,
        KafkaError::MessageConsumption(
            Code::AllBrokersDown
                | Code::BrokerTransportFailure
                | Code::Resolve
                | Code::BrokerNotAvailable
                | Code::NetworkException
                | Code::RequestTimedOut
                | Code::OperationTimedOut
        )
    )
}

/// The ranges of offsets `[start, end)` a shard's partition is read back in, from its end
/// towards its start: the last 64 records, then each range 4 times as wide as the one
/// before, until the start.
struct Windows {
    low: i64,
    end: i64,
    width: i64,
}

impl Windows {
    /// The windows of a partition whose offsets run from `low` to `high` (its watermarks).
    fn new(low: i64, high: i64) -> Windows {
        Windows {
            low,
            end: high,
            width: 64,
        }
    }
}

impl Iterator for Windows {
    type Item = (i64, i64);

    fn next(&mut self) -> Option<(i64, i64)> {
        let start = (self.end - self.width).max(self.low);
        if start >= self.end {
            return None;
        }
        let window = (start, self.end);
        self.end = start;
        self.width = self.width.saturating_mul(4);
        Some(window)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_is_read_back_only_for_its_own_shard() {
        let p = Progress {
            table: "t".into(),
            shard: 2,
            ids: vec!["1".into(), "2".into()],
            relay: "r".into(),
            at_ms: 5,
        };
        let key = Progress::key("t", 2);
        let bytes = p.encode();
        assert_eq!(
            Progress::decode(Some(key.as_bytes()), Some(&bytes), "t", 2),
            Some(p.clone())
        );
        assert_eq!(
            Progress::decode(Some(key.as_bytes()), Some(&bytes), "t", 1),
            None
        );
        assert_eq!(Progress::decode(Some(b"u/2"), Some(&bytes), "u", 2), None);
        assert_eq!(
            Progress::decode(Some(key.as_bytes()), Some(b"{"), "t", 2),
            None
        );
    }

    #[test]
    fn a_partition_is_read_back_from_its_end_in_windows_four_times_wider_each_time() {
        assert_eq!(
            Windows::new(0, 1000).collect::<Vec<_>>(),
            [(936, 1000), (680, 936), (0, 680)]
        );
        assert_eq!(
            Windows::new(100, 2000).collect::<Vec<_>>(),
            [(1936, 2000), (1680, 1936), (656, 1680), (100, 656)]
        );
        assert_eq!(Windows::new(10, 50).collect::<Vec<_>>(), [(10, 50)]);
        assert_eq!(Windows::new(7, 7).count(), 0);
    }

    #[test]
    fn progress_is_json_keyed_by_table_and_shard() {
        let p = Progress {
            table: "public.outbox".into(),
            shard: 2,
            ids: vec!["10".into(), "9".into()],
            relay: "pod-0".into(),
            at_ms: 5,
        };
        // What one relay writes, another (of another version too) reads back.
        assert_eq!(
            String::from_utf8(p.encode()).unwrap(),
            r#"{"table":"public.outbox","shard":2,"ids":["10","9"],"relay":"pod-0","at_ms":5}"#
        );
        assert_eq!(Progress::key("public.outbox", 2), "public.outbox/2");
    }

    #[test]
    fn a_record_without_key_or_value_or_naming_another_shard_is_not_progress() {
        let p = Progress {
            table: "t".into(),
            shard: 2,
            ids: vec!["1".into()],
            relay: "r".into(),
            at_ms: 5,
        };
        let bytes = p.encode();
        assert_eq!(Progress::decode(None, Some(&bytes), "t", 2), None);
        assert_eq!(Progress::decode(Some(b"t/2"), None, "t", 2), None);
        let other = Progress {
            shard: 3,
            ..p.clone()
        }
        .encode();
        assert_eq!(Progress::decode(Some(b"t/2"), Some(&other), "t", 2), None);
        let other = Progress {
            table: "u".into(),
            ..p
        }
        .encode();
        assert_eq!(Progress::decode(Some(b"t/2"), Some(&other), "t", 2), None);
    }

    #[test]
    fn a_consumers_word_on_its_connections_is_not_an_answer_about_the_partition() {
        use rdkafka::types::RDKafkaErrorCode as Code;
        for code in [
            Code::AllBrokersDown,
            Code::BrokerTransportFailure,
            Code::Resolve,
        ] {
            assert!(
                is_connection_event(&KafkaError::MessageConsumption(code)),
                "{code:?}"
            );
        }
        for code in [
            Code::UnknownTopicOrPartition,
            Code::TopicAuthorizationFailed,
        ] {
            assert!(
                !is_connection_event(&KafkaError::MessageConsumption(code)),
                "{code:?}"
            );
        }
    }

    #[test]
    fn the_progress_of_a_batch_names_its_rows_in_the_order_published() {
        let row = |id: &str| Row {
            id: id.into(),
            aggregatetype: "order".into(),
            aggregateid: "o-1".into(),
            event_type: "OrderPaid".into(),
            payload: None,
            headers: None,
            created_ms: None,
        };
        let p = Progress::of("t", 1, &[row("10"), row("9"), row("11")], "pod-0", 77);
        assert_eq!(
            p,
            Progress {
                table: "t".into(),
                shard: 1,
                ids: vec!["10".into(), "9".into(), "11".into()],
                relay: "pod-0".into(),
                at_ms: 77,
            }
        );
    }
}
