//! Stitching (page-level defragmentation of expandable segments, after GMLake, arXiv
//! 2401.08156): when a request fits no free block, the memory of free gaps moves to where the
//! request needs it, so the memory held follows live bytes to within a page.
//!
//! Invariants of an expandable segment (checked by `check_invariants` after every step of the
//! property tests):
//! - A page below `extent` is either wholly inside one `Unmapped` block (a *hole*) and not
//!   mapped, or it overlaps only blocks that are not holes and is mapped. So every free block
//!   is backed: the hit path never maps, and a request that fits a free block costs no call.
//! - A hole starts and ends on page boundaries, is in no pool, is never next to another hole
//!   (they merge), and is never the segment's last block (the extent is cut back past it).
//! - Within a segment each page is mapped at one address: pages are moved
//!   (`MemoryBackend::remap`), never mapped twice there. The only second mappings are the
//!   aliases of stitched blocks (`stitched.rs`), whose pages are `Lent` in the segment while
//!   the stitched block is in use, so no two blocks in use share memory.
//!
//! Every miss of an expandable segment comes to [`stitch`](CachingAllocator::stitch), which
//! picks where the request goes: at the start of a hole (joined to the free block before it,
//! and to the one after it when the hole fills up) or past the extent (joined to a free last
//! block), whichever needs the fewest pages (a hole on a tie, so address space is reused).
//! With `page_stitching` on a backend with alias mappings, a large-pool miss first tries a
//! stitched block (`stitched.rs`): the whole free pages of the stream's large segment, mapped a
//! second time as one range and kept cached after use, so later steps reuse it with no call.
//! On a backend without aliases, when the request takes allocated bytes to a new peak (the
//! moment that sets the peak of reserved bytes), the pages come first from the whole pages
//! inside free blocks of any expandable segment, the blocks with most such pages first, each
//! block's run moved with one backend call; only the rest is new memory. (Moving pages on
//! every miss lowers the first step's peak further, but a repeating step then moves pages back
//! and forth in every later step: single-mapped pages cannot serve two layouts without calls;
//! aliases can.) Other misses map new pages, and every miss moves pages when the backend is
//! out of memory. A repeating step reaches its peak in its first run, so later runs move
//! nothing and settle like plain expandable segments.

use crate::allocator::CachingAllocator;
use crate::backend::BackendError;
use crate::block::{Block, BlockState, Segment, State, NONE};
use crate::stats::PoolKind;

/// Where a stitched request goes in its segment.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Target {
    /// The free block before the new pages, which the request starts in (or `NONE`).
    left: u32,
    /// The free block after the hole, left alone so the hole keeps its neighbours (or `NONE`).
    right: u32,
    /// The hole the pages fill from its start, or `NONE` for pages past the extent.
    hole: u32,
    /// First page to map.
    page: usize,
    /// Pages to map.
    pub pages: usize,
}

/// A run of whole pages inside a free block, to be moved or lent.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Source {
    pub seg: u32,
    pub block: u32,
    pub p0: usize,
    pub p1: usize,
}

impl CachingAllocator {
    fn is_state(st: &State, id: u32, state: BlockState) -> bool {
        id != NONE && st.blocks[id as usize].state == state
    }

    /// The place for `rounded` bytes in segment `seg` needing the fewest new pages, or `None`
    /// when the segment's address space has no room.
    pub(crate) fn stitch_target(&self, st: &State, seg: u32, rounded: usize) -> Option<Target> {
        let s = st.segment(seg);
        let page = self.page;
        let free_size =
            |id: u32| Self::is_state(st, id, BlockState::Free).then(|| st.blocks[id as usize].size);
        let mut best: Option<Target> = None;
        let mut id = s.head;
        while id != NONE {
            let b = &st.blocks[id as usize];
            if b.state == BlockState::Unmapped {
                let left = free_size(b.prev);
                let right = free_size(b.next);
                let need = rounded.saturating_sub(left.unwrap_or(0));
                let pages = if need <= b.size {
                    Some(need.div_ceil(page))
                } else if need <= b.size + right.unwrap_or(0) {
                    Some(b.size / page)
                } else {
                    None
                };
                if let Some(pages) = pages.filter(|&p| best.is_none_or(|t| p < t.pages)) {
                    best = Some(Target {
                        left: if left.is_some() { b.prev } else { NONE },
                        right: if right.is_some() { b.next } else { NONE },
                        hole: id,
                        page: ((b.addr - s.base) / page as u64) as usize,
                        pages,
                    });
                }
            }
            id = b.next;
        }
        let tail = free_size(s.tail);
        let pages = rounded.saturating_sub(tail.unwrap_or(0)).div_ceil(page);
        let fits = pages
            .checked_mul(page)
            .and_then(|b| b.checked_add(s.extent))
            .is_some_and(|end| end <= s.address_space);
        if fits && best.is_none_or(|t| pages < t.pages) {
            best = Some(Target {
                left: if tail.is_some() { s.tail } else { NONE },
                right: NONE,
                hole: NONE,
                page: s.extent / page,
                pages,
            });
        }
        best
    }

