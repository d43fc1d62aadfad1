//! The onceflow command line: parse it, then hand it to [`onceflow::cli`].

use std::process::ExitCode;

// The per-record path makes many small, short-lived allocations: mimalloc handles them much
// faster than the system allocator (see docs/benchmarks.md). Its `override` feature makes it
// the process's malloc too, so librdkafka's copy of every produced and fetched message (C
// code, which this attribute does not reach) no longer goes through glibc's allocator, whose
// free and consolidation were about a sixth of the job's CPU (measured in
// docs/benchmarks.md, "librdkafka's allocations").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // First: a SIGTERM while the process starts waits for the command's own handling.
    onceflow::cli::hold_stop_signals();
    onceflow::alloc::keep_freed_memory();
    onceflow::cli::main(onceflow::cli::Cli::from_args())
}
