//! Copies and fills (`cuMemcpy*`, `cuMemset*`), with direction checks.
//!
//! Invariants:
//! - Every device address is checked against the live ranges when the call is made (a bad one is
//!   `CUDA_ERROR_INVALID_VALUE`, logged) and again when the stream runs the copy (memory freed in
//!   between is a fault: `CUDA_ERROR_ILLEGAL_ADDRESS`, sticky), so the emulator never touches an
//!   address outside a live allocation.
//! - A host argument that lies in a device span is refused (a copy in the wrong direction).
//! - Timing follows the driver's documented rules: a copy from pageable host memory stages the
//!   source before returning (the caller may reuse it at once) and lands in stream order; a copy
//!   to pageable host memory returns only when it has landed; copies to or from page-locked
//!   memory (`cuMemHostAlloc`, `cuMemHostRegister`) are fully asynchronous, so reading the host
//!   buffer before synchronising shows stale data; device-to-device copies and fills are
//!   asynchronous.

use std::ffi::{c_uint, c_void};

use cudarc::driver::sys::{CUcontext, CUdeviceptr, CUresult, CUstream};

use super::context::context_from_handle;
use super::events::resolve_stream;
use super::pinned::is_pinned;
use super::stream::{Item, Stream};
use super::{fail, log, status};
use crate::space;

fn check_device(call: &str, what: &str, ptr: u64, len: usize) -> Result<(), CUresult> {
    space::check_device_range(ptr, len as u64).map_err(|e| {
        fail(
            call,
            CUresult::CUDA_ERROR_INVALID_VALUE,
            format!("{what} is not device memory: {e}"),
        )
    })
}

pub(super) fn check_host(call: &str, what: &str, ptr: usize, len: usize) -> Result<(), CUresult> {
    if ptr == 0 {
        return Err(fail(
            call,
            CUresult::CUDA_ERROR_INVALID_VALUE,
            format!("{what} is a null host pointer"),
        ));
    }
    let last = ptr.saturating_add(len - 1) as u64;
    if let Some(d) = space::device_of(ptr as u64).or_else(|| space::device_of(last)) {
        return Err(fail(
            call,
            CUresult::CUDA_ERROR_INVALID_VALUE,
            format!(
                "{what} 0x{ptr:x} is device {d}'s memory, not host memory (wrong copy direction?)"
            ),
        ));
    }
    Ok(())
}

/// At run time: runs `f` while the device ranges are live and stay live; memory freed since
/// the call is a fault.
fn guarded(call: &'static str, ranges: &[(u64, usize)], f: impl FnOnce()) -> Result<(), CUresult> {
    let ranges: Vec<(u64, u64)> = ranges.iter().map(|&(p, l)| (p, l as u64)).collect();
    space::with_live(&ranges, f).map_err(|e| {
        log(&format!(
            "{call}: device memory was freed before the copy ran: {e}"
        ));
        CUresult::CUDA_ERROR_ILLEGAL_ADDRESS
    })
}

/// The stream for a copy: `hStream`, or the legacy null stream for the synchronous calls.
pub(super) fn copy_stream(hStream: CUstream) -> Result<std::sync::Arc<Stream>, CUresult> {
    let s = resolve_stream(hStream)?;
    s.ctx.check()?;
    Ok(s)
}

fn htod(
    call: &'static str,
    dst: u64,
    src: usize,
    n: usize,
    hStream: CUstream,
    sync: bool,
) -> Result<(), CUresult> {
    let s = copy_stream(hStream)?;
    if n == 0 {
        return Ok(());
    }
    check_device(call, "destination", dst, n)?;
    check_host(call, "source", src, n)?;
    let pinned = is_pinned(src, n);
    // SAFETY: the caller guarantees `src` is readable for `n` bytes during the call.
    let staged =
        (!pinned).then(|| unsafe { std::slice::from_raw_parts(src as *const u8, n) }.to_vec());
    let seq = s.submit(Item::Work(Box::new(move || {
        let from = staged.as_ref().map_or(src as *const u8, |v| v.as_ptr());
        // SAFETY: the destination is live while guarded; a pinned source stays valid until the
        // stream is synchronised (the caller's contract).
        guarded(call, &[(dst, n)], || unsafe {
            std::ptr::copy(from, dst as *mut u8, n)
        })
    })));
    if sync && pinned {
        s.wait_for(seq);
        return s.ctx.check();
    }
    Ok(())
}

