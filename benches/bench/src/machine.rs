//! What the machine was doing while a cell ran, from `/proc`: the load average, the CPU time
//! of the whole machine, of the broker and of the process under test, what the broker read
//! from storage and what memory the kernel reclaimed; and the page cache filled before the
//! first cell ([`PageCacheFill`]).
//!
//! The broker is found by the port it listens on (`/proc/net/tcp*`, then the process holding
//! that socket), so a broker the bench did not start is measured too, as long as it runs on
//! this machine under a user whose `/proc/<pid>/fd` can be read.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Clock ticks a second of the times in `/proc/<pid>/stat` and `/proc/stat`.
fn ticks_per_s() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

/// The 1-minute load average.
pub fn load1() -> Option<f64> {
    parse_loadavg(&std::fs::read_to_string("/proc/loadavg").ok()?)
}

fn parse_loadavg(text: &str) -> Option<f64> {
    text.split_whitespace().next()?.parse().ok()
}

/// The number of cores this process may run on.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// CPU time (user + system, all threads) of process `pid` so far, in seconds.
pub fn process_cpu_s(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_pid_stat(&stat).map(|ticks| ticks as f64 / ticks_per_s())
}

/// utime + stime, in ticks, of a `/proc/<pid>/stat` line (fields 14 and 15; the command
/// name in parentheses may hold spaces, so count from the last `)`).
fn parse_pid_stat(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state): utime is field 14, stime field 15.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// Bytes process `pid` has had read from storage so far (`read_bytes` of `/proc/<pid>/io`):
/// a broker reads from storage what is no longer in the page cache.
pub fn process_read_bytes(pid: u32) -> Option<u64> {
    parse_io_read_bytes(&std::fs::read_to_string(format!("/proc/{pid}/io")).ok()?)
}

fn parse_io_read_bytes(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("read_bytes:"))?
        .trim()
        .parse()
        .ok()
}

/// Bytes of memory the kernel has reclaimed so far, machine-wide (`pgsteal_kswapd` and
/// `pgsteal_direct` of `/proc/vmstat`, in pages of 4 KiB): with memory full of page cache,
/// every page the broker writes takes one back, on its own CPU when the reclaim is direct.
pub fn reclaimed_bytes() -> Option<u64> {
    parse_vmstat_reclaimed(&std::fs::read_to_string("/proc/vmstat").ok()?)
}

fn parse_vmstat_reclaimed(text: &str) -> Option<u64> {
    let pages = text
        .lines()
        .filter_map(|l| {
            let (name, value) = l.split_once(' ')?;
            matches!(name, "pgsteal_kswapd" | "pgsteal_direct")
                .then(|| value.trim().parse::<u64>().ok())?
        })
        .fold(None, |sum: Option<u64>, n| Some(sum.unwrap_or(0) + n))?;
    Some(pages * 4096)
}

/// Bytes of memory free so far (`MemFree` of `/proc/meminfo`): neither used nor cache.
pub fn mem_free_bytes() -> Option<u64> {
    parse_meminfo_free(&std::fs::read_to_string("/proc/meminfo").ok()?)
}

