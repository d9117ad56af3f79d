//! Device memory (`cuMemAlloc*`, `cuMemFree*`, `cuMemGetInfo`) and page-locked host memory.
//!
//! Invariants: allocation and free go through [`crate::space`] (capacity, guard pages);
//! `cuMemFree` does not wait for queued work, so work still using the memory faults (the async
//! free waits for its stream instead); an allocation with a queued async free cannot be freed
//! again; page-locked ranges never overlap.

use std::collections::HashSet;
use std::ffi::{c_uint, c_void};
use std::sync::Mutex;

use cudarc::driver::sys::{CUdeviceptr, CUresult, CUstream};

use super::context::current;
use super::copy::{check_host, copy_stream};
use super::pinned::{is_pinned, PINNED};
use super::stream::Item;
use super::{fail, out, status};
use crate::space::{self, SpaceError};

/// Allocations with a queued `cuMemFreeAsync`.
static FREEING: Mutex<Option<HashSet<u64>>> = Mutex::new(None);

fn allocate(call: &str, device: i32, size: usize) -> Result<u64, CUresult> {
    space::alloc(device as usize, size as u64).map_err(|e| match e {
        SpaceError::OutOfMemory { requested, free } => fail(
            call,
            CUresult::CUDA_ERROR_OUT_OF_MEMORY,
            format!(
                "out of memory on device {device}: {size} bytes requested ({requested} rounded), \
                 {free} of {} free",
                space::capacity()
            ),
        ),
        other => fail(
            call,
            CUresult::CUDA_ERROR_OUT_OF_MEMORY,
            format!("{other:?}"),
        ),
    })
}

/// `cuMemAlloc_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult {
    super::trace("cuMemAlloc_v2");
    let ctx = match current() {
        Ok(c) => c,
        Err(code) => return code,
    };
    if dptr.is_null() || bytesize == 0 {
        return fail(
            "cuMemAlloc_v2",
            CUresult::CUDA_ERROR_INVALID_VALUE,
            "null out-pointer or size 0",
        );
    }
    match allocate("cuMemAlloc_v2", ctx.device, bytesize) {
        // SAFETY: checked not null above.
        Ok(p) => unsafe { out(dptr, p) },
        Err(code) => code,
    }
}

/// `cuMemAllocAsync`: the memory is usable at once (and so in stream order); size 0 gives the
/// null pointer.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    hStream: CUstream,
) -> CUresult {
    super::trace("cuMemAllocAsync");
    let s = match copy_stream(hStream) {
        Ok(s) => s,
        Err(code) => return code,
    };
    if dptr.is_null() {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    if bytesize == 0 {
        // SAFETY: checked not null above.
        return unsafe { out(dptr, 0) };
    }
    match allocate("cuMemAllocAsync", s.ctx.device, bytesize) {
        // SAFETY: checked not null above.
        Ok(p) => unsafe { out(dptr, p) },
        Err(code) => code,
    }
}

fn free_now(call: &str, ptr: u64) -> Result<(), CUresult> {
    space::free(ptr).map(|_| ()).map_err(|_| {
        fail(
            call,
            CUresult::CUDA_ERROR_INVALID_VALUE,
            format!("0x{ptr:x} is not the start of a live allocation"),
        )
    })
}

/// `cuMemFree_v2`: frees at once (queued work still using the memory will fault).
#[no_mangle]
pub unsafe extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    super::trace("cuMemFree_v2");
    if let Err(code) = current() {
        return code;
    }
    if dptr == 0 {
        return CUresult::CUDA_SUCCESS;
    }
    let freeing = FREEING.lock().unwrap_or_else(|e| e.into_inner());
    if freeing.as_ref().is_some_and(|f| f.contains(&dptr)) {
        return fail(
            "cuMemFree_v2",
            CUresult::CUDA_ERROR_INVALID_VALUE,
            format!("0x{dptr:x} already has an async free queued"),
        );
    }
    drop(freeing);
    status(free_now("cuMemFree_v2", dptr))
}

