//! The index of free blocks of one pool: segregated size classes with a two-level bitmap, so a
//! best-fit lookup, an insertion and a removal each cost a handful of instructions and never
//! allocate (an ordered tree, as in PyTorch's `std::set`, costs a descent and sometimes a node
//! allocation per operation, which dominated the hit path).
//!
//! Classes: every size up to 2 MiB (the largest free block a small segment can hold) has its own
//! class (`size / 512`), so the first non-empty class at or above a request holds blocks of
//! exactly the best-fit size. Above 2 MiB, each power of two is cut into 16 classes; the first
//! non-empty class may then hold several sizes and is scanned (large free blocks are few) for
//! the smallest that fits, ties to the lowest address. Inside an exact class ties go to the most
//! recently freed block, whose memory is the most likely to still be in cache.
//!
//! Each class is an intrusive doubly linked list threaded through the blocks' `free_prev` /
//! `free_next` fields; a bit per class says whether it is non-empty and a summary bit per word
//! of the bitmap says whether that word is non-zero.

use crate::sizes::MIN_BLOCK;
use crate::slab::{Block, NONE};

/// Classes `1..=EXACT_MAX` are exact sizes `class * 512` (up to 2 MiB).
const EXACT_MAX: usize = (2 << 20) / MIN_BLOCK;
/// Classes per power of two above 2 MiB (as a shift).
const SUB_BITS: u32 = 4;
/// log2 of the first size above the exact classes.
const FIRST_LOG: u32 = 21;
/// Powers of two covered above 2 MiB (up to 2^51 bytes).
const LOG_LEVELS: usize = 30;
const NUM_CLASSES: usize = EXACT_MAX + 1 + LOG_LEVELS * (1 << SUB_BITS);
const WORDS: usize = NUM_CLASSES.div_ceil(64);

fn class_of(size: usize) -> usize {
    let units = size / MIN_BLOCK;
    if units <= EXACT_MAX {
        return units;
    }
    let log = usize::BITS - 1 - size.leading_zeros();
    let sub = (size >> (log - SUB_BITS)) & ((1 << SUB_BITS) - 1);
    EXACT_MAX + 1 + (log - FIRST_LOG) as usize * (1 << SUB_BITS) + sub
}

/// Free blocks of one pool of one stream.
#[derive(Debug, Clone)]
pub(crate) struct FreeIndex {
    heads: Vec<u32>,
    words: [u64; WORDS],
    summary: u128,
    len: usize,
}

impl Default for FreeIndex {
    fn default() -> Self {
        Self {
            heads: vec![NONE; NUM_CLASSES],
            words: [0; WORDS],
            summary: 0,
            len: 0,
        }
    }
}

impl FreeIndex {
    /// Number of free blocks indexed.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Adds free block `id` (its size must not change while indexed).
    #[inline]
    pub fn insert(&mut self, blocks: &mut [Block], id: u32) {
        let class = class_of(blocks[id as usize].size);
        let head = self.heads[class];
        if head != NONE {
            blocks[head as usize].free_prev = id;
        } else {
            self.words[class / 64] |= 1 << (class % 64);
            self.summary |= 1 << (class / 64);
        }
        let b = &mut blocks[id as usize];
        b.free_prev = NONE;
        b.free_next = head;
        self.heads[class] = id;
        self.len += 1;
    }

    /// Removes indexed block `id`.
    #[inline]
    pub fn remove(&mut self, blocks: &mut [Block], id: u32) {
        let (size, prev, next) = {
            let b = &blocks[id as usize];
            (b.size, b.free_prev, b.free_next)
        };
        let class = class_of(size);
        if next != NONE {
            blocks[next as usize].free_prev = prev;
        }
        if prev != NONE {
            blocks[prev as usize].free_next = next;
        } else {
            debug_assert_eq!(self.heads[class], id);
            self.heads[class] = next;
            if next == NONE {
                self.words[class / 64] &= !(1 << (class % 64));
                if self.words[class / 64] == 0 {
                    self.summary &= !(1 << (class / 64));
                }
            }
        }
        self.len -= 1;
    }

    /// First non-empty class at or above `class`.
    #[inline]
    fn next_nonempty(&self, class: usize) -> Option<usize> {
        if class >= NUM_CLASSES {
            return None;
        }
        let w = class / 64;
        let bits = self.words[w] & (!0u64 << (class % 64));
        if bits != 0 {
            return Some(w * 64 + bits.trailing_zeros() as usize);
        }
        let rest = self.summary & (!0u128 << (w + 1));
        if rest == 0 {
            return None;
        }
        let w = rest.trailing_zeros() as usize;
        Some(w * 64 + self.words[w].trailing_zeros() as usize)
    }

