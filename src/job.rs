//! Which loop runs a topology: the outbox relay ([`crate::relay`]) for a topology whose input
//! is a PostgreSQL outbox table, the read-process-write loop ([`crate::engine`]) otherwise.

use std::sync::atomic::AtomicBool;

use crate::engine::{self, EngineError};
use crate::instance::{Identity, RunOptions, Summary};
use crate::relay::{self, RelayError};
use crate::telemetry;
use crate::topology::Topology;

/// Why a job stopped with an error: its loop's error.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Relay(#[from] RelayError),
}

/// Runs the job of `topology` until `shutdown` is set, `options` say stop, or a fatal error:
/// its outbox relay when its input is an outbox table, its read-process-write loop otherwise.
pub fn run(
    topology: &Topology,
    identity: &Identity,
    options: &RunOptions,
    shutdown: &AtomicBool,
) -> Result<Summary, JobError> {
    if topology.outbox().is_some() {
        return relay::run(topology, identity, options, shutdown).map_err(|e| {
            telemetry::fatal(&e);
            JobError::from(e)
        });
    }
    Ok(engine::run(topology, identity, options, shutdown)?)
}
