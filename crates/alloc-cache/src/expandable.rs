//! Expandable segments: one address-space reservation per (stream, pool), backed page by page.
//!
//! A segment's blocks cover `[base, base + extent)`. Pages are mapped, moved and unmapped by
//! the primitives here (each one backend call, counted in `num_device_alloc`/`num_device_free`
//! and `reserved_bytes`, so the reserved bytes are always the mapped bytes). Where pages go is
//! decided in `stitch.rs`, which states the block invariants: every page overlapping a block
//! that is not `Unmapped` is mapped, so a free block is always backed and the hit path never
//! maps. A miss stitches (moves the pages of free gaps to where the request needs them, maps
//! new ones only for the rest); releasing cached memory unmaps every page lying wholly inside a
//! free block, wherever it is, turning it into an `Unmapped` block (a *hole*), and cuts the
//! extent back past a hole at the end. Pages shared by a free block and a neighbour in use are
//! never unmapped.
//!
//! Mapped pages are kept as runs ([`PageRuns`](crate::page_runs::PageRuns)), never one bit per
//! page of the reserved address space: a device whose capacity is 2^62 bytes costs nothing until
//! its pages are used, and mapping a huge request is one run, not millions of bits.

use crate::allocator::CachingAllocator;
use crate::backend::BackendError;
use crate::block::{pool_index, Block, BlockState, Segment, State, NONE};
use crate::error::Result;
use crate::history::MemoryEventKind;
use crate::page_runs::PageRuns;
use crate::stats::PoolKind;

/// How many times the device's capacity an expandable segment reserves as address space, so
/// that holes left by stitching never run a segment out of addresses before memory runs out.
const ADDRESS_SPACE_FACTOR: usize = 2;
/// No headroom past this much address space (128 TiB; simulated devices claim up to 2^64).
const ADDRESS_SPACE_HEADROOM_LIMIT: usize = 1 << 47;

impl Segment {
    fn set_pages(&mut self, p0: usize, p1: usize, mapped: bool) {
        if mapped {
            self.pages.insert(p0, p1);
        } else {
            self.pages.remove(p0, p1);
        }
    }

    /// Counts pages `[p0, p1)` as mapped (or not), keeping `mapped` and `holes` in step.
    fn account(&mut self, p0: usize, p1: usize, mapped: bool, page: usize) {
        let below_extent = p1.min(self.extent / page).saturating_sub(p0);
        self.set_pages(p0, p1, mapped);
        if mapped {
            self.mapped += (p1 - p0) * page;
            self.holes -= below_extent;
        } else {
            self.mapped -= (p1 - p0) * page;
            self.holes += below_extent;
        }
    }
}

impl CachingAllocator {
    /// Address space of a new expandable segment (or of the stitched blocks' alias space): the
    /// capacity with headroom, in whole pages (rounded down where up would overflow).
    pub(crate) fn address_space_bytes(&self) -> usize {
        let capacity = self.backend.capacity();
        let wanted = capacity
            .saturating_mul(ADDRESS_SPACE_FACTOR)
            .min(capacity.max(ADDRESS_SPACE_HEADROOM_LIMIT));
        wanted
            .checked_next_multiple_of(self.page)
            .unwrap_or(wanted / self.page * self.page)
    }

    fn page_addr(&self, s: &Segment, p: usize) -> u64 {
        s.base + (p * self.page) as u64
    }

    /// Counts `bytes` as mapped (or unmapped) in segment `seg` in the statistics and history.
    fn note_mapping(&self, st: &mut State, seg: u32, addr: u64, bytes: usize, mapped: bool) {
        let (pool, si) = (st.segment(seg).pool, st.segment(seg).stream);
        let (kind, delta) = if mapped {
            st.stats.num_device_alloc += 1;
            (MemoryEventKind::SegmentAlloc, bytes as i64)
        } else {
            st.stats.num_device_free += 1;
            (MemoryEventKind::SegmentFree, -(bytes as i64))
        };
        st.stats.reserved_bytes.update(pool, delta);
        if st.history.is_some() {
            st.history_segment(kind, addr, bytes, si);
        }
    }

    /// Maps new memory at pages `[p0, p1)` (all unmapped) of segment `seg`: one backend call.
    pub(crate) fn map_run(
        &self,
        st: &mut State,
        seg: u32,
        p0: usize,
        p1: usize,
    ) -> Result<(), BackendError> {
        let addr = self.page_addr(st.segment(seg), p0);
        let bytes = (p1 - p0) * self.page;
        self.backend.map(addr, bytes)?;
        st.segment_mut(seg).account(p0, p1, true, self.page);
        self.note_mapping(st, seg, addr, bytes, true);
        Ok(())
    }

    /// Unmaps pages `[p0, p1)` (all mapped, none used by a block in use) of segment `seg`.
    pub(crate) fn unmap_run(
        &self,
        st: &mut State,
        seg: u32,
        p0: usize,
        p1: usize,
    ) -> Result<(), BackendError> {
        let addr = self.page_addr(st.segment(seg), p0);
        let bytes = (p1 - p0) * self.page;
        // SAFETY: callers pass only pages lying wholly inside free blocks (or pages they have
        // just mapped for a block not handed out yet).
        unsafe { self.backend.unmap(addr, bytes)? };
        st.segment_mut(seg).account(p0, p1, false, self.page);
        self.note_mapping(st, seg, addr, bytes, false);
        Ok(())
    }