fn dtoh(
    call: &'static str,
    dst: usize,
    src: u64,
    n: usize,
    hStream: CUstream,
    sync: bool,
) -> Result<(), CUresult> {
    let s = copy_stream(hStream)?;
    if n == 0 {
        return Ok(());
    }
    check_device(call, "source", src, n)?;
    check_host(call, "destination", dst, n)?;
    let seq = s.submit(Item::Work(Box::new(move || {
        // SAFETY: the source is live while guarded; the destination is the caller's writable host
        // buffer, valid until the copy completes (pageable: the call waits; pinned: until
        // synchronised).
        guarded(call, &[(src, n)], || unsafe {
            std::ptr::copy(src as *const u8, dst as *mut u8, n)
        })
    })));
    if sync || !is_pinned(dst, n) {
        s.wait_for(seq);
        return s.ctx.check();
    }
    Ok(())
}

fn dtod(
    call: &'static str,
    dst: u64,
    src: u64,
    n: usize,
    hStream: CUstream,
) -> Result<(), CUresult> {
    let s = copy_stream(hStream)?;
    if n == 0 {
        return Ok(());
    }
    check_device(call, "destination", dst, n)?;
    check_device(call, "source", src, n)?;
    s.submit(Item::Work(Box::new(move || {
        // SAFETY: both ranges are live while guarded.
        guarded(call, &[(src, n), (dst, n)], || unsafe {
            std::ptr::copy(src as *const u8, dst as *mut u8, n)
        })
    })));
    Ok(())
}

fn fill(
    call: &'static str,
    dst: u64,
    value: u32,
    elem: usize,
    count: usize,
    hStream: CUstream,
) -> Result<(), CUresult> {
    let s = copy_stream(hStream)?;
    if count == 0 {
        return Ok(());
    }
    if !dst.is_multiple_of(elem as u64) {
        return Err(fail(
            call,
            CUresult::CUDA_ERROR_INVALID_VALUE,
            format!("0x{dst:x} is not {elem}-byte aligned"),
        ));
    }
    let n = count
        .checked_mul(elem)
        .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    check_device(call, "destination", dst, n)?;
    s.submit(Item::Work(Box::new(move || {
        // SAFETY: live while guarded, aligned for `elem` (checked above).
        guarded(call, &[(dst, n)], || unsafe {
            match elem {
                1 => std::ptr::write_bytes(dst as *mut u8, value as u8, n),
                2 => std::slice::from_raw_parts_mut(dst as *mut u16, count).fill(value as u16),
                _ => std::slice::from_raw_parts_mut(dst as *mut u32, count).fill(value),
            }
        })
    })));
    Ok(())
}

const NULL: CUstream = std::ptr::null_mut();

/// `cuMemcpyHtoD_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoD_v2(
    dstDevice: CUdeviceptr,
    srcHost: *const c_void,
    ByteCount: usize,
) -> CUresult {
    super::trace("cuMemcpyHtoD_v2");
    status(htod(
        "cuMemcpyHtoD_v2",
        dstDevice,
        srcHost as usize,
        ByteCount,
        NULL,
        true,
    ))
}

/// `cuMemcpyHtoDAsync_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2(
    dstDevice: CUdeviceptr,
    srcHost: *const c_void,
    ByteCount: usize,
    hStream: CUstream,
) -> CUresult {
    super::trace("cuMemcpyHtoDAsync_v2");
    status(htod(
        "cuMemcpyHtoDAsync_v2",
        dstDevice,
        srcHost as usize,
        ByteCount,
        hStream,
        false,
    ))
}

/// `cuMemcpyDtoH_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoH_v2(
    dstHost: *mut c_void,
    srcDevice: CUdeviceptr,
    ByteCount: usize,
) -> CUresult {
    super::trace("cuMemcpyDtoH_v2");
    status(dtoh(
        "cuMemcpyDtoH_v2",
        dstHost as usize,
        srcDevice,
        ByteCount,
        NULL,
        true,
    ))
}

/// `cuMemcpyDtoHAsync_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2(
    dstHost: *mut c_void,
    srcDevice: CUdeviceptr,
    ByteCount: usize,
    hStream: CUstream,
) -> CUresult {
    super::trace("cuMemcpyDtoHAsync_v2");
    status(dtoh(
        "cuMemcpyDtoHAsync_v2",
        dstHost as usize,
        srcDevice,
        ByteCount,
        hStream,
        false,
    ))
}

/// `cuMemcpyDtoD_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoD_v2(
    dstDevice: CUdeviceptr,
    srcDevice: CUdeviceptr,
    ByteCount: usize,
) -> CUresult {
    super::trace("cuMemcpyDtoD_v2");
    status(dtod(
        "cuMemcpyDtoD_v2",
        dstDevice,
        srcDevice,
        ByteCount,
        NULL,
    ))
}

/// `cuMemcpyDtoDAsync_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoDAsync_v2(
    dstDevice: CUdeviceptr,
    srcDevice: CUdeviceptr,
    ByteCount: usize,
    hStream: CUstream,
) -> CUresult {
    super::trace("cuMemcpyDtoDAsync_v2");
    status(dtod(
        "cuMemcpyDtoDAsync_v2",
        dstDevice,
        srcDevice,
        ByteCount,
        hStream,
    ))
}

