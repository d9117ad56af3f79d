//! Planned steps: when a training step's allocation sequence repeats, pack one recorded step
//! offline into a single arena (interval packing) and serve the following steps from it; a step
//! that deviates falls back to the caching allocator without failing.
//!
//! [`StepPlan::pack`] takes one step's events, in which every block allocated is freed again
//! (the steady state of a loop: gradients, activations and temporaries, not parameters). Each
//! block is an interval in time (from its allocation to its free) and needs its rounded size
//! in address space; blocks are placed largest first (ties: earliest allocation), each at the
//! lowest offset where it overlaps no placed block that is live at the same time. The arena is
//! the highest end of any placed block.
//!
//! [`PlannedReplayer`] replays steps: a step whose allocations ask for exactly the planned
//! sizes in the planned order is served from the arena (offsets from the plan, no allocator
//! call at all); at the first allocation that differs, the step's blocks still live stay where
//! they are and every later event of the step goes through the caching allocator, as without a
//! plan.
//!
//! Invariants: two blocks of a plan whose lifetimes overlap never overlap in the arena; every
//! offset is a multiple of 512; the arena is at most the sum of the planned sizes.

use crate::error::{Error, Result};
pub use crate::plan_state::PlannedCounts;
use crate::replay::{ReplayMode, Replayer};
pub use crate::trace::steps_of;
use crate::trace::{Trace, TraceEvent};
use std::collections::HashMap;

/// The packed arena of one step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepPlan {
    /// Requested bytes of each allocation, in the step's order.
    pub requests: Vec<usize>,
    /// Offset of each allocation in the arena, same order.
    pub offsets: Vec<usize>,
    /// Bytes the arena needs.
    pub arena_bytes: usize,
    /// Largest sum of live block sizes over the step (the arena can be no smaller).
    pub peak_live_bytes: usize,
}

/// One block of a step: (index of its allocation, rounded size, first event, last event).
type Lifetime = (usize, usize, usize, usize);

/// The requests of `step`, the lifetime of each block, largest first (ties: earliest), and the
/// peak of live rounded bytes. Errors as [`StepPlan::pack`] says.
fn lifetimes(step: &Trace) -> Result<(Vec<usize>, Vec<Lifetime>, usize)> {
    let mut start: HashMap<u64, (usize, usize)> = HashMap::new();
    let mut blocks: Vec<Lifetime> = Vec::new();
    let mut requests = Vec::new();
    let (mut live, mut peak) = (0usize, 0usize);
    for (t, e) in step.events.iter().enumerate() {
        match *e {
            TraceEvent::Alloc { id, bytes } => {
                start.insert(id, (requests.len(), t));
                requests.push(bytes);
                live += crate::round_size(bytes);
                peak = peak.max(live);
            }
            TraceEvent::Free { id } => {
                let (i, t0) = start.remove(&id).ok_or_else(|| Error::TraceParse {
                    line: 0,
                    message: format!(
                        "the step frees id {id}, which it did not allocate; plan a step \
                         whose blocks are all allocated and freed inside it"
                    ),
                })?;
                let size = crate::round_size(requests[i]);
                live -= size;
                blocks.push((i, size, t0, t));
            }
        }
    }
    if let Some((&id, _)) = start.iter().min_by_key(|(_, &(i, _))| i) {
        return Err(Error::TraceParse {
            line: 0,
            message: format!(
                "id {id} is allocated in the step and still live at its end; plan a steady \
                 step (one after the first), in which every block is freed again"
            ),
        });
    }
    blocks.sort_by(|a, b| b.1.cmp(&a.1).then(a.2.cmp(&b.2)));
    Ok((requests, blocks, peak))
}

/// The lowest offset at which a block of `size` bytes live over events `[t0, t1]` overlaps
/// no block of `placed` (offset, end, first event, last event) live at the same time, ending
/// at most at `limit`.
fn lowest_offset(
    placed: &[(usize, usize, usize, usize)],
    (size, t0, t1): (usize, usize, usize),
    limit: usize,
) -> Option<usize> {
    let mut clashes: Vec<(usize, usize)> = placed
        .iter()
        .filter(|p| p.2 < t1 && t0 < p.3)
        .map(|p| (p.0, p.1))
        .collect();
    clashes.sort_unstable();
    let mut offset = 0;
    for (lo, hi) in clashes {
        if lo >= offset + size {
            break;
        }
        offset = offset.max(hi);
    }
    (offset.checked_add(size)? <= limit).then_some(offset)
}

impl StepPlan {
    /// Packs `step`. Errors name an allocation that is not freed within the step (it would
    /// outlive the arena's reuse) or a free of a block the step did not allocate.
    pub fn pack(step: &Trace) -> Result<StepPlan> {
        let (requests, blocks, peak) = lifetimes(step)?;
        let mut offsets = vec![0usize; requests.len()];
        // Placed blocks: (offset, end, first event, last event).
        let mut placed: Vec<(usize, usize, usize, usize)> = Vec::with_capacity(blocks.len());
        let mut arena = 0;
        for &(i, size, t0, t1) in &blocks {
            let offset = lowest_offset(&placed, (size, t0, t1), usize::MAX).unwrap_or(0);
            offsets[i] = offset;
            arena = arena.max(offset + size);
            placed.push((offset, offset + size, t0, t1));
        }
        Ok(StepPlan {
            requests,
            offsets,
            arena_bytes: arena,
            peak_live_bytes: peak,
        })
    }
}

