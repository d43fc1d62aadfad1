//! Where records come from: the job's input topics, consumed with read_committed by one
//! consumer per job whose offsets commit inside the job's transactions. Consumed messages as
//! records, the consumer's rebalance callback, pausing and resuming partitions, and the
//! start-up check that topics exist. (A PostgreSQL outbox table is not a source of a job:
//! [`crate::relay`] publishes it.)

mod context;

use std::cell::RefCell;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::TopicPartitionList;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Headers, Message};

pub use context::SourceContext;

use crate::record::{Origin, Record};
use crate::telemetry;
use crate::topology::MESSAGE_ID_HEADER;
use crate::transform::Input;

/// Where a consumed message came from.
pub fn origin_of(msg: &impl Message) -> Origin {
    Origin {
        topic: topic_name(msg.topic()),
        partition: msg.partition(),
        offset: msg.offset(),
    }
}

/// Topic names kept per thread for [`topic_name`]: a job reads a handful of topics.
const KEPT_TOPIC_NAMES: usize = 64;

/// `name` as a shared string, the same one for every record of the topic: a reference count
/// raised instead of a string allocated, copied and freed for each record. Past
/// [`KEPT_TOPIC_NAMES`] names (a pattern subscription to many topics), the rest are copied.
fn topic_name(name: &str) -> Arc<str> {
    thread_local! {
        static NAMES: RefCell<Vec<Arc<str>>> = const { RefCell::new(Vec::new()) };
    }
    NAMES.with_borrow_mut(|names| {
        if let Some(kept) = names.iter().find(|n| ***n == *name) {
            return Arc::clone(kept);
        }
        let new: Arc<str> = Arc::from(name);
        if names.len() < KEPT_TOPIC_NAMES {
            names.push(Arc::clone(&new));
        }
        new
    })
}

/// Key and value bytes of a consumed message.
pub fn consumed_bytes(msg: &BorrowedMessage<'_>) -> usize {
    msg.key().map_or(0, <[u8]>::len) + msg.payload().map_or(0, <[u8]>::len)
}

/// The record of a consumed message from `origin` ([`origin_of`]): key, value and headers
/// copied once.
pub fn to_record(msg: &impl Message, origin: Origin) -> Record {
    // The value first: its copy streams through the fetched record, so the headers that
    // follow it are in the cache when they are read.
    let value = msg.payload().map(<[u8]>::to_vec);
    Record {
        key: msg.key().map(<[u8]>::to_vec),
        value,
        headers: headers_of(msg),
        timestamp: msg.timestamp().to_millis(),
        origin,
    }
}

/// The pipeline's input of a consumed message from `origin`: key and value borrowed from
/// the message (the pipeline decodes them there and copies only what it writes), headers
/// copied.
pub fn to_input<'m>(msg: &'m impl Message, origin: Origin) -> Input<'m> {
    Input {
        key: msg.key(),
        value: msg.payload(),
        headers: headers_of(msg),
        timestamp: msg.timestamp().to_millis(),
        origin,
    }
}

