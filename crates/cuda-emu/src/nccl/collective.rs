//! The collective algorithms over a [`Clique`]: every rank calls [`run`] with the same
//! operation, and data moves through the ranks' shared slots in chunks. Invariants:
//! - Before any data moves, each rank publishes a descriptor (operation, count, type, operator,
//!   root, sequence number) and checks, after a barrier, that every rank's matches: ranks that
//!   disagree all get `InvalidUsage` instead of NCCL's hang or corruption.
//! - Per chunk: each rank copies its contribution into its slot, barrier, each rank reads the
//!   slots it needs, barrier (so slots are free again). In-place calls (NCCL's aliasing rules:
//!   `recv == send`, or the rank's own block of an all-gather / reduce-scatter) are correct
//!   because a chunk is copied into the slot before any result of that chunk is written.
//! - Buffers are raw addresses the caller has checked; nothing here validates memory.

use super::clique::{Clique, CommError};
use super::reduce::{reduce, DType, RedOp};

/// Which collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `ncclAllReduce`: every rank gets op over all ranks' `count` elements.
    AllReduce,
    /// `ncclBroadcast`: every rank gets the root's `count` elements.
    Broadcast,
    /// `ncclReduce`: the root gets op over all ranks' `count` elements.
    Reduce,
    /// `ncclAllGather`: every rank gets all ranks' `count` elements, in rank order.
    AllGather,
    /// `ncclReduceScatter`: rank r gets op over all ranks of block r (`count` elements each).
    ReduceScatter,
}

impl Kind {
    /// The NCCL function name.
    pub fn name(self) -> &'static str {
        match self {
            Kind::AllReduce => "ncclAllReduce",
            Kind::Broadcast => "ncclBroadcast",
            Kind::Reduce => "ncclReduce",
            Kind::AllGather => "ncclAllGather",
            Kind::ReduceScatter => "ncclReduceScatter",
        }
    }
}

/// One collective call's shape (identical on every rank).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Collective {
    /// The operation.
    pub kind: Kind,
    /// NCCL's count argument (all-gather: per rank sent; reduce-scatter: per rank received).
    pub count: usize,
    /// Element type.
    pub dtype: DType,
    /// Reduction operator (ignored by broadcast and all-gather).
    pub op: RedOp,
    /// Root rank (broadcast and reduce; 0 otherwise).
    pub root: usize,
}

impl Collective {
    /// Elements this rank reads from its send buffer (0: it is not read; `None`: overflow).
    pub fn send_elems(&self, rank: usize, nranks: usize) -> Option<usize> {
        match self.kind {
            Kind::Broadcast if rank != self.root => Some(0),
            Kind::ReduceScatter => self.count.checked_mul(nranks),
            _ => Some(self.count),
        }
    }

    /// Elements this rank writes to its receive buffer (0: it is not written; `None`:
    /// overflow).
    pub fn recv_elems(&self, rank: usize, nranks: usize) -> Option<usize> {
        match self.kind {
            Kind::Reduce if rank != self.root => Some(0),
            Kind::AllGather => self.count.checked_mul(nranks),
            _ => Some(self.count),
        }
    }

    fn descriptor(&self, seq: u64) -> [u64; 4] {
        let kind = self.kind as u64;
        let code = kind | (self.dtype as u64) << 8 | (self.op as u64) << 16;
        [code, self.count as u64, self.root as u64, seq]
    }

    fn describe(d: &[u64; 4]) -> String {
        format!(
            "operation {} type {} op {} count {} root {} (call #{})",
            d[0] & 0xff,
            d[0] >> 8 & 0xff,
            d[0] >> 16 & 0xff,
            d[1],
            d[2],
            d[3]
        )
    }
}

/// Wraps every stretch of code that touches the rank's own buffers (never a wait): the C API
/// holds the buffers live for it (`space::with_live`), tests run it as it is ([`unguarded`]).
pub type Access<'a> = &'a dyn Fn(&mut dyn FnMut()) -> Result<(), CommError>;

/// An [`Access`] that just runs the code (host buffers that cannot go away).
pub fn unguarded(f: &mut dyn FnMut()) -> Result<(), CommError> {
    f();
    Ok(())
}

/// Runs `c` as `rank`; `seq` numbers this rank's operations on the communicator (peers must
/// agree). `send`/`recv` address the rank's buffers (sizes per [`Collective::send_elems`] /
/// [`Collective::recv_elems`]); every access to them runs inside `access`.
///
/// # Safety
/// The buffers are readable / writable for those sizes for the whole call.
pub unsafe fn run(
    clique: &Clique,
    rank: usize,
    seq: u64,
    c: &Collective,
    (send, recv): (u64, u64),
    access: Access<'_>,
) -> Result<(), CommError> {
    let name = c.kind.name();
    if c.count == 0 {
        return Ok(());
    }
    let nranks = clique.nranks();
    let mine = c.descriptor(seq);
    clique.publish(rank, mine);
    clique.barrier(rank, name)?;
    for r in 0..nranks {
        let theirs = clique.descriptor(r);
        if theirs != mine {
            clique.leave(rank, true);
            return Err(CommError::InvalidUsage(format!(
                "{name}: ranks disagree: rank {rank} runs {} but rank {r} runs {}",
                Collective::describe(&mine),
                Collective::describe(&theirs)
            )));
        }
    }
    let size = c.dtype.size();
    let chunk = clique.slot_bytes() / size;
    let total = match c.kind {
        Kind::ReduceScatter => c.count * nranks,
        _ => c.count,
    };
    let slots: Vec<*const u8> = (0..nranks).map(|r| clique.slot(r) as *const u8).collect();
    let (send, recv) = (send as *const u8, recv as *mut u8);
    let mut off = 0;
    while off < total {
        let n = chunk.min(total - off);
        let bytes = n * size;
        let at = off * size;
        let contributes = c.kind != Kind::Broadcast || rank == c.root;
        if contributes {
            // SAFETY: `send` holds `total` elements (send_elems) when this rank contributes;
            // the slot holds slot_bytes >= bytes.
            access(&mut || unsafe { std::ptr::copy(send.add(at), clique.slot(rank), bytes) })?;
        }
        clique.barrier(rank, name)?;
        // SAFETY: every slot holds this chunk; `recv` holds recv_elems elements.
        access(&mut || unsafe {
            match c.kind {
                Kind::AllReduce => reduce(&slots, recv.add(at), n, c.dtype, c.op),
                Kind::Reduce if rank == c.root => reduce(&slots, recv.add(at), n, c.dtype, c.op),
                Kind::Reduce => {}
                Kind::Broadcast => std::ptr::copy(slots[c.root], recv.add(at), bytes),
                Kind::AllGather => {
                    for (q, slot) in slots.iter().enumerate() {
                        std::ptr::copy(*slot, recv.add((q * c.count) * size + at), bytes);
                    }
                }
                Kind::ReduceScatter => {
                    // This rank's block [rank·count, (rank+1)·count) within [off, off + n).
                    let lo = off.max(rank * c.count);
                    let hi = (off + n).min((rank + 1) * c.count);
                    if lo < hi {
                        let inputs: Vec<*const u8> =
                            slots.iter().map(|s| s.add((lo - off) * size)).collect();
                        let out = recv.add((lo - rank * c.count) * size);
                        reduce(&inputs, out, hi - lo, c.dtype, c.op);
                    }
                }
            }
        })?;
        clique.barrier(rank, name)?;
        off += n;
    }
    Ok(())
}
