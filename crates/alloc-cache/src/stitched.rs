//! Stitched blocks kept in the cache (GMLake's multi-mapping, arXiv 2401.08156): with
//! `page_stitching` on a backend that can alias pages, a miss in a large pool that whole free
//! pages of the stream's expandable segments could hold is served by a *stitched block*: a
//! range of a separate alias address space onto which those pages are mapped a second time.
//! The pages stay mapped where they are, so no hole is left behind; when the stitched block is
//! freed it stays cached, and a later miss of the same page count takes it again with no
//! backend call if its pages are all free by then. A repeating step therefore stitches in its
//! first runs and then only reuses (moving pages instead would leave holes that the next run
//! fills by moving pages back).
//!
//! Invariants:
//! - A stitched block is a block of segment [`ALIAS_SEGMENT`] (no neighbours, in no pool),
//!   `runs` pages long in total; its i-th page reaches the memory of the i-th page of its runs
//!   (whole pages of expandable segments of its stream), one alias mapping per run.
//! - While it is allocated or pending, each run is exactly one `Lent` block of its segment,
//!   listed in `lent` (so no other block can be handed out over that memory); while it is free
//!   (cached), `lent` is empty and each run's memory is free or used by ordinary blocks.
//! - The memory of a run stays mapped at the run's pages as long as the stitched block exists:
//!   before pages are unmapped or moved, every cached stitched block over them is dropped
//!   (aliases unmapped first). Blocks in use never lie over free pages, so none is dropped.
//! - Aliases are not memory: a stitched block adds nothing to `reserved_bytes`; in use it counts
//!   in `allocated_bytes`, `active` and `allocation` like any block (its lent pages count
//!   nowhere), and cached it counts nowhere.

use crate::allocator::CachingAllocator;
use crate::backend::BackendError;
use crate::block::{Block, BlockState, State, NONE};
use crate::slab::ALIAS_SEGMENT;
use crate::stats::PoolKind;
use crate::stitched_state::{Run, Stitched};

/// Stitched blocks kept at most; beyond it the least recently used cached ones are dropped.
pub(crate) const MAX_CACHED_STITCHED: usize = 64;
/// A request is stitched only when its page rounding wastes at most this fraction (1/16) of
/// the stitched block: the block's pages serve no one else while it is in use, whereas pages
/// mapped in place share their tail with the next block (a 9 MiB request would lock 1 MiB
/// of a 10 MiB stitched block; 31.75 MiB in 32 MiB is fine).
pub(crate) const STITCHED_WASTE_DIVISOR: usize = 16;

impl State {
    /// Allocator teardown: forgets every stitched block and returns the alias mappings to
    /// unmap (one per run) and the alias space to release.
    #[allow(clippy::type_complexity)]
    pub(crate) fn take_aliases(
        &mut self,
        page: usize,
    ) -> (Vec<(u64, usize)>, Option<(u64, usize)>) {
        let mut out = Vec::new();
        for s in std::mem::take(&mut self.stitched.blocks) {
            let mut at = self.blocks[s.block as usize].addr;
            for r in &s.runs {
                let bytes = (r.p1 - r.p0) * page;
                out.push((at, bytes));
                at += bytes as u64;
            }
        }
        (out, self.stitched.space.take())
    }

    /// Frees stitched block `id` (allocated or pending): it becomes cached and its lent pages
    /// go back to their pools.
    pub(crate) fn free_stitched(&mut self, id: u32) {
        let before = self.contribution(id);
        let clock = self.clock;
        let b = &mut self.blocks[id as usize];
        b.state = BlockState::Free;
        b.requested = 0;
        b.freed_at = clock;
        let after = self.contribution(id);
        before.apply_change(after, &mut self.stats, PoolKind::Large);
        let Some(entry) = self.stitched.blocks.iter_mut().find(|s| s.block == id) else {
            return;
        };
        entry.used_at = clock;
        for lent in std::mem::take(&mut entry.lent) {
            self.free_block(lent);
        }
    }
}

impl CachingAllocator {
    fn run_addr(&self, st: &State, r: Run) -> u64 {
        st.segment(r.seg).base + (r.p0 * self.page) as u64
    }

