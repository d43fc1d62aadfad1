//! Taking consumed records from a consumer's queue a batch at a time
//! (`rd_kafka_consume_batch_queue`), for the readers that go through whole topics
//! ([`super::read::read_ranges`]).
//!
//! rust-rdkafka's `BaseConsumer::poll` returns one record per call: it reads the clock,
//! crosses into librdkafka, takes the queue's lock and allocates a reference-counted event
//! for every record. Reconcile reads tens of millions of records, and a profile put those
//! per-record costs at about a fifth of its time. A batch call takes up to
//! [`BATCH`] records under one call; each record is still its own librdkafka message, freed
//! as soon as its callback returns.
//!
//! Only for consumers with assigned partitions (no group membership): a rebalance event on
//! the queue would be served by librdkafka's default handler here, not by rust-rdkafka's.

use std::ffi::CStr;
use std::marker::PhantomData;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Headers, Message, Timestamp};
use rdkafka_sys as rdsys;

/// Records taken per call at most.
pub const BATCH: usize = 1024;

/// The queue of one consumer, read a batch at a time.
pub struct BatchQueue<'c> {
    queue: *mut rdsys::rd_kafka_queue_t,
    buffer: Vec<*mut rdsys::rd_kafka_message_t>,
    /// The queue belongs to the consumer, which must outlive it.
    _consumer: PhantomData<&'c BaseConsumer>,
}

impl<'c> BatchQueue<'c> {
    /// The queue of `consumer`, which must have a group id (rust-rdkafka then forwards its
    /// main queue to the consumer queue) and be assigned, not subscribed.
    pub fn new(consumer: &'c BaseConsumer) -> Result<BatchQueue<'c>, KafkaError> {
        // SAFETY: the client pointer is valid for the consumer's lifetime, which bounds ours;
        // the returned queue is a new reference, destroyed in `drop`.
        let queue = unsafe { rdsys::rd_kafka_queue_get_consumer(consumer.client().native_ptr()) };
        if queue.is_null() {
            return Err(KafkaError::ClientCreation(
                "the consumer has no consumer queue (no group.id)".into(),
            ));
        }
        Ok(BatchQueue {
            queue,
            buffer: Vec::with_capacity(BATCH),
            _consumer: PhantomData,
        })
    }

    /// Waits up to `timeout` for records and calls `each` for every one taken, in the queue's
    /// order (each partition's in offset order). Returns how many were taken (0 when none came
    /// in time). A consumer error, or an error of `each`, ends the batch and is returned: the
    /// records after it are freed unread, and the consumer's position has passed them, so a
    /// caller that goes on must seek back first (the readers here stop).
    pub fn poll<E: From<KafkaError>>(
        &mut self,
        timeout: Duration,
        mut each: impl FnMut(&Polled<'_>) -> Result<(), E>,
    ) -> Result<usize, E> {
        let timeout_ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: the buffer has room for BATCH pointers; librdkafka writes at most that many
        // and returns how many it wrote (or -1 on error, with none written).
        let taken = unsafe {
            rdsys::rd_kafka_consume_batch_queue(
                self.queue,
                timeout_ms,
                self.buffer.as_mut_ptr(),
                BATCH,
            )
        };
        let Ok(taken) = usize::try_from(taken) else {
            return Err(KafkaError::MessageConsumption(RDKafkaErrorCode::Fail).into());
        };
        // SAFETY: the first `taken` slots were written by librdkafka.
        unsafe { self.buffer.set_len(taken) };
        // Every message is destroyed once, whatever `each` does (the drain drops them all).
        let mut outcome = Ok(taken);
        for ptr in self.buffer.drain(..) {
            let _owned = Owned(ptr);
            if outcome.is_err() {
                continue;
            }
            // SAFETY: a message of this batch, alive until `msg` drops.
            let raw = unsafe { &*ptr };
            if raw.err != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
                outcome = Err(KafkaError::MessageConsumption(raw.err.into()).into());
                continue;
            }
            if let Err(e) = each(&Polled { raw }) {
                outcome = Err(e);
            }
        }
        outcome
    }
}

impl Drop for BatchQueue<'_> {
    fn drop(&mut self) {
        // SAFETY: our own reference to the queue, taken in `new`.
        unsafe { rdsys::rd_kafka_queue_destroy(self.queue) };
    }
}

/// A message of a batch, destroyed when dropped.
struct Owned(*mut rdsys::rd_kafka_message_t);

impl Drop for Owned {
    fn drop(&mut self) {
        // SAFETY: each message of a batch is wrapped once.
        unsafe { rdsys::rd_kafka_message_destroy(self.0) };
    }
}

/// One consumed record of a batch, valid during its callback.
pub struct Polled<'a> {
    raw: &'a rdsys::rd_kafka_message_t,
}

