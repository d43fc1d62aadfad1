//! The statistics the report uses: the median and the range of a few values (a cell's rounds,
//! or the per-round ratios of two cells). No "fastest of": on a shared machine the fastest
//! run is the one that happened to land in a quiet second, which says nothing about the next.

/// Median and range of some values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub n: usize,
}

impl Summary {
    /// `None` without any finite value.
    pub fn of(values: impl IntoIterator<Item = f64>) -> Option<Summary> {
        let mut v: Vec<f64> = values.into_iter().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Some(Summary {
            median,
            min: v[0],
            max: v[n - 1],
            n,
        })
    }

    /// (max - min) / median: how far apart the rounds were.
    pub fn spread(&self) -> f64 {
        if self.median == 0.0 {
            0.0
        } else {
            (self.max - self.min) / self.median
        }
    }
}

/// The ratios `a[r] / b[r]` of the rounds `r` that both have, in round order.
pub fn paired(a: &[(u32, f64)], b: &[(u32, f64)]) -> Vec<(u32, f64)> {
    a.iter()
        .filter_map(|(r, x)| {
            b.iter()
                .find(|(rb, _)| rb == r)
                .filter(|(_, y)| *y > 0.0)
                .map(|(_, y)| (*r, x / y))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_range() {
        let s = Summary::of([3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.n), (2.0, 1.0, 3.0, 3));
        let s = Summary::of([4.0, 1.0, 2.0, 10.0]).unwrap();
        assert_eq!(s.median, 3.0);
        assert!((s.spread() - 3.0).abs() < 1e-12);
        assert_eq!(Summary::of([f64::NAN]), None);
        assert_eq!(Summary::of(Vec::new()), None);
        assert_eq!(Summary::of([5.0]).unwrap().spread(), 0.0);
    }

    #[test]
    fn ratios_pair_rounds_not_positions() {
        // Round 1 of `a` failed; round 3 of `b` failed; `b` round 0 is zero.
        let a = [(0, 10.0), (2, 30.0), (3, 40.0)];
        let b = [(0, 0.0), (1, 5.0), (2, 10.0)];
        assert_eq!(paired(&a, &b), vec![(2, 3.0)]);
        assert!(paired(&a, &[]).is_empty());
    }
}
