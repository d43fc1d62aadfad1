//! How many times each offset of a partition was seen, in one byte per offset (saturating at
//! 255), allocated lazily by chunks: memory follows the span of offsets a run covers, never
//! the ids or the records themselves, and a stretch nothing names costs nothing.

use std::collections::HashMap;

const CHUNK_BITS: u32 = 16;
const CHUNK: usize = 1 << CHUNK_BITS;

/// Counts per offset of one partition.
#[derive(Debug, Default)]
pub struct Counts {
    chunks: HashMap<i64, Box<[u8]>>,
}

impl Counts {
    /// Counts one more sighting of `offset` (a negative offset is ignored).
    pub fn add(&mut self, offset: i64) {
        if offset < 0 {
            return;
        }
        let chunk = self
            .chunks
            .entry(offset >> CHUNK_BITS)
            .or_insert_with(|| vec![0u8; CHUNK].into_boxed_slice());
        let slot = &mut chunk[(offset as usize) & (CHUNK - 1)];
        *slot = slot.saturating_add(1);
    }

    /// How many times `offset` was seen (255 stands for 255 or more).
    pub fn get(&self, offset: i64) -> u8 {
        if offset < 0 {
            return 0;
        }
        self.chunks
            .get(&(offset >> CHUNK_BITS))
            .map_or(0, |c| c[(offset as usize) & (CHUNK - 1)])
    }

    /// Adds every count of `other` to these (saturating), as if its sightings had been
    /// counted here: how the counts of readers that ran side by side come together.
    pub fn merge(&mut self, other: Counts) {
        for (index, chunk) in other.chunks {
            match self.chunks.entry(index) {
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(chunk);
                }
                std::collections::hash_map::Entry::Occupied(mut e) => {
                    for (mine, theirs) in e.get_mut().iter_mut().zip(chunk.iter()) {
                        *mine = mine.saturating_add(*theirs);
                    }
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
}
