//! Planned steps inside the allocator (`planned_steps:True`, with
//! [`CachingAllocator::mark_step`] called at the start of every training step): a loop's step
//! is recorded once, packed offline into the cache's own free memory (interval packing into
//! bins, [`BinPlan::pack`]) and then served from it, each allocation at its planned address with
//! no search.
//!
//! - **Recording.** While no plan is active, every allocation and free between two markers is
//!   recorded, allocations only from the thread that marks the steps, or from a thread acting
//!   for it ([`StepThread`](crate::StepThread): kiln's CPU passes run on a pool thread that
//!   enters it): other threads (a data loader's prefetching, a kernel's parallel tasks taking
//!   scratch under [`StepThread::OUTSIDE`](crate::StepThread::OUTSIDE)) allocate in an order
//!   that changes from step to step, so the cache serves them and no plan waits on them. The
//!   first packable step recorded is planned at once: a loop's second step repeats its first
//!   but for what the first leaves live (the optimizer's state, skipped when serving), and the
//!   second step is where a loop reaches its peak, after that state took free blocks the
//!   activations had left. After a plan is dropped, a step is planned when its requests
//!   (sizes and stream, in order) equal those of the step recorded before it. The blocks the
//!   step allocated and freed again are packed; those it left live (a batch that a
//!   Python-style loop frees only when the next step assigns the next one, a logged loss kept
//!   for good, the optimizer's state) are left to the cache in every step. All of the packed
//!   blocks' memory is free at that marker, so the free blocks of the stream are the bins: the
//!   step is packed into them, and those that receive blocks leave the pools (state `Arena`).
//!   With fixed segments, the blocks no bin has room for are packed into one *spare* bin: a
//!   new segment just large enough for them, reserved when the step first asks for one of
//!   them (a step that leaves the plan before then reserves nothing; a backend that refuses
//!   it sends them to the cache). With expandable segments, a step the bins cannot hold
//!   whole, or one with blocks left to the cache, is not planned: the bins would keep whole
//!   free pages from being remapped for the requests the cache serves.
//! - **Serving.** The i-th allocation of a planned step that asks for the planned size on the
//!   planned stream, and whose planned range overlaps no planned block still live, is placed
//!   there (in the spare bin, reserved then if it is the first); one the plan leaves to the
//!   cache goes through the cache, as do other threads' allocations. A request of another size
//!   is matched to the next planned request of its size when only requests the plan leaves to
//!   the cache lie between (what the recorded step made and later steps do not: the
//!   optimizer's state, made in the first step only, is skipped so); past the plan's last
//!   placed allocation it goes to the cache (a value logged now and then). Anything else is a
//!   deviation: that allocation and the rest of the step go through the cache, as without a
//!   plan; blocks already placed stay where they are.
//! - **Lending.** Kernel scratch taken under [`StepThread::OUTSIDE`](crate::StepThread::OUTSIDE)
//!   (freed inside the op that took it) that finds no free block in the cache is lent a
//!   stretch of a bin that no planned or lent block holds at the time, before the cache maps
//!   new memory for it (`plan_lend.rs`): the stretch whose next planned use is furthest ahead
//!   in the step. A planned allocation whose place a lent block still holds is served by the
//!   cache, and the plan goes on. Without this, scratch that grows with the thread count
//!   (one piece per task in flight) mapped new segments beside bins that sat idle.
//! - **Dropping.** At the marker after a deviating step, a step that stopped before the plan's
//!   last placed allocation, or when a planned block outlives its step, the plan is dropped:
//!   the bins go back to the pools once their last block is freed, and recording starts
//!   again. A step that asked for more than the plan holds (work past its last placed block,
//!   such as an evaluation after the loop's steps) drops it when the marking thread misses in
//!   the cache for a request an idle bin could hold: the idle bins go back at once, before the
//!   cache maps memory beside them. When the cache runs short, or is emptied (`empty_cache`,
//!   `trim_to` short of its target), the plan is dropped and every bin goes back at once, one
//!   still holding planned blocks dissolved around them (`plan_dissolve.rs`).
//!
//! Invariants: two planned or lent blocks live at once never overlap and each lies inside its
//! bin (checked on every placement, not assumed from the plan); a planned block is a block of
//! segment [`ARENA_SEGMENT`] (no neighbours, in no pool); statistics stay true: a planned block
//! counts in `allocated_bytes`, `active` and `allocation` (of its bin's pool) while live, the
//! bins themselves only in `reserved_bytes` (they are neither allocated nor cached-free).

