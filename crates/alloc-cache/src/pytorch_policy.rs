//! A model of PyTorch's CUDA caching allocator policy, so a [`Trace`] can be replayed under
//! PyTorch's rules next to kiln's (`cargo xtask replay FILE --policy pytorch`, the fragmentation
//! rows of `cargo xtask bench alloc`).
//!
//! Written from the documented behaviour of `c10/cuda/CUDACachingAllocator.cpp` (no code taken
//! from it), on one stream:
//! - requests are rounded up to 512 bytes; at most 1 MiB goes to the small pool, more to the
//!   large pool; a zero-byte request takes no block;
//! - best fit: the smallest free block of the pool that holds the request, ties to the lowest
//!   address;
//! - on a miss a new segment: 2 MiB for small requests, 20 MiB for requests under 10 MiB, the
//!   request rounded up to 2 MiB otherwise;
//! - the allocated part is the front of the block; the rest is split off when at least 512
//!   bytes remain (small pool, and every block in expandable mode) or more than 1 MiB remain
//!   (large pool, and only for requests under `max_split_size`);
//! - blocks of at least `max_split_size` (default unlimited) are not handed to smaller
//!   requests, and a request of at least that size takes only a block less than 20 MiB larger;
//! - a freed block merges with free neighbours of its segment at once;
//! - when the device is full: every wholly free segment is released (in expandable mode every
//!   whole free chunk is unmapped) and the request is retried once, then it fails;
//! - expandable segments: one segment per pool reserving address space, mapped in chunks of
//!   2 MiB (small pool) or 20 MiB (large pool); a miss maps chunks at the lowest address where
//!   free and unmapped space together hold the request; best fit counts a free block followed
//!   by unmapped space as that much larger (so blocks inside the mapped part are preferred);
//!   nothing is unmapped before an out-of-memory retry.
//!
//! Reserved bytes are segments held (mapped chunks in expandable mode); backend calls are
//! `cudaMalloc` / `cudaFree` (chunk maps / unmaps).
//!
//! Invariants: adjacent blocks of a segment are never both free and mapped (they merge), nor
//! both unmapped; every free mapped block is in its pool's size index and every unmapped block in
//! its pool's address index, and no other block is; unmapped blocks start and end on chunk
//! boundaries; reserved bytes equal the sum of mapped segment bytes.

use crate::replay_report::{ReplayMode, ReplayReport};
use crate::trace::{Trace, TraceEvent};
use std::collections::{BTreeSet, HashMap};

const MIN_BLOCK: usize = 512;
const SMALL_SIZE: usize = 1 << 20;
const SMALL_BUFFER: usize = 2 << 20;
const LARGE_BUFFER: usize = 20 << 20;
const MIN_LARGE_ALLOC: usize = 10 << 20;
const ROUND_LARGE: usize = 2 << 20;
const NONE: u32 = u32::MAX;

#[derive(Debug, Clone)]
struct Block {
    addr: u64,
    size: usize,
    allocated: bool,
    mapped: bool,
    prev: u32,
    next: u32,
    pool: usize,
}

/// PyTorch's allocator as a replay policy over a simulated device of `capacity` bytes.
#[derive(Debug)]
pub struct PyTorchPolicy {
    expandable: bool,
    max_split: usize,
    capacity: usize,
    blocks: Vec<Block>,
    free_slots: Vec<u32>,
    /// Free mapped blocks per pool (0 small, 1 large) by (size, address).
    free: [BTreeSet<(usize, u64, u32)>; 2],
    /// Unmapped blocks per pool by address (expandable mode).
    unmapped: [BTreeSet<(u64, u32)>; 2],
    next_addr: u64,
    reserved: usize,
    peak_reserved: usize,
    device_allocs: u64,
    device_frees: u64,
    retries: u64,
    ooms: u64,
    live: HashMap<u64, (u32, usize)>,
    failed: std::collections::HashSet<u64>,
    live_bytes: usize,
    peak_live: usize,
    events: usize,
}

fn chunk(pool: usize) -> usize {
    if pool == 0 {
        SMALL_BUFFER
    } else {
        LARGE_BUFFER
    }
}

fn round_up(x: u64, to: usize) -> u64 {
    x.div_ceil(to as u64) * to as u64
}

impl PyTorchPolicy {
    /// PyTorch's defaults (`max_split_size` unlimited) in `mode` on a device of `capacity` bytes.
    pub fn new(mode: ReplayMode, capacity: usize) -> Self {
        Self::with_max_split(mode, capacity, None)
    }