fn parse_meminfo_free(text: &str) -> Option<u64> {
    let kib: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("MemFree:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// The page cache filled with the holes of a sparse file, kept until dropped: no byte on
/// disk, and clean pages the kernel reclaims at once when anything needs memory.
///
/// Why: a broker appends to its log through the page cache. Taken from free memory, each new
/// page is a first touch, and where free memory is given back to a hypervisor (free page
/// reporting, as on the machine of docs/benchmarks.md) a first touch costs the broker
/// several times the CPU of a page reclaimed from the cache ("The broker's slow mode is fresh
/// memory"). A broker that has run for a while has memory full of its page cache; this puts
/// the machine in that state before the first cell instead of during the first ones.
pub struct PageCacheFill {
    dir: PathBuf,
    /// One sparse file per fill: the first, then one for each [`PageCacheFill::add`].
    parts: Mutex<Vec<PathBuf>>,
}

impl PageCacheFill {
    /// Creates a sparse file of `bytes` in `dir` and reads it once through.
    pub fn new(dir: &Path, bytes: u64) -> std::io::Result<PageCacheFill> {
        // Owned first, so that an error below still removes the file.
        let fill = PageCacheFill {
            dir: dir.to_path_buf(),
            parts: Mutex::new(Vec::new()),
        };
        fill.add(bytes)?;
        Ok(fill)
    }

    /// Fills `bytes` more, with a sparse file of its own: memory freed since (a deleted
    /// topic's log takes its pages with it) taken back.
    pub fn add(&self, bytes: u64) -> std::io::Result<()> {
        use std::io::Read;
        let path = {
            let mut parts = self.parts.lock().unwrap_or_else(|e| e.into_inner());
            let path = self.dir.join(format!("page-cache-fill-{}", parts.len()));
            parts.push(path.clone());
            path
        };
        std::fs::File::create(&path)?.set_len(bytes)?;
        let mut file = std::fs::File::open(&path)?;
        let mut buf = vec![0u8; 1 << 20];
        while file.read(&mut buf)? > 0 {}
        Ok(())
    }
}

impl Drop for PageCacheFill {
    fn drop(&mut self) {
        let parts = self.parts.get_mut().unwrap_or_else(|e| e.into_inner());
        for path in parts.iter() {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// What to fill so that `margin` of memory is left free, with `free` free now: nothing under
/// [`TOP_UP_MIN`] (not worth a file).
pub fn fill_bytes(free: u64, margin: u64) -> Option<u64> {
    free.checked_sub(margin).filter(|&b| b >= TOP_UP_MIN)
}

/// The least [`fill_bytes`] fills.
pub const TOP_UP_MIN: u64 = 64 << 20;

/// How much free memory may still change between two readings [`SETTLE_STEP`] apart for a
/// deletion to be over.
const SETTLED_WITHIN: u64 = 16 << 20;
const SETTLE_STEP: Duration = Duration::from_millis(250);

/// Waits at least `min` for memory being freed (a broker deleting a topic's log, just
/// asked), then until the free memory holds still, `max` at most.
pub fn wait_for_freed_memory(min: Duration, max: Duration) {
    let started = Instant::now();
    std::thread::sleep(min);
    let mut last = mem_free_bytes();
    while started.elapsed() < max {
        std::thread::sleep(SETTLE_STEP);
        let now = mem_free_bytes();
        if settled(last, now) {
            return;
        }
        last = now;
    }
}

/// Whether two readings of the free memory, a step apart, say nothing more is being freed
/// (or taken); no reading, no wait.
fn settled(before: Option<u64>, after: Option<u64>) -> bool {
    match (before, after) {
        (Some(b), Some(a)) => a.abs_diff(b) < SETTLED_WITHIN,
        _ => true,
    }
}

/// Busy and total CPU time of the whole machine so far (the `cpu` line of `/proc/stat`), in
/// seconds summed over cores.
#[derive(Debug, Clone, Copy)]
pub struct MachineCpu {
    pub busy_s: f64,
    pub total_s: f64,
}

pub fn machine_cpu() -> Option<MachineCpu> {
    parse_proc_stat(&std::fs::read_to_string("/proc/stat").ok()?)
}

fn parse_proc_stat(text: &str) -> Option<MachineCpu> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest times are inside user).
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3)? + v.get(4).copied().unwrap_or(0);
    let tps = ticks_per_s();
    Some(MachineCpu {
        busy_s: total.saturating_sub(idle) as f64 / tps,
        total_s: total as f64 / tps,
    })
}

/// The process listening on TCP `port` of this machine, if it can be found.
pub fn listener_pid(port: u16) -> Option<u32> {
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        if let Ok(text) = std::fs::read_to_string(table) {
            inodes.extend(listening_inodes(&text, port));
        }
    }
    if inodes.is_empty() {
        return None;
    }
    let wanted: Vec<String> = inodes.iter().map(|i| format!("socket:[{i}]")).collect();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(target) = std::fs::read_link(fd.path())
                && wanted.iter().any(|w| Path::new(w) == target)
            {
                return Some(pid);
            }
        }
    }
    None
}

/// Inodes of the sockets listening on `port` in a `/proc/net/tcp` table.
fn listening_inodes(table: &str, port: u16) -> Vec<u64> {
    const LISTEN: &str = "0A";
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let local_port = f.get(1)?.rsplit(':').next()?;
            let port_matches = u16::from_str_radix(local_port, 16).ok()? == port;
            (port_matches && *f.get(3)? == LISTEN).then(|| f.get(9)?.parse().ok())?
        })
        .collect()
}

/// The port of the first `host:port` of a bootstrap list.
pub fn bootstrap_port(bootstrap: &str) -> Option<u16> {
    bootstrap
        .split(',')
        .next()?
        .trim()
        .rsplit(':')
        .next()?
        .parse()
        .ok()
}

