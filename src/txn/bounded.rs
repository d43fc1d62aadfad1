//! A transactional client call on a thread of its own, waited for up to a bound: one that has
//! not returned by then is abandoned, and its client with it.
//!
//! librdkafka bounds each transactional call by the timeout it is given, but a request whose
//! answer never reaches its handler leaves the call waiting forever (a coordinator's broker
//! SIGKILLed and decommissioned while the call ran: librdkafka#5456 and #5511, which
//! vendor/patches/0005 and 0007 cover; a path not covered yet would hang the same way). A
//! thread inside a C call cannot be stopped. What can be done is what Kafka Streams does when
//! `sendOffsetsToTransaction` exceeds `max.block.ms`: give up on that producer and make a new
//! one with the same `transactional.id`, whose initialization fences the old one's epoch and
//! aborts its open transaction. The abandoned thread keeps its client until the call
//! returns, if ever; [`MAX_STUCK`] of them at once is as far as the process goes: past that,
//! the caller waits as before, and the watchdog of client calls ends the process.

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Duration;

/// How long past its own timeout a call is waited for before it is abandoned: the patched
/// client returns by its timeout plus the 500 ms of a last retry's delay; the rest is
/// scheduling slack on a loaded machine. The watchdog of client calls
/// ([`crate::instance::call_bound`]) allows 5 s, so it fires only when a call could not be
/// abandoned.
pub const ABANDON_AFTER: Duration = Duration::from_millis(2_500);

/// The most abandoned calls still running at once; past this the caller waits for its call.
pub const MAX_STUCK: usize = 3;

/// Abandoned calls that have not returned yet, in this process.
static STUCK: AtomicUsize = AtomicUsize::new(0);

const RUNNING: u8 = 0;
const RETURNED: u8 = 1;
const ABANDONED: u8 = 2;

/// The number of abandoned calls that have not returned yet.
pub fn stuck() -> usize {
    STUCK.load(Ordering::Acquire)
}

/// Runs `call` on a thread of its own and waits for it up to `bound`. `None`: it has not
/// returned by then and is abandoned (it runs on, and its result is dropped when it comes).
/// With [`MAX_STUCK`] calls already abandoned, or no thread to be had, it waits for the call
/// whatever it takes. A panic of the call panics here.
pub fn call<T: Send + 'static>(
    bound: Duration,
    call: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let state = Arc::new(AtomicU8::new(RUNNING));
    let (tx, rx) = mpsc::sync_channel(1);
    let theirs = Arc::clone(&state);
    let call = Arc::new(std::sync::Mutex::new(Some(call)));
    let on_thread = Arc::clone(&call);
    let spawned = std::thread::Builder::new()
        .name("onceflow-call".into())
        .stack_size(256 << 10)
        .spawn(move || {
            let Some(call) = crate::sync::lock(&on_thread).take() else {
                return;
            };
            let result = call();
            if theirs
                .compare_exchange(RUNNING, RETURNED, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                let _ = tx.send(result);
            } else {
                // Abandoned by its caller: this call no longer counts as stuck.
                STUCK.fetch_sub(1, Ordering::AcqRel);
            }
        });
    if spawned.is_err() {
        // No thread to be had: call here.
        let call = crate::sync::lock(&call).take()?;
        return Some(call());
    }
    match rx.recv_timeout(bound) {
        Ok(result) => return Some(result),
        // A panic on the call's thread is a defect, not a hung client: end as the loop would.
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            panic!("the thread of a client call ended without its result: it panicked")
        }
        Err(mpsc::RecvTimeoutError::Timeout) => {}
    }
    if abandon(&state) {
        return None;
    }
    // It returned meanwhile, or may not be abandoned: its result comes.
    match rx.recv() {
        Ok(result) => Some(result),
        Err(_) => panic!("the thread of a client call ended without its result: it panicked"),
    }
}

/// Marks a call that has not returned as abandoned, if fewer than [`MAX_STUCK`] are; false if
/// it returned meanwhile or may not be abandoned.
fn abandon(state: &AtomicU8) -> bool {
    if STUCK.fetch_add(1, Ordering::AcqRel) >= MAX_STUCK {
        STUCK.fetch_sub(1, Ordering::AcqRel);
        return false;
    }
    if state
        .compare_exchange(RUNNING, ABANDONED, Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
    {
        return true;
    }
    STUCK.fetch_sub(1, Ordering::AcqRel);
    false
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    use super::*;

    #[test]
    fn a_call_that_returns_in_time_gives_its_result() {
        assert_eq!(call(Duration::from_secs(5), || 7), Some(7));
    }

    /// One test for everything that counts stuck calls, since the count is the process's.
    #[test]
    fn a_call_past_its_bound_is_abandoned_until_too_many_are_stuck() {
        let before = stuck();
        let mut releases = Vec::new();
        for i in 0..MAX_STUCK - before {
            let (release, wait) = mpsc::channel::<()>();
            releases.push(release);
            let started = Instant::now();
            let r = call(Duration::from_millis(100), move || {
                let _ = wait.recv();
                i
            });
            assert_eq!(r, None, "call {i} was not abandoned");
            assert!(started.elapsed() < Duration::from_secs(2));
        }
        assert_eq!(stuck(), MAX_STUCK);
        // With MAX_STUCK stuck, the next call is waited for past its bound.
        let started = Instant::now();
        let r = call(Duration::from_millis(50), || {
            std::thread::sleep(Duration::from_millis(300));
            "waited for"
        });
        assert_eq!(r, Some("waited for"));
        assert!(started.elapsed() >= Duration::from_millis(300));
        // An abandoned call that returns at last no longer counts.
        drop(releases);
        let deadline = Instant::now() + Duration::from_secs(5);
        while stuck() > before && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(stuck(), before);
    }
}
