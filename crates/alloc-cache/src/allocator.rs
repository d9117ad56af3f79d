//! The caching allocator.
//!
//! # Design
//!
//! Memory comes from a [`MemoryBackend`] in *segments*; callers get *blocks* carved out of them.
//! A freed block is not returned to the backend: it goes back to a pool and is reused by the
//! next request that fits, so steady-state training makes no backend calls at all (a
//! `cuMemAlloc`/`cuMemFree` pair costs tens of microseconds and `cuMemFree` synchronises the
//! device). The anchor is PyTorch's `CUDACachingAllocator`; the differences are listed below.
//!
//! **Rounding.** Every request is rounded up to a multiple of [`MIN_BLOCK`] = 512 bytes (at most
//! 511 bytes wasted, keeps every block 512-byte aligned for vector loads). PyTorch's optional
//! `roundup_power2_divisions` is available but off: on the shipped traces it raised peak
//! reserved/live in every setting tried (e.g. 1.00 -> 1.09 on the variable-length transformer
//! in expandable mode with 4 divisions), because the rounding waste outweighs the extra reuse.
//!
//! **Two pools per stream.** Requests of at most [`SMALL_SIZE`] = 256 KiB go to the *small*
//! pool, which packs them into [`SMALL_SEGMENT`] = 2 MiB segments (2 MiB is also the GPU's page,
//! so a small segment costs exactly one page). PyTorch's boundary is 1 MiB; but a 2 MiB segment
//! holds only two requests of 683 KiB to 1 MiB, and on the traces recorded from kiln's runs such
//! requests (a ViT's 0.76 MiB activations) left a third of the small pool free and unusable by
//! large requests: moving the boundary to 256 KiB took default-mode reserved/live from 1.273 to
//! 1.148 (ViT), 1.157 to 1.026 (GPT, variable length), 1.256 to 1.146 (fine-tune) and 1.243 to
//! 1.230 (ResNet-18), and expandable mode by 0.05-0.11 on three of them; 384 and 512 KiB were
//! better on ResNet-18 and worse on the others (the placement is chaotic). Larger requests go to
//! the *large* pool: a request under 10 MiB gets a segment of whole copies of itself, up to
//! [`LARGE_SEGMENT`] = 20 MiB, so several share one backend call (PyTorch: always 20 MiB; the
//! copies whose 2 MiB-rounded segment wastes least, so 9 MiB gets 18 MiB rather than 20 MiB
//! with a tail no 9 MiB tensor can use), or a segment of its own size when the large pool
//! already caches half a segment it could not use (a fragmentation miss, often the one that
//! sets the peak: a padded segment would then sit mostly empty); on the recorded traces the
//! worst default-mode figure went from 1.230 to 1.151 (`mid_segment_size` in `segments.rs`).
//! Requests of [`MIN_LARGE_ALLOC`] = 10 MiB or more get a segment of their size rounded up to
//! [`ROUND_LARGE`] = 2 MiB, or more under geometric growth (below). Keeping small and large apart
//! stops long-lived small tensors (biases, norms, scalars) from pinning large segments so they
//! can never be released.
//!
//! **Where PyTorch's fixed segments lose memory, and the two rules that recover it.** Copying
//! PyTorch's rules exactly, replaying the shipped ResNet-18 step reserved 1.395x its peak of
//! live bytes. A per-miss diagnostic (`examples/replay_misses.rs`: request, reserved and
//! cached-free bytes at each miss, then the segment map at the peak) showed two causes.
//! (1) *Stranding*: backward needs two 98 MiB gradients when 426 MiB sit cached, but in
//! 26/14/20 MiB segments that cannot be joined, so both were new segments and the peak came
//! *after* the forward pass, with 577 MiB free. (2) *Rounding*: a 24.5 MiB activation in its own
//! 26 MiB segment, 12.25 MiB in 14 MiB, and so on; at the forward peak 80 MiB (9%) were such
//! tails. The variable-length transformer (1.158x) strands the same
//! way: segments sized for one step's shapes serve the next step's larger ones one per segment.
//!
//! - *Defragmentation on a miss* (`segments.rs`): when a large request misses and the wholly
//!   free large segments of the stream together hold at least the request, all of them are
//!   released and one segment of their total size is reserved instead. Reserved memory does not
//!   grow; the cache becomes one contiguous block. Releasing costs backend calls (and on CUDA a
//!   device synchronisation), but only while the cache is still being shaped: on every shipped
//!   fixed-shape trace, the second and later replays of the step make no backend call at all
//!   (tested; measured, not guaranteed: a different placement in step 2 could miss again, as
//!   the MLP trace did with growth divisor 8). Skipped when the merged block would be at least `max_split_size` and the request
//!   smaller, since such a block could not be split for it.
//! - *Geometric growth in whole requests*: a new segment for a request of at least 10 MiB holds
//!   as many copies of the request as fit in 1/16 ([`GROWTH_DIVISOR`](crate::GROWTH_DIVISOR)) of the large pool's
//!   reserved bytes (at least one; rounded to 2 MiB). Runs of same-sized activations (repeated
//!   layers) then share segments, so the 2 MiB rounding is paid once per segment instead of per
//!   tensor, and tensors freed together in backward coalesce into blocks big enough for the next
//!   large request. Whole copies, because a segment merely "a bit larger" than the request
//!   (1/16 of reserved, not a multiple) leaves a tail no request of that size can use: that
//!   variant measured 1.123 on the MLP trace instead of 1.047. The cost is the unused copies of
//!   the newest segment, under 1/16 of what is reserved. Divisors 10 to 18 were measured on the
//!   four shipped traces: every trace moves by up to +-0.03 from one divisor to the next with no
//!   trend (the placement is chaotic), so 16 is a round choice inside the range where all four
//!   stay <= 1.11, not a tuned optimum; 8 leaves too large a tail and 24 fragments the
//!   variable-length trace (1.163). Growth is not applied to 1-10 MiB requests, which keep their
//!   20 MiB segments, nor beyond `max_split_size`. While the pool is still too small for two
//!   copies, a request that its own segment's 2 MiB rounding would waste more than 1/32 of
//!   (`PAIR_ROUNDING_WASTE`; 24.5 MiB in 26 MiB, 12.25 MiB in 14 MiB) gets a segment for two
//!   anyway, if it is at most 1/8 of the pool: ResNet-18 1.084 -> 1.054, the other three
//!   traces unchanged (their large sizes are within 1/32 of a 2 MiB multiple); 1/16 changes
//!   nothing, 1/64 the same as 1/32.
//!
//! Together (default mode, reserved/live on the synthetic traces; PyTorch's rules in brackets;
//! the recorded traces are in `docs/ARCHITECTURE.md`): ResNet-18 step 1.063 (1.395), GPT-2-like variable length 1.103 (1.158), fixed length 1.052 (1.059), MLP 1.047
//! (1.202). What is left on ResNet-18 is mostly 8 MiB of small segments the optimizer adds at
//! the end of the step while the large pool is mostly free (small requests never take large
//! blocks, so that long-lived small tensors cannot pin large segments). On the fixed-length
//! transformer, the optimizer state created after the first backward settles where that step's
//! activations were, so the second step's activations take the cached logits blocks and the
//! logits need new segments. Where the backend maps pages, expandable segments do better still
//! (1.000-1.047).
//!
//! **Best fit, split, coalesce.** A pool is a segregated free index (`free_index.rs`): exact
//! size classes up to 2 MiB and 16 classes per power of two above, with a bitmap of non-empty
//! classes, so the smallest fitting block is found in constant time without an ordered tree
//! (PyTorch uses a `std::set`). Ties go to the most recently freed block up to 2 MiB (its memory
//! is the likeliest to be in cache) and to the lowest address above. The tail of a block is split
//! off when it is worth keeping: any remainder of at least 512 bytes in the small pool and in
//! expandable segments, more than [`SMALL_SIZE`] in the large pool (smaller remainders there
//! could only serve small requests, which never look in the large pool). A freed block is merged with its
//! free neighbours at once.
//!
//! **`max_split_size`** (default unlimited): blocks at least this big are never cut for smaller
//! requests, and a request of at least this size only takes a block less than 20 MiB larger.
//! **`garbage_collection_threshold`**: on a miss that would take reserved memory past this
//! fraction of capacity, the oldest fully free segments are released first, only as many as
//! needed (PyTorch frees every block older than the mean age).
//!
//! **Expandable segments.** Instead of fixed segments, each (stream, pool) has one segment that
//! reserves address space for the whole device and maps 2 MiB pages at its end on demand (2 MiB
//! for both pools, where PyTorch maps 20 MiB at a time for large ones: less overshoot); a free
//! block at the end is grown in place. Releasing unmaps every page lying wholly inside a free
//! block, in the middle too, leaving a hole block that is mapped again when a miss needs its
//! addresses (`expandable.rs`); free blocks are always backed. This removes the "free, but in a
//! segment of the wrong size" waste of fixed segments. With `page_stitching`, a large miss is
//! served by a *stitched block* where the backend can alias pages: the whole free pages of the
//! segment mapped a second time as one range and kept cached, so a repeating step reuses it
//! with no call (`stitched.rs`); without aliases, a miss at a new peak moves the pages of free
//! gaps to the request (`stitch.rs`).
//!
//! **Planned steps** (`planned_steps`, opt-in): with `mark_step` at the start of each step, a
//! loop's first step is packed offline into the cache's own free memory and the next steps are
//! served from it, each allocation at its planned address (`planner.rs`); a deviation falls
//! back to the cache, and a loop whose steps repeat is planned again. Blocks no free block can
//! hold share one new segment, reserved when the step first asks for one of them. Planning the
//! second step, where a loop peaks after the optimizer's state took the free blocks the first
//! step's activations left, lowers that peak (kiln's recorded ResNet-18 run: 1.072 -> 1.020 of
//! peak live); later, the plan removes the search.
//!
//! **Streams.** A block belongs to the stream it was allocated on and is reused only there.
//! `record_stream` notes other streams that used it; freeing such a block records an event on
//! each and the block returns to its pool only when all have completed. While such blocks wait,
//! each allocation polls their events (non-blocking, as PyTorch does); otherwise a hit makes no
//! backend call. Freeing never synchronises; only `empty_cache`/`trim_to` and the slow paths of
//! a miss (defragmentation, the out-of-memory retry), which release segments, may.
//!
//! **Out of memory.** Pool miss -> defragmentation (above) -> backend (a padded segment, then one
//! of the request rounded to 2 MiB; expandable: new pages, or when the backend is full the
//! pages of free gaps moved) -> the smallest free block of the stream that fits
//! regardless of pool and `max_split_size` (free blocks are always backed, so an allocation
//! never fails while a fitting free block exists) -> release every cached segment and
//! page of every stream and retry (counted in `num_alloc_retries`) -> [`Error::OutOfMemory`], whose report gives the request,
//! capacity, backend-free, allocated, reserved, reserved-but-unallocated, largest free block,
//! fragmentation and advice that depends on which of these is the problem.
//!
//! **The hit path** takes one uncontended lock (`lock.rs`: one atomic to take, a plain store to
//! release), does one bitmap lookup and list removal (plus a list insertion when it splits) and
//! a few integer statistic updates; a free is a slab index (the handle carries it, no hash
//! lookup), up to two list removals for coalescing and one insertion. Nothing on it allocates.
//! Blocks are plain `Copy` records: the streams `record_stream` adds live in a side map that
//! the free of a block consults only while some block has any.

