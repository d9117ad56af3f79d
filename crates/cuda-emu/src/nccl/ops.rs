//! The collective entry points (`ncclAllReduce`, `ncclBroadcast`, `ncclBcast`, `ncclReduce`,
//! `ncclAllGather`, `ncclReduceScatter`). Invariants: every argument is checked at the call
//! (communicator, type, operator, root, count overflow, buffers live on the communicator's
//! device, stream on that device) and again, for the buffers, when the work runs; the work is
//! queued on the stream (or, inside a group, at the outermost `ncclGroupEnd`).

use std::ffi::{c_int, c_void};

use cudarc::driver::sys::{CUresult, CUstream};
use cudarc::nccl::sys::{cudaStream_t, ncclComm_t, ncclResult_t};

use super::clique::CommError;
use super::collective::{Collective, Kind};
use super::comm::with_group;
use super::reduce::{DType, RedOp};
use super::{arg, comm_of, fail};
use crate::{driver, space};

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
    match driver::stream_device(stream) {
        Ok(d) if d == device => {}
        Ok(d) => {
            let e = format!("the stream is on device {d}, the communicator on device {device}");
            return fail(call, CommError::InvalidUsage(e));
        }
        Err(e) => {
            return fail(
                call,
                CommError::InvalidUsage(format!("the stream is not usable ({e:?})")),
            )
        }
    }
    let seq = comm.next_seq();
    let queued = comm.queue_token();
    let work = move || {
        let comm = queued;
        let checked = buffers
            .iter()
            .filter(|(_, _, len)| *len > 0)
            .try_for_each(|&(name, addr, len)| check_buffer(name, addr, len as u64, device));
        // SAFETY: both buffers were just checked to be live device memory of their sizes.
        let result = checked.and_then(|()| unsafe { comm.execute(seq, &c, send, recv) });
        result.map_err(|e| {
            fail(call, e);
            CUresult::CUDA_ERROR_LAUNCH_FAILED
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
    if let Some(work) = queued {
        if let Err(e) = driver::enqueue(stream, work) {
            driver::log(&format!(
                "{call}: queueing on the stream failed ({e:?}) (ncclUnhandledCudaError)"
            ));
            return ncclResult_t::ncclUnhandledCudaError;
        }
    }
    ncclResult_t::ncclSuccess
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
