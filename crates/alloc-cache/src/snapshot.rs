//! `snapshot()`: every segment and its blocks, serialisable to JSON (the shape of
//! `torch.cuda.memory_snapshot()`), and `check_invariants()`, the recomputation that the
//! property tests compare the incrementally kept statistics against.

use crate::allocator::CachingAllocator;
use crate::backend::StreamId;
use crate::block::{pool_index, BlockState, Contribution, State, NONE};
use crate::slab::ARENA_SEGMENT;
use crate::stats::{MemoryStats, PoolKind};
use serde::Serialize;

/// State of one block in a snapshot (PyTorch's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockSnapshotState {
    /// Handed to a caller.
    ActiveAllocated,
    /// Freed, waiting for work on other streams to finish.
    ActivePendingFree,
    /// Free and cached.
    Inactive,
}

/// One block of a segment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BlockSnapshot {
    /// First byte.
    pub address: u64,
    /// Bytes.
    pub size: usize,
    /// Bytes the caller asked for (0 when not allocated).
    pub requested_size: usize,
    /// Allocated, pending or free.
    pub state: BlockSnapshotState,
    /// Whether memory backs all of it (false only for free blocks of expandable segments whose
    /// pages `empty_cache` unmapped).
    pub fully_mapped: bool,
    /// Who asked for an allocated block, when the allocation history recorded it (allocated
    /// while recording was on; see `record_memory_history`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attribution: Option<crate::history::Attribution>,
}

/// One segment and its blocks in address order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SegmentSnapshot {
    /// First byte.
    pub address: u64,
    /// Bytes backed by memory.
    pub total_size: usize,
    /// Bytes in allocated blocks.
    pub allocated_size: usize,
    /// Bytes in allocated or pending blocks.
    pub active_size: usize,
    /// Bytes requested by callers in allocated blocks.
    pub requested_size: usize,
    /// Stream that owns the segment.
    pub stream: StreamId,
    /// `small` or `large`.
    pub segment_type: PoolKind,
    /// Whether this is an expandable segment.
    pub is_expandable: bool,
    /// Reserved address space (expandable segments; 0 otherwise).
    pub address_space: usize,
    /// Blocks in address order.
    pub blocks: Vec<BlockSnapshot>,
}

/// The whole allocator at one moment.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MemorySnapshot {
    /// Segments sorted by address.
    pub segments: Vec<SegmentSnapshot>,
    /// Statistics at the same moment.
    pub stats: MemoryStats,
}

impl MemorySnapshot {
    /// Pretty-printed JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("snapshot types serialise infallibly")
    }
}

impl CachingAllocator {
    /// Every segment with its blocks, and the statistics, taken under one lock.
    pub fn snapshot(&self) -> MemorySnapshot {
        self.with_state(|st| self.snapshot_of(st))
    }

    /// [`snapshot`](Self::snapshot) of state already locked.
    pub(crate) fn snapshot_of(&self, st: &State) -> MemorySnapshot {
        {
            // Only a running history knows the blocks live now.
            let history = st.history.as_ref();
            let mut segments: Vec<SegmentSnapshot> = st
                .segments
                .iter()
                .flatten()
                .map(|s| {
                    let mut out = SegmentSnapshot {
                        address: s.base,
                        total_size: s.mapped,
                        allocated_size: 0,
                        active_size: 0,
                        requested_size: 0,
                        stream: st.streams[s.stream as usize].stream,
                        segment_type: s.pool,
                        is_expandable: s.expandable(),
                        address_space: s.address_space,
                        blocks: Vec::new(),
                    };
                    let mut id = s.head;
                    while id != NONE {
                        let b = &st.blocks[id as usize];
                        let state = match b.state {
                            BlockState::Allocated => BlockSnapshotState::ActiveAllocated,
                            BlockState::Pending => BlockSnapshotState::ActivePendingFree,
                            // Memory a stitched block in use reaches at its own addresses, and
                            // the arena of planned steps: neither is free.
                            BlockState::Lent | BlockState::Arena => {
                                BlockSnapshotState::ActiveAllocated
                            }
                            _ => BlockSnapshotState::Inactive,
                        };
                        if state == BlockSnapshotState::ActiveAllocated {
                            out.allocated_size += b.size;
                            out.requested_size += b.requested;
                        }
                        if state != BlockSnapshotState::Inactive {
                            out.active_size += b.size;
                        }
                        out.blocks.push(BlockSnapshot {
                            address: b.addr,
                            size: b.size,
                            requested_size: b.requested,
                            state,
                            fully_mapped: self.fully_mapped(s, b),
                            attribution: match (state, history) {
                                (BlockSnapshotState::ActiveAllocated, Some(h)) => {
                                    h.attribution_of(b.addr).cloned()
                                }
                                _ => None,
                            },
                        });
                        id = b.next;
                    }
                    out
                })
                .collect();
            segments.sort_by_key(|s| s.address);
            MemorySnapshot {
                segments,
                stats: st.stats.clone(),
            }
        }
    }