fn peer(
    call: &'static str,
    dst: u64,
    dst_ctx: CUcontext,
    src: u64,
    src_ctx: CUcontext,
    n: usize,
    s: CUstream,
) -> CUresult {
    if let Err(code) = context_from_handle(dst_ctx).and(context_from_handle(src_ctx)) {
        return code;
    }
    status(dtod(call, dst, src, n, s))
}

/// `cuMemcpyPeerAsync`.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyPeerAsync(
    dstDevice: CUdeviceptr,
    dstContext: CUcontext,
    srcDevice: CUdeviceptr,
    srcContext: CUcontext,
    ByteCount: usize,
    hStream: CUstream,
) -> CUresult {
    super::trace("cuMemcpyPeerAsync");
    peer(
        "cuMemcpyPeerAsync",
        dstDevice,
        dstContext,
        srcDevice,
        srcContext,
        ByteCount,
        hStream,
    )
}

/// `cuMemcpyPeer`.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyPeer(
    dstDevice: CUdeviceptr,
    dstContext: CUcontext,
    srcDevice: CUdeviceptr,
    srcContext: CUcontext,
    ByteCount: usize,
) -> CUresult {
    super::trace("cuMemcpyPeer");
    peer(
        "cuMemcpyPeer",
        dstDevice,
        dstContext,
        srcDevice,
        srcContext,
        ByteCount,
        NULL,
    )
}

fn unified(
    call: &'static str,
    dst: u64,
    src: u64,
    n: usize,
    s: CUstream,
    sync: bool,
) -> Result<(), CUresult> {
    let on_device = |p: u64| space::device_of(p).is_some();
    match (on_device(dst), on_device(src)) {
        (true, true) => dtod(call, dst, src, n, s),
        (true, false) => htod(call, dst, src as usize, n, s, sync),
        (false, true) => dtoh(call, dst as usize, src, n, s, sync),
        (false, false) => Err(fail(
            call,
            CUresult::CUDA_ERROR_INVALID_VALUE,
            "neither pointer is device memory",
        )),
    }
}

/// `cuMemcpy` (direction inferred from the addresses: unified addressing).
#[no_mangle]
pub unsafe extern "C" fn cuMemcpy(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    ByteCount: usize,
) -> CUresult {
    super::trace("cuMemcpy");
    status(unified("cuMemcpy", dst, src, ByteCount, NULL, true))
}

/// `cuMemcpyAsync` (direction inferred from the addresses).
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyAsync(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    ByteCount: usize,
    hStream: CUstream,
) -> CUresult {
    super::trace("cuMemcpyAsync");
    status(unified(
        "cuMemcpyAsync",
        dst,
        src,
        ByteCount,
        hStream,
        false,
    ))
}

/// `cuMemsetD8_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD8_v2(dstDevice: CUdeviceptr, uc: u8, N: usize) -> CUresult {
    super::trace("cuMemsetD8_v2");
    status(fill("cuMemsetD8_v2", dstDevice, uc as u32, 1, N, NULL))
}

/// `cuMemsetD8Async`.
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD8Async(
    dstDevice: CUdeviceptr,
    uc: u8,
    N: usize,
    hStream: CUstream,
) -> CUresult {
    super::trace("cuMemsetD8Async");
    status(fill("cuMemsetD8Async", dstDevice, uc as u32, 1, N, hStream))
}

/// `cuMemsetD16_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD16_v2(dstDevice: CUdeviceptr, us: u16, N: usize) -> CUresult {
    super::trace("cuMemsetD16_v2");
    status(fill("cuMemsetD16_v2", dstDevice, us as u32, 2, N, NULL))
}

/// `cuMemsetD16Async`.
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD16Async(
    dstDevice: CUdeviceptr,
    us: u16,
    N: usize,
    hStream: CUstream,
) -> CUresult {
    super::trace("cuMemsetD16Async");
    status(fill(
        "cuMemsetD16Async",
        dstDevice,
        us as u32,
        2,
        N,
        hStream,
    ))
}

/// `cuMemsetD32_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD32_v2(dstDevice: CUdeviceptr, ui: c_uint, N: usize) -> CUresult {
    super::trace("cuMemsetD32_v2");
    status(fill("cuMemsetD32_v2", dstDevice, ui, 4, N, NULL))
}

/// `cuMemsetD32Async`.
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD32Async(
    dstDevice: CUdeviceptr,
    ui: c_uint,
    N: usize,
    hStream: CUstream,
) -> CUresult {
    super::trace("cuMemsetD32Async");
    status(fill("cuMemsetD32Async", dstDevice, ui, 4, N, hStream))
}