    /// Moves the memory of pages `[p0, p1)` of segment `from` (mapped, wholly inside a free
    /// block) to the pages starting at `to_p0` of segment `to` (unmapped): one backend call.
    pub(crate) fn remap_run(
        &self,
        st: &mut State,
        (from, p0, p1): (u32, usize, usize),
        (to, to_p0): (u32, usize),
    ) -> Result<(), BackendError> {
        let n = p1 - p0;
        let src = self.page_addr(st.segment(from), p0);
        let dst = self.page_addr(st.segment(to), to_p0);
        // SAFETY: the source pages lie wholly inside a free block: nothing uses them.
        unsafe { self.backend.remap(src, dst, n * self.page)? };
        st.segment_mut(from).account(p0, p1, false, self.page);
        st.segment_mut(to)
            .account(to_p0, to_p0 + n, true, self.page);
        self.note_mapping(st, from, src, n * self.page, false);
        self.note_mapping(st, to, dst, n * self.page, true);
        Ok(())
    }

    /// Returns a free block (out of its pool) holding `rounded` bytes at its start in stream
    /// `si`'s expandable segment for `pool`, creating the segment on first use; the pages come
    /// from stitching (`stitch.rs`).
    pub(crate) fn grow_expandable(
        &self,
        st: &mut State,
        si: u16,
        pool: PoolKind,
        rounded: usize,
    ) -> Result<u32, BackendError> {
        let mut seg = st.streams[si as usize].expandable[pool_index(pool)];
        if seg == NONE {
            let address_space = self.address_space_bytes();
            let base = self.backend.reserve_address_space(address_space)?;
            let segment = Segment {
                base,
                mapped: 0,
                extent: 0,
                address_space,
                pages: PageRuns::default(),
                holes: 0,
                pool,
                stream: si,
                head: NONE,
                tail: NONE,
            };
            seg = st.new_segment(segment);
            st.streams[si as usize].expandable[pool_index(pool)] = seg;
            st.stats.segment.update(pool, 1);
        }
        self.stitch(st, seg, rounded)
    }

    /// Whether every page overlapping block `b` of segment `s` is mapped.
    pub(crate) fn fully_mapped(&self, s: &Segment, b: &Block) -> bool {
        if !s.expandable() || s.holes == 0 {
            return true;
        }
        let page = self.page as u64;
        let p0 = ((b.addr - s.base) / page) as usize;
        let p1 = (b.addr + b.size as u64 - s.base).div_ceil(page) as usize;
        s.pages.covers(p0, p1)
    }

    /// Page range `[p0, p1)` lying wholly inside block `b` of segment `s`.
    pub(crate) fn interior_pages(&self, s: &Segment, b: &Block) -> (usize, usize) {
        let page = self.page as u64;
        let p0 = (b.addr - s.base).div_ceil(page) as usize;
        let p1 = ((b.addr + b.size as u64 - s.base) / page) as usize;
        (p0, p1.max(p0))
    }

    /// Bytes `release_expandable` would give back.
    pub(crate) fn expandable_releasable(&self, st: &State, seg: u32) -> usize {
        let s = st.segment(seg);
        let mut bytes = 0;
        let mut id = s.head;
        while id != NONE {
            let b = &st.blocks[id as usize];
            if b.state == BlockState::Free {
                let (p0, p1) = self.interior_pages(s, b);
                bytes += s.pages.count_in(p0, p1) * self.page;
            }
            id = b.next;
        }
        bytes
    }

    /// Unmaps every page inside a free block (each becomes a hole; a hole at the end is cut
    /// off), and gives the address space back once no block is left.
    pub(crate) fn release_expandable(&self, st: &mut State, seg: u32) -> Result<usize> {
        let mut free = Vec::new();
        let mut id = st.segment(seg).head;
        while id != NONE {
            let b = &st.blocks[id as usize];
            if b.state == BlockState::Free {
                free.push(id);
            }
            id = b.next;
        }
        let mut released = 0;
        // Carving a block kills only holes and the block itself, never another free block.
        for id in free {
            let (p0, p1) = self.interior_pages(st.segment(seg), &st.blocks[id as usize]);
            if p0 < p1 {
                self.evict_stitched(st, seg, p0, p1)?;
                self.unmap_run(st, seg, p0, p1)?;
                self.carve_hole(st, id, p0, p1);
                released += (p1 - p0) * self.page;
            }
        }
        let s = st.segment(seg).clone();
        if s.head == NONE {
            // SAFETY: no block is left, so nothing is mapped in the reservation.
            unsafe {
                self.backend
                    .release_address_space(s.base, s.address_space)?
            };
            st.stats.segment.update(s.pool, -1);
            st.streams[s.stream as usize].expandable[pool_index(s.pool)] = NONE;
            st.segments[seg as usize] = None;
            st.free_segment_slots.push(seg);
        }
        Ok(released)
    }

    /// Unmaps everything and releases the reservation (allocator teardown).
    pub(crate) fn drop_expandable(&self, s: &Segment) {
        for (a, b) in s.pages.runs(0, s.address_space / self.page, true) {
            let addr = s.base + (a * self.page) as u64;
            // SAFETY: teardown; nothing can reach these pages any more.
            let _ = unsafe { self.backend.unmap(addr, (b - a) * self.page) };
        }
        // SAFETY: as above, and every page is unmapped now.
        let _ = unsafe { self.backend.release_address_space(s.base, s.address_space) };
    }
}
