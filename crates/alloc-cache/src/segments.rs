//! The slow paths of the allocator: getting memory from the backend on a miss (fixed or
//! expandable segments), the out-of-memory fallbacks, garbage collection, and giving cached
//! memory back (`empty_cache`, `trim_to`).

use crate::allocator::{segment_size_for, CachingAllocator, ROUND_LARGE};
use crate::backend::BackendError;
use crate::block::{pool_index, Block, BlockState, Segment, State, NONE};
use crate::error::{Error, OomReport, Result};
use crate::stats::PoolKind;

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
        match self.grow(st, si, pool, rounded) {
            Ok(id) => return Ok(id),
            Err(e) if is_oom(&e) => {}
            Err(e) => return Err(e.into()),
        }
        if let Some(id) = Self::find_any_fit(st, si, rounded) {
            return Ok(id);
        }
        if self.release_cached(st, Release::All)? > 0 {
            st.stats.num_alloc_retries += 1;
            match self.grow(st, si, pool, rounded) {
                Ok(id) => return Ok(id),
                Err(e) if is_oom(&e) => {}
                Err(e) => return Err(e.into()),
            }
        }
        st.stats.num_ooms += 1;
        Err(Error::OutOfMemory(Box::new(
            self.oom_report(st, si, pool, rounded, requested),
        )))
    }

    /// The smallest free block of stream `si` in either pool with at least `rounded` bytes,
    /// ignoring pool boundaries and `max_split_size` (the last resort before releasing memory).
    fn find_any_fit(st: &mut State, si: u16, rounded: usize) -> Option<u32> {
        let State {
            streams, blocks, ..
        } = st;
        let pools = &mut streams[si as usize].free;
        let (p, id) = (0..2)
            .filter_map(|p| pools[p].best_fit(blocks, rounded).map(|id| (p, id)))
            .min_by_key(|&(_, id)| blocks[id as usize].size)?;
        pools[p].remove(blocks, id);
        Some(id)
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
        let padded = segment_size_for(rounded);
        // Devices hand out whole 2 MiB pages anyway, so the fallback is rounded to them.
        let exact = rounded.div_ceil(ROUND_LARGE) * ROUND_LARGE;
        let (size, base) = match self.backend.reserve(padded) {
            Ok(base) => (padded, base),
            Err(e) if is_oom(&e) && padded > exact => (exact, self.backend.reserve(exact)?),
            Err(e) => return Err(e),
        };
        st.stats.num_device_alloc += 1;
        st.stats.segment.update(pool, 1);
        st.stats.reserved_bytes.update(pool, size as i64);
        let stream = si;
        let seg = st.new_segment(Segment {
            base,
            mapped: size,
            address_space: 0,
            pool,
            stream,
            head: NONE,
            tail: NONE,
        });
        let id = st.new_block(Block {
            addr: base,
            size,
            requested: 0,
            segment: seg,
            prev: NONE,
            next: NONE,
            state: BlockState::Free,
            pool,
            stream,
            pending_events: 0,
            freed_at: st.clock,
            alloc_id: 0,
            free_prev: NONE,
            free_next: NONE,
            stream_uses: Vec::new(),
        });
        let s = st.segment_mut(seg);
        s.head = id;
        s.tail = id;
        Ok(id)
    }

    /// Maps pages at the end of stream `si`'s expandable segment for `pool` until its last block
    /// is free and holds `rounded` bytes; returns that block (out of its pool).
    fn grow_expandable(
        &self,
        st: &mut State,
        si: u16,
        pool: PoolKind,
        rounded: usize,
    ) -> Result<u32, BackendError> {
        let mut seg = st.streams[si as usize].expandable[pool_index(pool)];
        if seg == NONE {
            let address_space = self.backend.capacity().div_ceil(self.page) * self.page;
            let base = self.backend.reserve_address_space(address_space)?;
            let segment = Segment {
                base,
                mapped: 0,
                address_space,
                pool,
                stream: si,
                head: NONE,
                tail: NONE,
            };
            seg = st.new_segment(segment);
            st.streams[si as usize].expandable[pool_index(pool)] = seg;
            st.stats.segment.update(pool, 1);
        }
        let (base, mapped, address_space, tail) = {
            let s = st.segment(seg);
            (s.base, s.mapped, s.address_space, s.tail)
        };
        let tail_free = tail != NONE && st.blocks[tail as usize].state == BlockState::Free;
        let have = if tail_free {
            st.blocks[tail as usize].size
        } else {
            0
        };
        let need = (rounded - have).div_ceil(self.page) * self.page;
        if mapped + need > address_space {
            return Err(BackendError::OutOfMemory {
                requested: need,
                free: address_space - mapped,
            });
        }
        let end = base + mapped as u64;
        self.backend.map(end, need)?;
        st.stats.num_device_alloc += 1;
        st.stats.reserved_bytes.update(pool, need as i64);
        st.segment_mut(seg).mapped += need;
        if tail_free {
            st.pool_remove(tail);
            let before = st.contribution(tail);
            st.blocks[tail as usize].size += need;
            let after = st.contribution(tail);
            before.apply_change(after, &mut st.stats, pool);
            return Ok(tail);
        }
        let before = st.contribution(tail);
        let id = st.new_block(Block {
            addr: end,
            size: need,
            requested: 0,
            segment: seg,
            prev: tail,
            next: NONE,
            state: BlockState::Free,
            pool,
            stream: si,
            pending_events: 0,
            freed_at: st.clock,
            alloc_id: 0,
            free_prev: NONE,
            free_next: NONE,
            stream_uses: Vec::new(),
        });
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

    /// Releases cached memory in `order`; returns the bytes given back to the backend.
    fn release_cached(&self, st: &mut State, order: Release) -> Result<usize> {
        // (segment, releasable bytes, freed_at of the free block)
        let mut candidates: Vec<(u32, usize, u64)> = Vec::new();
        for (i, s) in st.segments.iter().enumerate() {
            let Some(s) = s else { continue };
            if s.tail == NONE {
                candidates.push((i as u32, 0, 0));
                continue;
            }
            let t = &st.blocks[s.tail as usize];
            if t.state != BlockState::Free {
                continue;
            }
            if !s.expandable() {
                if s.head == s.tail {
                    candidates.push((i as u32, s.mapped, t.freed_at));
                }
                continue;
            }
            let start = (t.addr - s.base).div_ceil(self.page as u64) * self.page as u64;
            let releasable = s.mapped.saturating_sub(start as usize);
            if releasable > 0 {
                candidates.push((i as u32, releasable, t.freed_at));
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
                self.release_expandable_tail(st, seg)?
            } else {
                self.release_segment(st, seg)?
            };
        }
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
        Ok(s.mapped)
    }

    /// Unmaps the whole pages inside the free last block of an expandable segment, and gives
    /// the address space back once nothing is mapped.
    fn release_expandable_tail(&self, st: &mut State, seg: u32) -> Result<usize> {
        let s = st.segment(seg).clone();
        let mut released = 0;
        if s.tail != NONE {
            let t = st.blocks[s.tail as usize].clone();
            let page = self.page as u64;
            let start = s.base + (t.addr - s.base).div_ceil(page) * page;
            let end = s.base + s.mapped as u64;
            if start < end {
                let bytes = (end - start) as usize;
                // SAFETY: [start, end) lies inside the free last block, so nobody uses it.
                unsafe { self.backend.unmap(start, bytes)? };
                st.stats.num_device_free += 1;
                st.stats.reserved_bytes.update(s.pool, -(bytes as i64));
                st.segment_mut(seg).mapped -= bytes;
                st.pool_remove(s.tail);
                let before = st.contribution(s.tail) + st.contribution(t.prev);
                if t.size == bytes {
                    if t.prev == NONE {
                        st.segment_mut(seg).head = NONE;
                    } else {
                        st.blocks[t.prev as usize].next = NONE;
                    }
                    st.segment_mut(seg).tail = t.prev;
                    st.kill_block(s.tail);
                } else {
                    st.blocks[s.tail as usize].size -= bytes;
                    st.pool_insert(s.tail);
                }
                let after = st.contribution(s.tail) + st.contribution(t.prev);
                before.apply_change(after, &mut st.stats, s.pool);
                released = bytes;
            }
        }
        if st.segment(seg).head == NONE {
            // SAFETY: nothing is mapped in the reservation any more.
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
    pub fn empty_cache(&self) -> Result<usize> {
        self.with_state(|st| {
            self.synchronize_pending(st)?;
            self.release_cached(st, Release::All)
        })
    }

    /// Releases cached memory, largest pieces first, until at most `max_reserved` bytes stay
    /// reserved (or nothing releasable is left); waits on stream events only if that is needed.
    /// Returns the bytes released.
    pub fn trim_to(&self, max_reserved: usize) -> Result<usize> {
        self.with_state(|st| {
            let mut released = self.release_cached(st, Release::LargestFirst(max_reserved))?;
            if st.stats.reserved_bytes.all.current as usize > max_reserved && !st.pending.is_empty()
            {
                self.synchronize_pending(st)?;
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
        let fragmentation = if reserved_unallocated == 0 {
            0.0
        } else {
            1.0 - largest_free_block as f64 / reserved_unallocated as f64
        };
        OomReport {
            backend: self.backend.name(),
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
        }
    }
}

impl Drop for CachingAllocator {
    /// Gives every segment back to the backend. Live `Allocation`s keep the allocator alive, so
    /// only blocks leaked as `RawAllocation`s can still be in use here; their memory goes too.
    fn drop(&mut self) {
        let st = self.state.get_mut();
        for (event, _) in st.pending.drain(..) {
            self.backend.destroy_event(event);
        }
        for s in st.segments.drain(..).flatten() {
            // SAFETY: the allocator is going away; no handle can reach these segments any more.
            unsafe {
                if s.expandable() {
                    if s.mapped > 0 {
                        let _ = self.backend.unmap(s.base, s.mapped);
                    }
                    let _ = self.backend.release_address_space(s.base, s.address_space);
                } else {
                    let _ = self.backend.release(s.base, s.mapped);
                }
            }
        }
    }
}
