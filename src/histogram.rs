//! A histogram of durations, for percentiles without keeping every sample: commit durations
//! in the engine's stats, end-to-end latencies in the benchmark.
//!
//! Values are microseconds, counted in an HdrHistogram with 3 significant digits: below
//! 2048 µs each value has its own bucket; above, a bucket is at most 1/1000 of its values
//! wide, so a percentile is off by at most 0.1 % of its value. The histogram grows with the
//! largest value recorded; values of 2^40 µs (12 days) and more share its last bucket.

use std::time::Duration;

/// Significant decimal digits kept of every value.
const SIGFIG: u8 = 3;
/// Values from here up count in one bucket.
const HIGHEST_US: u64 = 1 << 40;

/// Counts of durations by bucket, and the exact largest one.
#[derive(Clone, PartialEq)]
pub struct Histogram {
    counts: hdrhistogram::Histogram<u64>,
    max: u64,
}

impl Eq for Histogram {}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            // Cannot fail: hdrhistogram refuses only more than 5 significant digits.
            counts: hdrhistogram::Histogram::new(SIGFIG).expect("3 significant digits"),
            max: 0,
        }
    }
}

impl std::fmt::Debug for Histogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Histogram")
            .field("count", &self.count())
            .field("p50_us", &self.percentile(0.5))
            .field("p99_us", &self.percentile(0.99))
            .field("max_us", &self.max)
            .finish()
    }
}

impl Histogram {
    /// Adds one duration.
    pub fn record(&mut self, d: Duration) {
        self.record_us(u64::try_from(d.as_micros()).unwrap_or(u64::MAX), 1);
    }

    /// Adds `n` values of `us` microseconds.
    pub fn record_us(&mut self, us: u64, n: u64) {
        if n == 0 {
            return;
        }
        let capped = us.min(HIGHEST_US);
        // The histogram grows to hold any value up to far beyond HIGHEST_US, so this does not
        // fail; were it to, the values would count in its current last bucket.
        if self.counts.record_n(capped, n).is_err() {
            self.counts.saturating_record_n(capped, n);
        }
        self.max = self.max.max(us);
    }

    /// Adds every value of `other`.
    pub fn merge(&mut self, other: &Histogram) {
        // Only a histogram that cannot grow refuses an addend, and these all can; were it to
        // happen, the buckets are added one by one.
        if self.counts.add(&other.counts).is_err() {
            for (low, n) in other.buckets() {
                self.record_us(low, n);
            }
        }
        self.max = self.max.max(other.max);
    }

    pub fn count(&self) -> u64 {
        self.counts.len()
    }

    /// The largest value recorded (exact).
    pub fn max_us(&self) -> u64 {
        self.max
    }

    /// The value at quantile `q` (0..=1) in microseconds: the middle of its bucket, never more
    /// than the maximum. `None` when empty.
    pub fn percentile(&self, q: f64) -> Option<u64> {
        if self.counts.is_empty() {
            return None;
        }
        let value = self.counts.value_at_quantile(q.clamp(0.0, 1.0));
        Some(self.counts.median_equivalent(value).min(self.max))
    }

    /// The non-empty buckets as `(lowest value, count)`, lowest first: a compact form that
    /// [`Histogram::record_us`] turns back into the same counts.
    pub fn buckets(&self) -> Vec<(u64, u64)> {
        self.counts
            .iter_recorded()
            .map(|v| {
                (
                    self.counts.lowest_equivalent(v.value_iterated_to()),
                    v.count_at_value(),
                )
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one bucket of a histogram holding only `us`.
    fn bucket_of(us: u64) -> (u64, u64) {
        let mut h = Histogram::default();
        h.record_us(us, 1);
        let buckets = h.buckets();
        assert_eq!(buckets.len(), 1, "{us}");
        buckets[0]
    }

    #[test]
    fn buckets_hold_three_significant_digits() {
        for us in (0..2048).chain([2048, 2049, 4097, 9_999, 123_456, 7_000_001, HIGHEST_US - 1]) {
            let (low, n) = bucket_of(us);
            assert_eq!(n, 1);
            assert!(low <= us, "{us}: {low}");
            if us < 2048 {
                assert_eq!(low, us, "exact below 2048");
            } else {
                assert!(us - low <= us / 1000, "{us}: {low}");
            }
            assert_eq!(
                bucket_of(low).0,
                low,
                "{us}: a bucket's lowest value is in it"
            );
        }
        // Beyond the top, values share the last bucket; the maximum stays exact.
        assert_eq!(bucket_of(u64::MAX).0, bucket_of(HIGHEST_US).0);
        let mut h = Histogram::default();
        h.record(Duration::MAX);
        assert_eq!((h.count(), h.max_us()), (1, u64::MAX));
        assert!(h.percentile(1.0).unwrap() >= HIGHEST_US - HIGHEST_US / 1000);
    }

    #[test]
    fn percentiles_are_within_a_thousandth() {
        let mut h = Histogram::default();
        for us in 1..=10_000 {
            h.record_us(us, 1);
        }
        for (q, exact) in [(0.5, 5_000.0), (0.99, 9_900.0), (1.0, 10_000.0)] {
            let got = h.percentile(q).unwrap() as f64;
            assert!(
                (got - exact).abs() <= exact / 1000.0,
                "q{q}: {got} vs {exact}"
            );
        }
        assert_eq!(
            h.percentile(1.0),
            Some(10_000),
            "never more than the maximum"
        );
        assert_eq!(h.count(), 10_000);
        assert_eq!(h.max_us(), 10_000);
        assert_eq!(Histogram::default().percentile(0.5), None);
    }

    #[test]
    fn durations_count_in_microseconds() {
        let mut h = Histogram::default();
        h.record(Duration::from_millis(3));
        h.record(Duration::from_nanos(1_500));
        assert_eq!(h.buckets(), [(1, 1), (3_000, 1)]);
        assert_eq!(h.max_us(), 3_000);
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
        assert_eq!(a.buckets(), b.buckets());
        assert_eq!(a.buckets().len(), 6);
        let mut m = Histogram::default();
        m.merge(&a);
        m.merge(&b);
        assert_eq!(m.count(), 24);
        assert_eq!(m.max_us(), 7_000_000);
        let doubled: Vec<_> = a.buckets().into_iter().map(|(us, n)| (us, 2 * n)).collect();
        assert_eq!(m.buckets(), doubled);
        assert_eq!(m.percentile(0.5), a.percentile(0.5));
    }
}
