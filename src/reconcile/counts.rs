//! How many times each offset of a partition was seen, in one byte per offset (saturating at
//! 255), allocated lazily by chunks: memory follows the span of offsets a run covers, never
//! the ids or the records themselves, and a stretch nothing names costs nothing.

use std::collections::HashMap;
use std::hash::Hash;

const CHUNK_BITS: u32 = 16;
const CHUNK: usize = 1 << CHUNK_BITS;

/// Values by key, with the slot of the last key added to kept at hand: records come in runs
/// of one partition and of neighbouring offsets, so most additions skip the hash look-up
/// (a profile of reconcile put the hashing of keys at about 5 % of its time).
#[derive(Debug)]
pub struct Slots<K, V> {
    values: Vec<(K, V)>,
    index: HashMap<K, usize>,
    last: Option<(K, usize)>,
}

impl<K, V> Default for Slots<K, V> {
    fn default() -> Self {
        Slots {
            values: Vec::new(),
            index: HashMap::new(),
            last: None,
        }
    }
}

impl<K: Copy + Eq + Hash, V> Slots<K, V> {
    /// The value of `key`, made by `make` the first time.
    pub fn get_or_insert_with(&mut self, key: K, make: impl FnOnce() -> V) -> &mut V {
        let at = match self.last {
            Some((last, at)) if last == key => at,
            _ => {
                let values = &mut self.values;
                let at = *self.index.entry(key).or_insert_with(|| {
                    values.push((key, make()));
                    values.len() - 1
                });
                self.last = Some((key, at));
                at
            }
        };
        &mut self.values[at].1
    }

    pub fn get(&self, key: &K) -> Option<&V> {
        self.index.get(key).map(|&at| &self.values[at].1)
    }

    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.values.iter().map(|(_, v)| v)
    }

    pub fn len(&self) -> usize {
        self.values.len()
    }
}

impl<K, V> IntoIterator for Slots<K, V> {
    type Item = (K, V);
    type IntoIter = std::vec::IntoIter<(K, V)>;

    fn into_iter(self) -> Self::IntoIter {
        self.values.into_iter()
    }
}

/// Counts per offset of one partition.
#[derive(Debug, Default)]
pub struct Counts {
    chunks: Slots<i64, Box<[u8]>>,
}

/// The counts of one chunk of offsets ([`Counts::chunk`]), read without a look-up per offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk<'a> {
    number: i64,
    counts: Option<&'a [u8]>,
}

impl<'a> Chunk<'a> {
    /// The chunk of `offset` where nothing was counted.
    pub fn empty(offset: i64) -> Chunk<'a> {
        Chunk {
            number: offset.max(0) >> CHUNK_BITS,
            counts: None,
        }
    }

    /// Whether `offset` is in this chunk.
    pub fn holds(&self, offset: i64) -> bool {
        offset >= 0 && offset >> CHUNK_BITS == self.number
    }

    /// The count of `offset`, which must be in this chunk ([`Chunk::holds`]).
    pub fn get(&self, offset: i64) -> u8 {
        debug_assert!(self.holds(offset));
        self.counts
            .map_or(0, |c| c[(offset as usize) & (CHUNK - 1)])
    }
}

impl Counts {
    /// Counts one more sighting of `offset` (a negative offset is ignored).
    pub fn add(&mut self, offset: i64) {
        if offset < 0 {
            return;
        }
        let chunk = self
            .chunks
            .get_or_insert_with(offset >> CHUNK_BITS, || vec![0u8; CHUNK].into_boxed_slice());
        let slot = &mut chunk[(offset as usize) & (CHUNK - 1)];
        *slot = slot.saturating_add(1);
    }

    #[cfg(test)]
    /// How many times `offset` was seen (255 stands for 255 or more).
    pub fn get(&self, offset: i64) -> u8 {
        if offset < 0 {
            return 0;
        }
        self.chunk(offset).get(offset)
    }

    /// The chunk of counts `offset` (not negative) falls in, for reading its neighbours
    /// without a look-up each.
    pub fn chunk(&self, offset: i64) -> Chunk<'_> {
        let number = offset.max(0) >> CHUNK_BITS;
        Chunk {
            number,
            counts: self.chunks.get(&number).map(|c| &c[..]),
        }
    }

    /// Adds every count of `other` to these (saturating), as if its sightings had been
    /// counted here: how the counts of readers that ran side by side come together.
    pub fn merge(&mut self, other: Counts) {
        for (number, chunk) in other.chunks {
            let mut theirs = Some(chunk);
            let mine = self
                .chunks
                .get_or_insert_with(number, || theirs.take().unwrap_or_default());
            if let Some(theirs) = theirs {
                for (mine, theirs) in mine.iter_mut().zip(theirs.iter()) {
                    *mine = mine.saturating_add(*theirs);
                }
            }
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.chunks.len() * CHUNK
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_are_counted_and_saturate() {
        let mut c = Counts::default();
        c.add(3);
        c.add(3);
        c.add(70_000);
        c.add(-1);
        assert_eq!(c.get(3), 2);
        assert_eq!(c.get(4), 0);
        assert_eq!(c.get(70_000), 1);
        assert_eq!(c.get(-1), 0);
        assert_eq!(c.get(10_000_000), 0);
        assert_eq!(c.bytes(), 2 * CHUNK, "two chunks, allocated when named");
        for _ in 0..300 {
            c.add(5);
        }
        assert_eq!(c.get(5), 255);
    }

    #[test]
    fn merged_counts_are_the_sum_of_both() {
        let mut a = Counts::default();
        let mut b = Counts::default();
        a.add(1);
        a.add(2);
        b.add(2);
        b.add(200_000);
        for _ in 0..200 {
            a.add(9);
            b.add(9);
        }
        a.merge(b);
        assert_eq!(
            (a.get(1), a.get(2), a.get(3), a.get(9), a.get(200_000)),
            (1, 2, 0, 255, 1)
        );
        assert_eq!(a.bytes(), 2 * CHUNK);
    }

    #[test]
    fn a_chunk_reads_the_counts_of_its_offsets_and_says_which_it_holds() {
        let mut c = Counts::default();
        c.add(CHUNK as i64 + 1);
        c.add(CHUNK as i64 + 1);
        let chunk = c.chunk(CHUNK as i64 + 5);
        assert!(chunk.holds(CHUNK as i64) && chunk.holds(2 * CHUNK as i64 - 1));
        assert!(!chunk.holds(CHUNK as i64 - 1) && !chunk.holds(2 * CHUNK as i64));
        assert_eq!(
            (chunk.get(CHUNK as i64 + 1), chunk.get(CHUNK as i64)),
            (2, 0)
        );
        // A chunk nothing was counted in reads as zeros.
        let empty = c.chunk(5);
        assert!(empty.holds(0) && !empty.holds(-1));
        assert_eq!(empty.get(5), 0);
    }

    #[test]
    fn slots_find_every_key_whichever_was_added_last() {
        let mut s: Slots<i32, u32> = Slots::default();
        for key in [1, 1, 2, 1, 3, 3, 2] {
            *s.get_or_insert_with(key, || 0) += 1;
        }
        assert_eq!(
            (s.get(&1), s.get(&2), s.get(&3), s.get(&4)),
            (Some(&3), Some(&2), Some(&2), None)
        );
        assert_eq!(s.len(), 3);
        let mut all: Vec<(i32, u32)> = s.into_iter().collect();
        all.sort_unstable();
        assert_eq!(all, vec![(1, 3), (2, 2), (3, 2)]);
    }
}
