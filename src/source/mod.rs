//! Where records come from. [`kafka`]: the job's input topics, consumed with read_committed
//! by one consumer per job whose offsets commit inside the job's transactions. (A PostgreSQL
//! outbox table is not a source of a job: [`crate::relay`] publishes it.)

pub mod kafka;