use crate::allocator::CachingAllocator;
use crate::backend::StreamId;
use crate::block::{Block, BlockState, State, NONE};
use crate::error::Result;
use crate::handle::RawAllocation;
use crate::plan_state::{Active, PlannedCounts, Realign, RecordedStep, Spare};
use crate::planned::BinPlan;
use crate::sizes::ROUND_LARGE;
use crate::slab::ARENA_SEGMENT;
use crate::stats::PoolKind;
use crate::trace::Trace;
use std::collections::BTreeMap;

impl State {
    /// A block of `bytes` at `addr` inside a bin of the active plan, taken for a request of
    /// `size` and recorded as live: a planned block, or one lent to scratch (`plan_lend.rs`).
    pub(crate) fn take_arena_block(
        &mut self,
        addr: u64,
        bytes: usize,
        size: usize,
        pool: PoolKind,
        si: u16,
    ) -> u32 {
        let block = Block::free(addr, bytes, ARENA_SEGMENT, NONE, pool, si, self.clock);
        let id = self.new_block(block);
        self.take(id, bytes, size, false);
        if let Some(a) = self.planner.as_mut().and_then(|p| p.active.as_mut()) {
            a.live.insert(addr, addr + bytes as u64);
        }
        id
    }

    /// Frees planned block `id` (allocated or pending); when the plan was dropped and this was
    /// its last block, the bins go back to the pools.
    pub(crate) fn free_arena_block(&mut self, id: u32) {
        let before = self.contribution(id);
        let (addr, pool) = (self.blocks[id as usize].addr, self.blocks[id as usize].pool);
        self.kill_block(id);
        before.apply_change(self.contribution(id), &mut self.stats, pool);
        let Some(a) = self.planner.as_mut().and_then(|p| p.active.as_mut()) else {
            return;
        };
        a.live.remove(&addr);
        a.lent.remove(&addr);
        if a.dropped && a.live.is_empty() {
            self.release_bins();
        }
    }

    /// Ends the active plan: every bin goes back to its pool (merged with free neighbours).
    fn release_bins(&mut self) {
        let Some(a) = self.planner.as_mut().and_then(|p| p.active.take()) else {
            return;
        };
        for bin in a.bins {
            self.release_bin(bin);
        }
    }

    /// Bin `bin` back to its pool: it counted as nothing while a bin (state `Arena`), so
    /// freeing it counts it as cached only, never as an allocation.
    fn release_bin(&mut self, bin: u32) {
        self.free_block(bin);
    }

    /// A deviation: drops the active plan and returns every bin holding no live planned block
    /// to its pool at once (the others follow with their last block, or are dissolved if the
    /// cache runs short first, `plan_dissolve.rs`). Whether any bin went back.
    pub(crate) fn yield_plan(&mut self) -> bool {
        let Some(p) = self.planner.as_mut() else {
            return false;
        };
        let Some(a) = p.active.as_mut() else {
            return false;
        };
        p.counts.fallback_steps += u64::from(!a.dropped);
        a.dropped = true;
        let blocks = &self.blocks;
        let (busy, idle): (Vec<u32>, Vec<u32>) = a.bins.iter().partition(|&&bin| {
            let b = &blocks[bin as usize];
            a.holds_live(b.addr, b.size)
        });
        a.bins = busy;
        if a.bins.is_empty() {
            p.active = None;
        }
        for &bin in &idle {
            self.release_bin(bin);
        }
        !idle.is_empty()
    }

