//! The emulated NCCL (`libnccl.so.2`): unique ids, communicators for several emulated devices in
//! one process (threads, `ncclCommInitAll`, grouped `ncclCommInitRank`) and across processes on
//! one machine (a shared-memory rendezvous named by the id, [`clique`]), and the collectives
//! all-reduce, broadcast, reduce, all-gather and reduce-scatter ([`collective`]) for sum, prod,
//! max, min and avg over the integer, f16, bf16, f32 and f64 types ([`reduce`]). Invariants:
//! - C names and ABI of NCCL 2.30 as cudarc binds them; enum-typed arguments are taken as raw
//!   integers, so an out-of-range value is `ncclInvalidArgument`, never undefined behaviour.
//! - A collective is validated at the call (communicator, type, operator, root, count overflow,
//!   buffers live on the communicator's device, stream on that device) and queued on the given
//!   stream; it completes when every rank's stream has reached it. Inside a group, collectives
//!   are queued at the outermost `ncclGroupEnd`.
//! - Every wait has a deadline (`KILN_EMU_NCCL_TIMEOUT` seconds, default 60); a failed
//!   collective fails its stream with `CUDA_ERROR_UNKNOWN` (not sticky: as with NCCL, the
//!   context survives, so the communicator can be aborted and made again), is logged, and
//!   becomes the communicator's async error.

pub mod clique;
pub mod collective;
pub mod comm;
pub mod ops;
pub mod p2p;
pub mod reduce;
mod status;

#[cfg(test)]
mod tests;

use std::ffi::{c_char, c_int};
use std::sync::Arc;

use cudarc::nccl::sys::{ncclComm_t, ncclResult_t, ncclUniqueId};

use self::clique::{Clique, CommError};
use self::comm::{register, unregister, with_group, Comm};
use self::status::code;
pub(crate) use self::status::{arg, comm_of, fail};
use crate::driver;

/// NCCL version this library reports (2.30.0, as `NCCL_VERSION_CODE`).
pub const NCCL_VERSION: c_int = 2_30_00;

