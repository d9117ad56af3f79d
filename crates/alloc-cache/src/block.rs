//! Blocks, segments and the per-stream pools: the data the allocator's lock protects, and the
//! primitive moves on it (take a block with an optional split, free a block with coalescing).
//!
//! Blocks and segments live in slabs (`Vec`s indexed by `u32`), linked into a doubly linked list
//! per segment in address order. A free block sits in exactly one pool's [`FreeIndex`]
//! (segregated size classes, see `free_index.rs`). Statistics are maintained by diffing the
//! contribution of every touched block before and after a move, so they cannot drift from what
//! a recomputation over the blocks would give (the property tests check exactly that).

use crate::backend::{EventId, StreamId};
use crate::free_index::FreeIndex;
pub(crate) use crate::slab::{Block, BlockState, NONE};
use crate::stats::{MemoryStats, PoolKind};
use crate::trace::TraceRecorder;

#[derive(Debug, Clone)]
pub(crate) struct Segment {
    pub base: u64,
    /// Bytes backed by memory (the whole segment for fixed segments).
    pub mapped: usize,
    /// Bytes covered by blocks (`mapped` plus holes for expandable segments).
    pub extent: usize,
    /// Reserved address space of an expandable segment; 0 for a fixed segment.
    pub address_space: usize,
    /// Expandable segments: the mapped pages, as runs (empty for fixed segments).
    pub pages: crate::page_runs::PageRuns,
    /// Expandable segments: unmapped pages below `extent` (those of its `Unmapped` blocks).
    pub holes: usize,
    pub pool: PoolKind,
    pub stream: u16,
    pub head: u32,
    pub tail: u32,
}

impl Segment {
    pub fn expandable(&self) -> bool {
        self.address_space > 0
    }
}

/// The free blocks of one stream: one ordered map per pool, plus its expandable segments.
#[derive(Debug)]
pub(crate) struct StreamPools {
    pub stream: StreamId,
    pub free: [FreeIndex; 2],
    pub expandable: [u32; 2],
}

pub(crate) fn pool_index(pool: PoolKind) -> usize {
    match pool {
        PoolKind::Small => 0,
        PoolKind::Large => 1,
    }
}

/// What one block adds to the current value of each block statistic.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Contribution {
    allocation: i64,
    allocated_bytes: i64,
    requested_bytes: i64,
    active: i64,
    active_bytes: i64,
    inactive_split: i64,
    inactive_split_bytes: i64,
}

impl std::ops::Add for Contribution {
    type Output = Contribution;
    fn add(self, o: Contribution) -> Contribution {
        Contribution {
            allocation: self.allocation + o.allocation,
            allocated_bytes: self.allocated_bytes + o.allocated_bytes,
            requested_bytes: self.requested_bytes + o.requested_bytes,
            active: self.active + o.active,
            active_bytes: self.active_bytes + o.active_bytes,
            inactive_split: self.inactive_split + o.inactive_split,
            inactive_split_bytes: self.inactive_split_bytes + o.inactive_split_bytes,
        }
    }
}

impl Contribution {
    pub fn of(b: &Block) -> Contribution {
        let size = b.size as i64;
        match b.state {
            BlockState::Allocated => Contribution {
                allocation: 1,
                allocated_bytes: size,
                requested_bytes: b.requested as i64,
                active: 1,
                active_bytes: size,
                ..Contribution::default()
            },
            BlockState::Pending => Contribution {
                active: 1,
                active_bytes: size,
                ..Contribution::default()
            },
            BlockState::Free if b.prev != NONE || b.next != NONE => Contribution {
                inactive_split: 1,
                inactive_split_bytes: size,
                ..Contribution::default()
            },
            BlockState::Free
            | BlockState::Unmapped
            | BlockState::Lent
            | BlockState::Arena
            | BlockState::Dead => Contribution::default(),
        }
    }

