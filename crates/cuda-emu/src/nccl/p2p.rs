//! Point-to-point transfers (`ncclSend` / `ncclRecv`) over a [`Clique`]'s rings, one ring per
//! ordered pair of ranks. Invariants:
//! - A message is a 16-byte header (payload bytes, element type) and its payload, streamed
//!   through the ring in order; the receiver checks the header against what it expects, so a
//!   send/receive pair that disagrees is `InvalidUsage` on the receiving rank, never a silent
//!   partial copy.
//! - The operations of one group on one communicator progress together without blocking on any
//!   one of them (a rank may send to and receive from the same peer in one group, whatever the
//!   sizes); several operations on one channel (same direction and peer) run one after another
//!   in call order, so they match the peer's in order, as NCCL's; an operation alone blocks
//!   until it is done, as NCCL's would.
//! - Every wait is a [`Waiter`] pause: bounded by the clique's timeout, stopped by a dead or
//!   departed peer.

use std::sync::atomic::Ordering;

use super::clique::{Clique, CommError, Waiter};
use super::collective::Access;
use super::reduce::DType;

/// One send or receive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct P2pOp {
    /// Send (true) or receive.
    pub send: bool,
    /// The other rank.
    pub peer: usize,
    /// This rank's buffer.
    pub addr: u64,
    /// Elements.
    pub count: usize,
    /// Element type.
    pub dtype: DType,
}

const HEADER: usize = 16;

/// Progress of one operation: bytes of header + payload moved so far.
struct Transfer {
    op: P2pOp,
    header: [u8; HEADER],
    moved: usize,
    total: usize,
}

impl Transfer {
    fn new(op: P2pOp) -> Transfer {
        let bytes = op.count * op.dtype.size();
        let mut header = [0u8; HEADER];
        if op.send {
            header[..8].copy_from_slice(&(bytes as u64).to_le_bytes());
            header[8..].copy_from_slice(&(op.dtype as u64).to_le_bytes());
        }
        Transfer {
            op,
            header,
            moved: 0,
            total: HEADER + bytes,
        }
    }

    /// The local bytes at stream position `at` and how many are contiguous from there.
    fn local(&mut self, at: usize) -> (*mut u8, usize) {
        if at < HEADER {
            // SAFETY: `at` is inside the header array.
            (unsafe { self.header.as_mut_ptr().add(at) }, HEADER - at)
        } else {
            (
                (self.op.addr as usize + (at - HEADER)) as *mut u8,
                self.total - at,
            )
        }
    }

    /// Moves what the ring allows now; true when something moved.
    ///
    /// # Safety
    /// The operation's buffer holds `count` elements (readable to send, writable to receive).
    unsafe fn step(&mut self, clique: &Clique, rank: usize) -> Result<bool, CommError> {
        let (src, dst) = if self.op.send {
            (rank, self.op.peer)
        } else {
            (self.op.peer, rank)
        };
        let (written, read, ring) = clique.channel(src, dst);
        let cap = clique.channel_bytes() as u64;
        let mut moved_any = false;
        while self.moved < self.total {
            let (w, r) = (
                written.load(Ordering::Acquire),
                read.load(Ordering::Acquire),
            );
            let ready = if self.op.send { cap - (w - r) } else { w - r } as usize;
            if ready == 0 {
                break;
            }
            let pos = if self.op.send { w } else { r };
            let ring_at = (pos % cap) as usize;
            let (local, local_len) = self.local(self.moved);
            let n = ready.min(local_len).min(cap as usize - ring_at);
            // SAFETY: `n` bytes fit both the ring (from ring_at) and the local range.
            unsafe {
                if self.op.send {
                    std::ptr::copy_nonoverlapping(local, ring.add(ring_at), n);
                    written.fetch_add(n as u64, Ordering::AcqRel);
                } else {
                    std::ptr::copy_nonoverlapping(ring.add(ring_at), local, n);
                    read.fetch_add(n as u64, Ordering::AcqRel);
                }
            }
            let before = self.moved;
            self.moved += n;
            moved_any = true;
            if !self.op.send && before < HEADER && self.moved >= HEADER {
                self.check_header(rank)?;
            }
        }
        Ok(moved_any)
    }

    fn check_header(&self, rank: usize) -> Result<(), CommError> {
        let bytes = u64::from_le_bytes(self.header[..8].try_into().expect("8 bytes"));
        let dtype = u64::from_le_bytes(self.header[8..].try_into().expect("8 bytes"));
        let want = (self.total - HEADER) as u64;
        if bytes != want || dtype != self.op.dtype as u64 {
            return Err(CommError::InvalidUsage(format!(
                "ncclRecv: rank {} sent {bytes} bytes of type {dtype}, rank {rank} receives {want} \
                 bytes of type {} ({:?})",
                self.op.peer, self.op.dtype as u64, self.op.dtype
            )));
        }
        Ok(())
    }
}

/// Runs `ops` as `rank`, all progressing together, until every one is done; every access to
/// the buffers runs inside `access` (see [`Access`]).
///
/// # Safety
/// Every operation's buffer holds its `count` elements (readable to send, writable to
/// receive) for the whole call.
pub unsafe fn run(
    clique: &Clique,
    rank: usize,
    ops: &[P2pOp],
    access: Access<'_>,
) -> Result<(), CommError> {
    let mut transfers: Vec<Transfer> = ops.iter().map(|&op| Transfer::new(op)).collect();
    let mut waiter = Waiter::new();
    loop {
        let mut moved = false;
        // Operations on one channel (same direction and peer) run in call order, one at a time.
        let mut busy: Vec<(bool, usize)> = Vec::new();
        for t in transfers.iter_mut().filter(|t| t.moved < t.total) {
            let channel = (t.op.send, t.op.peer);
            if busy.contains(&channel) {
                continue;
            }
            let mut stepped = Ok(false);
            // SAFETY: forwarded from the caller.
            access(&mut || stepped = unsafe { t.step(clique, rank) })?;
            moved |= stepped?;
            if t.moved < t.total {
                busy.push(channel);
            }
        }
        let waiting: Vec<usize> = transfers
            .iter()
            .filter(|t| t.moved < t.total)
            .map(|t| t.op.peer)
            .collect();
        if waiting.is_empty() {
            return Ok(());
        }
        if moved {
            waiter = Waiter::new();
        } else {
            let what = if ops.iter().any(|o| o.send) {
                "ncclSend"
            } else {
                "ncclRecv"
            };
            waiter.pause(clique, rank, what, &waiting)?;
        }
    }
}