    /// A miss of `rounded` bytes in `pool` of stream `si` by the marking thread after its step
    /// asked for more than the plan holds (work past the last placed block, such as an
    /// evaluation after the loop's steps): the plan has nothing more to serve before the next
    /// marker, so when an idle bin of that pool and stream could hold the request, the plan is
    /// dropped and its idle bins go back to the pools before the cache maps new memory beside
    /// them. The step counts as served when no planned block is live. Whether any bin went
    /// back.
    pub(crate) fn yield_plan_past_its_step(
        &mut self,
        si: u16,
        pool: PoolKind,
        rounded: usize,
    ) -> bool {
        let Some(p) = self.planner.as_mut() else {
            return false;
        };
        let Some(a) = p.active.as_mut() else {
            return false;
        };
        if !a.beyond || a.dropped || a.deviated || p.thread != crate::plan_state::current_thread() {
            return false;
        }
        let blocks = &self.blocks;
        let fits = a.bins.iter().any(|&bin| {
            let b = &blocks[bin as usize];
            b.pool == pool && b.stream == si && b.size >= rounded && !a.holds_live(b.addr, b.size)
        });
        if !fits {
            return false;
        }
        a.count_step(&mut p.counts);
        a.dropped = true;
        self.yield_plan()
    }

    /// Takes the first `used` bytes of free block `id` out of its pool as a bin of the plan;
    /// the rest stays free.
    fn take_bin(&mut self, id: u32, used: usize) {
        self.pool_remove(id);
        let before = self.contribution(id);
        let rest = if self.blocks[id as usize].size - used >= crate::MIN_BLOCK {
            self.split_tail(id, used)
        } else {
            NONE
        };
        self.blocks[id as usize].state = BlockState::Arena;
        let pool = self.blocks[id as usize].pool;
        let after = self.contribution(id) + self.contribution(rest);
        before.apply_change(after, &mut self.stats, pool);
    }
}

impl CachingAllocator {
    /// Places allocation `size` on `stream` where the plan says; `None` sends it to the cache
    /// (no plan, an allocation the plan leaves to the cache, or a step that deviates).
    pub(crate) fn planned_alloc(
        &self,
        st: &mut State,
        size: usize,
        stream: StreamId,
    ) -> Option<RawAllocation> {
        let a = st.planner.as_mut()?.active.as_mut()?;
        if a.deviated || a.dropped {
            return None;
        }
        let mut i = a.next;
        if a.stream == stream && a.requests.get(i) != Some(&size) {
            match a.realign(i, size) {
                Realign::At(k) => i = k,
                // Past the plan's last placed block: the cache serves it, the plan stays.
                Realign::Extra => {
                    a.beyond = true;
                    return None;
                }
                Realign::Deviate => {}
            }
            a.next = i;
        }
        let bytes = crate::round_size(size);
        let asked = a.requests.get(i) == Some(&size) && a.stream == stream;
        let mut place = a.places.get(i).copied().flatten();
        if asked && place.is_none() {
            place = self.spare_place(st, i, stream);
        }
        let a = st.planner.as_mut()?.active.as_mut()?;
        // The live blocks overlapping the place (disjoint, so their ends rise with their
        // starts): a planned one is a clash, a lent one only displaces this allocation.
        let (mut clash, mut displaced) = (false, false);
        if let Some((addr, _)) = place {
            let over = a.live.range(..addr + bytes as u64).rev();
            for (start, _) in over.take_while(|(_, &e)| e > addr) {
                if a.lent.contains(start) {
                    displaced = true;
                } else {
                    clash = true;
                }
            }
        }
        if !asked || clash {
            // The rest of the step goes to the cache, which gets the idle bins back.
            a.deviated = true;
            st.yield_plan();
            return None;
        }
        a.next += 1;
        if displaced {
            // The cache serves it; the plan goes on with the next allocation.
            if let Some(p) = st.planner.as_mut() {
                p.counts.displaced_allocs += 1;
            }
            return None;
        }
        let (addr, pool) = place?;
        let si = st.stream_index(stream);
        let id = st.take_arena_block(addr, bytes, size, pool, si);
        if let Some(p) = st.planner.as_mut() {
            p.counts.arena_allocs += 1;
        }
        if st.history.is_some() {
            st.history_alloc(addr, bytes, stream);
        }
        Some(RawAllocation {
            addr,
            size,
            block_size: bytes,
            stream,
            slot: id,
            owner: self.instance,
            alloc_id: st.blocks[id as usize].alloc_id,
        })
    }