    /// Like [`new`](Self::new) with `max_split_size` bytes (`None`: unlimited).
    pub fn with_max_split(mode: ReplayMode, capacity: usize, max_split: Option<usize>) -> Self {
        Self {
            expandable: mode == ReplayMode::Expandable,
            max_split: max_split.unwrap_or(usize::MAX),
            capacity,
            blocks: Vec::new(),
            free_slots: Vec::new(),
            free: [BTreeSet::new(), BTreeSet::new()],
            unmapped: [BTreeSet::new(), BTreeSet::new()],
            next_addr: 1 << 40,
            reserved: 0,
            peak_reserved: 0,
            device_allocs: 0,
            device_frees: 0,
            retries: 0,
            ooms: 0,
            live: HashMap::new(),
            failed: std::collections::HashSet::new(),
            live_bytes: 0,
            peak_live: 0,
            events: 0,
        }
    }

    /// Replays every event of `trace`; an allocation that does not fit is counted in `ooms` and
    /// its free skipped. An id freed but never allocated is an error naming it.
    pub fn run(&mut self, trace: &Trace) -> crate::Result<()> {
        for e in &trace.events {
            self.events += 1;
            match *e {
                TraceEvent::Alloc { id, bytes } => {
                    let block = if bytes == 0 {
                        Some(NONE)
                    } else {
                        self.malloc(bytes)
                    };
                    match block {
                        Some(b) => {
                            if self.live.insert(id, (b, bytes)).is_some() {
                                return Err(crate::Error::TraceParse {
                                    line: 0,
                                    message: format!("id {id} allocated twice; free it first"),
                                });
                            }
                            self.live_bytes += bytes;
                            self.peak_live = self.peak_live.max(self.live_bytes);
                        }
                        None => {
                            self.ooms += 1;
                            self.failed.insert(id);
                        }
                    }
                }
                TraceEvent::Free { id } => match self.live.remove(&id) {
                    Some((b, bytes)) => {
                        self.live_bytes -= bytes;
                        if b != NONE {
                            self.free_block(b);
                        }
                    }
                    None if self.failed.remove(&id) => {}
                    None => {
                        return Err(crate::Error::TraceParse {
                            line: 0,
                            message: format!("free of unknown id {id}"),
                        })
                    }
                },
            }
        }
        Ok(())
    }

    /// The figures so far, in the form kiln's replay reports them.
    pub fn report(&self) -> ReplayReport {
        ReplayReport {
            events: self.events,
            peak_live_bytes: self.peak_live,
            peak_reserved_bytes: self.peak_reserved,
            reserved_over_live: if self.peak_live == 0 {
                0.0
            } else {
                self.peak_reserved as f64 / self.peak_live as f64
            },
            device_allocs: self.device_allocs,
            device_frees: self.device_frees,
            alloc_retries: self.retries,
            ooms: self.ooms,
        }
    }

    /// Bytes reserved now.
    pub fn reserved_bytes(&self) -> usize {
        self.reserved
    }

    fn new_block(&mut self, b: Block) -> u32 {
        if let Some(i) = self.free_slots.pop() {
            self.blocks[i as usize] = b;
            i
        } else {
            self.blocks.push(b);
            (self.blocks.len() - 1) as u32
        }
    }

    fn index_insert(&mut self, id: u32) {
        let b = &self.blocks[id as usize];
        if b.mapped {
            self.free[b.pool].insert((b.size, b.addr, id));
        } else {
            self.unmapped[b.pool].insert((b.addr, id));
        }
    }

    fn index_remove(&mut self, id: u32) {
        let b = &self.blocks[id as usize];
        if b.mapped {
            self.free[b.pool].remove(&(b.size, b.addr, id));
        } else {
            self.unmapped[b.pool].remove(&(b.addr, id));
        }
    }

    fn grow_reserved(&mut self, bytes: usize) {
        self.reserved += bytes;
        self.peak_reserved = self.peak_reserved.max(self.reserved);
        self.device_allocs += 1;
    }

    /// Rounded request -> allocated block id, or `None` when the device is full.
    fn malloc(&mut self, bytes: usize) -> Option<u32> {
        let size = bytes.div_ceil(MIN_BLOCK) * MIN_BLOCK;
        let pool = usize::from(size > SMALL_SIZE);
        let id = match self.get_free_block(pool, size) {
            Some(id) => id,
            None => match self.alloc_block(pool, size) {
                Some(id) => id,
                None => {
                    self.release_cached_blocks();
                    self.retries += 1;
                    self.alloc_block(pool, size)?
                }
            },
        };
        Some(self.take(id, size))
    }