/// The unique id's text (its NUL-terminated name).
pub fn id_name(id: &ncclUniqueId) -> String {
    let bytes: Vec<u8> = id
        .internal
        .iter()
        .map(|&c| c as u8)
        .take_while(|&b| b != 0)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// A fresh unique id.
pub fn unique_id() -> Result<ncclUniqueId, CommError> {
    let name = clique::new_id_name()?;
    let mut id = ncclUniqueId { internal: [0; 128] };
    for (slot, b) in id.internal.iter_mut().zip(name.bytes()) {
        *slot = b as c_char;
    }
    Ok(id)
}

/// Writes `value` through a C out-pointer, or `ncclInvalidArgument` when it is null.
///
/// # Safety
/// A non-null `out` is writable.
unsafe fn put<T>(call: &str, out: *mut T, value: T) -> ncclResult_t {
    if out.is_null() {
        return arg(call, "an output pointer is null".into());
    }
    // SAFETY: non-null and writable by the caller's contract.
    unsafe { out.write(value) };
    ncclResult_t::ncclSuccess
}

/// The library version.
#[no_mangle]
pub unsafe extern "C" fn ncclGetVersion(version: *mut c_int) -> ncclResult_t {
    // SAFETY: the caller's contract.
    unsafe { put("ncclGetVersion", version, NCCL_VERSION) }
}

/// A new unique id (names a fresh shared-memory rendezvous).
#[no_mangle]
pub unsafe extern "C" fn ncclGetUniqueId(out: *mut ncclUniqueId) -> ncclResult_t {
    driver::trace("ncclGetUniqueId");
    match unique_id() {
        // SAFETY: the caller's contract.
        Ok(id) => unsafe { put("ncclGetUniqueId", out, id) },
        Err(e) => fail("ncclGetUniqueId", e),
    }
}

/// Joins `id` as `rank` of `nranks` on the current device (0 without a current context, as
/// the runtime's `cudaGetDevice`); waits for every rank (at the
/// outermost `ncclGroupEnd` inside a group).
#[no_mangle]
pub unsafe extern "C" fn ncclCommInitRank(
    out: *mut ncclComm_t,
    nranks: c_int,
    id: ncclUniqueId,
    rank: c_int,
) -> ncclResult_t {
    // SAFETY: the caller's contract.
    unsafe { init_rank("ncclCommInitRank", out, nranks, id, rank) }
}

/// `NCCL_CONFIG_INITIALIZER`'s magic number.
const CONFIG_MAGIC: u32 = 0xcafe_beef;

/// [`ncclCommInitRank`] with a configuration (null: defaults). The configuration must come from
/// `NCCL_CONFIG_INITIALIZER`; its tuning fields do not change the emulation, and a
/// non-blocking communicator is ready when the call returns (`ncclSuccess`).
#[no_mangle]
pub unsafe extern "C" fn ncclCommInitRankConfig(
    out: *mut ncclComm_t,
    nranks: c_int,
    id: ncclUniqueId,
    rank: c_int,
    config: *mut cudarc::nccl::sys::ncclConfig_t,
) -> ncclResult_t {
    const CALL: &str = "ncclCommInitRankConfig";
    if !config.is_null() {
        // SAFETY: a non-null config points to an ncclConfig_t (the caller's contract).
        let magic = unsafe { (*config).magic };
        if magic != CONFIG_MAGIC {
            return arg(
                CALL,
                format!(
                    "config magic 0x{magic:x} is not NCCL_CONFIG_INITIALIZER's 0x{CONFIG_MAGIC:x}"
                ),
            );
        }
    }
    // SAFETY: the caller's contract.
    unsafe { init_rank(CALL, out, nranks, id, rank) }
}

/// The body of both InitRank calls.
///
/// # Safety
/// A non-null `out` is writable.
unsafe fn init_rank(
    call: &'static str,
    out: *mut ncclComm_t,
    nranks: c_int,
    id: ncclUniqueId,
    rank: c_int,
) -> ncclResult_t {
    driver::trace(call);
    if out.is_null() {
        return arg(call, "comm is a null pointer".into());
    }
    if nranks < 1 || rank < 0 || rank >= nranks {
        return arg(
            call,
            format!("rank {rank} of nranks {nranks} is out of range"),
        );
    }
    // NCCL takes cudaGetDevice(), which is device 0 while no context is current.
    let device = driver::current_device().unwrap_or(0);
    let name = id_name(&id);
    let timeout = clique::env_timeout();
    let comm = match Comm::join(
        &name,
        nranks as usize,
        rank as usize,
        device,
        clique::SLOT_BYTES,
        timeout,
    ) {
        Ok(c) => c,
        Err(e) => return fail(call, e),
    };
    let deferred = with_group(|g| {
        if g.depth > 0 {
            g.inits.push(comm.clone());
            true
        } else {
            false
        }
    });
    if !deferred {
        if let Err(e) = comm.ready() {
            return fail(call, e);
        }
    }
    // SAFETY: non-null; the caller passes a writable ncclComm_t.
    unsafe { out.write(register(comm) as ncclComm_t) };
    ncclResult_t::ncclSuccess
}

/// One communicator per device of `devlist` (null: devices 0..ndev), ranks in list order.
#[no_mangle]
pub unsafe extern "C" fn ncclCommInitAll(
    out: *mut ncclComm_t,
    ndev: c_int,
    devlist: *const c_int,
) -> ncclResult_t {
    const CALL: &str = "ncclCommInitAll";
    driver::trace(CALL);
    if out.is_null() {
        return arg(CALL, "comms is a null pointer".into());
    }
    if ndev < 1 || ndev as usize > clique::MAX_RANKS {
        return arg(
            CALL,
            format!("ndev {ndev} is not in 1..={}", clique::MAX_RANKS),
        );
    }
    let n = ndev as usize;
    let devices: Vec<i32> = if devlist.is_null() {
        (0..ndev).collect()
    } else {
        // SAFETY: a non-null devlist holds ndev ints (the caller's contract).
        unsafe { std::slice::from_raw_parts(devlist, n) }.to_vec()
    };
    for (i, d) in devices.iter().enumerate() {
        if *d < 0 {
            return arg(CALL, format!("devlist[{i}] = {d} is not a device"));
        }
        if devices[..i].contains(d) {
            return fail(
                CALL,
                CommError::InvalidUsage(format!("device {d} appears twice in devlist")),
            );
        }
    }
    let made = (|| {
        let name = clique::new_id_name()?;
        let clique = Arc::new(Clique::open(
            &name,
            n,
            clique::SLOT_BYTES,
            clique::env_timeout(),
        )?);
        let comms = devices
            .iter()
            .enumerate()
            .map(|(rank, &d)| Comm::join_clique(clique.clone(), rank, d))
            .collect::<Result<Vec<_>, _>>()?;
        comms[0].ready()?;
        Ok::<_, CommError>(comms)
    })();
    match made {
        Ok(comms) => {
            for (i, c) in comms.into_iter().enumerate() {
                // SAFETY: `out` holds ndev ncclComm_t slots (the caller's contract).
                unsafe { out.add(i).write(register(c) as ncclComm_t) };
            }
            ncclResult_t::ncclSuccess
        }
        Err(e) => fail(CALL, e),
    }
}

/// Waits for the communicator's queued operations.
#[no_mangle]
pub unsafe extern "C" fn ncclCommFinalize(comm: ncclComm_t) -> ncclResult_t {
    match comm_of("ncclCommFinalize", comm) {
        Ok(_) => ncclResult_t::ncclSuccess,
        Err(r) => r,
    }
}

/// Waits for queued operations, then frees the communicator.
#[no_mangle]
pub unsafe extern "C" fn ncclCommDestroy(comm: ncclComm_t) -> ncclResult_t {
    let c = match comm_of("ncclCommDestroy", comm) {
        Ok(c) => c,
        Err(r) => return r,
    };
    unregister(comm as usize);
    match c.destroy() {
        Ok(()) => ncclResult_t::ncclSuccess,
        Err(e) => fail("ncclCommDestroy", e),
    }
}

/// Frees the communicator at once; its queued operations fail, and peers waiting for it stop.
#[no_mangle]
pub unsafe extern "C" fn ncclCommAbort(comm: ncclComm_t) -> ncclResult_t {
    let c = match comm_of("ncclCommAbort", comm) {
        Ok(c) => c,
        Err(r) => return r,
    };
    unregister(comm as usize);
    c.abort();
    ncclResult_t::ncclSuccess
}

/// Ranks in the communicator.
#[no_mangle]
pub unsafe extern "C" fn ncclCommCount(comm: ncclComm_t, count: *mut c_int) -> ncclResult_t {
    match comm_of("ncclCommCount", comm) {
        // SAFETY: the caller's contract.
        Ok(c) => unsafe { put("ncclCommCount", count, c.nranks as c_int) },
        Err(r) => r,
    }
}

/// The communicator's CUDA device.
#[no_mangle]
pub unsafe extern "C" fn ncclCommCuDevice(comm: ncclComm_t, device: *mut c_int) -> ncclResult_t {
    match comm_of("ncclCommCuDevice", comm) {
        // SAFETY: the caller's contract.
        Ok(c) => unsafe { put("ncclCommCuDevice", device, c.device) },
        Err(r) => r,
    }
}

/// This rank.
#[no_mangle]
pub unsafe extern "C" fn ncclCommUserRank(comm: ncclComm_t, rank: *mut c_int) -> ncclResult_t {
    match comm_of("ncclCommUserRank", comm) {
        // SAFETY: the caller's contract.
        Ok(c) => unsafe { put("ncclCommUserRank", rank, c.rank as c_int) },
        Err(r) => r,
    }
}

/// The first error a queued operation of the communicator hit (`ncclSuccess` if none).
#[no_mangle]
pub unsafe extern "C" fn ncclCommGetAsyncError(
    comm: ncclComm_t,
    error: *mut ncclResult_t,
) -> ncclResult_t {
    match comm_of("ncclCommGetAsyncError", comm) {
        Ok(c) => {
            let e = c
                .async_error()
                .map_or(ncclResult_t::ncclSuccess, |e| code(&e));
            // SAFETY: the caller's contract.
            unsafe { put("ncclCommGetAsyncError", error, e) }
        }
        Err(r) => r,
    }
}

/// A sentence for a result code.
#[no_mangle]
pub unsafe extern "C" fn ncclGetErrorString(result: u32) -> *const c_char {
    let text = match result {
        0 => c"no error",
        1 => c"unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
        2 => c"unhandled system error (run with NCCL_DEBUG=INFO for details)",
        3 => c"internal error - please report this issue to the NCCL developers",
        4 => c"invalid argument (run with NCCL_DEBUG=WARN for details)",
        5 => c"invalid usage (run with NCCL_DEBUG=WARN for details)",
        6 => c"remote process exited or there was a network error",
        7 => c"NCCL operation in progress",
        8 => c"NCCL operation timed out",
        _ => c"unknown result code",
    };
    text.as_ptr()
}

/// The last error's message (valid until the next error).
#[no_mangle]
pub unsafe extern "C" fn ncclGetLastError(_comm: ncclComm_t) -> *const c_char {
    status::last_error()
}

/// Opens a group: collectives and initialisations wait for the outermost `ncclGroupEnd`.
#[no_mangle]
pub unsafe extern "C" fn ncclGroupStart() -> ncclResult_t {
    driver::trace("ncclGroupStart");
    with_group(|g| g.depth += 1);
    ncclResult_t::ncclSuccess
}

/// Closes a group; the outermost one waits for deferred initialisations and queues the
/// group's collectives in call order.
#[no_mangle]
pub unsafe extern "C" fn ncclGroupEnd() -> ncclResult_t {
    const CALL: &str = "ncclGroupEnd";
    driver::trace(CALL);
    let taken = with_group(|g| {
        if g.depth == 0 {
            return None;
        }
        g.depth -= 1;
        Some(if g.depth == 0 {
            (
                std::mem::take(&mut g.inits),
                std::mem::take(&mut g.ops),
                std::mem::take(&mut g.p2p),
            )
        } else {
            Default::default()
        })
    });
    let Some((inits, mut ops, p2p)) = taken else {
        return fail(
            CALL,
            CommError::InvalidUsage("ncclGroupEnd without ncclGroupStart".into()),
        );
    };
    // The group's sends and receives: one piece of work per communicator and stream.
    let mut batches: Vec<(Arc<Comm>, cudarc::driver::sys::CUstream, Vec<p2p::P2pOp>)> = Vec::new();
    for (comm, stream, op) in p2p {
        match batches
            .iter_mut()
            .find(|(c, s, _)| Arc::ptr_eq(c, &comm) && *s == stream)
        {
            Some((_, _, list)) => list.push(op),
            None => batches.push((comm, stream, vec![op])),
        }
    }
    for (comm, stream, list) in batches {
        ops.push((stream, ops::p2p_work(&comm, list)));
    }
    // Every deferred operation is queued even after a failed initialisation: it then fails on
    // its stream (the communicator keeps the error), so no stream silently skips work.
    let mut result = ncclResult_t::ncclSuccess;
    for c in inits {
        if let Err(e) = c.ready() {
            if result == ncclResult_t::ncclSuccess {
                result = fail(CALL, e);
            }
        }
    }
    for (stream, work) in ops {
        if let Err(e) = driver::enqueue(stream, work) {
            driver::log(&format!(
                "{CALL}: queueing on the stream failed ({e:?}) (ncclUnhandledCudaError)"
            ));
            if result == ncclResult_t::ncclSuccess {
                result = ncclResult_t::ncclUnhandledCudaError;
            }
        }
    }
    result
}