/// One line about the machine: cores, CPU model, memory.
pub fn describe() -> String {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let mem_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map(|kib| kib / 1024.0 / 1024.0);
    match mem_gib {
        Some(g) => format!("{} cores ({model}), {g:.0} GiB", cores()),
        None => format!("{} cores ({model})", cores()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_files_parse() {
        assert_eq!(parse_loadavg("2.50 1.00 0.50 3/400 1234\n"), Some(2.5));
        assert_eq!(parse_loadavg(""), None);
        // A command name with spaces and parentheses; utime 7, stime 5.
        let stat = "42 (my (odd) name) S 1 42 42 0 -1 4194560 100 0 0 0 7 5 0 0 20 0 3 0";
        assert_eq!(parse_pid_stat(stat), Some(12));
        assert_eq!(parse_pid_stat("42 (x) S 1"), None);
        let cpu = parse_proc_stat("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3\n").unwrap();
        let tps = ticks_per_s();
        assert!((cpu.total_s - 1000.0 / tps).abs() < 1e-9);
        assert!((cpu.busy_s - 150.0 / tps).abs() < 1e-9);
        let io =
            "rchar: 900\nwchar: 100\nsyscr: 3\nsyscw: 1\nread_bytes: 8192\nwrite_bytes: 4096\n";
        assert_eq!(parse_io_read_bytes(io), Some(8192));
        assert_eq!(parse_io_read_bytes("rchar: 900\n"), None);
        let vmstat =
            "pgsteal_kswapd 10\npgsteal_direct 5\npgsteal_khugepaged 7\npgscan_kswapd 99\n";
        assert_eq!(parse_vmstat_reclaimed(vmstat), Some(15 * 4096));
        assert_eq!(parse_vmstat_reclaimed("pgscan_kswapd 99\n"), None);
        let meminfo = "MemTotal:       24684048 kB\nMemFree:         1164000 kB\nCached: 1 kB\n";
        assert_eq!(parse_meminfo_free(meminfo), Some(1_164_000 * 1024));
        assert_eq!(parse_meminfo_free("MemTotal: 1 kB\n"), None);
    }

    #[test]
    fn a_listening_socket_is_found_by_port() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
            0: 0100007F:C004 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1111 1\n\
            1: 0100007F:C004 0100007F:D000 01 00000000:00000000 00:00000000 00000000     0        0 2222 1\n\
            2: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 3333 1\n";
        // 0xC004 = 49156: only the listening socket, not the connection.
        assert_eq!(listening_inodes(table, 49156), vec![1111]);
        assert_eq!(listening_inodes(table, 8080), vec![3333]);
        assert!(listening_inodes(table, 1).is_empty());
        assert_eq!(
            bootstrap_port("127.0.0.1:49092,127.0.0.1:49094"),
            Some(49092)
        );
        assert_eq!(bootstrap_port("nohost"), None);
    }

    #[test]
    fn the_page_cache_fill_takes_no_disk_and_goes_with_its_owner() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let fill = PageCacheFill::new(dir.path(), 8 << 20).unwrap();
        fill.add(4 << 20).unwrap();
        for (name, len) in [
            ("page-cache-fill-0", 8 << 20),
            ("page-cache-fill-1", 4 << 20),
        ] {
            let meta = std::fs::metadata(dir.path().join(name)).unwrap();
            assert_eq!(meta.len(), len, "{name}");
            assert_eq!(meta.blocks(), 0, "{name}: a sparse file, holes only");
        }
        drop(fill);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_fill_leaves_its_margin_and_skips_crumbs() {
        const GIB: u64 = 1 << 30;
        assert_eq!(fill_bytes(5 * GIB, GIB), Some(4 * GIB));
        assert_eq!(fill_bytes(GIB + TOP_UP_MIN, GIB), Some(TOP_UP_MIN));
        assert_eq!(fill_bytes(GIB + TOP_UP_MIN - 1, GIB), None);
        assert_eq!(fill_bytes(GIB / 2, GIB), None);
    }

    #[test]
    fn memory_has_settled_when_two_readings_agree() {
        assert!(settled(Some(1 << 30), Some((1 << 30) + (8 << 20))));
        assert!(settled(Some(1 << 30), Some((1 << 30) - (8 << 20))));
        assert!(!settled(Some(1 << 30), Some(2 << 30)), "still being freed");
        assert!(settled(None, Some(1 << 30)), "no reading: no wait");
    }
}
