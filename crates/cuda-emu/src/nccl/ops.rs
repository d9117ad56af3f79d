//! The collective entry points (`ncclAllReduce`, `ncclBroadcast`, `ncclBcast`, `ncclReduce`,
//! `ncclAllGather`, `ncclReduceScatter`) and the point-to-point ones (`ncclSend`, `ncclRecv`). Invariants: every argument is checked at the call
//! (communicator, type, operator, root, count overflow, buffers live on the communicator's
//! device, stream on that device) and again, for the buffers, when the work runs; the work is
//! queued on the stream (or, inside a group, at the outermost `ncclGroupEnd`).

use std::ffi::{c_int, c_void};

use cudarc::driver::sys::{CUresult, CUstream};
use cudarc::nccl::sys::{cudaStream_t, ncclComm_t, ncclResult_t};

use super::clique::CommError;
use super::collective::{Collective, Kind};
use super::comm::{with_group, Comm};
use super::p2p::P2pOp;
use super::reduce::{DType, RedOp};
use super::status::{arg, comm_of, fail};
use crate::{driver, space};
use std::sync::Arc;

/// Checks that `[addr, addr + bytes)` is live memory on `device`.
fn check_buffer(name: &str, addr: u64, bytes: u64, device: i32) -> Result<(), CommError> {
    space::check_device_range(addr, bytes)
        .map_err(|e| CommError::InvalidArgument(format!("{name} is not device memory: {e}")))?;
    match space::device_of(addr) {
        Some(d) if d == device => Ok(()),
        other => Err(CommError::InvalidArgument(format!(
            "{name} 0x{addr:x} is on {}, the communicator is on device {device}",
            other.map_or("no device".to_string(), |d| format!("device {d}"))
        ))),
    }
}

/// Runs `f` while every range stays live (a concurrent `cuMemFree` waits; never held across a
/// wait for a peer); a range freed before is an error.
fn held_live(ranges: &[(u64, u64)], f: &mut dyn FnMut()) -> Result<(), CommError> {
    space::with_live(ranges, f).map_err(|e| {
        CommError::InvalidArgument(format!("a buffer was freed while the operation ran: {e}"))
    })
}

/// Checks that `stream` is usable and on `device`.
fn check_stream(stream: CUstream, device: i32) -> Result<(), CommError> {
    match driver::stream_device(stream) {
        Ok(d) if d == device => Ok(()),
        Ok(d) => Err(CommError::InvalidUsage(format!(
            "the stream is on device {d}, the communicator on device {device}"
        ))),
        Err(e) => Err(CommError::InvalidUsage(format!(
            "the stream is not usable ({e:?})"
        ))),
    }
}

/// Validates and queues one collective.
#[allow(clippy::too_many_arguments)]
unsafe fn enqueue_collective(
    kind: Kind,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: u32,
    op: u32,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    let call = kind.name();
    let comm = match comm_of(call, comm) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let Some(dtype) = DType::from_raw(dtype) else {
        return arg(
            call,
            format!("datatype {dtype} is not an emulated ncclDataType_t"),
        );
    };
    let reduces = matches!(kind, Kind::AllReduce | Kind::Reduce | Kind::ReduceScatter);
    let op = match (reduces, RedOp::from_raw(op)) {
        (false, _) => RedOp::Sum,
        (true, Some(op)) => op,
        (true, None) => {
            return arg(
                call,
                format!("op {op} is not ncclSum, ncclProd, ncclMax, ncclMin or ncclAvg"),
            )
        }
    };
    let rooted = matches!(kind, Kind::Broadcast | Kind::Reduce);
    if rooted && (root < 0 || root as usize >= comm.nranks) {
        return arg(
            call,
            format!("root {root} is not a rank of {}", comm.nranks),
        );
    }
    let c = Collective {
        kind,
        count,
        dtype,
        op,
        root: if rooted { root as usize } else { 0 },
    };
    let bytes = |elems: Option<usize>| {
        elems
            .and_then(|e| e.checked_mul(dtype.size()))
            .filter(|&b| b <= isize::MAX as usize)
    };
    let (Some(send_bytes), Some(recv_bytes)) = (
        bytes(c.send_elems(comm.rank, comm.nranks)),
        bytes(c.recv_elems(comm.rank, comm.nranks)),
    ) else {
        return arg(call, format!("count {count} overflows the buffer size"));
    };
    if let Err(e) = comm.usable() {
        return fail(call, e);
    }
    if count == 0 {
        return ncclResult_t::ncclSuccess;
    }
    let (send, recv) = (send as u64, recv as u64);
    let buffers = [
        ("sendbuff", send, send_bytes),
        ("recvbuff", recv, recv_bytes),
    ];
    let device = comm.device;
    for (name, addr, len) in buffers {
        if len > 0 {
            if let Err(e) = check_buffer(name, addr, len as u64, device) {
                return fail(call, e);
            }
        }
    }
    let stream = stream as CUstream;
    if let Err(e) = check_stream(stream, device) {
        return fail(call, e);
    }
    let seq = comm.next_seq();
    let queued = comm.queue_token();
    let work = move || {
        let comm = queued;
        let checked = buffers
            .iter()
            .filter(|(_, _, len)| *len > 0)
            .try_for_each(|&(name, addr, len)| check_buffer(name, addr, len as u64, device))
            .inspect_err(|e| comm.record_failure(e));
        let ranges: Vec<(u64, u64)> = buffers
            .iter()
            .filter(|(_, _, len)| *len > 0)
            .map(|&(_, addr, len)| (addr, len as u64))
            .collect();
        let access = |f: &mut dyn FnMut()| held_live(&ranges, f);
        // SAFETY: both buffers were just checked to be live device memory of their sizes, and
        // every access to them holds them live.
        let result = checked.and_then(|()| unsafe { comm.execute(seq, &c, (send, recv), &access) });
        result.map_err(|e| {
            fail(call, e);
            CUresult::CUDA_ERROR_UNKNOWN
        })
    };
    let work: driver::StreamWork = Box::new(work);
    let queued = with_group(|g| {
        if g.depth > 0 {
            g.ops.push((stream, work));
            None
        } else {
            Some(work)
        }
    });
    match queued {
        Some(work) => enqueue_or_fail(call, stream, work),
        None => ncclResult_t::ncclSuccess,
    }
}

