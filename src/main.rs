//! The onceflow command line: parse it, then hand it to [`onceflow::cli`].

use std::process::ExitCode;

use clap::Parser;

// The per-record path makes many small, short-lived allocations: mimalloc handles them much
// faster than the system allocator (see docs/benchmarks.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    onceflow::cli::main(onceflow::cli::Cli::parse())
}
