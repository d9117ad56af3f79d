//! The emulated cuBLAS: handles and their settings, GEMM ([`gemm`]) with cuBLAS's C names and
//! ABI (`libcublas.so.13`, the subset kiln reaches through cudarc). Invariants:
//! - A handle is an opaque token, never a pointer to memory: tokens are never reused, so a
//!   destroyed or made-up handle is recognised and answered `CUBLAS_STATUS_NOT_INITIALIZED`.
//! - A handle belongs to the device that was current when it was created; its work runs on its
//!   stream (null: that device's default stream) through [`crate::driver::enqueue`], in order
//!   with every other piece of work queued there.
//! - Enum-typed arguments are taken as raw integers, so an out-of-range value is an error
//!   (`CUBLAS_STATUS_INVALID_VALUE`), never undefined behaviour.

pub mod gemm;
pub mod math;
pub mod typed;
pub mod validate;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use cudarc::cublas::sys::{cublasHandle_t, cublasStatus_t, cudaStream_t};

use crate::driver;

/// cuBLAS version this library reports (13.0.0: major·10000 + minor·100 + patch).
pub const CUBLAS_VERSION: c_int = 13_00_00;

/// Settings of one live handle.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HandleState {
    /// Device current when the handle was created.
    pub device: i32,
    /// The stream work runs on (address of the driver's stream; 0 = default stream).
    pub stream: usize,
    /// `cublasPointerMode_t`: 0 host, 1 device.
    pub pointer_mode: u32,
    /// `cublasMath_t` bits.
    pub math_mode: u32,
    /// User workspace (address, bytes); unused by the emulator beyond validation.
    pub workspace: (u64, usize),
}

static HANDLES: Mutex<Option<HashMap<usize, HandleState>>> = Mutex::new(None);
/// Next handle token; tokens are distinct, non-null and never reused.
static NEXT_HANDLE: AtomicUsize = AtomicUsize::new(0xcb1a_5000_0000);

fn handles() -> MutexGuard<'static, Option<HashMap<usize, HandleState>>> {
    HANDLES.lock().unwrap_or_else(|p| p.into_inner())
}

/// The settings of `handle`, or `NOT_INITIALIZED` (logged, naming `call`) when it is null,
/// destroyed or was never created.
pub(crate) fn handle_state(
    call: &str,
    handle: cublasHandle_t,
) -> Result<HandleState, cublasStatus_t> {
    driver::trace(call);
    let found = handles()
        .as_ref()
        .and_then(|map| map.get(&(handle as usize)).copied());
    found.ok_or_else(|| {
        driver::log(&format!(
            "{call}: handle {handle:p} is null, destroyed or was never created by cublasCreate \
             (CUBLAS_STATUS_NOT_INITIALIZED)"
        ));
        cublasStatus_t::CUBLAS_STATUS_NOT_INITIALIZED
    })
}

fn update(
    call: &str,
    handle: cublasHandle_t,
    change: impl FnOnce(&mut HandleState),
) -> cublasStatus_t {
    let mut guard = handles();
    match guard
        .as_mut()
        .and_then(|map| map.get_mut(&(handle as usize)))
    {
        Some(state) => {
            change(state);
            cublasStatus_t::CUBLAS_STATUS_SUCCESS
        }
        None => {
            drop(guard);
            handle_state(call, handle)
                .err()
                .unwrap_or(cublasStatus_t::CUBLAS_STATUS_SUCCESS)
        }
    }
}

/// The driver's stream handle for a stream address kept in a [`HandleState`].
pub(crate) fn driver_stream(addr: usize) -> cudarc::driver::sys::CUstream {
    addr as cudarc::driver::sys::CUstream
}

pub(crate) fn invalid(call: &str, what: &str) -> cublasStatus_t {
    driver::log(&format!("{call}: {what} (CUBLAS_STATUS_INVALID_VALUE)"));
    cublasStatus_t::CUBLAS_STATUS_INVALID_VALUE
}

/// Creates a handle on the current device (`CUBLAS_STATUS_NOT_INITIALIZED` without one).
#[no_mangle]
pub unsafe extern "C" fn cublasCreate_v2(handle: *mut cublasHandle_t) -> cublasStatus_t {
    driver::trace("cublasCreate_v2");
    if handle.is_null() {
        return invalid("cublasCreate_v2", "handle is a null pointer");
    }
    let device = match driver::current_device() {
        Ok(device) => device,
        Err(e) => {
            driver::log(&format!(
                "cublasCreate_v2: no current CUDA context ({e:?}) (CUBLAS_STATUS_NOT_INITIALIZED)"
            ));
            return cublasStatus_t::CUBLAS_STATUS_NOT_INITIALIZED;
        }
    };
    let token = NEXT_HANDLE.fetch_add(16, Ordering::Relaxed);
    let state = HandleState {
        device,
        stream: 0,
        pointer_mode: 0,
        math_mode: 0,
        workspace: (0, 0),
    };
    handles()
        .get_or_insert_with(HashMap::new)
        .insert(token, state);
    // SAFETY: `handle` is non-null; the caller passes a writable cublasHandle_t.
    unsafe { handle.write(token as cublasHandle_t) };
    cublasStatus_t::CUBLAS_STATUS_SUCCESS
}

