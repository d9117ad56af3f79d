//! The slow paths of the allocator: getting memory from the backend on a miss (fixed or
//! expandable segments), the out-of-memory fallbacks, garbage collection, and giving cached
//! memory back (`empty_cache`, `trim_to`).

use crate::allocator::{segment_size_for, CachingAllocator};
use crate::backend::BackendError;
use crate::block::{Block, BlockState, Segment, State, NONE};
use crate::error::{Error, OomReport, Result};
use crate::history::MemoryEventKind;
use crate::sizes::{
    GROWTH_DIVISOR, LARGE_SEGMENT, MIN_LARGE_ALLOC, PAIR_ROUNDING_WASTE, ROUND_LARGE,
};
use crate::stats::PoolKind;

/// Size of a new fixed segment for a large-pool request of `rounded` bytes under
/// [`MIN_LARGE_ALLOC`], when the large pool caches `cached_free` bytes it could not use:
/// - with at least half a [`LARGE_SEGMENT`] cached, the miss is one of fragmentation (the space
///   exists, in pieces), and padding would add memory that sits unused at the peak: the request
///   rounded up to [`ROUND_LARGE`];
/// - otherwise the whole number of copies of the request (up to a [`LARGE_SEGMENT`]) whose
///   segment, rounded up to [`ROUND_LARGE`], wastes the smallest fraction on its tail, the most
///   copies on a tie (9 MiB: 18 MiB, not 20 MiB with a 2 MiB tail no 9 MiB tensor can use).
///
/// On the recorded traces the two rules took the worst default-mode reserved/live from 1.230 to
/// 1.151 (each alone: 1.187 and 1.215; see the design note in `allocator.rs`).
pub(crate) fn mid_segment_size(rounded: usize, cached_free: usize) -> usize {
    let exact = rounded.div_ceil(ROUND_LARGE) * ROUND_LARGE;
    if 2 * cached_free >= LARGE_SEGMENT || rounded >= LARGE_SEGMENT {
        return exact;
    }
    let (mut best, mut best_waste) = (exact, exact - rounded);
    for copies in 2..=LARGE_SEGMENT / rounded {
        let size = (copies * rounded).div_ceil(ROUND_LARGE) * ROUND_LARGE;
        if size > LARGE_SEGMENT {
            break;
        }
        let waste = size - copies * rounded;
        // waste / size <= best_waste / best, in integers.
        if waste * best <= best_waste * size {
            (best, best_waste) = (size, waste);
        }
    }
    best
}

/// Which cached segments to release first, and when to stop.
#[derive(Debug, Clone, Copy)]
enum Release {
    /// Everything releasable.
    All,
    /// Oldest free memory first until reserved bytes are at most the target.
    OldestFirst(usize),
    /// Largest releasable amounts first until reserved bytes are at most the target.
    LargestFirst(usize),
}

fn is_oom(e: &BackendError) -> bool {
    matches!(e, BackendError::OutOfMemory { .. })
}