    /// Applies `after - self` to `stats` for `pool`.
    pub fn apply_change(self, after: Contribution, stats: &mut MemoryStats, pool: PoolKind) {
        stats
            .allocation
            .update(pool, after.allocation - self.allocation);
        stats
            .allocated_bytes
            .update(pool, after.allocated_bytes - self.allocated_bytes);
        stats
            .requested_bytes
            .update(pool, after.requested_bytes - self.requested_bytes);
        stats.active.update(pool, after.active - self.active);
        stats
            .active_bytes
            .update(pool, after.active_bytes - self.active_bytes);
        stats
            .inactive_split
            .update(pool, after.inactive_split - self.inactive_split);
        stats
            .inactive_split_bytes
            .update(pool, after.inactive_split_bytes - self.inactive_split_bytes);
    }
}

/// Everything behind the allocator's mutex.
#[derive(Debug, Default)]
pub(crate) struct State {
    pub blocks: Vec<Block>,
    pub free_block_slots: Vec<u32>,
    pub segments: Vec<Option<Segment>>,
    pub free_segment_slots: Vec<u32>,
    pub streams: Vec<StreamPools>,
    pub stats: MemoryStats,
    pub pending: Vec<(EventId, u32)>,
    /// The other streams each allocated block was used on (`record_stream`), by block; empty,
    /// the hit path's only test, while no block has any.
    pub stream_uses: std::collections::HashMap<u32, Vec<StreamId>>,
    pub clock: u64,
    pub next_alloc_id: u64,
    pub recorder: Option<TraceRecorder>,
    /// The allocation history while it is recorded (`None`, the hooks' only test, when off).
    pub history: Option<Box<crate::ring::Recorder>>,
    /// The last history after recording stopped, kept for reading.
    pub history_kept: Option<Box<crate::ring::Recorder>>,
    /// What a memory plan predicted (for the out-of-memory report).
    pub plan_prediction: Option<Box<crate::history::PlanPrediction>>,
    /// Stitched blocks, in use and cached (`stitched.rs`).
    pub stitched: crate::stitched_state::StitchedCache,
    /// Planned steps, once `mark_step` was called with `planned_steps` on (`planner.rs`).
    pub planner: Option<Box<crate::plan_state::Planner>>,
}

impl State {
    /// Index of `stream`'s pools, creating them on first use. Streams are few, so a linear scan
    /// beats hashing.
    #[inline(always)]
    pub fn stream_index(&mut self, stream: StreamId) -> u16 {
        if let Some(i) = self.streams.iter().position(|s| s.stream == stream) {
            return i as u16;
        }
        self.streams.push(StreamPools {
            stream,
            free: [FreeIndex::default(), FreeIndex::default()],
            expandable: [NONE, NONE],
        });
        (self.streams.len() - 1) as u16
    }

    pub fn contribution(&self, id: u32) -> Contribution {
        if id == NONE {
            return Contribution::default();
        }
        Contribution::of(&self.blocks[id as usize])
    }

    pub fn new_block(&mut self, block: Block) -> u32 {
        match self.free_block_slots.pop() {
            Some(id) => {
                self.blocks[id as usize] = block;
                id
            }
            None => {
                self.blocks.push(block);
                (self.blocks.len() - 1) as u32
            }
        }
    }

    pub fn kill_block(&mut self, id: u32) {
        let b = &mut self.blocks[id as usize];
        b.state = BlockState::Dead;
        self.free_block_slots.push(id);
    }

    pub fn new_segment(&mut self, segment: Segment) -> u32 {
        match self.free_segment_slots.pop() {
            Some(id) => {
                self.segments[id as usize] = Some(segment);
                id
            }
            None => {
                self.segments.push(Some(segment));
                (self.segments.len() - 1) as u32
            }
        }
    }

    pub fn segment(&self, id: u32) -> &Segment {
        self.segments[id as usize].as_ref().expect("live segment")
    }

    pub fn segment_mut(&mut self, id: u32) -> &mut Segment {
        self.segments[id as usize].as_mut().expect("live segment")
    }

    #[inline]
    pub fn pool_insert(&mut self, id: u32) {
        let b = &self.blocks[id as usize];
        let index = &mut self.streams[b.stream as usize].free[pool_index(b.pool)];
        index.insert(&mut self.blocks, id);
    }

    #[inline]
    pub fn pool_remove(&mut self, id: u32) {
        let b = &self.blocks[id as usize];
        let index = &mut self.streams[b.stream as usize].free[pool_index(b.pool)];
        index.remove(&mut self.blocks, id);
    }