    /// Where allocation `i` of the step goes in the spare bin, reserving the bin (one fixed
    /// segment) when this is the first of its blocks the step asks for; `None` when the plan
    /// has no spare place for it or the backend refuses the segment (then the spare bin is
    /// given up, and its blocks go to the cache).
    fn spare_place(&self, st: &mut State, i: usize, stream: StreamId) -> Option<(u64, PoolKind)> {
        let spare = st.planner.as_mut()?.active.as_mut()?.spare.as_mut()?;
        let offset = spare.offsets.get(i).copied().flatten()?;
        let base = match spare.base {
            Some(base) => base,
            None => {
                let bytes = spare.bytes;
                let si = st.stream_index(stream);
                let Ok(id) = self.reserve_fixed(st, si, PoolKind::Large, bytes) else {
                    if let Some(a) = st.planner.as_mut().and_then(|p| p.active.as_mut()) {
                        a.spare = None;
                    }
                    return None;
                };
                st.pool_insert(id);
                st.take_bin(id, bytes);
                let base = st.blocks[id as usize].addr;
                let a = st.planner.as_mut()?.active.as_mut()?;
                a.bins.push(id);
                if let Some(s) = a.spare.as_mut() {
                    s.base = Some(base);
                }
                base
            }
        };
        Some((base + offset as u64, PoolKind::Large))
    }

    /// Marks the start of a training step (a no-op unless `planned_steps` is on): closes the
    /// step before it, plans the loop from the first packable step recorded (and, after a plan
    /// was dropped, once two packable steps in a row made the same requests), and drops the
    /// plan after a step that deviated from it. Makes no backend call (a plan's spare bin is
    /// reserved when its step first needs it).
    pub fn mark_step(&self) -> Result<()> {
        if !self.config.planned_steps {
            return Ok(());
        }
        let mut st = self.lock();
        let ooms = st.stats.num_ooms;
        let p = st.planner.get_or_insert_with(Box::default);
        p.thread = crate::plan_state::current_thread();
        if let Some(a) = p.active.as_mut() {
            if a.served_whole() && !a.dropped {
                a.next = 0;
                a.beyond = false;
                p.counts.planned_steps += 1;
                return Ok(());
            }
            p.counts.fallback_steps += u64::from(!a.dropped);
            a.dropped = true;
            let release = a.live.is_empty();
            p.previous = None;
            p.recording.clear();
            if release {
                st.release_bins();
            }
            return Ok(());
        }
        let step = p.recorded_step();
        let failed = std::mem::replace(&mut p.ooms, ooms) != ooms;
        if failed || step.trace.events.is_empty() {
            p.previous = None;
            return Ok(());
        }
        let first = !std::mem::replace(&mut p.recorded_before, true);
        if !first && p.previous.as_ref() != Some(&step.requests) {
            p.previous = Some(step.requests);
            return Ok(());
        }
        p.previous = None;
        self.start_plan(&mut st, step);
        Ok(())
    }