/// `cuMemFreeAsync`: the memory is freed when the stream reaches this point.
#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync(dptr: CUdeviceptr, hStream: CUstream) -> CUresult {
    super::trace("cuMemFreeAsync");
    let s = match copy_stream(hStream) {
        Ok(s) => s,
        Err(code) => return code,
    };
    if dptr == 0 {
        return CUresult::CUDA_SUCCESS;
    }
    let mut freeing = FREEING.lock().unwrap_or_else(|e| e.into_inner());
    let set = freeing.get_or_insert_with(HashSet::new);
    if space::allocation_device(dptr).is_none() || !set.insert(dptr) {
        return fail(
            "cuMemFreeAsync",
            CUresult::CUDA_ERROR_INVALID_VALUE,
            format!("0x{dptr:x} is not the start of a live allocation"),
        );
    }
    drop(freeing);
    s.submit(Item::Control(Box::new(move || {
        // Freed and unmarked under one hold of the lock: a second `cuMemFreeAsync` of the same
        // pointer sees it either queued or gone, never live and unqueued (it was once accepted
        // in that window and failed later on the stream).
        let mut freeing = FREEING.lock().unwrap_or_else(|e| e.into_inner());
        let _ = free_now("cuMemFreeAsync", dptr);
        if let Some(set) = freeing.as_mut() {
            set.remove(&dptr);
        }
    })));
    CUresult::CUDA_SUCCESS
}

/// `cuMemGetInfo_v2`: the current device's free and total bytes.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    super::trace("cuMemGetInfo_v2");
    let ctx = match current() {
        Ok(c) => c,
        Err(code) => return code,
    };
    let capacity = space::capacity();
    let used = space::used(ctx.device as usize);
    // SAFETY: the caller's out-pointers (checked for null).
    match unsafe { out(free, (capacity - used) as usize) } {
        CUresult::CUDA_SUCCESS => unsafe { out(total, capacity as usize) },
        code => code,
    }
}

/// `cuMemHostAlloc`: page-locked host memory (copies to and from it are asynchronous).
#[no_mangle]
pub unsafe extern "C" fn cuMemHostAlloc(
    pp: *mut *mut c_void,
    bytesize: usize,
    Flags: c_uint,
) -> CUresult {
    super::trace("cuMemHostAlloc");
    if let Err(code) = current() {
        return code;
    }
    if pp.is_null() || bytesize == 0 || Flags & !0xf != 0 {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: a fresh anonymous mapping the kernel places (never in a device span: those are
    // already mapped).
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytesize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return fail(
            "cuMemHostAlloc",
            CUresult::CUDA_ERROR_OUT_OF_MEMORY,
            std::io::Error::last_os_error(),
        );
    }
    PINNED
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .insert(p as usize, (bytesize, true));
    // SAFETY: checked not null above.
    unsafe { out(pp, p) }
}

/// `cuMemAllocHost_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocHost_v2(pp: *mut *mut c_void, bytesize: usize) -> CUresult {
    super::trace("cuMemAllocHost_v2");
    // SAFETY: forwarded out-pointer.
    unsafe { cuMemHostAlloc(pp, bytesize, 0) }
}

/// `cuMemFreeHost`.
#[no_mangle]
pub unsafe extern "C" fn cuMemFreeHost(p: *mut c_void) -> CUresult {
    super::trace("cuMemFreeHost");
    let removed = PINNED
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&(p as usize));
    match removed {
        Some((len, true)) => {
            // SAFETY: a mapping cuMemHostAlloc made, with its length.
            unsafe { libc::munmap(p, len) };
            CUresult::CUDA_SUCCESS
        }
        Some(registered) => {
            PINNED
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .insert(p as usize, registered);
            fail(
                "cuMemFreeHost",
                CUresult::CUDA_ERROR_INVALID_VALUE,
                "memory was registered, not allocated",
            )
        }
        None => fail(
            "cuMemFreeHost",
            CUresult::CUDA_ERROR_INVALID_VALUE,
            format!("{p:?} is not page-locked memory"),
        ),
    }
}

