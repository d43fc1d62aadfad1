//! librdkafka's mock cluster, in-process, for the tests of faults a real broker gives only by
//! chance: slowed responses, refused requests, coordinators moved, brokers taken down, and
//! the requests received. It fakes transactions: never a proof of exactly-once.

use std::ffi::{CStr, CString};
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::error::KafkaResult;
use rdkafka::producer::{BaseProducer, Producer};
use rdkafka_sys::rd_kafka_mock_cluster_t;
use rdkafka_sys::rd_kafka_resp_err_t::{self, RD_KAFKA_RESP_ERR_NO_ERROR};

/// A running mock cluster; it lives as long as this value.
pub struct MockCluster {
    // The mock cluster belongs to this client's handle (`test.mock.num.brokers`).
    handle: BaseProducer,
    bootstrap: String,
}

impl MockCluster {
    /// Starts a mock cluster of `brokers` brokers.
    pub fn start(brokers: u32) -> KafkaResult<MockCluster> {
        let handle: BaseProducer = ClientConfig::new()
            .set("test.mock.num.brokers", brokers.to_string())
            .create()?;
        let mut cluster = MockCluster {
            handle,
            bootstrap: String::new(),
        };
        let mock = cluster.mock();
        // SAFETY: `mock` is alive with `cluster.handle`; the call only sets a field. Without
        // it the mock delays every first group join by 3 s.
        unsafe { rdkafka_sys::rd_kafka_mock_group_initial_rebalance_delay_ms(mock, 0) };
        // SAFETY: the mock cluster returns a NUL-terminated string it owns.
        cluster.bootstrap = unsafe {
            CStr::from_ptr(rdkafka_sys::rd_kafka_mock_cluster_bootstraps(mock))
                .to_string_lossy()
                .into_owned()
        };
        Ok(cluster)
    }

    /// The mock cluster of the handle.
    pub fn mock(&self) -> *mut rd_kafka_mock_cluster_t {
        // SAFETY: the native handle is valid while `self.handle` lives.
        let mock =
            unsafe { rdkafka_sys::rd_kafka_handle_mock_cluster(self.handle.client().native_ptr()) };
        assert!(!mock.is_null(), "librdkafka started no mock cluster");
        mock
    }

    /// The bootstrap servers of the cluster.
    pub fn bootstrap_servers(&self) -> &str {
        &self.bootstrap
    }

    /// Creates a topic.
    pub fn create_topic(&self, name: &str, partitions: i32) -> Result<(), rd_kafka_resp_err_t> {
        let topic = CString::new(name).expect("a topic name without NUL");
        // SAFETY: the mock is alive with `self.handle`; `topic` is a valid C string.
        let err = unsafe {
            rdkafka_sys::rd_kafka_mock_topic_create(self.mock(), topic.as_ptr(), partitions, 1)
        };
        if err == RD_KAFKA_RESP_ERR_NO_ERROR {
            Ok(())
        } else {
            Err(err)
        }
    }

    /// Makes the next `errors.len()` requests of Kafka API `api_key` (any broker) fail with
    /// these errors, in order.
    pub fn push_request_errors(
        &self,
        api_key: i16,
        errors: &[rd_kafka_resp_err_t],
    ) -> Result<(), rd_kafka_resp_err_t> {
        // SAFETY: the mock is alive with `self.handle`; the array outlives the call, which
        // copies it.
        unsafe {
            rdkafka_sys::rd_kafka_mock_push_request_errors_array(
                self.mock(),
                api_key,
                errors.len(),
                errors.as_ptr(),
            );
        }
        Ok(())
    }