    /// Up to `pages` whole pages inside free blocks of every expandable segment (of one stream
    /// and pool only, when `only` says so) but not in `keep`, taken from the blocks with the
    /// most such pages first (fewest moves or aliases), each from its end.
    pub(crate) fn stitch_sources(
        &self,
        st: &State,
        pages: usize,
        keep: [u32; 2],
        only: Option<(u16, PoolKind)>,
    ) -> Vec<Source> {
        let mut found = Vec::new();
        for (seg, s) in st.segments.iter().enumerate() {
            let wanted = |s: &&Segment| {
                s.expandable() && only.is_none_or(|(si, pool)| si == s.stream && pool == s.pool)
            };
            let Some(s) = s.as_ref().filter(wanted) else {
                continue;
            };
            let mut id = s.head;
            while id != NONE {
                let b = &st.blocks[id as usize];
                if b.state == BlockState::Free && !keep.contains(&id) {
                    let (p0, p1) = self.interior_pages(s, b);
                    if p0 < p1 {
                        found.push(Source {
                            seg: seg as u32,
                            block: id,
                            p0,
                            p1,
                        });
                    }
                }
                id = b.next;
            }
        }
        found.sort_by_key(|r| (std::cmp::Reverse(r.p1 - r.p0), r.seg, r.p0));
        let mut left = pages;
        let mut out = Vec::new();
        for mut r in found {
            if left == 0 {
                break;
            }
            let take = left.min(r.p1 - r.p0);
            r.p0 = r.p1 - take;
            left -= take;
            out.push(r);
        }
        out
    }

    /// A free block (out of its pool) of segment `seg` holding `rounded` bytes at its start
    /// (or a stitched block, see `stitched.rs`). With `page_stitching` and aliases, a large
    /// request first tries a stitched block, when that needs fewer new pages than growing in
    /// place. Without aliases, a request that takes allocated bytes past their peak gets the
    /// pages of free gaps moved to it first (the moment that sets the peak of reserved
    /// bytes). Any other request gets new pages, and only when the backend is out of memory are
    /// the gaps' pages moved instead. So a repeating step, whose peak was reached in its first
    /// run, moves no more pages once its layout has settled.
    pub(crate) fn stitch(
        &self,
        st: &mut State,
        seg: u32,
        rounded: usize,
    ) -> Result<u32, BackendError> {
        if self.aliases && st.segment(seg).pool == PoolKind::Large {
            let pages = self
                .stitch_target(st, seg, rounded)
                .map_or(usize::MAX, |t| t.pages);
            if let Some(id) = self.stitched_fit(st, seg, rounded, pages)? {
                return Ok(id);
            }
        }
        let allocated = &st.stats.allocated_bytes.all;
        let new_peak =
            (allocated.current as usize).saturating_add(rounded) > allocated.peak as usize;
        let first = self.config.page_stitching && new_peak && !self.aliases;
        match self.place_pages(st, seg, rounded, first) {
            Err(BackendError::OutOfMemory { .. }) if !first => {
                self.place_pages(st, seg, rounded, true)
            }
            other => other,
        }
    }

