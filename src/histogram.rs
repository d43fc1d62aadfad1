//! A fixed-size log-linear histogram of durations, for percentiles without keeping every
//! sample: commit durations in the engine's stats, end-to-end latencies in the benchmark.
//!
//! Values are microseconds. Below 16 µs each value has its own bucket; above, every power of
//! two is split into 16 equal buckets, so a percentile is off by at most 1/16 (6 %) of its
//! value. Values of 2^40 µs (12 days) and more share the last bucket.

/// Sub-buckets per power of two.
const SUB: usize = 16;
const SUB_BITS: u32 = 4;
/// Largest power of two with buckets of its own.
const MAX_EXP: u32 = 40;
const BUCKETS: usize = SUB + (MAX_EXP as usize - SUB_BITS as usize + 1) * SUB;

/// Counts of durations by bucket. `Copy`, so stats that hold one stay plain values.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Histogram {
    counts: [u64; BUCKETS],
    total: u64,
    max: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: [0; BUCKETS],
            total: 0,
            max: 0,
        }
    }
}

impl std::fmt::Debug for Histogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Histogram")
            .field("count", &self.total)
            .field("p50_us", &self.percentile(0.5))
            .field("p99_us", &self.percentile(0.99))
            .field("max_us", &self.max)
            .finish()
    }
}

fn index_of(us: u64) -> usize {
    if us < SUB as u64 {
        return us as usize;
    }
    let exp = (63 - us.leading_zeros()).min(MAX_EXP);
    if exp == MAX_EXP && us >> MAX_EXP > 1 {
        return BUCKETS - 1;
    }
    let sub = ((us >> (exp - SUB_BITS)) as usize) & (SUB - 1);
    SUB + (exp - SUB_BITS) as usize * SUB + sub
}

/// The smallest value of bucket `i`.
fn low_of(i: usize) -> u64 {
    if i < SUB {
        return i as u64;
    }
    let exp = ((i - SUB) / SUB) as u32 + SUB_BITS;
    let sub = ((i - SUB) % SUB) as u64;
    (1u64 << exp) + (sub << (exp - SUB_BITS))
}

impl Histogram {
    /// Adds one duration.
    pub fn record(&mut self, d: std::time::Duration) {
        self.record_us(u64::try_from(d.as_micros()).unwrap_or(u64::MAX), 1);
    }

    /// Adds `n` values of `us` microseconds.
    pub fn record_us(&mut self, us: u64, n: u64) {
        if n == 0 {
            return;
        }
        self.counts[index_of(us)] += n;
        self.total += n;
        self.max = self.max.max(us);
    }

    /// Adds every value of `other`.
    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
            *a += b;
        }
        self.total += other.total;
        self.max = self.max.max(other.max);
    }

    pub fn count(&self) -> u64 {
        self.total
    }

    /// The largest value recorded (exact).
    pub fn max_us(&self) -> u64 {
        self.max
    }

    /// The value at quantile `q` (0..=1) in microseconds: the middle of its bucket, never more
    /// than the maximum. `None` when empty.
    pub fn percentile(&self, q: f64) -> Option<u64> {
        if self.total == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                let low = low_of(i);
                let high = if i + 1 < BUCKETS {
                    low_of(i + 1)
                } else {
                    self.max + 1
                };
                return Some((low + (high - 1 - low) / 2).min(self.max));
            }
        }
        Some(self.max)
    }

    /// The non-empty buckets as `(lowest value, count)`: a compact form that
    /// [`Histogram::record_us`] turns back into the same histogram.
    pub fn buckets(&self) -> Vec<(u64, u64)> {
        self.counts
            .iter()
            .enumerate()
            .filter(|(_, c)| **c > 0)
            .map(|(i, c)| (low_of(i), *c))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_contiguous_and_ordered() {
        for i in 1..BUCKETS {
            assert!(low_of(i) > low_of(i - 1), "bucket {i}");
            assert_eq!(index_of(low_of(i)), i, "bucket {i}");
            assert_eq!(index_of(low_of(i) - 1), i - 1, "bucket {i}");
        }
        assert_eq!(index_of(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn percentiles_are_within_a_sixteenth() {
        let mut h = Histogram::default();
        for us in 1..=10_000 {
            h.record_us(us, 1);
        }
        for (q, exact) in [(0.5, 5_000.0), (0.99, 9_900.0), (1.0, 10_000.0)] {
            let got = h.percentile(q).unwrap() as f64;
            assert!(
                (got - exact).abs() <= exact / 16.0,
                "q{q}: {got} vs {exact}"
            );
        }
        assert_eq!(h.count(), 10_000);
        assert_eq!(h.max_us(), 10_000);
        assert_eq!(Histogram::default().percentile(0.5), None);
    }

    #[test]
    fn buckets_round_trip_and_merge() {
        let mut a = Histogram::default();
        for us in [3, 17, 900, 901, 123_456, 7_000_000] {
            a.record_us(us, 2);
        }
        let mut b = Histogram::default();
        for (low, n) in a.buckets() {
            b.record_us(low, n);
        }
        assert_eq!(a.counts, b.counts);
        let mut m = Histogram::default();
        m.merge(&a);
        m.merge(&b);
        assert_eq!(m.count(), 24);
        assert_eq!(m.max_us(), 7_000_000);
    }
}
