//! Every log line the engine writes about its own life comes from here, one function per
//! event, so the wording, the fields and (later) the metric bumped with it stay in one place.

use std::time::Duration;

use tracing::{debug, error, info, warn};

/// Sets up logging: `json` for machines, human-readable otherwise; `RUST_LOG` filters.
pub fn init_tracing(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // A second initialisation (tests) is harmless: the first subscriber stays.
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

pub fn job_started(topology: &str, transactional_id: &str, group_id: &str, inputs: &[&str]) {
    info!(topology, transactional_id, group_id, ?inputs, "job started");
}

pub fn txn_committed(records: u64, outputs: u64, took: Duration) {
    debug!(
        records,
        outputs,
        took_ms = took.as_secs_f64() * 1e3,
        "transaction committed"
    );
}

pub fn txn_aborted(reason: &str, records: u64) {
    warn!(
        reason,
        records, "transaction aborted; partitions rewound to their committed offsets"
    );
}

pub fn txn_retry(operation: &str, attempt: u32, error: &dyn std::fmt::Display) {
    warn!(operation, attempt, %error, "retriable transaction error; calling again");
}

pub fn producer_rebuilt(error: &dyn std::fmt::Display) {
    warn!(%error, "fatal producer error; rebuilding the producer with the same transactional.id");
}

pub fn fatal(error: &dyn std::fmt::Display) {
    error!(%error, "fatal error; the job stops");
}

pub fn partitions_assigned(partitions: &[(String, i32)]) {
    info!(count = partitions.len(), ?partitions, "partitions assigned");
}

pub fn partitions_revoked(partitions: &[(String, i32)], lost: bool) {
    if lost {
        warn!(count = partitions.len(), ?partitions, "partitions lost");
    } else {
        info!(count = partitions.len(), ?partitions, "partitions revoked");
    }
}

pub fn consumer_error(error: &dyn std::fmt::Display) {
    warn!(%error, "consumer error");
}

pub fn progress(records_in: u64, records_out: u64, committed: u64, aborted: u64, rate: f64) {
    info!(
        records_in,
        records_out,
        txns_committed = committed,
        txns_aborted = aborted,
        records_per_s = rate.round(),
        "progress"
    );
}

/// The pipeline failed on a record; `on_error` says what the engine does about it.
pub fn record_failed(
    origin: &crate::transform::Origin,
    error: &crate::transform::TransformError,
    on_error: crate::topology::OnError,
) {
    let (topic, partition, offset) = (origin.topic.as_str(), origin.partition, origin.offset);
    let kind = error.kind.name();
    let stage = error.stage.to_string();
    match on_error {
        crate::topology::OnError::Fail => error!(
            topic, partition, offset, kind, stage, %error,
            "record failed in the pipeline; aborting the transaction and stopping (runtime.on_error: fail)"
        ),
        crate::topology::OnError::Skip => warn!(
            topic, partition, offset, kind, stage, %error,
            "record failed in the pipeline; skipped: its offset commits without output (runtime.on_error: skip)"
        ),
    }
}

pub fn shutting_down() {
    info!("shutdown requested; committing the transaction in flight");
}