    fn get_free_block(&mut self, pool: usize, size: usize) -> Option<u32> {
        let mut it = self.free[pool].range((size, 0, 0)..);
        let mut best = *it.next()?;
        if self.expandable {
            let grown = |s: &Self, id: u32| {
                let b = &s.blocks[id as usize];
                let tail = match b.next {
                    NONE => 0,
                    n if !s.blocks[n as usize].mapped => s.blocks[n as usize].size,
                    _ => 0,
                };
                b.size + tail
            };
            for &next in it {
                if grown(self, next.2) < grown(self, best.2) {
                    best = next;
                } else {
                    break;
                }
            }
        }
        let found = best.0;
        if (size < self.max_split && found >= self.max_split)
            || (size >= self.max_split && found >= size + LARGE_BUFFER)
        {
            return None;
        }
        self.free[pool].remove(&best);
        Some(best.2)
    }

    /// A new segment (or newly mapped chunks) holding at least `size`, out of the index.
    fn alloc_block(&mut self, pool: usize, size: usize) -> Option<u32> {
        if self.expandable {
            return self.allocate_expandable(pool, size);
        }
        let segment = if size <= SMALL_SIZE {
            SMALL_BUFFER
        } else if size < MIN_LARGE_ALLOC {
            LARGE_BUFFER
        } else {
            size.div_ceil(ROUND_LARGE) * ROUND_LARGE
        };
        if self.reserved.checked_add(segment)? > self.capacity {
            return None;
        }
        let addr = self.next_addr;
        self.next_addr += segment as u64;
        self.grow_reserved(segment);
        Some(self.new_block(Block {
            addr,
            size: segment,
            allocated: false,
            mapped: true,
            prev: NONE,
            next: NONE,
            pool,
        }))
    }

    /// Merges free block `src` into `dst` when both are free and equally mapped; `dst` must be
    /// out of its index, `src` is taken out of its own.
    fn try_merge(&mut self, dst: u32, src: u32) {
        if src == NONE {
            return;
        }
        let (s, d) = (&self.blocks[src as usize], &self.blocks[dst as usize]);
        if s.allocated || s.mapped != d.mapped {
            return;
        }
        self.index_remove(src);
        let s = self.blocks[src as usize].clone();
        let d = &mut self.blocks[dst as usize];
        if d.prev == src {
            d.addr = s.addr;
            d.prev = s.prev;
            if s.prev != NONE {
                self.blocks[s.prev as usize].next = dst;
            }
        } else {
            d.next = s.next;
            if s.next != NONE {
                self.blocks[s.next as usize].prev = dst;
            }
        }
        self.blocks[dst as usize].size += s.size;
        self.free_slots.push(src);
    }

    /// Splits the tail of block `id` (out of the index) past `size` bytes off as a new block
    /// with the same mapping, linked after it and indexed when free.
    fn split_off(&mut self, id: u32, size: usize) -> u32 {
        let b = self.blocks[id as usize].clone();
        let rest = self.new_block(Block {
            addr: b.addr + size as u64,
            size: b.size - size,
            allocated: false,
            mapped: b.mapped,
            prev: id,
            next: b.next,
            pool: b.pool,
        });
        if b.next != NONE {
            self.blocks[b.next as usize].prev = rest;
        }
        let d = &mut self.blocks[id as usize];
        d.next = rest;
        d.size = size;
        self.index_insert(rest);
        rest
    }

    /// Hands out the front `size` bytes of free block `id` (out of the index).
    fn take(&mut self, id: u32, size: usize) -> u32 {
        let b = &self.blocks[id as usize];
        let remaining = b.size - size;
        let split = if b.pool == 0 || self.expandable {
            remaining >= MIN_BLOCK
        } else {
            size < self.max_split && remaining > SMALL_SIZE
        };
        if split {
            self.split_off(id, size);
        }
        self.blocks[id as usize].allocated = true;
        id
    }

    fn free_block(&mut self, id: u32) {
        self.blocks[id as usize].allocated = false;
        let (prev, next) = (self.blocks[id as usize].prev, self.blocks[id as usize].next);
        self.try_merge(id, prev);
        self.try_merge(id, next);
        self.index_insert(id);
    }

    /// Expandable mode: the lowest block where free and unmapped space hold `size`, with
    /// chunks mapped until it does; out of the index. `None` when the device is full.
    fn allocate_expandable(&mut self, pool: usize, size: usize) -> Option<u32> {
        let mut candidate = self.find_expandable(pool, size)?;
        if !self.blocks[candidate as usize].mapped {
            let want = size.min(self.blocks[candidate as usize].size);
            candidate = self.map_block(candidate, want)?;
        }
        while self.blocks[candidate as usize].size < size {
            let remaining = size - self.blocks[candidate as usize].size;
            let next = self.blocks[candidate as usize].next;
            let want = remaining.min(self.blocks[next as usize].size);
            candidate = self.map_block(next, want)?;
        }
        self.index_remove(candidate);
        Some(candidate)
    }