    /// The free block of `r.seg` holding every page of run `r`, if there is one.
    fn free_block_over(&self, st: &State, r: Run) -> Option<u32> {
        let s = st.segment(r.seg);
        let (lo, hi) = (
            s.base + (r.p0 * self.page) as u64,
            s.base + (r.p1 * self.page) as u64,
        );
        let mut id = s.head;
        while id != NONE {
            let b = &st.blocks[id as usize];
            if b.addr <= lo && hi <= b.addr + b.size as u64 {
                return (b.state == BlockState::Free).then_some(id);
            }
            if b.addr >= hi {
                return None;
            }
            id = b.next;
        }
        None
    }

    /// Serves a miss of `rounded` bytes in large-pool expandable segment `seg`, which would need
    /// `growth` new pages in place, from a stitched block: a cached one of the same page count
    /// whose memory is all free again (no backend call), else a new one from the whole pages
    /// inside free blocks of the segment's stream, topped up with new pages mapped past the
    /// segment's end when those are fewer than `growth` (else `None`: growing in place needs
    /// less new memory). `None` too when the backend is out of memory for the top-up.
    pub(crate) fn stitched_fit(
        &self,
        st: &mut State,
        seg: u32,
        rounded: usize,
        growth: usize,
    ) -> Result<Option<u32>, BackendError> {
        let si = st.segment(seg).stream;
        let pages = rounded.div_ceil(self.page);
        if let Some(id) = self.reuse_stitched(st, si, pages) {
            return Ok(Some(id));
        }
        if (pages * self.page - rounded) * STITCHED_WASTE_DIVISOR > pages * self.page {
            return Ok(None);
        }
        let sources = self.stitch_sources(st, pages, [NONE, NONE], Some((si, PoolKind::Large)));
        let shortfall = pages - sources.iter().map(|r| r.p1 - r.p0).sum::<usize>();
        if shortfall >= growth {
            return Ok(None);
        }
        if shortfall > 0 {
            match self.map_free_tail(st, seg, shortfall) {
                Err(BackendError::OutOfMemory { .. }) => return Ok(None),
                other => other?,
            }
        }
        self.new_stitched(st, si, pages)
    }

    /// Maps `pages` new pages past the end of expandable segment `seg` as free memory (joined to
    /// a free last block, in the pool).
    fn map_free_tail(&self, st: &mut State, seg: u32, pages: usize) -> Result<(), BackendError> {
        let s = st.segment(seg);
        let bytes = pages * self.page;
        if s.extent
            .checked_add(bytes)
            .is_none_or(|end| end > s.address_space)
        {
            return Err(BackendError::OutOfMemory {
                requested: bytes,
                free: s.address_space - s.extent,
            });
        }
        let (p0, addr, tail, pool, stream) = (
            s.extent / self.page,
            s.base + s.extent as u64,
            s.tail,
            s.pool,
            s.stream,
        );
        self.map_run(st, seg, p0, p0 + pages)?;
        st.segment_mut(seg).extent += bytes;
        let mut b = Block::free(addr, bytes, seg, tail, pool, stream, st.clock);
        b.state = BlockState::Unmapped;
        // A free last block counts as split once something follows it.
        let before = st.contribution(tail);
        let id = self.link_after(st, seg, tail, b);
        before.apply_change(st.contribution(tail), &mut st.stats, pool);
        st.free_block(id);
        Ok(())
    }

    /// The most recently used cached stitched block of `pages` pages on stream `si` whose
    /// memory is all free, with its runs lent to it again.
    fn reuse_stitched(&self, st: &mut State, si: u16, pages: usize) -> Option<u32> {
        let bytes = pages * self.page;
        let pick = st
            .stitched
            .blocks
            .iter()
            .enumerate()
            .filter(|(_, s)| {
                let b = &st.blocks[s.block as usize];
                b.state == BlockState::Free && b.stream == si && b.size == bytes
            })
            .filter(|(_, s)| {
                s.runs
                    .iter()
                    .all(|&r| self.free_block_over(st, r).is_some())
            })
            .max_by_key(|(_, s)| s.used_at)
            .map(|(i, _)| i)?;
        let runs = st.stitched.blocks[pick].runs.clone();
        let mut lent = Vec::with_capacity(runs.len());
        for r in runs {
            // Checked above; carving one run leaves the others inside free blocks.
            let id = self.free_block_over(st, r)?;
            lent.push(self.carve_pages(st, id, r.p0, r.p1, BlockState::Lent));
        }
        let clock = st.clock;
        let entry = &mut st.stitched.blocks[pick];
        entry.lent = lent;
        entry.used_at = clock;
        Some(entry.block)
    }

