//! The ceiling clients: what a child process started as `onceflow-bench --client ...` runs
//! (produce-only, and the read-process-write loop without a transaction).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::BenchError;
use crate::kafka::{self, ProducerTuning};

/// The line a ceiling client prints once it is ready to go.
pub(crate) const CLIENT_READY: &str = "onceflow-bench: running";

/// What a ceiling client child (`onceflow-bench --client ...`) runs.
#[derive(Debug, Clone)]
pub enum Client {
    /// Write `records` records to `topic`, then wait to be stopped.
    Produce { topic: String, records: u64 },
    /// Read `input` (`partitions` partitions) and write it to `output` until stopped.
    Rpw {
        input: String,
        partitions: i32,
        output: String,
    },
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigterm(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// Runs a ceiling client in this process until SIGTERM (then returns `Ok`, exit code 0).
pub fn run_client(
    bootstrap: &str,
    client: &Client,
    record_size: usize,
    tuning: ProducerTuning,
) -> Result<(), BenchError> {
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(
            libc::SIGTERM,
            on_sigterm as extern "C" fn(libc::c_int) as libc::sighandler_t,
        )
    };
    let go_on = || !STOP.load(Ordering::Relaxed);
    let ready = || {
        use std::io::Write as _;
        let mut out = std::io::stdout();
        let _ = writeln!(out, "{CLIENT_READY}");
        let _ = out.flush();
    };
    match client {
        Client::Produce { topic, records } => {
            ready();
            kafka::preload(
                bootstrap,
                topic,
                0..*records,
                None,
                crate::kafka::RecordShape {
                    size: record_size,
                    keys: None,
                },
                tuning,
                &|_| {},
            )?;
            while go_on() {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Client::Rpw {
            input,
            partitions,
            output,
        } => {
            ready();
            kafka::read_process_write(bootstrap, input, *partitions, output, tuning, &|_| go_on())?;
        }
    }
    Ok(())
}