impl CachingAllocator {
    /// Called when the pool has no fitting block: returns a free block (out of its pool) of at
    /// least `rounded` bytes on stream `si`, or the out-of-memory error.
    pub(crate) fn allocate_miss(
        &self,
        st: &mut State,
        si: u16,
        pool: PoolKind,
        rounded: usize,
        requested: usize,
        report_oom: bool,
    ) -> Result<u32> {
        if let Some(threshold) = self.config.garbage_collection_threshold {
            let limit = (threshold * self.backend.capacity() as f64) as usize;
            let needed = if self.config.expandable_segments {
                rounded
            } else {
                segment_size_for(rounded)
            };
            if st.stats.reserved_bytes.all.current as usize + needed > limit {
                self.release_cached(st, Release::OldestFirst(limit.saturating_sub(needed)))?;
            }
        }
        if let Some(id) = self.defragment(st, si, pool, rounded)? {
            return Ok(id);
        }
        if let Some(id) = self.grow_backed(st, si, pool, rounded)? {
            return Ok(id);
        }
        if let Some(id) = self.find_any_fit(st, si, rounded)? {
            return Ok(id);
        }
        // A plan holding bins gives them back first, dissolved around its live blocks (no
        // backend call).
        let yielded = st.dissolve_plan();
        if self.release_cached(st, Release::All)? > 0 || yielded {
            st.stats.num_alloc_retries += 1;
            if let Some(id) = self.find_fit(st, si, pool, rounded) {
                return Ok(id);
            }
            if let Some(id) = self.grow_backed(st, si, pool, rounded)? {
                return Ok(id);
            }
            if let Some(id) = self.find_any_fit(st, si, rounded)? {
                return Ok(id);
            }
        }
        if report_oom {
            st.stats.num_ooms += 1;
            if st.history.is_some() {
                st.history_oom(requested, si);
            }
        }
        Err(Error::OutOfMemory(Box::new(
            self.oom_report(st, si, pool, rounded, requested),
        )))
    }