    /// Maps the pages the best target for `rounded` bytes needs, moving those of free gaps
    /// first when `move_pages`. On an error the target has got nothing (gaps already moved
    /// stay holes, which is consistent).
    fn place_pages(
        &self,
        st: &mut State,
        seg: u32,
        rounded: usize,
        move_pages: bool,
    ) -> Result<u32, BackendError> {
        let Some(t) = self.stitch_target(st, seg, rounded) else {
            let s = st.segment(seg);
            return Err(BackendError::OutOfMemory {
                requested: rounded,
                free: s.address_space - s.extent,
            });
        };
        let steal = if move_pages { t.pages } else { 0 };
        let sources = self.stitch_sources(st, steal, [t.left, t.right], None);
        for r in &sources {
            self.evict_stitched(st, r.seg, r.p0, r.p1)?;
        }
        let moved: usize = sources.iter().map(|r| r.p1 - r.p0).sum();
        if moved < t.pages {
            self.map_run(st, seg, t.page + moved, t.page + t.pages)?;
        }
        let mut at = t.page;
        for r in sources {
            if let Err(e) = self.remap_run(st, (r.seg, r.p0, r.p1), (seg, at)) {
                // Give back what the target got so far; the moved gaps stay holes.
                let _ = self.unmap_run(st, seg, t.page, at);
                if moved < t.pages {
                    let _ = self.unmap_run(st, seg, t.page + moved, t.page + t.pages);
                }
                return Err(e);
            }
            self.carve_hole(st, r.block, r.p0, r.p1);
            at += r.p1 - r.p0;
        }
        if t.pages == 0 {
            st.pool_remove(t.left);
            return Ok(t.left);
        }
        let bytes = t.pages * self.page;
        let (pool, stream) = (st.segment(seg).pool, st.segment(seg).stream);
        let filled = if t.hole == NONE {
            let s = st.segment(seg);
            let (addr, tail) = (s.base + s.extent as u64, s.tail);
            st.segment_mut(seg).extent += bytes;
            let mut b = Block::free(addr, bytes, seg, tail, pool, stream, st.clock);
            b.state = BlockState::Unmapped;
            // A free last block counts as split once something follows it.
            let before = st.contribution(tail);
            let id = self.link_after(st, seg, tail, b);
            before.apply_change(st.contribution(tail), &mut st.stats, pool);
            id
        } else if bytes < st.blocks[t.hole as usize].size {
            let h = &mut st.blocks[t.hole as usize];
            let (addr, prev) = (h.addr, h.prev);
            h.addr += bytes as u64;
            h.size -= bytes;
            let mut b = Block::free(addr, bytes, seg, prev, pool, stream, st.clock);
            b.state = BlockState::Unmapped;
            self.link_after(st, seg, prev, b)
        } else {
            t.hole
        };
        // The new pages count as a hole (nothing) until `free_block` makes them free, joins
        // them to free neighbours and puts the result in the pool.
        st.free_block(filled);
        st.pool_remove(filled);
        Ok(filled)
    }

    /// Links `block` into segment `seg` after block `after` (`NONE`: first); returns its id.
    pub(crate) fn link_after(&self, st: &mut State, seg: u32, after: u32, mut block: Block) -> u32 {
        let next = if after == NONE {
            st.segment(seg).head
        } else {
            st.blocks[after as usize].next
        };
        block.prev = after;
        block.next = next;
        let id = st.new_block(block);
        if after == NONE {
            st.segment_mut(seg).head = id;
        } else {
            st.blocks[after as usize].next = id;
        }
        if next == NONE {
            st.segment_mut(seg).tail = id;
        } else {
            st.blocks[next as usize].prev = id;
        }
        id
    }

    /// Takes block `id` out of its segment's list (its slot dies).
    fn unlink(&self, st: &mut State, id: u32) {
        let b = st.blocks[id as usize];
        if b.prev == NONE {
            st.segment_mut(b.segment).head = b.next;
        } else {
            st.blocks[b.prev as usize].next = b.next;
        }
        if b.next == NONE {
            st.segment_mut(b.segment).tail = b.prev;
        } else {
            st.blocks[b.next as usize].prev = b.prev;
        }
        st.kill_block(id);
    }