/// Destroys a handle after the work queued on its stream has finished (as cuBLAS, which
/// synchronises).
#[no_mangle]
pub unsafe extern "C" fn cublasDestroy_v2(handle: cublasHandle_t) -> cublasStatus_t {
    let state = match handle_state("cublasDestroy_v2", handle) {
        Ok(state) => state,
        Err(status) => return status,
    };
    // A stream error belongs to the stream's next synchronising call, not to this one.
    let _ = driver::synchronize_stream(driver_stream(state.stream));
    if let Some(map) = handles().as_mut() {
        map.remove(&(handle as usize));
    }
    cublasStatus_t::CUBLAS_STATUS_SUCCESS
}

/// Sets the stream the handle's work runs on (null: the default stream).
#[no_mangle]
pub unsafe extern "C" fn cublasSetStream_v2(
    handle: cublasHandle_t,
    stream: cudaStream_t,
) -> cublasStatus_t {
    update("cublasSetStream_v2", handle, |s| s.stream = stream as usize)
}

/// The handle's stream.
#[no_mangle]
pub unsafe extern "C" fn cublasGetStream_v2(
    handle: cublasHandle_t,
    stream: *mut cudaStream_t,
) -> cublasStatus_t {
    let state = match handle_state("cublasGetStream_v2", handle) {
        Ok(state) => state,
        Err(status) => return status,
    };
    if stream.is_null() {
        return invalid("cublasGetStream_v2", "streamId is a null pointer");
    }
    // SAFETY: non-null; the caller passes a writable cudaStream_t.
    unsafe { stream.write(state.stream as cudaStream_t) };
    cublasStatus_t::CUBLAS_STATUS_SUCCESS
}

/// Sets whether alpha and beta are host (0) or device (1) pointers.
#[no_mangle]
pub unsafe extern "C" fn cublasSetPointerMode_v2(
    handle: cublasHandle_t,
    mode: u32,
) -> cublasStatus_t {
    if let Err(status) = handle_state("cublasSetPointerMode_v2", handle) {
        return status;
    }
    if mode > 1 {
        return invalid(
            "cublasSetPointerMode_v2",
            &format!("mode {mode} is not a cublasPointerMode_t"),
        );
    }
    update("cublasSetPointerMode_v2", handle, |s| s.pointer_mode = mode)
}

/// The handle's pointer mode.
#[no_mangle]
pub unsafe extern "C" fn cublasGetPointerMode_v2(
    handle: cublasHandle_t,
    mode: *mut u32,
) -> cublasStatus_t {
    let state = match handle_state("cublasGetPointerMode_v2", handle) {
        Ok(state) => state,
        Err(status) => return status,
    };
    if mode.is_null() {
        return invalid("cublasGetPointerMode_v2", "mode is a null pointer");
    }
    // SAFETY: non-null; the caller passes a writable cublasPointerMode_t.
    unsafe { mode.write(state.pointer_mode) };
    cublasStatus_t::CUBLAS_STATUS_SUCCESS
}

/// Math-mode bit that forbids reduced-precision reductions (accepted; sums are f32 anyway).
const DISALLOW_REDUCED_PRECISION: u32 = 16;

/// Sets the math mode: `CUBLAS_TF32_TENSOR_OP_MATH` makes f32 GEMMs with `CUBLAS_COMPUTE_32F`
/// round A and B to TF32, as on tensor cores.
#[no_mangle]
pub unsafe extern "C" fn cublasSetMathMode(handle: cublasHandle_t, mode: u32) -> cublasStatus_t {
    if let Err(status) = handle_state("cublasSetMathMode", handle) {
        return status;
    }
    if !matches!(mode & !DISALLOW_REDUCED_PRECISION, 0..=4 | 8) {
        return invalid(
            "cublasSetMathMode",
            &format!("mode {mode} is not a cublasMath_t"),
        );
    }
    update("cublasSetMathMode", handle, |s| s.math_mode = mode)
}

/// The handle's math mode.
#[no_mangle]
pub unsafe extern "C" fn cublasGetMathMode(
    handle: cublasHandle_t,
    mode: *mut u32,
) -> cublasStatus_t {
    let state = match handle_state("cublasGetMathMode", handle) {
        Ok(state) => state,
        Err(status) => return status,
    };
    if mode.is_null() {
        return invalid("cublasGetMathMode", "mode is a null pointer");
    }
    // SAFETY: non-null; the caller passes a writable cublasMath_t.
    unsafe { mode.write(state.math_mode) };
    cublasStatus_t::CUBLAS_STATUS_SUCCESS
}

