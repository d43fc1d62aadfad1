//! An in-process Kafka cluster for trying onceflow with nothing installed.
//!
//! It is librdkafka's mock cluster: it speaks the protocol, but aborted records stay visible
//! to read_committed readers, offsets sent in a transaction are not stored and nothing is
//! fenced. It is for a first run and for error-handling tests, never a proof of exactly-once.

use std::ffi::{CStr, CString, NulError};
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

use super::{Cluster, send};

/// A running mock cluster; it lives as long as this value.
pub struct EmbeddedCluster {
    // The mock cluster belongs to this client's handle (`test.mock.num.brokers`).
    handle: BaseProducer,
    bootstrap: String,
}

/// Why the embedded cluster could not be used.
#[derive(Debug, thiserror::Error)]
pub enum EmbeddedError {
    #[error("embedded cluster: {0}")]
    Client(#[source] KafkaError),
    #[error("embedded cluster: librdkafka did not start a mock cluster")]
    NoMock,
    #[error("embedded cluster: {0}")]
    TopicName(#[source] NulError),
    #[error("embedded cluster: cannot create topic {name}: {code:?}")]
    CreateTopic {
        name: String,
        code: rdkafka_sys::rd_kafka_resp_err_t,
    },
    #[error("embedded cluster: feeding {topic}: {source}")]
    Feed {
        topic: String,
        #[source]
        source: KafkaError,
    },
}

/// How long feeding waits for room while the local queue is full, and for the last
/// deliveries.
const FEED_TIMEOUT: Duration = Duration::from_secs(30);

impl EmbeddedCluster {
    /// Starts a mock cluster of `brokers` brokers.
    pub fn start(brokers: u32) -> Result<EmbeddedCluster, EmbeddedError> {
        let handle: BaseProducer = ClientConfig::new()
            .set("test.mock.num.brokers", brokers.to_string())
            .create()
            .map_err(EmbeddedError::Client)?;
        let mock = mock_ptr(&handle)?;
        // SAFETY: `mock` belongs to `handle`, which is alive; the call only sets a field.
        // Without it the mock delays every first group join by 3 s.
        unsafe { rdkafka_sys::rd_kafka_mock_group_initial_rebalance_delay_ms(mock, 0) };
        // SAFETY: the mock cluster returns a NUL-terminated string it owns.
        let bootstrap = unsafe {
            CStr::from_ptr(rdkafka_sys::rd_kafka_mock_cluster_bootstraps(mock))
                .to_string_lossy()
                .into_owned()
        };
        Ok(EmbeddedCluster { handle, bootstrap })
    }

    /// The bootstrap servers of the cluster.
    pub fn bootstrap_servers(&self) -> &str {
        &self.bootstrap
    }

    /// Creates a topic.
    pub fn create_topic(&self, name: &str, partitions: i32) -> Result<(), EmbeddedError> {
        let mock = mock_ptr(&self.handle)?;
        let topic = CString::new(name).map_err(EmbeddedError::TopicName)?;
        // SAFETY: `mock` is alive with `self.handle`; `topic` is a valid C string.
        let err =
            unsafe { rdkafka_sys::rd_kafka_mock_topic_create(mock, topic.as_ptr(), partitions, 1) };
        if err == rdkafka_sys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            Ok(())
        } else {
            Err(EmbeddedError::CreateTopic {
                name: name.to_string(),
                code: err,
            })
        }
    }

    /// Makes the next `errors.len()` requests of Kafka API `api_key` (any broker) fail with
    /// these errors, in order: for tests of error handling.
    pub fn push_request_errors(
        &self,
        api_key: i16,
        errors: &[rdkafka_sys::rd_kafka_resp_err_t],
    ) -> Result<(), EmbeddedError> {
        let mock = mock_ptr(&self.handle)?;
        // SAFETY: `mock` is alive with `self.handle`; the array outlives the call, which
        // copies it.
        unsafe {
            rdkafka_sys::rd_kafka_mock_push_request_errors_array(
                mock,
                api_key,
                errors.len(),
                errors.as_ptr(),
            );
        }
        Ok(())
    }

    /// Writes `count` generated JSON records `{"id": n, ...}` keyed by id.
    pub fn feed(&self, topic: &str, count: u64) -> Result<(), EmbeddedError> {
        let producer: BaseProducer = Cluster::new(&self.bootstrap)
            .config()
            .set("linger.ms", "5")
            .create()
            .map_err(EmbeddedError::Client)?;
        let failed = |source| EmbeddedError::Feed {
            topic: topic.to_string(),
            source,
        };
        for id in 0..count {
            let key = id.to_string();
            let value = format!(r#"{{"id":{id},"kind":"order","amount":{}}}"#, id % 997);
            let record = BaseRecord::to(topic).key(&key).payload(&value);
            send::send(&producer, record, FEED_TIMEOUT, send::poll_briefly).map_err(failed)?;
        }
        producer.flush(FEED_TIMEOUT).map_err(failed)
    }
}

fn mock_ptr(
    handle: &BaseProducer,
) -> Result<*mut rdkafka_sys::rd_kafka_mock_cluster_t, EmbeddedError> {
    // SAFETY: the native handle is valid while `handle` lives.
    let mock = unsafe { rdkafka_sys::rd_kafka_handle_mock_cluster(handle.client().native_ptr()) };
    if mock.is_null() {
        Err(EmbeddedError::NoMock)
    } else {
        Ok(mock)
    }
}