    /// The smallest indexed block of at least `rounded` bytes (not removed).
    #[inline]
    pub fn best_fit(&self, blocks: &[Block], rounded: usize) -> Option<u32> {
        let mut class = self.next_nonempty(class_of(rounded))?;
        loop {
            if class <= EXACT_MAX {
                return Some(self.heads[class]);
            }
            if let Some(id) = self.smallest_in(blocks, class, rounded) {
                return Some(id);
            }
            class = self.next_nonempty(class + 1)?;
        }
    }

    /// Smallest block of `class` with at least `min` bytes, ties to the lowest address.
    fn smallest_in(&self, blocks: &[Block], class: usize, min: usize) -> Option<u32> {
        let mut best: Option<(usize, u64, u32)> = None;
        let mut id = self.heads[class];
        while id != NONE {
            let b = &blocks[id as usize];
            if b.size >= min && best.is_none_or(|(s, a, _)| (b.size, b.addr) < (s, a)) {
                best = Some((b.size, b.addr, id));
            }
            id = b.free_next;
        }
        best.map(|(_, _, id)| id)
    }

    /// Size of the largest indexed block (0 when empty).
    pub fn largest(&self, blocks: &[Block]) -> usize {
        if self.summary == 0 {
            return 0;
        }
        let w = 127 - self.summary.leading_zeros() as usize;
        let class = w * 64 + 63 - self.words[w].leading_zeros() as usize;
        let mut id = self.heads[class];
        let mut largest = 0;
        while id != NONE {
            largest = largest.max(blocks[id as usize].size);
            id = blocks[id as usize].free_next;
        }
        largest
    }

    /// Whether block `id` is indexed (walks its class: for invariant checks).
    pub fn contains(&self, blocks: &[Block], id: u32) -> bool {
        let mut cur = self.heads[class_of(blocks[id as usize].size)];
        while cur != NONE {
            if cur == id {
                return true;
            }
            cur = blocks[cur as usize].free_next;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_are_monotonic_and_exact_up_to_2_mib() {
        assert_eq!(class_of(512), 1);
        assert_eq!(class_of(2 << 20), EXACT_MAX);
        assert_eq!(class_of((2 << 20) + 512), EXACT_MAX + 1);
        assert_eq!(class_of(3 << 20), EXACT_MAX + 1 + 8);
        assert_eq!(class_of(4 << 20), EXACT_MAX + 1 + 16);
        assert!(class_of(1 << 50) < NUM_CLASSES);
        let mut last = 0;
        let mut size = 512;
        while size < 1 << 40 {
            let c = class_of(size);
            assert!(c >= last, "class of {size} went down");
            last = c;
            size += size / 7 / 512 * 512 + 512;
        }
    }

    /// Blocks of one class above 2 MiB share a list in the order they were freed; the largest,
    /// the best fit and the lowest-address tie are found by size, not by position in the list.
    #[test]
    fn a_shared_class_is_searched_by_size_and_address() {
        use crate::stats::PoolKind;
        let mb = 1usize << 20;
        // One class (3 MiB up to 3 MiB + 128 KiB); its list holds them most recently freed first.
        let sizes = [
            3 * mb + (32 << 10),
            3 * mb + (64 << 10),
            3 * mb,
            3 * mb + (64 << 10),
        ];
        assert!(sizes.iter().all(|&s| class_of(s) == class_of(3 * mb)));
        let mut blocks: Vec<Block> = sizes
            .iter()
            .enumerate()
            .map(|(i, &size)| {
                Block::free((1 + i as u64) << 30, size, 0, NONE, PoolKind::Large, 0, 0)
            })
            .collect();
        let mut index = FreeIndex::default();
        for id in 0..blocks.len() as u32 {
            index.insert(&mut blocks, id);
        }
        assert_eq!(index.largest(&blocks), 3 * mb + (64 << 10));
        assert_eq!(index.best_fit(&blocks, 3 * mb), Some(2));
        assert_eq!(index.best_fit(&blocks, 3 * mb + 512), Some(0));
        // Two blocks of the largest size; the list visits block 3 first, the lower address
        // (block 1) wins.
        assert_eq!(index.best_fit(&blocks, 3 * mb + (33 << 10)), Some(1));
        assert_eq!(index.best_fit(&blocks, 3 * mb + (65 << 10)), None);
        index.remove(&mut blocks, 3);
        index.remove(&mut blocks, 1);
        assert_eq!(index.largest(&blocks), 3 * mb + (32 << 10));
    }
}