use crate::backend::{MemoryBackend, StreamId};
use crate::block::{pool_index, BlockState, State};
use crate::config::AllocatorConfig;
use crate::error::{Error, Result};
use crate::handle::{Allocation, AllocatorRef, RawAllocation};
use crate::lock::{HitGuard, HitLock};
use crate::sizes::{
    LARGE_SEGMENT, MAX_REQUEST, MIN_BLOCK, MIN_LARGE_ALLOC, ROUND_LARGE, SMALL_SEGMENT, SMALL_SIZE,
};
use crate::stats::{MemoryStats, PoolKind};
use crate::trace::TraceRecorder;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

static NEXT_INSTANCE: AtomicU32 = AtomicU32::new(0);

/// Which pool serves a request of `rounded` bytes.
pub fn pool_for(rounded: usize) -> PoolKind {
    if rounded <= SMALL_SIZE {
        PoolKind::Small
    } else {
        PoolKind::Large
    }
}

/// The base size of a fixed segment for a request of `rounded` bytes (PyTorch's rule: 2 MiB for
/// the small pool, 20 MiB under 10 MiB, the request rounded to 2 MiB above). The segment a miss
/// reserves starts from it: large requests under 10 MiB get the whole copies that waste least
/// (`mid_segment_size` in `segments.rs`; 3 MiB + 512 gets 16 MiB), larger ones may grow
/// geometrically (see the design note above).
pub fn segment_size_for(rounded: usize) -> usize {
    if rounded <= SMALL_SIZE {
        SMALL_SEGMENT
    } else if rounded < MIN_LARGE_ALLOC {
        LARGE_SEGMENT
    } else {
        rounded.div_ceil(ROUND_LARGE) * ROUND_LARGE
    }
}