/// Queues `work` on `stream`; a stream that refuses it is NCCL's `ncclUnhandledCudaError`.
fn enqueue_or_fail(call: &str, stream: CUstream, work: driver::StreamWork) -> ncclResult_t {
    match driver::enqueue(stream, work) {
        Ok(()) => ncclResult_t::ncclSuccess,
        Err(e) => {
            driver::log(&format!(
                "{call}: queueing on the stream failed ({e:?}) (ncclUnhandledCudaError)"
            ));
            ncclResult_t::ncclUnhandledCudaError
        }
    }
}

/// Every rank gets `op` over all ranks' `count` elements.
#[no_mangle]
pub unsafe extern "C" fn ncclAllReduce(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: u32,
    op: u32,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    // SAFETY: the caller's contract is NCCL's.
    unsafe {
        enqueue_collective(
            Kind::AllReduce,
            send,
            recv,
            count,
            dtype,
            op,
            0,
            comm,
            stream,
        )
    }
}

/// Every rank gets the root's `count` elements.
#[no_mangle]
pub unsafe extern "C" fn ncclBroadcast(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: u32,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    // SAFETY: the caller's contract is NCCL's.
    unsafe {
        enqueue_collective(
            Kind::Broadcast,
            send,
            recv,
            count,
            dtype,
            0,
            root,
            comm,
            stream,
        )
    }
}

/// In-place broadcast (legacy name).
#[no_mangle]
pub unsafe extern "C" fn ncclBcast(
    buff: *mut c_void,
    count: usize,
    dtype: u32,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    // SAFETY: the caller's contract is NCCL's.
    unsafe {
        enqueue_collective(
            Kind::Broadcast,
            buff,
            buff,
            count,
            dtype,
            0,
            root,
            comm,
            stream,
        )
    }
}

/// The root gets `op` over all ranks' `count` elements.
#[no_mangle]
pub unsafe extern "C" fn ncclReduce(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: u32,
    op: u32,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    // SAFETY: the caller's contract is NCCL's.
    unsafe {
        enqueue_collective(
            Kind::Reduce,
            send,
            recv,
            count,
            dtype,
            op,
            root,
            comm,
            stream,
        )
    }
}

/// Every rank gets every rank's `sendcount` elements, in rank order.
#[no_mangle]
pub unsafe extern "C" fn ncclAllGather(
    send: *const c_void,
    recv: *mut c_void,
    sendcount: usize,
    dtype: u32,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    // SAFETY: the caller's contract is NCCL's.
    unsafe {
        enqueue_collective(
            Kind::AllGather,
            send,
            recv,
            sendcount,
            dtype,
            0,
            0,
            comm,
            stream,
        )
    }
}

