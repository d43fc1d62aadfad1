//! The allocator's settings shared by the binaries (onceflow's and the benchmark's, each
//! with mimalloc as its global allocator).

/// mimalloc's `mi_option_purge_delay` (its v3 `include/mimalloc.h`, `enum mi_option_e`; the
/// sys crate has no constant for it).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Memory the process frees stays with mimalloc for reuse instead of going back to the OS a
/// second later: librdkafka frees and allocates its fetch and produce buffers all the time,
/// and every page given back came back as a fresh page for the kernel to fault in and zero
/// (87,000 page faults in a 19 s exactly-once run at 8 partitions, about 1,000 without
/// purging). Paired against purging after 1 s (docs/benchmarks.md): CPU 0.91 (0.85-0.95)
/// times on an Intel Xeon, 1.00 (0.88-1.07) on an AMD EPYC, for 1.12 (0.99-1.17) times the
/// peak RSS. The environment's `MIMALLOC_PURGE_DELAY` (milliseconds; mimalloc's own default
/// is 1000) still decides when set.
pub fn keep_freed_memory() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: sets an option of the allocator linked in; options are plain integers
        // read when mimalloc decides to purge, and -1 is its documented "never".
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
    }
}