    /// Checks every internal invariant and that the statistics equal a recomputation from the
    /// blocks; returns the first violation found. Costs a full walk: meant for tests.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.with_state(|st| check(self, st, self.page))
    }
}

fn check(a: &CachingAllocator, st: &State, page: usize) -> Result<(), String> {
    let mut recomputed = MemoryStats::default();
    let mut free_blocks = 0usize;
    let mut reserved = [0i64; 2];
    let mut segments = [0i64; 2];
    for (si, s) in st.segments.iter().enumerate() {
        let Some(s) = s else { continue };
        segments[pool_index(s.pool)] += 1;
        reserved[pool_index(s.pool)] += s.mapped as i64;
        if s.expandable() {
            let pages = s.extent / page;
            let mapped = s.pages.count_in(0, pages);
            let total = s.pages.total();
            let beyond = total != mapped;
            if s.extent % page != 0 || s.extent > s.address_space || beyond {
                return Err(format!(
                    "segment {si}: extent {} or pages beyond it",
                    s.extent
                ));
            }
            if mapped * page != s.mapped || pages - mapped != s.holes {
                return Err(format!(
                    "segment {si}: {mapped} pages mapped, {} holes, but mapped={} holes={}",
                    pages - mapped,
                    s.mapped,
                    s.holes
                ));
            }
        } else if s.extent != s.mapped {
            return Err(format!("segment {si}: fixed segment with extent != mapped"));
        }
        let (mut id, mut prev, mut addr, mut prev_free) = (s.head, NONE, s.base, false);
        while id != NONE {
            let b = &st.blocks[id as usize];
            let here = format!("segment {si} block {id} at {:#x}", b.addr);
            if b.state == BlockState::Dead || b.segment != si as u32 || b.prev != prev {
                return Err(format!("{here}: dead or mislinked ({b:?})"));
            }
            if b.addr != addr || b.size == 0 || !b.size.is_multiple_of(crate::MIN_BLOCK) {
                return Err(format!(
                    "{here}: expected address {addr:#x}, size {}",
                    b.size
                ));
            }
            if b.pool != s.pool || b.stream != s.stream {
                return Err(format!("{here}: pool/stream differ from its segment"));
            }
            let free = b.state == BlockState::Free;
            if free && prev_free {
                return Err(format!(
                    "{here}: two adjacent free blocks were not coalesced"
                ));
            }
            if free {
                free_blocks += 1;
                let pool = &st.streams[b.stream as usize].free[pool_index(b.pool)];
                if !pool.contains(&st.blocks, id) {
                    return Err(format!("{here}: free block missing from its pool"));
                }
            }
            if s.expandable() {
                if let Some(problem) = a.check_stitch_block(st, s, b) {
                    return Err(format!("{here}: {problem}"));
                }
            }
            if b.state == BlockState::Allocated && b.requested > b.size {
                return Err(format!(
                    "{here}: requested {} > block {}",
                    b.requested, b.size
                ));
            }
            Contribution::default().apply_change(Contribution::of(b), &mut recomputed, b.pool);
            prev_free = free;
            addr += b.size as u64;
            prev = id;
            id = b.next;
        }
        if s.tail != prev || addr != s.base + s.extent as u64 {
            return Err(format!(
                "segment {si}: blocks end at {addr:#x}, tail {} vs {prev}",
                s.tail
            ));
        }
    }
    if let Some(problem) = a.check_stitched(st).or_else(|| a.check_planner(st)) {
        return Err(problem);
    }
    // Stitched blocks and arena blocks lie in no segment's list.
    for b in st.blocks.iter().filter(|b| b.segment >= ARENA_SEGMENT) {
        Contribution::default().apply_change(Contribution::of(b), &mut recomputed, b.pool);
    }
    let pooled: usize = st
        .streams
        .iter()
        .flat_map(|s| s.free.iter())
        .map(|m| m.len())
        .sum();
    if pooled != free_blocks {
        return Err(format!(
            "{pooled} pool entries but {free_blocks} free blocks"
        ));
    }
    let mine = &st.stats;
    for ((name, a), (_, b)) in mine.arrays().iter().zip(recomputed.arrays().iter()) {
        if matches!(*name, "segment" | "reserved_bytes") {
            continue;
        }
        for pool in [PoolKind::Small, PoolKind::Large] {
            if a.pool(pool).current != b.pool(pool).current {
                return Err(format!(
                    "{name}.{}: kept {} but recomputed {}",
                    pool.stat_name(),
                    a.pool(pool).current,
                    b.pool(pool).current
                ));
            }
        }
        if a.all.current != a.small_pool.current + a.large_pool.current {
            return Err(format!("{name}.all is not the sum of its pools"));
        }
    }
    for pool in [PoolKind::Small, PoolKind::Large] {
        let p = pool_index(pool);
        if mine.reserved_bytes.pool(pool).current != reserved[p]
            || mine.segment.pool(pool).current != segments[p]
        {
            return Err(format!(
                "reserved/segment stats of {} differ from segments",
                pool.stat_name()
            ));
        }
    }
    Ok(())
}