/// Rank r gets `op` over all ranks' block r of `recvcount` elements.
#[no_mangle]
pub unsafe extern "C" fn ncclReduceScatter(
    send: *const c_void,
    recv: *mut c_void,
    recvcount: usize,
    dtype: u32,
    op: u32,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    // SAFETY: the caller's contract is NCCL's.
    unsafe {
        enqueue_collective(
            Kind::ReduceScatter,
            send,
            recv,
            recvcount,
            dtype,
            op,
            0,
            comm,
            stream,
        )
    }
}

/// The stream work running `ops` of `comm` together (buffers checked again when it runs).
pub(crate) fn p2p_work(comm: &Arc<Comm>, ops: Vec<P2pOp>) -> driver::StreamWork {
    let queued = comm.queue_token();
    Box::new(move || {
        let comm = queued;
        let call = if ops.iter().all(|o| o.send) {
            "ncclSend"
        } else {
            "ncclRecv"
        };
        let checked = ops.iter().try_for_each(|o| {
            let name = if o.send { "sendbuff" } else { "recvbuff" };
            let bytes = (o.count * o.dtype.size()) as u64;
            check_buffer(name, o.addr, bytes, comm.device)
        });
        let checked = checked.inspect_err(|e| comm.record_failure(e));
        let ranges: Vec<(u64, u64)> = ops
            .iter()
            .map(|o| (o.addr, (o.count * o.dtype.size()) as u64))
            .filter(|&(_, len)| len > 0)
            .collect();
        let access = |f: &mut dyn FnMut()| held_live(&ranges, f);
        // SAFETY: every buffer was just checked to be live device memory of its size, and
        // every access to them holds them live.
        let result = checked.and_then(|()| unsafe { comm.execute_p2p(&ops, &access) });
        result.map_err(|e| {
            fail(call, e);
            CUresult::CUDA_ERROR_UNKNOWN
        })
    })
}

/// Validates and queues one send or receive (inside a group: at the group's end, together
/// with the group's other sends and receives on the same communicator and stream).
#[allow(clippy::too_many_arguments)]
unsafe fn enqueue_p2p(
    send: bool,
    buff: u64,
    count: usize,
    dtype: u32,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    let call = if send { "ncclSend" } else { "ncclRecv" };
    let comm = match comm_of(call, comm) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let Some(dtype) = DType::from_raw(dtype) else {
        return arg(
            call,
            format!("datatype {dtype} is not an emulated ncclDataType_t"),
        );
    };
    if peer < 0 || peer as usize >= comm.nranks {
        return arg(
            call,
            format!("peer {peer} is not a rank of {}", comm.nranks),
        );
    }
    let Some(bytes) = count
        .checked_mul(dtype.size())
        .filter(|&b| b <= isize::MAX as usize)
    else {
        return arg(call, format!("count {count} overflows the buffer size"));
    };
    if let Err(e) = comm.usable() {
        return fail(call, e);
    }
    let name = if send { "sendbuff" } else { "recvbuff" };
    if bytes > 0 {
        if let Err(e) = check_buffer(name, buff, bytes as u64, comm.device) {
            return fail(call, e);
        }
    }
    let stream = stream as CUstream;
    if let Err(e) = check_stream(stream, comm.device) {
        return fail(call, e);
    }
    let op = P2pOp {
        send,
        peer: peer as usize,
        addr: buff,
        count,
        dtype,
    };
    let grouped = with_group(|g| {
        if g.depth > 0 {
            g.p2p.push((comm.clone(), stream, op));
            true
        } else {
            false
        }
    });
    if grouped {
        return ncclResult_t::ncclSuccess;
    }
    enqueue_or_fail(call, stream, p2p_work(&comm, vec![op]))
}

/// Sends `count` elements to `peer` (completes once they are in the pair's ring: at once for
/// small messages, like NCCL's eager protocol; else as the peer's receive drains it).
#[no_mangle]
pub unsafe extern "C" fn ncclSend(
    send: *const c_void,
    count: usize,
    dtype: u32,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    // SAFETY: the caller's contract is NCCL's.
    unsafe { enqueue_p2p(true, send as u64, count, dtype, peer, comm, stream) }
}

/// Receives `count` elements from `peer`.
#[no_mangle]
pub unsafe extern "C" fn ncclRecv(
    recv: *mut c_void,
    count: usize,
    dtype: u32,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    // SAFETY: the caller's contract is NCCL's.
    unsafe { enqueue_p2p(false, recv as u64, count, dtype, peer, comm, stream) }
}