/// Bytes at `ptr`, or `None` for a null pointer.
///
/// # Safety
/// `ptr` must be null or point to `len` readable bytes that outlive `'a`.
unsafe fn bytes<'a>(ptr: *const std::ffi::c_void, len: usize) -> Option<&'a [u8]> {
    if ptr.is_null() {
        None
    } else {
        // SAFETY: the caller's promise.
        Some(unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) })
    }
}

impl Message for Polled<'_> {
    type Headers = PolledHeaders;

    fn key(&self) -> Option<&[u8]> {
        // SAFETY: librdkafka's key buffer of the message, alive as long as it is.
        unsafe { bytes(self.raw.key, self.raw.key_len) }
    }

    fn payload(&self) -> Option<&[u8]> {
        // SAFETY: as for the key.
        unsafe { bytes(self.raw.payload, self.raw.len) }
    }

    unsafe fn payload_mut(&mut self) -> Option<&mut [u8]> {
        if self.raw.payload.is_null() {
            None
        } else {
            // SAFETY: the caller's promise (the trait's contract), as for BorrowedMessage.
            Some(unsafe {
                std::slice::from_raw_parts_mut(self.raw.payload.cast::<u8>(), self.raw.len)
            })
        }
    }

    fn topic(&self) -> &str {
        // SAFETY: a consumed message has a topic handle whose name lives as long as it does.
        let name = unsafe { CStr::from_ptr(rdsys::rd_kafka_topic_name(self.raw.rkt)) };
        // Kafka topic names are ASCII ([a-zA-Z0-9._-]).
        name.to_str().unwrap_or_default()
    }

    fn partition(&self) -> i32 {
        self.raw.partition
    }

    fn offset(&self) -> i64 {
        self.raw.offset
    }

    fn timestamp(&self) -> Timestamp {
        use rdsys::rd_kafka_timestamp_type_t as T;
        let mut kind = T::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE;
        // SAFETY: a valid message; librdkafka only reads it.
        let ms = unsafe {
            rdsys::rd_kafka_message_timestamp(std::ptr::from_ref(self.raw).cast_mut(), &mut kind)
        };
        match kind {
            _ if ms == -1 => Timestamp::NotAvailable,
            T::RD_KAFKA_TIMESTAMP_CREATE_TIME => Timestamp::CreateTime(ms),
            T::RD_KAFKA_TIMESTAMP_LOG_APPEND_TIME => Timestamp::LogAppendTime(ms),
            T::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE => Timestamp::NotAvailable,
        }
    }

    fn headers(&self) -> Option<&PolledHeaders> {
        let mut headers: *mut rdsys::rd_kafka_headers_t = std::ptr::null_mut();
        // SAFETY: librdkafka parses the message's headers once and keeps them with it.
        let err = unsafe {
            rdsys::rd_kafka_message_headers(std::ptr::from_ref(self.raw).cast_mut(), &mut headers)
        };
        if err != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || headers.is_null() {
            return None;
        }
        // SAFETY: `PolledHeaders` is a zero-sized stand-in for the header list, whose address
        // it carries, and the list lives as long as the message borrowed by `self`.
        Some(unsafe { &*headers.cast::<PolledHeaders>() })
    }
}

/// The header list of a [`Polled`] record (a reference to it is the list's address).
pub struct PolledHeaders {
    _private: [u8; 0],
}

impl PolledHeaders {
    fn ptr(&self) -> *const rdsys::rd_kafka_headers_t {
        std::ptr::from_ref(self).cast()
    }
}

impl Headers for PolledHeaders {
    fn count(&self) -> usize {
        // SAFETY: the list's address (see `Polled::headers`).
        unsafe { rdsys::rd_kafka_header_cnt(self.ptr()) }
    }

    fn try_get(&self, idx: usize) -> Option<Header<'_, &[u8]>> {
        let mut name: *const std::ffi::c_char = std::ptr::null();
        let mut value: *const std::ffi::c_void = std::ptr::null();
        let mut size = 0usize;
        // SAFETY: the list's address; librdkafka fills the three out-pointers on success.
        let err = unsafe {
            rdsys::rd_kafka_header_get_all(self.ptr(), idx, &mut name, &mut value, &mut size)
        };
        if err != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || name.is_null() {
            return None;
        }
        // SAFETY: a NUL-terminated name and `size` value bytes owned by the list.
        // A name that is not UTF-8 is none of ours: it reads as a replacement character
        // rather than ending the iteration (rdkafka's `HeadersIter` panics on `None`).
        let key = unsafe { CStr::from_ptr(name) }
            .to_str()
            .unwrap_or("\u{fffd}");
        Some(Header {
            key,
            value: unsafe { bytes(value, size) },
        })
    }
}