    /// Cuts free block `id` (out of its pool) to `keep` bytes; the rest becomes a new free block
    /// in the pool, returned. Statistics are the caller's to update.
    #[inline(always)]
    pub fn split_tail(&mut self, id: u32, keep: usize) -> u32 {
        let b = &self.blocks[id as usize];
        let remainder = Block {
            addr: b.addr + keep as u64,
            size: b.size - keep,
            requested: 0,
            segment: b.segment,
            prev: id,
            next: b.next,
            state: BlockState::Free,
            pool: b.pool,
            stream: b.stream,
            pending_events: 0,
            freed_at: b.freed_at,
            alloc_id: 0,
            free_prev: NONE,
            free_next: NONE,
        };
        let (next, segment) = (b.next, b.segment);
        let rest = self.new_block(remainder);
        if next == NONE {
            self.segment_mut(segment).tail = rest;
        } else {
            self.blocks[next as usize].prev = rest;
        }
        let b = &mut self.blocks[id as usize];
        b.next = rest;
        b.size = keep;
        self.pool_insert(rest);
        rest
    }

    /// Hands out free block `id` (already out of its pool) for a request of `rounded` bytes,
    /// splitting the tail off into a new free block when `split` says so.
    pub fn take(&mut self, id: u32, rounded: usize, requested: usize, split: bool) {
        let before = self.contribution(id);
        let rest = if split {
            self.split_tail(id, rounded)
        } else {
            NONE
        };
        self.next_alloc_id += 1;
        let alloc_id = self.next_alloc_id;
        let b = &mut self.blocks[id as usize];
        b.state = BlockState::Allocated;
        b.requested = requested;
        b.alloc_id = alloc_id;
        let pool = b.pool;
        let after = self.contribution(id) + self.contribution(rest);
        before.apply_change(after, &mut self.stats, pool);
        if let Some(r) = self.recorder.as_mut() {
            r.record_alloc(alloc_id, requested);
        }
    }

    /// Returns allocated or pending block `id` to its pool, merging it with free neighbours (a
    /// stitched block goes back to the stitched cache instead and returns its lent pages).
    pub fn free_block(&mut self, id: u32) {
        match self.blocks[id as usize].segment {
            crate::slab::ALIAS_SEGMENT => return self.free_stitched(id),
            crate::slab::ARENA_SEGMENT => return self.free_arena_block(id),
            _ => {}
        }
        let (prev, next, pool) = {
            let b = &self.blocks[id as usize];
            (b.prev, b.next, b.pool)
        };
        let is_free =
            |s: &State, n: u32| n != NONE && s.blocks[n as usize].state == BlockState::Free;
        let merge_prev = is_free(self, prev);
        let merge_next = is_free(self, next);
        let mut before = self.contribution(id);
        if merge_prev {
            before = before + self.contribution(prev);
            self.pool_remove(prev);
        }
        if merge_next {
            before = before + self.contribution(next);
            self.pool_remove(next);
        }
        if merge_prev {
            let p = &self.blocks[prev as usize];
            let (p_addr, p_size, p_prev, p_segment) = (p.addr, p.size, p.prev, p.segment);
            let b = &mut self.blocks[id as usize];
            b.addr = p_addr;
            b.size += p_size;
            b.prev = p_prev;
            if p_prev == NONE {
                self.segment_mut(p_segment).head = id;
            } else {
                self.blocks[p_prev as usize].next = id;
            }
            self.kill_block(prev);
        }
        if merge_next {
            let n = &self.blocks[next as usize];
            let (n_size, n_next, n_segment) = (n.size, n.next, n.segment);
            let b = &mut self.blocks[id as usize];
            b.size += n_size;
            b.next = n_next;
            if n_next == NONE {
                self.segment_mut(n_segment).tail = id;
            } else {
                self.blocks[n_next as usize].prev = id;
            }
            self.kill_block(next);
        }
        let clock = self.clock;
        let b = &mut self.blocks[id as usize];
        b.state = BlockState::Free;
        b.requested = 0;
        b.freed_at = clock;
        self.pool_insert(id);
        let after = self.contribution(id);
        before.apply_change(after, &mut self.stats, pool);
    }
}
