//! An in-process Kafka cluster for trying onceflow with nothing installed.
//!
//! It is librdkafka's mock cluster: it speaks the protocol, but aborted records stay visible
//! to read_committed readers, offsets sent in a transaction are not stored and nothing is
//! fenced. It is for a first run and for error-handling tests, never a proof of exactly-once.

use std::ffi::{CStr, CString};
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

/// A running mock cluster; it lives as long as this value.
pub struct EmbeddedCluster {
    // The mock cluster belongs to this client's handle (`test.mock.num.brokers`).
    handle: BaseProducer,
    bootstrap: String,
}

/// Why the embedded cluster could not be used.
#[derive(Debug, thiserror::Error)]
#[error("embedded cluster: {0}")]
pub struct EmbeddedError(String);

impl EmbeddedCluster {
    /// Starts a mock cluster of `brokers` brokers.
    pub fn start(brokers: u32) -> Result<EmbeddedCluster, EmbeddedError> {
        let handle: BaseProducer = ClientConfig::new()
            .set("test.mock.num.brokers", brokers.to_string())
            .create()
            .map_err(|e| EmbeddedError(e.to_string()))?;
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
        let topic = CString::new(name).map_err(|e| EmbeddedError(e.to_string()))?;
        // SAFETY: `mock` is alive with `self.handle`; `topic` is a valid C string.
        let err =
            unsafe { rdkafka_sys::rd_kafka_mock_topic_create(mock, topic.as_ptr(), partitions, 1) };
        if err == rdkafka_sys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            Ok(())
        } else {
            Err(EmbeddedError(format!(
                "cannot create topic {name}: {err:?}"
            )))
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
        let producer: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .set("linger.ms", "5")
            .create()
            .map_err(|e| EmbeddedError(e.to_string()))?;
        for id in 0..count {
            let key = id.to_string();
            let value = format!(r#"{{"id":{id},"kind":"order","amount":{}}}"#, id % 997);
            let mut record = BaseRecord::to(topic).key(&key).payload(&value);
            loop {
                match producer.send(record) {
                    Ok(()) => break,
                    Err((_, back)) => {
                        record = back;
                        producer.poll(Duration::from_millis(5));
                    }
                }
            }
        }
        producer
            .flush(Duration::from_secs(30))
            .map_err(|e| EmbeddedError(format!("feeding {topic}: {e}")))
    }
}

fn mock_ptr(
    handle: &BaseProducer,
) -> Result<*mut rdkafka_sys::rd_kafka_mock_cluster_t, EmbeddedError> {
    // SAFETY: the native handle is valid while `handle` lives.
    let mock = unsafe { rdkafka_sys::rd_kafka_handle_mock_cluster(handle.client().native_ptr()) };
    if mock.is_null() {
        Err(EmbeddedError(
            "librdkafka did not start a mock cluster".into(),
        ))
    } else {
        Ok(mock)
    }
}