    /// First page of `pages` free pages of the alias space (reserving the space on first use,
    /// dropping least recently used cached stitched blocks when it is full); `None` when even
    /// that leaves no room.
    fn alias_pages(&self, st: &mut State, pages: usize) -> Result<Option<usize>, BackendError> {
        let (_, bytes) = match st.stitched.space {
            Some(space) => space,
            None => {
                let bytes = self.address_space_bytes();
                let base = self.backend.reserve_address_space(bytes)?;
                st.stitched.space = Some((base, bytes));
                (base, bytes)
            }
        };
        let total = bytes / self.page;
        loop {
            let gaps = st.stitched.used.runs(0, total, false);
            if let Some(&(p0, _)) = gaps.iter().find(|(a, b)| b - a >= pages) {
                return Ok(Some(p0));
            }
            if !self.evict_least_recent(st, None)? {
                return Ok(None);
            }
        }
    }

    /// A new stitched block of `pages` pages on stream `si` from the whole pages inside free
    /// blocks of the stream's expandable segments (largest runs first, so fewest mappings);
    /// `None` when they hold fewer pages.
    fn new_stitched(
        &self,
        st: &mut State,
        si: u16,
        pages: usize,
    ) -> Result<Option<u32>, BackendError> {
        let sources = self.stitch_sources(st, pages, [NONE, NONE], Some((si, PoolKind::Large)));
        if sources.iter().map(|r| r.p1 - r.p0).sum::<usize>() < pages {
            return Ok(None);
        }
        let Some(at) = self.alias_pages(st, pages)? else {
            return Ok(None);
        };
        let base = st.stitched.space.map_or(0, |(b, _)| b) + (at * self.page) as u64;
        let mut done = 0;
        for (i, r) in sources.iter().enumerate() {
            let run = Run {
                seg: r.seg,
                p0: r.p0,
                p1: r.p1,
            };
            let bytes = (r.p1 - r.p0) * self.page;
            let to = base + (done * self.page) as u64;
            if let Err(e) = self.backend.map_alias(self.run_addr(st, run), to, bytes) {
                let mut undo = 0;
                for r in &sources[..i] {
                    let n = (r.p1 - r.p0) * self.page;
                    // SAFETY: aliases made just now, reached by no block yet.
                    unsafe { self.backend.unmap_alias(base + undo as u64, n)? };
                    undo += n;
                }
                return match e {
                    BackendError::OutOfMemory { .. } => Ok(None),
                    e => Err(e),
                };
            }
            done += r.p1 - r.p0;
        }
        st.stitched.used.insert(at, at + pages);
        let block = Block::free(
            base,
            pages * self.page,
            ALIAS_SEGMENT,
            NONE,
            PoolKind::Large,
            si,
            st.clock,
        );
        let id = st.new_block(block);
        let mut runs = Vec::with_capacity(sources.len());
        let mut lent = Vec::with_capacity(sources.len());
        for r in sources {
            runs.push(Run {
                seg: r.seg,
                p0: r.p0,
                p1: r.p1,
            });
            lent.push(self.carve_pages(st, r.block, r.p0, r.p1, BlockState::Lent));
        }
        let used_at = st.clock;
        st.stitched.blocks.push(Stitched {
            block: id,
            runs,
            lent,
            used_at,
        });
        while st.stitched.blocks.len() > MAX_CACHED_STITCHED {
            if !self.evict_least_recent(st, None)? {
                break;
            }
        }
        Ok(Some(id))
    }