    /// Turns pages `[q0, q1)` of free block `id` (in its pool), just unmapped, into a hole:
    /// the parts of the block before and after stay free, the hole joins neighbouring holes,
    /// and a hole at the end of the segment is cut off.
    pub(crate) fn carve_hole(&self, st: &mut State, id: u32, q0: usize, q1: usize) {
        let hole = self.carve_pages(st, id, q0, q1, BlockState::Unmapped);
        self.merge_holes(st, hole);
    }

    /// Cuts pages `[q0, q1)` of free block `id` (in its pool) out as a block of `state` (in no
    /// pool; `Unmapped` or `Lent`), keeping the parts before and after free and pooled;
    /// returns the cut block.
    pub(crate) fn carve_pages(
        &self,
        st: &mut State,
        id: u32,
        q0: usize,
        q1: usize,
        state: BlockState,
    ) -> u32 {
        let b = st.blocks[id as usize];
        let seg = b.segment;
        let base = st.segment(seg).base;
        let (h0, h1) = (
            base + (q0 * self.page) as u64,
            base + (q1 * self.page) as u64,
        );
        let end = b.addr + b.size as u64;
        st.pool_remove(id);
        let before = st.contribution(id);
        let hole_block = |addr: u64, size: usize| Block {
            state,
            ..Block::free(addr, size, seg, NONE, b.pool, b.stream, b.freed_at)
        };
        let (left, hole) = if b.addr == h0 {
            let x = &mut st.blocks[id as usize];
            x.state = state;
            x.size = (h1 - h0) as usize;
            (NONE, id)
        } else {
            st.blocks[id as usize].size = (h0 - b.addr) as usize;
            let hole = self.link_after(st, seg, id, hole_block(h0, (h1 - h0) as usize));
            (id, hole)
        };
        let right = if h1 < end {
            let r = Block::free(
                h1,
                (end - h1) as usize,
                seg,
                NONE,
                b.pool,
                b.stream,
                b.freed_at,
            );
            self.link_after(st, seg, hole, r)
        } else {
            NONE
        };
        let after = st.contribution(left) + st.contribution(right);
        before.apply_change(after, &mut st.stats, b.pool);
        for piece in [left, right] {
            if piece != NONE {
                st.pool_insert(piece);
            }
        }
        hole
    }

    /// Joins hole `hole` to neighbouring holes; cuts the extent back past a hole at the end.
    fn merge_holes(&self, st: &mut State, mut hole: u32) {
        let prev = st.blocks[hole as usize].prev;
        if Self::is_state(st, prev, BlockState::Unmapped) {
            st.blocks[prev as usize].size += st.blocks[hole as usize].size;
            self.unlink(st, hole);
            hole = prev;
        }
        let next = st.blocks[hole as usize].next;
        if Self::is_state(st, next, BlockState::Unmapped) {
            st.blocks[hole as usize].size += st.blocks[next as usize].size;
            self.unlink(st, next);
        }
        let h = st.blocks[hole as usize];
        if h.next != NONE {
            return;
        }
        let before = st.contribution(h.prev);
        let s = st.segment_mut(h.segment);
        s.extent -= h.size;
        s.holes -= h.size / self.page;
        self.unlink(st, hole);
        let after = st.contribution(h.prev);
        before.apply_change(after, &mut st.stats, h.pool);
    }

    /// The stitching invariants for block `b` of expandable segment `s`; a violation's text.
    pub(crate) fn check_stitch_block(&self, st: &State, s: &Segment, b: &Block) -> Option<String> {
        if b.state != BlockState::Unmapped {
            return (!self.fully_mapped(s, b)).then(|| "not fully mapped".to_string());
        }
        let page = self.page as u64;
        let (p0, p1) = (
            ((b.addr - s.base) / page) as usize,
            ((b.addr - s.base) / page) as usize + b.size / self.page,
        );
        if !(b.addr - s.base).is_multiple_of(page) || !(b.size as u64).is_multiple_of(page) {
            return Some("hole not page-aligned".into());
        }
        if s.pages.count_in(p0, p1) != 0 {
            return Some("hole has mapped pages".into());
        }
        if b.next == NONE || Self::is_state(st, b.next, BlockState::Unmapped) {
            return Some("hole at the end or next to another hole".into());
        }
        None
    }
}
