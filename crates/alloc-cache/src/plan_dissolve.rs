//! Giving a dropped plan's bins back to the cache at once (`planner.rs`): a bin whose planned
//! blocks are all freed goes back whole; a bin still holding live planned blocks is dissolved,
//! each of those blocks becoming an ordinary block of the bin's segment and the ranges between
//! them free blocks of its pool, so the cache can use them before the planned blocks are freed.
//!
//! Invariants: no byte changes hands (a dissolved bin's live blocks keep their addresses, sizes,
//! handles and statistics); the pieces of a bin tile it exactly, in address order, between the
//! bin's neighbours; a free piece is merged with a free neighbour as any freed block is.

use crate::block::{BlockState, State};
use crate::slab::{Block, ARENA_SEGMENT, NONE};

impl State {
    /// Drops the active plan and gives every bin back: whole when idle, dissolved around its
    /// live planned blocks otherwise. Whether any bin went back.
    pub(crate) fn dissolve_plan(&mut self) -> bool {
        let Some(p) = self.planner.as_mut() else {
            return false;
        };
        let Some(mut a) = p.active.take() else {
            return false;
        };
        // The step under way is counted as at a marker: served whole (`empty_cache` after its
        // last planned block) as planned, cut short (memory ran out inside it) as fallen back;
        // one that has not asked for anything yet (scratch lent meanwhile aside), as neither.
        let begun = a.next > 0 || a.deviated || a.live.len() > a.lent.len();
        if !a.dropped && begun {
            a.count_step(&mut p.counts);
        }
        let bins = std::mem::take(&mut a.bins);
        for &bin in &bins {
            let b = &self.blocks[bin as usize];
            if a.holds_live(b.addr, b.size) {
                self.dissolve_bin(bin);
            } else {
                self.free_block(bin);
            }
        }
        !bins.is_empty()
    }

    /// Replaces bin `bin` in its segment by its live planned blocks and the free ranges between
    /// them (see the module doc).
    fn dissolve_bin(&mut self, bin: u32) {
        let b = &self.blocks[bin as usize];
        let (addr, end) = (b.addr, b.addr + b.size as u64);
        let (segment, prev, next, pool, stream) = (b.segment, b.prev, b.next, b.pool, b.stream);
        let mut live: Vec<u32> = (0..self.blocks.len() as u32)
            .filter(|&id| {
                let b = &self.blocks[id as usize];
                b.segment == ARENA_SEGMENT
                    && matches!(b.state, BlockState::Allocated | BlockState::Pending)
                    && (addr..end).contains(&b.addr)
            })
            .collect();
        live.sort_unstable_by_key(|&id| self.blocks[id as usize].addr);
        let mut gaps = Vec::new();
        let mut last = prev;
        let mut cursor = addr;
        let link = |st: &mut State, id: u32, last: &mut u32| {
            if *last == NONE {
                st.segment_mut(segment).head = id;
            } else {
                st.blocks[*last as usize].next = id;
            }
            let b = &mut st.blocks[id as usize];
            b.prev = *last;
            b.next = NONE;
            *last = id;
        };
        for id in live {
            let (at, size) = (self.blocks[id as usize].addr, self.blocks[id as usize].size);
            if at > cursor {
                let gap = self.arena_gap(cursor, at, segment, pool, stream);
                link(self, gap, &mut last);
                gaps.push(gap);
            }
            // Allocated and pending blocks count the same wherever they are linked.
            self.blocks[id as usize].segment = segment;
            link(self, id, &mut last);
            cursor = at + size as u64;
        }
        if cursor < end {
            let gap = self.arena_gap(cursor, end, segment, pool, stream);
            link(self, gap, &mut last);
            gaps.push(gap);
        }
        self.blocks[last as usize].next = next;
        if next == NONE {
            self.segment_mut(segment).tail = last;
        } else {
            self.blocks[next as usize].prev = last;
        }
        self.kill_block(bin);
        // Each range counted nothing while it was part of the bin: freeing it counts it as
        // cached, merged with a free neighbour.
        for gap in gaps {
            self.free_block(gap);
        }
    }

    /// A new block for `from..to` of `segment`, counted as nothing (state `Arena`, as the bin
    /// it comes from) until it is freed.
    fn arena_gap(
        &mut self,
        from: u64,
        to: u64,
        segment: u32,
        pool: crate::stats::PoolKind,
        stream: u16,
    ) -> u32 {
        let mut block = Block::free(from, (to - from) as usize, segment, NONE, pool, stream, 0);
        block.state = BlockState::Arena;
        self.new_block(block)
    }
}
