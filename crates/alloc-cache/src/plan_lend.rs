//! Lending a planned step's idle bin space to kernel scratch (`planner.rs`, "Lending").
//!
//! A plan holds its bins for the whole step, but at any moment only part of each is taken by
//! live planned blocks. Scratch taken under [`StepThread::OUTSIDE`](crate::StepThread::OUTSIDE)
//! (a kernel's parallel tasks, one piece per task in flight, freed before the op returns) is
//! not in the plan; when the cache has no free block for it, it is lent such an idle stretch
//! instead of the cache mapping a new segment beside the idle bins.
//!
//! Invariants: a lent block lies inside one bin of its pool and stream and overlaps no live
//! planned or lent block when it is lent; it is a block of segment
//! [`ARENA_SEGMENT`](crate::slab::ARENA_SEGMENT) recorded in `Active::live` and
//! `Active::lent`, counted in the statistics as a planned block is, and freed through the
//! same path; a planned allocation whose place it still holds is served by the cache
//! (`planner.rs`), so no two live blocks ever overlap.

use crate::allocator::CachingAllocator;
use crate::block::{BlockState, State};
use crate::plan_state::{Active, StepThread};
use crate::stats::PoolKind;
use std::cmp::Reverse;

impl CachingAllocator {
    /// Lends `rounded` bytes of an idle bin stretch to a request of `size` made under
    /// [`StepThread::OUTSIDE`] while a plan is being served: the block (taken), or `None` when
    /// this is not such a request or no bin of `pool` on stream `si` has a stretch that long.
    pub(crate) fn lend_from_plan(
        &self,
        st: &mut State,
        si: u16,
        pool: PoolKind,
        rounded: usize,
        size: usize,
    ) -> Option<u32> {
        if !serving_scratch(st) {
            return None;
        }
        let a = st.planner.as_ref()?.active.as_ref()?;
        let bins: Vec<(u64, u64)> = a
            .bins
            .iter()
            .map(|&b| &st.blocks[b as usize])
            .filter(|b| b.state == BlockState::Arena && b.pool == pool && b.stream == si)
            .map(|b| (b.addr, b.addr + b.size as u64))
            .collect();
        let addr = pick_stretch(a, &bins, rounded)?;
        let id = st.take_arena_block(addr, rounded, size, pool, si);
        let p = st.planner.as_mut()?;
        p.counts.lent_allocs += 1;
        p.active.as_mut()?.lent.insert(addr);
        Some(id)
    }
}

/// Whether the caller takes scratch (under [`StepThread::OUTSIDE`]) while a plan is being
/// served: such a request is lent bin space when it can be, and a miss gets a segment of its
/// own size rounded to whole pages, not padded with copies (later scratch borrows the bins).
pub(crate) fn serving_scratch(st: &State) -> bool {
    let active = st.planner.as_ref().and_then(|p| p.active.as_ref());
    active.is_some_and(|a| !a.dropped && !a.deviated)
        && StepThread::current() == StepThread::OUTSIDE
}

/// How a place to lend ranks: its first planned use, then the stretch's length and the
/// address, each reversed so that the larger rank is the better place.
type Rank = (usize, Reverse<u64>, Reverse<u64>);

/// Where in `bins` (address ranges) to lend `bytes`: among the idle stretches long enough
/// (a bin's range less its live blocks), at either end of one, the place whose first overlap
/// with a planned block still to come in the step is latest (none at all is best); ties go to
/// the shortest stretch, then the lowest address.
fn pick_stretch(a: &Active, bins: &[(u64, u64)], bytes: usize) -> Option<u64> {
    let bytes = bytes as u64;
    // Planned places of the rest of the step: (start, end, index).
    let ahead: Vec<(u64, u64, usize)> = (a.next..a.requests.len())
        .filter_map(|k| {
            let at = match a.places[k] {
                Some((addr, _)) => addr,
                None => {
                    let s = a.spare.as_ref()?;
                    s.base? + s.offsets[k]? as u64
                }
            };
            Some((at, at + crate::round_size(a.requests[k]) as u64, k))
        })
        .collect();
    // `ahead` is in step order, so the first overlap found is the first use.
    let first_use = |lo: u64| {
        let hi = lo + bytes;
        ahead
            .iter()
            .find(|&&(s, e, _)| s < hi && e > lo)
            .map_or(usize::MAX, |&(.., k)| k)
    };
    // (first planned use, shortest stretch, lowest address) -> the address.
    let mut best: Option<(Rank, u64)> = None;
    for &(lo, hi) in bins {
        let mut cursor = lo;
        let mut stretches = Vec::new();
        for (&s, &e) in a.live.range(lo..hi) {
            if s > cursor {
                stretches.push((cursor, s));
            }
            cursor = cursor.max(e);
        }
        if cursor < hi {
            stretches.push((cursor, hi));
        }
        for (s, e) in stretches.into_iter().filter(|&(s, e)| e - s >= bytes) {
            for at in [s, e - bytes] {
                let key = (first_use(at), Reverse(e - s), Reverse(at));
                if best.as_ref().is_none_or(|(k, _)| key > *k) {
                    best = Some((key, at));
                }
            }
        }
    }
    best.map(|(_, at)| at)
}