    /// Packs the step into the free blocks of its stream and makes the plan active (when the
    /// step uses one stream and some block found room). When packing leaves a block without
    /// room but the addresses the cache gave the recorded step all lie in free blocks, those
    /// are the plan instead (the cache's own layout, served without search).
    fn start_plan(&self, st: &mut State, recorded: RecordedStep) {
        let RecordedStep {
            trace: step,
            requests,
            addrs,
            inside,
        } = recorded;
        let stream = requests[0].1;
        if requests.iter().any(|r| r.1 != stream) {
            return;
        }
        if self.config.expandable_segments && inside.contains(&false) {
            // Bins would keep whole free pages from the blocks the cache serves (those that
            // outlive the step), which would map new pages for them (measured on PyTorch's
            // recorded ResNet-18 run: peak 1.064 -> 1.077 of live, and calls in later runs).
            return;
        }
        let step = &step;
        let recorded: Vec<u64> = addrs
            .iter()
            .zip(&inside)
            .filter_map(|(&addr, &i)| i.then_some(addr))
            .collect();
        let si = st.stream_index(stream);
        let free: Vec<u32> = (0..st.blocks.len() as u32)
            .filter(|&id| {
                let b = &st.blocks[id as usize];
                b.state == BlockState::Free && b.segment < ARENA_SEGMENT && b.stream == si
            })
            .collect();
        let sizes: Vec<usize> = free.iter().map(|&id| st.blocks[id as usize].size).collect();
        let Ok(mut plan) = BinPlan::pack(step, &sizes) else {
            return;
        };
        if plan.places.iter().any(Option::is_none) {
            let mut spans: Vec<(u64, u64, usize)> = free
                .iter()
                .enumerate()
                .map(|(i, &id)| {
                    let b = &st.blocks[id as usize];
                    (b.addr, b.addr + b.size as u64, i)
                })
                .collect();
            spans.sort_unstable();
            let inside = |addr: u64, bytes: usize| {
                let i = spans.partition_point(|s| s.0 <= addr).checked_sub(1)?;
                let (lo, hi, bin) = spans[i];
                (addr + bytes as u64 <= hi).then(|| (bin, (addr - lo) as usize))
            };
            // The cache's own layout where it lies in free blocks, the rest packed around it.
            let own: Vec<_> = recorded
                .iter()
                .zip(&plan.requests)
                .map(|(&addr, &bytes)| inside(addr, crate::round_size(bytes)))
                .collect();
            if let Ok(around) = BinPlan::pack_around(step, &sizes, &own) {
                plan = around;
            }
        }
        if plan.places.iter().any(Option::is_none) && self.config.expandable_segments {
            // Bins that leave requests to the cache would keep whole free pages from being
            // remapped for them, and those requests would map new pages every step.
            return;
        }
        let spare = spare_bin(step, &sizes, &mut plan);
        // Bytes of each bin up to the end of its last planned block.
        let mut used = vec![0usize; free.len()];
        let mut planned = plan.places.iter().zip(&plan.requests);
        let places = inside
            .iter()
            .map(|&i| {
                // The blocks that outlive the step are left to the cache.
                let (place, &bytes) = if i { planned.next()? } else { return None };
                place.map(|(bin, offset)| {
                    used[bin] = used[bin].max(offset + crate::round_size(bytes));
                    let b = &st.blocks[free[bin] as usize];
                    (b.addr + offset as u64, b.pool)
                })
            })
            .collect();
        let bins: Vec<u32> = (0..free.len())
            .filter(|&b| used[b] > 0)
            .map(|b| free[b])
            .collect();
        if bins.is_empty() && spare.is_none() {
            return;
        }
        // Offsets in the spare bin, per allocation of the step (those left to the cache: none).
        let spare = spare.map(|(bytes, offsets)| {
            let mut offsets = offsets.into_iter();
            Spare {
                bytes,
                offsets: inside
                    .iter()
                    .map(|&i| if i { offsets.next().flatten() } else { None })
                    .collect(),
                base: None,
            }
        });
        for (bin, &bytes) in free.iter().zip(&used) {
            if bytes > 0 {
                st.take_bin(*bin, bytes);
            }
        }
        let mut active = Active {
            requests: requests.iter().map(|r| r.0).collect(),
            stream,
            places,
            bins,
            next: 0,
            deviated: false,
            beyond: false,
            dropped: false,
            live: BTreeMap::new(),
            lent: Default::default(),
            spare,
            last_placed: 0,
        };
        active.last_placed = active.find_last_placed();
        if let Some(p) = st.planner.as_mut() {
            p.active = Some(active);
        }
    }

