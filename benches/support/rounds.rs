//! What the codec benchmarks share: a variant's rate over a timed pass, the median and spread
//! of its rounds, their settings from the environment, and the machine's load.

#![allow(dead_code)]

use std::time::{Duration, Instant};

/// Records per second of `pass` (one pass over the records, returning how many it did) over
/// `secs`, after `warm` not counted.
pub fn rate(pass: &mut dyn FnMut() -> usize, warm: Duration, secs: Duration) -> f64 {
    let warm_until = Instant::now() + warm;
    while Instant::now() < warm_until {
        pass();
    }
    let started = Instant::now();
    let mut done = 0;
    loop {
        done += pass();
        let elapsed = started.elapsed();
        if elapsed >= secs {
            return done as f64 / elapsed.as_secs_f64();
        }
    }
}

/// Median and min-max of `v`.
pub fn spread(v: &[f64]) -> (f64, f64, f64) {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    (median, v[0], v[n - 1])
}

pub fn env_f64(name: &str, default: f64) -> f64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.replace('_', "").parse().ok())
        .unwrap_or(default)
}

/// The one-minute load average.
pub fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_string))
        .unwrap_or_default()
}