    /// Drops the least recently used cached stitched block (over page run `over` only, when
    /// given); whether there was one.
    fn evict_least_recent(&self, st: &mut State, over: Option<Run>) -> Result<bool, BackendError> {
        let meets = |s: &Stitched| {
            over.is_none_or(|o| {
                s.runs
                    .iter()
                    .any(|r| r.seg == o.seg && r.p0 < o.p1 && o.p0 < r.p1)
            })
        };
        let pick = st
            .stitched
            .blocks
            .iter()
            .enumerate()
            .filter(|(_, s)| st.blocks[s.block as usize].state == BlockState::Free && meets(s))
            .min_by_key(|(_, s)| s.used_at)
            .map(|(i, _)| i);
        let Some(i) = pick else {
            return Ok(false);
        };
        let s = st.stitched.blocks.swap_remove(i);
        let b = st.blocks[s.block as usize];
        let mut at = b.addr;
        for r in &s.runs {
            let bytes = (r.p1 - r.p0) * self.page;
            // SAFETY: the block is cached (free): nothing reaches memory through its aliases.
            unsafe { self.backend.unmap_alias(at, bytes)? };
            at += bytes as u64;
        }
        let space = st.stitched.space.map_or(0, |(base, _)| base);
        let p0 = ((b.addr - space) / self.page as u64) as usize;
        st.stitched.used.remove(p0, p0 + b.size / self.page);
        st.kill_block(s.block);
        Ok(true)
    }

    /// Drops every cached stitched block over pages `[p0, p1)` of segment `seg` (all of them
    /// when `seg` is `NONE`), before those pages are unmapped or moved.
    pub(crate) fn evict_stitched(
        &self,
        st: &mut State,
        seg: u32,
        p0: usize,
        p1: usize,
    ) -> Result<(), BackendError> {
        let over = (seg != NONE).then_some(Run { seg, p0, p1 });
        while self.evict_least_recent(st, over)? {}
        Ok(())
    }

    /// Gives the alias address space back once no stitched block is left in it.
    pub(crate) fn release_alias_space(&self, st: &mut State) -> Result<(), BackendError> {
        if !st.stitched.blocks.is_empty() {
            return Ok(());
        }
        if let Some((base, bytes)) = st.stitched.space.take() {
            // SAFETY: no stitched block is left, so nothing is mapped in the space.
            unsafe { self.backend.release_address_space(base, bytes)? };
        }
        Ok(())
    }

    /// The stitched-block invariants; a violation's text.
    pub(crate) fn check_stitched(&self, st: &State) -> Option<String> {
        let mut lent_total = 0;
        for s in &st.stitched.blocks {
            let b = &st.blocks[s.block as usize];
            let pages: usize = s.runs.iter().map(|r| r.p1 - r.p0).sum();
            if b.segment != ALIAS_SEGMENT || b.size != pages * self.page {
                return Some(format!("stitched block {}: size or segment wrong", s.block));
            }
            let in_use = matches!(
                b.state,
                BlockState::Allocated | BlockState::Pending | BlockState::Arena
            );
            let cached = b.state == BlockState::Free && s.lent.is_empty();
            if !in_use && !cached {
                return Some(format!("stitched block {}: state {:?}", s.block, b.state));
            }
            if in_use && s.lent.len() != s.runs.len() {
                return Some(format!("stitched block {}: runs not all lent", s.block));
            }
            for (&l, &r) in s.lent.iter().zip(&s.runs) {
                let x = &st.blocks[l as usize];
                let base = st.segment(r.seg).base;
                let addr = base + (r.p0 * self.page) as u64;
                if x.state != BlockState::Lent
                    || x.addr != addr
                    || x.size != (r.p1 - r.p0) * self.page
                {
                    return Some(format!("stitched block {}: lent block {l} wrong", s.block));
                }
            }
            for r in &s.runs {
                if !st.segment(r.seg).pages.covers(r.p0, r.p1) {
                    return Some(format!("stitched block {}: memory unmapped", s.block));
                }
            }
            lent_total += s.lent.len();
        }
        let lent_blocks = st
            .blocks
            .iter()
            .filter(|b| b.state == BlockState::Lent)
            .count();
        (lent_blocks != lent_total)
            .then(|| format!("{lent_blocks} lent blocks, {lent_total} lent by stitched blocks"))
    }
}
