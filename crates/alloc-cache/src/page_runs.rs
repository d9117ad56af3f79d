//! [`PageRuns`]: which pages of an expandable segment are mapped, as maximal runs.
//!
//! Invariants: the runs are disjoint, non-empty, non-adjacent (touching runs are merged) and
//! keyed by their first page. Every query and update costs O(log r + k) for r runs of which k
//! meet the range asked about, whatever the page count: mapping a 64 TiB request on a simulated
//! 2^62-byte device is one run, not 2^25 bits.

use std::collections::BTreeMap;

/// Sets of pages kept as `start -> end` (exclusive) runs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct PageRuns {
    runs: BTreeMap<usize, usize>,
}

impl PageRuns {
    /// Whether page `p` is in the set.
    #[cfg(test)]
    pub fn contains(&self, p: usize) -> bool {
        self.runs
            .range(..=p)
            .next_back()
            .is_some_and(|(_, &end)| p < end)
    }

    /// The runs meeting `[p0, p1)`, clipped to it, in order.
    fn clipped(&self, p0: usize, p1: usize) -> Vec<(usize, usize)> {
        let first = self
            .runs
            .range(..p0)
            .next_back()
            .filter(|(_, &end)| end > p0)
            .map(|(&s, &e)| (s, e));
        first
            .into_iter()
            .chain(self.runs.range(p0..p1).map(|(&s, &e)| (s, e)))
            .map(|(s, e)| (s.max(p0), e.min(p1)))
            .filter(|(s, e)| s < e)
            .collect()
    }

    /// Pages of `[p0, p1)` in the set.
    pub fn count_in(&self, p0: usize, p1: usize) -> usize {
        self.clipped(p0, p1).iter().map(|(s, e)| e - s).sum()
    }

    /// Whether every page of `[p0, p1)` is in the set.
    pub fn covers(&self, p0: usize, p1: usize) -> bool {
        self.count_in(p0, p1) == p1.saturating_sub(p0)
    }

    /// Pages in the set.
    pub fn total(&self) -> usize {
        self.runs.iter().map(|(s, e)| e - s).sum()
    }

    /// Maximal runs of `[p0, p1)` that are in the set (`inside`) or outside it.
    pub fn runs(&self, p0: usize, p1: usize, inside: bool) -> Vec<(usize, usize)> {
        let hits = self.clipped(p0, p1);
        if inside {
            return hits;
        }
        let mut gaps = Vec::new();
        let mut at = p0;
        for (s, e) in hits {
            if at < s {
                gaps.push((at, s));
            }
            at = e;
        }
        if at < p1 {
            gaps.push((at, p1));
        }
        gaps
    }

    /// Adds `[p0, p1)`, merging with touching runs.
    pub fn insert(&mut self, p0: usize, p1: usize) {
        if p0 >= p1 {
            return;
        }
        let (mut start, mut end) = (p0, p1);
        if let Some((&s, &e)) = self.runs.range(..=p0).next_back() {
            if e >= p0 {
                start = s;
                end = end.max(e);
            }
        }
        let absorbed: Vec<usize> = self.runs.range(start..=end).map(|(&s, _)| s).collect();
        for s in absorbed {
            if let Some(e) = self.runs.remove(&s) {
                end = end.max(e);
            }
        }
        self.runs.insert(start, end);
    }

    /// Removes `[p0, p1)`, splitting runs that stick out of it.
    pub fn remove(&mut self, p0: usize, p1: usize) {
        if p0 >= p1 {
            return;
        }
        let mut met: Vec<(usize, usize)> = Vec::new();
        if let Some((&s, &e)) = self.runs.range(..p0).next_back() {
            if e > p0 {
                met.push((s, e));
            }
        }
        met.extend(self.runs.range(p0..p1).map(|(&s, &e)| (s, e)));
        for (s, e) in met {
            self.runs.remove(&s);
            if s < p0 {
                self.runs.insert(s, p0);
            }
            if e > p1 {
                self.runs.insert(p1, e);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against a plain bit set over a small range, for every operation.
    #[test]
    fn matches_a_bit_set() {
        let mut runs = PageRuns::default();
        let mut bits = [false; 40];
        let mut x: u64 = 7;
        for _ in 0..2000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let a = (x >> 33) as usize % 40;
            let b = (x >> 45) as usize % 41;
            let (p0, p1) = (a.min(b), a.max(b));
            if x & 1 == 0 {
                runs.insert(p0, p1);
                bits[p0..p1].iter_mut().for_each(|v| *v = true);
            } else {
                runs.remove(p0, p1);
                bits[p0..p1].iter_mut().for_each(|v| *v = false);
            }
            for (p, &bit) in bits.iter().enumerate() {
                assert_eq!(runs.contains(p), bit, "page {p}");
            }
            let count = bits[p0..p1].iter().filter(|&&v| v).count();
            assert_eq!(runs.count_in(p0, p1), count);
            assert_eq!(runs.total(), bits.iter().filter(|&&v| v).count());
            for inside in [true, false] {
                let covered: usize = runs.runs(p0, p1, inside).iter().map(|(s, e)| e - s).sum();
                let want = if inside { count } else { p1 - p0 - count };
                assert_eq!(covered, want);
            }
            let keys: Vec<_> = runs.runs.iter().collect();
            assert!(
                keys.windows(2).all(|w| w[0].1 < w[1].0),
                "disjoint, not touching"
            );
        }
    }
}