    /// Defragmentation on a miss (fixed segments, large pool): when the wholly free large
    /// segments of stream `si` together hold at least the request, they are all released and
    /// one segment of their total size is reserved in their place, so reserved memory does not
    /// grow and the cached bytes become one contiguous block. Returns that block (out of its
    /// pool), or `None` when there is not enough wholly free memory or the backend refuses.
    fn defragment(
        &self,
        st: &mut State,
        si: u16,
        pool: PoolKind,
        rounded: usize,
    ) -> Result<Option<u32>> {
        if self.config.expandable_segments || pool != PoolKind::Large {
            return Ok(None);
        }
        let need = rounded.div_ceil(ROUND_LARGE) * ROUND_LARGE;
        let mut free_segments = Vec::new();
        let mut total = 0;
        for (i, s) in st.segments.iter().enumerate() {
            let Some(s) = s else { continue };
            let wholly_free =
                s.head == s.tail && st.blocks[s.head as usize].state == BlockState::Free;
            if wholly_free && !s.expandable() && s.pool == pool && s.stream == si {
                free_segments.push(i as u32);
                total += s.mapped;
            }
        }
        // Below the request nothing is gained; and a merged block that `max_split_size` would
        // forbid splitting must not be made for a smaller request.
        if total < need || (rounded < self.max_split && total >= self.max_split) {
            return Ok(None);
        }
        for seg in free_segments {
            self.release_segment(st, seg)?;
        }
        for size in [total, need] {
            match self.reserve_fixed(st, si, pool, size) {
                Ok(id) => return Ok(Some(id)),
                Err(e) if is_oom(&e) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Ok(None)
    }

    /// New memory from the backend with its pages backed; `None` when the backend is full.
    fn grow_backed(
        &self,
        st: &mut State,
        si: u16,
        pool: PoolKind,
        rounded: usize,
    ) -> Result<Option<u32>> {
        match self.grow(st, si, pool, rounded) {
            Ok(id) => Ok(Some(id)),
            Err(e) if is_oom(&e) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// The smallest free block of stream `si` in either pool with at least `rounded` bytes,
    /// ignoring pool boundaries and `max_split_size` (the last resort before releasing memory).
    fn find_any_fit(&self, st: &mut State, si: u16, rounded: usize) -> Result<Option<u32>> {
        let State {
            streams, blocks, ..
        } = st;
        let pools = &mut streams[si as usize].free;
        let Some((p, id)) = (0..2)
            .filter_map(|p| pools[p].best_fit(blocks, rounded).map(|id| (p, id)))
            .min_by_key(|&(_, id)| blocks[id as usize].size)
        else {
            return Ok(None);
        };
        pools[p].remove(blocks, id);
        Ok(Some(id))
    }

    /// Gets new memory from the backend for a request of `rounded` bytes.
    fn grow(
        &self,
        st: &mut State,
        si: u16,
        pool: PoolKind,
        rounded: usize,
    ) -> Result<u32, BackendError> {
        if self.config.expandable_segments {
            return self.grow_expandable(st, si, pool, rounded);
        }
        let padded = self.fixed_segment_size(st, pool, rounded);
        // Devices hand out whole 2 MiB pages anyway, so the fallback is rounded to them.
        let exact = rounded.div_ceil(ROUND_LARGE) * ROUND_LARGE;
        match self.reserve_fixed(st, si, pool, padded) {
            Err(e) if is_oom(&e) && padded > exact => self.reserve_fixed(st, si, pool, exact),
            other => other,
        }
    }

    /// Size of a new fixed segment for a request of `rounded` bytes: [`segment_size_for`] for the
    /// small pool, [`mid_segment_size`] for large requests under [`MIN_LARGE_ALLOC`], and for
    /// requests of at least [`MIN_LARGE_ALLOC`] the largest whole number of such requests
    /// that fits in `1 / GROWTH_DIVISOR` of the large pool's reserved bytes (two when rounding
    /// one would waste more than `1 / PAIR_ROUNDING_WASTE` of it), when that is more and
    /// `max_split_size` does not forbid splitting it. Kernel scratch beside a planned step's
    /// bins gets no padding, the request rounded up to [`ROUND_LARGE`]: more scratch borrows the
    /// bins (`plan_lend.rs`; padded copies took ResNet-18's planned real run from 1.045 to 1.136).
    pub(crate) fn fixed_segment_size(&self, st: &State, pool: PoolKind, rounded: usize) -> usize {
        if pool == PoolKind::Large && crate::plan_lend::serving_scratch(st) {
            return rounded.div_ceil(ROUND_LARGE) * ROUND_LARGE;
        }
        let base = segment_size_for(rounded);
        if pool == PoolKind::Large && rounded < MIN_LARGE_ALLOC {
            let stats = &st.stats;
            let cached =
                stats.reserved_bytes.large_pool.current - stats.allocated_bytes.large_pool.current;
            return mid_segment_size(rounded, cached.max(0) as usize);
        }
        if pool != PoolKind::Large || rounded < MIN_LARGE_ALLOC {
            return base;
        }
        let reserved = st.stats.reserved_bytes.large_pool.current as usize;
        let budget = reserved / GROWTH_DIVISOR;
        let mut copies = budget / rounded;
        // A request whose own segment would lose more than 1/32 of it to the 2 MiB rounding
        // gets room for two (the rounding is then paid once for both), while it is at most
        // 1/8 of the pool.
        if copies < 2 && (base - rounded) * PAIR_ROUNDING_WASTE > rounded && 2 * budget >= rounded {
            copies = 2;
        }
        let grown = (copies * rounded).div_ceil(ROUND_LARGE) * ROUND_LARGE;
        if grown > base && grown < self.max_split {
            grown
        } else {
            base
        }
    }

    /// A new fixed segment of exactly `size` bytes, as one free block (out of the pool).
    pub(crate) fn reserve_fixed(
        &self,
        st: &mut State,
        si: u16,
        pool: PoolKind,
        size: usize,
    ) -> Result<u32, BackendError> {
        let base = self.backend.reserve(size)?;
        st.stats.num_device_alloc += 1;
        st.stats.segment.update(pool, 1);
        st.stats.reserved_bytes.update(pool, size as i64);
        let segment = Segment {
            base,
            mapped: size,
            extent: size,
            address_space: 0,
            pages: crate::page_runs::PageRuns::default(),
            holes: 0,
            pool,
            stream: si,
            head: NONE,
            tail: NONE,
        };
        let seg = st.new_segment(segment);
        if st.history.is_some() {
            st.history_segment(MemoryEventKind::SegmentAlloc, base, size, si);
        }
        let id = st.new_block(Block::free(base, size, seg, NONE, pool, si, st.clock));
        let s = st.segment_mut(seg);
        s.head = id;
        s.tail = id;
        Ok(id)
    }

    /// Releases cached memory in `order`; returns the bytes given back to the backend.
    fn release_cached(&self, st: &mut State, order: Release) -> Result<usize> {
        // (segment, releasable bytes, freed_at of the free block)
        let mut candidates: Vec<(u32, usize, u64)> = Vec::new();
        for (i, s) in st.segments.iter().enumerate() {
            let Some(s) = s else { continue };
            if s.expandable() {
                let releasable = self.expandable_releasable(st, i as u32);
                if releasable > 0 || s.tail == NONE {
                    candidates.push((
                        i as u32,
                        releasable,
                        st.blocks.get(s.tail as usize).map_or(0, |t| t.freed_at),
                    ));
                }
                continue;
            }
            let t = &st.blocks[s.tail as usize];
            if t.state == BlockState::Free && s.head == s.tail {
                candidates.push((i as u32, s.mapped, t.freed_at));
            }
        }
        match order {
            Release::All => {}
            Release::OldestFirst(_) => candidates.sort_by_key(|&(i, _, age)| (age, i)),
            Release::LargestFirst(_) => {
                candidates.sort_by_key(|&(i, bytes, _)| (std::cmp::Reverse(bytes), i))
            }
        }
        let mut released = 0;
        for (seg, _, _) in candidates {
            if let Release::OldestFirst(target) | Release::LargestFirst(target) = order {
                if st.stats.reserved_bytes.all.current as usize <= target {
                    break;
                }
            }
            released += if st.segment(seg).expandable() {
                self.release_expandable(st, seg)?
            } else {
                self.release_segment(st, seg)?
            };
        }
        self.release_alias_space(st)?;
        Ok(released)
    }

    /// Gives a wholly free fixed segment back to the backend.
    fn release_segment(&self, st: &mut State, seg: u32) -> Result<usize> {
        let s = st.segment(seg).clone();
        // SAFETY: the segment came from `reserve` with this size and its only block is free, so
        // no caller holds any part of it.
        unsafe { self.backend.release(s.base, s.mapped)? };
        st.pool_remove(s.head);
        st.kill_block(s.head);
        st.stats.num_device_free += 1;
        st.stats.segment.update(s.pool, -1);
        st.stats.reserved_bytes.update(s.pool, -(s.mapped as i64));
        st.segments[seg as usize] = None;
        st.free_segment_slots.push(seg);
        if st.history.is_some() {
            st.history_segment(MemoryEventKind::SegmentFree, s.base, s.mapped, s.stream);
        }
        Ok(s.mapped)
    }

    /// Waits for every outstanding stream event and frees the blocks waiting on them.
    fn synchronize_pending(&self, st: &mut State) -> Result<()> {
        if st.pending.is_empty() {
            return Ok(());
        }
        st.stats.num_sync_all_streams += 1;
        for &(event, _) in &st.pending {
            self.backend.synchronize_event(event)?;
        }
        self.process_events(st)
    }

    /// Returns every cached free segment (and the free pages at the end of expandable segments)
    /// to the backend, after waiting for outstanding stream events. Returns the bytes released.
    /// A planned-steps plan is dropped first and its bins given back (dissolved around planned
    /// blocks still live): memory the plan keeps for the next step is cached memory too, and
    /// the loop is planned again once two steps in a row repeat.
    pub fn empty_cache(&self) -> Result<usize> {
        self.with_state(|st| {
            self.synchronize_pending(st)?;
            st.dissolve_plan();
            self.release_cached(st, Release::All)
        })
    }

    /// Releases cached memory, largest pieces first, until at most `max_reserved` bytes stay
    /// reserved (or nothing releasable is left); waits on stream events, and drops a
    /// planned-steps plan to give its bins back, only if that is needed. Returns the bytes
    /// released.
    pub fn trim_to(&self, max_reserved: usize) -> Result<usize> {
        self.with_state(|st| {
            let mut released = self.release_cached(st, Release::LargestFirst(max_reserved))?;
            if st.stats.reserved_bytes.all.current as usize > max_reserved && !st.pending.is_empty()
            {
                self.synchronize_pending(st)?;
                released += self.release_cached(st, Release::LargestFirst(max_reserved))?;
            }
            // Still above: the bins a planned-steps plan keeps are cached memory too.
            if st.stats.reserved_bytes.all.current as usize > max_reserved && st.dissolve_plan() {
                released += self.release_cached(st, Release::LargestFirst(max_reserved))?;
            }
            Ok(released)
        })
    }

    fn oom_report(
        &self,
        st: &State,
        si: u16,
        pool: PoolKind,
        rounded: usize,
        requested: usize,
    ) -> OomReport {
        let allocated = st.stats.allocated_bytes.all.current as usize;
        let reserved = st.stats.reserved_bytes.all.current as usize;
        let reserved_unallocated = reserved.saturating_sub(allocated);
        let largest_free_block = Self::largest_free(st);
        // A free block of an expandable segment may span unmapped pages, so it can exceed the
        // free mapped bytes; fragmentation is then reported as 0.
        let fragmentation = if reserved_unallocated == 0 {
            0.0
        } else {
            (1.0 - largest_free_block as f64 / reserved_unallocated as f64).max(0.0)
        };
        OomReport {
            backend: self.backend.name().to_string(),
            requested,
            rounded,
            stream: st.streams[si as usize].stream,
            pool,
            capacity: self.backend.capacity(),
            backend_free: self.backend.free_bytes(),
            allocated,
            reserved,
            reserved_unallocated,
            largest_free_block,
            fragmentation,
            expandable_segments: self.config.expandable_segments,
            expandable_supported: self.backend.page_size().is_some(),
            min_reservation: rounded
                .checked_next_multiple_of(crate::sizes::ROUND_LARGE)
                .unwrap_or(usize::MAX),
            // No expandable segment yet for this pool: the miss began by reserving one.
            address_space: match self.config.expandable_segments
                && st.streams[si as usize].expandable[crate::block::pool_index(pool)] == NONE
            {
                true => self.address_space_bytes(),
                false => 0,
            },
            top_live: st
                .history
                .as_ref()
                .map(|h| h.top_live(crate::oom_context::TOP_LIVE))
                .unwrap_or_default(),
            history_recorded: st.history.is_some(),
            plan: st.plan_prediction.as_deref().cloned(),
        }
    }
}

impl Drop for CachingAllocator {
    /// Gives every segment back to the backend. Live `Allocation`s keep the allocator alive, so
    /// only blocks leaked as `RawAllocation`s can still be in use here; their memory goes too.
    fn drop(&mut self) {
        let page = self.page;
        let st = self.state.get_mut();
        if st.history.take().is_some() {
            crate::context::recording_stopped();
        }
        let pending: Vec<_> = st.pending.drain(..).collect();
        let (aliases, alias_space) = st.take_aliases(page);
        let segments: Vec<_> = st.segments.drain(..).flatten().collect();
        for (event, _) in pending {
            self.backend.destroy_event(event);
        }
        // Aliases go before the memory they reach.
        for (addr, bytes) in aliases {
            // SAFETY: the allocator is going away; nothing reaches these addresses any more.
            let _ = unsafe { self.backend.unmap_alias(addr, bytes) };
        }
        if let Some((base, bytes)) = alias_space {
            // SAFETY: as above, and every alias in it is unmapped now.
            let _ = unsafe { self.backend.release_address_space(base, bytes) };
        }
        for s in segments {
            // SAFETY: the allocator is going away; no handle can reach these segments any more.
            unsafe {
                if s.expandable() {
                    self.drop_expandable(&s);
                } else {
                    let _ = self.backend.release(s.base, s.mapped);
                }
            }
        }
    }
}
