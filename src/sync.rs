//! Small helpers over `std::sync`, shared by the engine and the telemetry.

use std::sync::{Mutex, MutexGuard};

/// Locks a mutex; a poisoned one means a panic elsewhere already ended the job's thread, and
/// the data it guards (counters, an error) stays meaningful.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