    /// Delays every response of broker `broker` by `rtt`.
    pub fn set_round_trip_time(
        &self,
        broker: i32,
        rtt: Duration,
    ) -> Result<(), rd_kafka_resp_err_t> {
        let ms = i32::try_from(rtt.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: the mock is alive with `self.handle`; the call only sets a field.
        let err = unsafe { rdkafka_sys::rd_kafka_mock_broker_set_rtt(self.mock(), broker, ms) };
        if err == RD_KAFKA_RESP_ERR_NO_ERROR {
            Ok(())
        } else {
            Err(err)
        }
    }

    /// Makes broker `broker` the leader of partition `partition` of `topic`.
    pub fn set_leader(&self, topic: &str, partition: i32, broker: i32) {
        let topic = CString::new(topic).expect("a topic name without NUL");
        // SAFETY: the mock is alive with `self.handle`; `topic` outlives the call.
        let err = unsafe {
            rdkafka_sys::rd_kafka_mock_partition_set_leader(
                self.mock(),
                topic.as_ptr(),
                partition,
                broker,
            )
        };
        assert_eq!(err, RD_KAFKA_RESP_ERR_NO_ERROR, "the leader was not set");
    }

    /// Makes broker `broker` the coordinator of `key` (`key_type`: "group" or "transaction").
    pub fn set_coordinator(&self, key_type: &str, key: &str, broker: i32) {
        let (key_type, key) = (
            CString::new(key_type).expect("no NUL"),
            CString::new(key).expect("no NUL"),
        );
        // SAFETY: the mock is alive with `self.handle`; the strings outlive the call.
        let err = unsafe {
            rdkafka_sys::rd_kafka_mock_coordinator_set(
                self.mock(),
                key_type.as_ptr(),
                key.as_ptr(),
                broker,
            )
        };
        assert_eq!(
            err, RD_KAFKA_RESP_ERR_NO_ERROR,
            "the coordinator was not set"
        );
    }

    /// Takes broker `broker` down (its connections closed, new ones refused), or up again.
    pub fn set_broker_up(&self, broker: i32, up: bool) {
        // SAFETY: the mock is alive with `self.handle`; the call only changes the broker's state.
        let err = unsafe {
            if up {
                rdkafka_sys::rd_kafka_mock_broker_set_up(self.mock(), broker)
            } else {
                rdkafka_sys::rd_kafka_mock_broker_set_down(self.mock(), broker)
            }
        };
        assert_eq!(
            err, RD_KAFKA_RESP_ERR_NO_ERROR,
            "broker {broker} did not change state"
        );
    }

    /// Removes broker `broker` from the cluster: its connections closed, its partitions and
    /// coordinator roles moved to the others, and it gone from the metadata.
    pub fn decommission(&self, broker: i32) {
        // SAFETY: the mock is alive with `self.handle`; the call only changes the cluster.
        let err = unsafe { rdkafka_sys::rd_kafka_mock_broker_decommission(self.mock(), broker) };
        assert_eq!(
            err, RD_KAFKA_RESP_ERR_NO_ERROR,
            "broker {broker} was not decommissioned"
        );
    }

    /// Starts recording the requests the cluster receives, for [`requests`](Self::requests).
    pub fn track_requests(&self) -> Result<(), rd_kafka_resp_err_t> {
        // SAFETY: the mock is alive with `self.handle`; the call only sets a flag.
        unsafe { rdkafka_sys::rd_kafka_mock_start_request_tracking(self.mock()) };
        Ok(())
    }

    /// The requests received since [`track_requests`](Self::track_requests), in order: each
    /// one's Kafka API key and when it arrived (microseconds of librdkafka's clock).
    pub fn requests(&self) -> Result<Vec<(i16, i64)>, rd_kafka_resp_err_t> {
        let mut count = 0usize;
        // SAFETY: the mock is alive with `self.handle`; the call returns a copied array of
        // `count` requests (or null), which is ours and freed below.
        let array = unsafe { rdkafka_sys::rd_kafka_mock_get_requests(self.mock(), &mut count) };
        if array.is_null() {
            return Ok(Vec::new());
        }
        // SAFETY: `array` holds `count` valid request pointers until destroyed below.
        let requests = unsafe {
            let seen = std::slice::from_raw_parts(array, count)
                .iter()
                .map(|&r| {
                    (
                        rdkafka_sys::rd_kafka_mock_request_api_key(r),
                        rdkafka_sys::rd_kafka_mock_request_timestamp(r),
                    )
                })
                .collect();
            rdkafka_sys::rd_kafka_mock_request_destroy_array(array, count);
            seen
        };
        Ok(requests)
    }
}