    fn find_expandable(&mut self, pool: usize, size: usize) -> Option<u32> {
        let free_at = |s: &Self, b: u32| b != NONE && !s.blocks[b as usize].allocated;
        for &(_, id) in &self.unmapped[pool] {
            let mut c = id;
            let prev = self.blocks[c as usize].prev;
            if free_at(self, prev) {
                c = prev;
            }
            let (mut bytes, mut b) = (0, c);
            while bytes < size && free_at(self, b) {
                bytes += self.blocks[b as usize].size;
                b = self.blocks[b as usize].next;
            }
            if bytes >= size {
                return Some(c);
            }
        }
        // PyTorch reserves address space for the device's memory and an eighth more.
        let step = chunk(pool);
        let extent = round_up((self.capacity + self.capacity / 8) as u64, step);
        if extent < size as u64 {
            return None;
        }
        let addr = round_up(self.next_addr, step);
        self.next_addr = addr + extent;
        let id = self.new_block(Block {
            addr,
            size: extent as usize,
            allocated: false,
            mapped: false,
            prev: NONE,
            next: NONE,
            pool,
        });
        self.index_insert(id);
        Some(id)
    }

    /// Maps the chunks covering the first `size` bytes of unmapped block `id`; returns the
    /// free mapped block they join (in the index). `None` when the device is full.
    fn map_block(&mut self, id: u32, size: usize) -> Option<u32> {
        let b = &self.blocks[id as usize];
        let mapped = (round_up(size as u64, chunk(b.pool)) as usize).min(b.size);
        if self.reserved.checked_add(mapped)? > self.capacity {
            return None;
        }
        self.index_remove(id);
        if mapped < self.blocks[id as usize].size {
            self.split_off(id, mapped);
        }
        self.blocks[id as usize].mapped = true;
        let (prev, next) = (self.blocks[id as usize].prev, self.blocks[id as usize].next);
        self.try_merge(id, prev);
        self.try_merge(id, next);
        self.index_insert(id);
        self.grow_reserved(mapped);
        Some(id)
    }

    /// Unmaps the whole chunks inside free mapped block `id` (in the index).
    fn unmap_block(&mut self, id: u32) {
        let b = self.blocks[id as usize].clone();
        let step = chunk(b.pool);
        let lo = round_up(b.addr, step);
        let hi = (b.addr + b.size as u64) / step as u64 * step as u64;
        if hi <= lo {
            return;
        }
        self.index_remove(id);
        let mut middle = id;
        if lo > b.addr {
            middle = self.split_off(id, (lo - b.addr) as usize);
            self.index_remove(middle);
        }
        if hi < b.addr + b.size as u64 {
            self.split_off(middle, (hi - lo) as usize);
        }
        if middle != id {
            // The front before the first whole chunk stays free and mapped.
            self.index_insert(id);
        }
        self.blocks[middle as usize].mapped = false;
        let (prev, next) = (
            self.blocks[middle as usize].prev,
            self.blocks[middle as usize].next,
        );
        self.try_merge(middle, prev);
        self.try_merge(middle, next);
        self.index_insert(middle);
        self.reserved -= (hi - lo) as usize;
        self.device_frees += 1;
    }

    /// The out-of-memory retry: every wholly free segment released (whole free chunks unmapped
    /// in expandable mode).
    fn release_cached_blocks(&mut self) {
        for pool in 0..2 {
            let blocks: Vec<u32> = self.free[pool].iter().map(|&(_, _, id)| id).collect();
            for id in blocks {
                if self.expandable {
                    self.unmap_block(id);
                    continue;
                }
                let b = &self.blocks[id as usize];
                if b.prev == NONE && b.next == NONE {
                    let size = b.size;
                    self.index_remove(id);
                    self.free_slots.push(id);
                    self.reserved -= size;
                    self.device_frees += 1;
                }
            }
        }
    }
}

/// Replays `trace` once under PyTorch's policy in `mode` on a device of `capacity` bytes.
pub fn replay_pytorch(
    trace: &Trace,
    mode: ReplayMode,
    capacity: usize,
) -> crate::Result<ReplayReport> {
    let mut p = PyTorchPolicy::new(mode, capacity);
    p.run(trace)?;
    Ok(p.report())
}
