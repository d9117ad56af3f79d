//! `CUresult` values: conversion from the raw `u32` a caller passes, their names and strings
//! (`cuGetErrorName` / `cuGetErrorString`), and which errors are sticky.
//!
//! Invariants: a raw value becomes a `CUresult` only when it is one of the enum's values (the
//! table `build.rs` generates from cudarc's bindings), so no invalid enum is ever made; the
//! strings handed out are static and NUL-terminated.

use std::collections::HashMap;
use std::ffi::{c_char, CString};
use std::sync::Mutex;

use cudarc::driver::sys::CUresult;

include!(concat!(env!("OUT_DIR"), "/cuda_errors.rs"));

/// The `CUresult` with value `raw`, if there is one.
pub(crate) fn from_raw(raw: u32) -> Option<CUresult> {
    CUDA_ERROR_CODES
        .iter()
        .any(|&(v, _)| v == raw)
        // SAFETY: `raw` is a discriminant of the `#[repr(u32)]` enum (the table lists them all).
        .then(|| unsafe { std::mem::transmute::<u32, CUresult>(raw) })
}

/// True for the errors after which a GPU context is unusable: every later call returns them.
pub(crate) fn is_sticky(code: CUresult) -> bool {
    use CUresult as R;
    matches!(
        code,
        R::CUDA_ERROR_ILLEGAL_ADDRESS
            | R::CUDA_ERROR_LAUNCH_TIMEOUT
            | R::CUDA_ERROR_ASSERT
            | R::CUDA_ERROR_HARDWARE_STACK_ERROR
            | R::CUDA_ERROR_ILLEGAL_INSTRUCTION
            | R::CUDA_ERROR_MISALIGNED_ADDRESS
            | R::CUDA_ERROR_INVALID_ADDRESS_SPACE
            | R::CUDA_ERROR_INVALID_PC
            | R::CUDA_ERROR_LAUNCH_FAILED
    )
}

/// The driver's description of the common errors; others read their name in words.
fn describe(name: &str) -> String {
    let known = match name {
        "CUDA_SUCCESS" => "no error",
        "CUDA_ERROR_INVALID_VALUE" => "invalid argument",
        "CUDA_ERROR_OUT_OF_MEMORY" => "out of memory",
        "CUDA_ERROR_NOT_INITIALIZED" => "initialization error",
        "CUDA_ERROR_NO_DEVICE" => "no CUDA-capable device is detected",
        "CUDA_ERROR_INVALID_DEVICE" => "invalid device ordinal",
        "CUDA_ERROR_INVALID_IMAGE" => "device kernel image is invalid",
        "CUDA_ERROR_INVALID_CONTEXT" => "invalid device context",
        "CUDA_ERROR_INVALID_HANDLE" => "invalid resource handle",
        "CUDA_ERROR_NOT_FOUND" => "named symbol not found",
        "CUDA_ERROR_NOT_READY" => "device not ready",
        "CUDA_ERROR_ILLEGAL_ADDRESS" => "an illegal memory access was encountered",
        "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES" => "too many resources requested for launch",
        "CUDA_ERROR_LAUNCH_FAILED" => "unspecified launch failure",
        "CUDA_ERROR_NOT_SUPPORTED" => "operation not supported",
        "CUDA_ERROR_ALREADY_MAPPED" => "resource already mapped",
        "CUDA_ERROR_NOT_MAPPED" => "resource not mapped",
        _ => "",
    };
    if !known.is_empty() {
        return known.to_string();
    }
    name.trim_start_matches("CUDA_ERROR_")
        .to_ascii_lowercase()
        .replace('_', " ")
}

/// Static C strings for `(raw, want_name)`, made once each.
fn text(raw: u32, want_name: bool) -> Option<*const c_char> {
    static CACHE: Mutex<Option<HashMap<(u32, bool), CString>>> = Mutex::new(None);
    let name = CUDA_ERROR_CODES.iter().find(|&&(v, _)| v == raw)?.1;
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    let entry = cache
        .get_or_insert_with(HashMap::new)
        .entry((raw, want_name))
        .or_insert_with(|| {
            let s = if want_name {
                name.to_string()
            } else {
                describe(name)
            };
            CString::new(s).unwrap_or_default()
        });
    // The CString's heap buffer never moves or drops: entries are never removed.
    Some(entry.as_ptr())
}

/// `cuGetErrorName`.
#[no_mangle]
pub unsafe extern "C" fn cuGetErrorName(error: u32, pStr: *mut *const c_char) -> CUresult {
    super::trace("cuGetErrorName");
    // SAFETY: forwarded out-pointer.
    unsafe { write_text(error, pStr, true) }
}

/// `cuGetErrorString`.
#[no_mangle]
pub unsafe extern "C" fn cuGetErrorString(error: u32, pStr: *mut *const c_char) -> CUresult {
    super::trace("cuGetErrorString");
    // SAFETY: forwarded out-pointer.
    unsafe { write_text(error, pStr, false) }
}

unsafe fn write_text(error: u32, out: *mut *const c_char, want_name: bool) -> CUresult {
    if out.is_null() {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    match text(error, want_name) {
        Some(p) => {
            // SAFETY: the caller passes a writable out-pointer.
            unsafe { *out = p };
            CUresult::CUDA_SUCCESS
        }
        None => {
            // SAFETY: as above; the driver writes NULL for unknown codes.
            unsafe { *out = std::ptr::null() };
            CUresult::CUDA_ERROR_INVALID_VALUE
        }
    }
}