/// A caching allocator over one backend. `Send + Sync`; share it as `Arc<CachingAllocator>`.
pub struct CachingAllocator {
    pub(crate) backend: Box<dyn MemoryBackend>,
    pub(crate) config: AllocatorConfig,
    pub(crate) max_split: usize,
    pub(crate) page: usize,
    /// Page stitching keeps stitched blocks (the backend can alias pages; `stitched.rs`).
    pub(crate) aliases: bool,
    /// Distinguishes this allocator's handles from another allocator's.
    pub(crate) instance: u32,
    pub(crate) state: HitLock<State>,
}

impl std::fmt::Debug for CachingAllocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachingAllocator")
            .field("backend", &self.backend.name())
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl CachingAllocator {
    /// An allocator over `backend` with `config`; refuses settings out of range and expandable
    /// segments on a backend that cannot map pages.
    pub fn new(backend: impl MemoryBackend + 'static, config: AllocatorConfig) -> Result<Self> {
        Self::from_boxed(Box::new(backend), config)
    }

    /// Like [`new`](Self::new) for an already boxed backend.
    pub fn from_boxed(backend: Box<dyn MemoryBackend>, config: AllocatorConfig) -> Result<Self> {
        config.validate()?;
        let page = match (config.expandable_segments, backend.page_size()) {
            (true, None) => {
                return Err(Error::InvalidConfig(format!(
                    "expandable segments need a backend that maps pages; `{}` cannot: turn \
                     expandable_segments off for it",
                    backend.name()
                )))
            }
            (true, Some(p)) if p == 0 || p % MIN_BLOCK != 0 => {
                return Err(Error::InvalidConfig(format!(
                    "backend `{}` reports page size {p}, not a multiple of {MIN_BLOCK}",
                    backend.name()
                )))
            }
            (_, p) => p.unwrap_or(SMALL_SEGMENT),
        };
        let mut state = State::default();
        state.stats.max_split_size = config.max_split_size.map_or(-1, |m| m as i64);
        Ok(Self {
            aliases: config.page_stitching && backend.supports_aliases(),
            max_split: config.max_split_size.unwrap_or(usize::MAX),
            backend,
            config,
            page,
            instance: NEXT_INSTANCE.fetch_add(1, Ordering::Relaxed),
            state: HitLock::new(state),
        })
    }

    /// The backend.
    pub fn backend(&self) -> &dyn MemoryBackend {
        self.backend.as_ref()
    }

    /// The settings.
    pub fn config(&self) -> &AllocatorConfig {
        &self.config
    }

    #[inline]
    pub(crate) fn lock(&self) -> HitGuard<'_, State> {
        self.state.lock()
    }

    /// Allocates `size` bytes on `stream` and returns an RAII handle that frees on drop.
    pub fn allocate(self: &Arc<Self>, size: usize, stream: StreamId) -> Result<Allocation> {
        let raw = self.allocate_raw(size, stream)?;
        Ok(Allocation::new(AllocatorRef::Shared(Arc::clone(self)), raw))
    }

    /// Like [`allocate`](Self::allocate) for an allocator that lives for the whole process (a
    /// per-device allocator in a `static`): the handle holds a plain reference, so no reference
    /// count is touched.
    pub fn allocate_static(&'static self, size: usize, stream: StreamId) -> Result<Allocation> {
        let raw = self.allocate_raw(size, stream)?;
        Ok(Allocation::new(AllocatorRef::Static(self), raw))
    }

    /// Allocates `size` bytes on `stream`; the block must be returned with
    /// [`free_raw`](Self::free_raw). A size of 0 gets a minimal block.
    pub fn allocate_raw(&self, size: usize, stream: StreamId) -> Result<RawAllocation> {
        if size > MAX_REQUEST {
            return Err(Error::InvalidSize {
                requested: size,
                reason: "larger than 1 PiB, which no device holds; check the shape arithmetic",
            });
        }
        let rounded = self.config.rounded_size(size);
        let mut st = self.lock();
        if !st.pending.is_empty() {
            self.process_events(&mut st)?;
        }
        st.clock += 1;
        // Planned steps follow the thread that marks them (or one acting for it); other
        // threads (a loader's, a kernel's parallel tasks) allocate from the cache, their order
        // between steps being no one's.
        let planning = st
            .planner
            .as_ref()
            .is_some_and(|p| p.thread == crate::plan_state::current_thread());
        if planning {
            if let Some(raw) = self.planned_alloc(&mut st, size, stream) {
                return Ok(raw);
            }
        }
        let si = st.stream_index(stream);
        let id = self.take_block(&mut st, si, rounded, size, true)?;
        if planning {
            let (alloc_id, addr) = (st.blocks[id as usize].alloc_id, st.blocks[id as usize].addr);
            if let Some(p) = st.planner.as_mut() {
                p.record_alloc(alloc_id, size, stream, addr);
            }
        }
        if st.history.is_some() {
            let b = &st.blocks[id as usize];
            let (addr, block_size) = (b.addr, b.size);
            st.history_alloc(addr, block_size, stream);
        }
        let b = &st.blocks[id as usize];
        Ok(RawAllocation {
            addr: b.addr,
            size,
            block_size: b.size,
            stream,
            slot: id,
            owner: self.instance,
            alloc_id: b.alloc_id,
        })
    }

    /// Hands out a block of `rounded` bytes for a request of `size` on stream `si`: best fit in
    /// its pool, else the slow paths of a miss (`report_oom`: count a failure in the
    /// statistics and history, as for a caller's request).
    #[inline]
    pub(crate) fn take_block(
        &self,
        st: &mut State,
        si: u16,
        rounded: usize,
        size: usize,
        report_oom: bool,
    ) -> Result<u32> {
        let pool = pool_for(rounded);
        let Some(id) = self.find_fit(st, si, pool, rounded) else {
            return self.take_block_missed(st, si, pool, rounded, size, report_oom);
        };
        let split = self.should_split(st, id, rounded);
        st.take(id, rounded, size, split);
        Ok(id)
    }

    /// [`take_block`](Self::take_block) when its pool has no fitting block: kernel scratch
    /// may borrow idle space of a planned step's bins, a plan past its step's last block gives
    /// its idle bins back, else the slow paths of a miss. Kept out of line, so that a hit runs
    /// none of it.
    #[cold]
    #[inline(never)]
    fn take_block_missed(
        &self,
        st: &mut State,
        si: u16,
        pool: PoolKind,
        rounded: usize,
        size: usize,
        report_oom: bool,
    ) -> Result<u32> {
        if let Some(id) = self.lend_from_plan(st, si, pool, rounded, size) {
            return Ok(id);
        }
        // A plan past its step's last block gives its idle bins back before memory is mapped.
        let refit = match st.yield_plan_past_its_step(si, pool, rounded) {
            true => self.find_fit(st, si, pool, rounded),
            false => None,
        };
        let id = match refit {
            Some(id) => id,
            None => self.allocate_miss(st, si, pool, rounded, size, report_oom)?,
        };
        let split = self.should_split(st, id, rounded);
        st.take(id, rounded, size, split);
        Ok(id)
    }

    /// Best fit in `stream`'s `pool` under the `max_split_size` rules; removes it from the pool.
    #[inline]
    pub(crate) fn find_fit(
        &self,
        st: &mut State,
        si: u16,
        pool: PoolKind,
        rounded: usize,
    ) -> Option<u32> {
        let State {
            streams, blocks, ..
        } = st;
        let free = &mut streams[si as usize].free[pool_index(pool)];
        let id = free.best_fit(blocks, rounded)?;
        let size = blocks[id as usize].size;
        if (rounded < self.max_split && size >= self.max_split)
            || (rounded >= self.max_split && size >= rounded + LARGE_SEGMENT)
        {
            return None;
        }
        free.remove(blocks, id);
        Some(id)
    }

    fn should_split(&self, st: &State, id: u32, rounded: usize) -> bool {
        let b = &st.blocks[id as usize];
        if b.segment == crate::slab::ALIAS_SEGMENT {
            return false;
        }
        let remaining = b.size - rounded;
        if b.pool == PoolKind::Small || st.segment(b.segment).expandable() {
            remaining >= MIN_BLOCK
        } else {
            rounded < self.max_split && remaining > SMALL_SIZE
        }
    }

    /// Returns a block. Fails (and changes nothing) if `raw` is not live in this allocator.
    pub fn free_raw(&self, raw: RawAllocation) -> Result<()> {
        let mut st = self.lock();
        let id = self.validate(&st, &raw)?;
        if let Some(r) = st.recorder.as_mut() {
            r.record_free(raw.alloc_id);
        }
        if let Some(p) = st.planner.as_mut() {
            p.record_free(raw.alloc_id);
        }
        st.clock += 1;
        let (addr, block_size) = (st.blocks[id as usize].addr, st.blocks[id as usize].size);
        let uses = if st.stream_uses.is_empty() {
            None
        } else {
            st.stream_uses.remove(&id)
        };
        let Some(uses) = uses else {
            st.free_block(id);
            if st.history.is_some() {
                st.history_free(addr, block_size, true);
            }
            return Ok(());
        };
        // Used on other streams: wait for their work before reuse.
        let mut events = Vec::with_capacity(uses.len());
        for s in &uses {
            match self.backend.record_event(*s) {
                Ok(e) => events.push(e),
                Err(err) => {
                    for e in events {
                        self.backend.destroy_event(e);
                    }
                    st.stream_uses.insert(id, uses);
                    return Err(err.into());
                }
            }
        }
        let before = st.contribution(id);
        let b = &mut st.blocks[id as usize];
        b.state = BlockState::Pending;
        b.pending_events = events.len() as u32;
        let pool = b.pool;
        let after = st.contribution(id);
        before.apply_change(after, &mut st.stats, pool);
        st.pending.extend(events.into_iter().map(|e| (e, id)));
        if st.history.is_some() {
            st.history_free(addr, block_size, false);
        }
        Ok(())
    }

    fn validate(&self, st: &State, raw: &RawAllocation) -> Result<u32> {
        let id = raw.slot;
        match st.blocks.get(id as usize) {
            Some(b)
                if raw.owner == self.instance
                    && b.state == BlockState::Allocated
                    && b.alloc_id == raw.alloc_id =>
            {
                Ok(id)
            }
            _ => Err(Error::InvalidFree(format!(
                "block at {:#x} ({} bytes) is not live in this allocator (double free, or a block \
                 of another allocator); free each allocation exactly once, to its own allocator",
                raw.addr, raw.size
            ))),
        }
    }

    /// Marks `raw` as used by work on `stream` (PyTorch's `record_stream`): when freed it is
    /// reused only after that work, as of the free, has completed.
    pub fn record_stream(&self, raw: &RawAllocation, stream: StreamId) -> Result<()> {
        let mut st = self.lock();
        let id = self.validate(&st, raw)?;
        if stream != raw.stream {
            let uses = st.stream_uses.entry(id).or_default();
            if !uses.contains(&stream) {
                uses.push(stream);
            }
        }
        Ok(())
    }

    /// Frees blocks whose stream events have all completed. Never blocks.
    pub(crate) fn process_events(&self, st: &mut State) -> Result<()> {
        let mut i = 0;
        while i < st.pending.len() {
            let (event, id) = st.pending[i];
            if !self.backend.query_event(event)? {
                i += 1;
                continue;
            }
            self.backend.destroy_event(event);
            st.pending.swap_remove(i);
            let b = &mut st.blocks[id as usize];
            b.pending_events -= 1;
            if b.pending_events == 0 {
                let (addr, size) = (b.addr, b.size);
                st.free_block(id);
                if st.history.is_some() {
                    st.history_free_completed(addr, size);
                }
            }
        }
        Ok(())
    }

    /// A copy of every statistic.
    pub fn memory_stats(&self) -> MemoryStats {
        self.lock().stats.clone()
    }

    /// Resets every peak statistic to its current value.
    pub fn reset_peak_stats(&self) {
        self.lock().stats.reset_peak();
    }

    /// The human-readable statistics table (like `torch.cuda.memory_summary()`).
    pub fn memory_summary(&self) -> String {
        let st = self.lock();
        st.stats
            .summary(self.backend.name(), Self::largest_free(&st))
    }

    /// Size of the largest cached free block over all streams and pools (0 when none).
    pub fn largest_free_block(&self) -> usize {
        Self::largest_free(&self.lock())
    }

    pub(crate) fn largest_free(st: &State) -> usize {
        let indexes = st.streams.iter().flat_map(|s| s.free.iter());
        indexes.map(|f| f.largest(&st.blocks)).max().unwrap_or(0)
    }

    /// Starts recording every allocation and free into `recorder` (replacing any previous one).
    pub fn set_trace_recorder(&self, recorder: Option<TraceRecorder>) {
        self.lock().recorder = recorder;
    }

    /// Stops recording and returns the recorder with what it recorded.
    pub fn take_trace_recorder(&self) -> Option<TraceRecorder> {
        self.lock().recorder.take()
    }

    pub(crate) fn with_state<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        f(&mut self.lock())
    }
}
