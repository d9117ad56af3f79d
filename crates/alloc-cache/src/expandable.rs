//! Expandable segments: one address-space reservation per (stream, pool), backed page by page.
//!
//! A segment's blocks cover `[base, base + extent)`; `extent` grows by mapping pages at the end
//! (a free last block is grown in place). Releasing cached memory unmaps every page that lies
//! wholly inside a free block, wherever it is, leaving a *hole*: the block stays where it is
//! (so no coalescing or statistics change) and its pages are mapped again when it is handed
//! out. A per-segment hole count keeps the hit path to one comparison while there are none.
//! Pages shared by a free block and an allocated neighbour are never unmapped.
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

impl Segment {
    fn set_pages(&mut self, p0: usize, p1: usize, mapped: bool) {
        if mapped {
            self.pages.insert(p0, p1);
        } else {
            self.pages.remove(p0, p1);
        }
    }

    /// Maximal runs of pages in `[p0, p1)` whose mapped state is `mapped`.
    fn runs(&self, p0: usize, p1: usize, mapped: bool) -> Vec<(usize, usize)> {
        self.pages.runs(p0, p1, mapped)
    }
}

impl CachingAllocator {
    /// Maps every unmapped page of `[p0, p1)` in segment `seg`.
    fn map_pages(
        &self,
        st: &mut State,
        seg: u32,
        p0: usize,
        p1: usize,
    ) -> Result<(), BackendError> {
        let runs = st.segment(seg).runs(p0, p1, false);
        for (a, b) in runs {
            let s = st.segment(seg);
            let (addr, bytes) = (s.base + (a * self.page) as u64, (b - a) * self.page);
            let below_extent = b.min(s.extent / self.page).saturating_sub(a);
            self.backend.map(addr, bytes)?;
            let pool = s.pool;
            let s = st.segment_mut(seg);
            s.set_pages(a, b, true);
            s.mapped += bytes;
            s.holes -= below_extent;
            let si = s.stream;
            st.stats.num_device_alloc += 1;
            st.stats.reserved_bytes.update(pool, bytes as i64);
            if st.history.is_some() {
                st.history_segment(MemoryEventKind::SegmentAlloc, addr, bytes, si);
            }
        }
        Ok(())
    }

    /// Unmaps every mapped page of `[p0, p1)` (all below `extent`); returns the bytes released.
    fn unmap_pages(&self, st: &mut State, seg: u32, p0: usize, p1: usize) -> Result<usize> {
        let mut released = 0;
        for (a, b) in st.segment(seg).runs(p0, p1, true) {
            let s = st.segment(seg);
            let (addr, bytes, pool) =
                (s.base + (a * self.page) as u64, (b - a) * self.page, s.pool);
            // SAFETY: callers pass only pages lying wholly inside free blocks.
            unsafe { self.backend.unmap(addr, bytes)? };
            let s = st.segment_mut(seg);
            s.set_pages(a, b, false);
            s.mapped -= bytes;
            s.holes += b - a;
            let si = s.stream;
            st.stats.num_device_free += 1;
            st.stats.reserved_bytes.update(pool, -(bytes as i64));
            if st.history.is_some() {
                st.history_segment(MemoryEventKind::SegmentFree, addr, bytes, si);
            }
            released += bytes;
        }
        Ok(released)
    }

    /// Makes sure the first `rounded` bytes of free block `id` (out of its pool) are backed. On
    /// a backend out-of-memory the block goes back to its pool and `Ok(false)` is returned.
    #[inline]
    pub(crate) fn back_pages(&self, st: &mut State, id: u32, rounded: usize) -> Result<bool> {
        if !self.config.expandable_segments {
            return Ok(true);
        }
        let b = &st.blocks[id as usize];
        let seg = b.segment;
        let s = st.segment(seg);
        if s.holes == 0 {
            return Ok(true);
        }
        let page = self.page as u64;
        let p0 = ((b.addr - s.base) / page) as usize;
        let p1 = (b.addr + rounded as u64 - s.base).div_ceil(page) as usize;
        match self.map_pages(st, seg, p0, p1) {
            Ok(()) => Ok(true),
            Err(e) => {
                st.pool_insert(id);
                match e {
                    BackendError::OutOfMemory { .. } => Ok(false),
                    other => Err(other.into()),
                }
            }
        }
    }