fn headers_of(msg: &impl Message) -> Vec<(String, Vec<u8>)> {
    msg.headers()
        .map(|hs| {
            hs.iter()
                .map(|h| {
                    (
                        h.key.to_string(),
                        h.value.map(<[u8]>::to_vec).unwrap_or_default(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// At debug level, a span with the record's origin and message id, so one message can be
/// followed end to end; at other levels a disabled span that costs next to nothing.
pub fn record_span(origin: &Origin, msg: &BorrowedMessage<'_>) -> tracing::Span {
    if !tracing::enabled!(tracing::Level::DEBUG) {
        return tracing::Span::none();
    }
    let message_id = msg.headers().and_then(|hs| {
        hs.iter()
            .find(|h| h.key == MESSAGE_ID_HEADER)
            .map(|h| String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned())
    });
    tracing::debug_span!(
        "record",
        topic = %origin.topic,
        partition = origin.partition,
        offset = origin.offset,
        message_id = message_id.as_deref().unwrap_or(""),
    )
}

/// A topic a job needs is missing, or its metadata cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum TopicError {
    #[error("kafka client: cannot read metadata of {topic}: {error}")]
    Metadata { topic: String, error: KafkaError },
    #[error("invalid topology: topic `{topic}`, {what}, does not exist: create it first")]
    Missing { topic: String, what: String },
}

/// Every topic the job writes to must exist: a send to a missing topic fails every
/// transaction that holds it, and the job would abort and rewind forever.
pub fn check_topics_exist<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topics: &[&str],
    what: &str,
    timeout: Duration,
) -> Result<(), TopicError> {
    for topic in topics {
        // A broker that is briefly unreachable (restarting, a lost connection) is waited for
        // until the timeout, as the producer's registration waits for its coordinator.
        let deadline = Instant::now() + timeout;
        let metadata = loop {
            let left = deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(100));
            match consumer.fetch_metadata(Some(topic), left) {
                Ok(m) => break m,
                Err(e) if Instant::now() < deadline => {
                    telemetry::consumer_error(&e);
                    std::thread::sleep(Duration::from_millis(500));
                }
                Err(error) => {
                    return Err(TopicError::Metadata {
                        topic: topic.to_string(),
                        error,
                    });
                }
            }
        };
        let exists = metadata
            .topics()
            .iter()
            .any(|t| t.name() == *topic && t.error().is_none() && !t.partitions().is_empty());
        if !exists {
            return Err(TopicError::Missing {
                topic: topic.to_string(),
                what: what.to_string(),
            });
        }
    }
    Ok(())
}

/// A partition could not be paused at a record.
#[derive(Debug, thiserror::Error)]
#[error("kafka client: cannot {what}: {error}")]
pub struct PauseError {
    /// What failed, and where: `pause orders[2]`.
    what: String,
    error: KafkaError,
}

/// Partitions paused on a record whose retries ran out, and when to resume each.
#[derive(Debug, Default)]
pub struct Paused {
    until: Vec<(String, i32, Instant)>,
}

impl Paused {
    /// Stops fetching `origin`'s partition and seeks it back to the record, so that the
    /// record is the first one consumed when the partition resumes after `for_`.
    pub fn pause_at<C: ConsumerContext>(
        &mut self,
        consumer: &BaseConsumer<C>,
        origin: &Origin,
        for_: Duration,
    ) -> Result<(), PauseError> {
        let fail = |what: &str, error| PauseError {
            what: format!("{what} {}[{}]", origin.topic, origin.partition),
            error,
        };
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&origin.topic, origin.partition);
        consumer.pause(&tpl).map_err(|e| fail("pause", e))?;
        consumer
            .seek(
                &origin.topic,
                origin.partition,
                rdkafka::Offset::Offset(origin.offset),
                Duration::from_secs(10),
            )
            .map_err(|e| fail("seek", e))?;
        self.until.push((
            origin.topic.to_string(),
            origin.partition,
            Instant::now() + for_,
        ));
        Ok(())
    }

    /// Resumes the paused partitions whose time has come. A partition revoked meanwhile
    /// cannot be resumed; that is logged, not fatal (its next owner starts unpaused).
    pub fn resume_due<C: ConsumerContext>(&mut self, consumer: &BaseConsumer<C>, now: Instant) {
        // Called between any two records: with nothing paused, no list is made.
        if self.until.is_empty() {
            return;
        }
        let due = self.take_due(now);
        if due.count() == 0 {
            return;
        }
        if let Err(e) = consumer.resume(&due) {
            telemetry::consumer_error(&e);
        }
    }

    /// Forgets the partitions due at `now` and lists them.
    fn take_due(&mut self, now: Instant) -> TopicPartitionList {
        let mut tpl = TopicPartitionList::new();
        self.until.retain(|(topic, partition, until)| {
            let due = *until <= now;
            if due {
                tpl.add_partition(topic, *partition);
            }
            !due
        });
        tpl
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_topic_name_is_shared_by_its_records_up_to_the_kept_count() {
        let a = topic_name("orders");
        assert!(
            Arc::ptr_eq(&a, &topic_name("orders")),
            "the same name, shared"
        );
        assert!(!Arc::ptr_eq(&a, &topic_name("payments")));
        assert_eq!(&*topic_name("payments"), "payments");
        for i in 0..KEPT_TOPIC_NAMES {
            topic_name(&format!("topic-{i}"));
        }
        // Past the kept count a name is copied each time, still right.
        let past = topic_name("one-too-many");
        assert_eq!(&*past, "one-too-many");
        assert!(!Arc::ptr_eq(&past, &topic_name("one-too-many")));
        assert!(
            Arc::ptr_eq(&a, &topic_name("orders")),
            "kept names stay kept"
        );
    }

    #[test]
    fn paused_partitions_resume_when_their_time_comes() {
        let now = Instant::now();
        let mut paused = Paused::default();
        paused
            .until
            .push(("a".into(), 0, now + Duration::from_secs(1)));
        paused
            .until
            .push(("b".into(), 1, now + Duration::from_secs(3)));
        assert_eq!(paused.take_due(now).count(), 0);
        let due = paused.take_due(now + Duration::from_secs(2));
        assert_eq!(due.count(), 1);
        assert_eq!(due.elements()[0].topic(), "a");
        assert_eq!(paused.until.len(), 1);
        assert_eq!(paused.take_due(now + Duration::from_secs(3)).count(), 1);
        assert!(paused.until.is_empty());
    }
}