/// Sets a user workspace: it must be device memory of at least `size` bytes, 256-byte aligned
/// (null with size 0 restores the default).
#[no_mangle]
pub unsafe extern "C" fn cublasSetWorkspace_v2(
    handle: cublasHandle_t,
    workspace: *mut c_void,
    size: usize,
) -> cublasStatus_t {
    const CALL: &str = "cublasSetWorkspace_v2";
    if let Err(status) = handle_state(CALL, handle) {
        return status;
    }
    let addr = workspace as u64;
    if addr == 0 && size > 0 {
        return invalid(
            CALL,
            &format!("workspace is null with workspaceSizeInBytes {size}"),
        );
    }
    if !addr.is_multiple_of(256) {
        return invalid(
            CALL,
            &format!("workspace 0x{addr:x} is not 256-byte aligned"),
        );
    }
    if addr != 0 {
        if let Err(e) = crate::space::check_device_range(addr, size as u64) {
            return invalid(CALL, &format!("workspace is not device memory: {e}"));
        }
    }
    update(CALL, handle, |s| s.workspace = (addr, size))
}

/// The library version of the handle's cuBLAS.
#[no_mangle]
pub unsafe extern "C" fn cublasGetVersion_v2(
    handle: cublasHandle_t,
    version: *mut c_int,
) -> cublasStatus_t {
    if let Err(status) = handle_state("cublasGetVersion_v2", handle) {
        return status;
    }
    if version.is_null() {
        return invalid("cublasGetVersion_v2", "version is a null pointer");
    }
    // SAFETY: non-null; the caller passes a writable int.
    unsafe { version.write(CUBLAS_VERSION) };
    cublasStatus_t::CUBLAS_STATUS_SUCCESS
}

/// Major (0), minor (1) or patch (2) version of the library.
#[no_mangle]
pub unsafe extern "C" fn cublasGetProperty(kind: u32, value: *mut c_int) -> cublasStatus_t {
    if value.is_null() {
        return invalid("cublasGetProperty", "value is a null pointer");
    }
    let v = match kind {
        0 => CUBLAS_VERSION / 10_000,
        1 => CUBLAS_VERSION / 100 % 100,
        2 => CUBLAS_VERSION % 100,
        other => {
            return invalid(
                "cublasGetProperty",
                &format!("type {other} is not a libraryPropertyType"),
            )
        }
    };
    // SAFETY: non-null; the caller passes a writable int.
    unsafe { value.write(v) };
    cublasStatus_t::CUBLAS_STATUS_SUCCESS
}

fn status_text(status: u32) -> (&'static std::ffi::CStr, &'static std::ffi::CStr) {
    match status {
        0 => (c"CUBLAS_STATUS_SUCCESS", c"success"),
        1 => (
            c"CUBLAS_STATUS_NOT_INITIALIZED",
            c"the library was not initialized",
        ),
        3 => (
            c"CUBLAS_STATUS_ALLOC_FAILED",
            c"the resource allocation failed",
        ),
        7 => (
            c"CUBLAS_STATUS_INVALID_VALUE",
            c"an invalid numeric value was used as an argument",
        ),
        8 => (
            c"CUBLAS_STATUS_ARCH_MISMATCH",
            c"an absent device architectural feature is required",
        ),
        11 => (
            c"CUBLAS_STATUS_MAPPING_ERROR",
            c"an access to GPU memory space failed",
        ),
        13 => (
            c"CUBLAS_STATUS_EXECUTION_FAILED",
            c"the GPU program failed to execute",
        ),
        14 => (
            c"CUBLAS_STATUS_INTERNAL_ERROR",
            c"an internal operation failed",
        ),
        15 => (
            c"CUBLAS_STATUS_NOT_SUPPORTED",
            c"the functionality requested is not supported",
        ),
        16 => (
            c"CUBLAS_STATUS_LICENSE_ERROR",
            c"error detected trying to check the license",
        ),
        _ => (c"CUBLAS_STATUS_UNKNOWN", c"unknown error"),
    }
}

/// The enum name of a status (`CUBLAS_STATUS_UNKNOWN` for other values).
#[no_mangle]
pub unsafe extern "C" fn cublasGetStatusName(status: u32) -> *const c_char {
    status_text(status).0.as_ptr()
}

/// A sentence describing a status.
#[no_mangle]
pub unsafe extern "C" fn cublasGetStatusString(status: u32) -> *const c_char {
    status_text(status).1.as_ptr()
}