/// `cuMemHostRegister_v2`: marks host memory page-locked.
#[no_mangle]
pub unsafe extern "C" fn cuMemHostRegister_v2(
    p: *mut c_void,
    bytesize: usize,
    Flags: c_uint,
) -> CUresult {
    super::trace("cuMemHostRegister_v2");
    if let Err(code) = current() {
        return code;
    }
    if bytesize == 0 || Flags & !0xf != 0 {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    if let Err(code) = check_host("cuMemHostRegister_v2", "memory", p as usize, bytesize) {
        return code;
    }
    let mut pinned = PINNED.write().unwrap_or_else(|e| e.into_inner());
    let overlaps = pinned
        .range(..(p as usize + bytesize))
        .next_back()
        .is_some_and(|(&s, &(l, _))| s + l > p as usize);
    if overlaps {
        return CUresult::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    }
    pinned.insert(p as usize, (bytesize, false));
    CUresult::CUDA_SUCCESS
}

/// `cuMemHostUnregister`.
#[no_mangle]
pub unsafe extern "C" fn cuMemHostUnregister(p: *mut c_void) -> CUresult {
    super::trace("cuMemHostUnregister");
    let mut pinned = PINNED.write().unwrap_or_else(|e| e.into_inner());
    match pinned.get(&(p as usize)) {
        Some(&(_, false)) => {
            pinned.remove(&(p as usize));
            CUresult::CUDA_SUCCESS
        }
        _ => CUresult::CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
    }
}

/// `cuMemGetAddressRange_v2`: the live allocation (or VMM mapping) holding `dptr`.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetAddressRange_v2(
    pbase: *mut CUdeviceptr,
    psize: *mut usize,
    dptr: CUdeviceptr,
) -> CUresult {
    super::trace("cuMemGetAddressRange_v2");
    if let Err(code) = current() {
        return code;
    }
    let Some((start, len, _)) = space::range_of(dptr) else {
        return CUresult::CUDA_ERROR_NOT_FOUND;
    };
    // SAFETY: the caller's out-pointers; either may be null (then it is not written).
    unsafe {
        if !pbase.is_null() {
            *pbase = start;
        }
        if !psize.is_null() {
            *psize = len as usize;
        }
    }
    CUresult::CUDA_SUCCESS
}

/// `cuPointerGetAttribute` for device memory (context, memory type, device pointer, device
/// ordinal, range start and size) and page-locked host memory (memory type, host pointer);
/// other attributes and other host memory are `CUDA_ERROR_INVALID_VALUE`.
#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttribute(
    data: *mut c_void,
    attribute: c_uint,
    ptr: CUdeviceptr,
) -> CUresult {
    super::trace("cuPointerGetAttribute");
    if let Err(code) = super::context::driver() {
        return code;
    }
    if data.is_null() {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    if let Some((start, len, device)) = space::range_of(ptr) {
        let ctx = match super::context::context_of_device(device) {
            Ok(c) => c,
            Err(code) => return code,
        };
        // SAFETY: the caller's buffer holds the attribute's type (CUDA's documented sizes).
        return unsafe {
            match attribute {
                1 => out(data.cast(), ctx.handle()),
                2 => out(data.cast::<c_uint>(), 2), // CU_MEMORYTYPE_DEVICE
                3 => out(data.cast::<CUdeviceptr>(), ptr),
                9 => out(data.cast::<i32>(), device),
                11 => out(data.cast::<CUdeviceptr>(), start),
                12 => out(data.cast::<usize>(), len as usize),
                _ => CUresult::CUDA_ERROR_INVALID_VALUE,
            }
        };
    }
    if is_pinned(ptr as usize, 1) {
        // SAFETY: as above.
        return unsafe {
            match attribute {
                2 => out(data.cast::<c_uint>(), 1), // CU_MEMORYTYPE_HOST
                4 => out(data.cast::<*mut c_void>(), ptr as *mut c_void),
                _ => CUresult::CUDA_ERROR_INVALID_VALUE,
            }
        };
    }
    CUresult::CUDA_ERROR_INVALID_VALUE
}
