//! A set of offsets as sorted, disjoint, half-open runs `[start, end)`: the missing or
//! duplicated offsets of a partition, kept compact (one run for a whole stretch) and cheap to
//! add to in offset order.

/// Offsets as runs; adding in increasing order extends the last run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RangeSet {
    runs: Vec<(i64, i64)>,
    len: u64,
}

impl RangeSet {
    /// Adds `offset`; O(1) when offsets come in increasing order (as a partition is read),
    /// O(runs) otherwise.
    pub fn insert(&mut self, offset: i64) {
        match self.runs.last_mut() {
            Some((_, end)) if *end == offset => {
                *end += 1;
                self.len += 1;
                return;
            }
            Some((_, end)) if *end < offset => {
                self.runs.push((offset, offset + 1));
                self.len += 1;
                return;
            }
            None => {
                self.runs.push((offset, offset + 1));
                self.len += 1;
                return;
            }
            Some(_) => {}
        }
        // Out of order: find its place.
        let i = self.runs.partition_point(|&(_, end)| end < offset);
        if let Some(&(start, end)) = self.runs.get(i)
            && start <= offset
            && offset < end
        {
            return;
        }
        self.len += 1;
        let joins_left = self.runs.get(i).is_some_and(|&(_, end)| end == offset);
        let next = if joins_left { i + 1 } else { i };
        let joins_right = self
            .runs
            .get(next)
            .is_some_and(|&(start, _)| start == offset + 1);
        match (joins_left, joins_right) {
            (true, true) => {
                self.runs[i].1 = self.runs[next].1;
                self.runs.remove(next);
            }
            (true, false) => self.runs[i].1 = offset + 1,
            (false, true) => self.runs[next].0 = offset,
            (false, false) => self.runs.insert(i, (offset, offset + 1)),
        }
    }

    #[cfg(test)]
    /// How many offsets it holds.
    pub fn len(&self) -> u64 {
        self.len
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    #[cfg(test)]
    /// The runs, in order.
    pub fn runs(&self) -> &[(i64, i64)] {
        &self.runs
    }

    #[cfg(test)]
    pub fn contains(&self, offset: i64) -> bool {
        let i = self.runs.partition_point(|&(_, end)| end <= offset);
        self.runs.get(i).is_some_and(|&(start, _)| start <= offset)
    }

    /// The first `n` runs as text: `3`, `5-9` (inclusive), `…` when there are more.
    pub fn describe(&self, n: usize) -> String {
        let mut parts: Vec<String> = self
            .runs
            .iter()
            .take(n)
            .map(|&(s, e)| {
                if e == s + 1 {
                    s.to_string()
                } else {
                    format!("{s}-{}", e - 1)
                }
            })
            .collect();
        if self.runs.len() > n {
            parts.push("…".into());
        }
        parts.join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_in_order_make_one_run_per_stretch() {
        let mut s = RangeSet::default();
        for o in (0..1000).chain(2000..2010) {
            s.insert(o);
        }
        assert_eq!(s.runs(), &[(0, 1000), (2000, 2010)]);
        assert_eq!(s.len(), 1010);
        assert_eq!(s.describe(5), "0-999,2000-2009");
        assert_eq!(s.describe(1), "0-999,…");
    }

    #[test]
    fn offsets_out_of_order_merge_with_their_neighbours() {
        let mut s = RangeSet::default();
        for o in [10, 12, 5, 11, 11, 4, 6, 20, 0] {
            s.insert(o);
        }
        assert_eq!(s.runs(), &[(0, 1), (4, 7), (10, 13), (20, 21)]);
        assert_eq!(s.len(), 8);
        assert!(s.contains(5) && s.contains(12) && s.contains(0));
        assert!(!s.contains(7) && !s.contains(3) && !s.contains(13));
        s.insert(3);
        s.insert(1);
        s.insert(2);
        assert_eq!(s.runs(), &[(0, 7), (10, 13), (20, 21)]);
        assert_eq!(s.describe(9), "0-6,10-12,20");
    }

    #[test]
    fn the_same_offset_twice_counts_once() {
        let mut s = RangeSet::default();
        s.insert(7);
        s.insert(7);
        assert_eq!(s.len(), 1);
        assert!(!s.is_empty());
        assert!(RangeSet::default().is_empty());
    }
}