/// A step packed into given bins (the free blocks of a cache) instead of one arena.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BinPlan {
    /// Requested bytes of each allocation, in the step's order.
    pub requests: Vec<usize>,
    /// For each allocation, the bin (index into the bins packed into) and offset in it, or
    /// `None` when no bin had room for it.
    pub places: Vec<Option<(usize, usize)>>,
    /// Largest sum of live block sizes over the step.
    pub peak_live_bytes: usize,
}

impl BinPlan {
    /// Packs `step` into bins of the given sizes: blocks largest first (ties: earliest
    /// allocation), each into the smallest bin where some offset overlaps no block placed
    /// there that is live at the same time (the lowest such offset). Errors as
    /// [`StepPlan::pack`].
    pub fn pack(step: &Trace, bins: &[usize]) -> Result<BinPlan> {
        Self::pack_around(step, bins, &[])
    }

    /// Like [`pack`](Self::pack), with the allocations that `fixed` places (same order as the
    /// step's allocations; `None` or missing: not fixed) kept where it says, and the others
    /// packed around them. The fixed places must not overlap in a bin while live together.
    pub fn pack_around(
        step: &Trace,
        bins: &[usize],
        fixed: &[Option<(usize, usize)>],
    ) -> Result<BinPlan> {
        let (requests, blocks, peak) = lifetimes(step)?;
        let mut order: Vec<usize> = (0..bins.len()).collect();
        order.sort_by_key(|&b| (bins[b], b));
        let mut placed: Vec<Vec<(usize, usize, usize, usize)>> = vec![Vec::new(); bins.len()];
        let mut places = vec![None; requests.len()];
        for &(i, size, t0, t1) in &blocks {
            if let Some(&Some((b, offset))) = fixed.get(i) {
                places[i] = Some((b, offset));
                placed[b].push((offset, offset + size, t0, t1));
            }
        }
        for &(i, size, t0, t1) in &blocks {
            if places[i].is_some() {
                continue;
            }
            for &b in order.iter().filter(|&&b| bins[b] >= size) {
                if let Some(offset) = lowest_offset(&placed[b], (size, t0, t1), bins[b]) {
                    places[i] = Some((b, offset));
                    placed[b].push((offset, offset + size, t0, t1));
                    break;
                }
            }
        }
        Ok(BinPlan {
            requests,
            places,
            peak_live_bytes: peak,
        })
    }
}

/// Replays steps through a plan's arena, falling back to a [`Replayer`] (kiln's caching
/// allocator on a simulated device) for steps that deviate.
#[derive(Debug)]
pub struct PlannedReplayer {
    plan: StepPlan,
    fallback: Replayer,
    counts: PlannedCounts,
}

impl PlannedReplayer {
    /// A replayer serving `plan`, with a fallback allocator in `mode` on `capacity` bytes.
    pub fn new(plan: StepPlan, mode: ReplayMode, capacity: usize) -> Result<Self> {
        Ok(Self {
            plan,
            fallback: Replayer::new(mode, capacity)?,
            counts: PlannedCounts::default(),
        })
    }

    /// Replays one step. Returns the arena offset of each allocation served from the arena, in
    /// order (all of them when the step matched the plan).
    pub fn run_step(&mut self, step: &Trace) -> Result<Vec<usize>> {
        let mut served = Vec::new();
        let mut in_arena: HashMap<u64, usize> = HashMap::new();
        let mut rest = Trace::default();
        let mut deviated = false;
        for e in &step.events {
            if !deviated {
                match *e {
                    TraceEvent::Alloc { id, bytes }
                        if self.plan.requests.get(served.len()) == Some(&bytes) =>
                    {
                        let offset = self.plan.offsets[served.len()];
                        served.push(offset);
                        in_arena.insert(id, offset);
                        continue;
                    }
                    TraceEvent::Free { id } if in_arena.remove(&id).is_some() => continue,
                    TraceEvent::Free { .. } => {}
                    TraceEvent::Alloc { .. } => deviated = true,
                }
            } else if let TraceEvent::Free { id } = *e {
                // A block placed before the deviation is freed in the arena, not the fallback.
                if in_arena.remove(&id).is_some() {
                    continue;
                }
            }
            rest.events.push(*e);
        }
        if !deviated && served.len() < self.plan.requests.len() {
            deviated = true;
        }
        if deviated {
            self.counts.fallback_steps += 1;
        } else {
            self.counts.planned_steps += 1;
        }
        self.counts.arena_allocs += served.len() as u64;
        self.fallback.run(&rest)?;
        Ok(served)
    }

    /// The plan.
    pub fn plan(&self) -> &StepPlan {
        &self.plan
    }

    /// Steps and allocations served so far.
    pub fn counts(&self) -> PlannedCounts {
        self.counts
    }

    /// The fallback replayer (its report counts only what did not go to the arena).
    pub fn fallback(&self) -> &Replayer {
        &self.fallback
    }
}