    /// Steps served by the plan, steps that fell back, allocations placed by it, and the bytes
    /// of the bins it holds (0 while no plan is active).
    pub fn plan_counts(&self) -> (PlannedCounts, usize) {
        let st = self.lock();
        let Some(p) = st.planner.as_deref() else {
            return (PlannedCounts::default(), 0);
        };
        let bins = p.active.as_ref().filter(|a| !a.dropped);
        let bytes = bins.map_or(0, |a| {
            a.bins.iter().map(|&b| st.blocks[b as usize].size).sum()
        });
        (p.counts, bytes)
    }

    /// The planner invariants: every live planned block inside a bin, none overlapping
    /// another; a violation's text.
    pub(crate) fn check_planner(&self, st: &State) -> Option<String> {
        let a = st.planner.as_deref().and_then(|p| p.active.as_ref());
        let mut spans: Vec<(u64, u64)> = st
            .blocks
            .iter()
            .filter(|b| b.segment == ARENA_SEGMENT && b.state != BlockState::Dead)
            .map(|b| (b.addr, b.addr + b.size as u64))
            .collect();
        let Some(a) = a else {
            return (!spans.is_empty()).then(|| "planned blocks without a plan".into());
        };
        spans.sort_unstable();
        let bins: Vec<(u64, u64)> = a
            .bins
            .iter()
            .map(|&b| &st.blocks[b as usize])
            .filter(|b| b.state == BlockState::Arena)
            .map(|b| (b.addr, b.addr + b.size as u64))
            .collect();
        if bins.len() != a.bins.len() || spans.len() != a.live.len() {
            return Some("bins or live planned blocks out of step".into());
        }
        let inside = spans
            .iter()
            .all(|&(lo, hi)| bins.iter().any(|&(b0, b1)| b0 <= lo && hi <= b1));
        let disjoint = spans.windows(2).all(|w| w[0].1 <= w[1].0);
        (!inside || !disjoint).then(|| "planned blocks overlap or leave their bins".into())
    }
}

/// The spare bin of a fixed-segment plan whose packing left blocks without room: the step
/// packed again with one more bin of unbounded size, which takes only what no free block can
/// hold (the packer tries the smallest bins first). Returns its size, rounded up to whole
/// [`ROUND_LARGE`] units, and each packed block's offset in it (in `plan`'s order), and moves
/// `plan` to that packing; `None` when every block found room (or the step cannot be packed).
fn spare_bin(
    step: &Trace,
    bins: &[usize],
    plan: &mut BinPlan,
) -> Option<(usize, Vec<Option<usize>>)> {
    if plan.places.iter().all(Option::is_some) {
        return None;
    }
    let spare = bins.len();
    let mut with_spare = bins.to_vec();
    with_spare.push(usize::MAX / 4);
    let packed = BinPlan::pack(step, &with_spare).ok()?;
    let offsets: Vec<Option<usize>> = packed
        .places
        .iter()
        .map(|p| p.filter(|&(b, _)| b == spare).map(|(_, offset)| offset))
        .collect();
    let end = offsets
        .iter()
        .zip(&packed.requests)
        .filter_map(|(o, &bytes)| o.map(|o| o + crate::round_size(bytes)))
        .max()?;
    let mut places = packed.places;
    for p in &mut places {
        if p.is_some_and(|(b, _)| b == spare) {
            *p = None;
        }
    }
    plan.places = places;
    plan.requests = packed.requests;
    Some((end.checked_next_multiple_of(ROUND_LARGE)?, offsets))
}
