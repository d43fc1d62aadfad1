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
}
