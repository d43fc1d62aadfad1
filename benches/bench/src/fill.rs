//! The page cache filled before the first cell and refilled after each topic deletion, so
//! that no cell pays for the first touch of fresh memory (docs/benchmarks.md, "The broker's
//! slow mode is fresh memory"); the files themselves are [`machine::PageCacheFill`].

use std::path::Path;
use std::time::{Duration, Instant};

use crate::machine;

/// Memory left free when the page cache is filled. Small: what is free when a cell starts,
/// less the kernel's own reserve (its high watermarks, about 115 MiB here), the broker
/// writes into as fresh memory before the kernel reclaims anything; the processes of a cell
/// take clean page-cache pages back as readily as free ones. With 1 GiB left, each
/// 2,000,000-record run of `compare-builds` still wrote half its output into fresh memory.
const FILL_MARGIN: u64 = 256 << 20;

/// The least free memory worth a first fill.
const FILL_FIRST_MIN: u64 = 1 << 30;

/// Fills the page cache with the free memory less [`FILL_MARGIN`], in `dir`; `None` when less
/// than [`FILL_FIRST_MIN`] would be filled or the file cannot be made (said on standard
/// error: the run goes on).
pub(crate) fn fill_page_cache(dir: &Path) -> Option<machine::PageCacheFill> {
    let bytes = machine::mem_free_bytes()?.checked_sub(FILL_MARGIN)?;
    if bytes < FILL_FIRST_MIN {
        return None;
    }
    let gib = bytes as f64 / f64::from(1u32 << 30);
    eprintln!(
        "filling the page cache with {gib:.1} GiB (a sparse file's pages, nothing on disk), as \
         a broker's log fills it over time..."
    );
    let started = Instant::now();
    match machine::PageCacheFill::new(dir, bytes) {
        Ok(fill) => {
            eprintln!(
                "page cache filled in {:.0} s",
                started.elapsed().as_secs_f64()
            );
            Some(fill)
        }
        Err(e) => {
            eprintln!("could not fill the page cache in {}: {e}", dir.display());
            None
        }
    }
}

/// Fills the page cache again with what a topic deletion just freed, once the broker has
/// freed it (the broker the bench starts deletes a log at once: [`BROKER_SETTINGS`]), so that
/// no cell writes into fresh memory its predecessors left.
pub(crate) fn refill(fill: Option<&machine::PageCacheFill>) {
    if fill.is_some() {
        machine::wait_for_freed_memory(Duration::from_secs(1), Duration::from_secs(6));
    }
    top_up(fill);
}

/// Fills the page cache with what is free beyond [`FILL_MARGIN`] now, if anything.
pub(crate) fn top_up(fill: Option<&machine::PageCacheFill>) {
    let Some(fill) = fill else { return };
    let Some(bytes) = machine::mem_free_bytes().and_then(|f| machine::fill_bytes(f, FILL_MARGIN))
    else {
        return;
    };
    if let Err(e) = fill.add(bytes) {
        eprintln!("could not refill the page cache: {e}");
    }
}
