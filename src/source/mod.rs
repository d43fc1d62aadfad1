//! Where records come from. [`kafka`]: the job's input topics, consumed with read_committed
//! by one consumer per job whose offsets commit inside the job's transactions.
//! [`outbox`]: a PostgreSQL outbox table, relayed to Kafka by [`crate::relay`].

pub mod kafka;
pub mod outbox;