    /// Maps pages at the end of stream `si`'s expandable segment for `pool` until its last block
    /// is free and holds `rounded` bytes; returns that block (out of its pool; holes inside it
    /// are left to [`back_pages`](Self::back_pages)).
    pub(crate) fn grow_expandable(
        &self,
        st: &mut State,
        si: u16,
        pool: PoolKind,
        rounded: usize,
    ) -> Result<u32, BackendError> {
        let mut seg = st.streams[si as usize].expandable[pool_index(pool)];
        if seg == NONE {
            // The capacity rounded up to whole pages (down where that would overflow usize).
            let capacity = self.backend.capacity();
            let address_space = capacity
                .div_ceil(self.page)
                .checked_mul(self.page)
                .unwrap_or(capacity / self.page * self.page);
            let base = self.backend.reserve_address_space(address_space)?;
            let pages = PageRuns::default();
            let segment = Segment {
                base,
                mapped: 0,
                extent: 0,
                address_space,
                pages,
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
        let (base, extent, address_space, tail) = {
            let s = st.segment(seg);
            (s.base, s.extent, s.address_space, s.tail)
        };
        let tail_free = tail != NONE && st.blocks[tail as usize].state == BlockState::Free;
        let have = if tail_free {
            st.blocks[tail as usize].size
        } else {
            0
        };
        let short = rounded.saturating_sub(have);
        let Some(need) = short.div_ceil(self.page).checked_mul(self.page) else {
            return Err(BackendError::OutOfMemory {
                requested: short,
                free: address_space - extent,
            });
        };
        if extent
            .checked_add(need)
            .is_none_or(|end| end > address_space)
        {
            return Err(BackendError::OutOfMemory {
                requested: need,
                free: address_space - extent,
            });
        }
        self.map_pages(st, seg, extent / self.page, (extent + need) / self.page)?;
        st.segment_mut(seg).extent += need;
        if tail_free {
            st.pool_remove(tail);
            let before = st.contribution(tail);
            st.blocks[tail as usize].size += need;
            let after = st.contribution(tail);
            before.apply_change(after, &mut st.stats, pool);
            return Ok(tail);
        }
        let before = st.contribution(tail);
        let id = st.new_block(Block::free(
            base + extent as u64,
            need,
            seg,
            tail,
            pool,
            si,
            st.clock,
        ));
        if tail == NONE {
            st.segment_mut(seg).head = id;
        } else {
            st.blocks[tail as usize].next = id;
        }
        st.segment_mut(seg).tail = id;
        let after = st.contribution(tail) + st.contribution(id);
        before.apply_change(after, &mut st.stats, pool);
        Ok(id)
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
    fn interior_pages(&self, s: &Segment, b: &Block) -> (usize, usize) {
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

    /// Unmaps every page inside a free block, shrinks the segment past a free last block, and
    /// gives the address space back once no block is left.
    pub(crate) fn release_expandable(&self, st: &mut State, seg: u32) -> Result<usize> {
        let mut released = 0;
        let mut id = st.segment(seg).head;
        while id != NONE {
            let b = st.blocks[id as usize].clone();
            if b.state == BlockState::Free {
                let (p0, p1) = self.interior_pages(st.segment(seg), &b);
                released += self.unmap_pages(st, seg, p0, p1)?;
            }
            id = b.next;
        }
        let s = st.segment(seg).clone();
        if s.tail != NONE && st.blocks[s.tail as usize].state == BlockState::Free {
            let t = st.blocks[s.tail as usize].clone();
            let page = self.page as u64;
            let new_extent = ((t.addr - s.base).div_ceil(page) * page) as usize;
            if new_extent < s.extent {
                // Every page in [new_extent, extent) lies inside the tail and is unmapped now.
                let cut = s.extent - new_extent;
                st.pool_remove(s.tail);
                let before = st.contribution(s.tail) + st.contribution(t.prev);
                let seg_mut = st.segment_mut(seg);
                seg_mut.extent = new_extent;
                seg_mut.holes -= cut / self.page;
                if t.size == cut {
                    if t.prev == NONE {
                        seg_mut.head = NONE;
                    } else {
                        st.blocks[t.prev as usize].next = NONE;
                    }
                    st.segment_mut(seg).tail = t.prev;
                    st.kill_block(s.tail);
                } else {
                    st.blocks[s.tail as usize].size -= cut;
                    st.pool_insert(s.tail);
                }
                let after = st.contribution(s.tail) + st.contribution(t.prev);
                before.apply_change(after, &mut st.stats, s.pool);
            }
        }
        if st.segment(seg).head == NONE {
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
        for (a, b) in s.runs(0, s.extent / self.page, true) {
            let addr = s.base + (a * self.page) as u64;
            // SAFETY: teardown; nothing can reach these pages any more.
            let _ = unsafe { self.backend.unmap(addr, (b - a) * self.page) };
        }
        // SAFETY: as above, and every page is unmapped now.
        let _ = unsafe { self.backend.release_address_space(s.base, s.address_space) };
    }
}
